#pragma once
// Compressed vectors, so that a search reads fewer bytes per node: a quantizer trained with
// Faiss (SQ8: faiss::ScalarQuantizer QT_8bit; PQ: faiss::ProductQuantizer, M sub-quantizers of
// 8 bits) and the block that stores it with the index in a memnode's region, so that every
// computenode encodes and compares with the same one. The block (docs/formats.md "codes block"):
//
//   [CodesHeader: magic "DMCODES1", version, kind, dim, code_size, payload bytes, checksum]
//   [payload: the quantizer as Faiss writes an empty IndexScalarQuantizer / IndexPQ]
//
// The checksum (common/checksum.hpp) covers the payload; the header's fields are checked against
// it and each other before Faiss reads a byte.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/distance.hpp"

namespace faiss {
struct Index;
struct FlatCodesDistanceComputer;
}  // namespace faiss

namespace dmhnsw::compute {

enum class CodeKind : uint32_t { None = 0, Sq8 = 1, Pq = 2 };

/// What --codes asks for: none, sq8 or pq:M (M sub-quantizers of 8 bits; M divides the dimension).
struct CodesSpec {
  CodeKind kind = CodeKind::None;
  uint32_t pq_m = 0;
  bool enabled() const { return kind != CodeKind::None; }
  std::string to_string() const;
};
/// Parses --codes; throws std::invalid_argument naming the flag and the text.
CodesSpec parse_codes(const std::string& text);

struct CodesHeader {
  char magic[8];  // "DMCODES1"
  uint32_t version;
  uint32_t kind;  // CodeKind
  uint32_t dim;
  uint32_t code_size;  // bytes per vector
  uint32_t metric;     // 0 l2, 1 ip
  uint32_t reserved0;
  uint64_t payload_bytes;
  uint64_t checksum;  // checksum64 of the payload
  uint64_t reserved[2];
};
static_assert(sizeof(CodesHeader) == 64 && std::is_trivially_copyable_v<CodesHeader>);
static_assert(offsetof(CodesHeader, kind) == 12 && offsetof(CodesHeader, payload_bytes) == 32 &&
              offsetof(CodesHeader, checksum) == 40);
inline constexpr uint32_t kCodesVersion = 1;
/// A block larger than this is not one we wrote (SQ8 of 65,536 dimensions is ~0.5 MiB, PQ's
/// centroids 256 x dim floats).
inline constexpr uint64_t kMaxCodesBlock = 256ull << 20;

/// One query's distances to codes, on the scale of common/distance.hpp (squared L2, or 1 - <q, x>
/// for ip): approximate, comparable with exact distances. One per query and thread.
class CodeDistance {
 public:
  CodeDistance(std::unique_ptr<faiss::FlatCodesDistanceComputer> dc, bool ip);
  /// SQ8 (Faiss's per-dimension range: x_i = vmin_i + (c_i + 0.5) / 255 * vdiff_i), computed
  /// here with the query folded in: l2 sum (a_i - c_i s_i)^2, ip 1 - (k + sum b_i c_i).
  CodeDistance(const float* q, const std::vector<float>& trained, uint32_t dim, bool ip);
  ~CodeDistance();
  float operator()(const uint8_t* code) const;

 private:
  std::unique_ptr<faiss::FlatCodesDistanceComputer> dc_;
  bool ip_;
  std::vector<float> a_, s_;  // SQ8: per dimension (l2: offset and step; ip: b in a_)
  float k_ = 0;
};

/// Rows a quantizer is trained on at most: a sample is enough, and both modes' builds and the
/// import train on the same number.
inline constexpr size_t kCodesTrainRows = 65536;

class Quantizer {
 public:
  /// Trains on up to kCodesTrainRows of n rows, spread evenly over them (row floor(j n / rows)
  /// for j < rows); `row(i)` gives row i's dim floats.
  static std::shared_ptr<const Quantizer> train_spread(const CodesSpec& spec, size_t n, uint32_t dim, Metric metric,
                                                       const std::function<const float*(size_t)>& row);
  /// Trains on n x dim vectors (a sample is enough: SQ8 learns each dimension's range, PQ runs
  /// k-means with 256 centroids per sub-space). Throws std::invalid_argument on a bad spec.
  static std::shared_ptr<const Quantizer> train(const CodesSpec& spec, const float* x, size_t n, uint32_t dim,
                                                Metric metric);
  /// Reads and checks a block as stored at region offset `offset` of `where` (e.g. "memnode 0");
  /// throws std::runtime_error naming them and the offset of the first bad field.
  static std::shared_ptr<const Quantizer> load(const char* block, size_t len, const std::string& where,
                                               uint64_t offset);
  ~Quantizer();

  /// The block: header and payload.
  std::vector<char> serialize() const;
  CodesSpec spec() const { return spec_; }
  uint32_t dim() const { return dim_; }
  Metric metric() const { return metric_; }
  size_t code_size() const { return code_size_; }
  /// n vectors into n x code_size() bytes.
  void encode(const float* x, size_t n, uint8_t* codes) const;
  /// n codes back into n x dim floats (approximately).
  void decode(const uint8_t* codes, size_t n, float* x) const;
  /// Distances from query `q` (dim floats) to codes (Faiss's distance computer: SQ8 decodes on
  /// the fly, PQ looks up its per-query tables).
  std::unique_ptr<CodeDistance> distance_to(const float* q) const;

 private:
  Quantizer() = default;
  CodesSpec spec_;
  uint32_t dim_ = 0;
  Metric metric_ = Metric::L2;
  size_t code_size_ = 0;
  std::unique_ptr<faiss::Index> index_;  // IndexScalarQuantizer or IndexPQ, ntotal 0
};

}  // namespace dmhnsw::compute
