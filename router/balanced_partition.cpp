// d-HNSW's index balancer (router/balanced_partition.hpp): approximate k-means++ initialisation,
// then capacity-constrained k-means (or plain Lloyd iterations, Figure 17's comparison).
//
// Cost per round (appendix, "Phase 2"): the n x k distances (O(n k d), blocked, parallel over
// vectors), the top-L selection per vector (O(n k) insertion into an L-element sorted list),
// the capacity-constrained assignment through one priority queue (O(n log n), sequential), and
// the centroid means (O(n d), parallel over fixed row ranges). Only the top-L candidates of each
// vector are stored (n x L), never the n x k matrix, so 1M x 1000 fits in memory.
//
// Seeding makes one pass over its rows per new centre; it runs over a seeded pool of at most
// max(16384, 32 k) training rows, so that its k passes stay cheap next to the rounds.
//
// Determinism: the random numbers come from std::mt19937_64 through our own uniform helpers
// (independent of the standard library's distributions); every distance is computed by the same
// code path for the same (vector, centroid) pair whatever the thread count (tiles are fixed by
// index, each pair has its own accumulator); every floating-point reduction runs in a fixed
// order (prefix sums and the inertia sequentially, the means over fixed row ranges added in
// order). So the output is bitwise identical for any OMP_NUM_THREADS.
#include "router/balanced_partition.hpp"
#include "router/kmeans_kernels.hpp"

