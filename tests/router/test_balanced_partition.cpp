// d-HNSW's index balancer (router/balanced_partition.hpp): capacity-constrained k-means keeps
// every partition within ceil(n/k) on skewed data where plain k-means does not (Figure 17),
// is deterministic whatever the thread count, clusters well (inertia, blob recovery), rejects
// bad arguments, and works with the inner-product metric.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "common/distance.hpp"
#include "router/balanced_partition.hpp"

using namespace dmhnsw;
using namespace dmhnsw::router;

namespace {

/// Gaussian mixture: component j has weights[j] * n points around a centre drawn from
/// N(0, spread^2) per coordinate, unit noise; points shuffled. `label` (if given) receives each
/// point's component.
std::vector<float> mixture(size_t n, uint32_t dim, const std::vector<double>& weights,
                           float spread, uint64_t seed, std::vector<uint32_t>* label = nullptr) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<size_t> count(weights.size());
  size_t assigned = 0;
  for (size_t j = 0; j < weights.size(); ++j) {
    count[j] = static_cast<size_t>(static_cast<double>(n) * weights[j] / total);
    assigned += count[j];
  }
  count[0] += n - assigned;  // rounding remainder to the first component
  std::vector<uint32_t> comp;
  comp.reserve(n);
  for (size_t j = 0; j < count.size(); ++j) comp.insert(comp.end(), count[j], static_cast<uint32_t>(j));
  std::shuffle(comp.begin(), comp.end(), rng);
  std::vector<float> centres(weights.size() * dim);
  for (auto& v : centres) v = spread * normal(rng);
  std::vector<float> data(n * dim);
  for (size_t i = 0; i < n; ++i)
    for (uint32_t d = 0; d < dim; ++d)
      data[i * dim + d] = centres[size_t{comp[i]} * dim + d] + normal(rng);
  if (label) *label = std::move(comp);
  return data;
}

void normalise(std::vector<float>& data, uint32_t dim) {
  for (size_t i = 0; i < data.size() / dim; ++i) {
    double s = 0;
    for (uint32_t d = 0; d < dim; ++d) s += double{data[i * dim + d]} * data[i * dim + d];
    const float inv = static_cast<float>(1.0 / std::sqrt(s));
    for (uint32_t d = 0; d < dim; ++d) data[i * dim + d] *= inv;
  }
}

double distance(Metric metric, const float* a, const float* b, uint32_t dim) {
  double s = 0;
  for (uint32_t d = 0; d < dim; ++d) {
    if (metric == Metric::L2) {
      const double t = double{a[d]} - b[d];
      s += t * t;
    } else {
      s += double{a[d]} * b[d];
    }
  }
  return metric == Metric::L2 ? s : 1.0 - s;
}

/// Inertia of `assignment` with its partitions' means as centroids.
double inertia_of(const std::vector<float>& data, uint32_t dim, uint32_t k,
                  const std::vector<uint32_t>& assignment, Metric metric) {
  const size_t n = assignment.size();
  std::vector<double> sums(size_t{k} * dim, 0.0);
  std::vector<uint64_t> count(k, 0);
  for (size_t i = 0; i < n; ++i) {
    ++count[assignment[i]];
    for (uint32_t d = 0; d < dim; ++d) sums[size_t{assignment[i]} * dim + d] += data[i * dim + d];
  }
  std::vector<float> centroids(size_t{k} * dim);
  for (uint32_t c = 0; c < k; ++c)
    for (uint32_t d = 0; d < dim; ++d)
      centroids[size_t{c} * dim + d] =
          static_cast<float>(sums[size_t{c} * dim + d] / static_cast<double>(count[c]));
  double total = 0;
  for (size_t i = 0; i < n; ++i)
    total += distance(metric, &data[i * dim], &centroids[size_t{assignment[i]} * dim], dim);
  return total;
}

