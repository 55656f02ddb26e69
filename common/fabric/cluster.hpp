#pragma once
// What the layers above reach the real providers through: the compute side (connect_cluster)
// and the memory side (RegionServer, which registers a region and serves it). Which provider
// serves either side is chosen in providers.cpp; each lives in its folder (providers.hpp).
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/fabric/bootstrap.hpp"
#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric {

struct ClusterOptions {
  Provider provider = Provider::Shm;
  std::vector<std::string> memnodes;  // "host:port" control addresses
  std::string token;
  Mode mode = Mode::None;
  uint32_t cn_id = 0;
  /// Computenodes in the run (0: unknown). With at least as many RMA lanes as computenodes,
  /// each computenode reads through lanes of its own (see FabricEndpoint).
  uint32_t num_cns = 0;
  uint16_t control_version = kControlVersion;  // tests only
  int heartbeat_timeout_ms = 4000;             // a ping unanswered this long declares the memnode dead
  /// A memnode whose fabric endpoint takes or completes none of this endpoint's operations for
  /// this long, while some wait on it, is declared dead too: it may answer heartbeats and still
  /// not progress (libfabric 1.17's shm provider, when a computenode is killed inside it).
  int stall_timeout_ms = 10000;
  /// When > 0: once a memnode with no live copy left is declared dead (the run cannot go on),
  /// the process exits with code 1 this long after unless it exited by itself. A provider call
  /// can stay stuck on the dead peer for ever (libfabric 1.17's shm keeps spin locks in shared
  /// memory that a process killed inside it leaves held), and the error must still come out
  /// within seconds. For commands that end when the run fails; a service leaves it 0.
  int fatal_exit_ms = 0;
};

/// The RMA lane (of `lanes` > 0) that computenode `cn`'s `ordinal`-th endpoint reads through.
/// With 0 < num_cns <= lanes and cn < num_cns: lanes cn, cn + num_cns, ... only, in turn (no
/// two computenodes share a lane). Otherwise (cn + 7919·ordinal) mod lanes: different
/// computenodes' first endpoints get different lanes.
uint64_t rma_lane_for(uint32_t cn, uint32_t num_cns, uint64_t ordinal, uint64_t lanes);

/// Connects to every memnode (bootstrap + fabric address exchange) and starts the liveness
/// monitor. Memnode ids must be exactly 0..N-1. Throws FabricError naming the memnode.
std::shared_ptr<Cluster> connect_cluster(const ClusterOptions& opts);

class RegionBackend;  // one per provider family (region_backend.hpp)

/// Memory side: a registered region served over one endpoint, plus message handling.
class RegionServer {
 public:
  /// Handles one message from a computenode; `reply` sends an answer back to it.
  using Handler = std::function<void(const Message& in, const std::function<void(const void*, size_t)>& reply)>;

  /// `rma_lanes` extra endpoints serve one-sided operations on the region besides the main
  /// endpoint (which also carries messages); computenodes spread over them. With shm, every
  /// READ locks the target endpoint's command queue while the initiator copies the data, so
  /// computenodes sharing one endpoint wait for each other; a lane each removes that.
  /// `region_fd`: with --provider cxl, the shared memory object the region is mapped from.
  RegionServer(Provider p, const std::string& listen_host, char* region, uint64_t size, uint16_t memnode_id,
               unsigned rma_lanes = 0, int region_fd = -1);
  ~RegionServer();
  RegionServer(const RegionServer&) = delete;
  RegionServer& operator=(const RegionServer&) = delete;

  std::vector<char> fabric_address() const;
  std::vector<std::vector<char>> rma_lane_addresses() const;
  uint64_t remote_base() const;
  uint64_t key() const;
  /// The key for the computenode whose hello carried `addr` (RegionBackend::client_key).
  uint64_t client_key(uint32_t cn_id, const std::vector<char>& addr);
  std::string describe() const;

  void add_client(uint32_t cn_id, const std::vector<char>& fabric_addr);
  void remove_client(uint32_t cn_id);
  /// Another endpoint address of computenode `cn_id` (see RegionBackend::add_client_address).
  void add_client_address(uint32_t cn_id, const std::vector<char>& fabric_addr);
  void remove_client_address(uint32_t cn_id, const std::vector<char>& fabric_addr);
  void set_handler(Handler h);
  /// Sends a message to the endpoint that sent `sender` (Message::sender) earlier. Only
  /// from the progress thread: inside the handler or the tick function.
  void send_to(uint64_t sender, const void* data, size_t len);
  /// Called by the progress thread about every `period_ms` (timeouts of the relay).
  void set_tick(std::function<void()> tick, int period_ms = 50);

  /// Drives progress until `stop`: spins while work arrives, blocks on the completion
  /// queue's wait object (with a short timeout) when idle.
  void run(const std::atomic<bool>& stop);

  struct Stats {
    uint64_t spins = 0, waits = 0, messages = 0, remote_ops = 0;  // remote_ops: all endpoints
    std::vector<uint64_t> lane_ops;                               // per RMA lane
  };
  Stats stats() const;
  /// How long run()'s loop has not come round (0 before run starts): seconds, so a caller can
  /// tell a progress thread stuck inside the provider from a quiet one.
  double progress_stalled_seconds() const;

 private:
  std::unique_ptr<RegionBackend> impl_;
};

}  // namespace dmhnsw::fabric
