// Workload generation: query streams over a pool (uniform, Zipf, clustered hot sets) and their
// statistics. The file format is in workload_file.cpp.
#include "common/workload.hpp"

#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>

namespace dmhnsw {

// ---------------------------------------------------------------------------------------------
// random numbers

std::uint64_t Rng::uniform(std::uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::uniform: n must be >= 1");
  // Lemire, "Fast random integer generation in an interval" (2019).
  std::uint64_t x = engine_();
  unsigned __int128 m = static_cast<unsigned __int128>(x) * n;
  std::uint64_t low = static_cast<std::uint64_t>(m);
  if (low < n) {
    const std::uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      x = engine_();
      m = static_cast<unsigned __int128>(x) * n;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u = 0, v = 0, s = 0;
  do {
    u = 2.0 * uniform01() - 1.0;
    v = 2.0 * uniform01() - 1.0;
    s = u * u + v * v;
  } while (s >= 1.0 || s == 0.0);
  const double m = std::sqrt(-2.0 * std::log(s) / s);
  spare_ = v * m;
  has_spare_ = true;
  return u * m;
}

std::vector<std::uint32_t> random_permutation(std::size_t n, Rng& rng) {
  if (n > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument("random_permutation: n does not fit uint32");
  std::vector<std::uint32_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint32_t>(i);
  for (std::size_t i = n; i > 1; --i) std::swap(p[i - 1], p[rng.uniform(i)]);
  return p;
}

ZipfSampler::ZipfSampler(std::size_t n, double s) : cdf_(n) {
  if (n == 0) throw std::invalid_argument("ZipfSampler: n must be >= 1");
  if (!(s >= 0.0) || !std::isfinite(s))
    throw std::invalid_argument("ZipfSampler: exponent must be finite and >= 0");
  double sum = 0.0;
  for (std::size_t r = 0; r < n; ++r) {
    sum += std::pow(static_cast<double>(r + 1), -s);
    cdf_[r] = sum;
  }
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;
}

std::size_t ZipfSampler::operator()(Rng& rng) const {
  const double u = rng.uniform01();
  const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  const auto r = static_cast<std::size_t>(it - cdf_.begin());
  return std::min(r, cdf_.size() - 1);
}

// ---------------------------------------------------------------------------------------------
// distributions

Distribution Distribution::parse(std::string_view text) {
  const std::string t(text);
  if (t == "uniform") return {};
  Distribution d;
  std::string_view param;
  if (text.starts_with("zipf:")) {
    d.kind = Kind::Zipf;
    param = text.substr(5);
  } else if (text.starts_with("hot-clusters:")) {
    d.kind = Kind::HotClusters;
    param = text.substr(13);
  } else {
    throw std::invalid_argument("unknown distribution '" + t +
                                "' (expected uniform, zipf:S or hot-clusters:S)");
  }
  double s = 0.0;
  const auto [end, ec] = std::from_chars(param.data(), param.data() + param.size(), s);
  if (param.empty() || ec != std::errc() || end != param.data() + param.size() ||
      !std::isfinite(s) || s < 0.0 || s > 100.0)
    throw std::invalid_argument("distribution '" + t +
                                "': exponent S must be a number in [0, 100]");
  d.s = s;
  return d;
}

std::string Distribution::to_string() const {
  if (kind == Kind::Uniform) return "uniform";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, s);
  const std::string num(buf, res.ptr);
  return (kind == Kind::Zipf ? "zipf:" : "hot-clusters:") + num;
}

// ---------------------------------------------------------------------------------------------
// generation

namespace {

std::uint64_t total_of(const WorkloadSpec& spec) {
  if (spec.count == 0) throw std::invalid_argument("workload: measured count must be >= 1");
  std::uint64_t total = 0;
  if (__builtin_add_overflow(spec.warmup, spec.count, &total) || total > kMaxQueries)
    throw std::invalid_argument("workload: warmup + count too large");
  return total;
}

/// k-means cluster of every pool vector (Faiss, seeded).
std::vector<faiss::Index::idx_t> cluster_pool(const FloatMatrix& pool, std::size_t k,
                                              std::uint64_t seed) {
  const FloatMatrix owned = pool.contiguous() ? FloatMatrix() : pool.copy();
  const float* x = pool.contiguous() ? pool.data() : owned.data();
  const auto n = static_cast<faiss::Index::idx_t>(pool.n());
  const int d = static_cast<int>(pool.d());

  faiss::ClusteringParameters cp;
  cp.niter = 20;
  cp.verbose = false;
  cp.min_points_per_centroid = 1;  // no warning for small pools
  cp.seed = static_cast<int>(seed % static_cast<std::uint64_t>(INT_MAX));
  faiss::Clustering clustering(d, static_cast<int>(k), cp);
  faiss::IndexFlatL2 index(d);
  clustering.train(n, x, index);  // leaves the final centroids in index

  std::vector<float> distances(pool.n());
  std::vector<faiss::Index::idx_t> labels(pool.n());
  index.search(n, x, 1, distances.data(), labels.data());
  return labels;
}

}  // namespace

std::vector<std::uint32_t> generate_stream(const FloatMatrix& pool, const WorkloadSpec& spec,
                                           std::uint32_t* clusters_used) {
  const std::uint64_t total = total_of(spec);
  const std::size_t n = pool.n();
  if (n == 0) throw std::invalid_argument("workload: the query pool is empty");
  if (n > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument("workload: query pool larger than 2^32 - 1");
  if (clusters_used != nullptr) *clusters_used = 0;

  Rng rng(spec.seed);
  std::vector<std::uint32_t> stream(total);
  const Distribution& dist = spec.distribution;
  switch (dist.kind) {
    case Distribution::Kind::Uniform:
      for (auto& q : stream) q = static_cast<std::uint32_t>(rng.uniform(n));
      break;
    case Distribution::Kind::Zipf: {
      const std::vector<std::uint32_t> perm = random_permutation(n, rng);
      const ZipfSampler zipf(n, dist.s);
      for (auto& q : stream) q = perm[zipf(rng)];
      break;
    }
    case Distribution::Kind::HotClusters: {
      std::size_t k = spec.clusters;
      if (k == 0)
        k = std::clamp<std::size_t>(
            static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(n)))), 1, 4096);
      if (k > n)
        throw std::invalid_argument("workload: " + std::to_string(k) +
                                    " clusters for a pool of " + std::to_string(n) + " queries");
      const auto labels = cluster_pool(pool, k, spec.seed);
      std::vector<std::vector<std::uint32_t>> members(k);
      for (std::size_t i = 0; i < n; ++i) {
        const auto c = labels[i];
        if (c < 0 || static_cast<std::size_t>(c) >= k)
          throw std::runtime_error("workload: k-means returned an invalid cluster label");
        members[static_cast<std::size_t>(c)].push_back(static_cast<std::uint32_t>(i));
      }
      std::erase_if(members, [](const auto& m) { return m.empty(); });
      const std::vector<std::uint32_t> perm = random_permutation(members.size(), rng);
      const ZipfSampler zipf(members.size(), dist.s);
      for (auto& q : stream) {
        const auto& m = members[perm[zipf(rng)]];
        q = m[rng.uniform(m.size())];
      }
      if (clusters_used != nullptr) *clusters_used = static_cast<std::uint32_t>(members.size());
      break;
    }
  }
  return stream;
}

