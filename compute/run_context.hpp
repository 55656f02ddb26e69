#pragma once
// What a computenode run (either mode) knows about where it runs.
#include <cstdint>
#include <string>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

struct RunContext {
  fabric::Cluster* cluster = nullptr;
  uint32_t cn_id = 0;
  uint32_t num_cns = 1;
  std::string provider;
};

}  // namespace dmhnsw::compute
