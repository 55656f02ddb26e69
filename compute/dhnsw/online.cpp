#include "compute/dhnsw/online.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "common/dataset.hpp"
#include "common/presence.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "common/write_gate.hpp"

namespace dmhnsw::dhnsw {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kChunk = 4u << 20;   // bytes per WRITE
constexpr size_t kPerDoorbell = 8;      // WRITEs per post

std::string mn_name(const fabric::Cluster& c, uint16_t m) {
  return "memnode " + std::to_string(m) + " (" + c.memnodes().at(m).address + ")";
}

RegionHeader read_header(fabric::Cluster& c, fabric::Endpoint& ep, uint16_t m) {
  RegionHeader h;
  ep.read(RemotePtr(m, 0), &h, sizeof h);
  validate_region_header(h, mn_name(c, m));
  return h;
}

}  // namespace

void write_bytes(fabric::Endpoint& ep, uint16_t memnode, uint64_t offset, const char* data, uint64_t len,
                 WriteStats& st) {
  fabric::Buffer buf = ep.alloc(kChunk * kPerDoorbell);
  std::vector<fabric::Op> ops;
  auto flush = [&] {
    if (ops.empty()) return;
    if (ep.post(ops) != fabric::Status::Ok)
      throw fabric::FabricError("dhnsw: posting WRITEs to memnode " + std::to_string(memnode) + " failed");
    ++st.doorbells;
    st.writes += ops.size();
    ep.wait_all(ops.size());
    ops.clear();
  };
  for (uint64_t at = 0; at < len; at += kChunk) {
    const uint64_t n = std::min<uint64_t>(kChunk, len - at);
    char* slot = buf.data() + ops.size() * kChunk;
    std::memcpy(slot, data + at, n);
    ops.push_back(fabric::Op::write(RemotePtr(memnode, offset + at), slot, n, ops.size()));
    st.bytes += n;
    if (ops.size() == kPerDoorbell) flush();
  }
  flush();
}

// A memnode holds one index: what to do when a build finds one.
constexpr const char* kHeldIndexHint =
    "`insert`, `upsert` and `delete` change it, `snapshot --dir DIR` stores it; a new index needs memnodes "
    "with empty regions (restart them, without --load)";

