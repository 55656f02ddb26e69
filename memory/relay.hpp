#pragma once
// The memnode's side of the SHINE query relay (see relay_protocol.hpp): members, forwarding,
// the barrier, liveness. Pure logic: messages in, messages out through `Send`; the progress
// thread of the memnode drives it (RegionServer handler and tick).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "memory/relay_protocol.hpp"

namespace dmhnsw::memory {

class Relay {
 public:
  using Clock = std::chrono::steady_clock;
  /// Sends `bytes` to the endpoint with handle `to` (RegionServer::send_to).
  using Send = std::function<void(uint64_t to, const std::vector<char>& bytes)>;

  /// `copy`: this memnode's copy in its replica set (computenodes join every copy's relay).
  Relay(uint16_t memnode_id, uint16_t copy, Send send, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  /// Handles one relay message from the endpoint `sender`; false when it is not one.
  bool on_message(const std::vector<char>& payload, uint64_t sender, Clock::time_point now = Clock::now());
  /// Declares members silent for longer than the timeout gone. Time the relay itself did
  /// not run (a gap between ticks longer than a quarter of the timeout, less that quarter)
  /// does not count as silence: after a stall of the memnode the heartbeats of that time may
  /// still wait unread.
  void tick(Clock::time_point now = Clock::now());

  struct Stats {
    uint64_t forwarded = 0, bounced = 0, barriers = 0, gone = 0;
  };
  Stats stats() const { return stats_; }
  bool alive(uint32_t cn) const;

 private:
  struct Member {
    uint64_t handle = 0;
    uint32_t num_cns = 0;
    Clock::time_point last_seen;
    bool alive = false;
    bool left = false;  // clean Leave
    Clock::time_point joined{};
  };
  void gone(uint32_t cn, const std::string& why);
  void try_release();
  void send(uint32_t to_cn, const std::vector<char>& bytes);

  uint16_t id_, copy_;
  Send send_;
  std::chrono::milliseconds timeout_;
  std::map<uint32_t, Member> members_;
  std::map<uint64_t, std::set<uint32_t>> arrived_;  // barrier seq -> computenodes arrived
  std::map<uint64_t, uint32_t> barrier_cns_;        // barrier seq -> num_cns of its run
  uint64_t generation_ = 0;
  Clock::time_point last_tick_{};  // none yet
  Stats stats_;
};

}  // namespace dmhnsw::memory
