#pragma once
// computenode selftest: exercises every transport operation against the scratch area of
// each memnode and checks every result.
#include <cstdint>
#include <string>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

struct SelftestOptions {
  uint32_t cn_id = 0;
  uint64_t atomics = 1000;    // fetch_adds and compare_swap increments per memnode
  double loop_seconds = 0;    // after the checks, keep reading for this long (liveness tests)
  bool verbose = true;
};

struct SelftestResult {
  uint64_t checks = 0;
  uint64_t failures = 0;
  std::string first_failure;
  double memnode_cpu_s = 0;  // memnodes' process CPU during the one-sided checks, summed
};

/// Throws FabricError when a memnode fails (dead peer, error completion).
SelftestResult run_selftest(fabric::Cluster& cluster, const SelftestOptions& o);

/// Scratch-area layout shared by the selftest, fabric-bench and the tests.
struct ScratchLayout {
  static constexpr uint64_t kFetchAddWord = 0;   // offset inside the scratch area
  static constexpr uint64_t kCasWord = 8;
  static constexpr uint64_t kPerCnBase = 4096;   // per-computenode data areas follow
  static constexpr uint64_t kPerCnBytes = 1u << 20;
};

}  // namespace dmhnsw::compute
