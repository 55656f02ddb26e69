#pragma once
// d-HNSW's index balancer (paper section 4.1.1, complexity in the appendix "Phase 1/2", results
// in section 5.8 / Figure 17): the data set is split into k partitions of (almost) equal size,
// each later indexed by its own sub-HNSW, the centroids indexed by the meta-HNSW.
//
//   capacity_kmeans: approximate k-means++ initialisation, then capacity-constrained k-means
//                    (no partition holds more than ceil(slack * n / k) vectors);
//   plain_kmeans:    the same initialisation, then plain Lloyd iterations (Figure 17's k-means).
//
// This is a different algorithm from SHINE's balanced k-means (router/partition.hpp).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/distance.hpp"

namespace dmhnsw::router {

struct CapacityKMeansOptions {
  uint32_t iterations = 10;       // assignment + update rounds after the initialisation
  uint32_t top_l = 4;             // candidate centroids kept per vector in the assignment
  uint32_t init_candidates = 8;   // approximate k-means++: sampled candidates per new centre
  double capacity_slack = 1.0;    // capacity = ceil(slack * n / k); 1.0 = ceil(n / k)
  uint64_t seed = 1;
  size_t max_train = 0;  // > 0: centroids trained on a seeded sample of this many vectors;
                         // every vector is assigned at the end
};

struct Partitioning {
  uint32_t k = 0, dim = 0;
  std::vector<float> centroids;      // k x dim, row-major; the mean of each partition's vectors
  std::vector<uint32_t> assignment;  // partition of each vector
  std::vector<uint64_t> sizes;       // vectors per partition
  uint64_t capacity = 0;  // max vectors per partition the assignment enforced (0: plain k-means)
  double inertia = 0;     // sum of distances vector -> its centroid (metric's distance:
                          // squared L2, or 1 - <x, c> for IP)
  double max_over_mean() const;  // largest size / mean size (0 when empty)
  double min_over_mean() const;  // smallest size / mean size (0 when empty)
};

/// d-HNSW's index balancer over n vectors (row-major, n x dim).
///
/// Initialisation (approximate k-means++): the first centre is a uniformly drawn vector; for
/// each next centre, `init_candidates` vectors are sampled with probability proportional to
/// their distance to the nearest centre chosen so far (squared L2, or max(0, 1 - <x, c>) for
/// IP) and the candidate farthest from the chosen centres is kept. Seeding draws from a seeded
/// pool of at most max(16384, 32 k) of the training vectors (each new centre costs one pass
/// over the pool).
///
/// Then `iterations` rounds (at least one; stops early when the assignment no longer changes)
/// of capacity-constrained k-means: every vector keeps its `top_l` nearest centroids; one global
/// priority queue, smallest distance first (ties: smaller vector id), places each vector into
/// its nearest candidate that still has room; a vector whose candidates are all full goes to
/// its nearest centroid (ties: smaller id) that still has room. The capacity is
/// ceil(capacity_slack * n / k) (at least ceil(n / k)); no partition is left empty (n >= k).
/// Then each centroid becomes the mean of its partition (also for IP).
///
/// With max_train > 0 (and < n), the rounds run on a seeded sample of max(max_train, k)
/// vectors (capacity from the sample size); then every vector is assigned once against the
/// trained centroids with the capacity from n, and the centroids become the partition means.
///
/// Deterministic: the same input, options and seed give bitwise identical output, whatever
/// the number of OpenMP threads.
///
/// Throws std::invalid_argument naming the problem: k == 0 or k > n ("partitions"), dim == 0,
/// null data, top_l == 0, init_candidates == 0, capacity_slack < 1 or not finite.
Partitioning capacity_kmeans(const float* data, size_t n, uint32_t dim, uint32_t k, Metric metric,
                             const CapacityKMeansOptions& opts = {});

/// The comparison of Figure 17: the same initialisation (and sampling), then plain Lloyd
/// iterations (every vector to its nearest centroid, no capacity; `top_l` and
/// `capacity_slack` are ignored). A partition that becomes empty is re-seeded with the vector
/// farthest from its centroid (ties: smaller id) taken from a partition of two or more, so no
/// partition is empty either. capacity is 0. Same determinism and errors.
Partitioning plain_kmeans(const float* data, size_t n, uint32_t dim, uint32_t k, Metric metric,
                          const CapacityKMeansOptions& opts = {});

}  // namespace dmhnsw::router
