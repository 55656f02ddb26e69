// Balanced k-means (SHINE logical index partitioning, paper section 6.2) and the oracle.
// One unit: balance_offsets and the oracle use the same distance and centroid helpers.
//
// balanced_kmeans:
//   1. k-means++ initialisation (deterministic: std::mt19937_64 seeded with opts.seed and our
//      own uniform helpers, so the result does not depend on the standard library's
//      distributions);
//   2. Lloyd iterations whose assignment step is capacity constrained: cluster sizes are
//      exactly floor(n/k) or ceil(n/k) (detail::balanced_assign); centroids are the means of
//      their points; stop when the assignment no longer changes;
//   3. the paper's heuristic for small/odd k: if the result is still imbalanced beyond
//      opts.max_imbalance (only possible when its sizes are not already floor/ceil optimal,
//      i.e. never with the exact quotas of step 2, but kept as a safety net), cluster into 2k,
//      4k, ... clusters and merge the closest pairs back to k; the best balanced result wins.
//
// Determinism: every floating-point reduction runs in a fixed order (the OpenMP loops only
// split independent work: per-point distances, sums over fixed point ranges added in order),
// so the centroids are bitwise identical for the same input and seed, whatever the number of
// threads (OMP_NUM_THREADS) and in every process on the same machine.
#include "router/partition.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <queue>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "router/partition_detail.hpp"

namespace dmhnsw::router {

namespace {

/// Uniform numbers from mt19937_64 with explicit arithmetic (portable across libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  /// [0, 1) with 53 random bits.
  double uniform01() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  /// [0, bound), bound >= 1, unbiased (rejection).
  uint64_t below(uint64_t bound) {
    if (bound <= 1) return 0;
    const uint64_t limit = std::numeric_limits<uint64_t>::max() -
                           std::numeric_limits<uint64_t>::max() % bound;
    uint64_t x;
    do x = gen_();
    while (x >= limit);
    return x % bound;
  }

 private:
  std::mt19937_64 gen_;
};

/// DistanceComputer for k-means' bulk distances. hnswlib runs dimensions that are a multiple
/// of 4 but not of 16 (e.g. 100, 1000) through its 4-wide SSE kernel; here those are split
/// into a 16-wide head (dim rounded down to 16) and a short tail, both DistanceComputers:
/// L2 = head + tail, IP: 1 - dot = (1 - dot_head) + (1 - dot_tail) - 1.
class BulkDistance {
 public:
  BulkDistance(Metric metric, uint32_t dim)
      : metric_(metric),
        head_dim_(split(dim) ? dim & ~15u : dim),
        head_(metric, head_dim_) {
    if (split(dim)) tail_.emplace(metric, dim - head_dim_);
  }
  float operator()(const float* a, const float* b) const {
    if (!tail_) return head_(a, b);
    const float d = head_(a, b) + (*tail_)(a + head_dim_, b + head_dim_);
    return metric_ == Metric::IP ? d - 1.0f : d;
  }

