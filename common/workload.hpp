// Query workloads: a stream of queries drawn from a query pool (uniform, Zipf or hot clusters),
// with a warm-up part followed by a measured part, stored in a versioned binary file.
//
// File layout (little-endian), version 1:
//   [WorkloadHeader, 256 bytes]
//   [pool index of each query: uint32 x total]                 at header.index_offset
//   [query vectors: float32 x dim x total]                     at header.vectors_offset
//   [ground-truth ids: int32 x gt_k x total]                   at header.groundtruth_offset
// total = warmup_count + measured_count; sections start at 64-byte aligned offsets (zero
// padding); header.checksum covers the whole file with the checksum field taken as zero.
//
// Generation is deterministic by seed: std::mt19937_64 plus this project's own distribution
// code (Rng below), never std::*_distribution, whose outputs differ between standard libraries.
// hot-clusters additionally runs Faiss k-means (seeded), which is deterministic for a given
// Faiss/BLAS build and thread count.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/dataset.hpp"

namespace dmhnsw {

// ---------------------------------------------------------------------------------------------
// deterministic random numbers (also used by tools/datagen)

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  std::uint64_t next() { return engine_(); }
  /// Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject); n >= 1.
  std::uint64_t uniform(std::uint64_t n);
  /// Uniform double in [0, 1) with 53 random bits.
  double uniform01() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  /// Standard normal (Marsaglia's polar method).
  double normal();

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

/// Fisher-Yates permutation of [0, n).
std::vector<std::uint32_t> random_permutation(std::size_t n, Rng& rng);

/// Zipf over ranks 0..n-1: P(rank r) proportional to 1 / (r+1)^s (s >= 0).
class ZipfSampler {
 public:
  ZipfSampler(std::size_t n, double s);
  std::size_t operator()(Rng& rng) const;
  std::size_t size() const noexcept { return cdf_.size(); }

 private:
  std::vector<double> cdf_;
};

// ---------------------------------------------------------------------------------------------
// distributions and generation

struct Distribution {
  enum class Kind { Uniform, Zipf, HotClusters };
  Kind kind = Kind::Uniform;
  double s = 0.0;  // Zipf exponent (zipf, hot-clusters)

  /// "uniform", "zipf:S", "hot-clusters:S" (0 <= S <= 100); std::invalid_argument otherwise.
  static Distribution parse(std::string_view text);
  /// Canonical text, e.g. "zipf:1.25".
  std::string to_string() const;
};

struct WorkloadSpec {
  Distribution distribution;
  std::uint64_t warmup = 0;   // warm-up queries (may be 0)
  std::uint64_t count = 0;    // measured queries (>= 1)
  std::uint64_t seed = 0;
  std::size_t clusters = 0;   // hot-clusters: k-means clusters; 0 = auto (~sqrt(pool size))
  std::size_t gt_k = 0;       // ground-truth ids kept per query; 0 = all the ground truth has
};

struct Workload {
  std::string distribution;  // canonical Distribution text
  std::uint64_t seed = 0;
  std::uint64_t warmup_count = 0;
  std::uint64_t measured_count = 0;
  std::uint64_t pool_size = 0;
  std::uint32_t clusters = 0;  // hot-clusters: clusters used (non-empty); 0 otherwise
  std::vector<std::uint32_t> pool_index;  // per query: its row in the query pool
  FloatMatrix queries;                    // total x dim (a view into the file after reading)
  IdMatrix groundtruth;                   // total x k