/// A random balanced assignment: a seeded permutation, point perm[i] -> i mod k.
std::vector<uint32_t> random_balanced(size_t n, uint32_t k, uint64_t seed) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t{0});
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<uint32_t> a(n);
  for (size_t i = 0; i < n; ++i) a[perm[i]] = static_cast<uint32_t>(i % k);
  return a;
}

/// Shapes, sizes consistent with the assignment and summing to n, no empty partition, every
/// centroid the mean of its partition, inertia matching the centroids.
void check_consistent(const Partitioning& p, const std::vector<float>& data, size_t n,
                      uint32_t dim, uint32_t k, Metric metric) {
  REQUIRE(p.k == k);
  REQUIRE(p.dim == dim);
  REQUIRE(p.centroids.size() == size_t{k} * dim);
  REQUIRE(p.assignment.size() == n);
  REQUIRE(p.sizes.size() == k);
  std::vector<uint64_t> count(k, 0);
  std::vector<double> sums(size_t{k} * dim, 0.0);
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(p.assignment[i] < k);
    ++count[p.assignment[i]];
    for (uint32_t d = 0; d < dim; ++d) sums[size_t{p.assignment[i]} * dim + d] += data[i * dim + d];
  }
  CHECK(count == p.sizes);
  CHECK(std::accumulate(p.sizes.begin(), p.sizes.end(), uint64_t{0}) == n);
  bool means_ok = true;
  for (uint32_t c = 0; c < k; ++c) {
    REQUIRE(count[c] > 0);
    for (uint32_t d = 0; d < dim; ++d) {
      const double mean = sums[size_t{c} * dim + d] / static_cast<double>(count[c]);
      if (std::fabs(p.centroids[size_t{c} * dim + d] - mean) > 1e-4 * (1.0 + std::fabs(mean)))
        means_ok = false;
    }
  }
  CHECK(means_ok);
  double inertia = 0;
  for (size_t i = 0; i < n; ++i)
    inertia += distance(metric, &data[i * dim], &p.centroids[size_t{p.assignment[i]} * dim], dim);
  CHECK(p.inertia == Approx(inertia).epsilon(1e-4).margin(1e-3));
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// The skewed mixture of tests 1, 2 and 4: 20,000 x 32, nine components from 30 % down to 2 %.
constexpr size_t kN = 20000;
constexpr uint32_t kDim = 32;
const std::vector<double> kSkew{0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.02};

const std::vector<float>& skewed() {
  static const std::vector<float> data = mixture(kN, kDim, kSkew, 4.0f, 11);
  return data;
}

/// Restores the OpenMP thread count on scope exit.
struct ThreadCount {
  int saved = omp_get_max_threads();
  ~ThreadCount() { omp_set_num_threads(saved); }
};

}  // namespace

TEST_CASE("capacity k-means keeps every partition within ceil(n/k) on skewed data",
          "[router][dhnsw-partition]") {
  const std::vector<float>& data = skewed();
  for (uint32_t k : {2u, 3u, 5u, 8u, 16u, 50u}) {
    INFO("k = " << k);
    const Partitioning p = capacity_kmeans(data.data(), kN, kDim, k, Metric::L2);
    check_consistent(p, data, kN, kDim, k, Metric::L2);
    CHECK(p.capacity == ceil_div(kN, k));
    for (uint64_t s : p.sizes) CHECK(s <= ceil_div(kN, k));
    CHECK(p.max_over_mean() <= 1.05);
    CHECK(p.min_over_mean() >= 0.85);
  }
}

