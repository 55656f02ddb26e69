// computenode: does all the computing; reads the index from memnodes with one-sided
// operations. This file is the control path: flags, connection, dispatch to subcommands.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>

#include "common/fabric/fabric_cluster.hpp"
#include "common/region.hpp"
#include "compute/selftest.hpp"

using namespace dmhnsw;

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

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
  app.add_option("--provider", provider, "fabric: shm (one host), tcp (any IP network), verbs (RDMA NICs, soft-RoCE)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp", "verbs"}));
  app.add_option("--token-file", token_file, "file holding the cluster token (else the DMHNSW_TOKEN variable)");
  app.add_option("--cn-id", cn_id, "this computenode's id, 0..num-cns-1")->capture_default_str();
  app.add_option("--num-cns", num_cns, "number of computenodes in the run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();

  auto* st = app.add_subcommand("selftest", "write, read, batched reads, fetch_adds, compare_swaps and messages "
                                            "against the scratch area of every memnode, checking every result");
  compute::SelftestOptions so;
  st->add_option("--atomics", so.atomics, "fetch_adds and compare_swap increments per memnode")->capture_default_str();
  st->add_option("--loop", so.loop_seconds, "after the checks, keep reading for this many seconds")->capture_default_str();
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
    auto cluster = fabric::connect_cluster(co);
    spdlog::info("connected to {} memnode(s) over {}", cluster->memnodes().size(), provider);
    print_headers(*cluster);
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
