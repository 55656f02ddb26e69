#include "compute/dhnsw/insert.hpp"

#include <faiss/IndexFlatCodes.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/timing.hpp"
#include "compute/dhnsw/commit.hpp"
#include "compute/dhnsw/epoch.hpp"
#include "compute/dhnsw/insert_buffer.hpp"
#include "compute/dhnsw/subindex.hpp"

namespace dmhnsw::dhnsw {

namespace {

std::string num(uint64_t v) { return std::to_string(v); }


}  // namespace

nlohmann::json InsertStats::to_json(double seconds) const {
  // Per vector acknowledged; a delete run (nothing inserted) per vector it deleted.
  const uint64_t per = inserted > 0 ? inserted : deleted;
  const double n = per > 0 ? static_cast<double>(per) : 1.0;
  return {{"inserted", inserted},
          {"seconds", seconds},
          {"inserts_per_s", seconds > 0 ? static_cast<double>(inserted) / seconds : 0.0},
          {"commits", commits},
          {"writes", writes},
          {"doorbells", doorbells},
          {"bytes_written", bytes_written},
          {"bytes_fetched", bytes_fetched},
          {"per_insert", {{"writes", static_cast<double>(writes) / n},
                          {"doorbells", static_cast<double>(doorbells) / n},
                          {"bytes_written", static_cast<double>(bytes_written) / n}}},
          {"appended_bytes", appended_bytes},
          {"overwritten_bytes", overwritten_bytes},
          {"overflow_records", overflow_records},
          {"lock_waits", lock_waits},
          {"lock_takeovers", lock_takeovers},
          {"repairs", repairs},
          {"sanitized_entries", sanitized_entries},
          {"buffered", buffered},
          {"rebuilds", rebuilds},
          {"epoch_moves", epoch_moves},
          {"duplicates_skipped", duplicates_skipped},
          {"deleted", deleted},
          {"not_found", not_found},
          {"replaced", replaced},
          {"id_lookups", id_lookups},
          {"rebuild_waits", rebuild_waits},
          {"upserts_redone", redone},
          {"rebuild_reports", rebuild_reports},
          {"commit_us", {{"p50", percentile(commit_us, 0.5)}, {"p99", percentile(commit_us, 0.99)},
                         {"max", commit_us.empty() ? 0.0 : *std::max_element(commit_us.begin(), commit_us.end())}}}};
}

Inserter::Inserter(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, InsertTuning t)
    : c_(c), ep_(ep), cn_id_(cn_id), t_(t) {
  ticket_ = std::random_device{}();
  if (const char* p = std::getenv("DMHNSW_TEST_PAUSE_IN_COMMIT_MS")) pause_in_commit_ms_ = std::atoi(p);
  reload();
}

void Inserter::reload() {
  index_ = std::make_unique<Index>(load_index(c_, ep_));
  if (!index_->meta) throw std::invalid_argument("dhnsw insert: the index has no meta-HNSW");
  ids_.reset();
  if (!sched_) sched_ = std::make_unique<compute::Scheduler>(ep_);
  if (index_->header.id_buckets > 0)
    ids_ = std::make_unique<IdIndex>(id_table(index_->header), 0, *sched_, ticket_ ^ 0x1d1d);
  rule_ = BoundaryRule::of(index_->header);
  placement_.reset();
  if (rule_.enabled()) {
    const auto* st = dynamic_cast<const faiss::IndexFlatCodes*>(index_->meta->storage);
    const uint32_t P = index_->header.num_subs, dim = index_->header.dim;
    if (st == nullptr || static_cast<size_t>(st->ntotal) != P || st->codes.size() != size_t{4} * P * dim)
      throw std::runtime_error("dhnsw insert: the meta-HNSW does not hold the " + num(P) + " partitions' centroids");
    placement_.emplace(reinterpret_cast<const float*>(st->codes.data()), P, dim, rule_);
  }
  ack();
}

namespace {

constexpr size_t kIdLanes = 16;  // id index operations in flight at once

compute::Task<void> map_lane(IdIndex& x, const std::vector<IdKey>& keys, const std::vector<std::pair<int64_t, RemotePtr>>& items,
                             bool replace, size_t lane, std::vector<IdIndex::PutResult>& out) {
  for (size_t i = lane; i < items.size(); i += kIdLanes) {
    const IdIndex::PutResult r = co_await x.insert(keys[i], items[i].second, replace);
    out[i] = r;
  }
}

compute::Task<void> erase_lane(IdIndex& x, const std::vector<IdKey>& keys, const std::vector<std::pair<int64_t, RemotePtr>>& items,
                               const std::vector<char>& which, size_t lane) {
  for (size_t i = lane; i < items.size(); i += kIdLanes) {
    if (!which[i]) continue;
    const RemotePtr was = co_await x.erase(keys[i], items[i].second);
    (void)was;  // null: the entry was already gone or names another place (an upsert moved it)
  }
}

}  // namespace

std::vector<RemotePtr> Inserter::lookup(const std::vector<IdKey>& keys) {
  if (!ids_) return std::vector<RemotePtr>(keys.size());
  st_.id_lookups += keys.size();
  return ids_->find_all(keys, kIdLanes);
}

void Inserter::map_ids(const std::vector<IdKey>& keys, const std::vector<std::pair<int64_t, RemotePtr>>& placed) {
  if (!ids_ || placed.empty()) return;
  std::vector<IdIndex::PutResult> r(placed.size(), IdIndex::PutResult{IdIndex::Put::Inserted, {}});
  for (size_t l = 0; l < std::min(placed.size(), kIdLanes); ++l)
    sched_->spawn(map_lane(*ids_, keys, placed, upsert_, l, r));
  sched_->run();
  for (size_t i = 0; i < placed.size(); ++i) {
    if (r[i].what != IdIndex::Put::Present) mapped_.emplace_back(keys[i], placed[i].second);
    if (r[i].what == IdIndex::Put::Replaced && r[i].old != placed[i].second) {
      replaced_.emplace_back(placed[i].first, r[i].old);
    } else if (r[i].what == IdIndex::Put::Present && r[i].old != placed[i].second) {
      // Another computenode inserted the id meanwhile: it keeps it. A copy key taken by another's
      // copy loses only that copy of ours; the id is lost when its own key was.
      (keys[i].copy == 0 ? lost_ : unmapped_copies_).push_back(placed[i]);
    }
  }
}

void Inserter::unmap_ids(const std::vector<IdKey>& keys, const std::vector<std::pair<int64_t, RemotePtr>>& e,
                         const std::vector<char>& which) {
  if (!ids_) return;
  for (size_t l = 0; l < std::min(e.size(), kIdLanes); ++l) sched_->spawn(erase_lane(*ids_, keys, e, which, l));
  sched_->run();
}

uint64_t Inserter::wait_for_idle(bool deletes) {
  uint64_t seen = ~uint64_t{0};
  auto since = Clock::now();
  bool waited = false;
  uint64_t phase = kIdle;
  for (;;) {
    const Control ctl = read_control(ep_);
    phase = ctl.phase;
    if (deletes ? deletes_open(ctl) : ctl.phase == kIdle) break;
    if (!waited) {
      waited = true;
      ++st_.rebuild_waits;
    }
    const auto now = Clock::now();
    if (ctl.master != seen) {
      seen = ctl.master;
      since = now;
    } else if (now - since > std::chrono::milliseconds(std::max<uint32_t>(t_.lease_ms, 2000) + 5000)) {
      // The master's word has not moved for longer than its lease: it died; finish its work.
      rebuild(true);
      since = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (waited || read_control(ep_).epoch != index_->header.epoch) reload();
  return phase;
}

uint32_t Inserter::group_of(RemotePtr p) const {
  for (const SubDesc& d : index_->subs)
    if (d.slot == 0 && d.memnode == p.node() && p.offset() >= d.group_offset && p.offset() < d.group_offset + d.group_bytes)
      return d.id;
  return kNoPartner;
}

void Inserter::ack() { write_control_word(ep_, ack_ptr(cn_id_), ack_word(index_->header.epoch, ++beat_)); }

void Inserter::post_writes(uint16_t memnode, const std::vector<std::pair<uint64_t, const std::vector<char>*>>& w) {
  uint64_t total = 0;
  for (const auto& [off, bytes] : w) total += bytes->size();
  if (total == 0) return;
  fabric::Buffer buf = ep_.alloc(total);
  std::vector<fabric::Op> ops;
  uint64_t at = 0;
  auto flush = [&] {
    if (ops.empty()) return;
    if (ep_.post(ops) != fabric::Status::Ok)
      throw fabric::FabricError("dhnsw insert: posting a commit to memnode " + num(memnode) + " failed");
    ++st_.doorbells;
    st_.writes += ops.size();
    ep_.wait_all(ops.size());
    ops.clear();
  };
  for (const auto& [off, bytes] : w) {
    if (bytes->empty()) continue;
    std::memcpy(buf.data() + at, bytes->data(), bytes->size());
    ops.push_back(fabric::Op::write(RemotePtr(memnode, off), buf.data() + at, bytes->size(), ops.size()));
    at += bytes->size();
    st_.bytes_written += bytes->size();
    if (ops.size() >= t_.max_write_ops) flush();
  }
  flush();
}

/// A sub-HNSW as fetched under its group's lock, deserialized to insert into.
struct Inserter::Fetched {
  SubDesc d{}, pd{};  // its live descriptor, and its partner's (for the shared gap)
  bool repair = false;
  SubIndex s;
  ArraySegments segs;
  std::vector<int32_t> old_nb;  // its neighbour array as fetched (prepare_commit writes the changed ranges)
};

Inserter::Outcome Inserter::insert_into(uint32_t sub, const float* x, const int64_t* ids, size_t n) {
  const Index& index_ = *this->index_;
  const SubDesc& sd = index_.subs.at(sub);
  const uint32_t g0 = sd.slot == 0 ? sub : sd.partner;
  const auto t0 = Clock::now();
  const GroupLock lock(ep_, index_, g0, cn_id_, t_.lease_ms, ticket_, &st_.lock_waits, &st_.lock_takeovers, "insert");
  // Under the lock: is this still the live epoch, and is no rebuild snapshotting it?
  const Control ctl = read_control(ep_);
  if (ctl.epoch != index_.header.epoch) return Outcome::EpochMoved;
  if (ctl.phase == kBuilding && !merge_) return Outcome::UseBuffer;

  Fetched f = fetch_sub(sub);
  // 3. Local insert.
  std::vector<float> kept_x;
  std::vector<int64_t> kept_ids;
  {
    std::unordered_set<int64_t> have(f.s.labels.begin(), f.s.labels.end());
    for (size_t i = 0; i < n; ++i) {
      if (!have.insert(ids[i]).second && !upsert_) {  // an upsert marks the old one deleted after
        if (!merge_)
          throw std::invalid_argument("dhnsw insert: id " + std::to_string(ids[i]) +
                                      " is already in the index (sub-HNSW " + num(sub) + ")");
        ++st_.duplicates_skipped;  // merged before a rebuild was cut short
        continue;
      }
      kept_x.insert(kept_x.end(), x + i * index_.header.dim, x + (i + 1) * index_.header.dim);
      kept_ids.push_back(ids[i]);
    }
  }
  if (kept_ids.empty()) return Outcome::Done;
  f.s.index->add(static_cast<faiss::Index::idx_t>(kept_ids.size()), kept_x.data());
  f.s.labels.insert(f.s.labels.end(), kept_ids.begin(), kept_ids.end());
  if (index_.codes) {  // the new vectors' codes go into the codes array with them
    const size_t old = f.s.codes.size(), cs = index_.codes->code_size();
    f.s.codes.resize(old + kept_ids.size() * cs);
    index_.codes->encode(kept_x.data(), kept_ids.size(), f.s.codes.data() + old);
  }
  commit(sub, lock.word(), f, kept_ids);
  st_.commit_us.push_back(seconds_since(t0) * 1e6);
  return Outcome::Done;
}

Inserter::Fetched Inserter::fetch_sub(uint32_t sub) {
  const Index& index_ = *this->index_;
  const SubDesc& sd = index_.subs.at(sub);
  Fetched f;
  // 1. Live descriptors: the sub's and its partner's (for the shared gap).
  const uint32_t partner = sd.partner;
  fabric::Buffer dbuf = ep_.alloc(2 * sizeof(SubDesc));
  std::vector<fabric::Op> ops{fabric::Op::read(live_ptr(sub), dbuf.data(), sizeof(SubDesc), 0)};
  if (partner != kNoPartner) ops.push_back(fabric::Op::read(live_ptr(partner), dbuf.data() + sizeof(SubDesc), sizeof(SubDesc), 1));
  if (ep_.post(ops) != fabric::Status::Ok) throw fabric::FabricError("dhnsw insert: reading descriptors failed");
  ep_.wait_all(ops.size());
  SubDesc& d = f.d;
  std::memcpy(&d, dbuf.data(), sizeof d);
  if (partner != kNoPartner) std::memcpy(&f.pd, dbuf.data() + sizeof(SubDesc), sizeof f.pd);
  // The live copy must be the same sub in the same place as the table cached at load.
  if (static_part(d).block_offset != sd.block_offset || d.id != sub || d.overflow_used > d.overflow_bytes)
    throw std::runtime_error("dhnsw insert: the live descriptor of sub-HNSW " + num(sub) + " on memnode " +
                             num(sd.memnode) + " does not match the metadata block (was the index rebuilt?)");
  f.repair = (d.version & 1) != 0;

  // 2. Fetch and deserialize.
  const auto [off, len] = fetch_range(d);
  fabric::Buffer fb = ep_.alloc(std::max<uint64_t>(len, 64));
  if (len > 0) ep_.read(RemotePtr(d.memnode, off), fb.data(), len);
  st_.bytes_fetched += len;
  const std::string what = "memnode " + num(d.memnode);
  f.s = deserialize_sub(fb.data(), len, d, index_.header, what, f.repair);
  if (f.repair) {
    ++st_.repairs;
    st_.sanitized_entries += f.s.sanitized;
    spdlog::warn("dhnsw insert: sub-HNSW {} was left inside a commit (version {}); repaired ({} neighbour entries "
                 "dropped)", sub, d.version, f.s.sanitized);
  }
  f.segs = array_segments(fb.data(), len, d);
  const std::vector<char> raw = gather(fb.data(), d, f.segs[kNeighbors]);
  f.old_nb.resize(raw.size() / 4);
  std::memcpy(f.old_nb.data(), raw.data(), raw.size());
  return f;
}

void Inserter::commit(uint32_t sub, uint64_t mine, const Fetched& f, const std::vector<int64_t>& kept_ids) {
  const SubDesc& d = f.d;
  const uint32_t partner = index_->subs.at(sub).partner;
  const uint32_t g0 = index_->subs.at(sub).slot == 0 ? sub : partner;
  // 4. Commit.
  const UpdateCommit cm =
      prepare_commit(d, f.segs, f.old_nb, f.s, partner != kNoPartner ? &f.pd : nullptr, index_->header.dim,
                     index_->header.code_size);
  if (ep_.compare_swap(live_ptr(g0, offsetof(SubDesc, lock)), mine, mine) != mine)
    throw std::runtime_error("dhnsw insert: lost the lock of sub-HNSW " + num(sub) + "'s group before committing");
  fabric::Buffer word = ep_.alloc(8);
  auto put_version = [&](uint64_t v) {
    std::memcpy(word.data(), &v, 8);
    ep_.write(live_ptr(sub, offsetof(SubDesc, version)), word.data(), 8);
    ++st_.writes, ++st_.doorbells, st_.bytes_written += 8;
  };
  if (!f.repair) put_version(d.version + 1);
  std::vector<std::pair<uint64_t, const std::vector<char>*>> w;
  for (const RegionWrite& rw : cm.writes) w.emplace_back(rw.offset, &rw.bytes);
  post_writes(d.memnode, w);
  if (pause_in_commit_ms_ > 0) {  // fault injection for the tests: a writer dying here leaves an odd version
    std::printf("dhnsw insert: paused inside the commit of sub-HNSW %u\n", sub);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_in_commit_ms_));
  }
  const std::vector<char> live(reinterpret_cast<const char*>(&cm.desc) + kLiveFieldsBegin,
                               reinterpret_cast<const char*>(&cm.desc) + kLiveFieldsEnd);
  post_writes(d.memnode, {{live_desc_offset(index_->header, sub) + kLiveFieldsBegin, &live}});
  put_version(cm.desc.version);
  // The label entries of the new vectors, for the id index (mapped after the lock is released).
  placed_.clear();
  for (size_t j = 0; j < kept_ids.size(); ++j) {
    const uint64_t at = 8 * (d.count + j);
    for (const Segment& sg : cm.label_tail)
      if (at >= sg.logical && at < sg.logical + sg.bytes) {
        placed_.emplace_back(kept_ids[j], RemotePtr(d.memnode, sg.region + (at - sg.logical)));
        break;
      }
  }
  ++st_.commits;
  st_.appended_bytes += cm.appended_bytes;
  st_.overwritten_bytes += cm.overwritten_bytes;
  st_.overflow_records += cm.overflow_records;
}

RemotePtr Inserter::live_ptr(uint32_t sub, size_t field) const {
  return RemotePtr(index_->subs.at(sub).memnode, live_desc_offset(index_->header, sub) + field);
}

Inserter::Outcome Inserter::commit_rows(uint32_t sub, const float* x, const int64_t* ids, const std::vector<size_t>& rows,
                                         std::vector<char>& done) {
  const uint32_t dim = index_->header.dim;
  std::vector<float> xs(rows.size() * dim);
  std::vector<int64_t> is(rows.size());
  std::unordered_map<int64_t, unsigned> copy_of;  // a sub takes one copy of an id at most
  for (size_t j = 0; j < rows.size(); ++j) {
    const size_t row = rows[j] / kMaxCopies;
    std::memcpy(xs.data() + j * dim, x + row * dim, 4ull * dim);
    is[j] = ids[row];
    if (rows[j] % kMaxCopies != 0) copy_of[is[j]] = static_cast<unsigned>(rows[j] % kMaxCopies);
  }
  try {
    placed_.clear();
    const Outcome r = insert_into(sub, xs.data(), is.data(), rows.size());
    if (r == Outcome::Done) {
      std::vector<IdKey> keys;
      keys.reserve(placed_.size());
      for (const auto& [id, at] : placed_) {
        const auto it = copy_of.find(id);
        keys.push_back(IdKey::copy_of(static_cast<uint64_t>(id), it == copy_of.end() ? 0 : it->second));
      }
      map_ids(keys, placed_);
      for (size_t slot : rows) done[slot] = 1;
      for (size_t j = 0; j < keys.size(); ++j) ++(keys[j].copy == 0 ? st_.inserted : st_.copies);
      // Which copies of each row are in, and in which epoch its own partition took it.
      for (size_t slot : rows) {
        const size_t row = slot / kMaxCopies, k = slot % kMaxCopies;
        if (k == 0) {
          row_epoch_[row] = index_->header.epoch;
          placed_copies_[row] = 1;
        } else if (row_epoch_[row] == index_->header.epoch) {
          placed_copies_[row] |= static_cast<uint8_t>(1u << k);
        }
      }
    }
    return r;
  } catch (const CommitDoesNotFit&) {
    if (rows.size() == 1) throw;
  }
  // Too much for the gap at once: fill it with smaller commits; a rebuild starts when even one
  // vector does not fit.
  const std::vector<size_t> a(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(rows.size() / 2));
  const std::vector<size_t> b(rows.begin() + static_cast<std::ptrdiff_t>(rows.size() / 2), rows.end());
  const Outcome r = commit_rows(sub, x, ids, a, done);
  if (r != Outcome::Done) return r;
  return commit_rows(sub, x, ids, b, done);
}

void Inserter::insert(const float* x, const int64_t* ids, size_t n, bool upsert) {
  if (n == 0) return;
  begin_batch(ids, n, upsert);
  std::vector<size_t> pending(n);
  for (size_t i = 0; i < n; ++i) pending[i] = i;
  std::vector<char> done(n * kMaxCopies, 0);
  while (!pending.empty()) {
    std::fill(done.begin(), done.end(), 0);
    // Every row's primary first, then its boundary copies: a row is in once its primary is (and
    // the id index names it). A copy cut off by a rebuild comes with it: the rebuild's snapshot
    // reads every group after this batch's commits, and the next epoch places copies anew.
    std::map<uint32_t, std::vector<size_t>> copies;
    bool moved = false;
    for (auto& [sub, slots] : route(x, pending)) {
      std::vector<size_t> primaries;
      for (size_t slot : slots) (slot % kMaxCopies == 0 ? primaries : copies[sub]).push_back(slot);
      if (!primaries.empty() && !place(sub, x, ids, primaries, done)) {
        moved = true;  // the epoch or the phase moved: route again
        break;
      }
    }
    if (!moved)
      for (const auto& [sub, slots] : copies)
        if (!place(sub, x, ids, slots, done)) break;
    std::vector<size_t> next;
    for (size_t i : pending)
      if (!done[i * kMaxCopies]) next.push_back(i);
    pending.swap(next);
  }
  finish_batch(x, ids, n);
}

void Inserter::begin_batch(const int64_t* ids, size_t n, bool upsert) {
  std::unordered_set<int64_t> seen;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0) throw std::invalid_argument("dhnsw insert: id " + std::to_string(ids[i]) + " is negative");
    if (!seen.insert(ids[i]).second)
      throw std::invalid_argument("dhnsw insert: id " + std::to_string(ids[i]) + " appears twice in one batch");
  }
  if (upsert && !ids_)
    throw std::invalid_argument("dhnsw upsert: the index has no id index (built by an earlier version); build it again");
  upsert_ = upsert && !merge_;
  replaced_.clear();
  lost_.clear();
  mapped_.clear();
  placed_copies_.assign(n, 0);
  row_epoch_.assign(n, 0);
  unmapped_copies_.clear();
  if (upsert_) wait_for_idle();  // the buffer takes no upserts: they go in place
  if (ids_ && !merge_ && !upsert_) {
    // Refused before anything is inserted: an id the index holds.
    const std::vector<RemotePtr> at = lookup(std::vector<IdKey>(ids, ids + n));
    for (size_t i = 0; i < n; ++i)
      if (!at[i].is_null())
        throw std::invalid_argument("id " + std::to_string(ids[i]) + " is already in the index (an upsert replaces it)");
  }
}

