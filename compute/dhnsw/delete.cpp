// d-HNSW deletes (and an upsert's withdrawal of the vector it replaced): the label entry's top
// bit, set under the group's lock and seqlocked like a commit, then the id's entry removed.
#include <spdlog/spdlog.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/insert.hpp"

namespace dmhnsw::dhnsw {

void Inserter::rebuild_for_deletes() {
  spdlog::info("dhnsw: a sub-HNSW's deleted share passed {:.2f}: starting an online rebuild", t_.rebuild_deleted);
  rebuild(false);  // another master's rebuild drops them as well
  reload();
}

std::vector<int64_t> Inserter::remove(const int64_t* ids, size_t n) {
  if (!ids_)
    throw std::invalid_argument("dhnsw delete: the index has no id index (built by an earlier version); build it again");
  std::vector<int64_t> pending;
  {
    std::unordered_set<int64_t> seen;
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] < 0) throw std::invalid_argument("dhnsw delete: id " + std::to_string(ids[i]) + " is negative");
      if (seen.insert(ids[i]).second) pending.push_back(ids[i]);
    }
  }
  std::vector<int64_t> missing, later;
  std::unordered_set<int64_t> touched;  // ids with an entry marked: found, whatever a later round sees
  // With boundary copies, an id whose entries were marked is looked up again until none is left:
  // an insert maps a row's copies after its own entry, so a round may miss copies mapped
  // meanwhile; an insert that maps one after the last look finds its own label marked and
  // withdraws its copies (Inserter::own_gone).
  std::vector<int64_t> verify;
  bool rebuild = false;
  while (!pending.empty() || !later.empty() || !verify.empty()) {
    uint64_t phase;
    if (pending.empty() && later.empty()) {
      pending.swap(verify);
      phase = wait_for_idle(true);
    } else if (pending.empty()) {
      // Ids the id index lacked while a rebuild ran may be in its insert buffer, which the merge
      // empties into the index: they are looked up again once it is idle.
      pending.swap(later);
      phase = wait_for_idle(false);
    } else {
      phase = wait_for_idle(true);
    }
    // Every copy of each id (compute/dhnsw/boundary.hpp): its primary and copy keys 1 .. K-1.
    const unsigned K = copies_max();
    std::vector<IdKey> keys;
    keys.reserve(pending.size() * K);
    for (int64_t id : pending)
      for (unsigned k = 0; k < K; ++k) keys.push_back(IdKey::copy_of(static_cast<uint64_t>(id), k));
    const std::vector<RemotePtr> at = lookup(keys);
    std::vector<std::pair<int64_t, RemotePtr>> e;
    std::vector<IdKey> ekeys;
    for (size_t i = 0; i < pending.size(); ++i) {
      bool any = false;
      for (unsigned k = 0; k < K; ++k)
        if (!at[i * K + k].is_null()) {
          e.emplace_back(pending[i], at[i * K + k]);
          ekeys.push_back(keys[i * K + k]);
          any = true;
        }
      if (any || touched.count(pending[i]) != 0) continue;
      if (phase == kIdle) missing.push_back(pending[i]);
      else later.push_back(pending[i]);
    }
    std::vector<char> done(e.size(), 0), gone(e.size(), 0);
    const Marked m = mark_deleted(e, done, gone, rebuild);
    // Unmapped second: a delete cut short here leaves a marked entry, which no lookup matches.
    unmap_ids(ekeys, e, done);
    pending.clear();
    // Per id of this round: its entries all gone (deleted or moved meanwhile: not found), some
    // marked (looked up again with copies), some neither (the epoch moved or a rebuild began).
    std::unordered_set<int64_t> held, marked, again, reported;  // held: some entry still held the id
    for (size_t i = 0; i < e.size(); ++i) {
      const int64_t id = e[i].first;
      if (!gone[i]) held.insert(id);
      if (done[i] && marked.insert(id).second) {
        touched.insert(id);
        if (K > 1) verify.push_back(id);
      }
      if (!gone[i] && !done[i] && again.insert(id).second) pending.push_back(id);
    }
    for (const auto& entry : e)
      if (held.count(entry.first) == 0 && touched.count(entry.first) == 0 && reported.insert(entry.first).second)
        missing.push_back(entry.first);
    if (m == Marked::EpochMoved) {
      ++st_.epoch_moves;
      reload();
    }
  }
  st_.not_found += missing.size();
  if (rebuild) rebuild_for_deletes();
  ack();
  return missing;
}

