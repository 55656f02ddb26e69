// computenode: does all the computing; reads the index from memnodes with one-sided
// operations. This file is the control path: flags, connection, dispatch to subcommands.
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>

#include "common/fabric/fabric_cluster.hpp"
#include "common/fabric/wire.hpp"
#include "common/json_file.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "compute/board.hpp"
#include "compute/dhnsw/epoch.hpp"
#include "compute/dhnsw/insert.hpp"
#include "compute/dhnsw/mixed.hpp"
#include "compute/dhnsw/online.hpp"
#include "compute/dhnsw/query.hpp"
#include "compute/memnode_cpu.hpp"
#include "compute/selftest.hpp"
#include "compute/serve/serve.hpp"
#include "compute/shine/engine.hpp"
#include "compute/store.hpp"
#include <fstream>

using namespace dmhnsw;

namespace {


void print_headers(const fabric::Cluster& c) {
  for (const auto& mn : c.memnodes()) {
    RegionHeader h = header_from_blob(mn.header, "memnode " + std::to_string(mn.id) + " (" + mn.address + ")");
    std::printf("%s  [%s]\n", describe(h).c_str(), mn.address.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines reach logs and pipes at once
  CLI::App app{"dmhnsw computenode: builds and searches HNSW indexes held by memnodes, over one-sided "
               "remote memory operations.\nWithout a subcommand it connects to every memnode and prints their "
               "region headers."};
  app.set_config("--config", "", "read these options from a TOML/INI file (same names as the flags)");
  std::string mode = "shine", memnodes, provider = "shm", token_file, log_level = "info";
  uint32_t cn_id = 0, num_cns = 1;
  app.add_option("--mode", mode, "index mode: shine (one global HNSW) or dhnsw (partitioned sub-HNSWs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shine", "dhnsw"}));
  app.add_option("--memnodes", memnodes, "control addresses of every memnode, HOST:PORT[,HOST:PORT...]")->required();
  app.add_option("--provider", provider, "fabric: shm (one host), tcp (any IP network), verbs (RDMA NICs, soft-RoCE), cxl (one host: the memnodes' regions mapped, a shared memory device)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp", "verbs", "cxl"}));
  app.add_option("--token-file", token_file, "file holding the cluster token (else the DMHNSW_TOKEN variable)");
  app.add_option("--cn-id", cn_id, "this computenode's id, 0..num-cns-1")->capture_default_str();
  app.add_option("--num-cns", num_cns, "number of computenodes in the run")->capture_default_str()->check(CLI::PositiveNumber);
  int heartbeat_ms = 4000;
  app.add_option("--heartbeat-timeout-ms", heartbeat_ms,
                 "a memnode whose control connection answers no ping for this long is declared dead")
      ->capture_default_str()
      ->check(CLI::Range(500, 600000));
  int stall_ms = 10000;
  app.add_option("--stall-timeout-ms", stall_ms,
                 "a memnode whose fabric endpoint takes or completes none of our operations for this long is "
                 "declared dead, even while its control connection answers")
      ->capture_default_str()
      ->check(CLI::Range(1000, 3600000));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  std::string wire = "none";
  app.add_option("--wire", wire,
                 "wire model on any provider: none, cxl, rdma-56g, rdma-100g or LAT_US,GBPS: each one-sided operation "
                 "completes no sooner than latency + bytes / bandwidth after its post, the bandwidth shared per "
                 "memnode; waiting sleeps (docs/wire-model.md)")
      ->capture_default_str();

  auto* st = app.add_subcommand("selftest", "write, read, batched reads, fetch_adds, compare_swaps and messages "
                                            "against the scratch area of every memnode, checking every result");
  compute::SelftestOptions so;
  st->add_option("--atomics", so.atomics, "fetch_adds and compare_swap increments per memnode")->capture_default_str();
  st->add_option("--loop", so.loop_seconds, "after the checks, keep reading for this many seconds")->capture_default_str();

  // ---- shine/dhnsw index commands
  shine::BuildOptions bo;
  std::string build_cache = "2GiB";
  std::string metric = "l2", read_mode = "batch", build_report, query_report, store_dir, ef_list = "64";
  auto* build = app.add_subcommand("build", "format the memnodes for an index (the first computenode to arrive "
                                            "does it) and insert this computenode's share of --data (rows i with "
                                            "i % num-cns == cn-id)");
  auto* insert = app.add_subcommand("insert", "insert rows [--begin, --end) of --data into an existing index "
                                              "(this computenode's share of them), while others may query");
  for (auto* sc : {build, insert}) {
    sc->add_option("--data", bo.data, "base vectors (.fvecs .bvecs .fbin .u8bin .i8bin); labels are row ids")->required();
    sc->add_option("--max-elements", bo.max_elements, "use only the first N rows (0 = all)")->capture_default_str();
    sc->add_option("--threads", bo.threads, "worker threads (each with its own endpoint)")->capture_default_str();
    sc->add_option("--coroutines", bo.coroutines, "inserts in flight per thread")->capture_default_str();
    sc->add_option("--report", build_report,
                   "write the build report (JSON) here (shine: computenode 0, merged; dhnsw: each computenode, "
                   "PATH.cn<id> when --num-cns > 1)");
    sc->add_option("--build-cache", build_cache, "memory for vectors read while inserting (they never change), e.g. 2GiB")
        ->capture_default_str();
  }
  build->add_option("--m", bo.params.m, "HNSW M: neighbours per node on upper levels (2M on level 0)")->capture_default_str();
  build->add_option("--ef-construction", bo.params.ef_construction, "HNSW efConstruction")->capture_default_str();
  build->add_option("--metric", metric, "l2 or ip")->capture_default_str()->check(CLI::IsMember({"l2", "ip"}));
  build->add_option("--seed", bo.params.seed, "seed of levels and memnode choice")->capture_default_str();
  build->add_option("--store-index", store_dir, "after the build, every memnode writes its region to DIR/memnode-<id>.img");
  // d-HNSW build (as tools/dhnsw-build) and insert options
  dhnsw::OnlineBuildOptions dbo;
  std::string partition_metric = "l2";
  build->add_option("--partitions", dbo.build.partitions, "dhnsw: partitions / sub-HNSWs (0: round(sqrt(n)))")
      ->capture_default_str();
  build->add_option("--meta-m", dbo.build.meta_m, "dhnsw: HNSW M of the meta-HNSW")->capture_default_str();
  build->add_option("--internal-gap", dbo.build.layout.internal_gap,
                    "dhnsw: internal gap after each array of a sub-HNSW, share of it (0..1000)")
      ->capture_default_str();
  build->add_option("--overflow-gap", dbo.build.layout.overflow_gap,
                    "dhnsw: shared overflow gap of a group, share of its two blocks (0..1000)")
      ->capture_default_str();
  build->add_option("--partition-metric", partition_metric, "dhnsw: l2 or ip, metric of the partitioning and meta-HNSW")
      ->capture_default_str()
      ->check(CLI::IsMember({"l2", "ip"}));
  dhnsw::InsertOptions dio;
  insert->add_option("--id-offset", dio.id_offset, "dhnsw: a row's id is this plus its row number")->capture_default_str();
  insert->add_option("--batch", dio.batch, "dhnsw: vectors routed and committed together")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::string share;
  insert->add_option("--share", share,
                     "dhnsw: I/K: insert rows i with i % K == I (default: cn-id/num-cns), so that K inserting "
                     "computenodes split the rows while others query");
  insert->add_option("--lease-ms", dio.tuning.lease_ms,
                     "dhnsw: a group lock word unchanged this long is taken over (its holder is presumed dead)")
      ->capture_default_str()
      ->check(CLI::Range(10u, 600000u));
  insert->add_option("--begin", bo.begin, "first row to insert")->capture_default_str();
  insert->add_option("--end", bo.end, "one past the last row (0 = all)")->capture_default_str();

  auto* rebuild = app.add_subcommand("rebuild", "dhnsw: an online rebuild now (paper section 4.5): re-partition "
                                                "and rebuild into a shadow area while others insert and query, publish "
                                                "the next epoch, merge the insert buffer");
  dhnsw::RebuildOptions dro;
  rebuild->add_option("--lease-ms", dro.lease_ms, "a master word unchanged this long is taken over")
      ->capture_default_str()
      ->check(CLI::Range(100u, 600000u));
  rebuild->add_option("--threads", dro.threads, "build threads (0: every core)")->capture_default_str();
  rebuild->add_option("--report", build_report, "write the rebuild report (JSON) here");

  shine::QueryOptions qo;
  auto* query = app.add_subcommand("query", "run a workload (tools/workload) against the index; computenode 0 "
                                            "gathers every computenode's numbers and writes the merged report");
  query->add_option("--workload", qo.workload, "workload file from tools/workload")->required();
  query->add_option("--k", qo.k, "neighbours per query")->capture_default_str();
  query->add_option("--ef-search", ef_list, "efSearch, or a comma list to run one after the other")->capture_default_str();
  query->add_option("--threads", qo.threads, "worker threads")->capture_default_str();
  query->add_option("--coroutines", qo.coroutines, "queries in flight per thread (C++20 coroutines)")->capture_default_str();
  query->add_option("--repeat-seconds", qo.repeat_seconds, "cycle through the measured part for at least this long (dhnsw --mix: run the mixed stream this long)")
      ->capture_default_str();
  query->add_option("--report", query_report, "write the query report (JSON) here (computenode 0: merged)");
  std::string cache_bytes;
  query->add_option("--cache-ratio", qo.cache_ratio,
                    "shine: node cache per computenode as a share of the index size, e.g. 0.05 (0: no cache); "
                    "dhnsw: sub-HNSWs kept across batches as a share of the partitions (default 0.10)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  query->add_option("--cache-bytes", cache_bytes, "node cache per computenode in bytes, e.g. 64MiB (overrides --cache-ratio)");
  query->add_option("--admit-probability", qo.admit_probability, "level-0 nodes enter the cache with this probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  query->add_option("--routing", qo.routing,
                    "none: every computenode answers its own share; best-fit: to the computenode whose partition "
                    "fits; balanced: best fit within equal quotas per batch; adaptive: quotas from the computenodes' "
                    "queue lengths (paper Algorithm 2)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "best-fit", "balanced", "adaptive"}));
  query->add_option("--route-batch", qo.route_batch, "b: queries per routing batch (balanced, adaptive)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  query->add_option("--route-threshold", qo.route_threshold,
                    "t: after a batch the router waits while its working queue is longer (adaptive)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  query->add_option("--adaptive-quota", qo.adaptive_quota,
                    "adaptive: what the queue weights scale; even: b/K per computenode (paper Algorithm 2, equal "
                    "queues give balanced routing); demand: the batch's best-fit counts (equal queues give "
                    "best-fit, a computenode with a longer queue keeps less)")
      ->capture_default_str()
      ->check(CLI::IsMember({"even", "demand"}));
  query->add_option("--oracle", qo.oracle,
                    "how a query's computenode is ranked: balanced: distance to the partition centroids plus "
                    "per-partition offsets that split the partitioned sample evenly; nearest: distance to the "
                    "centroids only (the paper)")
      ->capture_default_str()
      ->check(CLI::IsMember({"balanced", "nearest"}));
  query->add_option("--kmeans-seed", qo.kmeans_seed, "seed of the balanced k-means (the same on every computenode)")
      ->capture_default_str();
  query->add_option("--trace", qo.trace_dir, "record every node-cache access to DIR/cn<id>-t<thread>.trace (tools/csp-report)");
  // ---- dhnsw query options (paper sections 4.3-4.4)
  dhnsw::QueryOptions dq;
  bool no_regroup = false, no_doorbell = false, no_pipeline = false;
  query->add_option("--batch", dq.engine.batch, "dhnsw: B, queries per batch")->capture_default_str()->check(CLI::PositiveNumber);
  query->add_option("--max-wait-us", dq.engine.max_wait_us,
                    "dhnsw: a batch closes this long after its first query arrived (with --arrival-qps)")
      ->capture_default_str();
  query->add_option("--arrival-qps", dq.engine.arrival_qps,
                    "dhnsw: queries arrive at this rate (0: all are there at the start)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  query->add_option("--probe", dq.engine.probe, "dhnsw: b, partitions (sub-HNSWs) searched per query")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  query->add_option("--meta-ef-search", dq.engine.meta_ef_search, "dhnsw: efSearch in the meta-HNSW")->capture_default_str();
  query->add_option("--cache-subs", dq.engine.cache_subs,
                    "dhnsw: c, deserialized sub-HNSWs kept across batches (overrides --cache-ratio)");
  query->add_option("--doorbell-subs", dq.engine.doorbell_subs, "dhnsw: sub-HNSW fetches posted with one doorbell")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  query->add_option("--queue-depth", dq.engine.queue_depth, "dhnsw: items between two pipeline stages")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  query->add_option("--search-threads", dq.engine.search_threads,
                    "dhnsw: threads of one sub-HNSW search (0: every core)")
      ->capture_default_str();
  std::string mix;
  dhnsw::MixedOptions dmo;
  query->add_option("--mix", mix,
                    "dhnsw: insert:P: a share P of each batch's operations are inserts of --insert-data rows (this "
                    "computenode's share), the rest searches; the report separates them, with a timeline");
  query->add_option("--insert-data", dmo.insert_data, "dhnsw --mix: vectors to insert");
  query->add_option("--insert-begin", dmo.insert_begin, "dhnsw --mix: first row to insert")->capture_default_str();
  query->add_option("--insert-end", dmo.insert_end, "dhnsw --mix: one past the last row (0: all)")->capture_default_str();
  query->add_option("--insert-id-offset", dmo.id_offset, "dhnsw --mix: a row's id is this plus its row number")
      ->capture_default_str();
  query->add_flag("--no-regroup", no_regroup, "dhnsw ablation: each query fetches its own partitions (no sharing, no cache)");
  query->add_flag("--no-doorbell", no_doorbell, "dhnsw ablation: one READ per post, each waited for");
  query->add_flag("--no-pipeline", no_pipeline, "dhnsw ablation: fetch, deserialize and search in sequence on one thread");
  serve::ServeOptions svo;
  auto* serve_cmd = serve::add_serve_subcommand(app, svo);
  for (auto* sc : {build, insert, query})
    sc->add_option("--read-mode", read_mode, "batch: a candidate's neighbours in one doorbell; per-read: one READ each")
        ->capture_default_str()
        ->check(CLI::IsMember({"batch", "per-read"}));
  CLI11_PARSE(app, argc, argv);

  spdlog::set_pattern("[%H:%M:%S.%e] [computenode " + std::to_string(cn_id) + "] [%l] %v");
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    if (cn_id >= num_cns) throw std::invalid_argument("--cn-id " + std::to_string(cn_id) + " must be below --num-cns " +
                                                      std::to_string(num_cns));
    fabric::ClusterOptions co;
    co.provider = fabric::parse_provider(provider);
    co.memnodes = split_commas(memnodes);
    co.token = fabric::load_token(token_file);
    co.mode = *st ? fabric::Mode::None : fabric::parse_mode(mode);
    co.cn_id = cn_id;
    co.num_cns = num_cns;
    co.heartbeat_timeout_ms = heartbeat_ms;
    co.stall_timeout_ms = stall_ms;
    const fabric::WireModel wm = fabric::parse_wire(wire);
    auto cluster = fabric::with_wire(fabric::connect_cluster(co), wm);
    spdlog::info("connected to {} memnode(s) over {}", cluster->memnodes().size(), provider);
    if (!*build && !*insert && !*query && !*rebuild && !*serve_cmd) print_headers(*cluster);
    // Runs that write a report measure the memnodes' CPU over the run (memnode_cpu).
    std::unique_ptr<compute::MemnodeCpuMeter> cpu;
    if (!build_report.empty() || !query_report.empty()) cpu = std::make_unique<compute::MemnodeCpuMeter>(*cluster);
    // One writer per file: computenode 0 writes the merged report to --report, computenode i
    // its own to --report.cn<i> (all may be given the same --report). `per_process` paths
    // already name their computenode.
    auto write_report = [&cpu, &wm, &provider, cn_id, num_cns](std::string path, nlohmann::json r,
                                                              bool per_process = false) {
      if (path.empty()) return;
      if (!per_process && num_cns > 1 && cn_id != 0) path += ".cn" + std::to_string(cn_id);
      if (cpu) r["memnode_cpu"] = cpu->since_start();
      r["process_memory"] = compute::process_memory();
      r["wire"] = {{"model", fabric::describe(wm)}, {"latency_us", wm.latency_us}, {"gbytes_per_s", wm.gbytes_per_s}};
      if (!r.contains("provider")) r["provider"] = provider;
      write_json_file(path, r, "--report");
      std::printf("report: %s\n", path.c_str());
    };
    shine::RunContext rc{cluster.get(), cn_id, num_cns, provider, {}};
    rc.departed_at_connect = compute::Board::departures(*cluster->make_endpoint(1u << 20));
    auto rm = read_mode == "batch" ? shine::ReadMode::Batch : shine::ReadMode::PerRead;
    if (*serve_cmd) {
      svo.mode = mode;
      svo.token = co.token;
      return serve::run_serve(rc, svo);
    }
    if (*rebuild) {
      if (mode != "dhnsw") throw std::invalid_argument("rebuild: only --mode dhnsw has epochs");
      auto ep = cluster->make_endpoint(64u << 20);
      auto r = dhnsw::run_rebuild(*cluster, *ep, cn_id, dro);
      if (r.contains("skipped")) {
        std::printf("dhnsw rebuild: another computenode is the rebuild master; nothing done\n");
      } else {
        std::printf("dhnsw rebuild: epoch %llu live, %llu vectors, %llu buffered inserts merged, %.2f s\n",
                    static_cast<unsigned long long>(r.value("epoch", uint64_t{0})),
                    static_cast<unsigned long long>(r.value("vectors", uint64_t{0})),
                    static_cast<unsigned long long>(r.value("merged", uint64_t{0})), r.value("seconds_total", 0.0));
      }
      write_report(build_report, r);
      return 0;
    }
    if (mode == "dhnsw" && (*build || *insert)) {
      std::string path = build_report;
      if (!path.empty() && num_cns > 1) path += ".cn" + std::to_string(cn_id);  // one file per process
      if (*build) {
        dbo.data = bo.data;
        dbo.max_vectors = bo.max_elements;
        dbo.metric = parse_metric(metric);
        dbo.build.partition_metric = parse_metric(partition_metric);
        if (build->get_option("--m")->count() > 0) dbo.build.m = bo.params.m;
        if (build->get_option("--ef-construction")->count() > 0) dbo.build.ef_construction = bo.params.ef_construction;
        if (build->get_option("--seed")->count() > 0) dbo.build.seed = bo.params.seed;
        if (build->get_option("--threads")->count() > 0) dbo.build.threads = bo.threads;
        auto r = dhnsw::run_online_build({cluster.get(), cn_id, num_cns, provider}, dbo);
        if (!r.contains("skipped"))
          std::printf("dhnsw build: %llu vectors in %u partitions; wrote %llu bytes in %llu WRITEs, %llu doorbells, "
                      "%.2f s\n", static_cast<unsigned long long>(r["vectors"].get<uint64_t>()),
                      r["options"]["partitions"].get<unsigned>(),
                      static_cast<unsigned long long>(r["write"]["bytes"].get<uint64_t>()),
                      static_cast<unsigned long long>(r["write"]["writes"].get<uint64_t>()),
                      static_cast<unsigned long long>(r["write"]["doorbells"].get<uint64_t>()),
                      r["write"]["seconds"].get<double>());
        write_report(path, r, true);
        return 0;
      }
      dio.data = bo.data;
      dio.share_index = cn_id;
      dio.share_count = num_cns;
      if (!share.empty()) {
        const auto slash = share.find('/');
        try {
          if (slash == std::string::npos) throw std::invalid_argument("no /");
          dio.share_index = static_cast<uint32_t>(std::stoul(share.substr(0, slash)));
          dio.share_count = static_cast<uint32_t>(std::stoul(share.substr(slash + 1)));
        } catch (const std::exception&) {
          throw std::invalid_argument("--share '" + share + "': want I/K, e.g. 0/2");
        }
        if (dio.share_count == 0 || dio.share_index >= dio.share_count)
          throw std::invalid_argument("--share '" + share + "': I must be below K");
      }
      dio.begin = bo.begin;
      dio.end = bo.end;
      auto r = dhnsw::run_insert({cluster.get(), cn_id, num_cns, provider}, dio);
      dhnsw::print_insert(r);
      write_report(path, r, true);
      return 0;
    }
    if (*build || *insert) {
      bo.params.metric = parse_metric(metric);
      bo.mode = rm;
      bo.format = static_cast<bool>(*build);
      bo.cache_bytes = parse_bytes(build_cache, "--build-cache");
      auto r = shine::run_build(rc, bo);
      if (cn_id == 0) shine::print_build(r);
      write_report(build_report, r);
      if (!store_dir.empty() && cn_id == 0) {
        auto ep = cluster->make_endpoint(8u << 20);
        compute::store_index(*cluster, *ep, store_dir);
      }
      return 0;
    }
    if (*query && mode == "dhnsw") {
      dq.workload = qo.workload;
      dq.engine.k = qo.k;
      dq.ef_search.clear();
      for (auto& e : split_commas(ef_list)) dq.ef_search.push_back(static_cast<uint32_t>(std::stoul(e)));
      if (dq.ef_search.empty()) throw std::invalid_argument("--ef-search: no value");
      // --cache-ratio is a share of the sub-HNSWs here (default 0.10, like the paper)
      dq.engine.cache_ratio = query->get_option("--cache-ratio")->count() > 0 ? qo.cache_ratio : 0.10;
      dq.engine.regroup = !no_regroup;
      dq.engine.doorbell = !no_doorbell;
      dq.engine.pipeline = !no_pipeline;
      dq.on_report = [&](const nlohmann::json& r) {
        if (cn_id == 0) dhnsw::print_query(r);
        write_report(query_report, r);
      };
      if (!mix.empty()) {
        dmo.insert_share = dhnsw::parse_mix(mix);
        dmo.seconds = qo.repeat_seconds;
        auto r = dhnsw::run_mixed({cluster.get(), cn_id, num_cns, provider}, dq, dmo);
        dhnsw::print_mixed(r);
        write_report(num_cns > 1 && !query_report.empty() ? query_report + ".cn" + std::to_string(cn_id) : query_report, r,
                     true);
        return 0;
      }
      dhnsw::run_query({cluster.get(), cn_id, num_cns, provider}, dq);
      return 0;
    }
    if (*query) {
      qo.mode = rm;
      if (!cache_bytes.empty()) qo.cache_bytes = parse_bytes(cache_bytes, "--cache-bytes");
      qo.ef_search.clear();
      for (auto& e : split_commas(ef_list)) qo.ef_search.push_back(static_cast<uint32_t>(std::stoul(e)));
      if (qo.ef_search.empty()) throw std::invalid_argument("--ef-search: no value");
      qo.on_report = [&](const nlohmann::json& r) {
        if (cn_id == 0) shine::print_query(r);
        write_report(query_report, r);
      };
      shine::run_query(rc, qo);
      return 0;
    }
    if (*st) {
      so.cn_id = cn_id;
      auto r = compute::run_selftest(*cluster, so);
      std::printf("selftest: %llu checks, %llu failed\n", static_cast<unsigned long long>(r.checks),
                  static_cast<unsigned long long>(r.failures));
      return r.failures == 0 ? 0 : 1;
    }
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
