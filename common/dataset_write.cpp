// Writers of the vector and id formats (common/dataset.hpp): every file goes to a temporary
// name and is renamed over the target once complete.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/dataset.hpp"

namespace dmhnsw {

// ---------------------------------------------------------------------------------------------
// writers

namespace {

std::string errno_text() { return std::strerror(errno); }

/// Writes "<path>.tmp" and renames it over path on commit(); removes the temp file otherwise.
class AtomicWriter {
 public:
  explicit AtomicWriter(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (file_ == nullptr) throw std::runtime_error(tmp_ + ": cannot create: " + errno_text());
    std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  }
  ~AtomicWriter() {
    if (file_ != nullptr) {
      std::fclose(file_);
      std::remove(tmp_.c_str());
    }
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* p, std::size_t bytes) {
    if (bytes != 0 && std::fwrite(p, 1, bytes, file_) != bytes)
      throw std::runtime_error(tmp_ + ": write failed: " + errno_text());
  }
  template <typename T>
  void put(const T& v) {
    write(&v, sizeof v);
  }
  void commit() {
    std::string err;
    if (std::fflush(file_) != 0) err = errno_text();
    if (std::fclose(file_) != 0 && err.empty()) err = errno_text();
    file_ = nullptr;
    if (!err.empty()) {
      std::remove(tmp_.c_str());
      throw std::runtime_error(tmp_ + ": write failed: " + err);
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string e = errno_text();
      std::remove(tmp_.c_str());
      throw std::runtime_error(path_ + ": cannot rename " + tmp_ + " to it: " + e);
    }
  }

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
};

void require_format(const std::string& path, std::initializer_list<FileFormat> allowed,
                    const char* writer) {
  const FileFormat f = format_from_path(path);
  for (FileFormat a : allowed)
    if (a == f) return;
  throw std::invalid_argument(path + ": " + writer + " cannot write a ." +
                              std::string(to_string(f)) + " file (wrong extension)");
}

template <typename T>
void check_writable(const std::string& path, const Matrix<T>& m, bool bin_header) {
  if (m.n() == 0) throw std::invalid_argument(path + ": refusing to write an empty matrix (n=0)");
  if (m.d() == 0 || m.d() > kMaxDim)
    throw std::invalid_argument(path + ": dimension " + std::to_string(m.d()) +
                                " out of range 1.." + std::to_string(kMaxDim));
  if (bin_header && m.n() > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument(path + ": " + std::to_string(m.n()) +
                                " rows do not fit the uint32 header");
  for (std::size_t i = 0; i < m.n(); ++i) {
    const T* r = m.row(i);
    for (std::size_t j = 0; j < m.d(); ++j) {
      if constexpr (std::is_same_v<T, float>) {
        if (!std::isfinite(r[j]))
          throw std::invalid_argument(path + ": row " + std::to_string(i) + ", column " +
                                      std::to_string(j) + ": value is not finite");
      } else if constexpr (std::is_same_v<T, std::int32_t>) {
        if (r[j] < 0)
          throw std::invalid_argument(path + ": row " + std::to_string(i) + ", column " +
                                      std::to_string(j) + ": negative id " +
                                      std::to_string(r[j]));
      }
    }
  }
}

template <typename T>
void write_vecs_impl(const std::string& path, const Matrix<T>& m) {
  check_writable(path, m, false);
  AtomicWriter w(path);
  const std::int32_t d = static_cast<std::int32_t>(m.d());
  for (std::size_t i = 0; i < m.n(); ++i) {
    w.put(d);
    w.write(m.row(i), m.d() * sizeof(T));
  }
  w.commit();
}

template <typename T>
void write_rows(AtomicWriter& w, const Matrix<T>& m) {
  if (m.contiguous()) {
    w.write(m.data(), m.n() * m.d() * sizeof(T));
    return;
  }
  for (std::size_t i = 0; i < m.n(); ++i) w.write(m.row(i), m.d() * sizeof(T));
}

template <typename T>
void write_bin_impl(const std::string& path, const Matrix<T>& m) {
  check_writable(path, m, true);
  AtomicWriter w(path);
  w.put(static_cast<std::uint32_t>(m.n()));
  w.put(static_cast<std::uint32_t>(m.d()));
  write_rows(w, m);
  w.commit();
}

template <typename T>
Matrix<T> float_to_integral(const std::string& path, const FloatMatrix& m) {
  constexpr float lo = static_cast<float>(std::numeric_limits<T>::min());
  constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
  Matrix<T> out(m.n(), m.d());
  for (std::size_t i = 0; i < m.n(); ++i) {
    const float* r = m.row(i);
    T* o = out.mutable_row(i);
    for (std::size_t j = 0; j < m.d(); ++j) {
      const float v = r[j];
      if (!(v >= lo && v <= hi) || std::nearbyint(v) != v)
        throw std::invalid_argument(path + ": row " + std::to_string(i) + ", column " +
                                    std::to_string(j) + ": value " + std::to_string(v) +
                                    " is not an integer in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "]");
      o[j] = static_cast<T>(v);
    }
  }
  return out;
}

}  // namespace

void write_fvecs(const std::string& path, const FloatMatrix& m) {
  require_format(path, {FileFormat::Fvecs}, "write_fvecs");
  write_vecs_impl(path, m);
}
void write_bvecs(const std::string& path, const U8Matrix& m) {
  require_format(path, {FileFormat::Bvecs}, "write_bvecs");
  write_vecs_impl(path, m);
}
void write_ivecs(const std::string& path, const IdMatrix& m) {
  require_format(path, {FileFormat::Ivecs}, "write_ivecs");
  write_vecs_impl(path, m);
}
void write_fbin(const std::string& path, const FloatMatrix& m) {
  require_format(path, {FileFormat::Fbin}, "write_fbin");
  write_bin_impl(path, m);
}
void write_u8bin(const std::string& path, const U8Matrix& m) {
  require_format(path, {FileFormat::U8bin}, "write_u8bin");
  write_bin_impl(path, m);
}
void write_i8bin(const std::string& path, const I8Matrix& m) {
  require_format(path, {FileFormat::I8bin}, "write_i8bin");
  write_bin_impl(path, m);
}

void write_ibin(const std::string& path, const IdMatrix& ids, const FloatMatrix* distances) {
  require_format(path, {FileFormat::Ibin}, "write_ibin");
  check_writable(path, ids, true);
  if (distances != nullptr) {
    if (distances->n() != ids.n() || distances->d() != ids.d())
      throw std::invalid_argument(path + ": distances shape " + std::to_string(distances->n()) +
                                  "x" + std::to_string(distances->d()) + " != ids shape " +
                                  std::to_string(ids.n()) + "x" + std::to_string(ids.d()));
    check_writable(path, *distances, true);
  }
  AtomicWriter w(path);
  w.put(static_cast<std::uint32_t>(ids.n()));
  w.put(static_cast<std::uint32_t>(ids.d()));
  write_rows(w, ids);
  if (distances != nullptr) write_rows(w, *distances);
  w.commit();
}

void write_vectors(const std::string& path, const FloatMatrix& m) {
  switch (format_from_path(path)) {
    case FileFormat::Fvecs: return write_fvecs(path, m);
    case FileFormat::Fbin: return write_fbin(path, m);
    case FileFormat::Bvecs: return write_bvecs(path, float_to_integral<std::uint8_t>(path, m));
    case FileFormat::U8bin: return write_u8bin(path, float_to_integral<std::uint8_t>(path, m));
    case FileFormat::I8bin: return write_i8bin(path, float_to_integral<std::int8_t>(path, m));
    case FileFormat::Ivecs:
    case FileFormat::Ibin: break;
  }
  throw std::invalid_argument(path + ": is an id format (.ivecs/.ibin), not a vector format");
}

void write_ids(const std::string& path, const IdMatrix& ids, const FloatMatrix* distances) {
  switch (format_from_path(path)) {
    case FileFormat::Ivecs:
      if (distances != nullptr)
        throw std::invalid_argument(path + ": .ivecs cannot hold distances (use .ibin)");
      return write_ivecs(path, ids);
    case FileFormat::Ibin: return write_ibin(path, ids, distances);
    default: break;
  }
  throw std::invalid_argument(path + ": is a vector format, not an id format (.ivecs/.ibin)");
}

}  // namespace dmhnsw
