#include "compute/dhnsw/epoch.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "common/region.hpp"
#include "common/timing.hpp"
#include "common/units.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/commit.hpp"
#include "compute/dhnsw/insert.hpp"
#include "compute/dhnsw/insert_buffer.hpp"
#include "compute/dhnsw/mastership.hpp"
#include "compute/dhnsw/online.hpp"
#include "compute/dhnsw/rebuild_snapshot.hpp"

namespace dmhnsw::dhnsw {

namespace {

std::string num(uint64_t v) { return std::to_string(v); }

/// Fault injection for the tests (DMHNSW_TEST_PAUSE_REBUILD=before|after publishing): a master
/// killed there must leave the index serving and nothing acknowledged lost.
void test_pause(const char* where) {
  const char* p = std::getenv("DMHNSW_TEST_PAUSE_REBUILD");
  if (p == nullptr || std::string(p) != where) return;
  std::printf("dhnsw rebuild: paused %s publishing\n", where);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::minutes(10));
}

/// A base offset, the same on every memnode, where `span[m]` bytes fit on memnode m beside
/// everything in use: header page, live and old epoch areas, insert buffer, scratch.
uint64_t place(fabric::Cluster& c, fabric::Endpoint& ep, const Control& ctl, const std::vector<uint64_t>& span) {
  std::vector<std::pair<uint64_t, uint64_t>> used{{0, kMetadataOffset}, {ctl.cur_base, ctl.cur_end}};
  if (ctl.old_end > ctl.old_base) used.emplace_back(ctl.old_base, ctl.old_end);
  if (ctl.buffer_bytes > 0) used.emplace_back(ctl.buffer_offset, ctl.buffer_offset + ctl.buffer_bytes);
  std::vector<uint64_t> size(c.memnodes().size());
  for (uint16_t m = 0; m < c.memnodes().size(); ++m) {
    RegionHeader h;
    ep.read(RemotePtr(m, 0), &h, sizeof h);
    used.emplace_back(h.scratch_offset, h.scratch_offset + h.scratch_size);
    size[m] = h.region_size;
  }
  std::vector<uint64_t> candidates{kMetadataOffset};
  for (const auto& [a, b] : used) candidates.push_back(align_up(b, 4096));
  std::sort(candidates.begin(), candidates.end());
  uint64_t need_max = 0;
  for (uint64_t s : span) need_max = std::max(need_max, s);
  for (uint64_t base : candidates) {
    bool ok = true;
    for (size_t m = 0; m < span.size() && ok; ++m) {
      const uint64_t end = base + span[m];
      if (end > size[m]) ok = false;
      for (const auto& [a, b] : used)
        if (b > a && base < b && a < end) ok = false;
    }
    if (ok) return base;
  }
  uint64_t largest = 0;  // the largest free range on memnode 0, for the message
  std::sort(used.begin(), used.end());
  uint64_t at = 0;
  for (const auto& [a, b] : used) {
    if (a > at) largest = std::max(largest, a - at);
    at = std::max(at, b);
  }
  if (size[0] > at) largest = std::max(largest, size[0] - at);
  throw std::runtime_error("dhnsw rebuild: the regions are full: the next epoch needs " + num(need_max) + " bytes (" +
                           format_bytes(need_max) + ") beside the live one on every memnode, memnode 0 has at most " +
                           num(largest) + " free in one range; start the memnodes with a larger --region");
}

/// Phase kPublished: freeze the buffer, insert its entries into the live epoch, empty it.
/// Returns false when the live epoch cannot take them (the caller rebuilds again).
bool merge_buffer(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, const Mastership& ms, nlohmann::json& rep,
                  std::unordered_set<int64_t> known) {
  Control ctl = read_control(ep);
  for (uint32_t b = 0; b < ctl.buckets; ++b) {  // active -> merging: no new slot is taken from here on
    uint64_t w = ctl.bucket_words[b];
    while (bucket_state(w) == kBucketActive) {
      const uint64_t old = ep.compare_swap(bucket_ptr(b), w, bucket_word(kBucketMerging, bucket_count(w)));
      if (old == w) w = bucket_word(kBucketMerging, bucket_count(w));
      else w = old;
    }
    ctl.bucket_words[b] = w;
  }
  // An entry below the count whose commit word is not there yet is being written: give its
  // inserter a moment (it acknowledges only after the commit word).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Inserter ins(c, ep, cn_id);
  ins.set_merge_mode(true);
  const uint32_t dim = ins.index().header.dim;
  if (known.empty()) {  // a master that died after publishing: what does the live epoch hold?
    const Snapshot s = snapshot(ep, ins.index(), cn_id, false);
    known.insert(s.ids.begin(), s.ids.end());
  }
  const std::vector<BufferedVector> entries = buffer_read(ep, ctl, dim);
  std::vector<float> x;
  std::vector<int64_t> ids;
  for (const auto& e : entries) {
    if (!known.insert(e.id).second) continue;  // in the new epoch already
    x.insert(x.end(), e.v.begin(), e.v.end());
    ids.push_back(e.id);
  }
  ms.check();
  try {
    for (size_t at = 0; at < ids.size(); at += 1000) {
      const size_t n = std::min<size_t>(1000, ids.size() - at);
      ins.insert(x.data() + at * dim, ids.data() + at, n);
    }
  } catch (const CommitDoesNotFit& e) {
    spdlog::warn("dhnsw rebuild: the new epoch cannot take the {} buffered inserts ({}); rebuilding again",
                 ids.size(), e.what());
    for (uint32_t b = 0; b < ctl.buckets; ++b)
      ep.compare_swap(bucket_ptr(b), ctl.bucket_words[b], bucket_word(kBucketActive, bucket_count(ctl.bucket_words[b])));
    write_control_word(ep, control_ptr(offsetof(Control, phase)), kBuilding);
    return false;
  }
  // Inserters FETCH_ADD the bucket words: they are set by COMPARE_SWAP, never WRITE.
  for (uint32_t b = 0; b < ctl.buckets; ++b) ep.atomic_store(bucket_ptr(b), bucket_word(kBucketIdle, 0), ctl.bucket_words[b]);
  write_control_word(ep, control_ptr(offsetof(Control, phase)), kIdle);
  rep["merged"] = ids.size();
  rep["merge_duplicates_skipped"] = ins.stats().duplicates_skipped;
  return true;
}

/// Frees the old area once every computenode that is alive acknowledged `epoch`. With `wait`
/// it waits for that (a computenode whose ack word stays unchanged for ack_timeout_ms is taken
/// for dead); without, it frees only if that holds already and says whether it did.
bool free_old_area(fabric::Endpoint& ep, uint64_t epoch, uint32_t cn_id, const RebuildOptions& o,
                   nlohmann::json& rep, bool wait) {
  const auto t0 = Clock::now();
  std::map<uint32_t, std::pair<uint64_t, Clock::time_point>> seen;
  uint32_t waited_for_dead = 0;
  for (;;) {
    const Control ctl = read_control(ep);
    bool done = true;
    for (uint32_t s = 0; s < kMaxAckSlots; ++s) {
      const uint64_t w = ctl.acks[s];
      if (w == 0 || s == cn_id % kMaxAckSlots || ack_epoch(w) >= epoch) continue;
      auto it = seen.find(s);
      if (it == seen.end() || it->second.first != w) {
        seen[s] = {w, Clock::now()};
        done = false;
      } else if (std::chrono::duration<double>(Clock::now() - it->second.second).count() * 1000 < o.ack_timeout_ms) {
        done = false;
      }
    }
    if (done) break;
    if (!wait) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& [s, v] : seen)
    if (ack_epoch(v.first) < epoch) ++waited_for_dead;
  write_control_word(ep, control_ptr(offsetof(Control, old_base)), 0);
  write_control_word(ep, control_ptr(offsetof(Control, old_end)), 0);
  rep["acks_s"] = seconds_since(t0);
  rep["ack_slots_given_up"] = waited_for_dead;
  rep["old_area_freed"] = true;
  return true;
}

/// Step 1: from here on inserts go to the buffer (a master that died in kBuilding left it active).
void open_buffer(fabric::Endpoint& ep, const Control& ctl) {
  if (ctl.phase != kIdle) return;
  write_control_word(ep, control_ptr(offsetof(Control, generation)), ctl.generation + 1);
  for (uint32_t b = 0; b < ctl.buckets; ++b)
    ep.atomic_store(bucket_ptr(b), bucket_word(kBucketActive, 0), ctl.bucket_words[b]);
  write_control_word(ep, control_ptr(offsetof(Control, phase)), kBuilding);
}

/// The next epoch's build settings: the live epoch's, re-partitioned with a new seed.
BuildOptions next_epoch_options(const Index& idx, uint32_t threads) {
  const MetaHeader& h = idx.header;
  BuildOptions bo;
  bo.partitions = h.num_subs;
  bo.m = h.m;
  bo.ef_construction = h.ef_construction;
  bo.meta_m = h.meta_m;
  bo.memnodes = h.num_memnodes;
  bo.layout.internal_gap = static_cast<double>(h.internal_gap_ppm) / 1e6;
  bo.layout.overflow_gap = static_cast<double>(h.overflow_gap_ppm) / 1e6;
  bo.partition_metric = idx.meta->metric_type == faiss::METRIC_INNER_PRODUCT ? Metric::IP : Metric::L2;
  bo.seed = 1 + h.epoch;
  bo.threads = threads;
  bo.epoch = h.epoch + 1;
  bo.image = false;
  bo.id_index = h.id_buckets > 0;
  bo.quantizer = idx.codes;  // the codes stay comparable across epochs
  bo.boundary = BoundaryRule::of(h);
  return bo;
}

/// The next epoch as written into the regions, not yet live.
struct Shadow {
  Snapshot snap;
  BuiltIndex built;
  uint64_t epoch = 0, base = 0, end = 0;
  std::vector<uint64_t> span;  // bytes on each memnode from `base`
  double snapshot_s = 0, build_s = 0;
  WriteStats ws;
};

/// Step 2: snapshot the live epoch (and the buffer so far), re-partition and build it, and write
/// it into a free range at the same offset on every memnode.
Shadow build_shadow(fabric::Cluster& c, fabric::Endpoint& ep, const Control& ctl, uint32_t cn_id,
                    const RebuildOptions& o, const Mastership& ms, const Index& idx) {
  Shadow s;
  auto ts = Clock::now();
  s.snap = snapshot(ep, idx, cn_id, true);
  ms.check();
  s.snapshot_s = seconds_since(ts);
  const BuildOptions bo = next_epoch_options(idx, o.threads);
  s.epoch = bo.epoch;
  ts = Clock::now();
  const MetaHeader& h = idx.header;
  s.built = build_index(s.snap.x.data(), s.snap.ids.size(), h.dim, h.metric == 1 ? Metric::IP : Metric::L2, bo,
                        s.snap.ids.data());
  s.build_s = seconds_since(ts);
  ms.check();
  s.span.resize(s.built.regions.size());
  for (size_t m = 0; m < s.span.size(); ++m) s.span[m] = s.built.regions[m].size();
  s.base = place(c, ep, ctl, s.span);
  for (uint64_t n : s.span) s.end = std::max(s.end, s.base + n);
  relocate(s.built, s.base);
  for (uint16_t m = 0; m < s.built.regions.size(); ++m)
    write_bytes(ep, m, s.base, s.built.regions[m].data(), s.built.regions[m].size(), s.ws);
  ms.check();
  return s;
}

/// Step 3: the memnodes' region headers (memnode 0 last: its header is the switch), then the
/// control block (areas, epoch, this master's ack, phase kPublished).
void publish(fabric::Endpoint& ep, const Shadow& s, const Control& ctl, uint32_t cn_id) {
  for (size_t i = 0; i < s.built.regions.size(); ++i) {
    const uint16_t m = static_cast<uint16_t>(s.built.regions.size() - 1 - i);
    RegionHeader rh;
    ep.read(RemotePtr(m, 0), &rh, sizeof rh);
    rh.epoch = s.epoch;
    rh.mode_words[dhnsw_word::kMetadataOffset] = s.base;
    rh.mode_words[dhnsw_word::kMetadataSize] = s.built.header.block_bytes;
    rh.mode_words[dhnsw_word::kDataEnd] = std::max<uint64_t>(
        {rh.mode_words[dhnsw_word::kDataEnd], s.base + s.span[m], ctl.buffer_offset + ctl.buffer_bytes});
    fabric::Buffer hb = ep.alloc(sizeof rh);
    std::memcpy(hb.data(), &rh, sizeof rh);
    ep.write(RemotePtr(m, 0), hb.data(), sizeof rh);
  }
  write_control_word(ep, control_ptr(offsetof(Control, old_base)), ctl.cur_base);
  write_control_word(ep, control_ptr(offsetof(Control, old_end)), ctl.cur_end);
  write_control_word(ep, control_ptr(offsetof(Control, cur_base)), s.base);
  write_control_word(ep, control_ptr(offsetof(Control, cur_end)), s.end);
  write_control_word(ep, control_ptr(offsetof(Control, epoch)), s.epoch);
  write_control_word(ep, ack_ptr(cn_id), ack_word(s.epoch, 0));
  write_control_word(ep, control_ptr(offsetof(Control, phase)), kPublished);
}

}  // namespace

