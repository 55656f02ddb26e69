#pragma once
// The write gate: a snapshot of a live index (compute/snapshot.hpp) stores the memnodes'
// regions while no process writes to them, so the images hold every write acknowledged before
// the snapshot began and no half-done one. The words are in memnode 0's header page
// (common/write_gate.hpp).
//
// A writing process holds one slot for its life. Its monitor thread renews the slot's beat;
// when a snapshot closes the gate it lets no new write start (Pass blocks), waits for those in
// flight to finish, and marks the slot inactive; when the gate opens it marks the slot active
// again (then reads the gate once more, so a snapshot that closed it meanwhile sees the slot
// active or the writer sees the gate closed) and lets writes through. The snapshot closes the
// gate, waits until every slot is inactive, or unchanged for a lease (its process died),
// stores, and opens it. Its own beat in the freeze word tells writers that it is alive: a
// freeze word unchanged for a lease is a dead snapshot's, and the first writer to see that
// opens the gate.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

struct GateTiming {
  int beat_ms = 20;     // a writer's monitor reads the gate and renews its slot this often
  int lease_ms = 3000;  // a slot or freeze word unchanged this long is a dead process's
};

class WriteGate {
 public:
  /// Takes a slot on memnode 0 (a free one, else one unchanged for a lease) and starts the
  /// monitor; throws FabricError when none is free.
  explicit WriteGate(fabric::Cluster& c, GateTiming t = {});
  /// Stops the monitor and frees the slot.
  ~WriteGate();
  WriteGate(const WriteGate&) = delete;
  WriteGate& operator=(const WriteGate&) = delete;

  /// One write, or a thread's run of them: while it lives the snapshot waits.
  class Pass {
   public:
    explicit Pass(WriteGate& g) : g_(&g) { g.enter(); }
    Pass(Pass&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
    Pass& operator=(Pass&&) = delete;
    ~Pass() {
      if (g_ != nullptr) g_->exit();
    }

   private:
    WriteGate* g_;
  };
  /// Blocks while a snapshot closes the gate.
  void enter();
  void exit() { in_flight_.fetch_sub(1); }
  /// A snapshot waits for this process: a writer holding a Pass over many writes (coroutines)
  /// finishes the ones it started and releases it.
  bool closing() const { return !open_.load(); }
  uint32_t slot() const { return slot_; }

 private:
  void monitor();
  bool set_slot(bool active);  // COMPARE_SWAP with the next beat; false when the slot was taken over
  void claim_slot();

  fabric::Cluster& c_;
  GateTiming t_;
  std::unique_ptr<fabric::Endpoint> ep_;  // the constructor's, then the monitor's
  uint32_t slot_ = 0;
  uint64_t slot_word_ = 0;  // what the slot holds (ours)
  std::atomic<bool> open_{false}, stop_{false};
  std::atomic<int64_t> in_flight_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread monitor_;
};

/// What a snapshot's pause of the writers took.
struct PauseStats {
  double wait_s = 0;       // from closing the gate until no live writer was active
  uint32_t writers = 0;    // slots held by writing processes
  uint32_t dead = 0;       // of them, unchanged for a lease: ignored
};

/// Closes the gate (taking over a dead snapshot's freeze; another live snapshot: FabricError),
/// waits up to `wait_ms` for every live writer to pause (else opens it and throws FabricError
/// saying how many still write), runs `store`, and opens the gate, also when `store` throws.
PauseStats with_writes_paused(fabric::Cluster& c, int wait_ms, const std::function<void()>& store,
                              GateTiming t = {});

}  // namespace dmhnsw::compute
