#pragma once
// LocalFabric: the transport API inside one process, for unit tests of everything above the
// transport. Regions are plain memory; READ/WRITE are memcpy, atomics use std::atomic_ref.
// Faults can be injected: a fixed delay per operation, failing operations, disconnecting a
// memory node (in-flight and later operations toward it fail with PeerDead).
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>

#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric {

class LocalCluster : public Cluster, public std::enable_shared_from_this<LocalCluster> {
 public:
  /// `num_nodes` memory nodes with a zeroed region of `region_bytes` each.
  static std::shared_ptr<LocalCluster> create(uint16_t num_nodes, uint64_t region_bytes);

  Provider provider() const override { return Provider::Local; }
  const std::vector<MemnodeInfo>& memnodes() const override { return infos_; }
  std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes = 64u << 20) override;
  bool alive(uint16_t node) const override;
  void declare_dead(uint16_t node, const std::string& why) override { disconnect(node, why); }
  std::string dead_reason(uint16_t node) const override;

  /// Direct access to a node's region (to format headers, inspect results).
  char* region(uint16_t node) { return regions_.at(node).get(); }
  uint64_t region_size() const { return region_bytes_; }
  /// Re-copies each region's header page into memnodes()[i].header.
  void refresh_headers();

  // ---- fault injection (thread-safe) ----
  /// Every operation completes no earlier than `delay` after it was posted.
  void set_delay(std::chrono::microseconds delay) { delay_us_.store(delay.count()); }
  /// Each later operation fails with RemoteError with probability p (seeded, deterministic).
  void set_failure_rate(double p, uint64_t seed = 1);
  /// The next `n` operations fail with RemoteError; with `node` (and `kind`), only those toward
  /// that node (of that kind), so that a background thread's operations (a replica watcher's
  /// polls) cannot take the failure meant for the test's own.
  void fail_next(uint64_t n, int node = -1, int kind = -1) {
    fail_node_.store(node);
    fail_kind_.store(kind);
    fail_next_.store(n);
  }
  /// The node goes away: in-flight and later operations toward it fail with PeerDead.
  void disconnect(uint16_t node, const std::string& reason = "disconnected by the test");

  /// Handler for messages sent to a memory node; the default echoes the payload back.
  using MessageHandler = std::function<void(uint16_t node, const Message& in, std::function<void(Message)> reply)>;
  void set_message_handler(MessageHandler h);

 private:
  friend class LocalEndpoint;
  LocalCluster(uint16_t num_nodes, uint64_t region_bytes);
  bool should_fail(const Op& op);

  uint64_t region_bytes_;
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<char, FreeDeleter>> regions_;
  std::vector<MemnodeInfo> infos_;
  std::unique_ptr<std::atomic<bool>[]> dead_;
  mutable std::mutex mu_;
  std::vector<std::string> dead_reason_;
  std::atomic<int64_t> delay_us_{0};
  std::atomic<uint64_t> fail_next_{0};
  std::atomic<int> fail_node_{-1}, fail_kind_{-1};  // fail_next's filters; -1: any
  std::atomic<double> failure_rate_{0.0};
  std::mt19937_64 fail_rng_;
  MessageHandler handler_;
};

}  // namespace dmhnsw::fabric
