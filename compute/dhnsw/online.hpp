#pragma once
// `computenode --mode dhnsw build`: the d-HNSW index built on a computenode and written over the
// fabric into running memnodes (paper section 4.2): the same partitioning, sub-HNSWs,
// meta-HNSW and region bytes as tools/dhnsw-build, WRITEs of up to 4 MiB, eight per doorbell.
// Groups and the metadata block go first and every memnode's region header last, so a
// computenode that connects meanwhile sees an empty region, never a half-written index.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/dhnsw/build.hpp"
#include "compute/run_context.hpp"

namespace dmhnsw::dhnsw {

struct OnlineBuildOptions {
  std::string data;
  size_t max_vectors = 0;  // 0: every row
  BuildOptions build;      // memnodes: taken from the cluster
  Metric metric = Metric::L2;
  std::vector<int64_t> ids;  // row i's id (--ids); empty: the row number
};

struct WriteStats {
  uint64_t bytes = 0, writes = 0, doorbells = 0;
};
/// WRITEs [data, data + len) to region offset `offset` of `memnode`: 4 MiB per WRITE, eight per
/// doorbell, each doorbell's WRITEs completed before the next.
void write_bytes(fabric::Endpoint& ep, uint16_t memnode, uint64_t offset, const char* data, uint64_t len,
                 WriteStats& st);

/// Writes `built` into the cluster's regions (memnode m gets built.regions[m]; its header keeps
/// the region's real size). Refuses a memnode that already holds an index or whose region is
/// too small (naming it and the bytes needed). Returns the bytes, WRITEs and doorbells used.
nlohmann::json write_index(fabric::Cluster& c, fabric::Endpoint& ep, const BuiltIndex& built);

/// Computenode 0 builds and writes; the others have nothing to do (they say so and return).
nlohmann::json run_online_build(const compute::RunContext& rc, const OnlineBuildOptions& o);

}  // namespace dmhnsw::dhnsw