#include "common/workload.hpp"  // Rng: seeded, the same numbers with every standard library

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace dmhnsw::router {

namespace {


using namespace kmeans_detail;

// ---- initialisation ----

/// Approximate k-means++ (paper section 4.1.1): the first centre uniformly; each next one: the
/// farthest of `candidates` vectors sampled with probability proportional to the distance to
/// the nearest centre chosen so far (ties: the smaller row).
std::vector<float> init_centres(bool l2, const Rows& rows, uint32_t k, uint32_t candidates,
                                Rng& rng) {
  const uint32_t dim = rows.dim;
  const size_t n = rows.count;
  std::vector<float> centroids(static_cast<size_t>(k) * dim);
  auto take = [&](uint32_t c, size_t i) {
    const float* x = rows.row(i);
    std::copy(x, x + dim, centroids.begin() + static_cast<std::ptrdiff_t>(c) * dim);
  };
  take(0, rng.uniform(n));
  std::vector<float> near(n, std::numeric_limits<float>::infinity());
  std::vector<double> prefix(n);
  for (uint32_t c = 1; c < k; ++c) {
    const float* last = centroids.data() + static_cast<size_t>(c - 1) * dim;
    if (l2)
      lower_nearest<true>(rows, last, near);
    else
      lower_nearest<false>(rows, last, near);
    double total = 0;
    size_t last_positive = n;
    for (size_t i = 0; i < n; ++i) {
      const double w = near[i] > 0 ? static_cast<double>(near[i]) : 0.0;  // IP: max(0, 1 - dot)
      if (w > 0) last_positive = i;
      total += w;
      prefix[i] = total;
    }
    size_t pick = n;
    if (total > 0 && std::isfinite(total)) {
      for (uint32_t s = 0; s < candidates; ++s) {
        const double target = rng.uniform01() * total;
        size_t i = static_cast<size_t>(std::upper_bound(prefix.begin(), prefix.end(), target) -
                                       prefix.begin());
        if (i >= n) i = last_positive;  // rounding at the very end of the prefix sum
        if (pick == n || near[i] > near[pick] || (near[i] == near[pick] && i < pick)) pick = i;
      }
    } else {
      pick = rng.uniform(n);  // every vector coincides with a chosen centre
    }
    take(c, pick);
  }
  return centroids;
}

// ---- assignment ----

/// Capacity of each partition when m vectors are split into k: ceil(slack * m / k), at least
/// ceil(m / k), at most m.
uint64_t capacity_for(size_t m, uint32_t k, double slack) {
  const uint64_t base = (static_cast<uint64_t>(m) + k - 1) / k;
  if (slack <= 1.0) return base;
  double x = slack * static_cast<double>(m) / static_cast<double>(k);
  x -= x * 1e-12;  // 1.05 * 20000 / 8 is 2625.0000000000005 in doubles
  const uint64_t cap = x >= static_cast<double>(m) ? m : static_cast<uint64_t>(std::ceil(x));
  return std::clamp<uint64_t>(cap, base, m);
}

/// Capacity-constrained assignment through one global priority queue (smallest distance first,
/// ties: smaller row): a row goes to its nearest candidate with room; a row whose L candidates
/// are all full goes to its nearest centroid with room (ties: smaller id). A partition is also
/// "full" for non-empty partitions once the rows left are just enough for the empty ones, so
/// none stays empty (rows >= k).
std::vector<uint32_t> capacity_assign(bool l2, const Rows& rows, const float* centroids,
                                      uint32_t k, uint32_t L, const std::vector<uint32_t>& cid,
                                      const std::vector<float>& cdist, uint64_t capacity) {
  const size_t n = rows.count;
  std::vector<uint64_t> size(k, 0);
  uint64_t remaining = n, empties = k;
  auto full = [&](uint32_t c) {
    return size[c] >= capacity || (size[c] > 0 && remaining == empties);
  };
  std::vector<uint32_t> out(n, 0);
  auto place = [&](size_t i, uint32_t c) {
    out[i] = c;
    if (size[c]++ == 0) --empties;
    --remaining;
  };

  struct Entry {
    float d;
    uint32_t rank;
    uint64_t row;
  };
  // The queue: every row's first candidate, sorted by (distance, row), merged with a heap of
  // the later candidates of rows whose earlier ones were full. Pops the smallest (distance,
  // row) of both, i.e. exactly one global priority queue (a row is pending at most once, so
  // this is a total order), with most of the work in one sort.
  auto earlier = [](const Entry& a, const Entry& b) {
    return a.d < b.d || (a.d == b.d && a.row < b.row);
  };
  auto later = [&](const Entry& a, const Entry& b) { return earlier(b, a); };
  std::vector<Entry> first(n);
  for (size_t i = 0; i < n; ++i) first[i] = {cdist[i * L], 0, i};
  std::sort(first.begin(), first.end(), earlier);
  std::vector<Entry> heap;  // min-heap under `later`
  size_t next_first = 0;

  while (next_first < n || !heap.empty()) {
    Entry e;
    if (!heap.empty() && (next_first == n || earlier(heap.front(), first[next_first]))) {
      std::pop_heap(heap.begin(), heap.end(), later);
      e = heap.back();
      heap.pop_back();
    } else {
      e = first[next_first++];
    }
    const size_t base = static_cast<size_t>(e.row) * L;
    const uint32_t c = cid[base + e.rank];
    if (!full(c)) {
      place(e.row, c);
    } else if (e.rank + 1 < L) {
      heap.push_back({cdist[base + e.rank + 1], e.rank + 1, e.row});
      std::push_heap(heap.begin(), heap.end(), later);
    } else {
      // All candidates full: the nearest centroid with room (one exists: k * capacity >= rows,
      // and while rows remain for empty partitions, those are not full).
      const float* x = rows.row(e.row);
      uint32_t best = k;
      float best_d = 0;
      for (uint32_t c2 = 0; c2 < k; ++c2) {
        if (full(c2)) continue;
        const float d = one(l2, x, centroids + static_cast<size_t>(c2) * rows.dim, rows.dim);
        if (best == k || d < best_d) {
          best = c2;
          best_d = d;
        }
      }
      place(e.row, best);
    }
  }
  return out;
}

/// Plain k-means' empty partitions: each (in id order) takes the row farthest from its
/// centroid (ties: smaller row) among partitions of two or more rows.
void reseed_empty(std::vector<uint32_t>& assignment, const std::vector<float>& dist, uint32_t k) {
  const size_t n = assignment.size();
  std::vector<uint64_t> size(k, 0);
  for (uint32_t c : assignment) ++size[c];
  if (std::find(size.begin(), size.end(), uint64_t{0}) == size.end()) return;
  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) {
    return dist[a] > dist[b] || (dist[a] == dist[b] && a < b);
  });
  size_t pos = 0;
  for (uint32_t c = 0; c < k; ++c) {
    if (size[c] != 0) continue;
    // A row passed over belongs to a partition that only shrinks, so it never qualifies later.
    while (size[assignment[order[pos]]] < 2) ++pos;  // exists: rows >= k and c is empty
    const uint64_t i = order[pos++];
    --size[assignment[i]];
    assignment[i] = c;
    size[c] = 1;
  }
}

// ---- update ----

