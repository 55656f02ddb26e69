#pragma once
// SHINE logical index partitioning (paper section 6.2): balanced k-means over a sample of
// the graph's nodes, one cluster per computenode, and the oracle that ranks computenodes
// for a query by the distance of the query to their centroids.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/distance.hpp"

namespace dmhnsw::router {

struct BalancedKMeansOptions {
  uint32_t iterations = 25;
  uint64_t seed = 1;
  double max_imbalance = 1.2;  // accepted largest/smallest cluster size
  bool balance_oracle = true;  // compute Clustering::offsets (else they are zero)
};

struct Clustering {
  uint32_t k = 0, dim = 0;
  std::vector<float> centroids;       // k x dim, row-major
  std::vector<uint32_t> assignment;   // cluster of each input point
  std::vector<uint64_t> sizes;        // points per cluster
  /// Per-cluster offsets for the oracle (balance_offsets over the same points), k values.
  std::vector<float> offsets;
  /// Largest / mean of the points' counts when each goes to its nearest centroid, without
  /// and with the offsets: how evenly the oracle would split queries distributed like them.
  double oracle_load_nearest = 1.0, oracle_load_balanced = 1.0;
  double imbalance() const;           // largest / smallest size
};

/// Balanced k-means of n points (row-major, n x dim) into k clusters of near-equal size;
/// for small or odd k, clusters into 2k, 4k, ... until balanced and merges the closest
/// pairs back to k. Deterministic: the same input and seed give the same centroids.
Clustering balanced_kmeans(const float* data, size_t n, uint32_t dim, uint32_t k, Metric metric,
                           const BalancedKMeansOptions& opts = {});

/// Offsets o_c such that sending every point to argmin_c distance(point, centroid c) + o_c
/// splits the n points near-evenly (largest count <= ceil(tolerance x n / k), or the most even
/// split found in `max_rounds` rounds of raising the offsets of crowded clusters).
/// Balanced k-means balances its clusters by a constrained assignment, but a query has only
/// the centroids: plain nearest-centroid routing then loads computenodes unevenly (1.3-1.7x
/// on text embeddings), and adaptive routing must send the surplus to worse-fitting
/// computenodes. Deterministic (a fixed order of float operations). Returns k values.
/// `load_before` / `load_after` (optional) receive largest/mean count without/with offsets.
std::vector<float> balance_offsets(const float* data, size_t n, uint32_t dim, const float* centroids, uint32_t k,
                                   Metric metric, double tolerance = 1.02, uint32_t max_rounds = 2000,
                                   double* load_before = nullptr, double* load_after = nullptr);

/// Ranks computenodes for a query: computenode i owns centroid i. With offsets, the score of
/// computenode i is distance(query, centroid i) + offsets[i] (balance_offsets).
class Oracle {
 public:
  Oracle() = default;
  Oracle(std::vector<float> centroids, uint32_t k, uint32_t dim, Metric metric, std::vector<float> offsets = {});
  uint32_t k() const { return k_; }
  /// Fills `order` (size k) with computenode ids, best fitting (nearest centroid) first, and,
  /// when `scores` is not null, scores[i] (size k) with distance(q, centroid i) + offsets[i]
  /// (smaller fits better).
  void rank(const float* q, uint32_t* order, float* scores = nullptr) const;
  uint32_t best(const float* q) const;

 private:
  uint32_t k_ = 0, dim_ = 0;
  std::vector<float> centroids_;
  std::vector<float> offsets_;  // k values (zeros without offsets)
  Metric metric_ = Metric::L2;
  std::optional<DistanceComputer> dist_;  // the metric's kernel, chosen once
};

}  // namespace dmhnsw::router
