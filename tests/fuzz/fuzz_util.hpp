#pragma once
// Shared by the fuzz harnesses: a cursor that takes typed values off the front of the input
// (the idea of clang's FuzzedDataProvider, written out so that the gcc build compiles the
// harnesses too), and a per-process temporary file for parsers that only take a path.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace dmhnsw::fuzz {

/// Reads the input from the front. Past the end every value is zero and every span empty, so
/// a harness never has to check lengths.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  size_t left() const { return n_ - at_; }
  /// A trivially copyable value from the next sizeof(T) bytes (zero-filled past the end).
  template <class T>
  T take() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    const size_t k = std::min(sizeof(T), left());
    if (k > 0) std::memcpy(&v, p_ + at_, k);
    at_ += k;
    return v;
  }
  uint8_t byte() { return take<uint8_t>(); }
  bool flag() { return (byte() & 1) != 0; }
  /// A value in [0, n) (n >= 1).
  uint32_t below(uint32_t n) { return take<uint32_t>() % n; }
  /// Up to `n` bytes.
  std::vector<char> bytes(size_t n) {
    const size_t k = std::min(n, left());
    std::vector<char> v(p_ + at_, p_ + at_ + k);
    at_ += k;
    return v;
  }
  /// A chunk whose length is the next u16 (then at most what is left).
  std::vector<char> chunk() { return bytes(take<uint16_t>()); }
  std::vector<char> rest() { return bytes(left()); }
  std::string rest_text() {
    const std::vector<char> v = rest();
    return std::string(v.begin(), v.end());
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

/// A file in the temporary directory ($TMPDIR or /tmp) named after this process, so that
/// parallel fuzzers do not share it; rewritten for each input, removed when the harness exits.
class TempFile {
 public:
  explicit TempFile(const std::string& suffix)
      : path_((std::filesystem::temp_directory_path() /
               ("dmhnsw-fuzz-" + std::to_string(::getpid()) + "-" + std::to_string(next_++) + suffix))
                  .string()) {}
  ~TempFile() {
    std::remove(path_.c_str());
    std::remove((path_ + ".tmp").c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  /// Writes `bytes` as the whole file and returns its path.
  const std::string& write(const void* data, size_t size) {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr) throw std::logic_error("fuzz: cannot create " + path_);  // not the parser's fault: abort
    if (size > 0 && std::fwrite(data, 1, size, f) != size) {
      std::fclose(f);
      throw std::logic_error("fuzz: cannot write " + path_);
    }
    std::fclose(f);
    return path_;
  }
  const std::string& write(const std::vector<char>& v) { return write(v.data(), v.size()); }
  const std::string& path() const { return path_; }

 private:
  static inline int next_ = 0;
  std::string path_;
};

/// An input refused with an exception: an expected outcome. With DMHNSW_FUZZ_VERBOSE set in
/// the environment its message is printed (to see why a seed or a crash input is refused).
inline void refused(const std::exception& e) {
  static const bool verbose = std::getenv("DMHNSW_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz: refused: %s\n", e.what());
}

/// The harness's own invariant failed: a bug in the code under test that raised no exception.
[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "fuzz: invariant violated: %s\n", what);
  std::abort();
}
#define DMHNSW_FUZZ_CHECK(cond) \
  do {                          \
    if (!(cond)) ::dmhnsw::fuzz::violated(#cond); \
  } while (0)

}  // namespace dmhnsw::fuzz
