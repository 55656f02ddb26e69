#pragma once
// The records of deleted nodes, kept for reuse (hnswlib's replace_deleted): one stack per
// memnode of the deleted records that lie on it, in that memnode's region, changed with
// one-sided operations only, so that an insert reuses a record instead of growing the region
// and memory stays flat under steady churn (docs/architecture.md, "Deletes and upserts").
//
// A memnode's stack is a state word, then `capacity` slots. The state word holds the count
// (bits 0..39), and while a computenode pushes or pops, bit 63 and 23 bits of that holder's
// random number (bits 40..62). A push takes the word (COMPARE_SWAP count -> held), WRITEs the
// slot above the count, and releases with count + 1; a pop takes the word, READs the top slot,
// releases with count - 1. A state word held unchanged for kFreeListLease belongs to a holder
// that died: it is released with its count (a push in flight is lost: one record leaks, never
// a record handed out twice).
#include <cstdint>
#include <random>
#include <vector>

#include "common/fabric/remote_ptr.hpp"
#include "compute/coro.hpp"

namespace dmhnsw::shine {

/// Where the stacks are: at `offset` on every one of `memnodes` memnodes, `capacity` slots each.
struct FreeTable {
  uint16_t memnodes = 0;
  uint64_t offset = 0;
  uint64_t capacity = 0;  // 0: no stacks (an index without an id index, or from before them)

  /// Bytes the stack takes on each memnode (state word + slots, rounded up to 64).
  uint64_t bytes_per_memnode() const { return capacity == 0 ? 0 : (8 * (1 + capacity) + 63) / 64 * 64; }
  RemotePtr state(uint16_t memnode) const { return RemotePtr(memnode, offset); }
  RemotePtr slot(uint16_t memnode, uint64_t i) const { return RemotePtr(memnode, offset + 8 * (1 + i)); }
  /// Stacks for an index of `ids` ids: twice a memnode's share of them each.
  static FreeTable sized_for(uint64_t ids, uint16_t memnodes, uint64_t offset);
};

/// The reuse log: entry i of the ring (reuse number n at i = n mod capacity) is [n + 1, the
/// record's RemotePtr], written by the reuser after it claimed n from kReused.
struct ReuseLog {
  uint64_t offset = 0;    // on memnode 0
  uint64_t capacity = 0;  // entries; 0: none
  static constexpr uint64_t kEntryBytes = 16;
  static constexpr uint64_t kDefaultEntries = 4096;
  uint64_t bytes() const { return (capacity * kEntryBytes + 63) / 64 * 64; }
  RemotePtr entry(uint64_t n) const { return RemotePtr(0, offset + kEntryBytes * (n % capacity)); }
};

/// The state word's parts.
struct FreeState {
  static constexpr uint64_t kHeld = uint64_t{1} << 63;
  static constexpr uint64_t kCountMask = (uint64_t{1} << 40) - 1;
  static constexpr uint64_t count(uint64_t w) { return w & kCountMask; }
  static constexpr bool held(uint64_t w) { return (w & kHeld) != 0; }
  static constexpr uint64_t holding(uint64_t w, uint64_t nonce) { return kHeld | ((nonce & 0x7fffff) << 40) | count(w); }
};
static_assert(FreeState::count(FreeState::holding(12345, ~uint64_t{0})) == 12345);
static_assert(FreeState::held(FreeState::holding(0, 0)) && !FreeState::held(FreeState::kCountMask));

/// One computenode thread's access to the stacks, over its scheduler.
class FreeLists {
 public:
  FreeLists(const FreeTable& t, compute::Scheduler& s, uint64_t seed)
      : t_(t), s_(s), rng_(seed), guess_(t.memnodes, 0) {}
  bool enabled() const { return t_.capacity > 0; }

  /// Keeps the record `n` (a deleted node nobody's id names) for reuse; false when its
  /// memnode's stack is full (the record is then not reused).
  compute::Task<bool> push(RemotePtr n, compute::IoStats* io = nullptr);
  /// A kept record, from memnode `prefer` if it has one, else from the memnode with most; null
  /// when every stack is empty.
  compute::Task<RemotePtr> pop(uint16_t prefer, compute::IoStats* io = nullptr);

 private:
  /// Takes memnode m's state word (first trying `guess`, the word it is thought to hold).
  struct Taken {
    uint64_t was;   // the word it had (unheld)
    uint64_t mine;  // the word that marks it held here
  };
  compute::Task<Taken> take(uint16_t m, uint64_t guess, compute::IoStats* io);
  compute::Task<uint64_t> cas(RemotePtr word, uint64_t expect, uint64_t want, compute::IoStats* io);
  compute::Task<void> release(uint16_t m, uint64_t mine, uint64_t count, compute::IoStats* io);

  FreeTable t_;
  compute::Scheduler& s_;
  std::mt19937_64 rng_;
  std::vector<uint64_t> guess_;  // per memnode: the count this thread last saw (a push's first guess)
};

}  // namespace dmhnsw::shine
