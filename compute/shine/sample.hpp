#pragma once
// Reads what the logical partitioning needs from the remote graph: the index size and a
// sample of node vectors from the first level (from the top) holding >= min_nodes nodes.
// Scans each memnode's data area sequentially in large READs (nodes lie back to back,
// 64-byte aligned, each sized by its level).
#include <cstdint>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/shine/graph.hpp"

namespace dmhnsw::shine {

struct LevelSample {
  unsigned level = 0;                  // nodes whose level is >= this were sampled
  uint64_t nodes_at_level = 0;         // how many nodes reach that level
  uint64_t index_nodes = 0;            // nodes scanned
  uint64_t index_bytes = 0;            // bytes allocated in the memnodes' data areas
  std::vector<uint64_t> per_level;     // nodes whose top level is exactly l
  std::vector<float> vectors;          // sample x dim
  size_t size(uint32_t dim) const { return dim == 0 ? 0 : vectors.size() / dim; }
};

/// Two sequential scans (a level histogram, then the vectors); the sample is a deterministic
/// function of the index and `seed` (every computenode gets the same).
LevelSample sample_level(const Graph& g, fabric::Endpoint& ep, uint64_t min_nodes = 1000, uint64_t max_sample = 100000,
                         uint64_t seed = 1);

/// Bytes allocated in the memnodes' data areas (the index size, for --cache-ratio).
uint64_t index_bytes(const Graph& g, fabric::Endpoint& ep);

}  // namespace dmhnsw::shine
