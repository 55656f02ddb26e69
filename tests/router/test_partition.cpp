// Balanced k-means (router/partition.hpp): balance on synthetic and real data, determinism
// (also across processes, through tools/kmeans), the capacity-constrained assignment, the
// pairwise merge heuristic, and the oracle's ranking.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/test_util.hpp"
#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "router/partition.hpp"
#include "router/partition_detail.hpp"

using namespace dmhnsw;
using namespace dmhnsw::router;

namespace {

/// Gaussian blobs of the given sizes (dimension dim), centres far apart, points shuffled.
std::vector<float> blobs(const std::vector<size_t>& sizes, uint32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> points;
  for (size_t b = 0; b < sizes.size(); ++b) {
    std::vector<float> centre(dim);
    for (auto& v : centre) v = 10.0f * normal(rng);
    for (size_t i = 0; i < sizes[b]; ++i) {
      std::vector<float> p(dim);
      for (uint32_t d = 0; d < dim; ++d) p[d] = centre[d] + normal(rng);
      points.push_back(std::move(p));
    }
  }
  std::shuffle(points.begin(), points.end(), rng);
  std::vector<float> out;
  for (const auto& p : points) out.insert(out.end(), p.begin(), p.end());
  return out;
}

/// Checks the Clustering's internal consistency: shapes, sizes match the assignment, and every
/// centroid is the mean of its points.
void check_consistent(const Clustering& c, const float* data, size_t n, uint32_t dim, uint32_t k) {
  REQUIRE(c.k == k);
  REQUIRE(c.dim == dim);
  REQUIRE(c.centroids.size() == size_t{k} * dim);
  REQUIRE(c.assignment.size() == n);
  REQUIRE(c.sizes.size() == k);
  std::vector<uint64_t> count(k, 0);
  std::vector<double> sums(size_t{k} * dim, 0.0);
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(c.assignment[i] < k);
    ++count[c.assignment[i]];
    for (uint32_t d = 0; d < dim; ++d) sums[size_t{c.assignment[i]} * dim + d] += data[i * dim + d];
  }
  CHECK(count == c.sizes);
  CHECK(std::accumulate(c.sizes.begin(), c.sizes.end(), uint64_t{0}) == n);
  for (uint32_t j = 0; j < k; ++j) {
    REQUIRE(count[j] > 0);
    for (uint32_t d = 0; d < dim; ++d) {
      const double mean = sums[size_t{j} * dim + d] / static_cast<double>(count[j]);
      CHECK(c.centroids[size_t{j} * dim + d] ==
            Approx(mean).margin(1e-3 * (1.0 + std::fabs(mean))));
    }
  }
}

const std::string kBigann = test::kSharedData + "/bigann10k/bigann10k_base.bvecs";

