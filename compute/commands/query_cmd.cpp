// `query`: its flags (shine's node cache and routing, dhnsw's batch pipeline) and its run.
#include "common/units.hpp"
#include "compute/commands/commands.hpp"
#include "compute/dhnsw/options.hpp"

namespace dmhnsw::commands {

void QueryCommand::add(CLI::App& app) {
  query_ = app.add_subcommand("query", "run a workload (tools/workload) against the index; computenode 0 "
                                       "gathers every computenode's numbers and writes the merged report");
  CLI::App* q = query_;
  q->add_option("--workload", qo_.workload, "workload file from tools/workload")->required();
  q->add_option("--k", qo_.k, "neighbours per query")->capture_default_str();
  q->add_option("--ef-search", ef_list_, "efSearch, or a comma list to run one after the other")->capture_default_str();
  q->add_option("--repeat-seconds", qo_.repeat_seconds, "cycle through the measured part for at least this long (dhnsw --mix: run the mixed stream this long)")
      ->capture_default_str();
  q->add_option("--report", report_, "write the query report (JSON) here (computenode 0: merged)");
  // Each mode's search flags, as `serve` has them (compute/shine/options.hpp, compute/dhnsw/options.hpp).
  qo_.search.add_flags(*q, "; dhnsw: deserialized sub-HNSWs kept across batches as a share of the partitions "
                           "(default 0.10)");
  q->add_option("--trace", qo_.trace_dir, "record every node-cache access to DIR/cn<id>-t<thread>.trace (tools/csp-report)");
  dhnsw::add_engine_flags(*q, dq_.engine);
  q->add_option("--arrival-qps", dq_.engine.arrival_qps,
                "dhnsw: queries arrive at this rate (0: all are there at the start)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  q->add_option("--mix", mix_,
                "dhnsw: insert:P: a share P of each batch's operations are inserts of --insert-data rows (this "
                "computenode's share), the rest searches; the report separates them, with a timeline");
  q->add_option("--insert-data", dmo_.insert_data, "dhnsw --mix: vectors to insert");
  q->add_option("--insert-begin", dmo_.insert_begin, "dhnsw --mix: first row to insert")->capture_default_str();
  q->add_option("--insert-end", dmo_.insert_end, "dhnsw --mix: one past the last row (0: all)")->capture_default_str();
  q->add_option("--insert-id-offset", dmo_.id_offset, "dhnsw --mix: a row's id is this plus its row number")
      ->capture_default_str();
  q->add_flag("--no-regroup", no_regroup_, "dhnsw ablation: each query fetches its own partitions (no sharing, no cache)");
  q->add_flag("--no-doorbell", no_doorbell_, "dhnsw ablation: one READ per post, each waited for");
  q->add_flag("--no-pipeline", no_pipeline_, "dhnsw ablation: fetch, deserialize and search in sequence on one thread");
}

void QueryCommand::add_read_mode(std::string& read_mode) {
  query_->add_option("--read-mode", read_mode, "batch: a candidate's neighbours in one doorbell; per-read: one READ each")
      ->capture_default_str()
      ->check(CLI::IsMember({"batch", "per-read"}));
}

static std::vector<uint32_t> parse_ef_list(const std::string& list) {
  std::vector<uint32_t> ef;
  for (auto& e : split_commas(list)) ef.push_back(static_cast<uint32_t>(std::stoul(e)));
  if (ef.empty()) throw std::invalid_argument("--ef-search: no value");
  return ef;
}

int QueryCommand::run(RunEnv& env, shine::ReadMode rm) {
  if (env.flags.mode == "dhnsw") return run_dhnsw(env);
  qo_.mode = rm;
  qo_.ef_search = parse_ef_list(ef_list_);
  qo_.on_report = [&](const nlohmann::json& r) {
    if (env.flags.cn_id == 0) shine::print_query(r);
    env.write_report(report_, r);
  };
  shine::run_query(env.rc, qo_);
  return 0;
}

int QueryCommand::run_dhnsw(RunEnv& env) {
  const uint32_t cn_id = env.flags.cn_id, num_cns = env.flags.num_cns;
  const compute::RunContext& rc = env.rc;  // with the departures read at connect (Board)
  dq_.workload = qo_.workload;
  dq_.engine.k = qo_.k;
  dq_.ef_search = parse_ef_list(ef_list_);
  dq_.engine.regroup = !no_regroup_;
  dq_.engine.doorbell = !no_doorbell_;
  dq_.engine.pipeline = !no_pipeline_;
  dq_.engine.in_place = qo_.search.in_place;  // --in-place / --no-in-place, registered with shine's flags
  dq_.on_report = [&](const nlohmann::json& r) {
    if (cn_id == 0) dhnsw::print_query(r);
    env.write_report(report_, r);
  };
  if (!mix_.empty()) {
    dmo_.insert_share = dhnsw::parse_mix(mix_);
    dmo_.seconds = qo_.repeat_seconds;
    auto r = dhnsw::run_mixed(rc, dq_, dmo_);
    dhnsw::print_mixed(r);
    env.write_report(num_cns > 1 && !report_.empty() ? report_ + ".cn" + std::to_string(cn_id) : report_, r, true);
    return 0;
  }
  dhnsw::run_query(rc, dq_);
  return 0;
}

}  // namespace dmhnsw::commands
