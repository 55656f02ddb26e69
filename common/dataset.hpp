// Dataset I/O: readers and writers for the classic *vecs formats and the big-ann *bin formats.
//
// Formats (chosen by file extension):
//   .fvecs .bvecs .ivecs   per vector: int32 d, then d values (float32 / uint8 / int32)
//   .fbin .u8bin .i8bin    header uint32 n, uint32 d, then n*d values (float32 / uint8 / int8)
//   .ibin                  header uint32 n, uint32 k, then n*k int32 ids, optionally followed
//                          by n*k float32 distances (both file sizes are accepted)
//
// Reading goes through mmap. Every malformed input throws FormatError naming the file and the
// byte offset of the problem; a read never returns a silently shortened or garbled matrix.
// When no conversion is needed (e.g. .fvecs/.fbin loaded as float, .ivecs/.ibin as ids) the
// returned Matrix is by default a read-only view into the mapping (LoadOptions::allow_view).
// Such a view keeps the mapping alive; the file must not be truncated while the view exists.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dmhnsw {

/// Largest dimension accepted by every reader and writer.
inline constexpr std::size_t kMaxDim = 65536;

/// Malformed input file. what() is "<path>: byte offset <offset>: <reason>" (or "<path>: <reason>"
/// when no offset applies, e.g. an unknown extension).
class FormatError : public std::runtime_error {
 public:
  FormatError(const std::string& path, std::uint64_t offset, const std::string& reason);
  FormatError(const std::string& path, const std::string& reason);

  const std::string& path() const noexcept { return path_; }
  std::optional<std::uint64_t> offset() const noexcept { return offset_; }

 private:
  std::string path_;
  std::optional<std::uint64_t> offset_;
};

enum class FileFormat { Fvecs, Bvecs, Ivecs, Fbin, U8bin, I8bin, Ibin };
enum class ElementType { F32, U8, I8, I32 };

/// Format from the file name's extension; throws FormatError naming the file if unknown.
FileFormat format_from_path(const std::string& path);
std::string_view to_string(FileFormat format);  // "fvecs", "u8bin", ...
std::string_view to_string(ElementType type);    // "float32", "uint8", "int8", "int32"
ElementType element_type(FileFormat format);
std::size_t element_size(ElementType type);
bool is_vecs(FileFormat format);       // classic per-vector-header layout
bool is_id_format(FileFormat format);  // ivecs, ibin

/// Shape of a file from its header(s) and size, without reading the values.
struct FileShape {
  FileFormat format{};
  std::size_t n = 0;  // rows
  std::size_t d = 0;  // dimension (k for id files)
  bool has_distances = false;  // .ibin with the optional float distance block
  std::uint64_t file_size = 0;
};
FileShape probe(const std::string& path);

/// A read-only memory mapping of a whole file (PROT_READ, MAP_PRIVATE). Empty files map to
/// data() == nullptr, size() == 0. Open/map failures throw std::runtime_error naming the file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

/// Row-major n x d matrix, either owned (std::vector) or a read-only view into shared storage
/// (e.g. an mmap-ed file) with a row stride that may exceed d (the *vecs per-row header).
template <typename T>
class Matrix {
 public:
  Matrix() = default;
  /// Owned, zero-initialised.
  Matrix(std::size_t n, std::size_t d) : storage_(n * d), n_(n), d_(d), stride_(d) { rebase(); }
  /// Owned; values.size() must be n*d.
  Matrix(std::size_t n, std::size_t d, std::vector<T> values)
      : storage_(std::move(values)), n_(n), d_(d), stride_(d) {
    if (storage_.size() != n * d) throw std::invalid_argument("Matrix: values.size() != n*d");
    rebase();
  }
  /// Read-only view of n rows of d values, row i at base + i*stride; owner keeps base alive.
  static Matrix view(std::shared_ptr<const void> owner, const T* base, std::size_t n,
                     std::size_t d, std::size_t stride) {
    Matrix m;
    m.owner_ = std::move(owner);
    m.base_ = base;
    m.n_ = n;
    m.d_ = d;
    m.stride_ = stride;
    return m;
  }

  Matrix(const Matrix& o)
      : storage_(o.storage_), owner_(o.owner_), base_(o.base_), n_(o.n_), d_(o.d_),
        stride_(o.stride_) {
    rebase();
  }
  Matrix(Matrix&& o) noexcept
      : storage_(std::move(o.storage_)), owner_(std::move(o.owner_)), base_(o.base_), n_(o.n_),
        d_(o.d_), stride_(o.stride_) {
    rebase();
    o.reset();
  }
  Matrix& operator=(const Matrix& o) {
    if (this != &o) *this = Matrix(o);
    return *this;
  }
  Matrix& operator=(Matrix&& o) noexcept {
    if (this != &o) {
      storage_ = std::move(o.storage_);
      owner_ = std::move(o.owner_);
      base_ = o.base_;
      n_ = o.n_;
      d_ = o.d_;
      stride_ = o.stride_;
      rebase();
      o.reset();
    }
    return *this;
  }
  ~Matrix() = default;