Inserter::Marked Inserter::mark_deleted(const std::vector<std::pair<int64_t, RemotePtr>>& e, std::vector<char>& done,
                                        std::vector<char>& gone, bool& rebuild) {
  std::map<uint32_t, std::vector<size_t>> by_group;
  for (size_t i = 0; i < e.size(); ++i) {
    if (done[i] || gone[i]) continue;
    const uint32_t g = group_of(e[i].second);
    if (g == kNoPartner) {
      gone[i] = 1;  // not in this epoch's groups (an entry left from before a rebuild)
      continue;
    }
    by_group[g].push_back(i);
  }
  const Index& idx = *index_;
  for (const auto& [g0, rows] : by_group) {
    const GroupLock lock(ep_, idx, g0, cn_id_, t_.lease_ms, ticket_, &st_.lock_waits, &st_.lock_takeovers, "delete");
    const uint64_t mine = lock.word();
    const Control ctl = read_control(ep_);
    if (ctl.epoch != idx.header.epoch) return Marked::EpochMoved;
    if (!merge_ && !deletes_open(ctl)) return Marked::NotIdle;
    const SubDesc& s0 = idx.subs[g0];
    const uint16_t mem = s0.memnode;
    const uint32_t subs[2] = {g0, s0.partner};
    // One doorbell: both live descriptors and the label entries.
    fabric::Buffer buf = ep_.alloc(2 * sizeof(SubDesc) + 8 * rows.size());
    std::vector<fabric::Op> ops;
    for (int k = 0; k < 2; ++k)
      if (subs[k] != kNoPartner)
        ops.push_back(fabric::Op::read(RemotePtr(mem, live_desc_offset(idx.header, subs[k])),
                                       buf.data() + k * sizeof(SubDesc), sizeof(SubDesc), ops.size()));
    for (size_t j = 0; j < rows.size(); ++j)
      ops.push_back(fabric::Op::read(e[rows[j]].second, buf.data() + 2 * sizeof(SubDesc) + 8 * j, 8, ops.size()));
    if (ep_.post(ops) != fabric::Status::Ok) throw fabric::FabricError("dhnsw delete: reading a group failed");
    ep_.wait_all(ops.size());
    SubDesc d[2]{};
    for (int k = 0; k < 2; ++k)
      if (subs[k] != kNoPartner) std::memcpy(&d[k], buf.data() + k * sizeof(SubDesc), sizeof(SubDesc));
    // Which sub holds each entry: its block, or its side of the shared gap.
    auto owner = [&](uint64_t off) -> int {
      for (int k = 0; k < 2; ++k)
        if (subs[k] != kNoPartner && off >= d[k].block_offset && off < d[k].block_offset + d[k].block_bytes) return k;
      const SubDesc& a = d[0];
      if (off >= a.overflow_offset && off < a.overflow_offset + a.overflow_used) return 0;
      if (subs[1] != kNoPartner && off < a.overflow_offset + a.overflow_bytes &&
          off >= a.overflow_offset + a.overflow_bytes - d[1].overflow_used)
        return 1;
      return -1;
    };
    std::vector<std::pair<RemotePtr, int64_t>> writes;
    uint64_t marked[2] = {0, 0};
    for (size_t j = 0; j < rows.size(); ++j) {
      const auto& [id, at] = e[rows[j]];
      int64_t label;
      std::memcpy(&label, buf.data() + 2 * sizeof(SubDesc) + 8 * j, 8);
      const int k = owner(at.offset());
      if (label != id || k < 0) {
        gone[rows[j]] = 1;
        continue;
      }
      writes.emplace_back(at, static_cast<int64_t>(static_cast<uint64_t>(id) | kDeletedLabel));
      ++marked[k];
    }
    if (writes.empty()) continue;
    if (ep_.compare_swap(RemotePtr(mem, live_desc_offset(idx.header, g0) + offsetof(SubDesc, lock)), mine, mine) != mine)
      throw std::runtime_error("dhnsw delete: lost the lock of sub-HNSW " + std::to_string(g0) + "'s group before committing");
    // Seqlocked as a commit: version odd, the labels and the counts, version even. A version
    // found odd (a writer died inside a commit) stays odd for the next inserter to repair.
    // Words: up to 2 odd versions, the labels, up to 2 counts, up to 2 even versions.
    fabric::Buffer w = ep_.alloc(8 * (writes.size() + 6));
    auto post = [&](std::vector<fabric::Op>& o) {
      if (o.empty()) return;
      if (ep_.post(o) != fabric::Status::Ok) throw fabric::FabricError("dhnsw delete: posting to memnode " + std::to_string(mem) + " failed");
      ++st_.doorbells;
      st_.writes += o.size();
      ep_.wait_all(o.size());
      o.clear();
    };
    std::vector<fabric::Op> o;
    size_t slot = 0;
    auto word = [&](RemotePtr p, uint64_t v) {
      std::memcpy(w.data() + 8 * slot, &v, 8);
      o.push_back(fabric::Op::write(p, w.data() + 8 * slot, 8, o.size()));
      ++slot;
      st_.bytes_written += 8;
    };
    auto field = [&](int k, size_t f) { return RemotePtr(mem, live_desc_offset(idx.header, subs[k]) + f); };
    for (int k = 0; k < 2; ++k)
      if (marked[k] > 0 && (d[k].version & 1) == 0) word(field(k, offsetof(SubDesc, version)), d[k].version + 1);
    post(o);
    for (size_t j = 0; j < writes.size(); ++j) {
      word(writes[j].first, static_cast<uint64_t>(writes[j].second));
      if (o.size() >= t_.max_write_ops) post(o);
    }
    for (int k = 0; k < 2; ++k)
      if (marked[k] > 0) word(field(k, offsetof(SubDesc, deleted)), d[k].deleted + marked[k]);
    post(o);
    for (int k = 0; k < 2; ++k)
      if (marked[k] > 0 && (d[k].version & 1) == 0) word(field(k, offsetof(SubDesc, version)), d[k].version + 2);
    post(o);
    for (int k = 0; k < 2; ++k)
      if (marked[k] > 0 && t_.rebuild_deleted > 0 &&
          static_cast<double>(d[k].deleted + marked[k]) > t_.rebuild_deleted * static_cast<double>(d[k].count))
        rebuild = true;
    for (size_t j = 0; j < rows.size(); ++j)
      if (!gone[rows[j]]) done[rows[j]] = 1;
    {  // vectors: an id's copies (compute/dhnsw/boundary.hpp) count once
      std::unordered_set<int64_t> ids;
      for (const auto& [at, label] : writes) ids.insert(static_cast<int64_t>(static_cast<uint64_t>(label) & ~kDeletedLabel));
      st_.deleted += ids.size();
    }
  }
  return Marked::Done;
}

}  // namespace dmhnsw::dhnsw
