#pragma once
// d-HNSW's UpdateCommit (paper section 4.2, Algorithm 4): what an in-place insert into one
// sub-HNSW writes back. After the computenode inserted vectors into its local copy of the sub,
// the commit holds, as region WRITEs:
//   - the appended tails of levels, offsets, neighbors, labels, codes and vectors: first into each
//     array's internal gap, then as overflow records in the group's shared gap (slot 0 growing
//     up, slot 1 down; compute/dhnsw/layout.hpp says exactly how);
//   - the dirty ranges of the neighbour lists of nodes that were there before;
//   - the new live descriptor (count, entry point, max level, used bytes, overflow used).
// Pure: no fabric here (compute/dhnsw/insert.cpp posts it under the group lock).
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "compute/dhnsw/layout.hpp"
#include "compute/dhnsw/subindex.hpp"

namespace dmhnsw::dhnsw {

/// Elements [logical, logical + bytes) of an array are at region offset `region`.
struct Segment {
  uint64_t logical = 0;
  uint64_t region = 0;
  uint64_t bytes = 0;
};
using ArraySegments = std::array<std::vector<Segment>, kNumArrays>;

/// Where each array's elements of sub `d` are, in order: the internal part, then each overflow
/// record's payload in time order. `fetched` holds fetch_range(d) and was accepted by
/// deserialize_sub (so its records parse).
ArraySegments array_segments(const char* fetched, size_t len, const SubDesc& d);
/// Bytes [logical, logical + out_len) of an array, gathered from `fetched` by its segments.
std::vector<char> gather(const char* fetched, const SubDesc& d, const std::vector<Segment>& segs);

struct RegionWrite {
  uint64_t offset = 0;  // region offset on the sub's memnode
  std::vector<char> bytes;
};

struct UpdateCommit {
  uint32_t sub = 0;
  uint16_t memnode = 0;
  SubDesc desc{};  // the new live descriptor; its version is the old one + 2 (rounded to even)
  std::vector<RegionWrite> writes;
  /// Where the appended labels go (logical offsets in the labels array): the id index names them.
  std::vector<Segment> label_tail;
  uint64_t appended_bytes = 0, overwritten_bytes = 0, overflow_records = 0, overflow_bytes = 0;
};

/// The shared gap of the group cannot take the commit: a rebuild is needed.
class CommitDoesNotFit : public std::runtime_error {
 public:
  CommitDoesNotFit(const std::string& what, uint64_t need, uint64_t free)
      : std::runtime_error(what), needed(need), available(free) {}
  uint64_t needed, available;
};

/// The commit that turns sub `d` (as fetched: `segs`, and its neighbours array as it was in
/// remote memory, `old_neighbors`) into `now` (the local copy after the inserts; its first
/// d.count nodes are the old ones; with codes, now.codes holds one per node). `partner` is the live descriptor of the other sub of the
/// group (null when alone), for the free space of the shared gap. Throws CommitDoesNotFit.
UpdateCommit prepare_commit(const SubDesc& d, const ArraySegments& segs, const std::vector<int32_t>& old_neighbors,
                            const SubIndex& now, const SubDesc* partner, uint32_t dim, uint32_t code_size);

}  // namespace dmhnsw::dhnsw
