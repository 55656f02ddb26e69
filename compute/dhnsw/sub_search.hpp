#pragma once
// The search inside one sub-HNSW (paper section 4.3): a greedy descent through the upper
// levels, then a beam of efSearch at level 0, over the sub-HNSW's arrays wherever they lie:
// those of a deserialized SubIndex, or its block in a region the provider maps (cxl), read in
// place. It is hnswlib's algorithm (a result heap of efSearch, stop once the nearest candidate
// is farther than the efSearch-th result; deleted vectors are expanded and never returned) with
// the SIMD kernel of common/distance.hpp, on plain arrays: Faiss's HNSW::search calls a
// virtual distance per neighbour and pops its candidates in O(efSearch). A search over codes
// (SubIndex::coded) still goes through Faiss, which compares codes through the quantizer.
//
// Every index read from the arrays is checked against their bounds before it is used: a
// mapped block may be changed by an in-place insert while it is searched (the caller checks
// the sub's seqlock version after the search and discards what it found if it moved).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "common/distance.hpp"
#include "compute/dhnsw/layout.hpp"
#include "compute/dhnsw/subindex.hpp"

namespace dmhnsw::dhnsw {

/// The arrays of one sub-HNSW, in Faiss's layout (compute/dhnsw/layout.hpp).
struct SubView {
  uint64_t count = 0;
  int32_t entry_point = -1;
  int32_t max_level = -1;
  const uint64_t* offsets = nullptr;  // count + 1 entries
  const int32_t* neighbors = nullptr;
  uint64_t neighbor_entries = 0;
  const int64_t* labels = nullptr;  // count; negative: deleted (kDeletedLabel); null: vector i is label i
  const float* vectors = nullptr;   // count x dim
  std::span<const int> cum;         // Faiss HNSW::cum_nneighbor_per_level: list ranges per level
};

/// The arrays of an uncoded deserialized sub-HNSW (they stay owned by `s`).
SubView view_of(const SubIndex& s);
/// The arrays of a Faiss IndexHNSWFlat with flat storage, its vector i labelled labels[i], or i
/// with null `labels` (the meta-HNSW: vector i is partition i's centroid); an empty view for
/// other storage.
SubView view_of(const faiss::IndexHNSWFlat& idx, const int64_t* labels);

/// The list ranges per level of the sub-HNSWs of an index with HNSW M `m` (Faiss's levels).
std::vector<int> neighbors_per_level(uint32_t m);

/// Sub `d` searched where it lies: `block` is its mapped block (d.block_bytes bytes). Only a sub
/// without overflow records and codes, whose descriptor's sizes fit its block, has one
/// (nullopt otherwise: it is fetched and deserialized).
std::optional<SubView> mapped_view(const char* block, const SubDesc& d, const MetaHeader& h, std::span<const int> cum);

/// One searching thread's scratch (visited tags, the two heaps), reused across searches.
class SubSearcher {
 public:
  /// Up to k nearest live vectors of `q` in `v`, nearest first, into out[0..k): (distance in
  /// Faiss's convention: squared L2, or the inner product for `ip`, and the label). efSearch is
  /// max(ef, k). Returns how many were found.
  size_t search(const SubView& v, const DistanceComputer& dc, bool ip, const float* q, uint32_t k, uint32_t ef,
                std::pair<float, int64_t>* out);
  /// Distances computed by this searcher so far.
  uint64_t distances() const { return distances_; }

 private:
  void new_query(uint64_t count);
  std::vector<uint16_t> tags_;
  uint16_t tag_ = 0;
  std::vector<std::pair<float, uint32_t>> top_, cand_;  // max-heap of results, max-heap of -candidates
  std::vector<uint32_t> fresh_;                         // a hop's unvisited neighbours
  uint64_t distances_ = 0;
};

}  // namespace dmhnsw::dhnsw
