#pragma once
// computenode rejoin: fills a new copy of a replica set (memnode --rejoin, in a dead copy's
// place) from a live copy while the other computenodes go on writing, then makes it a full copy
// everywhere (docs/replication.md, "Replacing a memnode").
#include <cstdint>
#include <string>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

struct RejoinOptions {
  uint16_t memnode = 0;  // the set
  unsigned copy = 0;     // the copy that joins
  uint32_t cn_id = 0;
  int ack_timeout_s = 10;  // every computenode acknowledges each phase within this
};

struct RejoinResult {
  uint64_t region_bytes = 0, chunk_bytes = 0;
  uint64_t first_pass_bytes = 0, recopied_bytes = 0, final_bytes = 0;
  unsigned passes = 0;
  double first_pass_s = 0, total_s = 0, frozen_ms = 0;
  double first_pass_gbps() const { return first_pass_s > 0 ? first_pass_bytes / first_pass_s / 1e9 : 0; }
};

/// Throws naming what is wrong: no replica sets, the copy not connected or already full, a
/// rejoin under way, a computenode that does not acknowledge in time (the set goes back to idle).
RejoinResult run_rejoin(fabric::Cluster& c, const RejoinOptions& o);

}  // namespace dmhnsw::compute
