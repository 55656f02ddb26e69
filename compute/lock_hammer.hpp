#pragma once
// computenode selftest --lock-hammer: threads × coroutines take and release a few shared lock
// words on memnode 0 with COMPARE_SWAP, as shine's node locks and d-HNSW's group locks do, and
// check that the locks are exclusive and that no release is lost. With `release_by_write` the
// release is a plain WRITE instead: on soft-RoCE a waiter's failed COMPARE_SWAP can write the
// old (locked) value back over it, and the hammer shows that release lost.
#include <cstdint>
#include <string>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

struct LockHammerOptions {
  double seconds = 10;
  uint32_t words = 4;       // shared lock words (at most kMaxWords)
  uint32_t threads = 2;     // one endpoint each
  uint32_t coroutines = 4;  // per thread
  bool release_by_write = false;
  double stuck_seconds = 3;  // a lock word unchanged this long while waited on: its release was lost
  static constexpr uint32_t kMaxWords = 64;
};

struct LockHammerResult {
  uint64_t acquisitions = 0;
  uint64_t cas_failures = 0;   // COMPARE_SWAPs that found the word held
  uint64_t counter_delta = 0;  // sum of the counters' growth: equals acquisitions when exclusive
  double seconds = 0;
  double max_wait_ms = 0;
  std::string failure;  // empty when every check held
};

/// Scratch-area offsets of memnode 0 (below ScratchLayout::kPerCnBase): lock word i and the
/// counter it guards. The counter is read and written with plain READ/WRITE under the lock.
uint64_t lock_hammer_word_offset(uint32_t i);
uint64_t lock_hammer_counter_offset(uint32_t i);

/// Runs the hammer from this process alone (the counter check assumes no other hammer runs).
/// Throws FabricError when a memnode fails.
LockHammerResult run_lock_hammer(fabric::Cluster& cluster, const LockHammerOptions& o);

}  // namespace dmhnsw::compute
