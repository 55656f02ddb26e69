#include "common/dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>

namespace dmhnsw {

// ---------------------------------------------------------------------------------------------
// errors, formats

namespace {

std::string with_offset(const std::string& path, std::uint64_t offset, const std::string& reason) {
  return path + ": byte offset " + std::to_string(offset) + ": " + reason;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

FormatError::FormatError(const std::string& path, std::uint64_t offset, const std::string& reason)
    : std::runtime_error(with_offset(path, offset, reason)), path_(path), offset_(offset) {}

FormatError::FormatError(const std::string& path, const std::string& reason)
    : std::runtime_error(path + ": " + reason), path_(path) {}

FileFormat format_from_path(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".fvecs") return FileFormat::Fvecs;
  if (ext == ".bvecs") return FileFormat::Bvecs;
  if (ext == ".ivecs") return FileFormat::Ivecs;
  if (ext == ".fbin") return FileFormat::Fbin;
  if (ext == ".u8bin") return FileFormat::U8bin;
  if (ext == ".i8bin") return FileFormat::I8bin;
  if (ext == ".ibin") return FileFormat::Ibin;
  throw FormatError(path, "unknown file extension '" + ext +
                              "' (expected .fvecs .bvecs .ivecs .fbin .u8bin .i8bin .ibin)");
}

std::string_view to_string(FileFormat format) {
  switch (format) {
    case FileFormat::Fvecs: return "fvecs";
    case FileFormat::Bvecs: return "bvecs";
    case FileFormat::Ivecs: return "ivecs";
    case FileFormat::Fbin: return "fbin";
    case FileFormat::U8bin: return "u8bin";
    case FileFormat::I8bin: return "i8bin";
    case FileFormat::Ibin: return "ibin";
  }
  return "?";
}

std::string_view to_string(ElementType type) {
  switch (type) {
    case ElementType::F32: return "float32";
    case ElementType::U8: return "uint8";
    case ElementType::I8: return "int8";
    case ElementType::I32: return "int32";
  }
  return "?";
}

ElementType element_type(FileFormat format) {
  switch (format) {
    case FileFormat::Fvecs:
    case FileFormat::Fbin: return ElementType::F32;
    case FileFormat::Bvecs:
    case FileFormat::U8bin: return ElementType::U8;
    case FileFormat::I8bin: return ElementType::I8;
    case FileFormat::Ivecs:
    case FileFormat::Ibin: return ElementType::I32;
  }
  return ElementType::F32;
}

std::size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::F32:
    case ElementType::I32: return 4;
    case ElementType::U8:
    case ElementType::I8: return 1;
  }
  return 0;
}

bool is_vecs(FileFormat format) {
  return format == FileFormat::Fvecs || format == FileFormat::Bvecs || format == FileFormat::Ivecs;
}

bool is_id_format(FileFormat format) {
  return format == FileFormat::Ivecs || format == FileFormat::Ibin;
}

// ---------------------------------------------------------------------------------------------
// mmap

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = errno_text();
    ::close(fd);
    throw std::runtime_error(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string err = errno_text();
      ::close(fd);
      throw std::runtime_error(path + ": cannot mmap " + std::to_string(size_) + " bytes: " + err);
    }
    ::madvise(p, size_, MADV_SEQUENTIAL);
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

// ---------------------------------------------------------------------------------------------
// structural parsing