TEST_CASE("capacity k-means honours capacity_slack", "[router][dhnsw-partition]") {
  const std::vector<float>& data = skewed();
  CapacityKMeansOptions o;
  o.capacity_slack = 1.05;
  for (uint32_t k : {8u, 16u}) {
    INFO("k = " << k);
    const Partitioning p = capacity_kmeans(data.data(), kN, kDim, k, Metric::L2, o);
    check_consistent(p, data, kN, kDim, k, Metric::L2);
    // 1.05 * 20000 / 8 = 2625 exactly (no floating-point round-up to 2626).
    CHECK(p.capacity == static_cast<uint64_t>(std::ceil(1.05 * kN / k - 1e-9)));
    for (uint64_t s : p.sizes) CHECK(s <= p.capacity);
    CHECK(p.max_over_mean() <= static_cast<double>(p.capacity) * k / kN + 1e-12);
    CHECK(p.max_over_mean() <= 1.051);
  }
}

TEST_CASE("plain k-means is visibly unbalanced on the same skewed data (Figure 17)",
          "[router][dhnsw-partition]") {
  const std::vector<float>& data = skewed();
  for (uint32_t k : {5u, 8u, 16u}) {
    INFO("k = " << k);
    const Partitioning plain = plain_kmeans(data.data(), kN, kDim, k, Metric::L2);
    const Partitioning cap = capacity_kmeans(data.data(), kN, kDim, k, Metric::L2);
    check_consistent(plain, data, kN, kDim, k, Metric::L2);
    CHECK(plain.capacity == 0);
    INFO("plain max/mean " << plain.max_over_mean() << ", capacity " << cap.max_over_mean());
    CHECK(plain.max_over_mean() >= 1.5);
    CHECK(plain.max_over_mean() > cap.max_over_mean() + 0.4);
  }
}

TEST_CASE("capacity and plain k-means are deterministic, whatever the thread count",
          "[router][dhnsw-partition]") {
  const ThreadCount restore;
  // Large enough that the distance, seeding and mean loops run in parallel.
  const size_t n = 140000;
  const uint32_t dim = 32;
  const std::vector<float> data = mixture(n, dim, kSkew, 4.0f, 23);
  CapacityKMeansOptions o;
  o.seed = 77;
  o.iterations = 4;
  for (bool capacity : {true, false}) {
    INFO((capacity ? "capacity" : "plain"));
    auto run = [&](int threads, const CapacityKMeansOptions& opts) {
      omp_set_num_threads(threads);
      return capacity ? capacity_kmeans(data.data(), n, dim, 16, Metric::L2, opts)
                      : plain_kmeans(data.data(), n, dim, 16, Metric::L2, opts);
    };
    const Partitioning a = run(2, o);
    const Partitioning b = run(2, o);
    const Partitioning c = run(1, o);
    const Partitioning d = run(3, o);
    for (const Partitioning* other : {&b, &c, &d}) {
      CHECK(other->centroids == a.centroids);  // bitwise (float ==)
      CHECK(other->assignment == a.assignment);
      CHECK(other->sizes == a.sizes);
      CHECK(other->inertia == a.inertia);
    }
    // A different seed gives a different result.
    CapacityKMeansOptions o2 = o;
    o2.seed = 78;
    CHECK(run(2, o2).centroids != a.centroids);
    // Trained on a sample: deterministic too.
    CapacityKMeansOptions s = o;
    s.max_train = 20000;
    const Partitioning e = run(1, s);
    const Partitioning f = run(2, s);
    CHECK(e.centroids == f.centroids);
    CHECK(e.assignment == f.assignment);
  }
}

