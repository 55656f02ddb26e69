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

constexpr std::uint64_t kMaxQueries = std::uint64_t{1} << 40;

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

// ---------------------------------------------------------------------------------------------
// file format

namespace {

/// Word-wise hash: every step is a bijection of the state, so any single corrupted 8-byte
/// word always changes the result.
class Hasher {
 public:
  void update(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    length_ += n;
    if (fill_ > 0) {
      const std::size_t take = std::min(n, 8 - fill_);
      std::memcpy(buffer_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ < 8) return;
      flush_buffer();
    }
    for (; n >= 8; p += 8, n -= 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      mix(w);
    }
    std::memcpy(buffer_, p, n);
    fill_ = n;
  }
  void zeros(std::size_t n) {
    static constexpr unsigned char z[64] = {};
    while (n > 0) {
      const std::size_t c = std::min(n, sizeof z);
      update(z, c);
      n -= c;
    }
  }
  std::uint64_t finish() {
    if (fill_ > 0) {
      std::fill(buffer_ + fill_, buffer_ + 8, 0);
      flush_buffer();
    }
    mix(length_);
    std::uint64_t h = state_;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
  }

 private:
  void mix(std::uint64_t w) {
    state_ ^= w;
    state_ *= 0x100000001b3ULL;
    state_ ^= state_ >> 32;
  }
  void flush_buffer() {
    std::uint64_t w;
    std::memcpy(&w, buffer_, 8);
    mix(w);
    fill_ = 0;
  }
  std::uint64_t state_ = 0xcbf29ce484222325ULL;
  std::uint64_t length_ = 0;
  unsigned char buffer_[8] = {};
  std::size_t fill_ = 0;
};

constexpr std::uint64_t align64(std::uint64_t x) { return (x + 63) & ~std::uint64_t{63}; }

struct Sections {
  std::uint64_t index_offset = 0, vectors_offset = 0, groundtruth_offset = 0, file_size = 0;
};

/// Section offsets for a shape; false on overflow.
bool layout_for(std::uint64_t total, std::uint64_t dim, std::uint64_t k, Sections& s) {
  std::uint64_t index_bytes = 0, vec_bytes = 0, gt_bytes = 0, end = 0;
  if (__builtin_mul_overflow(total, std::uint64_t{4}, &index_bytes)) return false;
  if (__builtin_mul_overflow(total, dim * 4, &vec_bytes)) return false;
  if (__builtin_mul_overflow(total, k * 4, &gt_bytes)) return false;
  s.index_offset = sizeof(WorkloadHeader);
  if (__builtin_add_overflow(s.index_offset, index_bytes, &end) || end > (UINT64_MAX >> 2))
    return false;
  s.vectors_offset = align64(end);
  if (__builtin_add_overflow(s.vectors_offset, vec_bytes, &end) || end > (UINT64_MAX >> 2))
    return false;
  s.groundtruth_offset = align64(end);
  if (__builtin_add_overflow(s.groundtruth_offset, gt_bytes, &end)) return false;
  s.file_size = end;
  return true;
}

/// Feeds the file's bytes, in order, to sink(const void*, size_t); the header's checksum
/// field is emitted as given in h.
template <typename Sink>
void emit(const WorkloadHeader& h, const Workload& w, Sink&& sink) {
  static constexpr unsigned char zero[64] = {};
  std::uint64_t pos = 0;
  auto put = [&](const void* p, std::size_t n) {
    sink(p, n);
    pos += n;
  };
  auto pad_to = [&](std::uint64_t off) {
    while (pos < off) put(zero, static_cast<std::size_t>(std::min<std::uint64_t>(off - pos, 64)));
  };
  put(&h, sizeof h);
  pad_to(h.index_offset);
  put(w.pool_index.data(), w.pool_index.size() * sizeof(std::uint32_t));
  pad_to(h.vectors_offset);
  for (std::size_t i = 0; i < w.queries.n(); ++i) put(w.queries.row(i), w.dim() * sizeof(float));
  pad_to(h.groundtruth_offset);
  for (std::size_t i = 0; i < w.groundtruth.n(); ++i)
    put(w.groundtruth.row(i), w.k() * sizeof(std::int32_t));
}

void check_workload(const std::string& path, const Workload& w) {
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument(path + ": cannot write workload: " + why);
  };
  const std::uint64_t total = w.total();
  if (w.measured_count == 0) bad("measured_count is 0");
  if (w.pool_index.size() != total) bad("pool_index size != warmup + measured");
  if (w.queries.n() != total || w.groundtruth.n() != total) bad("row counts != warmup + measured");
  if (w.dim() == 0 || w.dim() > kMaxDim) bad("dimension out of range");
  if (w.k() == 0 || w.k() > kMaxDim) bad("ground-truth k out of range");
  if (w.pool_size == 0 || w.pool_size > (std::uint64_t{1} << 32)) bad("pool_size out of range");
  if (w.distribution.size() >= sizeof(WorkloadHeader::distribution)) bad("distribution too long");
  (void)Distribution::parse(w.distribution);
  for (std::size_t i = 0; i < total; ++i) {
    if (w.pool_index[i] >= w.pool_size) bad("pool index out of range at query " + std::to_string(i));
    const float* q = w.queries.row(i);
    for (std::size_t j = 0; j < w.dim(); ++j)
      if (!std::isfinite(q[j])) bad("non-finite value in query " + std::to_string(i));
    const std::int32_t* g = w.groundtruth.row(i);
    for (std::size_t j = 0; j < w.k(); ++j)
      if (g[j] < 0) bad("negative ground-truth id in query " + std::to_string(i));
  }
}

}  // namespace