/// centroids[c] = mean of the rows of partition c (unchanged if empty); sizes = rows per
/// partition. One streaming pass over the rows, summed in double: the rows are cut into a fixed
/// number of ranges (a function of n, k and dim only, at most 16, their partial sums at most
/// 64 MiB), each range summed in row order, the ranges added in order. So the means do not
/// depend on the thread count.
void update_means(const Rows& rows, const std::vector<uint32_t>& assignment, uint32_t k,
                  std::vector<float>& centroids, std::vector<uint64_t>& sizes) {
  const size_t n = rows.count;
  const uint32_t dim = rows.dim;
  sizes.assign(k, 0);
  for (size_t i = 0; i < n; ++i) ++sizes[assignment[i]];
  const size_t kd = static_cast<size_t>(k) * dim;
  constexpr size_t kMaxChunks = 16, kMaxPartialBytes = size_t{64} << 20, kMinRows = 4096;
  const size_t chunks = std::max<size_t>(
      1, std::min({kMaxChunks, kMaxPartialBytes / (kd * sizeof(double)), n / kMinRows}));
  const size_t per_chunk = (n + chunks - 1) / chunks;
  std::vector<double> partial(chunks * kd, 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1 && worth_parallel(n * dim))
  for (int64_t ch = 0; ch < static_cast<int64_t>(chunks); ++ch) {
    double* sums = partial.data() + static_cast<size_t>(ch) * kd;
    const size_t begin = static_cast<size_t>(ch) * per_chunk;
    const size_t end = std::min(n, begin + per_chunk);
    for (size_t i = begin; i < end; ++i) {
      const float* __restrict x = rows.row(i);
      double* __restrict acc = sums + static_cast<size_t>(assignment[i]) * dim;
#pragma omp simd
      for (uint32_t j = 0; j < dim; ++j) acc[j] += static_cast<double>(x[j]);
    }
  }
  for (size_t ch = 1; ch < chunks; ++ch) {
    const double* __restrict src = partial.data() + ch * kd;
    double* __restrict dst = partial.data();
#pragma omp simd
    for (size_t j = 0; j < kd; ++j) dst[j] += src[j];
  }
  for (uint32_t c = 0; c < k; ++c) {
    if (sizes[c] == 0) continue;
    const double inv = 1.0 / static_cast<double>(sizes[c]);
    const double* sum = partial.data() + static_cast<size_t>(c) * dim;
    float* out = centroids.data() + static_cast<size_t>(c) * dim;
    for (uint32_t j = 0; j < dim; ++j) out[j] = static_cast<float>(sum[j] * inv);
  }
}

/// Sum over rows of distance(row, its centroid), each distance in float, summed in double in
/// row order.
double inertia_of(bool l2, const Rows& rows, const float* centroids,
                  const std::vector<uint32_t>& assignment) {
  const size_t n = rows.count;
  std::vector<float> d(n);
#pragma omp parallel for schedule(static) if (worth_parallel(n * rows.dim))
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
    const size_t r = static_cast<size_t>(i);
    d[r] = one(l2, rows.row(r), centroids + static_cast<size_t>(assignment[r]) * rows.dim,
               rows.dim);
  }
  double total = 0;
  for (float v : d) total += static_cast<double>(v);
  return total;
}

// ---- driver ----

/// Seeding makes one pass over its rows per centre, memory bound once they exceed the caches
/// (measured: 100K x 960 into 200 partitions spent 46 % of its time seeding over all rows). So
/// it runs over a seeded pool of at most max(kInitPoolMin, kInitPoolPerCentre * k) rows.
constexpr size_t kInitPoolMin = 16384, kInitPoolPerCentre = 32;

/// `count` distinct ids of [0, m) drawn with `rng` (partial Fisher-Yates), sorted.
std::vector<uint64_t> sample_rows(size_t m, size_t count, Rng& rng) {
  std::vector<uint64_t> perm(m);
  std::iota(perm.begin(), perm.end(), uint64_t{0});
  for (size_t i = 0; i < count; ++i) std::swap(perm[i], perm[i + rng.uniform(m - i)]);
  perm.resize(count);
  std::sort(perm.begin(), perm.end());
  return perm;
}

void validate(const char* fn, const float* data, size_t n, uint32_t dim, uint32_t k,
              const CapacityKMeansOptions& opts, bool capacity) {
  const std::string name(fn);
  if (k == 0)
    throw std::invalid_argument(name + ": the number of partitions k must be >= 1 (k=0)");
  if (dim == 0) throw std::invalid_argument(name + ": the dimension dim must be >= 1 (dim=0)");
  if (data == nullptr) throw std::invalid_argument(name + ": data is null");
  if (k > n)
    throw std::invalid_argument(name + ": k=" + std::to_string(k) +
                                " partitions exceed the number of vectors n=" + std::to_string(n));
  if (opts.init_candidates == 0)
    throw std::invalid_argument(name + ": init_candidates must be >= 1");
  if (capacity) {
    if (opts.top_l == 0) throw std::invalid_argument(name + ": top_l must be >= 1");
    if (!(opts.capacity_slack >= 1.0) || !std::isfinite(opts.capacity_slack))
      throw std::invalid_argument(name + ": capacity_slack must be finite and >= 1 (got " +
                                  std::to_string(opts.capacity_slack) + ")");
  }
}