TEST_CASE("capacity k-means clusters well: low inertia, recovers equal well-separated blobs",
          "[router][dhnsw-partition]") {
  SECTION("inertia well below a random balanced assignment") {
    const std::vector<float>& data = skewed();
    for (uint32_t k : {5u, 16u, 50u}) {
      INFO("k = " << k);
      const Partitioning p = capacity_kmeans(data.data(), kN, kDim, k, Metric::L2);
      const double random = inertia_of(data, kDim, k, random_balanced(kN, k, 5), Metric::L2);
      INFO("capacity " << p.inertia << ", random " << random);
      CHECK(p.inertia < 0.7 * random);
    }
  }
  SECTION("k = number of blobs: each partition is one blob") {
    const uint32_t blobs = 12, dim = 16;
    const size_t n = blobs * 500;
    std::vector<uint32_t> label;
    const std::vector<float> data =
        mixture(n, dim, std::vector<double>(blobs, 1.0), 10.0f, 3, &label);
    const Partitioning p = capacity_kmeans(data.data(), n, dim, blobs, Metric::L2);
    check_consistent(p, data, n, dim, blobs, Metric::L2);
    std::vector<uint32_t> partition_of_blob(blobs, blobs);
    for (size_t i = 0; i < n; ++i) {
      if (partition_of_blob[label[i]] == blobs) partition_of_blob[label[i]] = p.assignment[i];
      REQUIRE(p.assignment[i] == partition_of_blob[label[i]]);
    }
    CHECK(std::set<uint32_t>(partition_of_blob.begin(), partition_of_blob.end()).size() == blobs);
    // Plain k-means finds the same blobs here.
    const Partitioning q = plain_kmeans(data.data(), n, dim, blobs, Metric::L2);
    for (uint64_t s : q.sizes) CHECK(s == 500);
  }
}

TEST_CASE("capacity k-means edge cases: k = 1, k = n, duplicates, sampled training",
          "[router][dhnsw-partition]") {
  const std::vector<float>& data = skewed();
  SECTION("k = 1") {
    const Partitioning p = capacity_kmeans(data.data(), kN, kDim, 1, Metric::L2);
    check_consistent(p, data, kN, kDim, 1, Metric::L2);
    CHECK(p.sizes[0] == kN);
  }
  SECTION("k = n") {
    const size_t n = 300;
    const std::vector<float> small(data.begin(), data.begin() + n * kDim);
    const Partitioning p = capacity_kmeans(small.data(), n, kDim, static_cast<uint32_t>(n), Metric::L2);
    check_consistent(p, small, n, kDim, static_cast<uint32_t>(n), Metric::L2);
    for (uint64_t s : p.sizes) CHECK(s == 1);
    CHECK(p.inertia == Approx(0.0).margin(1e-6));
  }
  SECTION("many duplicates: no partition is left empty, also by plain k-means") {
    // 90 copies of one vector and 10 distinct ones; k = 20 > distinct values.
    const size_t n = 100;
    const uint32_t k = 20;
    std::vector<float> dup(n * kDim);
    for (size_t i = 0; i < n; ++i)
      std::copy_n(data.begin() + static_cast<std::ptrdiff_t>((i < 90 ? 0 : i) * kDim), kDim,
                  dup.begin() + static_cast<std::ptrdiff_t>(i * kDim));
    const Partitioning p = capacity_kmeans(dup.data(), n, kDim, k, Metric::L2);
    check_consistent(p, dup, n, kDim, k, Metric::L2);
    for (uint64_t s : p.sizes) CHECK(s <= 5);
    const Partitioning q = plain_kmeans(dup.data(), n, kDim, k, Metric::L2);
    check_consistent(q, dup, n, kDim, k, Metric::L2);  // requires every partition non-empty
  }
  SECTION("max_train: trained on a sample, every vector assigned within capacity") {
    CapacityKMeansOptions o;
    o.max_train = 3000;
    const Partitioning p = capacity_kmeans(data.data(), kN, kDim, 16, Metric::L2, o);
    check_consistent(p, data, kN, kDim, 16, Metric::L2);
    CHECK(p.capacity == ceil_div(kN, 16));
    for (uint64_t s : p.sizes) CHECK(s <= p.capacity);
    const Partitioning full = capacity_kmeans(data.data(), kN, kDim, 16, Metric::L2);
    INFO("sampled " << p.inertia << ", full " << full.inertia);
    CHECK(p.inertia < 1.2 * full.inertia);
    // max_train >= n: the same as no sampling.
    o.max_train = kN;
    CHECK(capacity_kmeans(data.data(), kN, kDim, 16, Metric::L2, o).assignment == full.assignment);
  }
  SECTION("iterations = 0 still assigns every vector") {
    CapacityKMeansOptions o;
    o.iterations = 0;
    const Partitioning p = capacity_kmeans(data.data(), kN, kDim, 8, Metric::L2, o);
    check_consistent(p, data, kN, kDim, 8, Metric::L2);
    for (uint64_t s : p.sizes) CHECK(s <= p.capacity);
  }
}

