#pragma once
// The distance kernels of d-HNSW's balanced partitioning (balanced_partition.cpp): tiles of
// vectors against centroids with one accumulator per pair, so that every distance is the same
// whatever the thread count, and the top-L centroids of each vector. Only
// balanced_partition.cpp includes this.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace dmhnsw::router::kmeans_detail {

/// OpenMP pays off only for large loops: on these 2-core machines another process often holds
/// the second core, and then a parallel region waits for a descheduled thread. So regions run
/// in parallel only above about 4M scalar operations (a few milliseconds of work).
inline bool worth_parallel(size_t work) { return work >= (size_t{1} << 22); }

/// The vectors a step runs on: all n rows (ids == nullptr) or a sample (sorted row ids).
struct Rows {
  const float* data;
  uint32_t dim;
  const uint64_t* ids;
  size_t count;
  const float* row(size_t i) const {
    return data + static_cast<size_t>(ids ? ids[i] : i) * dim;
  }
};

// ---- distance kernels ----
// Squared L2, or 1 - <x, c> for IP (hnswlib's conventions, common/distance.hpp). Every pair has
// its own accumulator, so a pair's distance does not depend on the other vectors or centroids
// of its tile (a tile's tail repeats its last vector or centroid), and `omp simd reduction`
// lets the compiler vectorise each sum in a fixed order.
//
//   tile4: four vectors against one centroid, directly (seeding: one new centre at a time);
//   dot44: four vectors against four centroids, dot products only: the bulk n x k pass, where
//          L2 = |x|^2 + |c|^2 - 2 <x, c> (clamped at 0) halves the arithmetic and shares each
//          load between four products (measured: about twice as fast as tile4, which is itself
//          1.2-1.5x faster than hnswlib's per-pair kernels, at dim 128 to 960).
//
// The default build is portable (no -march=native), so these kernels are compiled three times,
// for x86-64-v4 (AVX-512), v3 (AVX2, FMA) and the baseline, and the loader picks one for the
// CPU (GCC target_clones, an ifunc): k-means 1.8x faster than with the baseline alone on an
// AVX-512 host (50k x 384, k = 224). Sums may differ in the last bits between those levels
// (DMHNSW_SIMD, common/distance.hpp, does not apply here). Not under ThreadSanitizer: gcc
// instruments the ifunc's resolver, which the loader runs before the TSan runtime is set up
// (every binary linking this crashed at load, SIGSEGV in dot44's resolver).
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define DMHNSW_KERNEL_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DMHNSW_KERNEL_CLONES
#endif

template <bool kL2>
DMHNSW_KERNEL_CLONES void tile4(const float* __restrict x0, const float* __restrict x1,
                                const float* __restrict x2, const float* __restrict x3,
                                const float* __restrict c, uint32_t dim, float* __restrict out) {
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  if constexpr (kL2) {
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (uint32_t j = 0; j < dim; ++j) {
      const float cj = c[j];
      const float t0 = x0[j] - cj, t1 = x1[j] - cj, t2 = x2[j] - cj, t3 = x3[j] - cj;
      a0 += t0 * t0;
      a1 += t1 * t1;
      a2 += t2 * t2;
      a3 += t3 * t3;
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
  } else {
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (uint32_t j = 0; j < dim; ++j) {
      const float cj = c[j];
      a0 += x0[j] * cj;
      a1 += x1[j] * cj;
      a2 += x2[j] * cj;
      a3 += x3[j] * cj;
    }
    out[0] = 1.0f - a0;
    out[1] = 1.0f - a1;
    out[2] = 1.0f - a2;
    out[3] = 1.0f - a3;
  }
}

template <bool kL2>
DMHNSW_KERNEL_CLONES float one(const float* __restrict x, const float* __restrict c,
                               uint32_t dim) {
  float a = 0;
  if constexpr (kL2) {
#pragma omp simd reduction(+ : a)
    for (uint32_t j = 0; j < dim; ++j) {
      const float t = x[j] - c[j];
      a += t * t;
    }
    return a;
  } else {
#pragma omp simd reduction(+ : a)
    for (uint32_t j = 0; j < dim; ++j) a += x[j] * c[j];
    return 1.0f - a;
  }
}

inline float one(bool l2, const float* x, const float* c, uint32_t dim) {
  return l2 ? one<true>(x, c, dim) : one<false>(x, c, dim);
}

/// Keeps the L smallest (distance, id) of `row` (k values), sorted ascending; ties: smaller id.
inline void select_top(const float* row, uint32_t k, uint32_t L, uint32_t* ids, float* dists) {
  uint32_t count = 0;
  for (uint32_t c = 0; c < k; ++c) {
    const float d = row[c];
    if (count == L && !(d < dists[L - 1])) continue;  // ties keep the smaller id already kept
    uint32_t pos = count < L ? count++ : L - 1;
    while (pos > 0 && d < dists[pos - 1]) {
      dists[pos] = dists[pos - 1];
      ids[pos] = ids[pos - 1];
      --pos;
    }
    dists[pos] = d;
    ids[pos] = c;
  }
}

/// out[4 q + w] = <x_q, c_w>.
DMHNSW_KERNEL_CLONES inline void dot44(const float* __restrict x0, const float* __restrict x1,
                                const float* __restrict x2, const float* __restrict x3,
                                const float* __restrict c0, const float* __restrict c1,
                                const float* __restrict c2, const float* __restrict c3,
                                uint32_t dim, float* __restrict out) {
  float a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;
  float a20 = 0, a21 = 0, a22 = 0, a23 = 0, a30 = 0, a31 = 0, a32 = 0, a33 = 0;
#pragma omp simd reduction(+ : a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, \
                               a30, a31, a32, a33)
  for (uint32_t j = 0; j < dim; ++j) {
    const float y0 = c0[j], y1 = c1[j], y2 = c2[j], y3 = c3[j];
    const float v0 = x0[j], v1 = x1[j], v2 = x2[j], v3 = x3[j];
    a00 += v0 * y0;
    a01 += v0 * y1;
    a02 += v0 * y2;
    a03 += v0 * y3;
    a10 += v1 * y0;
    a11 += v1 * y1;
    a12 += v1 * y2;
    a13 += v1 * y3;
    a20 += v2 * y0;
    a21 += v2 * y1;
    a22 += v2 * y2;
    a23 += v2 * y3;
    a30 += v3 * y0;
    a31 += v3 * y1;
    a32 += v3 * y2;
    a33 += v3 * y3;
  }
  const float r[16] = {a00, a01, a02, a03, a10, a11, a12, a13,
                       a20, a21, a22, a23, a30, a31, a32, a33};
  std::copy(r, r + 16, out);
}

