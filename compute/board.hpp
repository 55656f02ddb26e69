#pragma once
// Coordination of the computenodes of one run through memnode 0's scratch area, with
// one-sided operations only (computenodes never talk to each other): a barrier on a
// FETCH_ADD counter, and a slot per computenode where it publishes its results for
// computenode 0 to gather.
#include <cstdint>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

class Board {
 public:
  static constexpr uint64_t kSlotBytes = 255u << 10;  // 8 slots + a barrier page fit in 2 MiB
  static constexpr uint32_t kGroups = 8, kMaxCns = 8;
  /// Runs of different kinds (`group`: "build", "insert" or "query") use separate barrier
  /// counters and slots, so a query run and an insert run can share the memnodes.
  Board(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, uint32_t num_cns, const std::string& group);
  /// Waits until all num_cns computenodes arrived; returns the barrier's generation (the
  /// same number on every computenode). Fails after `timeout_s` naming how many arrived.
  uint64_t barrier(int timeout_s = 600);
  /// Publishes `text` under generation `gen` in this computenode's slot.
  void publish(uint64_t gen, const std::string& text);
  /// Computenode 0: every computenode's text of generation `gen`, by cn id; the ones in
  /// `skip` (gone) are not waited for and stay empty.
  std::vector<std::string> gather(uint64_t gen, int timeout_s = 600, const std::vector<uint32_t>& skip = {});

 private:
  fabric::Cluster& c_;
  fabric::Endpoint& ep_;
  uint32_t cn_, k_;
  RemotePtr base_;
};

}  // namespace dmhnsw::compute
