// computenode: does all the computing; reads the index from memnodes with one-sided
// operations. This file is the control path: the command line (each subcommand registers
// its own flags, compute/commands/), the connection, and dispatch to the subcommand.
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/version.hpp"
#include "common/fabric/cluster.hpp"
#include "common/fabric/pages.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "compute/board.hpp"
#include "compute/commands/commands.hpp"
#include "compute/pinning.hpp"
#include "compute/serve/serve.hpp"

using namespace dmhnsw;

namespace {

void print_headers(const fabric::Cluster& c) {
  for (const auto& mn : c.memnodes()) {
    RegionHeader h = header_from_blob(mn.header, "memnode " + std::to_string(mn.id) + " (" + mn.address + ")");
    std::printf("%s  [%s]\n", describe(h).c_str(), mn.address.c_str());
  }
}

/// After "The following arguments were not expected": for each unknown --flag, the subcommands
/// that take it (a flag of `insert` given to `build`, say).
void hint_other_subcommands(CLI::App& app, int argc, char** argv) {
  CLI::App* chosen = nullptr;
  for (CLI::App* sc : app.get_subcommands()) chosen = sc;
  if (chosen == nullptr) return;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0) continue;
    flag = flag.substr(0, flag.find('='));
    if (chosen->get_option_no_throw(flag) != nullptr || app.get_option_no_throw(flag) != nullptr) continue;
    std::string takers;
    for (const CLI::App* sc : app.get_subcommands({})) {
      if (sc == chosen || sc->get_option_no_throw(flag) == nullptr) continue;
      takers += (takers.empty() ? "" : ", ") + sc->get_name();
    }
    if (takers.empty()) continue;
    std::fprintf(stderr, "%s is not a flag of `%s` but of `%s`", flag.c_str(), chosen->get_name().c_str(),
                 takers.c_str());
    if (chosen->get_name() == "build" && (flag == "--begin" || flag == "--end"))
      std::fprintf(stderr, "; `build` takes --max-elements N (the first N rows of --data), and `insert` adds more later");
    std::fprintf(stderr, " (computenode %s --help lists its flags)\n", chosen->get_name().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines reach logs and pipes at once
  CLI::App app{"dmhnsw computenode: builds and searches HNSW indexes held by memnodes, over one-sided "
               "remote memory operations.\nWithout a subcommand it connects to every memnode and prints their "
               "region headers."};
  app.set_version_flag("--version", dmhnsw::version_line("computenode"));
  app.set_config("--config", "", "read these options from a TOML/INI file (same names as the flags)");
  commands::GlobalFlags flags;
  flags.add(app);
  commands::SelftestCommand selftest;
  selftest.add(app);
  commands::RejoinCommand rejoin;
  rejoin.add(app);
  commands::IndexCommands index;
  index.add(app);
  commands::QueryCommand query;
  query.add(app);
  serve::ServeOptions svo;
  auto* serve_cmd = serve::add_serve_subcommand(app, svo);
  std::string read_mode = "batch";
  index.add_read_mode(read_mode);
  query.add_read_mode(read_mode);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) hint_other_subcommands(app, argc, argv);
    return code;
  }

  spdlog::set_pattern("[%H:%M:%S.%e] [computenode " + std::to_string(flags.cn_id) + "] [%l] %v");
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  try {
    if (flags.cn_id >= flags.num_cns)
      throw std::invalid_argument("--cn-id " + std::to_string(flags.cn_id) + " must be below --num-cns " +
                                  std::to_string(flags.num_cns));
    fabric::ClusterOptions co;
    co.provider = fabric::parse_provider(flags.provider);
    co.memnodes = split_commas(flags.memnodes);
    co.token = fabric::load_token(flags.token_file);
    co.mode = selftest.selected() || rejoin.selected() || index.any_mode() ? fabric::Mode::None
                                                                         : fabric::parse_mode(flags.mode);
    co.cn_id = flags.cn_id;
    co.num_cns = flags.num_cns;
    co.heartbeat_timeout_ms = flags.heartbeat_ms;
    co.stall_timeout_ms = flags.stall_ms;
    // A command fails when a memnode with no copy left dies; it must say so within seconds even
    // if a provider call stays stuck on the dead peer. The service stays up and answers errors.
    co.fatal_exit_ms = *serve_cmd ? 0 : 3000;
    const fabric::WireModel wm = fabric::parse_wire(flags.wire);
    fabric::set_pool_pages(flags.hugepages      ? fabric::PoolPages::Huge
                           : flags.no_hugepages ? fabric::PoolPages::Normal
                                                : fabric::PoolPages::Auto);
    auto cluster = fabric::with_wire(fabric::connect_cluster(co), wm);
    compute::configure_pinning(compute::parse_pin(flags.pin), cluster->nic_numa_node(), flags.cn_id);
    spdlog::info("connected to {} memnode(s) over {}", cluster->memnodes().size(), flags.provider);
    if (!index.selected() && !query.selected() && !*serve_cmd && !rejoin.selected()) print_headers(*cluster);
    commands::RunEnv env{flags, *cluster, {cluster.get(), flags.cn_id, flags.num_cns, flags.provider, {}}, wm, nullptr};
    if (index.wants_report() || query.wants_report())
      env.cpu = std::make_unique<compute::MemnodeCpuMeter>(*cluster);
    env.rc.departed_at_connect = compute::Board::departures(*cluster->make_endpoint(1u << 20));
    const auto rm = read_mode == "batch" ? shine::ReadMode::Batch : shine::ReadMode::PerRead;
    if (*serve_cmd) {
      svo.mode = flags.mode;
      svo.token = co.token;
      return serve::run_serve(env.rc, svo);
    }
    if (index.selected()) return index.run(env, rm);
    if (query.selected()) return query.run(env, rm);
    if (selftest.selected()) return selftest.run(env);
    if (rejoin.selected()) return rejoin.run(env);
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