TEST_CASE("capacity and plain k-means reject bad arguments, naming the problem",
          "[router][dhnsw-partition]") {
  const std::vector<float> data(100 * 4, 1.0f);
  using Catch::Matchers::Contains;
  for (bool capacity : {true, false}) {
    auto run = [&](const float* d, size_t n, uint32_t dim, uint32_t k,
                   const CapacityKMeansOptions& o = {}) {
      return capacity ? capacity_kmeans(d, n, dim, k, Metric::L2, o)
                      : plain_kmeans(d, n, dim, k, Metric::L2, o);
    };
    CHECK_THROWS_WITH(run(data.data(), 100, 4, 0), Contains("partitions"));
    CHECK_THROWS_WITH(run(data.data(), 100, 4, 101), Contains("partitions") && Contains("n=100"));
    CHECK_THROWS_AS(run(data.data(), 100, 4, 101), std::invalid_argument);
    CHECK_THROWS_WITH(run(data.data(), 100, 0, 4), Contains("dim"));
    CHECK_THROWS_WITH(run(nullptr, 100, 4, 4), Contains("null"));
    CHECK_THROWS_WITH(run(data.data(), 0, 4, 1), Contains("partitions"));
    CapacityKMeansOptions o;
    o.init_candidates = 0;
    CHECK_THROWS_WITH(run(data.data(), 100, 4, 4, o), Contains("init_candidates"));
  }
  CapacityKMeansOptions o;
  o.top_l = 0;
  CHECK_THROWS_WITH(capacity_kmeans(data.data(), 100, 4, 4, Metric::L2, o), Contains("top_l"));
  o = {};
  o.capacity_slack = 0.9;
  CHECK_THROWS_WITH(capacity_kmeans(data.data(), 100, 4, 4, Metric::L2, o),
                    Contains("capacity_slack"));
  o.capacity_slack = std::nan("");
  CHECK_THROWS_WITH(capacity_kmeans(data.data(), 100, 4, 4, Metric::L2, o),
                    Contains("capacity_slack"));
  // Options capacity_kmeans alone uses do not bother plain k-means.
  CHECK_NOTHROW(plain_kmeans(data.data(), 100, 4, 4, Metric::L2, o));
}

TEST_CASE("capacity k-means with the inner-product metric on normalised vectors",
          "[router][dhnsw-partition]") {
  std::vector<float> data = mixture(kN, kDim, kSkew, 4.0f, 31);
  normalise(data, kDim);
  for (uint32_t k : {3u, 8u, 20u}) {
    INFO("k = " << k);
    const Partitioning p = capacity_kmeans(data.data(), kN, kDim, k, Metric::IP);
    check_consistent(p, data, kN, kDim, k, Metric::IP);
    for (uint64_t s : p.sizes) CHECK(s <= ceil_div(kN, k));
    CHECK(p.max_over_mean() <= 1.05);
    const double random = inertia_of(data, kDim, k, random_balanced(kN, k, 9), Metric::IP);
    INFO("capacity " << p.inertia << ", random " << random);
    CHECK(p.inertia < 0.7 * random);
    const Partitioning q = plain_kmeans(data.data(), kN, kDim, k, Metric::IP);
    check_consistent(q, data, kN, kDim, k, Metric::IP);
    CHECK(q.max_over_mean() > p.max_over_mean());
  }
}
