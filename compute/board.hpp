#pragma once
// Coordination of the computenodes of one run through memnode 0's scratch area, with
// one-sided operations only (computenodes never talk to each other): a barrier on a
// FETCH_ADD counter, and a slot per computenode where it publishes its results for
// computenode 0 to gather.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
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
  /// `departed_since`: memnode 0's departures per id when this process connected
  /// (RunContext::departed_at_connect); empty: read now.
  Board(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, uint32_t num_cns, const std::string& group,
        const std::vector<uint64_t>& departed_since = {});
  /// Memnode 0's presence table's departures, by computenode id (common/presence.hpp).
  static std::vector<uint64_t> departures(fabric::Endpoint& ep);
  /// Waits until all num_cns computenodes arrived; returns the barrier's generation (the
  /// same number on every computenode). Fails after `timeout_s` naming how many arrived, or
  /// as soon as memnode 0's presence table shows that a missing one left (common/presence.hpp).
  uint64_t barrier(int timeout_s = 600);
  /// barrier() in its two steps: arrive (counted, and this computenode's arrival word
  /// stamped), then wait for the rest. Apart only to test a computenode that dies between them.
  struct Arrival {
    uint64_t gen = 0, count = 0;  // the generation; the counter just after this arrival
  };
  Arrival arrive();
  uint64_t wait_rest(const Arrival& a, int timeout_s = 600);
  /// Publishes `text` under generation `gen` in this computenode's slot.
  void publish(uint64_t gen, const std::string& text);
  /// Computenode 0: every computenode's text of generation `gen`, by cn id; the ones in
  /// `skip` (gone) are not waited for and stay empty; one that left without publishing fails it.
  std::vector<std::string> gather(uint64_t gen, int timeout_s = 600, const std::vector<uint32_t>& skip = {});
  /// Another computenode of this run that left since the board started, per memnode 0's
  /// presence table READ through `ep` (a long phase checks between barriers, from a thread
  /// with an endpoint of its own; thread-safe beside barrier() on another endpoint).
  std::optional<uint32_t> left_peer(fabric::Endpoint& ep) const;
  std::string gone_message(uint32_t i) const;

 private:
  fabric::Cluster& c_;
  fabric::Endpoint& ep_;
  uint32_t cn_, k_;
  RemotePtr base_;
  std::vector<uint64_t> departed_;  // memnode 0's departures per id when this board started
  std::chrono::steady_clock::time_point next_presence_{};

  /// A computenode for which `missing` holds and that left since the board started.
  std::optional<uint32_t> gone_peer(const std::function<bool(uint32_t)>& missing);
  RemotePtr barrier_block() const;
  /// A failed barrier's clean-up (see board.cpp).
  void take_back(uint64_t stamp);
};

}  // namespace dmhnsw::compute
