// memnode: holds one region of the index in registered memory and serves one-sided
// operations on it; does almost no computing.
#include <signal.h>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "common/fabric/fabric_cluster.hpp"
#include "common/presence.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "memory/admin_service.hpp"
#include "memory/image.hpp"
#include "memory/region_memory.hpp"
#include "memory/relay.hpp"

using namespace dmhnsw;

int main(int argc, char** argv) {
  CLI::App app{"dmhnsw memnode: holds a region of the index in registered memory and serves one-sided "
               "READ/WRITE/atomic operations from computenodes"};
  std::string listen = "127.0.0.1:7000", provider = "shm", region = "256MiB", token_file, ready_file, log_level = "info",
              load;
  int id = 0, numa_node = -1, relay_timeout_ms = 10000, rma_lanes = -1;
  bool hugepages = false;
  app.add_option("--listen", listen, "HOST:PORT of the TCP control port (port 0 picks a free one)")->capture_default_str();
  app.add_option("--id", id, "memory node id (0..N-1, unique in the cluster)")->capture_default_str()->check(CLI::Range(0, 65534));
  app.add_option("--provider", provider,
                 "fabric: shm (one host), tcp (any IP network), verbs (RDMA NICs, soft-RoCE), cxl (one host: "
                 "computenodes map the region, a shared memory object)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp", "verbs", "cxl"}));
  auto* region_opt = app.add_option("--region", region,
                                    "region size, e.g. 512MiB, 8GiB (with --load: default the image's region size)")
                         ->capture_default_str();
  app.add_flag("--hugepages", hugepages, "back the region with 2 MiB hugepages (falls back to normal pages with a warning)");
  app.add_option("--numa-node", numa_node, "bind the region's memory to this NUMA node (libnuma)");
  std::string dax;
  app.add_option("--dax", dax,
                 "--provider cxl: map the region from this device-DAX or file (a CXL memory device) instead of "
                 "a memfd; a regular file is created or grown to --region (mode 0600)");
  app.add_option("--token-file", token_file,
                 "file holding the cluster token (else the DMHNSW_TOKEN variable; with neither, loopback only)");
  app.add_option("--load", load,
                 "serve the region image FILE (written by a store request: DIR/memnode-<id>.img); refused when "
                 "truncated, corrupted, of another memnode or larger than --region");
  std::string store_dir;
  app.add_option("--store-dir", store_dir,
                 "computenodes' store requests (`build --store-index DIR`) may write region images only inside "
                 "this directory (a relative DIR is taken from here; files mode 0600); without it they are refused");
  app.add_option("--ready-file", ready_file, "write the bound HOST:PORT to this file once serving");
  app.add_option("--relay-timeout-ms", relay_timeout_ms,
                 "query relay: a computenode silent this long is gone (reported to the others)")
      ->capture_default_str()
      ->check(CLI::Range(100, 600000));
  app.add_option("--rma-lanes", rma_lanes,
                 "extra endpoints that serve only one-sided operations, computenodes spread over them "
                 "(-1: 8 with shm, where computenodes sharing an endpoint serialize on its lock, else 0)")
      ->capture_default_str()
      ->check(CLI::Range(-1, static_cast<int>(fabric::kMaxRmaLanes)));
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
    auto [host, port] = fabric::parse_host_port(listen, "--listen");
    (void)port;

    uint64_t bytes = 0;
    if (!load.empty() && region_opt->count() == 0) {
      bytes = memory::read_image_header(load).region_size;  // checks magic, version, checksum, length
    } else {
      bytes = parse_bytes(region, "--region");
    }
    if (!dax.empty() && prov != fabric::Provider::Cxl)
      throw std::invalid_argument("--dax " + dax + ": only with --provider cxl (computenodes map the device)");
    memory::RegionMemory mem(bytes, hugepages, numa_node, prov == fabric::Provider::Cxl, dax);
    if (!load.empty()) {
      auto t0 = std::chrono::steady_clock::now();
      memory::ImageInfo info = memory::load_image(load, mem.data(), mem.size(), static_cast<uint16_t>(id));
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      spdlog::info("loaded {}: mode {}, {} used bytes of a {} region, node count word {}, checksum {:#018x}, {:.2f} s",
                   load, fabric::mode_name(info.mode), info.used_bytes, format_bytes(info.region_size),
                   info.node_count, info.body_checksum, s);
      if (mem.size() > info.region_size)
        spdlog::info("region grown from {} (image) to {} (--region): the extra room is free",
                     format_bytes(info.region_size), format_bytes(mem.size()));
    } else {
      RegionHeader fresh = make_region_header(static_cast<uint16_t>(id), bytes);
      std::memcpy(mem.data(), &fresh, sizeof fresh);
    }
    RegionHeader hdr;
    std::memcpy(&hdr, mem.data(), sizeof hdr);
    PresenceWriter presence(mem.data());
    presence.reset();

    const unsigned lanes = rma_lanes >= 0 ? static_cast<unsigned>(rma_lanes) : prov == fabric::Provider::Shm ? 8u : 0u;
    // Over tcp the data endpoint listens where the control port does: without a token both stay
    // on loopback, and a wildcard would let libfabric pick an interface nobody named. (verbs
    // binds rdma_cm to the RDMA device's address and admits only queue pairs the control port
    // issued a nonce for.)
    std::string data_host = host;
    if (prov == fabric::Provider::Tcp) {
      data_host = fabric::listen_host_for(host, token);
      if (data_host == "0.0.0.0" || data_host.empty())
        throw std::invalid_argument("--listen " + listen + " with --provider tcp: name the address of one interface "
                                    "(the data endpoint binds to one, and computenodes reach it there)");
    }
    fabric::RegionServer server(prov, data_host, mem.data(), mem.size(), static_cast<uint16_t>(id), lanes, mem.fd());
    // Messages are served in the progress thread: the query relay (routing between
    // computenodes), admin requests (store); anything else is echoed.
    memory::Relay relay(
        static_cast<uint16_t>(id),
        [&server](uint64_t to, const std::vector<char>& bytes) { server.send_to(to, bytes.data(), bytes.size()); },
        std::chrono::milliseconds(relay_timeout_ms));
    server.set_handler([&mem, &relay, &server, id, &store_dir](const fabric::Message& in,
                                                   const std::function<void(const void*, size_t)>& reply) {
      // A computenode speaks in the relay only as itself: the id its transport authenticated
      // (a join under another member's id took that member's place).
      if (auto rh = dmhnsw::relay::decode(in.payload); rh && rh->from_cn != in.from_cn) {
        spdlog::warn("relay: dropped a message from computenode {} claiming to be computenode {}", in.from_cn,
                     rh->from_cn);
        return;
      }
      if (relay.on_message(in.payload, in.sender)) return;
      if (auto out = memory::handle_admin(in.payload, mem.data(), mem.size(), static_cast<uint16_t>(id),
                                          server.stats().messages, store_dir))
        reply(out->data(), out->size());
      else
        reply(in.payload.data(), in.payload.size());
    });
    server.set_tick([&relay] { relay.tick(); });
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
    cc.rma_lanes = server.rma_lane_addresses();
    cc.mode = [&] {
      RegionHeader h;
      std::memcpy(&h, mem.data(), sizeof h);
      return static_cast<fabric::Mode>(h.mode);
    };
    cc.header = header_of;
    cc.key_for = [&](uint32_t cn, const std::vector<char>& addr) { return server.client_key(cn, addr); };
    cc.on_join = [&](uint32_t cn, const std::vector<char>& addr) {
      server.add_client(cn, addr);
      presence.joined(cn);
    };
    cc.on_register = [&](uint32_t cn, const std::vector<char>& addr) { server.add_client_address(cn, addr); };
    cc.on_forget = [&](uint32_t cn, const std::vector<char>& addr) { server.remove_client_address(cn, addr); };
    cc.on_leave = [&](uint32_t cn) {
      server.remove_client(cn);
      presence.left(cn);
    };
    fabric::ControlServer control(cc);

    std::atomic<bool> stop{false}, progress_done{false};
    std::thread progress([&] {
      server.run(stop);
      progress_done.store(true);
    });
    std::thread ctl([&] { control.run(); });
    spdlog::info("serving region {} ({}) on {} over {}, {} RMA lane(s)", mem.describe(), describe(hdr),
                 control.bound(), server.describe(), lanes);
    if (!ready_file.empty()) {
      std::string tmp = ready_file + ".tmp";
      std::ofstream(tmp) << control.bound() << "\n";
      std::rename(tmp.c_str(), ready_file.c_str());
    }
    // Wait for a stop signal; meanwhile watch the progress thread: a loop that has not come
    // round for 5 s is stuck inside the provider (libfabric 1.17 shm: a computenode killed
    // holding an endpoint's lock), and computenodes will find this memnode unreachable.
    int sig = 0;
    bool reported_stuck = false;
    for (;;) {
      timespec one_second{1, 0};
      sig = sigtimedwait(&sigs, nullptr, &one_second);
      if (sig > 0) break;
      const double stuck = server.progress_stalled_seconds();
      if (stuck >= 5.0 && !reported_stuck) {
        spdlog::error("memnode {}: the fabric progress thread has not come round for {:.0f} s: it is stuck inside "
                      "the {} provider (with shm, a computenode killed inside libfabric can leave an endpoint's "
                      "lock held); computenodes will find this memnode unreachable; restart it",
                      id, stuck, provider);
        reported_stuck = true;
      } else if (stuck < 1.0 && reported_stuck) {
        spdlog::info("memnode {}: the fabric progress thread runs again", id);
        reported_stuck = false;
      }
    }
    spdlog::info("got {}, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    control.stop();
    stop.store(true);
    ctl.join();
    // A progress thread stuck inside the provider never returns: do not wait for it for ever.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!progress_done.load() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!progress_done.load()) {
      spdlog::error("memnode {}: the fabric progress thread did not stop within 5 s (stuck inside the provider); "
                    "exiting without closing the fabric",
                    id);
      std::fflush(nullptr);
      std::_Exit(3);
    }
    progress.join();
    auto st = server.stats();
    spdlog::info("stopped (progress loop: {} spins, {} waits, {} messages, {} one-sided operations counted; "
                 "per RMA lane [{}])",
                 st.spins, st.waits, st.messages, st.remote_ops, fmt::join(st.lane_ops, ", "));
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
