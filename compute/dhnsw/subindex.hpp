#pragma once
// Sub-HNSWs in remote memory: a Faiss IndexHNSWFlat (Faiss 1.7.3) written into the five
// arrays of its block (compute/dhnsw/layout.hpp) and rebuilt from the bytes of one
// fetch_range() READ; the meta-HNSW as a Faiss index file inside the metadata block.
//
// Faiss members used: HNSW::levels (int, levels a node is in, >= 1), HNSW::offsets (size_t,
// count + 1), HNSW::neighbors (int32, -1 = empty), HNSW::entry_point, HNSW::max_level, and the
// IndexFlatCodes storage's `codes` (the float vectors, 4 * dim bytes each). Faiss ids inside a
// sub-HNSW are local (0..count-1); SubIndex::labels maps them to global ids.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <faiss/IndexHNSW.h>
#include <faiss/impl/IDSelector.h>

#include "compute/codes.hpp"
#include "compute/dhnsw/layout.hpp"

namespace dmhnsw::dhnsw {

/// The used sizes of `idx`'s arrays (count = ntotal, neighbour entries = offsets[ntotal]).
SubShape shape_of(const faiss::IndexHNSWFlat& idx);

/// The used sizes of `idx`'s arrays with codes of `code_size` bytes (0: none).
SubShape shape_of(const faiss::IndexHNSWFlat& idx, uint32_t code_size);

/// Writes `idx` (with `labels`: one global id per vector, idx.ntotal of them, and `codes`:
/// code_size bytes per vector, null when the index has none) into `block`, which holds
/// d.block_bytes bytes: each array at d.arrays[a].offset, its internal gap (and any byte of the
/// block outside the arrays) zeroed. The used sizes in `d` must be those of shape_of(idx)
/// (std::invalid_argument otherwise). Does not write overflow records.
void serialize_sub(const faiss::IndexHNSWFlat& idx, const int64_t* labels, const uint8_t* codes, uint32_t code_size,
                   const SubDesc& d, char* block);
inline void serialize_sub(const faiss::IndexHNSWFlat& idx, const int64_t* labels, const SubDesc& d, char* block) {
  serialize_sub(idx, labels, nullptr, 0, d, block);
}

/// A sub-HNSW rebuilt in local memory.
struct SubIndex {
  uint32_t id = 0;
  uint64_t version = 0;  // SubDesc::version it was read at
  uint64_t epoch = 0;    // MetaHeader::epoch of the index it belongs to
  std::unique_ptr<faiss::IndexHNSWFlat> index;
  std::vector<int64_t> labels;  // global id of each local Faiss id (kDeletedLabel set: deleted)
  uint64_t sanitized = 0;       // neighbour entries dropped by deserialize_sub(sanitize)
  /// Deleted vectors (labels with kDeletedLabel) and, when there are any, a Faiss selector of
  /// the live ones: searches expand deleted nodes but never return them.
  uint64_t deleted = 0;
  std::vector<uint8_t> live_bits;
  std::unique_ptr<faiss::IDSelectorBitmap> live;
  /// The codes array (an index with codes, read whole): what a commit extends.
  std::vector<uint8_t> codes;
  /// Read for a search over codes: the index compares codes, and the vectors stay in the
  /// memnode's region (those of overflow records were fetched anyway and are kept here).
  bool coded = false;
  uint16_t memnode = 0;
  uint64_t vectors_offset = 0;   // region offset of the vectors array's internal part
  uint64_t vectors_internal = 0; // vectors in it (local ids below this)
  std::vector<float> overflow_vectors;  // of local ids vectors_internal.. (dim floats each)
  /// Sets `deleted`, `live_bits` and `live` from `labels`.
  void index_deleted();
  /// Heap bytes held (graph, vectors, labels): what a cache of SubIndexes accounts.
  size_t memory_bytes() const;
};

/// Rebuilds sub `d` from `fetched`, the `len` bytes of region range fetch_range(d) (extra
/// bytes beyond it are ignored; fewer are refused). Checks the descriptor against the buffer
/// (every array's used <= capacity and inside the block), parses and applies the overflow
/// records (see the layout header: read in increasing address order from the start of the used
/// part; applied in time order, i.e. address order for slot 0, reverse address order for slot
/// 1), then checks the assembled arrays: levels count == d.count, offsets count + 1 entries,
/// monotone, offsets[0] == 0 and offsets[count] == neighbour entries, each node's neighbour
/// range matching Faiss's size for its level, levels in 1..max_level + 1, neighbour ids in
/// -1..count-1, the entry point a node of level max_level + 1, vectors dim * count floats,
/// labels count entries (a negative label is a deleted vector: index_deleted()). Dimension, M,
/// metric and efConstruction come from `h`. Throws
/// std::runtime_error naming `what`, the array and the byte offset (in `fetched`) on bad data.
/// Copies: one per array (into Faiss's std::vectors), plus the overflow payloads.
/// With `sanitize`, neighbour ids outside 0..count-1 are dropped from their lists first (the
/// rest moved up, -1 after them): what a commit left half-written by a dead computenode looks
/// like (lists of old nodes pointing at nodes its descriptor never published).
/// With `coded` (the index's quantizer), `fetched` holds coded_fetch_parts(d) only: the index
/// compares codes, SubIndex::coded is set and the vectors are located for a re-rank.
SubIndex deserialize_sub(const char* fetched, size_t len, const SubDesc& d, const MetaHeader& h,
                         const std::string& what, bool sanitize = false,
                         std::shared_ptr<const compute::Quantizer> coded = nullptr);

/// The meta-HNSW as a Faiss index file (faiss::write_index into memory).
std::vector<char> serialize_meta(const faiss::IndexHNSWFlat& idx);
/// Reads a meta-HNSW written by serialize_meta. The bytes are checked against that layout
/// first (type tags, metric, every length inside the buffer, the HNSW tables' sizes), so Faiss
/// never sizes a vector from a corrupted length; Faiss errors (and an index of another type)
/// are rethrown as std::runtime_error naming `what`.
std::unique_ptr<faiss::IndexHNSWFlat> deserialize_meta(const char* data, size_t len, const std::string& what);

/// The Faiss metric of a MetricCode byte (0 L2, 1 inner product); std::runtime_error otherwise.
faiss::MetricType faiss_metric(uint8_t metric_code);

}  // namespace dmhnsw::dhnsw
