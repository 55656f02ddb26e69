// The computenode's shared flags and how a run's report is written.
#include <cstdio>

#include "common/json_file.hpp"
#include "common/fabric/pages.hpp"
#include "common/fabric/providers.hpp"
#include "compute/pinning.hpp"
#include "compute/commands/commands.hpp"

namespace dmhnsw::commands {

void GlobalFlags::add(CLI::App& app) {
  app.add_option("--mode", mode, "index mode: shine (one global HNSW) or dhnsw (partitioned sub-HNSWs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shine", "dhnsw"}));
  app.add_option("--memnodes", memnodes, "control addresses of every memnode, HOST:PORT[,HOST:PORT...]")->required();
  app.add_option("--provider", provider, "fabric: " + fabric::provider_help())
      ->capture_default_str()
      ->check(CLI::IsMember(fabric::provider_names()));
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
  app.add_option("--pin", pin,
                 "pin worker threads to cores (shine's query, build and serve workers), the NIC's NUMA node first, one "
                 "hardware thread per physical core before any second: on, off, or auto (on where this process may "
                 "run on more cores than it has workers)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_flag("--hugepages", hugepages,
               "map the endpoints' registered buffer pools on 2 MiB hugepages (normal pages with a warning when too "
               "few are reserved). By default they are whenever the host has enough reserved and free, else normal "
               "pages advised for transparent hugepages");
  app.add_flag("--no-hugepages", no_hugepages, "buffer pools on normal pages, no transparent hugepages")
      ->excludes("--hugepages");
}

void RunEnv::write_report(std::string path, nlohmann::json r, bool per_process) const {
  if (path.empty()) return;
  if (!per_process && flags.num_cns > 1 && flags.cn_id != 0) path += ".cn" + std::to_string(flags.cn_id);
  if (cpu) r["memnode_cpu"] = cpu->since_start();
  r["process_memory"] = compute::process_memory();
  r["pinning"] = compute::pinning_json();
  const fabric::PoolCounts pools = fabric::pool_counts();
  r["buffer_pools"] = {{"pages", fabric::to_string(fabric::pool_pages())},
                       {"on_hugepages", pools.hugepages},
                       {"on_normal_pages", pools.normal}};
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
  st_->add_option("--lock-hammer", lh_.seconds,
                  "after the checks, threads x coroutines take and release shared lock words on memnode 0 for this "
                  "many seconds, checking exclusion and that no release is lost (0: off; run one computenode)")
      ->default_val(0);
  st_->add_option("--lock-words", lh_.words, "--lock-hammer: shared lock words")
      ->capture_default_str()
      ->check(CLI::Range(1u, compute::LockHammerOptions::kMaxWords));
  st_->add_option("--lock-threads", lh_.threads, "--lock-hammer: threads, one endpoint each")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  st_->add_option("--lock-coroutines", lh_.coroutines, "--lock-hammer: coroutines per thread")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  st_->add_option("--lock-release", lock_release_,
                  "--lock-hammer: release a lock by cas (COMPARE_SWAP, as dmhnsw does), or by write (a plain WRITE, "
                  "which RDMA does not order against other queue pairs' atomics: shows a lost release)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cas", "write"}));
}

void RejoinCommand::add(CLI::App& app) {
  cmd_ = app.add_subcommand("rejoin", "replica sets: copy a live copy of --memnode into the new memnode started with "
                                      "--rejoin in its dead --copy's place while computenodes go on, then make it a "
                                      "full copy for every computenode (docs/replication.md)");
  cmd_->add_option("--memnode", o_.memnode, "the memnode id whose set the copy joins")->required();
  cmd_->add_option("--copy", o_.copy, "the copy that joins (memnode --copy of the new memnode)")->required();
  cmd_->add_option("--ack-timeout", o_.ack_timeout_s, "seconds every computenode has to acknowledge each step")
      ->capture_default_str()
      ->check(CLI::Range(1, 600));
  cmd_->add_option("--report", report_, "write the rejoin report (JSON) here");
}

int RejoinCommand::run(RunEnv& env) {
  o_.cn_id = env.flags.cn_id;
  const auto r = compute::run_rejoin(env.cluster, o_);
  std::printf("rejoin: memnode %u copy %u is a full copy: %.1f MiB copied at %.2f GB/s, %u pass(es) over %.1f MiB "
              "changed meanwhile, frozen %.1f ms for the last %.1f MiB, %.2f s in all\n",
              o_.memnode, o_.copy, r.first_pass_bytes / 1048576.0, r.first_pass_gbps(), r.passes,
              r.recopied_bytes / 1048576.0, r.frozen_ms, r.final_bytes / 1048576.0, r.total_s);
  if (!report_.empty())
    env.write_report(report_, {{"tool", "computenode rejoin"},
                               {"mode", env.flags.mode},
                               {"kind", "rejoin"},
                               {"memnode", o_.memnode},
                               {"copy", o_.copy},
                               {"region_bytes", r.region_bytes},
                               {"chunk_bytes", r.chunk_bytes},
                               {"first_pass_bytes", r.first_pass_bytes},
                               {"first_pass_seconds", r.first_pass_s},
                               {"first_pass_gbytes_per_s", r.first_pass_gbps()},
                               {"passes", r.passes},
                               {"recopied_bytes", r.recopied_bytes},
                               {"final_bytes", r.final_bytes},
                               {"frozen_ms", r.frozen_ms},
                               {"seconds", r.total_s}});
  return 0;
}

int SelftestCommand::run(RunEnv& env) {
  so_.cn_id = env.flags.cn_id;
  auto r = compute::run_selftest(env.cluster, so_);
  std::printf("selftest: %llu checks, %llu failed\n", static_cast<unsigned long long>(r.checks),
              static_cast<unsigned long long>(r.failures));
  if (r.failures != 0) return 1;
  if (lh_.seconds <= 0) return 0;
  lh_.release_by_write = lock_release_ == "write";
  const auto h = compute::run_lock_hammer(env.cluster, lh_);
  std::printf("lock hammer: %u word(s), %u thread(s) x %u coroutine(s), release by %s: %llu acquisitions, %llu "
              "failed COMPARE_SWAPs, counters grew by %llu, longest wait %.1f ms, %.1f s\n",
              lh_.words, lh_.threads, lh_.coroutines, lock_release_.c_str(),
              static_cast<unsigned long long>(h.acquisitions), static_cast<unsigned long long>(h.cas_failures),
              static_cast<unsigned long long>(h.counter_delta), h.max_wait_ms, h.seconds);
  if (!h.failure.empty()) {
    std::printf("lock hammer: FAILED: %s\n", h.failure.c_str());
    return 1;
  }
  std::printf("lock hammer: every lock exclusive, every release seen\n");
  return 0;
}

}  // namespace dmhnsw::commands
