#pragma once
// d-HNSW in-place inserts (paper section 4.2, Algorithms 3 and 4), safe with many computenodes
// inserting and querying at once.
//
// An insert batch is routed by the cached meta-HNSW (each vector to its nearest partition) and
// grouped by sub-HNSW. For each sub-HNSW, under its group's lock (compute/dhnsw/group_lock.hpp):
//   1. READ the live descriptors of the sub and of its group partner (compute/dhnsw/layout.hpp);
//   2. fetch the sub with the overflow it uses (one READ range) and deserialize it; an odd
//      version means a writer died inside a commit: the copy is sanitized and repaired;
//   3. insert the vectors into the local copy (Faiss), refuse an id the sub already holds;
//   4. commit (compute/dhnsw/commit.hpp): version := odd; the appends and dirty neighbour
//      ranges in one doorbell batch of WRITEs; the descriptor's live fields; version := even.
// The insert is acknowledged after step 4 completed. Readers check the version around their
// fetch (compute/dhnsw/pipeline_stages.cpp), so they never use a torn copy. Deletes mark label
// entries under the same lock (compute/dhnsw/delete.cpp); the computenode's insert, upsert and
// delete runs are in insert_run.hpp.
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fabric/transport.hpp"
#include "compute/coro.hpp"
#include "compute/dhnsw/boundary.hpp"
#include "compute/dhnsw/group_lock.hpp"
#include "compute/dhnsw/pipeline.hpp"
#include "compute/id_index.hpp"
#include "compute/run_context.hpp"

namespace dmhnsw::dhnsw {

struct InsertTuning {
  uint32_t lease_ms = 2000;        // a lock word unchanged this long is taken over
  uint32_t meta_ef_search = 64;    // efSearch of the routing search in the meta-HNSW
  uint32_t max_write_ops = 64;     // WRITEs per doorbell
  /// A sub-HNSW whose deleted share passes this after a delete starts a rebuild, which drops the
  /// deleted vectors (0: never; `computenode rebuild` still does).
  double rebuild_deleted = 0.5;
};

struct InsertStats {
  uint64_t inserted = 0, commits = 0, writes = 0, doorbells = 0, bytes_written = 0, bytes_fetched = 0;
  uint64_t appended_bytes = 0, overwritten_bytes = 0, overflow_records = 0;
  uint64_t lock_waits = 0, lock_takeovers = 0, repairs = 0, sanitized_entries = 0;
  uint64_t buffered = 0, rebuilds = 0, epoch_moves = 0, duplicates_skipped = 0;
  uint64_t deleted = 0, not_found = 0, replaced = 0, id_lookups = 0, rebuild_waits = 0;
  uint64_t redone = 0;  // upserts repeated after a rebuild began before their old vectors were marked
  uint64_t copies = 0;  // boundary copies placed beside the inserted vectors (compute/dhnsw/boundary.hpp)
  std::vector<nlohmann::json> rebuild_reports;  // of the rebuilds this computenode ran as master
  std::vector<double> commit_us;  // per commit: lock taken to version published
  nlohmann::json to_json(double seconds) const;
};

/// Inserts into a d-HNSW index over one endpoint (not thread-safe; one per thread). Follows the
/// epochs (compute/dhnsw/epoch.hpp): in place while no rebuild runs, into the insert buffer
/// while one does, and it becomes the rebuild master when a group's shared gap is full.
class Inserter {
 public:
  Inserter(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, InsertTuning t = {});
  /// Inserts n vectors (n x dim) with global ids `ids`; every one is acknowledged (committed and
  /// published, or committed in the insert buffer) when this returns. Throws
  /// std::invalid_argument on a duplicate id (naming it), FabricError on a dead memnode. With
  /// the index's id index, an id it holds is refused before anything is inserted, unless
  /// `upsert`: then the new vector goes in, the id is pointed at it, and the old one is marked
  /// deleted (a search sees the old vector until the new one is in, never after this returns).
  /// Upserts wait for a running rebuild to finish (its buffer does not take them).
  void insert(const float* x, const int64_t* ids, size_t n, bool upsert = false);
  /// Marks the vectors of `ids` deleted: under their group's lock, the label entry's top bit
  /// (seqlocked like a commit), then the id's entry is removed. Returns the ids the index does
  /// not hold. While a rebuild builds, the live epoch is marked and the master carries the marks
  /// into the new epoch; only ids the id index lacks then (maybe in the insert buffer) and
  /// deletes while the master carries or merges wait for it. Throws std::invalid_argument when
  /// the index has no id index.
  std::vector<int64_t> remove(const int64_t* ids, size_t n);
  bool has_id_index() const { return ids_ != nullptr; }
  const InsertStats& stats() const { return st_; }
  const Index& index() const { return *index_; }
  /// The rebuild master's merge of the buffer: ids already in their sub-HNSW are skipped (a
  /// merge that was cut short is done again), and a full gap is thrown (CommitDoesNotFit).
  void set_merge_mode(bool on) { merge_ = on; }

 private:
  // One batch: checked (and upserts' setup), routed, placed sub by sub, then finished (an
  // upsert's old vectors marked deleted, ids another computenode took withdrawn).
  void begin_batch(const int64_t* ids, size_t n, bool upsert);
  /// Where each row goes, as slots (row * kMaxCopies + k: copy k of the row, 0 its primary) per
  /// sub-HNSW: the meta-HNSW's top 1; with boundary copies, the nearest centroid and those within
  /// the index's rule (compute/dhnsw/boundary.hpp).
  std::map<uint32_t, std::vector<size_t>> route(const float* x, const std::vector<size_t>& rows);
  /// Commits the rows of `slots` into `sub` (or appends them to the insert buffer while a rebuild
  /// runs); marks the slots in `done`. False when they must be routed again (the epoch moved, a
  /// rebuild started or ended).
  bool place(uint32_t sub, const float* x, const int64_t* ids, const std::vector<size_t>& slots, std::vector<char>& done);
  bool append_to_buffer(const float* x, const int64_t* ids, const std::vector<size_t>& slots, std::vector<char>& done);
  void finish_batch(const float* x, const int64_t* ids, size_t n);
  /// Ids whose copies this batch mapped but whose own label entry no longer holds them (deleted,
  /// or moved by another's upsert, meanwhile): one READ of each label entry.
  std::vector<int64_t> own_gone();