namespace {

template <typename T>
T load_at(const MappedFile& f, std::uint64_t offset) {
  T v;
  std::memcpy(&v, f.data() + offset, sizeof(T));
  return v;
}

/// Where the values are. Row i's first value is at data_offset + i * row_bytes.
struct Layout {
  FileFormat format{};
  std::size_t n = 0;  // rows in the file
  std::size_t d = 0;
  std::uint64_t data_offset = 0;
  std::uint64_t row_bytes = 0;
  bool has_distances = false;  // ibin only
  std::uint64_t distances_offset = 0;
};

std::string dims_text(std::uint64_t n, std::uint64_t d) {
  return "n=" + std::to_string(n) + ", d=" + std::to_string(d);
}

/// Classic layout. Checks the first header, the per-row header of the first `rows_to_check`
/// rows and that the file is a whole number of rows.
Layout parse_vecs(const MappedFile& f, FileFormat format, std::size_t rows_to_check) {
  const std::string& path = f.path();
  const std::uint64_t size = f.size();
  const std::size_t es = element_size(element_type(format));
  if (size == 0) throw FormatError(path, 0, "empty file (no vectors)");
  if (size < 4)
    throw FormatError(path, 0,
                      "truncated: " + std::to_string(size) +
                          " bytes, less than one 4-byte dimension header");
  const std::int32_t d0 = load_at<std::int32_t>(f, 0);
  if (d0 <= 0 || static_cast<std::uint64_t>(d0) > kMaxDim)
    throw FormatError(path, 0,
                      "invalid vector dimension " + std::to_string(d0) + " (expected 1.." +
                          std::to_string(kMaxDim) + "; is this really a " +
                          std::string(to_string(format)) + " file of " +
                          std::string(to_string(element_type(format))) + " values?)");
  Layout L;
  L.format = format;
  L.d = static_cast<std::size_t>(d0);
  L.row_bytes = 4 + static_cast<std::uint64_t>(L.d) * es;
  L.data_offset = 4;
  const std::uint64_t n_full = size / L.row_bytes;
  const std::uint64_t rem = size % L.row_bytes;
  L.n = static_cast<std::size_t>(n_full);

  auto check_header = [&](std::uint64_t i) {
    const std::uint64_t off = i * L.row_bytes;
    const std::int32_t di = load_at<std::int32_t>(f, off);
    if (di != d0)
      throw FormatError(path, off,
                        "vector " + std::to_string(i) + " has dimension " + std::to_string(di) +
                            ", expected " + std::to_string(d0) +
                            " (inconsistent dimension or wrong element type)");
  };
  const std::uint64_t check = std::min<std::uint64_t>(rows_to_check, n_full);
  for (std::uint64_t i = 1; i < check; ++i) check_header(i);
  if (rem != 0) {
    const std::uint64_t off = n_full * L.row_bytes;
    if (check == n_full && rem >= 4) check_header(n_full);
    throw FormatError(path, off,
                      "truncated: partial vector at end of file (" + std::to_string(rem) +
                          " of " + std::to_string(L.row_bytes) + " bytes of a vector of dimension " +
                          std::to_string(d0) + ")");
  }
  return L;
}

/// big-ann layout: uint32 n, uint32 d, values; ibin optionally followed by float distances.
Layout parse_bin(const MappedFile& f, FileFormat format) {
  const std::string& path = f.path();
  const std::uint64_t size = f.size();
  const std::uint64_t es = element_size(element_type(format));
  if (size < 8)
    throw FormatError(path, 0,
                      "file has " + std::to_string(size) +
                          " bytes, smaller than the 8-byte header (uint32 n, uint32 d)");
  const std::uint32_t n = load_at<std::uint32_t>(f, 0);
  const std::uint32_t d = load_at<std::uint32_t>(f, 4);
  if (n == 0) throw FormatError(path, 0, "header says n=0 (no vectors)");
  if (d == 0 || d > kMaxDim)
    throw FormatError(path, 4,
                      "header dimension d=" + std::to_string(d) + " out of range 1.." +
                          std::to_string(kMaxDim));
  std::uint64_t values = 0, payload = 0, expected = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(d), &values) ||
      __builtin_mul_overflow(values, es, &payload) ||
      __builtin_add_overflow(payload, std::uint64_t{8}, &expected))
    throw FormatError(path, 0, "header " + dims_text(n, d) + ": size overflows");
  Layout L;
  L.format = format;
  L.n = n;
  L.d = d;
  L.data_offset = 8;
  L.row_bytes = static_cast<std::uint64_t>(d) * es;
  if (format == FileFormat::Ibin && size != expected) {
    const std::uint64_t with_dist = expected + payload;  // + n*k float32
    if (size == with_dist) {
      L.has_distances = true;
      L.distances_offset = expected;
      return L;
    }
    if (size < expected)
      throw FormatError(path, size,
                        "file ends here but header (" + dims_text(n, d) + ") needs " +
                            std::to_string(expected) + " bytes of ids (truncated file?)");
    throw FormatError(path, expected,
                      "file has " + std::to_string(size) + " bytes; header (" + dims_text(n, d) +
                          ") allows " + std::to_string(expected) + " (ids) or " +
                          std::to_string(with_dist) + " (ids + distances)");
  }
  if (size < expected)
    throw FormatError(path, size,
                      "file ends here but header (" + dims_text(n, d) + ") needs " +
                          std::to_string(expected) + " bytes (truncated file, or wrong element "
                          "type for ." + std::string(to_string(format)) + "?)");
  if (size > expected)
    throw FormatError(path, expected,
                      std::to_string(size - expected) + " trailing bytes after the " +
                          dims_text(n, d) + " " + std::string(to_string(element_type(format))) +
                          " values (wrong element type for ." + std::string(to_string(format)) +
                          "?)");
  return L;
}