FloatMatrix bigann(size_t rows) {
  LoadOptions o;
  o.max_rows = rows;
  return load_vectors_as_float(kBigann, o).copy();  // contiguous copy of the bvecs rows
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

TEST_CASE("balanced k-means balances gaussian blobs of unequal sizes, k = 2..8", "[router][kmeans]") {
  const uint32_t dim = 16;
  const std::vector<size_t> sizes{1500, 700, 350, 120, 30};
  const std::vector<float> data = blobs(sizes, dim, 7);
  const size_t n = data.size() / dim;
  for (uint32_t k = 2; k <= 8; ++k) {
    INFO("k = " << k);
    const Clustering c = balanced_kmeans(data.data(), n, dim, k, Metric::L2);
    check_consistent(c, data.data(), n, dim, k);
    CHECK(c.imbalance() <= 1.2);
    // Exact quotas: every size is floor(n/k) or ceil(n/k).
    for (uint64_t s : c.sizes) CHECK((s == n / k || s == (n + k - 1) / k));
  }
}

TEST_CASE("balanced k-means balances the first 5000 bigann vectors, k = 2..8", "[router][kmeans]") {
  const FloatMatrix m = bigann(5000);
  REQUIRE(m.n() == 5000);
  const uint32_t dim = static_cast<uint32_t>(m.d());
  for (uint32_t k = 2; k <= 8; ++k) {
    INFO("k = " << k);
    const Clustering c = balanced_kmeans(m.data(), m.n(), dim, k, Metric::L2);
    check_consistent(c, m.data(), m.n(), dim, k);
    CHECK(c.imbalance() <= 1.2);
  }
}

TEST_CASE("balanced k-means with the inner-product metric is balanced too", "[router][kmeans]") {
  const FloatMatrix m = bigann(3000);
  const uint32_t dim = static_cast<uint32_t>(m.d());
  for (uint32_t k : {3u, 5u}) {
    const Clustering c = balanced_kmeans(m.data(), m.n(), dim, k, Metric::IP);
    check_consistent(c, m.data(), m.n(), dim, k);
    CHECK(c.imbalance() <= 1.2);
  }
}

TEST_CASE("balanced k-means is deterministic by seed", "[router][kmeans]") {
  const FloatMatrix m = bigann(5000);
  const uint32_t dim = static_cast<uint32_t>(m.d());
  BalancedKMeansOptions a;
  a.seed = 42;
  const Clustering c1 = balanced_kmeans(m.data(), m.n(), dim, 5, Metric::L2, a);
  const Clustering c2 = balanced_kmeans(m.data(), m.n(), dim, 5, Metric::L2, a);
  REQUIRE(c1.centroids.size() == c2.centroids.size());
  // Bitwise identical centroids and identical assignments.
  CHECK(detail::fnv1a64(c1.centroids.data(), c1.centroids.size()) ==
        detail::fnv1a64(c2.centroids.data(), c2.centroids.size()));
  CHECK(std::equal(c1.centroids.begin(), c1.centroids.end(), c2.centroids.begin(),
                   [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }));
  CHECK(c1.assignment == c2.assignment);
  CHECK(c1.sizes == c2.sizes);
  CHECK(detail::fnv1a64(c1.offsets.data(), c1.offsets.size()) == detail::fnv1a64(c2.offsets.data(), c2.offsets.size()));

  BalancedKMeansOptions b = a;
  b.seed = 43;
  const Clustering c3 = balanced_kmeans(m.data(), m.n(), dim, 5, Metric::L2, b);
  CHECK(c3.centroids != c1.centroids);
  CHECK(c3.imbalance() <= 1.2);
}

TEST_CASE("balanced k-means gives identical centroids across processes (tools/kmeans)",
          "[router][kmeans][tools]") {
  test::TempDir tmp1, tmp2;
  const std::string args = "--data '" + kBigann + "' --k 5 --seed 9 --max-elements 4000";
  const test::RunResult r1 = test::run_tool(tmp1, "kmeans", args);
  const test::RunResult r2 = test::run_tool(tmp2, "kmeans", args);
  INFO("stdout: " << r1.out << "\nstderr: " << r1.err);
  REQUIRE(r1.code == 0);
  REQUIRE(r2.code == 0);
  CHECK(r1.out == r2.out);
  CHECK(r1.out.find("imbalance") != std::string::npos);

  // ... and the same centroids as this process computes.
  const FloatMatrix m = bigann(4000);
  BalancedKMeansOptions o;
  o.seed = 9;
  const Clustering c =
      balanced_kmeans(m.data(), m.n(), static_cast<uint32_t>(m.d()), 5, Metric::L2, o);
  const std::string hash = hex64(detail::fnv1a64(c.centroids.data(), c.centroids.size()));
  CHECK(r1.out.find("fnv1a64 " + hash) != std::string::npos);
  std::string sizes = "sizes     ";
  for (uint64_t s : c.sizes) sizes += " " + std::to_string(s);
  CHECK(r1.out.find(sizes + "\n") != std::string::npos);
  // The oracle's offsets too.
  CHECK(r1.out.find("offsets    fnv1a64 " + hex64(detail::fnv1a64(c.offsets.data(), c.offsets.size()))) !=
        std::string::npos);

  // A different seed prints a different hash.
  const test::RunResult r3 = test::run_tool(tmp1, "kmeans", "--data '" + kBigann +
                                                             "' --k 5 --seed 10 --max-elements 4000");
  REQUIRE(r3.code == 0);
  CHECK(r3.out.find("fnv1a64 " + hash) == std::string::npos);

  // Errors: k > n names both.
  const test::RunResult bad =
      test::run_tool(tmp2, "kmeans", "--data '" + kBigann + "' --k 11 --max-elements 10");
  CHECK(bad.code != 0);
  CHECK(bad.err.find("k=11") != std::string::npos);
  CHECK(bad.err.find("n=10") != std::string::npos);
}

TEST_CASE("balanced k-means edge cases: k = 1, k = n, k > n", "[router][kmeans]") {
  const uint32_t dim = 3;
  const std::vector<float> data{0, 0, 0, 1, 1, 1, 2, 2, 2, 10, 10, 10, 11, 11, 11};
  const size_t n = 5;

  const Clustering one = balanced_kmeans(data.data(), n, dim, 1, Metric::L2);
  check_consistent(one, data.data(), n, dim, 1);
  CHECK(one.sizes == std::vector<uint64_t>{5});
  for (float v : one.centroids) CHECK(v == Approx(4.8));
  CHECK(one.imbalance() == 1.0);

  const Clustering all = balanced_kmeans(data.data(), n, dim, 5, Metric::L2);
  check_consistent(all, data.data(), n, dim, 5);
  CHECK(all.sizes == std::vector<uint64_t>(5, 1));

  // Two natural groups of 3 and 2: k = 2 keeps them.
  const Clustering two = balanced_kmeans(data.data(), n, dim, 2, Metric::L2);
  check_consistent(two, data.data(), n, dim, 2);
  CHECK(two.assignment[0] == two.assignment[1]);
  CHECK(two.assignment[1] == two.assignment[2]);
  CHECK(two.assignment[3] == two.assignment[4]);
  CHECK(two.assignment[0] != two.assignment[3]);

  try {
    balanced_kmeans(data.data(), n, dim, 6, Metric::L2);
    FAIL("k > n accepted");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("k=6") != std::string::npos);
    CHECK(msg.find("n=5") != std::string::npos);
  }
  CHECK_THROWS_AS(balanced_kmeans(data.data(), n, dim, 0, Metric::L2), std::invalid_argument);
}

