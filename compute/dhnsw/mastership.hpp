#pragma once
// The rebuild master's word in d-HNSW's control block (compute/dhnsw/control.hpp): one
// computenode at a time rebuilds. The word is a lock word taken with COMPARE_SWAP and renewed (a
// fresh ticket) every lease / 4 by a thread of its own; a word that stays unchanged for a lease
// belongs to a master that died or stalled, and is taken over.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <thread>

#include "common/fabric/transport.hpp"

namespace dmhnsw::dhnsw {

/// Lost the master word to a takeover (this computenode stalled longer than the lease).
struct MasterLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Mastership {
 public:
  Mastership(fabric::Cluster& c, uint32_t cn_id, uint32_t lease_ms) : c_(c), cn_(cn_id), lease_ms_(lease_ms) {}
  ~Mastership() { release(); }
  Mastership(const Mastership&) = delete;
  Mastership& operator=(const Mastership&) = delete;
  /// True when this computenode is the master now. A word that stays unchanged for a lease is
  /// taken over; with `wait`, a live master (its word moving) is watched for two leases first.
  bool acquire(fabric::Endpoint& ep, bool wait);
  /// Throws MasterLost once the renewer found the word taken over.
  void check() const {
    if (lost_.load()) throw MasterLost("dhnsw rebuild: another computenode took the master word over");
  }
  void release();

 private:
  void renew();
  fabric::Cluster& c_;
  uint32_t cn_;
  uint32_t lease_ms_;
  std::atomic<uint64_t> word_{0};
  std::atomic<bool> stop_{false}, lost_{false};
  bool held_ = false;
  std::thread renewer_;
};

}  // namespace dmhnsw::dhnsw