Layout parse(const MappedFile& f, FileFormat format, std::size_t rows_to_check) {
  return is_vecs(format) ? parse_vecs(f, format, rows_to_check) : parse_bin(f, format);
}

// ---- value checks ----

void check_finite(const MappedFile& f, const float* values, std::size_t count,
                  std::uint64_t first_offset, const char* what) {
  // Branch-free scan for the common all-finite case, then locate the culprit.
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(values[j]);
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (bad == 0) return;
  for (std::size_t j = 0; j < count; ++j) {
    if (!std::isfinite(values[j]))
      throw FormatError(f.path(), first_offset + j * 4,
                        std::string(what) + " value is " + (std::isnan(values[j]) ? "NaN" : "inf"));
  }
}

void check_ids(const MappedFile& f, const std::int32_t* ids, std::size_t count,
               std::uint64_t first_offset) {
  std::int32_t lo = 0;
  for (std::size_t j = 0; j < count; ++j) lo = std::min(lo, ids[j]);
  if (lo >= 0) return;
  for (std::size_t j = 0; j < count; ++j)
    if (ids[j] < 0)
      throw FormatError(f.path(), first_offset + j * 4,
                        "negative id " + std::to_string(ids[j]) +
                            " (wrong element type, or missing neighbours?)");
}

template <typename T>
const T* typed_row(const MappedFile& f, const Layout& L, std::size_t i) {
  // Row starts are 4-byte aligned relative to the page-aligned mapping for every format.
  return reinterpret_cast<const T*>(f.data() + L.data_offset + i * L.row_bytes);
}

std::uint64_t row_offset(const Layout& L, std::size_t i) {
  return L.data_offset + i * L.row_bytes;
}

template <typename T>
constexpr ElementType element_of() {
  if constexpr (std::is_same_v<T, float>) return ElementType::F32;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return ElementType::U8;
  else if constexpr (std::is_same_v<T, std::int8_t>) return ElementType::I8;
  else {
    static_assert(std::is_same_v<T, std::int32_t>);
    return ElementType::I32;
  }
}

/// Rows [0, rows) of the file as Matrix<T> (file element type == T), view or copy.
template <typename T>
Matrix<T> extract(const std::shared_ptr<MappedFile>& f, const Layout& L, std::size_t rows,
                  bool allow_view) {
  const T* base = typed_row<T>(*f, L, 0);
  const std::size_t stride = static_cast<std::size_t>(L.row_bytes / sizeof(T));
  auto view = Matrix<T>::view(std::shared_ptr<const void>(f, base), base, rows, L.d, stride);
  if (allow_view) return view;
  return view.copy();
}

struct Opened {
  std::shared_ptr<MappedFile> file;
  Layout layout;
  std::size_t rows = 0;
};

Opened open_checked(const std::string& path, FileFormat format, const LoadOptions& options) {
  if (options.max_rows == 0)
    throw std::invalid_argument(path + ": LoadOptions::max_rows must be >= 1");
  Opened o;
  o.file = std::make_shared<MappedFile>(path);
  o.layout = parse(*o.file, format, options.max_rows);
  o.rows = std::min(o.layout.n, options.max_rows);
  return o;
}

void check_float_rows(const MappedFile& f, const Layout& L, std::size_t rows) {
  for (std::size_t i = 0; i < rows; ++i)
    check_finite(f, typed_row<float>(f, L, i), L.d, row_offset(L, i), "vector");
}

void check_id_rows(const MappedFile& f, const Layout& L, std::size_t rows) {
  for (std::size_t i = 0; i < rows; ++i)
    check_ids(f, typed_row<std::int32_t>(f, L, i), L.d, row_offset(L, i));
}

template <typename Src>
FloatMatrix convert_to_float(const MappedFile& f, const Layout& L, std::size_t rows) {
  FloatMatrix out(rows, L.d);
  for (std::size_t i = 0; i < rows; ++i) {
    const Src* src = typed_row<Src>(f, L, i);
    float* dst = out.mutable_row(i);
    for (std::size_t j = 0; j < L.d; ++j) dst[j] = static_cast<float>(src[j]);
  }
  return out;
}

}  // namespace

