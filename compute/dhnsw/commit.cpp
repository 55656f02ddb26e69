#include "compute/dhnsw/commit.hpp"

#include <faiss/IndexFlatCodes.h>

#include <algorithm>
#include <cstring>

namespace dmhnsw::dhnsw {

namespace {

std::string num(uint64_t v) { return std::to_string(v); }

/// The bytes of array `a` of the local sub-HNSW.
std::pair<const char*, uint64_t> local_array(const SubIndex& s, uint32_t a) {
  const faiss::HNSW& g = s.index->hnsw;
  switch (a) {
    case kLevels: return {reinterpret_cast<const char*>(g.levels.data()), g.levels.size() * sizeof(int)};
    case kOffsets: return {reinterpret_cast<const char*>(g.offsets.data()), g.offsets.size() * sizeof(size_t)};
    case kNeighbors: return {reinterpret_cast<const char*>(g.neighbors.data()), g.neighbors.size() * sizeof(int32_t)};
    case kVectors: {
      auto* st = dynamic_cast<const faiss::IndexFlatCodes*>(s.index->storage);
      if (st == nullptr) throw std::invalid_argument("commit: the sub-HNSW's storage is not flat");
      return {reinterpret_cast<const char*>(st->codes.data()), st->codes.size()};
    }
    case kCodes: return {reinterpret_cast<const char*>(s.codes.data()), s.codes.size()};
    default: return {reinterpret_cast<const char*>(s.labels.data()), s.labels.size() * sizeof(int64_t)};
  }
}

}  // namespace

ArraySegments array_segments(const char* fetched, size_t len, const SubDesc& d) {
  const auto [region0, need] = fetch_range(d);
  if (len < need) throw std::invalid_argument("array_segments: " + num(len) + " bytes, the fetch range is " + num(need));
  ArraySegments out;
  for (uint32_t a = 0; a < kNumArrays; ++a)
    out[a].push_back({0, d.block_offset + d.arrays[a].offset, d.arrays[a].used});
  struct Rec {
    uint32_t array;
    uint64_t at, bytes;
  };
  std::vector<Rec> recs;
  const uint64_t start = d.slot == 0 ? d.block_bytes : 0, end = start + d.overflow_used;
  for (uint64_t p = start; p + sizeof(OverflowRecord) <= end;) {
    OverflowRecord r;
    std::memcpy(&r, fetched + p, sizeof r);
    if (r.array >= kNumArrays || r.bytes > end - p - sizeof r)
      throw std::runtime_error("array_segments: sub " + num(d.id) + ": bad overflow record at byte " + num(p));
    recs.push_back({r.array, p + sizeof r, r.bytes});
    p += overflow_record_bytes(r.bytes);
  }
  if (d.slot == 1) std::reverse(recs.begin(), recs.end());  // time order
  for (const Rec& r : recs) {
    auto& v = out[r.array];
    v.push_back({v.back().logical + v.back().bytes, region0 + r.at, r.bytes});
  }
  return out;
}

std::vector<char> gather(const char* fetched, const SubDesc& d, const std::vector<Segment>& segs) {
  const uint64_t region0 = fetch_range(d).first;
  std::vector<char> out;
  for (const Segment& s : segs) out.insert(out.end(), fetched + (s.region - region0), fetched + (s.region - region0) + s.bytes);
  return out;
}

UpdateCommit prepare_commit(const SubDesc& d, const ArraySegments& segs, const std::vector<int32_t>& old_neighbors,
                            const SubIndex& now, const SubDesc* partner, uint32_t dim, uint32_t code_size) {
  UpdateCommit c;
  c.sub = d.id;
  c.memnode = d.memnode;
  c.desc = d;
  SubDesc& nd = c.desc;

  // 1. Appended tails: internal gap first, the rest as one overflow record per array.
  struct Tail {
    uint32_t array;
    const char* data;
    uint64_t bytes;
    uint64_t logical;  // where in the array its elements start
  };
  std::vector<Tail> records;
  for (uint32_t a = 0; a < kNumArrays; ++a) {
    const auto [data, total] = local_array(now, a);
    const uint64_t old_total = segs[a].back().logical + segs[a].back().bytes;
    if (total < old_total)
      throw std::invalid_argument("commit: sub " + num(d.id) + ": the local " + array_name(a) + " array shrank");
    uint64_t tail = total - old_total;
    if (tail == 0) continue;
    const uint64_t elem = element_bytes(a, dim, code_size);
    const ArraySlot& slot = d.arrays[a];
    // Only while the array has no record yet: its elements must stay in order.
    const uint64_t room = segs[a].size() == 1 ? (slot.capacity - slot.used) / elem * elem : 0;
    const uint64_t in = std::min(tail, room);
    if (in > 0) {
      RegionWrite w;
      w.offset = d.block_offset + slot.offset + slot.used;
      w.bytes.assign(data + old_total, data + old_total + in);
      if (a == kLabels) c.label_tail.push_back({old_total, w.offset, in});
      c.writes.push_back(std::move(w));
      nd.arrays[a].used += in;
      c.appended_bytes += in;
      tail -= in;
    }
    if (tail > 0) records.push_back({a, data + old_total + in, tail, old_total + in});
  }
  uint64_t need = 0;
  for (const Tail& t : records) need += overflow_record_bytes(t.bytes);
  const uint64_t free = overflow_free(d, partner);
  if (need > free)
    throw CommitDoesNotFit("sub-HNSW " + num(d.id) + " (memnode " + num(d.memnode) + "): the commit needs " +
                               num(need) + " bytes of its group's shared overflow gap, " + num(free) + " are free",
                           need, free);
  for (const Tail& t : records) {
    const uint64_t rb = overflow_record_bytes(t.bytes);
    RegionWrite w;
    w.offset = next_overflow_record_offset(nd, rb);
    w.bytes.assign(rb, 0);
    OverflowRecord h{t.array, 0, t.bytes};
    std::memcpy(w.bytes.data(), &h, sizeof h);
    std::memcpy(w.bytes.data() + sizeof h, t.data, t.bytes);
    if (t.array == kLabels) c.label_tail.push_back({t.logical, w.offset + sizeof h, t.bytes});
    c.writes.push_back(std::move(w));
    nd.overflow_used += rb;
    ++c.overflow_records;
    c.overflow_bytes += rb;
    c.appended_bytes += t.bytes;
  }

  // 2. Neighbour lists of the old nodes that changed: ranges of changed entries, merged when
  //    close (one WRITE of a few unchanged entries is cheaper than two WRITEs).
  const auto& nb = now.index->hnsw.neighbors;
  const size_t old_n = old_neighbors.size();
  if (nb.size() < old_n) throw std::invalid_argument("commit: sub " + num(d.id) + ": the neighbors array shrank");
  constexpr size_t kMergeGap = 16;
  for (size_t i = 0; i < old_n;) {
    if (nb[i] == old_neighbors[i]) {
      ++i;
      continue;
    }
    size_t e = i + 1, last = i;
    while (e < old_n && e - last <= kMergeGap) {
      if (nb[e] != old_neighbors[e]) last = e;
      ++e;
    }
    const uint64_t lo = i * 4, hi = (last + 1) * 4;  // logical bytes [lo, hi) of the neighbors array
    for (const Segment& s : segs[kNeighbors]) {
      const uint64_t a = std::max(lo, s.logical), b = std::min(hi, s.logical + s.bytes);
      if (a >= b) continue;
      RegionWrite w;
      w.offset = s.region + (a - s.logical);
      const char* src = reinterpret_cast<const char*>(nb.data()) + a;
      w.bytes.assign(src, src + (b - a));
      c.overwritten_bytes += b - a;
      c.writes.push_back(std::move(w));
    }
    i = last + 1;
  }

  // 3. The new live descriptor.
  nd.count = static_cast<uint64_t>(now.index->ntotal);
  nd.entry_point = now.index->hnsw.entry_point;
  nd.max_level = now.index->hnsw.max_level;
  nd.version = (d.version | 1) + 1;
  nd.lock = 0;
  return c;
}

}  // namespace dmhnsw::dhnsw