TEST_CASE("Clustering::imbalance is largest over smallest", "[router][kmeans]") {
  Clustering c;
  c.sizes = {10, 12, 8};
  CHECK(c.imbalance() == Approx(1.5));
  c.sizes = {4, 4};
  CHECK(c.imbalance() == 1.0);
  c.sizes = {3, 0};
  CHECK(std::isinf(c.imbalance()));
}

TEST_CASE("balanced_assign: exact quotas even when every point prefers one cluster", "[router][kmeans]") {
  // 10 points, 3 clusters; cluster 0 is nearest to every point, cluster 1 next.
  const size_t n = 10;
  const uint32_t k = 3;
  std::vector<float> dist(n * k);
  for (size_t i = 0; i < n; ++i) {
    dist[i * k + 0] = static_cast<float>(i);
    dist[i * k + 1] = 100.0f + static_cast<float>(i);
    dist[i * k + 2] = 200.0f;
  }
  const std::vector<uint32_t> a = detail::balanced_assign(dist.data(), n, k);
  // Greedy by increasing distance: points 0..3 fill cluster 0 (4 = ceil(10/3), one ceil slot),
  // points 4..6 go to cluster 1 (3 = floor), the rest to cluster 2.
  CHECK(a == std::vector<uint32_t>{0, 0, 0, 0, 1, 1, 1, 2, 2, 2});

  // With only one candidate per point, the overflow goes to the nearest non-full cluster.
  const std::vector<uint32_t> b = detail::balanced_assign(dist.data(), n, k, 1);
  CHECK(b == a);

  // Random distances: sizes are floor/ceil of n/k for many (n, k).
  std::mt19937_64 rng(3);
  for (size_t nn : {7u, 64u, 1001u}) {
    for (uint32_t kk : {2u, 3u, 5u, 7u}) {
      std::vector<float> d(nn * kk);
      for (auto& v : d) v = static_cast<float>(rng() % 1000);
      const auto out = detail::balanced_assign(d.data(), nn, kk, 2);
      std::vector<uint64_t> sizes(kk, 0);
      for (uint32_t c : out) ++sizes[c];
      uint64_t at_ceil = 0;
      for (uint64_t s : sizes) {
        CHECK((s == nn / kk || s == nn / kk + 1));
        at_ceil += (s == nn / kk + 1);
      }
      CHECK(at_ceil == nn % kk);
    }
  }
}

