#pragma once
// The computenode's side of the query relay (memory/relay_protocol.hpp): joins every
// memnode's relay, sends heartbeats, forwards messages to other computenodes through a
// random live memnode, and waits on barriers held by memnode 0. One I/O thread receives
// and hands messages to the callbacks.
//
// With replica sets (common/fabric/replicas.hpp) the relay talks to the physical memnodes
// underneath: it joins every copy's relay and heartbeats each, so any live copy can forward
// to any member, and a barrier's arrival goes to every live copy of memnode 0, whichever
// releases it first. A copy's death loses only the messages it held at that moment; the
// callers recover those end to end (the shine query's sync, query_exchange.hpp).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

class RelayClient {
 public:
  struct Callbacks {
    /// A message another computenode forwarded to us (called on the I/O thread).
    std::function<void(uint32_t from_cn, const char* body, size_t len)> deliver;
    /// A message of ours the relay could not deliver (the target is gone).
    std::function<void(uint32_t to_cn, const char* body, size_t len)> bounce;
    /// A computenode of the run is gone (reported once per computenode).
    std::function<void(uint32_t cn, const std::string& why)> gone;
  };

  /// Joins the relay of every memnode (each answers; fails after `join_timeout_s` naming
  /// the memnode) and starts the I/O thread.
  RelayClient(fabric::Cluster& c, uint32_t cn_id, uint32_t num_cns, Callbacks cb, int join_timeout_s = 10);
  ~RelayClient();  // leaves every relay
  RelayClient(const RelayClient&) = delete;
  RelayClient& operator=(const RelayClient&) = delete;

  /// Sends `body` to computenode `to` through a random live memnode.
  void forward(uint32_t to, const void* body, size_t len);
  /// Sends `body` to every other computenode of the run (one relay does the fan-out).
  void broadcast(const void* body, size_t len);

  struct Release {
    uint64_t generation = 0;        // unique over memnode 0's life
    std::vector<uint32_t> gone;     // computenodes that did not arrive (gone)
  };
  /// Waits until every computenode of the run arrived (or is gone). Throws after
  /// `timeout_s`, or when memnode 0 is gone. With replica sets each copy of memnode 0
  /// releases on its own: the generation differs between copies, so callers that need one
  /// number on every computenode take it from the regions (Board::run_nonce).
  Release barrier(int timeout_s = 600);

  uint32_t cn_id() const { return cn_; }
  uint32_t num_cns() const { return k_; }

 private:
  void io_loop();
  /// `node`: a physical memnode (copy c of memnode L is L * copies + c). `kick`: wake the I/O
  /// thread to poll for the answer (the I/O thread's own heartbeats do not).
  fabric::Status send_to_memnode(uint16_t node, const std::vector<char>& bytes, bool kick = true);
  void send_or_throw(uint16_t node, const std::vector<char>& bytes);
  /// Sends through a random live memnode; one that refuses passes it to the next.
  void send_anywhere(const std::vector<char>& bytes);
  void handle(const fabric::Message& m);
  std::string name(uint16_t node) const;
  bool memnode0_alive() const;

  fabric::Cluster& c_;
  std::shared_ptr<fabric::Cluster> phys_;  // the cluster under replica sets, or null
  fabric::Cluster* net_;                    // where the relay's messages go: phys_ or &c_
  unsigned copies_ = 1;
  uint16_t nodes_ = 0;                      // physical memnodes
  std::vector<bool> joined_;                // I/O thread: a Join was sent since the copy was last seen alive
  uint32_t cn_, k_;
  Callbacks cb_;
  std::unique_ptr<fabric::Endpoint> ep_;
  std::mutex ep_mu_;  // the endpoint: the I/O thread receives, any thread sends
  std::mt19937_64 rng_;
  std::thread io_;
  std::atomic<bool> stop_{false};
  // The I/O thread polls every 50 us while messages flow (kBusyWindow after the last one
  // or our last send), then waits up to 1 ms at a time until a send of ours kicks it.
  static constexpr std::chrono::milliseconds kBusyWindow{5};
  std::chrono::steady_clock::time_point last_traffic_{};  // I/O thread only
  std::atomic<bool> kicked_{false};
  std::mutex kick_mu_;
  std::condition_variable kick_cv_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint16_t> acks_;
  std::map<uint64_t, Release> released_;  // barrier seq -> release
  uint64_t returned_below_ = 0;           // barriers already returned (a later copy's release is ignored)
  std::set<uint32_t> gone_;
  uint64_t barrier_seq_ = 0;
};

}  // namespace dmhnsw::compute
