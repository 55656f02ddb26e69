#pragma once
// What a computenode run (either mode) knows about where it runs.
#include <cstdint>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

struct RunContext {
  fabric::Cluster* cluster = nullptr;
  uint32_t cn_id = 0;
  uint32_t num_cns = 1;
  std::string provider;
  /// Memnode 0's departures per computenode id right after this process connected
  /// (Board::departures): a peer of the run that leaves later is told from one not started yet.
  std::vector<uint64_t> departed_at_connect;
};

}  // namespace dmhnsw::compute
