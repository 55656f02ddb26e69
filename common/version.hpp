#pragma once
// What `--version` prints in every binary: the project's version and the commit it was built from.
#include <string>

namespace dmhnsw {

/// "BINARY (dmhnsw) 0.1.0, commit 1a2b3c4d5e6f" (the commit of the tree at build time).
std::string version_line(const std::string& binary);

}  // namespace dmhnsw
