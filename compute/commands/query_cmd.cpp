// `query`: its flags (shine's node cache and routing, dhnsw's batch pipeline) and its run.
#include "common/units.hpp"
#include "compute/commands/commands.hpp"

namespace dmhnsw::commands {

void QueryCommand::add(CLI::App& app) {
  query_ = app.add_subcommand("query", "run a workload (tools/workload) against the index; computenode 0 "
                                       "gathers every computenode's numbers and writes the merged report");
  CLI::App* q = query_;
  q->add_option("--workload", qo_.workload, "workload file from tools/workload")->required();
  q->add_option("--k", qo_.k, "neighbours per query")->capture_default_str();
  q->add_option("--ef-search", ef_list_, "efSearch, or a comma list to run one after the other")->capture_default_str();
  q->add_option("--threads", qo_.threads, "worker threads")->capture_default_str();
  q->add_option("--coroutines", qo_.coroutines, "queries in flight per thread (C++20 coroutines)")->capture_default_str();
  q->add_option("--repeat-seconds", qo_.repeat_seconds, "cycle through the measured part for at least this long (dhnsw --mix: run the mixed stream this long)")
      ->capture_default_str();
  q->add_option("--report", report_, "write the query report (JSON) here (computenode 0: merged)");
  q->add_option("--cache-ratio", qo_.cache_ratio,
                "shine: node cache per computenode as a share of the index size, e.g. 0.05 (0: no cache); "
                "dhnsw: sub-HNSWs kept across batches as a share of the partitions (default 0.10)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  q->add_option("--cache-bytes", cache_bytes_, "node cache per computenode in bytes, e.g. 64MiB (overrides --cache-ratio)");
  q->add_option("--admit-probability", qo_.admit_probability, "level-0 nodes enter the cache with this probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  q->add_option("--routing", qo_.routing,
                "none: every computenode answers its own share; best-fit: to the computenode whose partition "
                "fits; balanced: best fit within equal quotas per batch; adaptive: quotas from the computenodes' "
                "queue lengths (paper Algorithm 2)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "best-fit", "balanced", "adaptive"}));
  q->add_option("--route-batch", qo_.route_batch, "b: queries per routing batch (balanced, adaptive)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  q->add_option("--route-threshold", qo_.route_threshold,
                "t: after a batch the router waits while its working queue is longer (adaptive)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  q->add_option("--adaptive-quota", qo_.adaptive_quota,
                "adaptive: what the queue weights scale; even: b/K per computenode (paper Algorithm 2, equal "
                "queues give balanced routing); demand: the batch's best-fit counts (equal queues give "
                "best-fit, a computenode with a longer queue keeps less)")
      ->capture_default_str()
      ->check(CLI::IsMember({"even", "demand"}));
  q->add_option("--oracle", qo_.oracle,
                "how a query's computenode is ranked: balanced: distance to the partition centroids plus "
                "per-partition offsets that split the partitioned sample evenly; nearest: distance to the "
                "centroids only (the paper)")
      ->capture_default_str()
      ->check(CLI::IsMember({"balanced", "nearest"}));
  q->add_option("--kmeans-seed", qo_.kmeans_seed, "seed of the balanced k-means (the same on every computenode)")
      ->capture_default_str();
  q->add_option("--trace", qo_.trace_dir, "record every node-cache access to DIR/cn<id>-t<thread>.trace (tools/csp-report)");
  // ---- dhnsw query options (paper sections 4.3-4.4)
  q->add_option("--batch", dq_.engine.batch, "dhnsw: B, queries per batch")->capture_default_str()->check(CLI::PositiveNumber);
  q->add_option("--max-wait-us", dq_.engine.max_wait_us,
                "dhnsw: a batch closes this long after its first query arrived (with --arrival-qps)")
      ->capture_default_str();
  q->add_option("--arrival-qps", dq_.engine.arrival_qps,
                "dhnsw: queries arrive at this rate (0: all are there at the start)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  q->add_option("--probe", dq_.engine.probe, "dhnsw: b, partitions (sub-HNSWs) searched per query")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  q->add_option("--meta-ef-search", dq_.engine.meta_ef_search, "dhnsw: efSearch in the meta-HNSW")->capture_default_str();
  q->add_option("--cache-subs", dq_.engine.cache_subs,
                "dhnsw: c, deserialized sub-HNSWs kept across batches (overrides --cache-ratio)");
  q->add_option("--doorbell-subs", dq_.engine.doorbell_subs, "dhnsw: sub-HNSW fetches posted with one doorbell")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  q->add_option("--queue-depth", dq_.engine.queue_depth, "dhnsw: items between two pipeline stages")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  q->add_option("--search-threads", dq_.engine.search_threads,
                "dhnsw: threads of one sub-HNSW search (0: every core)")
      ->capture_default_str();
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
  if (!cache_bytes_.empty()) qo_.cache_bytes = parse_bytes(cache_bytes_, "--cache-bytes");
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
  const compute::RunContext rc{&env.cluster, cn_id, num_cns, env.flags.provider, {}};
  dq_.workload = qo_.workload;
  dq_.engine.k = qo_.k;
  dq_.ef_search = parse_ef_list(ef_list_);
  // --cache-ratio is a share of the sub-HNSWs here (default 0.10, like the paper)
  dq_.engine.cache_ratio = query_->get_option("--cache-ratio")->count() > 0 ? qo_.cache_ratio : 0.10;
  dq_.engine.regroup = !no_regroup_;
  dq_.engine.doorbell = !no_doorbell_;
  dq_.engine.pipeline = !no_pipeline_;
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
