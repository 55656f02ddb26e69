#pragma once
// The process-wide cache of vectors that a shine build has read. A node's vector never
// changes once written, so every inserting thread may use what any thread read; an insert
// looks up every candidate's neighbours here before it reads them remotely (most are found
// once the graph has been walked a few times), so a lookup must cost about one cache miss:
// an open-addressing table of (node pointer, slot) with lock-free reads, over flat arrays of
// vectors, levels and labels. Append-only and bounded; both live in lazily touched mappings.
// A record reused after a delete holds another vector: its key is forgotten (invalidate) when
// the index's reuse log says so, and the new vector cached anew.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/fabric/remote_ptr.hpp"

namespace dmhnsw::shine {

/// A vector read from the index, with the node's level and label: a view that stays valid
/// as long as the cache that returned it.
struct VecEntry {
  const float* v = nullptr;
  unsigned level = 0;
  uint64_t label = 0;
};

class VectorCache {
 public:
  /// Holds at most about `max_bytes` (vectors of `dim` floats plus their table share).
  VectorCache(uint64_t max_bytes, uint32_t dim);
  ~VectorCache();
  VectorCache(const VectorCache&) = delete;
  VectorCache& operator=(const VectorCache&) = delete;

  /// Thread-safe, lock-free.
  std::optional<VecEntry> find(RemotePtr p) const;
  /// Caches p's vector; returns a view of it (this copy or one another thread cached first),
  /// or nullopt when the cache is full. Thread-safe.
  std::optional<VecEntry> insert(RemotePtr p, const float* v, unsigned level, uint64_t label);
  /// Forgets p's vector (its record was reused for another): a later find misses, a later
  /// insert caches the new one. Thread-safe.
  void invalidate(RemotePtr p);
  /// How far the owner has applied the index's reuse log (0 at first); only moves forward.
  uint64_t applied() const { return applied_.load(std::memory_order_acquire); }
  void set_applied(uint64_t position) {
    uint64_t cur = applied_.load(std::memory_order_relaxed);
    while (cur < position && !applied_.compare_exchange_weak(cur, position, std::memory_order_acq_rel)) {
    }
  }
  /// Starts loading p's table cell, so that a find(p) soon after does not wait for memory.
  void prefetch(RemotePtr p) const {
    if (capacity_ != 0) __builtin_prefetch(&keys_[home(p.raw())]);
  }
  uint64_t bytes() const;
  uint64_t entries() const { return entries_.load(std::memory_order_relaxed); }
  uint64_t capacity() const { return capacity_; }

 private:
  VecEntry view(uint64_t slot) const {
    return {vecs_ + slot * stride_, levels_[slot], labels_[slot]};
  }
  size_t home(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  uint32_t dim_;
  size_t stride_;          // floats per vector slot (a multiple of 16: 64-byte aligned rows)
  uint64_t capacity_ = 0;  // vector slots
  size_t mask_ = 0;
  unsigned shift_ = 63;
  size_t map_bytes_ = 0;
  void* map_ = nullptr;  // one anonymous mapping holding everything below
  float* vecs_ = nullptr;
  uint64_t* labels_ = nullptr;
  uint8_t* levels_ = nullptr;
  std::atomic<uint64_t>* keys_ = nullptr;   // RemotePtr::raw(); 0 = empty (no node lives at 0:0)
  std::atomic<uint64_t>* slots_ = nullptr;  // slot + 1 once the vector is in; 0 = being written
  std::atomic<uint64_t> next_{0}, entries_{0}, applied_{0};
  static constexpr uint64_t kDead = ~uint64_t{0};  // a forgotten key's cell (no node lives at the last address)
};

}  // namespace dmhnsw::shine