 private:
  static bool split(uint32_t dim) { return dim > 16 && dim % 16 != 0 && dim % 4 == 0; }
  Metric metric_;
  uint32_t head_dim_;
  DistanceComputer head_;
  std::optional<DistanceComputer> tail_;
};

/// OpenMP only pays off for large loops: on these 2-core machines other processes (other
/// computenodes clustering at the same time) often hold the second core, and then every
/// parallel region waits for a descheduled thread. So regions run in parallel only above
/// about 2^24 scalar operations.
bool worth_parallel(size_t n, size_t per_point) { return n * per_point >= (size_t{1} << 24); }

struct Result {
  std::vector<float> centroids;
  std::vector<uint32_t> assignment;
  std::vector<uint64_t> sizes;
};

double imbalance_of(const std::vector<uint64_t>& sizes) {
  if (sizes.empty()) return 1.0;
  const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
  if (*lo == 0) return *hi == 0 ? 1.0 : std::numeric_limits<double>::infinity();
  return static_cast<double>(*hi) / static_cast<double>(*lo);
}

/// Largest - smallest <= 1: no partition of the points is better balanced.
bool optimally_balanced(const std::vector<uint64_t>& sizes) {
  if (sizes.empty()) return true;
  const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
  return *hi - *lo <= 1;
}

/// dist[i*k + c] = distance(point i, centroid c).
void distance_matrix(const float* data, size_t n, uint32_t dim, const float* centroids,
                     uint32_t k, const BulkDistance& dc, std::vector<float>& dist) {
  dist.resize(n * k);
  const int64_t nn = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (worth_parallel(n, size_t{k} * dim))
  for (int64_t i = 0; i < nn; ++i) {
    const float* x = data + static_cast<size_t>(i) * dim;
    float* row = dist.data() + static_cast<size_t>(i) * k;
    for (uint32_t c = 0; c < k; ++c) row[c] = dc(x, centroids + static_cast<size_t>(c) * dim);
  }
}

/// Means of the clusters of `assignment`; every cluster must be non-empty. Sums in double:
/// the points are cut into kSumChunks fixed ranges (a function of n only), each range summed in
/// point order, the ranges added in order: deterministic whatever the thread count, and one
/// streaming pass over the data.
void update_centroids(const float* data, size_t n, uint32_t dim, uint32_t k,
                      const std::vector<uint32_t>& assignment, std::vector<float>& centroids,
                      std::vector<uint64_t>& sizes) {
  sizes.assign(k, 0);
  for (size_t i = 0; i < n; ++i) ++sizes[assignment[i]];
  constexpr size_t kSumChunks = 16;
  const size_t chunks = std::min(kSumChunks, (n + 1023) / 1024);
  const size_t per_chunk = (n + chunks - 1) / chunks;
  const size_t kd = static_cast<size_t>(k) * dim;
  std::vector<double> partial(chunks * kd, 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1 && worth_parallel(n, dim))
  for (int64_t ch = 0; ch < static_cast<int64_t>(chunks); ++ch) {
    double* sums = partial.data() + static_cast<size_t>(ch) * kd;
    const size_t begin = static_cast<size_t>(ch) * per_chunk;
    const size_t end = std::min(n, begin + per_chunk);
    for (size_t i = begin; i < end; ++i) {
      const float* __restrict x = data + i * dim;
      double* __restrict acc = sums + static_cast<size_t>(assignment[i]) * dim;
#pragma omp simd
      for (size_t d = 0; d < dim; ++d) acc[d] += static_cast<double>(x[d]);
    }
  }
  for (size_t ch = 1; ch < chunks; ++ch) {
    const double* src = partial.data() + ch * kd;
#pragma omp simd
    for (size_t j = 0; j < kd; ++j) partial[j] += src[j];
  }
  centroids.assign(kd, 0.0f);
  for (uint32_t c = 0; c < k; ++c) {
    if (sizes[c] == 0) continue;  // cannot happen with balanced_assign (sizes >= floor(n/k) >= 1)
    const double inv = 1.0 / static_cast<double>(sizes[c]);
    for (uint32_t d = 0; d < dim; ++d)
      centroids[static_cast<size_t>(c) * dim + d] =
          static_cast<float>(partial[static_cast<size_t>(c) * dim + d] * inv);
  }
}

/// k-means++ seeding: the first centre uniformly, each next one with probability proportional
/// to the distance (squared L2, or max(0, 1 - dot) for IP) to the nearest centre chosen so far.
std::vector<float> init_plus_plus(const float* data, size_t n, uint32_t dim, uint32_t k,
                                  const BulkDistance& dc, Rng& rng) {
  std::vector<float> centroids(static_cast<size_t>(k) * dim);
  auto take = [&](uint32_t c, size_t i) {
    std::copy(data + i * dim, data + (i + 1) * dim, centroids.begin() + static_cast<long>(c) * dim);
  };
  take(0, rng.below(n));
  std::vector<double> nearest(n, std::numeric_limits<double>::infinity());
  const int64_t nn = static_cast<int64_t>(n);
  for (uint32_t c = 1; c < k; ++c) {
    const float* last = centroids.data() + static_cast<size_t>(c - 1) * dim;
#pragma omp parallel for schedule(static) if (worth_parallel(n, dim))
    for (int64_t i = 0; i < nn; ++i) {
      const double d = std::max(0.0, static_cast<double>(dc(data + static_cast<size_t>(i) * dim, last)));
      if (d < nearest[static_cast<size_t>(i)]) nearest[static_cast<size_t>(i)] = d;
    }
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += nearest[i];
    size_t pick = n;
    if (total > 0 && std::isfinite(total)) {
      const double target = rng.uniform01() * total;
      double prefix = 0;
      size_t last_positive = n;
      for (size_t i = 0; i < n; ++i) {
        if (nearest[i] <= 0) continue;
        last_positive = i;
        prefix += nearest[i];
        if (prefix > target) {
          pick = i;
          break;
        }
      }
      if (pick == n) pick = last_positive;  // rounding at the very end of the prefix sum
    }
    if (pick == n) pick = rng.below(n);  // every point coincides with a centre already
    take(c, pick);
  }
  return centroids;
}

/// Balanced Lloyd iterations for k clusters (1 <= k <= n).
Result kmeans_run(const float* data, size_t n, uint32_t dim, uint32_t k,
                  const BulkDistance& dc, uint32_t iterations, uint64_t seed) {
  Result r;
  Rng rng(seed);
  r.centroids = init_plus_plus(data, n, dim, k, dc, rng);
  std::vector<float> dist;
  const uint32_t rounds = std::max<uint32_t>(1, iterations);
  for (uint32_t it = 0; it < rounds; ++it) {
    distance_matrix(data, n, dim, r.centroids.data(), k, dc, dist);
    std::vector<uint32_t> next = detail::balanced_assign(dist.data(), n, k);
    if (next == r.assignment) break;  // converged: the centroids are already its means
    r.assignment = std::move(next);
    update_centroids(data, n, dim, k, r.assignment, r.centroids, r.sizes);
  }
  return r;
}

}  // namespace