FileShape probe(const std::string& path) {
  const FileFormat format = format_from_path(path);
  MappedFile f(path);
  const Layout L = parse(f, format, 1);
  FileShape s;
  s.format = format;
  s.n = L.n;
  s.d = L.d;
  s.has_distances = L.has_distances;
  s.file_size = f.size();
  return s;
}

FloatMatrix load_vectors_as_float(const std::string& path, const LoadOptions& options) {
  const FileFormat format = format_from_path(path);
  if (is_id_format(format))
    throw FormatError(path, 0,
                      "holds int32 ids (." + std::string(to_string(format)) +
                          "), not vectors; wrong element type for a vector file");
  Opened o = open_checked(path, format, options);
  switch (element_type(format)) {
    case ElementType::F32:
      check_float_rows(*o.file, o.layout, o.rows);
      return extract<float>(o.file, o.layout, o.rows, options.allow_view);
    case ElementType::U8: return convert_to_float<std::uint8_t>(*o.file, o.layout, o.rows);
    case ElementType::I8: return convert_to_float<std::int8_t>(*o.file, o.layout, o.rows);
    case ElementType::I32: break;
  }
  throw std::logic_error("load_vectors_as_float: unreachable");
}

GroundTruth load_groundtruth(const std::string& path, const LoadOptions& options) {
  const FileFormat format = format_from_path(path);
  if (!is_id_format(format))
    throw FormatError(path, 0,
                      "is a ." + std::string(to_string(format)) + " file of " +
                          std::string(to_string(element_type(format))) +
                          " vectors, not ids (expected .ivecs or .ibin)");
  Opened o = open_checked(path, format, options);
  check_id_rows(*o.file, o.layout, o.rows);
  GroundTruth gt;
  gt.ids = extract<std::int32_t>(o.file, o.layout, o.rows, options.allow_view);
  if (o.layout.has_distances) {
    Layout dl = o.layout;
    dl.data_offset = o.layout.distances_offset;
    for (std::size_t i = 0; i < o.rows; ++i)
      check_finite(*o.file, typed_row<float>(*o.file, dl, i), dl.d, row_offset(dl, i),
                   "distance");
    gt.distances = extract<float>(o.file, dl, o.rows, options.allow_view);
  }
  return gt;
}

IdMatrix load_ids(const std::string& path, const LoadOptions& options) {
  return load_groundtruth(path, options).ids;
}

template <typename T>
Matrix<T> load_matrix(const std::string& path, const LoadOptions& options) {
  const FileFormat format = format_from_path(path);
  constexpr ElementType want = element_of<T>();
  if (element_type(format) != want)
    throw FormatError(path, 0,
                      "." + std::string(to_string(format)) + " holds " +
                          std::string(to_string(element_type(format))) + " values, expected " +
                          std::string(to_string(want)));
  Opened o = open_checked(path, format, options);
  if constexpr (std::is_same_v<T, float>) check_float_rows(*o.file, o.layout, o.rows);
  return extract<T>(o.file, o.layout, o.rows, options.allow_view);
}

template FloatMatrix load_matrix<float>(const std::string&, const LoadOptions&);
template U8Matrix load_matrix<std::uint8_t>(const std::string&, const LoadOptions&);
template I8Matrix load_matrix<std::int8_t>(const std::string&, const LoadOptions&);
template IdMatrix load_matrix<std::int32_t>(const std::string&, const LoadOptions&);

std::vector<std::uint64_t> load_id_list(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open: " + errno_text());
  std::vector<std::uint64_t> ids;
  std::string line;
  std::uint64_t offset = 0, number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::uint64_t at = offset;
    offset += line.size() + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const auto last = line.find_last_not_of(" \t");
    const std::string_view text(line.data() + first, last - first + 1);
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size() || v > (std::uint64_t{1} << 63) - 1)
      throw FormatError(path, at + first,
                        "line " + std::to_string(number) + ": '" + std::string(text.substr(0, 40)) +
                            "' is not an id (a decimal number 0 .. 9223372036854775807)");
    ids.push_back(v);
  }
  if (in.bad()) throw std::runtime_error(path + ": read error: " + errno_text());
  return ids;
}

}  // namespace dmhnsw