  std::uint64_t total() const noexcept { return warmup_count + measured_count; }
  std::size_t dim() const noexcept { return queries.d(); }
  std::size_t k() const noexcept { return groundtruth.d(); }
  /// Entries [0, warmup_count) are the warm-up, the rest is measured.
  bool is_warmup(std::uint64_t i) const noexcept { return i < warmup_count; }
};

/// The pool index of each query (warm-up then measured). clusters_used receives the number
/// of non-empty clusters for hot-clusters (0 otherwise) when not null.
std::vector<std::uint32_t> generate_stream(const FloatMatrix& pool, const WorkloadSpec& spec,
                                           std::uint32_t* clusters_used = nullptr);

/// Full workload: the stream plus each query's vector and ground truth. groundtruth must have
/// one row per pool vector. std::invalid_argument on inconsistent inputs.
Workload generate_workload(const FloatMatrix& pool, const IdMatrix& groundtruth,
                           const WorkloadSpec& spec);

struct WorkloadStats {
  std::uint64_t queries = 0;        // stream length
  std::uint64_t distinct = 0;       // distinct pool entries in the stream
  std::uint64_t top_count = 0;      // size of the "top 1%": max(1, ceil(pool_size / 100))
  double top1pct_share = 0.0;       // share of the stream taken by the top_count most frequent
  std::uint64_t max_frequency = 0;  // occurrences of the most frequent query
};
WorkloadStats summarize(std::span<const std::uint32_t> pool_index, std::uint64_t pool_size);
/// Over the whole stream (warm-up and measured).
WorkloadStats summarize(const Workload& workload);

// ---------------------------------------------------------------------------------------------
// file format

inline constexpr std::array<char, 8> kWorkloadMagic = {'D', 'M', 'H', 'W', 'L', 'D', '\x1a', '\n'};
inline constexpr std::uint32_t kWorkloadVersion = 1;
/// Queries a workload may hold (warm-up + measured): generated or read.
inline constexpr std::uint64_t kMaxQueries = std::uint64_t{1} << 40;

struct WorkloadHeader {
  char magic[8];                     // kWorkloadMagic
  std::uint32_t version;             // kWorkloadVersion
  std::uint32_t header_size;         // sizeof(WorkloadHeader)
  std::uint64_t warmup_count;
  std::uint64_t measured_count;      // >= 1
  std::uint32_t dim;                 // 1..kMaxDim
  std::uint32_t gt_k;                // 1..kMaxDim
  std::uint64_t seed;
  std::uint64_t pool_size;           // 1..2^32
  std::uint64_t index_offset;        // uint32 x total
  std::uint64_t vectors_offset;      // float32 x dim x total
  std::uint64_t groundtruth_offset;  // int32 x gt_k x total
  std::uint64_t file_size;
  std::uint64_t checksum;            // over the file with this field zero
  char distribution[64];             // canonical text, NUL-terminated
  std::uint32_t clusters;
  std::uint32_t reserved32;          // zero
  std::uint64_t reserved[11];        // zero
};
static_assert(std::is_trivially_copyable_v<WorkloadHeader>);
static_assert(std::is_standard_layout_v<WorkloadHeader>);
static_assert(sizeof(WorkloadHeader) == 256);
static_assert(offsetof(WorkloadHeader, version) == 8);
static_assert(offsetof(WorkloadHeader, header_size) == 12);
static_assert(offsetof(WorkloadHeader, warmup_count) == 16);
static_assert(offsetof(WorkloadHeader, measured_count) == 24);
static_assert(offsetof(WorkloadHeader, dim) == 32);
static_assert(offsetof(WorkloadHeader, gt_k) == 36);
static_assert(offsetof(WorkloadHeader, seed) == 40);
static_assert(offsetof(WorkloadHeader, pool_size) == 48);
static_assert(offsetof(WorkloadHeader, index_offset) == 56);
static_assert(offsetof(WorkloadHeader, vectors_offset) == 64);
static_assert(offsetof(WorkloadHeader, groundtruth_offset) == 72);
static_assert(offsetof(WorkloadHeader, file_size) == 80);
static_assert(offsetof(WorkloadHeader, checksum) == 88);
static_assert(offsetof(WorkloadHeader, distribution) == 96);
static_assert(offsetof(WorkloadHeader, clusters) == 160);
static_assert(offsetof(WorkloadHeader, reserved32) == 164);
static_assert(offsetof(WorkloadHeader, reserved) == 168);

/// Writes to "<path>.tmp" and renames over path. std::invalid_argument if w is inconsistent.
void write_workload(const std::string& path, const Workload& w);
/// Reads and fully validates (magic, version, header bounds, layout, size, checksum, pool
/// indices, finite vectors, ids >= 0); FormatError naming the file and the offset otherwise.
/// queries and groundtruth are views into the mapping unless allow_view is false.
Workload read_workload(const std::string& path, bool allow_view = true);

}  // namespace dmhnsw
