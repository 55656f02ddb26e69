// The computenode's shared flags and how a run's report is written.
#include <cstdio>

#include "common/json_file.hpp"
#include "compute/commands/commands.hpp"

namespace dmhnsw::commands {

void GlobalFlags::add(CLI::App& app) {
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
  app.add_option("--heartbeat-timeout-ms", heartbeat_ms,
                 "a memnode whose control connection answers no ping for this long is declared dead")
      ->capture_default_str()
      ->check(CLI::Range(500, 600000));
  app.add_option("--stall-timeout-ms", stall_ms,
                 "a memnode whose fabric endpoint takes or completes none of our operations for this long is "
                 "declared dead, even while its control connection answers")
      ->capture_default_str()
      ->check(CLI::Range(1000, 3600000));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_option("--wire", wire,
                 "wire model on any provider: none, cxl, rdma-56g, rdma-100g or LAT_US,GBPS: each one-sided operation "
                 "completes no sooner than latency + bytes / bandwidth after its post, the bandwidth shared per "
                 "memnode; waiting sleeps (docs/wire-model.md)")
      ->capture_default_str();
}

void RunEnv::write_report(std::string path, nlohmann::json r, bool per_process) const {
  if (path.empty()) return;
  if (!per_process && flags.num_cns > 1 && flags.cn_id != 0) path += ".cn" + std::to_string(flags.cn_id);
  if (cpu) r["memnode_cpu"] = cpu->since_start();
  r["process_memory"] = compute::process_memory();
  r["wire"] = {{"model", fabric::describe(wire)}, {"latency_us", wire.latency_us}, {"gbytes_per_s", wire.gbytes_per_s}};
  if (!r.contains("provider")) r["provider"] = flags.provider;
  write_json_file(path, r, "--report");
  std::printf("report: %s\n", path.c_str());
}

void SelftestCommand::add(CLI::App& app) {
  st_ = app.add_subcommand("selftest", "write, read, batched reads, fetch_adds, compare_swaps and messages "
                                       "against the scratch area of every memnode, checking every result");
  st_->add_option("--atomics", so_.atomics, "fetch_adds and compare_swap increments per memnode")->capture_default_str();
  st_->add_option("--loop", so_.loop_seconds, "after the checks, keep reading for this many seconds")->capture_default_str();
}

int SelftestCommand::run(RunEnv& env) {
  so_.cn_id = env.flags.cn_id;
  auto r = compute::run_selftest(env.cluster, so_);
  std::printf("selftest: %llu checks, %llu failed\n", static_cast<unsigned long long>(r.checks),
              static_cast<unsigned long long>(r.failures));
  return r.failures == 0 ? 0 : 1;
}

}  // namespace dmhnsw::commands