namespace detail {

std::vector<uint32_t> balanced_assign(const float* dist, size_t n, uint32_t k,
                                      uint32_t candidates) {
  if (k == 0 || n < k)
    throw std::invalid_argument("balanced_assign: need 1 <= k <= n (k=" + std::to_string(k) +
                                ", n=" + std::to_string(n) + ")");
  const uint32_t m = std::min(k, candidates == 0 ? 16u : candidates);
  // Each point's m nearest clusters, nearest first (ties: smaller cluster id).
  std::vector<uint32_t> cand(n * m);
  for (size_t i = 0; i < n; ++i) {
    const float* row = dist + i * k;
    uint32_t order[64];
    std::vector<uint32_t> big;
    uint32_t* ids = order;
    if (k > 64) {
      big.resize(k);
      ids = big.data();
    }
    for (uint32_t c = 0; c < k; ++c) ids[c] = c;
    auto closer = [row](uint32_t a, uint32_t b) { return row[a] < row[b] || (row[a] == row[b] && a < b); };
    if (k <= 64) {
      // Insertion sort: stable, so equal distances keep increasing cluster ids.
      for (uint32_t a = 1; a < k; ++a) {
        const uint32_t id = ids[a];
        uint32_t b = a;
        while (b > 0 && row[ids[b - 1]] > row[id]) {
          ids[b] = ids[b - 1];
          --b;
        }
        ids[b] = id;
      }
    } else {
      std::partial_sort(ids, ids + m, ids + k, closer);
    }
    std::copy(ids, ids + m, cand.begin() + static_cast<long>(i * m));
  }

  const uint64_t floor_size = n / k, ceil_slots = n % k;  // ceil_slots clusters get floor + 1
  std::vector<uint64_t> size(k, 0);
  uint64_t at_ceil = 0;
  auto full = [&](uint32_t c) {
    return size[c] >= floor_size + 1 || (size[c] >= floor_size && at_ceil >= ceil_slots);
  };
  auto place = [&](size_t i, uint32_t c, std::vector<uint32_t>& out) {
    out[i] = c;
    if (++size[c] == floor_size + 1) ++at_ceil;
  };

  struct Entry {
    float d;
    uint32_t rank;
    size_t point;
  };
  // Min-heap on (distance, point): a point is in the heap at most once, so this is a total order.
  auto later = [](const Entry& a, const Entry& b) {
    return a.d > b.d || (a.d == b.d && a.point > b.point);
  };
  std::vector<Entry> heap(n);
  for (size_t i = 0; i < n; ++i) heap[i] = {dist[i * k + cand[i * m]], 0, i};
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> pq(later, std::move(heap));

  std::vector<uint32_t> out(n, 0);
  while (!pq.empty()) {
    const Entry e = pq.top();
    pq.pop();
    const uint32_t c = cand[e.point * m + e.rank];
    if (!full(c)) {
      place(e.point, c, out);
    } else if (e.rank + 1 < m) {
      const uint32_t next = cand[e.point * m + e.rank + 1];
      pq.push({dist[e.point * k + next], e.rank + 1, e.point});
    } else {
      // Every candidate is full: the nearest non-full cluster (one exists, since the
      // capacities sum to n and this point is not placed yet).
      const float* row = dist + e.point * k;
      uint32_t best = k;
      for (uint32_t c2 = 0; c2 < k; ++c2)
        if (!full(c2) && (best == k || row[c2] < row[best])) best = c2;
      place(e.point, best, out);
    }
  }
  return out;
}

std::vector<uint32_t> merge_closest_pairs(std::vector<float>& centroids,
                                          std::vector<uint64_t>& sizes, uint32_t dim,
                                          uint32_t k_target) {
  const size_t count0 = sizes.size();
  if (k_target == 0 || k_target > count0 || centroids.size() != count0 * dim)
    throw std::invalid_argument("merge_closest_pairs: need 1 <= k_target (" +
                                std::to_string(k_target) + ") <= clusters (" +
                                std::to_string(count0) + ") and count x dim centroids");
  std::vector<uint32_t> mapping(count0);
  for (size_t c = 0; c < count0; ++c) mapping[c] = static_cast<uint32_t>(c);

  while (sizes.size() > k_target) {
    const size_t count = sizes.size();
    struct Pair {
      double d;
      uint32_t a, b;
    };
    std::vector<Pair> pairs;
    pairs.reserve(count * (count - 1) / 2);
    for (uint32_t a = 0; a < count; ++a)
      for (uint32_t b = a + 1; b < count; ++b) {
        double d = 0;
        const float* x = centroids.data() + static_cast<size_t>(a) * dim;
        const float* y = centroids.data() + static_cast<size_t>(b) * dim;
        for (uint32_t j = 0; j < dim; ++j) {
          const double t = static_cast<double>(x[j]) - y[j];
          d += t * t;
        }
        pairs.push_back({d, a, b});
      }
    std::sort(pairs.begin(), pairs.end(), [](const Pair& p, const Pair& q) {
      return p.d < q.d || (p.d == q.d && (p.a < q.a || (p.a == q.a && p.b < q.b)));
    });
    // partner[c]: the cluster c is merged with this round (count: none).
    std::vector<uint32_t> partner(count, static_cast<uint32_t>(count));
    size_t merges = 0;
    const size_t wanted = count - k_target;
    for (const Pair& p : pairs) {
      if (merges == wanted) break;
      if (partner[p.a] != count || partner[p.b] != count) continue;
      partner[p.a] = p.b;
      partner[p.b] = p.a;
      ++merges;
    }
    // New clusters in order of their smallest member id (a pair is emitted at its smaller id).
    std::vector<uint32_t> renumber(count);
    std::vector<float> next_centroids;
    std::vector<uint64_t> next_sizes;
    for (uint32_t c = 0; c < count; ++c) {
      const uint32_t p = partner[c];
      if (p != count && p < c) continue;  // emitted with its partner
      const uint32_t id = static_cast<uint32_t>(next_sizes.size());
      renumber[c] = id;
      const float* x = centroids.data() + static_cast<size_t>(c) * dim;
      if (p == count) {
        next_centroids.insert(next_centroids.end(), x, x + dim);
        next_sizes.push_back(sizes[c]);
        continue;
      }
      renumber[p] = id;
      const float* y = centroids.data() + static_cast<size_t>(p) * dim;
      const uint64_t total = sizes[c] + sizes[p];
      const double wx = total ? static_cast<double>(sizes[c]) / static_cast<double>(total) : 0.5;
      const double wy = total ? static_cast<double>(sizes[p]) / static_cast<double>(total) : 0.5;
      for (uint32_t j = 0; j < dim; ++j)
        next_centroids.push_back(static_cast<float>(wx * x[j] + wy * y[j]));
      next_sizes.push_back(total);
    }
    for (auto& m : mapping) m = renumber[m];
    centroids = std::move(next_centroids);
    sizes = std::move(next_sizes);
  }
  return mapping;
}

uint64_t fnv1a64(const float* values, size_t count) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < count * sizeof(float); ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace detail

double Clustering::imbalance() const { return imbalance_of(sizes); }

Clustering balanced_kmeans(const float* data, size_t n, uint32_t dim, uint32_t k, Metric metric,
                           const BalancedKMeansOptions& opts) {
  if (k == 0) throw std::invalid_argument("balanced_kmeans: k must be >= 1 (k=0)");
  if (k > n)
    throw std::invalid_argument("balanced_kmeans: k=" + std::to_string(k) +
                                " exceeds the number of points n=" + std::to_string(n));
  if (dim == 0) throw std::invalid_argument("balanced_kmeans: dim must be >= 1");
  if (data == nullptr) throw std::invalid_argument("balanced_kmeans: data is null");
  const BulkDistance dc(metric, dim);

  Result best;
  if (k == 1) {
    best.assignment.assign(n, 0);
    update_centroids(data, n, dim, 1, best.assignment, best.centroids, best.sizes);
  } else {
    best = kmeans_run(data, n, dim, k, dc, opts.iterations, opts.seed);
    // Paper heuristic (small/odd k): 2k, 4k, ... clusters merged pairwise back to k.
    constexpr uint32_t kMaxDoublings = 3;
    double best_imbalance = imbalance_of(best.sizes);
    for (uint32_t level = 1; level <= kMaxDoublings; ++level) {
      if (best_imbalance <= opts.max_imbalance || optimally_balanced(best.sizes)) break;
      const uint64_t fine_k = static_cast<uint64_t>(k) << level;
      if (fine_k > n) break;
      Result fine = kmeans_run(data, n, dim, static_cast<uint32_t>(fine_k), dc, opts.iterations,
                               opts.seed + level);
      Result merged;
      merged.centroids = std::move(fine.centroids);
      merged.sizes = std::move(fine.sizes);
      const std::vector<uint32_t> mapping =
          detail::merge_closest_pairs(merged.centroids, merged.sizes, dim, k);
      merged.assignment.resize(n);
      for (size_t i = 0; i < n; ++i) merged.assignment[i] = mapping[fine.assignment[i]];
      const double imb = imbalance_of(merged.sizes);
      if (imb < best_imbalance) {
        best = std::move(merged);
        best_imbalance = imb;
      }
    }
  }

  Clustering out;
  out.k = k;
  out.dim = dim;
  out.centroids = std::move(best.centroids);
  out.assignment = std::move(best.assignment);
  out.sizes = std::move(best.sizes);
  // Without balance_oracle: no rounds, zero offsets; the loads are measured either way.
  out.offsets = balance_offsets(data, n, dim, out.centroids.data(), k, metric, 1.02, opts.balance_oracle ? 2000 : 0,
                                &out.oracle_load_nearest, &out.oracle_load_balanced);
  return out;
}

std::vector<float> balance_offsets(const float* data, size_t n, uint32_t dim, const float* centroids, uint32_t k,
                                   Metric metric, double tolerance, uint32_t max_rounds, double* load_before,
                                   double* load_after) {
  if (k == 0 || n == 0 || dim == 0 || data == nullptr || centroids == nullptr)
    throw std::invalid_argument("balance_offsets: needs k, n, dim >= 1 and data (k=" + std::to_string(k) +
                                ", n=" + std::to_string(n) + ", dim=" + std::to_string(dim) + ")");
  std::vector<float> off(k, 0.0f);
  std::vector<float> dist;
  distance_matrix(data, n, dim, centroids, k, BulkDistance(metric, dim), dist);
  // The most crowded cluster's count under offsets `o`.
  std::vector<uint64_t> counts(k);
  auto count = [&](const std::vector<float>& o) {
    std::fill(counts.begin(), counts.end(), 0);
    for (size_t i = 0; i < n; ++i) {
      const float* row = dist.data() + i * k;
      uint32_t b = 0;
      for (uint32_t c = 1; c < k; ++c)
        if (row[c] + o[c] < row[b] + o[b]) b = c;
      ++counts[b];
    }
    return *std::max_element(counts.begin(), counts.end());
  };
  const double mean = static_cast<double>(n) / k;
  const uint64_t goal = static_cast<uint64_t>(std::ceil(tolerance * mean));
  uint64_t best_max = count(off);
  if (load_before != nullptr) *load_before = static_cast<double>(best_max) / mean;
  std::vector<float> best = off;
  if (k > 1 && best_max > goal) {
    // Step scale: the mean spread of a point's distances to the centroids.
    double spread = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto [lo, hi] = std::minmax_element(dist.begin() + i * k, dist.begin() + (i + 1) * k);
      spread += static_cast<double>(*hi) - static_cast<double>(*lo);
    }
    spread /= static_cast<double>(n);
    for (uint32_t round = 0; round < max_rounds && spread > 0; ++round) {
      const double step = 0.05 * spread / (1.0 + round / 50.0);
      for (uint32_t c = 0; c < k; ++c)
        off[c] += static_cast<float>(step * (static_cast<double>(counts[c]) - mean) / mean);
      const uint64_t mx = count(off);
      if (mx < best_max) {
        best_max = mx;
        best = off;
      }
      if (best_max <= goal) break;
    }
  }
  if (load_after != nullptr) *load_after = static_cast<double>(best_max) / mean;
  return best;
}