  std::size_t n() const noexcept { return n_; }
  std::size_t d() const noexcept { return d_; }
  /// Elements between the starts of consecutive rows (== d() when contiguous).
  std::size_t stride() const noexcept { return stride_; }
  bool empty() const noexcept { return n_ == 0; }
  bool contiguous() const noexcept { return stride_ == d_; }
  /// True when the matrix is a view into shared storage (read-only).
  bool is_view() const noexcept { return owner_ != nullptr; }

  const T* row(std::size_t i) const noexcept { return base_ + i * stride_; }
  std::span<const T> operator[](std::size_t i) const noexcept { return {row(i), d_}; }

  /// Writable row; only for owned matrices (throws std::logic_error on a view).
  T* mutable_row(std::size_t i) {
    if (is_view()) throw std::logic_error("Matrix::mutable_row on a read-only view");
    return storage_.data() + i * stride_;
  }
  /// All values; only for contiguous matrices (throws std::logic_error otherwise).
  const T* data() const {
    if (!contiguous()) throw std::logic_error("Matrix::data on a strided view; use copy()");
    return base_;
  }
  /// Owned, contiguous copy of the first min(rows, n()) rows.
  Matrix copy(std::size_t rows = std::numeric_limits<std::size_t>::max()) const {
    const std::size_t r = rows < n_ ? rows : n_;
    Matrix out(r, d_);
    for (std::size_t i = 0; i < r; ++i)
      std::copy(row(i), row(i) + d_, out.storage_.data() + i * d_);
    return out;
  }

 private:
  void rebase() noexcept {
    if (!owner_) base_ = storage_.data();
  }
  void reset() noexcept {
    storage_.clear();
    owner_.reset();
    base_ = nullptr;
    n_ = d_ = stride_ = 0;
  }

  std::vector<T> storage_;
  std::shared_ptr<const void> owner_;
  const T* base_ = nullptr;
  std::size_t n_ = 0, d_ = 0, stride_ = 0;
};

using FloatMatrix = Matrix<float>;
using IdMatrix = Matrix<std::int32_t>;
using U8Matrix = Matrix<std::uint8_t>;
using I8Matrix = Matrix<std::int8_t>;

struct LoadOptions {
  static constexpr std::size_t kAllRows = std::numeric_limits<std::size_t>::max();
  /// Read only the first max_rows rows (must be >= 1). The structure of the whole file (header,
  /// size) is still checked; per-row checks (dimension, NaN/inf, ids) cover the rows read.
  std::size_t max_rows = kAllRows;
  /// Return a view into the mapping when no conversion is needed; false forces an owned copy.
  bool allow_view = true;
};

/// Vectors of any vector format (fvecs, bvecs, fbin, u8bin, i8bin) as float; uint8/int8 are
/// converted. Id formats (ivecs, ibin) are refused. Float values must be finite.
FloatMatrix load_vectors_as_float(const std::string& path, const LoadOptions& options = {});

/// Ids from .ivecs or .ibin (the ids part; distances are ignored). Ids must be >= 0.
IdMatrix load_ids(const std::string& path, const LoadOptions& options = {});

/// An application's ids, one per line as a decimal number 0 .. 2^63 - 1 (a row of --data per
/// line; blank lines and lines starting with # are skipped). Errors name the file, line and
/// byte offset.
std::vector<std::uint64_t> load_id_list(const std::string& path);

/// Ground truth: ids (ivecs/ibin) and, for an .ibin that carries them, the distances.
struct GroundTruth {
  IdMatrix ids;
  std::optional<FloatMatrix> distances;
};
GroundTruth load_groundtruth(const std::string& path, const LoadOptions& options = {});

/// Typed load without conversion: the file's element type must be T (float: fvecs/fbin,
/// uint8_t: bvecs/u8bin, int8_t: i8bin, int32_t: ivecs/ibin). Instantiated for those four.
template <typename T>
Matrix<T> load_matrix(const std::string& path, const LoadOptions& options = {});

// ---- writers ----
// Each writer validates its input (n >= 1, 1 <= d <= kMaxDim, n fits the header for *bin,
// finite floats, ids >= 0; std::invalid_argument naming the file, row and column otherwise),
// writes to "<path>.tmp" and renames it over path (I/O errors: std::runtime_error naming the
// file). Strided views are accepted.
void write_fvecs(const std::string& path, const FloatMatrix& m);
void write_bvecs(const std::string& path, const U8Matrix& m);
void write_ivecs(const std::string& path, const IdMatrix& m);
void write_fbin(const std::string& path, const FloatMatrix& m);
void write_u8bin(const std::string& path, const U8Matrix& m);
void write_i8bin(const std::string& path, const I8Matrix& m);
/// distances, when given, must have the same shape as ids.
void write_ibin(const std::string& path, const IdMatrix& ids,
                const FloatMatrix* distances = nullptr);

/// Float vectors to any vector format by extension. For bvecs/u8bin/i8bin every value must be
/// an integer in the element type's range (std::invalid_argument otherwise).
void write_vectors(const std::string& path, const FloatMatrix& m);
/// Ids to .ivecs or .ibin by extension (ibin: with distances when given).
void write_ids(const std::string& path, const IdMatrix& ids,
               const FloatMatrix* distances = nullptr);

}  // namespace dmhnsw