nlohmann::json write_index(fabric::Cluster& c, fabric::Endpoint& ep, const BuiltIndex& built) {
  const size_t n = c.memnodes().size();
  if (built.regions.size() != n)
    throw std::invalid_argument("dhnsw build: the index was laid out for " + std::to_string(built.regions.size()) +
                                " memnode(s), the cluster has " + std::to_string(n));
  for (uint16_t m = 0; m < n; ++m) {
    const RegionHeader h = read_header(c, ep, m);
    if (h.mode != static_cast<uint8_t>(Mode::None))
      throw std::runtime_error(mn_name(c, m) + " already holds a " +
                               std::string(fabric::mode_name(static_cast<Mode>(h.mode))) + " index: " + kHeldIndexHint);
    if (h.region_size < built.region_bytes[m])
      throw std::runtime_error(mn_name(c, m) + ": its region of " + format_bytes(h.region_size) +
                               " cannot hold its part of the index: " + std::to_string(built.region_bytes[m]) +
                               " bytes needed (" + format_bytes(built.region_bytes[m]) +
                               "); start it with a larger --region");
  }
  // One computenode formats: the claim is a COMPARE_SWAP on a mode word of memnode 0.
  const uint64_t claim = mode_word_offset(dhnsw_word::kBuildClaim);
  const uint64_t mine = lock_word(0, static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  if (const uint64_t old = ep.compare_swap(RemotePtr(0, claim), 0, mine); old != 0)
    throw std::runtime_error("memnode 0: computenode " + std::to_string(lock_owner(old)) +
                             " is already building an index there");

  WriteStats ws;
  const auto t0 = Clock::now();
  // The rest of the header page (memnode 0: the control block) but its presence table, which
  // is the memnode's; then groups and metadata.
  for (uint16_t m = 0; m < n; ++m) {
    const std::vector<char>& r = built.regions[m];
    // The write gate's words stay: a snapshot or a writer may hold them (common/write_gate.hpp).
    write_bytes(ep, m, sizeof(RegionHeader), r.data() + sizeof(RegionHeader), kWriteGateOffset - sizeof(RegionHeader), ws);
    write_bytes(ep, m, kWriteGateEnd, r.data() + kWriteGateEnd, kPresenceOffset - kWriteGateEnd, ws);
    write_bytes(ep, m, kHeaderPageBytes, r.data() + kHeaderPageBytes, r.size() - kHeaderPageBytes, ws);
  }
  fabric::Buffer buf = ep.alloc(sizeof(RegionHeader));
  uint64_t& bytes = ws.bytes;
  uint64_t& writes = ws.writes;
  uint64_t& doorbells = ws.doorbells;
  for (uint16_t m = 0; m < n; ++m) {  // then the headers, memnode 0's (with the claim word) last
    const uint16_t who = static_cast<uint16_t>(n - 1 - m);
    RegionHeader h;
    std::memcpy(&h, built.regions[who].data(), sizeof h);
    h.region_size = c.memnodes()[who].region_size;  // the region's own size: the room past the scratch stays free
    validate_region_header(h, mn_name(c, who) + " new region header");
    // The claim word keeps its value under the WRITE (another builder's COMPARE_SWAP may land on
    // it meanwhile) and is released by a COMPARE_SWAP of its own below.
    if (who == 0) h.mode_words[dhnsw_word::kBuildClaim] = mine;
    std::memcpy(buf.data(), &h, sizeof h);
    ep.write(RemotePtr(who, 0), buf.data(), sizeof h);
    bytes += sizeof h;
    ++writes;
    ++doorbells;
  }
  if (const uint64_t old = ep.compare_swap(RemotePtr(0, claim), mine, 0); old != mine)
    throw std::runtime_error("memnode 0: the build claim word changed to " + std::to_string(old) +
                             " while this computenode wrote the index");
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {{"bytes", bytes}, {"writes", writes}, {"doorbells", doorbells}, {"seconds", s},
          {"mb_per_s", s > 0 ? static_cast<double>(bytes) / s / 1e6 : 0.0}};
}

namespace {

/// Fails at once, before minutes of building, where a region cannot hold even the estimate.
void check_room(fabric::Cluster& c, size_t n, uint32_t dim, const BuildOptions& bo, bool copies) {
  const std::vector<uint64_t> need = estimate_region_bytes(n, dim, bo);
  const uint64_t most = *std::max_element(need.begin(), need.end());
  for (uint16_t m = 0; m < need.size(); ++m) {
    if (need[m] <= c.memnodes()[m].region_size) continue;
    throw std::invalid_argument(
        "build: " + mn_name(c, m) + " has a region of " + format_bytes(c.memnodes()[m].region_size) +
        "; this d-HNSW index (" + std::to_string(n) + " vectors of dimension " + std::to_string(dim) + ", " +
        std::to_string(resolve_partitions(bo.partitions, n)) + " partitions, M " + std::to_string(bo.m) + ", over " +
        std::to_string(need.size()) + " memnode(s)) needs about " + format_bytes(need[m]) + " there" +
        (copies ? " before boundary copies" : "") + ", its 64 MiB scratch area included. Start the memnodes with "
        "--region " + suggested_region(most) + "; an online rebuild writes the next epoch beside the live one, so "
        "--region " + suggested_region(2 * most - kScratchBytes) + " leaves room for rebuilds (docs/operations.md, "
        "\"Sizing regions\"). Nothing was built.");
  }
}

}  // namespace

nlohmann::json run_online_build(const compute::RunContext& rc, const OnlineBuildOptions& o) {
  if (rc.cn_id != 0) {
    std::printf("dhnsw build: computenode 0 builds the index; nothing to do here\n");
    return {{"tool", "computenode dhnsw build"}, {"mode", "dhnsw"}, {"kind", "build"}, {"cn_id", rc.cn_id}, {"skipped", true}};
  }
  fabric::Cluster& c = *rc.cluster;
  LoadOptions load;
  if (o.max_vectors != 0) load.max_rows = o.max_vectors;
  FloatMatrix data;
  try {
    data = load_vectors_as_float(o.data, load);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--data: ") + e.what());
  }
  if (!data.contiguous()) data = data.copy();
  BuildOptions bo = o.build;
  bo.memnodes = static_cast<uint32_t>(c.memnodes().size());
  bo.progress = true;
  auto ep = c.make_endpoint((kChunk * kPerDoorbell) + (8u << 20));
  // Fail early, before minutes of building, on a memnode that holds an index already.
  for (uint16_t m = 0; m < c.memnodes().size(); ++m)
    if (read_header(c, *ep, m).mode != static_cast<uint8_t>(Mode::None))
      throw std::runtime_error(mn_name(c, m) + " already holds an index: " + kHeldIndexHint);
  check_room(c, data.n(), static_cast<uint32_t>(data.d()), bo, bo.boundary.enabled());
  spdlog::info("dhnsw build: {}: {} x {}, building on this computenode", o.data, data.n(), data.d());
  if (!o.ids.empty() && o.ids.size() < data.n())
    throw std::invalid_argument("--ids holds " + std::to_string(o.ids.size()) + " ids, --data " + o.data + " " +
                                std::to_string(data.n()) + " rows: one id per row");
  const BuiltIndex built = build_index(data.data(), data.n(), static_cast<uint32_t>(data.d()), o.metric, bo,
                                       o.ids.empty() ? nullptr : o.ids.data());
  spdlog::info("dhnsw build: {} partitions built in {:.2f} s; writing {} memnode region(s)", built.options.partitions,
               built.seconds_partition + built.seconds_build_subs + built.seconds_layout, built.regions.size());
  nlohmann::json r = built.report();
  r["tool"] = "computenode dhnsw build";
  r["mode"] = "dhnsw";
  r["kind"] = "build";
  r["data"] = o.data;
  r["write"] = write_index(c, *ep, built);
  return r;
}

}  // namespace dmhnsw::dhnsw