std::map<uint32_t, std::vector<size_t>> Inserter::route(const float* x, const std::vector<size_t>& rows) {
  const uint32_t dim = index_->header.dim;
  std::vector<float> xs(rows.size() * dim);
  for (size_t j = 0; j < rows.size(); ++j) std::memcpy(xs.data() + j * dim, x + rows[j] * dim, 4ull * dim);
  std::map<uint32_t, std::vector<size_t>> by_sub;
  if (placement_) {  // exact distances to the centroids, as the build placed copies
    const auto to = placement_->place(xs.data(), rows.size(), nullptr);
    for (size_t j = 0; j < rows.size(); ++j)
      for (size_t k = 0; k < to[j].size(); ++k) by_sub[to[j][k]].push_back(rows[j] * kMaxCopies + k);
    return by_sub;
  }
  std::vector<float> D(rows.size());
  std::vector<faiss::Index::idx_t> I(rows.size());
  index_->meta->hnsw.efSearch = static_cast<int>(t_.meta_ef_search);
  index_->meta->search(static_cast<faiss::Index::idx_t>(rows.size()), xs.data(), 1, D.data(), I.data());
  for (size_t j = 0; j < rows.size(); ++j) {
    if (I[j] < 0 || I[j] >= static_cast<faiss::Index::idx_t>(index_->header.num_subs))
      throw std::runtime_error("dhnsw insert: the meta-HNSW routed a vector to partition " + std::to_string(I[j]));
    by_sub[static_cast<uint32_t>(I[j])].push_back(rows[j] * kMaxCopies);
  }
  return by_sub;
}