TEST_CASE("merge_closest_pairs merges the closest pairs once each, size-weighted", "[router][kmeans]") {
  // Four clusters on a line: {0, 1} and {10, 12} are the close pairs.
  std::vector<float> centroids{0, 10, 1, 12};
  std::vector<uint64_t> sizes{3, 2, 1, 2};
  const std::vector<uint32_t> map = detail::merge_closest_pairs(centroids, sizes, 1, 2);
  CHECK(map == std::vector<uint32_t>{0, 1, 0, 1});
  CHECK(sizes == std::vector<uint64_t>{4, 4});
  REQUIRE(centroids.size() == 2);
  CHECK(centroids[0] == Approx(0.25));  // (3*0 + 1*1) / 4
  CHECK(centroids[1] == Approx(11.0));  // (2*10 + 2*12) / 4

  // Eight clusters to two: two rounds, each cluster merged at most once per round.
  std::vector<float> c8{0, 1, 20, 21, 5, 6, 25, 26};
  std::vector<uint64_t> s8(8, 1);
  const std::vector<uint32_t> m8 = detail::merge_closest_pairs(c8, s8, 1, 2);
  CHECK(m8 == std::vector<uint32_t>{0, 0, 1, 1, 0, 0, 1, 1});
  CHECK(s8 == std::vector<uint64_t>{4, 4});
  CHECK(c8[0] == Approx(3.0));
  CHECK(c8[1] == Approx(23.0));

  // Odd count: 3 -> 2 merges one pair only.
  std::vector<float> c3{0, 100, 1};
  std::vector<uint64_t> s3{1, 1, 1};
  CHECK(detail::merge_closest_pairs(c3, s3, 1, 2) == std::vector<uint32_t>{0, 1, 0});
  CHECK(s3 == std::vector<uint64_t>{2, 1});
}