void write_workload(const std::string& path, const Workload& w) {
  check_workload(path, w);
  WorkloadHeader h{};
  std::memcpy(h.magic, kWorkloadMagic.data(), sizeof h.magic);
  h.version = kWorkloadVersion;
  h.header_size = sizeof(WorkloadHeader);
  h.warmup_count = w.warmup_count;
  h.measured_count = w.measured_count;
  h.dim = static_cast<std::uint32_t>(w.dim());
  h.gt_k = static_cast<std::uint32_t>(w.k());
  h.seed = w.seed;
  h.pool_size = w.pool_size;
  Sections s;
  if (!layout_for(w.total(), w.dim(), w.k(), s))
    throw std::invalid_argument(path + ": workload too large");
  h.index_offset = s.index_offset;
  h.vectors_offset = s.vectors_offset;
  h.groundtruth_offset = s.groundtruth_offset;
  h.file_size = s.file_size;
  std::memcpy(h.distribution, w.distribution.data(), w.distribution.size());
  h.clusters = w.clusters;
  h.checksum = 0;

  Hasher hasher;
  emit(h, w, [&](const void* p, std::size_t n) { hasher.update(p, n); });
  h.checksum = hasher.finish();

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error(tmp + ": cannot create: " + std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, &std::fclose);
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  bool ok = true;
  std::string err;
  emit(h, w, [&](const void* p, std::size_t n) {
    if (ok && std::fwrite(p, 1, n, f) != n) {
      ok = false;
      err = std::strerror(errno);
    }
  });
  if (ok && std::fflush(f) != 0) {
    ok = false;
    err = std::strerror(errno);
  }
  if (std::fclose(guard.release()) != 0 && ok) {
    ok = false;
    err = std::strerror(errno);
  }
  if (!ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error(tmp + ": write failed: " + err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename " + tmp + " to it: " + e);
  }
}

Workload read_workload(const std::string& path, bool allow_view) {
  auto file = std::make_shared<MappedFile>(path);
  const std::uint64_t size = file->size();
  auto fail = [&](std::uint64_t offset, const std::string& why) -> void {
    throw FormatError(path, offset, "workload file: " + why);
  };
  if (size < sizeof(WorkloadHeader))
    fail(0, "file has " + std::to_string(size) + " bytes, smaller than the " +
                std::to_string(sizeof(WorkloadHeader)) + "-byte header (truncated?)");
  WorkloadHeader h;
  std::memcpy(&h, file->data(), sizeof h);
  if (std::memcmp(h.magic, kWorkloadMagic.data(), sizeof h.magic) != 0)
    fail(0, "bad magic (not a dmhnsw workload file)");
  if (h.version != kWorkloadVersion)
    fail(offsetof(WorkloadHeader, version),
         "unsupported version " + std::to_string(h.version) + " (this build reads version " +
             std::to_string(kWorkloadVersion) + ")");
  if (h.header_size != sizeof(WorkloadHeader))
    fail(offsetof(WorkloadHeader, header_size),
         "header_size " + std::to_string(h.header_size) + " != " +
             std::to_string(sizeof(WorkloadHeader)));
  if (h.measured_count == 0) fail(offsetof(WorkloadHeader, measured_count), "measured_count is 0");
  std::uint64_t total = 0;
  if (__builtin_add_overflow(h.warmup_count, h.measured_count, &total) || total > kMaxQueries)
    fail(offsetof(WorkloadHeader, warmup_count), "warmup_count + measured_count too large");
  if (h.dim == 0 || h.dim > kMaxDim)
    fail(offsetof(WorkloadHeader, dim), "dimension " + std::to_string(h.dim) + " out of range");
  if (h.gt_k == 0 || h.gt_k > kMaxDim)
    fail(offsetof(WorkloadHeader, gt_k), "ground-truth k " + std::to_string(h.gt_k) +
                                             " out of range");
  if (h.pool_size == 0 || h.pool_size > (std::uint64_t{1} << 32))
    fail(offsetof(WorkloadHeader, pool_size), "pool_size " + std::to_string(h.pool_size) +
                                                  " out of range");
  Sections s;
  if (!layout_for(total, h.dim, h.gt_k, s)) fail(offsetof(WorkloadHeader, warmup_count), "counts overflow");
  if (h.index_offset != s.index_offset)
    fail(offsetof(WorkloadHeader, index_offset), "index_offset inconsistent with the counts");
  if (h.vectors_offset != s.vectors_offset)
    fail(offsetof(WorkloadHeader, vectors_offset), "vectors_offset inconsistent with the counts");
  if (h.groundtruth_offset != s.groundtruth_offset)
    fail(offsetof(WorkloadHeader, groundtruth_offset),
         "groundtruth_offset inconsistent with the counts");
  if (h.file_size != s.file_size)
    fail(offsetof(WorkloadHeader, file_size), "file_size inconsistent with the counts");
  if (size < s.file_size)
    fail(size, "file ends here but the header needs " + std::to_string(s.file_size) +
                   " bytes (truncated)");
  if (size > s.file_size)
    fail(s.file_size, std::to_string(size - s.file_size) + " trailing bytes");
  const void* nul = std::memchr(h.distribution, '\0', sizeof h.distribution);
  if (nul == nullptr) fail(offsetof(WorkloadHeader, distribution), "distribution not terminated");
  const std::string distribution(h.distribution);
  try {
    (void)Distribution::parse(distribution);
  } catch (const std::invalid_argument& e) {
    fail(offsetof(WorkloadHeader, distribution), e.what());
  }

  // Zero as written: a later version may give them a meaning this build would ignore.
  if (h.reserved32 != 0) fail(offsetof(WorkloadHeader, reserved32), "reserved field is not zero");
  for (std::size_t i = 0; i < std::size(h.reserved); ++i)
    if (h.reserved[i] != 0) fail(offsetof(WorkloadHeader, reserved) + 8 * i, "reserved field is not zero");

  Hasher hasher;
  hasher.update(file->data(), offsetof(WorkloadHeader, checksum));
  hasher.zeros(sizeof h.checksum);
  const std::uint64_t after = offsetof(WorkloadHeader, checksum) + sizeof h.checksum;
  hasher.update(file->data() + after, static_cast<std::size_t>(size - after));
  if (hasher.finish() != h.checksum)
    fail(offsetof(WorkloadHeader, checksum), "checksum mismatch (corrupted file)");

  Workload w;
  w.distribution = distribution;
  w.seed = h.seed;
  w.warmup_count = h.warmup_count;
  w.measured_count = h.measured_count;
  w.pool_size = h.pool_size;
  w.clusters = h.clusters;
  w.pool_index.resize(total);
  std::memcpy(w.pool_index.data(), file->data() + s.index_offset, total * sizeof(std::uint32_t));
  for (std::uint64_t i = 0; i < total; ++i)
    if (w.pool_index[i] >= h.pool_size)
      fail(s.index_offset + 4 * i, "pool index " + std::to_string(w.pool_index[i]) +
                                       " >= pool_size " + std::to_string(h.pool_size));
  const auto* vec = reinterpret_cast<const float*>(file->data() + s.vectors_offset);
  for (std::uint64_t i = 0; i < total * h.dim; ++i)
    if (!std::isfinite(vec[i])) fail(s.vectors_offset + 4 * i, "non-finite query value");
  const auto* gt = reinterpret_cast<const std::int32_t*>(file->data() + s.groundtruth_offset);
  for (std::uint64_t i = 0; i < total * h.gt_k; ++i)
    if (gt[i] < 0) fail(s.groundtruth_offset + 4 * i, "negative ground-truth id");

  std::shared_ptr<const void> owner(file);
  w.queries = FloatMatrix::view(owner, vec, total, h.dim, h.dim);
  w.groundtruth = IdMatrix::view(owner, gt, total, h.gt_k, h.gt_k);
  if (!allow_view) {
    w.queries = w.queries.copy();
    w.groundtruth = w.groundtruth.copy();
  }
  return w;
}

}  // namespace dmhnsw