inline float squared_norm(const float* __restrict x, uint32_t dim) {
  float a = 0;
#pragma omp simd reduction(+ : a)
  for (uint32_t j = 0; j < dim; ++j) a += x[j] * x[j];
  return a;
}

/// For every row: its L nearest centroids (ids and distances, nearest first) into
/// ids/dists[i * L ...]. Rows are processed in tiles of kTile, each tile running through the
/// centroids in blocks that stay in L2, tiles in parallel.
template <bool kL2>
void nearest_pass(const Rows& rows, const float* centroids, uint32_t k, uint32_t L,
                  std::vector<uint32_t>& ids, std::vector<float>& dists) {
  constexpr size_t kTile = 32;
  const uint32_t dim = rows.dim;
  const size_t n = rows.count;
  ids.resize(n * L);
  dists.resize(n * L);
  std::vector<float> cnorm(k, 0.0f);
  if constexpr (kL2)
    for (uint32_t c = 0; c < k; ++c) cnorm[c] = squared_norm(centroids + size_t{c} * dim, dim);
  auto centroid = [&](size_t c) { return centroids + std::min<size_t>(c, k - 1) * dim; };
  // Centroid block: about 96 KiB, a multiple of 4.
  const size_t block =
      std::max<size_t>(4, ((size_t{96} << 10) / (size_t{dim} * sizeof(float))) & ~size_t{3});
  const int64_t tiles = static_cast<int64_t>((n + kTile - 1) / kTile);
#pragma omp parallel if (worth_parallel(n * k * dim))
  {
    std::vector<float> buf(kTile * k);
    float xnorm[kTile];
#pragma omp for schedule(dynamic, 8)
    for (int64_t t = 0; t < tiles; ++t) {
      const size_t begin = static_cast<size_t>(t) * kTile;
      const size_t m = std::min(kTile, n - begin);
      if constexpr (kL2)
        for (size_t r = 0; r < m; ++r) xnorm[r] = squared_norm(rows.row(begin + r), dim);
      for (size_t cb = 0; cb < k; cb += block) {
        const size_t ce = std::min<size_t>(k, cb + block);
        for (size_t r = 0; r < m; r += 4) {
          const float* x[4];
          for (size_t q = 0; q < 4; ++q) x[q] = rows.row(begin + std::min(r + q, m - 1));
          const size_t vr = std::min<size_t>(4, m - r);
          for (size_t c = cb; c < ce; c += 4) {
            float dot[16];
            dot44(x[0], x[1], x[2], x[3], centroid(c), centroid(c + 1), centroid(c + 2),
                  centroid(c + 3), dim, dot);
            const size_t vc = std::min<size_t>(4, ce - c);
            for (size_t q = 0; q < vr; ++q) {
              float* out = buf.data() + (r + q) * k + c;
              for (size_t w = 0; w < vc; ++w) {
                float d;
                if constexpr (kL2)
                  d = std::max(0.0f, xnorm[r + q] + cnorm[c + w] - 2.0f * dot[4 * q + w]);
                else
                  d = 1.0f - dot[4 * q + w];
                // NaN (from NaN or infinite input) would break the orderings below.
                out[w] = std::isnan(d) ? std::numeric_limits<float>::infinity() : d;
              }
            }
          }
        }
      }
      for (size_t r = 0; r < m; ++r)
        select_top(buf.data() + r * k, k, L, ids.data() + (begin + r) * L,
                   dists.data() + (begin + r) * L);
    }
  }
}

inline void nearest(bool l2, const Rows& rows, const float* centroids, uint32_t k, uint32_t L,
             std::vector<uint32_t>& ids, std::vector<float>& dists) {
  if (l2)
    nearest_pass<true>(rows, centroids, k, L, ids, dists);
  else
    nearest_pass<false>(rows, centroids, k, L, ids, dists);
}

/// dist[i] = min(dist[i], distance(row i, centre)).
template <bool kL2>
void lower_nearest(const Rows& rows, const float* centre, std::vector<float>& dist) {
  const size_t n = rows.count;
  const int64_t groups = static_cast<int64_t>((n + 3) / 4);
#pragma omp parallel for schedule(static) if (worth_parallel(n * rows.dim))
  for (int64_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * 4;
    const size_t valid = std::min<size_t>(4, n - begin);
    const float* x[4];
    for (size_t j = 0; j < 4; ++j) x[j] = rows.row(begin + std::min(j, valid - 1));
    float out[4];
    tile4<kL2>(x[0], x[1], x[2], x[3], centre, rows.dim, out);
    for (size_t j = 0; j < valid; ++j) dist[begin + j] = std::min(dist[begin + j], out[j]);
  }
}

}  // namespace dmhnsw::router::kmeans_detail
