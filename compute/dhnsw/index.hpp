#pragma once
// What a computenode holds of a d-HNSW index (the metadata block of memnode 0 and the meta-HNSW)
// and what a search answers.
#include <faiss/IndexHNSW.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/codes.hpp"
#include "compute/dhnsw/layout.hpp"

namespace dmhnsw::dhnsw {

/// What a computenode holds of an index: the metadata block of memnode 0 (validated, its
/// checksum checked) and the deserialized meta-HNSW.
struct Index {
  MetaHeader header{};
  std::vector<SubDesc> subs;
  std::unique_ptr<faiss::IndexHNSWFlat> meta;
  /// The quantizer of the codes arrays (null: the index has none), from the metadata block.
  std::shared_ptr<const compute::Quantizer> codes;
  uint64_t metadata_bytes = 0;
  /// The sub-HNSWs' list ranges per level (Faiss's, for the header's M: sub_search.hpp).
  std::vector<int> list_ranges;
  bool inner_product() const { return header.metric == 1; }
};
/// Reads and checks the metadata block (region mode words dhnsw_word::kMetadataOffset/Size of
/// memnode 0) and every memnode's region header; throws naming the memnode and offset.
Index load_index(fabric::Cluster& c, fabric::Endpoint& ep);

/// One query's answer: (distance, global id), best first; at most k.
using Answer = std::vector<std::pair<float, int64_t>>;

}  // namespace dmhnsw::dhnsw