bool Inserter::place(uint32_t sub, const float* x, const int64_t* ids, const std::vector<size_t>& rows,
                     std::vector<char>& done) {
  Outcome r;
  try {
    r = commit_rows(sub, x, ids, rows, done);
  } catch (const CommitDoesNotFit& e) {
    if (merge_) throw;
    // The group's shared gap is full: rebuild (as master, or wait for the one who is).
    const auto now = std::chrono::steady_clock::now();
    if (!skipped_since_) spdlog::info("dhnsw insert: {}: starting an online rebuild", e.what());
    // Another master works: its inserts go to the buffer meanwhile, so do not wait for it.
    // But a master that died after publishing leaves its word set and no buffer open:
    // once we were turned away for a whole lease, watch the word and take it over.
    const auto lease = std::chrono::milliseconds(std::max<uint32_t>(t_.lease_ms, 2000));
    if (rebuild(skipped_since_ && now - *skipped_since_ > lease)) {
      skipped_since_.reset();
    } else {
      if (!skipped_since_) skipped_since_ = now;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    reload();
    return false;
  }
  switch (r) {
    case Outcome::Done:
      skipped_since_.reset();
      return true;
    case Outcome::EpochMoved:
      skipped_since_.reset();
      ++st_.epoch_moves;
      reload();
      return false;
    case Outcome::UseBuffer:
      if (upsert_) {  // a rebuild runs: an upsert waits for it, then goes in place
        wait_for_idle();
        return false;
      }
      // Copies of rows whose primaries are in: the rebuild places them (see insert()).
      if (rows.front() % kMaxCopies != 0) return false;
      return append_to_buffer(x, ids, rows, done);
  }
  return false;
}

bool Inserter::append_to_buffer(const float* x, const int64_t* ids, const std::vector<size_t>& rows,
                                std::vector<char>& done) {
  const uint32_t dim = index_->header.dim;
  const Control ctl = read_control(ep_);
  bool all = true;
  for (size_t slot : rows) {
    if (done[slot]) continue;
    const size_t row = slot / kMaxCopies;
    const AppendResult a = buffer_append(ep_, ctl, x + row * dim, dim, ids[row]);
    if (a == AppendResult::Ok) {
      done[slot] = 1;
      ++st_.buffered;
      ++st_.inserted;
      continue;
    }
    if (a == AppendResult::Full) {
      // The buffer is full: the master may be dead. Watch its word (taking over a dead one's
      // rebuild), else wait for the live one to publish.
      spdlog::warn("dhnsw insert: the insert buffer's bucket is full while a rebuild runs; waiting for it");
      rebuild(true);
      reload();
    }
    all = false;
  }
  return all;
}

std::vector<int64_t> Inserter::own_gone() {
  std::unordered_map<int64_t, RemotePtr> own;  // ids with copies mapped -> their own label entry
  std::unordered_set<int64_t> with_copies;
  for (const auto& [key, at] : mapped_) {
    if (key.copy == 0) own.emplace(static_cast<int64_t>(key.label), at);
    else with_copies.insert(static_cast<int64_t>(key.label));
  }
  std::vector<std::pair<int64_t, RemotePtr>> check;
  for (const auto& [id, at] : own)
    if (with_copies.count(id) != 0) check.emplace_back(id, at);
  std::vector<int64_t> gone;
  constexpr size_t kPerDoorbell = 256;
  fabric::Buffer buf = ep_.alloc(8 * kPerDoorbell);
  for (size_t first = 0; first < check.size(); first += kPerDoorbell) {
    const size_t m = std::min(kPerDoorbell, check.size() - first);
    std::vector<fabric::Op> ops;
    for (size_t j = 0; j < m; ++j) ops.push_back(fabric::Op::read(check[first + j].second, buf.data() + 8 * j, 8, j));
    if (ep_.post(ops) != fabric::Status::Ok) throw fabric::FabricError("dhnsw insert: reading label entries failed");
    ep_.wait_all(ops.size());
    for (size_t j = 0; j < m; ++j) {
      int64_t label;
      std::memcpy(&label, buf.data() + 8 * j, 8);
      if (label != check[first + j].first) gone.push_back(check[first + j].first);
    }
  }
  return gone;
}

void Inserter::finish_batch(const float* x, const int64_t* ids, size_t n) {
  // Upserted ids: their old vectors are marked deleted now that the new ones answer; and a
  // vector of ours whose id another computenode inserted meanwhile is withdrawn.
  const size_t n_replaced = replaced_.size();
  std::vector<std::pair<int64_t, RemotePtr>> drop = replaced_;
  const std::vector<std::pair<int64_t, RemotePtr>> lost = lost_;
  drop.insert(drop.end(), lost.begin(), lost.end());
  // With boundary copies (compute/dhnsw/boundary.hpp):
  // - every copy of a lost id that this batch mapped is withdrawn as well, and each copy whose key
  //   another computenode's copy took;
  // - a row whose own vector was deleted (or moved by an upsert) meanwhile withdraws the copies it
  //   mapped: a delete that looked the id's keys up before they were mapped did not see them, but
  //   it marked the row's own label before its last look (Inserter::remove), so this READ sees it;
  // - an upserted id's old copies beyond its new ones, which no key of this batch replaced, are
  //   marked too (rows placed in the live epoch; a rebuild since placed copies anew).
  std::vector<IdKey> unmap_keys;
  std::vector<std::pair<int64_t, RemotePtr>> unmap_at;
  auto withdraw = [&](const IdKey& key, RemotePtr at) {  // marked with the drops, unmapped after
    drop.emplace_back(static_cast<int64_t>(key.label), at);
    unmap_keys.push_back(key);
    unmap_at.emplace_back(static_cast<int64_t>(key.label), at);
  };
  drop.insert(drop.end(), unmapped_copies_.begin(), unmapped_copies_.end());
  if (copies_max() > 1) {
    std::unordered_set<int64_t> gone_ids;
    for (const auto& [id, at] : lost) gone_ids.insert(id);
    for (const int64_t id : own_gone()) gone_ids.insert(id);
    for (const auto& [key, at] : mapped_)
      if (key.copy != 0 && gone_ids.count(static_cast<int64_t>(key.label)) != 0) withdraw(key, at);
    if (upsert_) {
      std::vector<IdKey> keys;
      for (size_t i = 0; i < n; ++i)
        if (row_epoch_[i] == index_->header.epoch)
          for (unsigned k = 1; k < copies_max(); ++k)
            if ((placed_copies_[i] & (1u << k)) == 0) keys.push_back(IdKey::copy_of(static_cast<uint64_t>(ids[i]), k));
      const std::vector<RemotePtr> old = lookup(keys);
      for (size_t j = 0; j < keys.size(); ++j)
        if (!old[j].is_null()) withdraw(keys[j], old[j]);
    }
  }
  std::vector<char> done(drop.size(), 0), gone(drop.size(), 0);
  bool many_deleted = false;
  const Marked m = drop.empty() ? Marked::Done : mark_deleted(drop, done, gone, many_deleted);
  if (m == Marked::Done && !unmap_keys.empty()) unmap_ids(unmap_keys, unmap_at, std::vector<char>(unmap_keys.size(), 1));
  std::vector<int64_t> redo;
  {  // per id: an upserted id's old copies were all marked, or it is upserted again
    std::unordered_map<int64_t, bool> marked;
    for (size_t i = 0; i < n_replaced; ++i) {
      bool& all = marked.try_emplace(drop[i].first, true).first->second;
      all = all && (done[i] || gone[i]);
    }
    for (const auto& [id, all] : marked) {
      if (all) ++st_.replaced;
      else redo.push_back(id);
    }
  }
  upsert_ = false;
  if (m != Marked::Done && !redo.empty()) {
    // A rebuild began before the old vectors were marked: it keeps one vector per id (the one
    // the id index named when it looked), maybe the old. Upsert those ids once more after it.
    wait_for_idle();
    std::unordered_map<int64_t, size_t> row;
    for (size_t i = 0; i < n; ++i) row.emplace(ids[i], i);
    std::vector<float> xr;
    const uint32_t dim = index_->header.dim;
    for (int64_t id : redo) xr.insert(xr.end(), x + row.at(id) * dim, x + (row.at(id) + 1) * dim);
    const uint64_t acknowledged = st_.inserted, copies = st_.copies;  // these were counted once already
    insert(xr.data(), redo.data(), redo.size(), true);
    st_.redone += redo.size();
    st_.inserted = acknowledged;
    st_.copies = copies;
  }
  if (many_deleted) rebuild_for_deletes();
  ack();  // the epoch this computenode uses, and a sign of life
  if (!lost.empty() && !merge_)  // a merge withdraws its copy and goes on: the id is in the index
    throw std::invalid_argument("dhnsw insert: id " + std::to_string(lost.front().first) +
                                " was inserted by another computenode meanwhile (" + std::to_string(lost.size()) +
                                " such ids); it keeps that vector");
}

bool Inserter::rebuild(bool wait_for_master) {
  RebuildOptions ro;
  ro.lease_ms = std::max<uint32_t>(t_.lease_ms, 2000);
  ro.wait_for_master = wait_for_master;
  nlohmann::json rr = run_rebuild(c_, ep_, cn_id_, ro);
  if (rr.contains("skipped")) return false;
  ++st_.rebuilds;
  st_.rebuild_reports.push_back(std::move(rr));
  return true;
}

}  // namespace dmhnsw::dhnsw