Workload generate_workload(const FloatMatrix& pool, const IdMatrix& groundtruth,
                           const WorkloadSpec& spec) {
  if (groundtruth.n() != pool.n())
    throw std::invalid_argument("workload: ground truth has " + std::to_string(groundtruth.n()) +
                                " rows but the query pool has " + std::to_string(pool.n()));
  if (pool.d() == 0 || pool.d() > kMaxDim)
    throw std::invalid_argument("workload: pool dimension out of range");
  if (groundtruth.d() == 0) throw std::invalid_argument("workload: ground truth has k=0");
  const std::size_t k = spec.gt_k == 0 ? groundtruth.d() : spec.gt_k;
  if (k > groundtruth.d())
    throw std::invalid_argument("workload: gt_k=" + std::to_string(k) +
                                " exceeds the ground truth's k=" +
                                std::to_string(groundtruth.d()));

  Workload w;
  w.distribution = spec.distribution.to_string();
  w.seed = spec.seed;
  w.warmup_count = spec.warmup;
  w.measured_count = spec.count;
  w.pool_size = pool.n();
  w.pool_index = generate_stream(pool, spec, &w.clusters);
  const std::size_t total = w.pool_index.size();
  w.queries = FloatMatrix(total, pool.d());
  w.groundtruth = IdMatrix(total, k);
  for (std::size_t i = 0; i < total; ++i) {
    const std::uint32_t p = w.pool_index[i];
    std::copy_n(pool.row(p), pool.d(), w.queries.mutable_row(i));
    std::copy_n(groundtruth.row(p), k, w.groundtruth.mutable_row(i));
  }
  return w;
}

WorkloadStats summarize(std::span<const std::uint32_t> pool_index, std::uint64_t pool_size) {
  WorkloadStats st;
  st.queries = pool_index.size();
  st.top_count = std::max<std::uint64_t>(1, (pool_size + 99) / 100);
  if (pool_index.empty()) return st;
  std::vector<std::uint32_t> sorted(pool_index.begin(), pool_index.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint64_t> freq;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    freq.push_back(j - i);
    i = j;
  }
  st.distinct = freq.size();
  std::sort(freq.begin(), freq.end(), std::greater<>());
  st.max_frequency = freq.front();
  std::uint64_t top = 0;
  for (std::size_t i = 0; i < freq.size() && i < st.top_count; ++i) top += freq[i];
  st.top1pct_share = static_cast<double>(top) / static_cast<double>(st.queries);
  return st;
}

WorkloadStats summarize(const Workload& workload) {
  return summarize(workload.pool_index, workload.pool_size);
}

}  // namespace dmhnsw
