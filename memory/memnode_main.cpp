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

#include "common/version.hpp"
#include "common/fabric/cluster.hpp"
#include "common/fabric/pages.hpp"
#include "common/fabric/rejoin_layout.hpp"
#include "common/json_file.hpp"
#include "common/presence.hpp"
#include "common/write_gate.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "memory/admin_service.hpp"
#include "memory/health.hpp"
#include "memory/image.hpp"
#include "memory/region_memory.hpp"
#include "memory/relay.hpp"

using namespace dmhnsw;

namespace {

struct Flags {
  std::string listen = "127.0.0.1:7000", provider = "shm", region = "256MiB", token_file, ready_file,
              log_level = "info", load, dax, store_dir, health_listen;
  int id = 0, numa_node = -1, relay_timeout_ms = 10000, rma_lanes = -1, replicas = 1, copy = 0;
  bool hugepages = false, no_hugepages = false, rejoin = false;
  CLI::Option* region_opt = nullptr;

  void add(CLI::App& app) {
    app.add_option("--listen", listen, "HOST:PORT of the TCP control port (port 0 picks a free one)")->capture_default_str();
    app.add_option("--id", id, "memory node id (0..N-1, unique in the cluster)")->capture_default_str()->check(CLI::Range(0, 65534));
    app.add_option("--replicas", replicas,
                   "memnodes serving this id, each an identical copy of the region (docs/replication.md); "
                   "computenodes list every copy in --memnodes")
        ->capture_default_str()
        ->check(CLI::Range(1, static_cast<int>(fabric::kMaxCopies)));
    app.add_option("--copy", copy, "which of the --replicas copies of this id this memnode is (0..R-1)")
        ->capture_default_str()
        ->check(CLI::Range(0, static_cast<int>(fabric::kMaxCopies) - 1));
    app.add_flag("--rejoin", rejoin,
                 "a new copy replacing a dead one of a replica set: computenodes do not read it until "
                 "`computenode rejoin` has copied the set's region into it (docs/replication.md)");
    app.add_option("--provider", provider, "fabric: " + fabric::provider_help())
        ->capture_default_str()
        ->check(CLI::IsMember(fabric::provider_names()));
    region_opt = app.add_option("--region", region,
                                "region size, e.g. 512MiB, 8GiB (with --load: default the image's region size)")
                     ->capture_default_str();
    app.add_flag("--hugepages", hugepages,
                 "back the region with 2 MiB hugepages (falls back to normal pages with a warning). By default the "
                 "region is on hugepages whenever the host has enough reserved and free (/proc/sys/vm/nr_hugepages): "
                 "a search touches a few bytes of many pages, and 4 KiB pages cost it a TLB miss for most of them");
    app.add_flag("--no-hugepages", no_hugepages, "normal pages even where the host has hugepages reserved")
        ->excludes("--hugepages");
    app.add_option("--numa-node", numa_node, "bind the region's memory to this NUMA node (libnuma)");
    app.add_option("--dax", dax,
                   "--provider cxl: map the region from this device-DAX or file (a CXL memory device) instead of "
                   "a memfd; a regular file is created or grown to --region (mode 0600)");
    app.add_option("--token-file", token_file,
                   "file holding the cluster token (else the DMHNSW_TOKEN variable; with neither, loopback only)");
    app.add_option("--load", load,
                   "serve the region image FILE (written by a store request: DIR/memnode-<id>.img); refused when "
                   "truncated, corrupted, of another memnode or larger than --region");
    app.add_option("--store-dir", store_dir,
                   "computenodes' store requests (`build --store-index DIR`) may write region images only inside "
                   "this directory (a relative DIR is taken from here; files mode 0600); without it they are refused");
    app.add_option("--ready-file", ready_file, "write the bound HOST:PORT to this file once serving");
    app.add_option("--health-listen", health_listen,
                   "HOST:PORT of a plain HTTP endpoint for probes, no token needed (port 0: any free one, logged): "
                   "GET /ready answers 200 once the region is registered and the control port serves (503 "
                   "before), GET /live 200 while the fabric progress thread comes round; nothing else is served");
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
  }
};

/// The region's size: --region, else (with --load) the image's.
uint64_t region_bytes(const Flags& f) {
  if (!f.load.empty() && f.region_opt->count() == 0)
    return memory::read_image_header(f.load).region_size;  // checks magic, version, checksum, length
  return parse_bytes(f.region, "--region");
}

/// The region's first bytes: the image's (--load), else a fresh header.
void fill_region(const Flags& f, memory::RegionMemory& mem, uint64_t bytes) {
  if (f.load.empty()) {
    RegionHeader fresh = make_region_header(static_cast<uint16_t>(f.id), bytes);
    std::memcpy(mem.data(), &fresh, sizeof fresh);
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  memory::ImageInfo info = memory::load_image(f.load, mem.data(), mem.size(), static_cast<uint16_t>(f.id));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("loaded {}: mode {}, {} used bytes of a {} region, node count word {}, checksum {:#018x}, {:.2f} s",
               f.load, fabric::mode_name(info.mode), info.used_bytes, format_bytes(info.region_size),
               info.node_count, info.body_checksum, s);
  if (mem.size() > info.region_size)
    spdlog::info("region grown from {} (image) to {} (--region): the extra room is free",
                 format_bytes(info.region_size), format_bytes(mem.size()));
}

// Over tcp the data endpoint listens where the control port does: without a token both stay
// on loopback, and a wildcard would let libfabric pick an interface nobody named. (verbs
// binds rdma_cm to the RDMA device's address and admits only queue pairs the control port
// issued a nonce for.)
std::string data_host_for(const Flags& f, fabric::Provider prov, const std::string& host, const std::string& token) {
  if (prov != fabric::Provider::Tcp) return host;
  std::string data_host = fabric::listen_host_for(host, token);
  if (data_host == "0.0.0.0" || data_host.empty())
    throw std::invalid_argument("--listen " + f.listen + " with --provider tcp: name the address of one interface "
                                "(the data endpoint binds to one, and computenodes reach it there)");
  return data_host;
}

// Messages are served in the progress thread: the query relay (routing between
// computenodes), admin requests (store); anything else is echoed.
void serve_messages(const Flags& f, fabric::RegionServer& server, memory::Relay& relay, memory::RegionMemory& mem) {
  server.set_handler([&mem, &relay, &server, id = f.id, &store_dir = f.store_dir](
                         const fabric::Message& in, const std::function<void(const void*, size_t)>& reply) {
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
}

/// The control port's view of this memnode: what a joining computenode is told, and what
/// joining, leaving and registering do to the data endpoint and the presence table.
fabric::ControlServer::Config control_config(const Flags& f, fabric::Provider prov, const std::string& token,
                                             fabric::RegionServer& server, memory::RegionMemory& mem,
                                             PresenceWriter& presence) {
  fabric::ControlServer::Config cc;
  cc.listen = f.listen;
  cc.token = token;
  cc.memnode_id = static_cast<uint16_t>(f.id);
  cc.copy = static_cast<uint8_t>(f.copy);
  cc.copies = static_cast<uint8_t>(f.replicas);
  cc.joining = [base = mem.data()] {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + fabric::kJoinWordOffset)).load() != 0;
  };
  cc.provider = prov;
  cc.region_base = server.remote_base();
  cc.region_size = mem.size();
  cc.region_key = server.key();
  cc.fabric_addr = server.fabric_address();
  cc.rma_lanes = server.rma_lane_addresses();
  char* base = mem.data();
  cc.mode = [base] {
    RegionHeader h;
    std::memcpy(&h, base, sizeof h);
    return static_cast<fabric::Mode>(h.mode);
  };
  cc.header = [base] {
    std::array<char, fabric::kHeaderBlobBytes> b;
    std::memcpy(b.data(), base, b.size());
    return b;
  };
  cc.key_for = [&server](uint32_t cn, const std::vector<char>& addr) { return server.client_key(cn, addr); };
  cc.on_join = [&server, &presence](uint32_t cn, const std::vector<char>& addr) {
    server.add_client(cn, addr);
    presence.joined(cn);
  };
  cc.on_register = [&server](uint32_t cn, const std::vector<char>& addr) { server.add_client_address(cn, addr); };
  cc.on_forget = [&server](uint32_t cn, const std::vector<char>& addr) { server.remove_client_address(cn, addr); };
  cc.on_leave = [&server, &presence](uint32_t cn) {
    server.remove_client(cn);
    presence.left(cn);
  };
  return cc;
}

void write_ready_file(const std::string& ready_file, const std::string& bound) {
  if (!ready_file.empty()) write_text_file(ready_file, bound + "\n", "--ready-file");
}

// Waits for a stop signal; meanwhile watches the progress thread: a loop that has not come
// round for 5 s is stuck inside the provider (libfabric 1.17 shm: a computenode killed
// holding an endpoint's lock), and computenodes will find this memnode unreachable.
int wait_for_stop(const sigset_t& sigs, const fabric::RegionServer& server, int id, const std::string& provider) {
  bool reported_stuck = false;
  // DMHNSW_TEST_STUCK_REPORT_S: the tests' shorter threshold.
  const char* env = std::getenv("DMHNSW_TEST_STUCK_REPORT_S");
  const double stuck_report_s = env != nullptr ? std::atof(env) : 5.0;
  for (;;) {
    timespec one_second{1, 0};
    int sig = sigtimedwait(&sigs, nullptr, &one_second);
    if (sig > 0) return sig;
    const double stuck = server.progress_stalled_seconds();
    if (stuck >= stuck_report_s && !reported_stuck) {
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
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dmhnsw memnode: holds a region of the index in registered memory and serves one-sided "
               "READ/WRITE/atomic operations from computenodes"};
  app.set_version_flag("--version", dmhnsw::version_line("memnode"));
  Flags f;
  f.add(app);
  CLI11_PARSE(app, argc, argv);

  spdlog::set_pattern("[%H:%M:%S.%e] [memnode " + std::to_string(f.id) +
                      (f.replicas > 1 ? " copy " + std::to_string(f.copy) : std::string()) + "] [%l] %v");
  spdlog::set_level(spdlog::level::from_str(f.log_level));
  try {
    // Block the stop signals in every thread; the main thread waits for them.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    if (f.copy >= f.replicas)
      throw std::invalid_argument("--copy " + std::to_string(f.copy) + ": want 0.." + std::to_string(f.replicas - 1) +
                                  " (--replicas " + std::to_string(f.replicas) + ")");
    fabric::Provider prov = fabric::parse_provider(f.provider);
    std::string token = fabric::load_token(f.token_file);
    auto [host, port] = fabric::parse_host_port(f.listen, "--listen");
    (void)port;

    // Probes first: they see "starting" (503) until the region serves.
    std::atomic<const fabric::RegionServer*> serving{nullptr};
    std::unique_ptr<memory::HealthServer> health;
    if (!f.health_listen.empty()) {
      health = std::make_unique<memory::HealthServer>(f.health_listen, [&serving] {
        const fabric::RegionServer* s = serving.load();
        return s == nullptr || s->progress_stalled_seconds() < 5.0;
      });
      spdlog::info("health on {}:{} (GET /ready, /live)", fabric::parse_host_port(f.health_listen, "--health-listen").first,
                   health->port());
    }
    if (const char* ms = std::getenv("DMHNSW_TEST_DELAY_REGION_MS"))  // tests: a slow region allocation
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
    const uint64_t bytes = region_bytes(f);
    if (bytes < kMinUsefulRegionBytes)
      spdlog::warn("--region {}: below {}, computenodes can run self-tests and benchmarks here but no build or "
                   "query (a quarter of the region is scratch, and their coordination board needs 32 MiB of it); "
                   "an index needs its vectors and links on top (docs/operations.md, \"Sizing regions\")",
                   format_bytes(bytes), format_bytes(kMinUsefulRegionBytes));
    if (!f.dax.empty() && prov != fabric::Provider::Cxl)
      throw std::invalid_argument("--dax " + f.dax + ": only with --provider cxl (computenodes map the device)");
    bool huge = f.hugepages;
    if (const uint64_t free_huge = fabric::free_hugepage_bytes();
        !f.hugepages && !f.no_hugepages && f.dax.empty() && free_huge >= bytes + (2u << 20)) {
      huge = true;
      spdlog::info("the host has {} of free hugepages: the region uses them (--no-hugepages: normal pages)",
                   format_bytes(free_huge));
    }
    memory::RegionMemory mem(bytes, huge, f.numa_node, prov == fabric::Provider::Cxl, f.dax);
    fill_region(f, mem, bytes);
    RegionHeader hdr;
    std::memcpy(&hdr, mem.data(), sizeof hdr);
    PresenceWriter presence(mem.data());
    presence.reset();
    // A loaded image carries the rejoin block and view of the set it was stored from: this set
    // starts afresh (every copy alike).
    std::memset(mem.data() + fabric::kRejoinBlockOffset, 0, fabric::kJoinWordOffset + 8 - fabric::kRejoinBlockOffset);
    // ... and the write gate as the snapshot left it (closed, the writers of that cluster).
    std::memset(mem.data() + kWriteGateOffset, 0, kWriteGateEnd - kWriteGateOffset);
    if (f.rejoin) {
      if (f.replicas < 2 || !f.load.empty())
        throw std::invalid_argument("--rejoin: a new copy of a replica set (--replicas 2 or more), without --load");
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(mem.data() + fabric::kJoinWordOffset)).store(1);
    }

    const unsigned lanes = f.rma_lanes >= 0 ? static_cast<unsigned>(f.rma_lanes)
                                            : prov == fabric::Provider::Shm ? 8u : 0u;
    fabric::RegionServer server(prov, data_host_for(f, prov, host, token), mem.data(), mem.size(),
                                static_cast<uint16_t>(f.id), lanes, mem.fd());
    memory::Relay relay(
        static_cast<uint16_t>(f.id), static_cast<uint16_t>(f.copy),
        [&server](uint64_t to, const std::vector<char>& b) { server.send_to(to, b.data(), b.size()); },
        std::chrono::milliseconds(f.relay_timeout_ms));
    serve_messages(f, server, relay, mem);
    fabric::ControlServer control(control_config(f, prov, token, server, mem, presence));

    std::atomic<bool> stop{false}, progress_done{false};
    std::thread progress([&] {
      server.run(stop);
      progress_done.store(true);
    });
    std::thread ctl([&] { control.run(); });
    spdlog::info("serving region {} ({}) on {} over {}, {} RMA lane(s)", mem.describe(), describe(hdr),
                 control.bound(), server.describe(), lanes);
    write_ready_file(f.ready_file, control.bound());
    serving.store(&server);
    if (health) health->set_ready();
    const int sig = wait_for_stop(sigs, server, f.id, f.provider);
    spdlog::info("got {}, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    serving.store(nullptr);
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
                    f.id);
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
