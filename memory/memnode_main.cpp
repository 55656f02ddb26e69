// memnode: holds one region of the index in registered memory and serves one-sided
// operations on it; does almost no computing.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/fabric/fabric_cluster.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "memory/region_memory.hpp"

using namespace dmhnsw;

int main(int argc, char** argv) {
  CLI::App app{"dmhnsw memnode: holds a region of the index in registered memory and serves one-sided "
               "READ/WRITE/atomic operations from computenodes"};
  std::string listen = "127.0.0.1:7000", provider = "shm", region = "256MiB", token_file, ready_file, log_level = "info";
  int id = 0, numa_node = -1;
  bool hugepages = false;
  app.add_option("--listen", listen, "HOST:PORT of the TCP control port (port 0 picks a free one)")->capture_default_str();
  app.add_option("--id", id, "memory node id (0..N-1, unique in the cluster)")->capture_default_str()->check(CLI::Range(0, 65534));
  app.add_option("--provider", provider, "fabric: shm (one host), tcp (any IP network), verbs (RDMA NICs, soft-RoCE)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp", "verbs"}));
  app.add_option("--region", region, "region size, e.g. 512MiB, 8GiB")->capture_default_str();
  app.add_flag("--hugepages", hugepages, "back the region with 2 MiB hugepages (falls back to normal pages with a warning)");
  app.add_option("--numa-node", numa_node, "bind the region's memory to this NUMA node (libnuma)");
  app.add_option("--token-file", token_file,
                 "file holding the cluster token (else the DMHNSW_TOKEN variable; with neither, loopback only)");
  app.add_option("--ready-file", ready_file, "write the bound HOST:PORT to this file once serving");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_pattern("[%H:%M:%S.%e] [memnode " + std::to_string(id) + "] [%l] %v");
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    // Block the stop signals in every thread; the main thread waits for them.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    fabric::Provider prov = fabric::parse_provider(provider);
    std::string token = fabric::load_token(token_file);
    uint64_t bytes = parse_bytes(region, "--region");
    auto [host, port] = fabric::parse_host_port(listen, "--listen");
    (void)port;

    RegionHeader hdr = make_region_header(static_cast<uint16_t>(id), bytes);
    memory::RegionMemory mem(bytes, hugepages, numa_node);
    std::memcpy(mem.data(), &hdr, sizeof hdr);

    fabric::RegionServer server(prov, host, mem.data(), mem.size(), static_cast<uint16_t>(id));
    auto header_of = [&] {
      std::array<char, fabric::kHeaderBlobBytes> b;
      std::memcpy(b.data(), mem.data(), b.size());
      return b;
    };
    fabric::ControlServer::Config cc;
    cc.listen = listen;
    cc.token = token;
    cc.memnode_id = static_cast<uint16_t>(id);
    cc.provider = prov;
    cc.region_base = server.remote_base();
    cc.region_size = mem.size();
    cc.region_key = server.key();
    cc.fabric_addr = server.fabric_address();
    cc.mode = [&] {
      RegionHeader h;
      std::memcpy(&h, mem.data(), sizeof h);
      return static_cast<fabric::Mode>(h.mode);
    };
    cc.header = header_of;
    cc.on_join = [&](uint32_t cn, const std::vector<char>& addr) { server.add_client(cn, addr); };
    cc.on_leave = [&](uint32_t cn) { server.remove_client(cn); };
    fabric::ControlServer control(cc);

    std::atomic<bool> stop{false};
    std::thread progress([&] { server.run(stop); });
    std::thread ctl([&] { control.run(); });
    spdlog::info("serving region {} ({}) on {} over {}", mem.describe(), describe(hdr), control.bound(),
                 server.describe());
    if (!ready_file.empty()) {
      std::string tmp = ready_file + ".tmp";
      std::ofstream(tmp) << control.bound() << "\n";
      std::rename(tmp.c_str(), ready_file.c_str());
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    spdlog::info("got {}, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    control.stop();
    stop.store(true);
    ctl.join();
    progress.join();
    auto st = server.stats();
    spdlog::info("stopped (progress loop: {} spins, {} waits, {} messages, {} one-sided operations counted)", st.spins,
                 st.waits, st.messages, st.remote_ops);
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
