#pragma once
// JSON reports written whole or not at all: to a temporary name of this process, then renamed,
// so a reader never sees half a file and two writers never interleave in one.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace dmhnsw {

/// Writes `j` (indented) to `path` via `path.tmp.<pid>`; errors name `flag` and the file.
inline void write_json_file(const std::string& path, const nlohmann::json& j, const std::string& flag) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error(flag + ": cannot write '" + tmp + "'");
    out << j.dump(2) << "\n";
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

}  // namespace dmhnsw