nlohmann::json run_rebuild(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, const RebuildOptions& o) {
  nlohmann::json rep{{"tool", "computenode dhnsw rebuild"}, {"mode", "dhnsw"}, {"kind", "rebuild"}, {"cn_id", cn_id}};
  Mastership ms(c, cn_id, o.lease_ms);
  if (!ms.acquire(ep, o.wait_for_master)) {
    rep["skipped"] = true;
    return rep;
  }
  const auto t0 = Clock::now();
  for (int round = 0;; ++round) {
    Control ctl = read_control(ep);
    if (ctl.buffer_bytes == 0)
      throw std::runtime_error("dhnsw rebuild: memnode 0 has no insert buffer (an index built before epochs); "
                               "build it again with this version");
    if (ctl.phase == kPublished) {  // a master died after publishing: merge and free
      rep["epoch"] = ctl.epoch;
      rep["finished_published_epoch"] = true;
      if (merge_buffer(c, ep, cn_id, ms, rep, {})) {
        free_old_area(ep, ctl.epoch, cn_id, o, rep, false);
        break;
      }
      continue;
    }
    open_buffer(ep, ctl);
    // Deletes mark the live epoch in place while this snapshot and build run (a master that
    // died while carrying them left them closed: this one reads them all again).
    write_control_word(ep, control_ptr(offsetof(Control, deletes_closed)), 0);
    if (ctl.old_end > ctl.old_base)  // the previous epoch's area, once every live computenode left it
      free_old_area(ep, ctl.epoch, cn_id, o, rep, true);
    ctl = read_control(ep);
    const Index idx = load_index(c, ep);
    const auto tw = Clock::now();
    const Shadow s = build_shadow(c, ep, ctl, cn_id, o, ms, idx);
    if (o.on_snapshot_written) o.on_snapshot_written();
    // Deletes that came after the snapshot read their group go into the shadow too.
    const auto tc = Clock::now();
    write_control_word(ep, control_ptr(offsetof(Control, deletes_closed)), 1);
    const std::vector<int64_t> carried = carry_deletes(ep, idx, cn_id, s.snap, s.built);
    const double carry_s = seconds_since(tc);
    if (o.on_deletes_closed) o.on_deletes_closed();
    ms.check();
    test_pause("before");
    publish(ep, s, ctl, cn_id);
    const double write_s = seconds_since(tw) - s.snapshot_s - s.build_s;
    test_pause("after");
    spdlog::info("dhnsw rebuild: epoch {} published: {} vectors in {} partitions at offset {} (snapshot {:.2f} s, "
                 "build {:.2f} s, write {:.2f} s)", s.epoch, s.snap.ids.size(), s.built.subs.size(), s.base,
                 s.snapshot_s, s.build_s, write_s);
    rep["epoch"] = s.epoch;
    rep["vectors"] = s.snap.ids.size();
    rep["base_offset"] = s.base;
    rep["seconds"] = {{"snapshot", s.snapshot_s}, {"build", s.build_s}, {"write", write_s}, {"carry", carry_s}};
    rep["bytes_written"] = s.ws.bytes;
    rep["bytes_read"] = s.snap.bytes;
    rep["from_buffer"] = s.snap.from_buffer;
    rep["deleted_dropped"] = s.snap.dropped;
    rep["duplicates_dropped"] = s.snap.duplicates;
    rep["copies_dropped"] = s.snap.copies;
    rep["copies"] = s.built.copies;  // the new epoch's boundary copies
    rep["deletes_carried"] = carried.size();
    // 4. Merge the buffer, 5. free the old area if every computenode moved already (else the
    //    next rebuild frees it before it needs the room). A carried id may be in the buffer
    //    again (inserted after its delete): the merge takes it.
    std::unordered_set<int64_t> known(s.snap.ids.begin(), s.snap.ids.end());
    for (int64_t id : carried) known.erase(id);
    if (merge_buffer(c, ep, cn_id, ms, rep, std::move(known))) {
      free_old_area(ep, s.epoch, cn_id, o, rep, false);
      break;
    }
    // Inserts arrived faster than the new epoch's gaps take them: rebuild again (with them).
    if (round >= 20) throw std::runtime_error("dhnsw rebuild: the buffered inserts did not fit after 20 rebuilds");
  }
  {
    const Control ctl = read_control(ep);
    write_control_word(ep, control_ptr(offsetof(Control, rebuilds)), ctl.rebuilds + 1);
  }
  rep["seconds_total"] = seconds_since(t0);
  return rep;
}

}  // namespace dmhnsw::dhnsw
