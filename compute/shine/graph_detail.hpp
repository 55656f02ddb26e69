#pragma once
// Helpers shared by shine's units (the datapath in graph.cpp, graph_insert.cpp, graph_reuse.cpp,
// and format.cpp): not part of graph.hpp's interface.
#include <cstddef>

#include "common/region.hpp"
#include "compute/shine/graph.hpp"

namespace dmhnsw::shine::graph_detail {

/// Mode word `w` of memnode 0's region header (entry point, counts, logs: compute/shine/layout.hpp).
inline RemotePtr word_ptr(size_t w) { return RemotePtr(0, mode_word_offset(w)); }
struct ByDistLess {
  bool operator()(const Neighbor& a, const Neighbor& b) const { return a.dist < b.dist; }
};
struct ByDistGreater {
  bool operator()(const Neighbor& a, const Neighbor& b) const { return a.dist > b.dist; }
};

}  // namespace dmhnsw::shine::graph_detail
