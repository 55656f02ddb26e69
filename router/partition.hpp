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
};

struct Clustering {
  uint32_t k = 0, dim = 0;
  std::vector<float> centroids;       // k x dim, row-major
  std::vector<uint32_t> assignment;   // cluster of each input point
  std::vector<uint64_t> sizes;        // points per cluster
  double imbalance() const;           // largest / smallest size
};

/// Balanced k-means of n points (row-major, n x dim) into k clusters of near-equal size;
/// for small or odd k, clusters into 2k, 4k, ... until balanced and merges the closest
/// pairs back to k. Deterministic: the same input and seed give the same centroids.
Clustering balanced_kmeans(const float* data, size_t n, uint32_t dim, uint32_t k, Metric metric,
                           const BalancedKMeansOptions& opts = {});

/// Ranks computenodes for a query: computenode i owns centroid i.
class Oracle {
 public:
  Oracle() = default;
  Oracle(std::vector<float> centroids, uint32_t k, uint32_t dim, Metric metric);
  uint32_t k() const { return k_; }
  /// Fills `order` (size k) with computenode ids, best fitting (nearest centroid) first.
  void rank(const float* q, uint32_t* order) const;
  uint32_t best(const float* q) const;

 private:
  uint32_t k_ = 0, dim_ = 0;
  std::vector<float> centroids_;
  Metric metric_ = Metric::L2;
  std::optional<DistanceComputer> dist_;  // the metric's kernel, chosen once
};

}  // namespace dmhnsw::router
