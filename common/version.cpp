#include "common/version.hpp"

#include "dmhnsw_version.h"  // generated at build time by common/version.cmake

namespace dmhnsw {

std::string version_line(const std::string& binary) {
  return binary + " (dmhnsw) " DMHNSW_VERSION ", commit " DMHNSW_COMMIT;
}

}  // namespace dmhnsw