TEST_CASE("the oracle ranks computenodes by centroid distance", "[router][oracle]") {
  // Four centroids in 2-d: corners of a square.
  const std::vector<float> cents{0, 0, 10, 0, 0, 10, 10, 10};
  const Oracle o(cents, 4, 2, Metric::L2);
  CHECK(o.k() == 4);
  uint32_t order[4];

  const float q0[2] = {1, 2};  // near 0; then (0,10) at 64+1, (10,0) at 81+4, (10,10)
  o.rank(q0, order);
  CHECK(std::vector<uint32_t>(order, order + 4) == std::vector<uint32_t>{0, 2, 1, 3});
  CHECK(o.best(q0) == 0);

  const float q3[2] = {9, 8};  // near 3; then (10,0): 1+64, (0,10): 81+4, (0,0)
  o.rank(q3, order);
  CHECK(std::vector<uint32_t>(order, order + 4) == std::vector<uint32_t>{3, 1, 2, 0});
  CHECK(o.best(q3) == 3);

  const float q1[2] = {11, -1};
  o.rank(q1, order);
  CHECK(order[0] == 1);
  CHECK(o.best(q1) == 1);

  const float q2[2] = {-1, 12};
  o.rank(q2, order);
  CHECK(order[0] == 2);
  CHECK(o.best(q2) == 2);

  // Ties keep increasing ids: the centre is equally far from all four.
  const float centre[2] = {5, 5};
  o.rank(centre, order);
  CHECK(std::vector<uint32_t>(order, order + 4) == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(o.best(centre) == 0);
  // Equidistant from 0 and 1 only.
  const float mid01[2] = {5, 1};
  o.rank(mid01, order);
  CHECK(std::vector<uint32_t>(order, order + 4) == std::vector<uint32_t>{0, 1, 2, 3});
}

TEST_CASE("the oracle with the inner-product metric ranks by largest dot product", "[router][oracle]") {
  const std::vector<float> cents{1, 0, 0, 1, -1, 0};
  const Oracle o(cents, 3, 2, Metric::IP);
  uint32_t order[3];
  const float q[2] = {0.2f, 0.9f};
  o.rank(q, order);
  CHECK(std::vector<uint32_t>(order, order + 3) == std::vector<uint32_t>{1, 0, 2});
  CHECK(o.best(q) == 1);
  const float q2[2] = {-0.8f, 0.1f};
  o.rank(q2, order);
  CHECK(std::vector<uint32_t>(order, order + 3) == std::vector<uint32_t>{2, 1, 0});

  CHECK_THROWS_AS(Oracle(std::vector<float>{1, 2, 3}, 2, 2, Metric::L2), std::invalid_argument);
}

TEST_CASE("the oracle built from k-means sends each point mostly to its own cluster", "[router][oracle]") {
  const uint32_t dim = 8;
  const std::vector<float> data = blobs({400, 400, 400, 400}, dim, 11);
  const size_t n = data.size() / dim;
  const Clustering c = balanced_kmeans(data.data(), n, dim, 4, Metric::L2);
  const Oracle o(c.centroids, 4, dim, Metric::L2);
  size_t agree = 0;
  for (size_t i = 0; i < n; ++i) agree += o.best(data.data() + i * dim) == c.assignment[i];
  CHECK(agree == n);  // well separated, equal blobs: the clustering recovers them exactly
}

TEST_CASE("balanced k-means on degenerate inputs and every kernel class", "[router][kmeans]") {
  // All points identical: any balanced split is fine, sizes must still be exact.
  const std::vector<float> same(100 * 4, 0.5f);
  const Clustering c = balanced_kmeans(same.data(), 100, 4, 4, Metric::L2);
  CHECK(c.sizes == std::vector<uint64_t>{25, 25, 25, 25});
  for (float v : c.centroids) CHECK(v == 0.5f);

  // Dimensions of each distance-kernel class (scalar, x4, x16, x16 + tail, and the split
  // 16-wide head + 4-wide tail used for multiples of 4): four equal well-separated blobs are
  // recovered exactly, in agreement with the oracle's (unsplit) kernel.
  for (uint32_t dim : {1u, 3u, 8u, 20u, 32u, 100u, 132u}) {
    for (Metric metric : {Metric::L2, Metric::IP}) {
      INFO("dim " << dim << " metric " << to_string(metric));
      std::vector<float> data = blobs({300, 300, 300, 300}, dim, 100 + dim);
      const size_t n = data.size() / dim;
      if (metric == Metric::IP) {  // unit length, as for cosine data
        for (size_t i = 0; i < n; ++i) {
          double norm = 0;
          for (uint32_t d = 0; d < dim; ++d) norm += double{data[i * dim + d]} * data[i * dim + d];
          for (uint32_t d = 0; d < dim; ++d)
            data[i * dim + d] = static_cast<float>(data[i * dim + d] / std::sqrt(norm));
        }
      }
      const Clustering km = balanced_kmeans(data.data(), n, dim, 4, metric);
      check_consistent(km, data.data(), n, dim, 4);
      CHECK(km.imbalance() == 1.0);
      if (dim >= 8) {  // blobs in 1 and 3 dimensions may overlap
        const Oracle o(km.centroids, 4, dim, metric);
        size_t agree = 0;
        for (size_t i = 0; i < n; ++i) agree += o.best(data.data() + i * dim) == km.assignment[i];
        CHECK(agree == n);
      }
    }
  }
}

TEST_CASE("balance_offsets move the oracle's boundaries until the points split evenly", "[router][oracle]") {
  // Points spread evenly over [0, 1] on a line; centroids at 0 and 0.5. Nearest centroid
  // splits them at 0.25 (a quarter against three quarters); the offsets move the boundary.
  const size_t n = 1000;
  std::vector<float> pts(n);
  for (size_t i = 0; i < n; ++i) pts[i] = (static_cast<float>(i) + 0.5f) / n;
  const std::vector<float> cents{0.0f, 0.5f};
  double before = 0, after = 0;
  const std::vector<float> off = balance_offsets(pts.data(), n, 1, cents.data(), 2, Metric::L2, 1.02, 2000, &before, &after);
  REQUIRE(off.size() == 2);
  CHECK(before == Approx(1.5).margin(0.01));
  CHECK(after <= 1.02);
  const Oracle plain(cents, 2, 1, Metric::L2);
  const Oracle balanced(cents, 2, 1, Metric::L2, off);
  size_t to0 = 0, plain_to0 = 0;
  for (size_t i = 0; i < n; ++i) {
    to0 += balanced.best(&pts[i]) == 0;
    plain_to0 += plain.best(&pts[i]) == 0;
  }
  CHECK(plain_to0 == 250);
  CHECK(to0 >= 490);
  CHECK(to0 <= 510);
  uint32_t order[2];
  const float q = 0.3f;  // nearer to 0.5, but inside centroid 0's share once balanced
  plain.rank(&q, order);
  CHECK(order[0] == 1);
  balanced.rank(&q, order);
  CHECK(order[0] == 0);
  CHECK(order[1] == 1);
  float sc[2];
  balanced.rank(&q, order, sc);  // scores: squared distance plus offset
  CHECK(order[0] == 0);
  CHECK(sc[0] == Approx(0.09f + off[0]));
  CHECK(sc[1] == Approx(0.04f + off[1]));
  // Deterministic.
  CHECK(balance_offsets(pts.data(), n, 1, cents.data(), 2, Metric::L2) == off);
  // Already even: no offsets at all.
  const std::vector<float> sym{0.25f, 0.75f};
  const std::vector<float> none = balance_offsets(pts.data(), n, 1, sym.data(), 2, Metric::L2, 1.02, 2000, &before, &after);
  CHECK(none == std::vector<float>{0.0f, 0.0f});
  CHECK(before == Approx(1.0));
  // Bad input names what is wrong; an oracle with the wrong number of offsets is refused.
  CHECK_THROWS_WITH(balance_offsets(pts.data(), n, 1, cents.data(), 0, Metric::L2), Catch::Contains("k=0"));
  CHECK_THROWS_WITH(Oracle(cents, 2, 1, Metric::L2, std::vector<float>{1.0f}), Catch::Contains("offsets"));
}

TEST_CASE("balanced k-means' oracle splits bigann evenly where nearest-centroid does not", "[router][oracle]") {
  const FloatMatrix m = bigann(5000);
  const uint32_t dim = static_cast<uint32_t>(m.d());
  for (uint32_t k : {3u, 4u, 5u}) {
    INFO("k = " << k);
    const Clustering c = balanced_kmeans(m.data(), m.n(), dim, k, Metric::L2);
    const Oracle o(c.centroids, k, dim, Metric::L2, c.offsets);
    std::vector<size_t> load(k);
    for (size_t i = 0; i < m.n(); ++i) ++load[o.best(m.data() + i * dim)];
    const double mean = static_cast<double>(m.n()) / k;
    const double largest = static_cast<double>(*std::max_element(load.begin(), load.end()));
    CHECK(largest / mean == Approx(c.oracle_load_balanced));
    CHECK(c.oracle_load_balanced <= 1.02);
    CHECK(c.oracle_load_nearest > 1.02);  // the uneven split the offsets are there for
    CHECK(c.oracle_load_balanced <= c.oracle_load_nearest);
    BalancedKMeansOptions plain;
    plain.balance_oracle = false;
    const Clustering p = balanced_kmeans(m.data(), m.n(), dim, k, Metric::L2, plain);
    CHECK(p.offsets == std::vector<float>(k, 0.0f));
    CHECK(p.centroids == c.centroids);
    CHECK(p.oracle_load_nearest == c.oracle_load_nearest);
  }
}
