#pragma once
// JSON reports written whole or not at all: to a temporary name of this process, then renamed,
// so a reader never sees half a file and two writers never interleave in one; and the check, before
// a long run, that the file can be created at all.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace dmhnsw {

/// Fails early (before a long build) when `path` cannot be created: its directory is missing or
/// not writable. Errors name `flag` and the path; an empty path (no output asked for) passes.
inline void check_writable(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw std::invalid_argument(flag + " " + path + ": directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    throw std::invalid_argument(flag + " " + path + ": directory " + dir.string() + " is not writable");
}

/// Writes `text` to `path` via `path.tmp.<pid>`, then renames it; errors name `flag` and the file.
inline void write_text_file(const std::string& path, const std::string& text, const std::string& flag) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error(flag + ": cannot write '" + tmp + "'");
    out << text;
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error(flag + ": writing '" + tmp + "' failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(flag + ": cannot rename '" + tmp + "' to '" + path + "'");
  }
}

/// Writes `j` (indented) to `path` whole (write_text_file).
inline void write_json_file(const std::string& path, const nlohmann::json& j, const std::string& flag) {
  write_text_file(path, j.dump(2) + "\n", flag);
}

}  // namespace dmhnsw
