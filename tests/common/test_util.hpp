// Helpers shared by the tests of common/: a temporary directory and raw file writing.
#pragma once
#include <sys/wait.h>
#include <cstdlib>
#include <sstream>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/dataset.hpp"
#include "../sanitizer_reports.hpp"

namespace dmhnsw::test {

inline const std::string kSharedData = DMHNSW_SHARED_DATA;
inline const std::string kBinDir = DMHNSW_BIN_DIR;

/// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("dmhnsw-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Byte buffer builder for hand-made (possibly malformed) files.
class Bytes {
 public:
  template <typename T>
  Bytes& put(const T& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    data_.insert(data_.end(), p, p + sizeof(T));
    return *this;
  }
  template <typename T>
  Bytes& put_all(const std::vector<T>& values) {
    for (const T& v : values) put(v);
    return *this;
  }
  std::size_t size() const { return data_.size(); }
  std::vector<unsigned char>& raw() { return data_; }
  void save(const std::string& path) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data_.data()),
              static_cast<std::streamsize>(data_.size()));
    if (!out) throw std::runtime_error("cannot write " + path);
  }

 private:
  std::vector<unsigned char> data_;
};

inline std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

struct RunResult {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Runs tool (from DMHNSW_BIN_DIR) with args through the shell; captures stdout and stderr.
inline RunResult run_tool(const TempDir& tmp, const std::string& tool, const std::string& args) {
  const std::string out = tmp.file(tool + ".out"), err = tmp.file(tool + ".err");
  const std::string cmd = kBinDir + "/" + tool + " " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  sanitizer_reports::collect_child_output(r.err, tool);
  return r;
}

/// f() must throw FormatError naming path and offset.
template <typename F>
void require_format_error(F&& f, const std::string& path, std::uint64_t offset) {
  bool thrown = false;
  try {
    f();
  } catch (const FormatError& e) {
    thrown = true;
    const std::string msg = e.what();
    INFO("message: " << msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("byte offset " + std::to_string(offset)) != std::string::npos);
    REQUIRE(e.offset().has_value());
    CHECK(*e.offset() == offset);
    CHECK(e.path() == path);
  }
  REQUIRE(thrown);
}

}  // namespace dmhnsw::test