// ---- oracle ----

Oracle::Oracle(std::vector<float> centroids, uint32_t k, uint32_t dim, Metric metric, std::vector<float> offsets)
    : k_(k), dim_(dim), centroids_(std::move(centroids)), offsets_(std::move(offsets)), metric_(metric) {
  if (k == 0 || dim == 0)
    throw std::invalid_argument("Oracle: k and dim must be >= 1 (k=" + std::to_string(k) +
                                ", dim=" + std::to_string(dim) + ")");
  if (centroids_.size() != static_cast<size_t>(k) * dim)
    throw std::invalid_argument("Oracle: " + std::to_string(centroids_.size()) +
                                " centroid values, expected k x dim = " + std::to_string(k) +
                                " x " + std::to_string(dim));
  if (offsets_.empty()) offsets_.assign(k, 0.0f);
  if (offsets_.size() != k)
    throw std::invalid_argument("Oracle: " + std::to_string(offsets_.size()) + " offsets, expected k = " +
                                std::to_string(k));
  dist_.emplace(metric, dim);
}

void Oracle::rank(const float* q, uint32_t* order, float* scores) const {
  if (k_ == 0) throw std::logic_error("Oracle::rank on an empty oracle");
  constexpr uint32_t kStack = 64;
  float stack_d[kStack];
  std::vector<float> heap_d;
  float* d = scores != nullptr ? scores : stack_d;
  if (scores == nullptr && k_ > kStack) {
    heap_d.resize(k_);
    d = heap_d.data();
  }
  for (uint32_t c = 0; c < k_; ++c) {
    d[c] = (*dist_)(q, centroids_.data() + static_cast<size_t>(c) * dim_) + offsets_[c];
    order[c] = c;
  }
  // Insertion sort (k is small), stable: equal distances keep increasing ids.
  for (uint32_t i = 1; i < k_; ++i) {
    const uint32_t id = order[i];
    uint32_t j = i;
    while (j > 0 && d[order[j - 1]] > d[id]) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = id;
  }
}

uint32_t Oracle::best(const float* q) const {
  if (k_ == 0) throw std::logic_error("Oracle::best on an empty oracle");
  uint32_t best = 0;
  float best_d = (*dist_)(q, centroids_.data()) + offsets_[0];
  for (uint32_t c = 1; c < k_; ++c) {
    const float d = (*dist_)(q, centroids_.data() + static_cast<size_t>(c) * dim_) + offsets_[c];
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace dmhnsw::router
