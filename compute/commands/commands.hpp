#pragma once
// The computenode's command line: the flags every subcommand shares (GlobalFlags), what a
// subcommand runs with once connected (RunEnv), and one class per subcommand that registers
// its own flags and runs it. `serve` registers itself the same way (compute/serve/serve.hpp).
#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "common/fabric/transport.hpp"
#include "common/fabric/wire.hpp"
#include "compute/dhnsw/epoch.hpp"
#include "compute/dhnsw/insert_run.hpp"
#include "compute/dhnsw/mixed.hpp"
#include "compute/dhnsw/online.hpp"
#include "compute/dhnsw/query.hpp"
#include "compute/memnode_cpu.hpp"
#include "compute/run_context.hpp"
#include "compute/lock_hammer.hpp"
#include "compute/rejoin.hpp"
#include "compute/selftest.hpp"
#include "compute/shine/engine.hpp"

namespace dmhnsw::commands {

struct GlobalFlags {
  std::string mode = "shine", memnodes, provider = "shm", token_file, log_level = "info", wire = "none", pin = "auto";
  bool hugepages = false, no_hugepages = false;
  uint32_t cn_id = 0, num_cns = 1;
  int heartbeat_ms = 4000, stall_ms = 10000;
  void add(CLI::App& app);
};

/// A connected computenode: the cluster, the run's context, and how reports are written.
struct RunEnv {
  const GlobalFlags& flags;
  fabric::Cluster& cluster;
  compute::RunContext rc;
  fabric::WireModel wire;
  std::unique_ptr<compute::MemnodeCpuMeter> cpu;  // runs that write a report measure the memnodes' CPU
  /// One writer per file: computenode 0 writes the merged report to `path`, computenode i its
  /// own to `path`.cn<i> (all may be given the same --report). `per_process` paths already
  /// name their computenode. Adds the memnodes' CPU, this process's memory, the wire model.
  void write_report(std::string path, nlohmann::json r, bool per_process = false) const;
};

/// `build`, `insert` and `rebuild`: making and changing an index, in either mode.
class IndexCommands {
 public:
  void add(CLI::App& app);
  /// The `--read-mode` flag of build and insert (registered after every subcommand's own flags).
  void add_read_mode(std::string& read_mode);
  bool selected() const {
    return *build_ || *insert_ || *upsert_ || *delete_ || *consolidate_ || *rebuild_ || *snapshot_;
  }
  /// `snapshot` works on an index of either mode.
  bool any_mode() const { return static_cast<bool>(*snapshot_); }
  bool wants_report() const { return !report_.empty(); }
  int run(RunEnv& env, shine::ReadMode rm);

 private:
  int run_rebuild(RunEnv& env);
  int run_snapshot(RunEnv& env, const std::string& dir, int wait_s);
  int run_dhnsw(RunEnv& env);
  int run_shine(RunEnv& env, shine::ReadMode rm);
  CLI::App *build_ = nullptr, *insert_ = nullptr, *upsert_ = nullptr, *delete_ = nullptr, *rebuild_ = nullptr;
  CLI::App *consolidate_ = nullptr, *snapshot_ = nullptr;
  int wait_s_ = 60;  // snapshot: --wait-seconds
  shine::BuildOptions bo_;
  shine::DeleteOptions del_;
  shine::ConsolidateOptions con_;
  std::string ids_file_;
  int64_t id_capacity_ = -1;  // shine build: -1 twice the rows, 0 no id index
  std::string codes_ = "none";  // shine build: --codes
  std::string build_cache_ = "2GiB", metric_ = "l2", report_, store_dir_, partition_metric_ = "l2", share_;
  dhnsw::OnlineBuildOptions dbo_;
  dhnsw::InsertOptions dio_;
  dhnsw::RebuildOptions dro_;
};

/// `query`: a workload against the index, in either mode.
class QueryCommand {
 public:
  void add(CLI::App& app);
  void add_read_mode(std::string& read_mode);
  bool selected() const { return static_cast<bool>(*query_); }
  bool wants_report() const { return !report_.empty(); }
  int run(RunEnv& env, shine::ReadMode rm);

 private:
  int run_dhnsw(RunEnv& env);
  CLI::App* query_ = nullptr;
  shine::QueryOptions qo_;
  std::string ef_list_ = "64", report_, mix_;
  dhnsw::QueryOptions dq_;
  dhnsw::MixedOptions dmo_;
  bool no_regroup_ = false, no_doorbell_ = false, no_pipeline_ = false;
};

/// `selftest`: every remote operation against every memnode's scratch area, checked.
class SelftestCommand {
 public:
  void add(CLI::App& app);
  bool selected() const { return static_cast<bool>(*st_); }
  int run(RunEnv& env);

 private:
  CLI::App* st_ = nullptr;
  compute::SelftestOptions so_;
  compute::LockHammerOptions lh_;
  std::string lock_release_ = "cas";
};

/// `rejoin`: fills a new copy of a replica set and makes it a full copy (compute/rejoin.hpp).
class RejoinCommand {
 public:
  void add(CLI::App& app);
  bool selected() const { return static_cast<bool>(*cmd_); }
  int run(RunEnv& env);

 private:
  CLI::App* cmd_ = nullptr;
  compute::RejoinOptions o_;
  std::string report_;
};

}  // namespace dmhnsw::commands
