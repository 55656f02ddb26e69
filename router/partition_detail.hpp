#pragma once
// Building blocks of balanced_kmeans (router/partition.hpp), exposed for unit tests only.
// Not part of the router's public interface.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dmhnsw::router::detail {

/// Capacity-constrained assignment of n points to k clusters (1 <= k <= n) from the n x k
/// row-major distance matrix `dist` (smaller = closer). Sizes come out exactly
/// floor(n/k) or ceil(n/k) (n mod k clusters get the larger size), so no cluster exceeds
/// ceil(n/k). Greedy by increasing distance through one priority queue over each point's
/// `candidates` nearest clusters (0: min(k, 16)); a point whose candidates are all full goes
/// to its nearest non-full cluster. Ties: smaller point id, then smaller cluster id.
/// Deterministic. Returns the cluster of each point.
std::vector<uint32_t> balanced_assign(const float* dist, size_t n, uint32_t k,
                                      uint32_t candidates = 0);

/// Merges clusters pairwise until k_target remain (paper section 6.2): in rounds, the
/// pairwise closest clusters (squared L2 between centroids; ties by ids) are merged, each
/// cluster at most once per round; a merged centroid is the size-weighted mean. `centroids`
/// (count x dim) and `sizes` (count) are replaced by the merged ones (k_target rows, ordered
/// by the smallest original cluster id of each group). Returns the new id of every original
/// cluster. Requires 1 <= k_target <= count.
std::vector<uint32_t> merge_closest_pairs(std::vector<float>& centroids,
                                          std::vector<uint64_t>& sizes, uint32_t dim,
                                          uint32_t k_target);

/// FNV-1a (64 bit) over the bytes of `values` (used to compare centroids across processes).
uint64_t fnv1a64(const float* values, size_t count);

}  // namespace dmhnsw::router::detail
