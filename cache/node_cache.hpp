#pragma once
// SHINE node cache (paper section 5): a concurrent hash table from RemotePtr to a node's
// vector and label. Its entries are `dim` floats of any content: a computenode that searches
// over codes keeps neighbour lists in it instead, each at the version it was read at
// (lookup_at), since lists change and vectors never do.
//  - Lookups take no lock: chains of entries linked by tagged pointers; an entry's tag is
//    bumped when it is unlinked, so a reader that followed a stale pointer (or whose entry
//    was recycled while it read the vector) notices the mismatch and restarts.
//  - Admission and eviction lock one bucket of the table.
//  - Replacement: when full, a random entry turns "cooling" and its key goes to the front
//    of a small FIFO in the cooling table (a hash table of FIFOs, ~10% of the entries);
//    a key falling off the end of a FIFO is evicted; a hit on a cooling entry makes it hot
//    again (its key leaves the FIFO).
//  - Admission: nodes of upper levels always, level-0 nodes with probability p.
#include <cstdint>
#include <memory>

#include "common/fabric/remote_ptr.hpp"

namespace dmhnsw::cache {

struct NodeCacheConfig {
  uint64_t capacity_bytes = 0;      // memory for entries: capacity = capacity_bytes / entry_bytes(dim)
  uint32_t dim = 0;                 // floats per vector
  double admit_probability = 0.01;  // level-0 nodes; upper levels are always admitted
  double cooling_share = 0.10;      // share of the entries held in the cooling table
  uint64_t seed = 1;                // admission and victim choice
};

struct NodeCacheStats {
  uint64_t lookups = 0;       // lookup()/visit() calls
  uint64_t hits = 0;
  uint64_t cooling_hits = 0;  // hits on a cooling entry (made hot again)
  uint64_t admissions = 0;    // entries inserted
  uint64_t rejections = 0;    // admit() calls the admission policy said no to
  uint64_t evictions = 0;
  uint64_t entries = 0;       // entries now in the cache
  double hit_rate() const { return lookups == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(lookups); }
};

class NodeCache {
 public:
  explicit NodeCache(const NodeCacheConfig& cfg);
  ~NodeCache();
  NodeCache(const NodeCache&) = delete;
  NodeCache& operator=(const NodeCache&) = delete;

  /// Bytes one entry costs (vector, label, key, tag, links, cooling share), so that
  /// capacity_bytes / entry_bytes(dim) entries fit.
  static uint64_t entry_bytes(uint32_t dim);
  uint64_t capacity_entries() const;
  uint32_t dim() const;

  /// Lock-free lookup. On a hit copies the vector (dim floats) to `vec`, the label to
  /// `label` and (when not null) the node's level to `level` and the record's generation to
  /// `generation`, and returns true. Never returns another key's vector.
  bool lookup(RemotePtr key, float* vec, uint64_t* label, unsigned* level = nullptr, uint32_t* generation = nullptr);
  /// A lookup that hits only an entry admitted with `generation` (an entry of another one counts
  /// as a miss and stays until admit() replaces it or it is evicted).
  bool lookup_at(RemotePtr key, float* vec, uint32_t generation);

  /// Offers a node just read from remote memory. Level > 0: always admitted; level 0: with
  /// probability admit_probability. Evicts through the cooling table when full. Returns
  /// true when the node is now cached (also when it already was).
  bool admit(RemotePtr key, unsigned level, const float* vec, uint64_t label, uint32_t generation = 0);

  /// Takes `key` out of the cache (its record was reused for another vector); true when it was
  /// there. Thread-safe. admit() of a key with another generation than the cached one does
  /// the same first.
  bool erase(RemotePtr key);
  /// Takes every entry out (an owner that lost track of which records changed).
  void clear();
  /// How far the owner has applied an external log of such changes (0 at first); set_applied
  /// only moves it forward. Thread-safe.
  uint64_t applied() const;
  void set_applied(uint64_t position);

  /// Counters summed over all threads (approximate while other threads run).
  NodeCacheStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dmhnsw::cache
