// The workload file format (docs/formats.md): its sections, checksum, writer and checked reader.
#include "common/workload.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

namespace dmhnsw {

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