  enum class Outcome { Done, EpochMoved, UseBuffer };
  /// Under the group's lock: the live epoch checked, then steps 1-4 above.
  Outcome insert_into(uint32_t sub, const float* x, const int64_t* ids, size_t n);
  struct Fetched;
  Fetched fetch_sub(uint32_t sub);  // steps 1 and 2
  /// Step 4, while this computenode still holds the group's lock word `mine`.
  void commit(uint32_t sub, uint64_t mine, const Fetched& f, const std::vector<int64_t>& kept_ids);
  RemotePtr live_ptr(uint32_t sub, size_t field = 0) const;  // of the sub's live descriptor
  /// insert_into for `rows` of (x, ids), halved while the group's gap cannot take them at once;
  /// marks the committed rows in `done`.
  Outcome commit_rows(uint32_t sub, const float* x, const int64_t* ids, const std::vector<size_t>& rows,
                      std::vector<char>& done);
  void reload();
  void ack();
  /// Returns once the control block's phase is idle (no rebuild, no merge), or with `deletes`
  /// once deletes may mark the live epoch (idle, or a rebuild building with deletes open); the
  /// phase it saw. Takes over a master whose word stays unchanged for a lease.
  uint64_t wait_for_idle(bool deletes = false);
  /// The id index's entries of `keys` (null: absent), looked up concurrently.
  std::vector<RemotePtr> lookup(const std::vector<IdKey>& keys);
  /// Maps each key to its label entry with IdIndex::insert(replace = upsert_); upserted ids' old
  /// entries go to replaced_, ids another computenode inserted meanwhile to lost_.
  void map_ids(const std::vector<IdKey>& keys, const std::vector<std::pair<int64_t, RemotePtr>>& placed);
  /// Removes the id index's entries keys[i] -> e[i] where which[i] (an entry that names another
  /// place now, moved by an upsert, stays).
  void unmap_ids(const std::vector<IdKey>& keys, const std::vector<std::pair<int64_t, RemotePtr>>& e,
                 const std::vector<char>& which);
  /// Partitions a vector is in at most: the index's max_copies with boundary copies, else 1.
  unsigned copies_max() const { return rule_.partitions(); }
  enum class Marked { Done, EpochMoved, NotIdle };
  /// Marks the label entries `e` (id, entry) deleted, group by group under each group's lock;
  /// sets done[i] for each marked and gone[i] for each whose entry no longer holds its id.
  /// Stops at the first group that finds the epoch moved or a rebuild running.
  Marked mark_deleted(const std::vector<std::pair<int64_t, RemotePtr>>& e, std::vector<char>& done,
                      std::vector<char>& gone, bool& rebuild);
  /// The slot-0 sub of the group holding region place `p`, or kNoPartner.
  uint32_t group_of(RemotePtr p) const;
  void rebuild_for_deletes();
  /// run_rebuild as master (with `wait_for_master`, watching another master's word and taking
  /// a dead one's over); counts it. False when another computenode was the master.
  bool rebuild(bool wait_for_master);  // this computenode's acknowledgement word: the epoch it uses, a beat
  void post_writes(uint16_t memnode, const std::vector<std::pair<uint64_t, const std::vector<char>*>>& w);

  fabric::Cluster& c_;
  fabric::Endpoint& ep_;
  std::unique_ptr<Index> index_;
  std::unique_ptr<compute::Scheduler> sched_;  // for the id index's coroutines, on ep_
  std::unique_ptr<IdIndex> ids_;               // null when the index has none
  bool upsert_ = false;
  BoundaryRule rule_;                 // the index's boundary copies
  std::optional<CopyPlacement> placement_;  // over the meta-HNSW's centroids, with copies
  std::vector<uint8_t> placed_copies_;  // per row of the batch: bit k set once copy k is committed
  std::vector<uint64_t> row_epoch_;     // per row of the batch: the epoch its own partition took it in
  std::vector<std::pair<int64_t, RemotePtr>> unmapped_copies_;  // copies of ours whose key another's copy took
  std::vector<std::pair<int64_t, RemotePtr>> placed_;    // label entries of the last commit's vectors
  /// Every key this batch mapped and the entry it names, to withdraw a row another computenode's
  /// insert of the same id won (all its copies), and an upsert's old copies beyond the new ones.
  std::vector<std::pair<IdKey, RemotePtr>> mapped_;
  std::vector<std::pair<int64_t, RemotePtr>> replaced_;  // old entries of upserted ids, to mark deleted
  std::vector<std::pair<int64_t, RemotePtr>> lost_;      // ours, of ids inserted elsewhere meanwhile
  uint32_t cn_id_;
  InsertTuning t_;
  uint64_t ticket_ = 0, beat_ = 0;
  bool merge_ = false;
  int pause_in_commit_ms_ = 0;  // DMHNSW_TEST_PAUSE_IN_COMMIT_MS: tests kill a writer inside a commit
  InsertStats st_;
  /// Since when a rebuild we asked for was turned away (another master's word set).
  std::optional<std::chrono::steady_clock::time_point> skipped_since_;
};

}  // namespace dmhnsw::dhnsw