Partitioning run(const char* fn, const float* data, size_t n, uint32_t dim, uint32_t k,
                 Metric metric, const CapacityKMeansOptions& opts, bool capacity) {
  validate(fn, data, n, dim, k, opts, capacity);
  const bool l2 = metric == Metric::L2;
  Rng rng(opts.seed);

  // The training rows: all, or a seeded sample of max(max_train, k) rows.
  const Rows all{data, dim, nullptr, n};
  std::vector<uint64_t> sample;
  if (opts.max_train > 0 && std::max<size_t>(opts.max_train, k) < n)
    sample = sample_rows(n, std::max<size_t>(opts.max_train, k), rng);
  const Rows train = sample.empty() ? all : Rows{data, dim, sample.data(), sample.size()};

  Partitioning out;
  out.k = k;
  out.dim = dim;
  // The seeding pool: the training rows, or a seeded sample of them copied together.
  const size_t pool_size = std::max(kInitPoolMin, kInitPoolPerCentre * k);
  if (train.count <= pool_size) {
    out.centroids = init_centres(l2, train, k, opts.init_candidates, rng);
  } else {
    const std::vector<uint64_t> picked = sample_rows(train.count, pool_size, rng);
    std::vector<float> pool(pool_size * dim);
    for (size_t i = 0; i < pool_size; ++i)
      std::copy_n(train.row(picked[i]), dim, pool.begin() + static_cast<std::ptrdiff_t>(i * dim));
    out.centroids = init_centres(l2, Rows{pool.data(), dim, nullptr, pool_size}, k,
                                 opts.init_candidates, rng);
  }

  const uint32_t L = capacity ? std::min(opts.top_l, k) : 1;
  std::vector<uint32_t> cid;
  std::vector<float> cdist;
  auto assign = [&](const Rows& rows) {
    nearest(l2, rows, out.centroids.data(), k, L, cid, cdist);
    if (capacity)
      return capacity_assign(l2, rows, out.centroids.data(), k, L, cid, cdist,
                             capacity_for(rows.count, k, opts.capacity_slack));
    std::vector<uint32_t> a = cid;  // L == 1: the nearest centroid
    reseed_empty(a, cdist, k);
    return a;
  };

  const uint32_t rounds = std::max<uint32_t>(1, opts.iterations);
  for (uint32_t it = 0; it < rounds; ++it) {
    std::vector<uint32_t> next = assign(train);
    if (next == out.assignment) break;  // converged: the centroids are already its means
    out.assignment = std::move(next);
    update_means(train, out.assignment, k, out.centroids, out.sizes);
  }
  if (!sample.empty()) {
    out.assignment = assign(all);
    update_means(all, out.assignment, k, out.centroids, out.sizes);
  }
  out.capacity = capacity ? capacity_for(n, k, opts.capacity_slack) : 0;
  out.inertia = inertia_of(l2, all, out.centroids.data(), out.assignment);
  return out;
}

}  // namespace

double Partitioning::max_over_mean() const {
  if (sizes.empty()) return 0;
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  if (total == 0) return 0;
  const double mean = static_cast<double>(total) / static_cast<double>(sizes.size());
  return static_cast<double>(*std::max_element(sizes.begin(), sizes.end())) / mean;
}

double Partitioning::min_over_mean() const {
  if (sizes.empty()) return 0;
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  if (total == 0) return 0;
  const double mean = static_cast<double>(total) / static_cast<double>(sizes.size());
  return static_cast<double>(*std::min_element(sizes.begin(), sizes.end())) / mean;
}

Partitioning capacity_kmeans(const float* data, size_t n, uint32_t dim, uint32_t k, Metric metric,
                             const CapacityKMeansOptions& opts) {
  return run("capacity_kmeans", data, n, dim, k, metric, opts, true);
}

Partitioning plain_kmeans(const float* data, size_t n, uint32_t dim, uint32_t k, Metric metric,
                          const CapacityKMeansOptions& opts) {
  return run("plain_kmeans", data, n, dim, k, metric, opts, false);
}

}  // namespace dmhnsw::router
