#include "compute/dhnsw/rebuild_snapshot.hpp"

#include <faiss/IndexFlatCodes.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/timing.hpp"
#include "compute/coro.hpp"
#include "compute/dhnsw/commit.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/group_lock.hpp"
#include "compute/dhnsw/insert_buffer.hpp"
#include "compute/dhnsw/subindex.hpp"
#include "compute/id_index.hpp"

namespace dmhnsw::dhnsw {

namespace {

constexpr size_t kLanes = 16;  // id index operations in flight at once

/// An id live twice: a vector's boundary copies (compute/dhnsw/boundary.hpp; the new epoch places
/// them anew), an upsert whose old vector this snapshot read before it was marked, or two
/// computenodes inserting one id at once. Keeps the vector the id index names, drops the others.
void drop_duplicates(fabric::Endpoint& ep, const Index& idx, Snapshot& s) {
  std::unordered_map<int64_t, std::vector<size_t>> rows;
  rows.reserve(s.where.size());
  std::vector<int64_t> twice;
  for (size_t i = 0; i < s.where.size(); ++i) {
    auto& r = rows[s.ids[i]];
    r.push_back(i);
    if (r.size() == 2) twice.push_back(s.ids[i]);
  }
  if (twice.empty() || idx.header.id_buckets == 0) return;
  compute::Scheduler sched(ep);
  IdIndex ids(id_table(idx.header), 0, sched, 7);
  const std::vector<RemotePtr> named = ids.find_all(std::vector<IdKey>(twice.begin(), twice.end()), kLanes);
  const uint32_t dim = idx.header.dim;
  std::vector<char> keep(s.ids.size(), 1);
  for (size_t t = 0; t < twice.size(); ++t) {
    const std::vector<size_t>& r = rows[twice[t]];
    size_t kept = r.back();  // none named (a cut-short insert): the last read
    for (size_t i : r)
      if (s.where[i] == named[t]) kept = i;
    for (size_t i : r) {
      if (i == kept) continue;
      keep[i] = 0;
      const bool same = std::memcmp(s.x.data() + i * dim, s.x.data() + kept * dim, 4ull * dim) == 0;
      ++(same ? s.copies : s.duplicates);
    }
  }
  size_t o = 0;
  for (size_t i = 0; i < s.ids.size(); ++i) {
    if (!keep[i]) continue;
    if (o != i) {
      std::memmove(s.x.data() + o * dim, s.x.data() + i * dim, 4ull * dim);
      s.ids[o] = s.ids[i];
      if (i < s.where.size()) s.where[o] = s.where[i];
    }
    ++o;
  }
  s.x.resize(o * dim);
  s.ids.resize(o);
  s.where.resize(std::min(s.where.size(), o));
}
/// Removes every key of ids[i] (its copies' too, `K` partitions at most) from the new epoch's id
/// index; at[i] gets the entries they named.
compute::Task<void> carry_lane(IdIndex& x, const std::vector<int64_t>& ids, unsigned K, size_t lane,
                               std::vector<std::vector<RemotePtr>>& at) {
  for (size_t i = lane; i < ids.size(); i += kLanes)
    for (unsigned k = 0; k < K; ++k) {
      const IdKey key = IdKey::copy_of(static_cast<uint64_t>(ids[i]), k);
      const RemotePtr p = co_await x.find(key);
      if (p.is_null()) continue;
      co_await x.erase(key, p);
      at[i].push_back(p);
    }
}

}  // namespace

Snapshot snapshot(fabric::Endpoint& ep, const Index& idx, uint32_t cn_id, bool buffer) {
  Snapshot s;
  const uint32_t dim = idx.header.dim;
  uint64_t ticket = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  for (const SubDesc& g : idx.subs) {
    if (g.slot != 0) continue;
    const GroupLock lock(ep, idx, g.id, cn_id, 2000, ticket, nullptr, nullptr, "rebuild snapshot");
    for (uint32_t id : {g.id, g.partner}) {
      if (id == kNoPartner) continue;
      SubDesc d;
      ep.read(RemotePtr(idx.subs[id].memnode, live_desc_offset(idx.header, id)), &d, sizeof d);
      const auto [off, len] = fetch_range(d);
      std::vector<char> buf(len);
      if (len > 0) ep.read(RemotePtr(d.memnode, off), buf.data(), len);
      s.bytes += len;
      const SubIndex sub = deserialize_sub(buf.data(), len, d, idx.header, "rebuild snapshot", (d.version & 1) != 0);
      auto* st = dynamic_cast<const faiss::IndexFlatCodes*>(sub.index->storage);
      const float* v = reinterpret_cast<const float*>(st->codes.data());
      const std::vector<Segment> labels = array_segments(buf.data(), len, d)[kLabels];
      for (const Segment& sg : labels)
        if (sg.bytes > 0) s.label_runs.push_back({g.id, RemotePtr(d.memnode, sg.region), sg.bytes});
      for (size_t i = 0; i < sub.labels.size(); ++i) {
        if (label_deleted(sub.labels[i])) {  // a rebuild drops what was deleted
          ++s.dropped;
          continue;
        }
        s.x.insert(s.x.end(), v + i * dim, v + (i + 1) * dim);
        s.ids.push_back(sub.labels[i]);
        RemotePtr at;
        for (const Segment& sg : labels)
          if (8 * i >= sg.logical && 8 * i < sg.logical + sg.bytes) at = RemotePtr(d.memnode, sg.region + 8 * i - sg.logical);
        s.where.push_back(at);
      }
    }
  }
  drop_duplicates(ep, idx, s);
  if (buffer) {
    // Entries committed so far go into the new epoch; what arrives later is merged after it is
    // published. Every insert is in one or the other: the merge skips ids the index holds.
    std::unordered_set<int64_t> have(s.ids.begin(), s.ids.end());
    for (const BufferedVector& e : buffer_read(ep, read_control(ep), dim)) {
      if (!have.insert(e.id).second) continue;
      s.x.insert(s.x.end(), e.v.begin(), e.v.end());
      s.ids.push_back(e.id);
      ++s.from_buffer;
    }
  }
  return s;
}

std::vector<int64_t> carry_deletes(fabric::Endpoint& ep, const Index& idx, uint32_t cn_id, const Snapshot& s,
                                   const BuiltIndex& b) {
  std::unordered_map<uint64_t, int64_t> kept;  // label entry -> id, of the vectors the snapshot kept
  kept.reserve(s.where.size());
  for (size_t i = 0; i < s.where.size(); ++i) kept.emplace(s.where[i].raw(), s.ids[i]);
  std::vector<int64_t> gone;
  uint64_t ticket = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  std::vector<char> buf;
  for (size_t r = 0; r < s.label_runs.size();) {
    const uint32_t g = s.label_runs[r].group;
    const GroupLock lock(ep, idx, g, cn_id, 2000, ticket, nullptr, nullptr, "rebuild: carrying deletes");
    for (; r < s.label_runs.size() && s.label_runs[r].group == g; ++r) {
      const auto& run = s.label_runs[r];
      buf.resize(run.bytes);
      ep.read(run.at, buf.data(), run.bytes);
      for (uint64_t o = 0; o + 8 <= run.bytes; o += 8) {
        int64_t label;
        std::memcpy(&label, buf.data() + o, 8);
        if (!label_deleted(label)) continue;
        const auto it = kept.find(RemotePtr(run.at.node(), run.at.offset() + o).raw());
        if (it != kept.end()) gone.push_back(it->second);
      }
    }
  }
  if (gone.empty()) return gone;
  compute::Scheduler sched(ep);
  IdIndex ids(id_table(b.header), 0, sched, ticket);
  const unsigned K = BoundaryRule::of(b.header).partitions();
  std::vector<std::vector<RemotePtr>> at(gone.size());
  for (size_t l = 0; l < std::min(gone.size(), kLanes); ++l) sched.spawn(carry_lane(ids, gone, K, l, at));
  sched.run();
  std::map<uint32_t, uint64_t> per_sub;
  std::vector<std::pair<RemotePtr, uint64_t>> words;  // the labels, then the subs' counts
  for (size_t i = 0; i < gone.size(); ++i) {
    if (at[i].empty()) throw std::runtime_error("dhnsw rebuild: id " + std::to_string(gone[i]) +
                                                " is not in the new epoch's id index");
    for (const RemotePtr p : at[i]) {
      words.emplace_back(p, static_cast<uint64_t>(gone[i]) | kDeletedLabel);
      bool found = false;
      for (const SubDesc& d : b.subs)
        if (d.memnode == p.node() && p.offset() >= d.block_offset && p.offset() < d.block_offset + d.block_bytes) {
          ++per_sub[d.id];
          found = true;
          break;
        }
      if (!found) throw std::runtime_error("dhnsw rebuild: the new epoch's id index names memnode " +
                                           std::to_string(p.node()) + " offset " + std::to_string(p.offset()) + ", in no sub-HNSW");
    }
  }
  for (const auto& [sub, n] : per_sub)
    words.emplace_back(RemotePtr(b.subs[sub].memnode, live_desc_offset(b.header, sub) + offsetof(SubDesc, deleted)),
                       b.subs[sub].deleted + n);
  // WRITEs of 8 bytes, many per doorbell: deletes stay closed while this runs.
  constexpr size_t kPerDoorbell = 64;
  fabric::Buffer wb = ep.alloc(8 * kPerDoorbell);
  for (size_t first = 0; first < words.size(); first += kPerDoorbell) {
    std::vector<fabric::Op> ops;
    for (size_t i = first; i < std::min(words.size(), first + kPerDoorbell); ++i) {
      std::memcpy(wb.data() + 8 * ops.size(), &words[i].second, 8);
      ops.push_back(fabric::Op::write(words[i].first, wb.data() + 8 * ops.size(), 8, ops.size()));
    }
    if (ep.post(ops) != fabric::Status::Ok) throw fabric::FabricError("dhnsw rebuild: writing carried deletes failed");
    ep.wait_all(ops.size());
  }
  return gone;
}

}  // namespace dmhnsw::dhnsw
