#pragma once
// What d-HNSW's rebuild master (compute/dhnsw/epoch.hpp) reads of the live epoch, and the deletes
// it carries from there into the shadow before publishing it.
#include <cstdint>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/index.hpp"

namespace dmhnsw::dhnsw {

/// Every vector of the live epoch, read group by group under each group's lock, and (with
/// `buffer`) the insert buffer's committed entries that no sub-HNSW holds yet.
struct Snapshot {
  std::vector<float> x;
  std::vector<int64_t> ids;
  std::vector<RemotePtr> where;  // the label entry of each vector read from a sub-HNSW
  uint64_t bytes = 0, from_buffer = 0, dropped = 0;  // dropped: deleted vectors left out
  uint64_t duplicates = 0;  // other vectors of an id left out (an upsert cut short by this rebuild)
  uint64_t copies = 0;      // boundary copies left out (the new epoch places them anew)
  /// The label entries of each group as read (deleted ones too): carry_deletes reads them again.
  struct LabelRun {
    uint32_t group;  // its slot-0 sub
    RemotePtr at;
    uint64_t bytes;
  };
  std::vector<LabelRun> label_runs;
};

/// Reads the snapshot (see Snapshot), each group under its lock; with `buffer`, also the insert
/// buffer's committed entries. An id live twice keeps the copy the id index names.
Snapshot snapshot(fabric::Endpoint& ep, const Index& idx, uint32_t cn_id, bool buffer);

/// Deletes acknowledged while the rebuild ran mark the live epoch in place; those that came
/// after the snapshot read their group are carried into the shadow `b` (not yet published, so
/// written without locks): with deletes closed, each group's label entries are read again under
/// its lock, and every vector the snapshot kept whose entry now has the deleted bit loses its
/// id index entry, gets the bit and counts in its sub's `deleted`. Returns their ids.
std::vector<int64_t> carry_deletes(fabric::Endpoint& ep, const Index& idx, uint32_t cn_id, const Snapshot& s,
                                   const BuiltIndex& b);

}  // namespace dmhnsw::dhnsw
