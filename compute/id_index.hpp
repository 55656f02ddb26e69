#pragma once
// The id index: an application's 64-bit id -> the remote word that holds it (a shine node
// record's label word; a d-HNSW sub-HNSW's label entry), a hash table in the memnodes' regions
// read and changed with one-sided operations only, so that any computenode finds, replaces or
// removes an id without asking anyone (docs/architecture.md, "The id index"). Both modes use it.
//
// Each id hashes to two buckets (two choices keep every bucket well below full) of
// IdSlot::kPerBucket 8-byte words; bucket b of the table lives on memnode b % N. A bucket's first
// word is a lock, the others are slots. A slot is 0 (free) or an entry: the node's place and 12
// bits of the id's hash (IdSlot). An entry names its id only through the word it points at
// (plus the index's label offset: NodeFront::label in a shine record, 0 in d-HNSW), so a lookup READs both buckets in one doorbell, then the label words
// of the entries whose bits match, in a second; lookups take no lock.
//
// Inserts, replacements and removals of an id hold the lock of the id's first bucket, so two of
// them never both find the id absent; each then changes one slot with COMPARE_SWAP (the slot may
// be taken meanwhile by an id whose lock is another's). A lock word that stays the same for
// kIdLockLease belongs to a computenode that died holding it (a critical section is a few round
// trips) and is taken over. A place is reused for another id (or its word marked deleted)
// only after, or while, its entry is removed: a lookup that read the entry before then finds
// another label and does not match.
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/fabric/remote_ptr.hpp"
#include "common/id_table.hpp"
#include "compute/coro.hpp"

namespace dmhnsw {

/// One computenode thread's access to the table, over its scheduler.
class IdIndex {
 public:
  /// `label_offset`: where, from the place an entry names, the 8-byte word holding the id is.
  IdIndex(const IdTable& t, uint64_t label_offset, compute::Scheduler& s, uint64_t seed)
      : t_(t), label_offset_(label_offset), s_(s), rng_(seed) {}

  /// The node holding `id`, or null. An IdKey::copy_of finds a boundary copy of the id.
  compute::Task<RemotePtr> find(IdKey id, compute::IoStats* io = nullptr);
  /// find() of every key, `lanes` in flight at once; runs the scheduler until all are done.
  std::vector<RemotePtr> find_all(const std::vector<IdKey>& keys, size_t lanes = 16);

  enum class Put : uint8_t { Inserted, Present, Replaced };
  struct PutResult {
    Put what;
    RemotePtr old;  // Present: the node holding the id; Replaced: the node it held before
  };
  /// Maps `id` to `node` (whose record's label word already holds `id`). An id already present
  /// is left as it is (Present) unless `replace`, which points its entry at `node` in one CAS
  /// (Replaced). Throws when both buckets are full (the table is sized too small).
  compute::Task<PutResult> insert(IdKey id, RemotePtr node, bool replace, compute::IoStats* io = nullptr);

  /// Removes `id`'s entry; returns the node it named, or null when the id was absent. With
  /// `only` set, removes it only while it names that node (null when it names another).
  compute::Task<RemotePtr> erase(IdKey id, RemotePtr only = {}, compute::IoStats* io = nullptr);

 private:
  struct Slots {
    uint64_t word[2 * IdSlot::kPerBucket];  // both buckets; words 0 and kPerBucket are their locks
  };
  static bool is_slot(unsigned pos) { return pos % IdSlot::kPerBucket != 0; }
  /// Takes the lock of `h`'s first bucket; returns the word that marks it ours.
  compute::Task<uint64_t> lock(const IdHash& h, compute::IoStats* io);
  compute::Task<void> unlock(const IdHash& h, uint64_t mine, compute::IoStats* io);
  /// Reads both buckets (one doorbell).
  compute::Task<Slots> read_buckets(const IdHash& h, compute::IoStats* io);
  /// Positions of `s` that hold `id`'s entries, lowest first (their labels read in one doorbell).
  compute::Task<std::vector<unsigned>> matches(const IdKey& id, const IdHash& h, const Slots& s, compute::IoStats* io);
  compute::Task<uint64_t> cas(RemotePtr word, uint64_t expect, uint64_t want, compute::IoStats* io);
  RemotePtr slot_ptr(const IdHash& h, unsigned pos) const {
    return t_.bucket(h.bucket[pos / IdSlot::kPerBucket]) + 8ull * (pos % IdSlot::kPerBucket);
  }
  void check(const fabric::Completion& c) const;

  IdTable t_;
  uint64_t label_offset_;
  compute::Scheduler& s_;
  std::mt19937_64 rng_;
};

}  // namespace dmhnsw
