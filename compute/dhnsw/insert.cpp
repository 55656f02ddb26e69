#include "common/timing.hpp"
#include "compute/dhnsw/insert.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/dataset.hpp"
#include "compute/dhnsw/commit.hpp"
#include "compute/dhnsw/epoch.hpp"

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

uint64_t lock_group(fabric::Endpoint& ep, const Index& idx, uint32_t slot0, uint32_t cn_id, uint32_t lease_ms,
                    uint64_t& ticket, uint64_t* waits, uint64_t* takeovers) {
  const RemotePtr p(idx.subs.at(slot0).memnode, live_desc_offset(idx.header, slot0) + offsetof(SubDesc, lock));
  const uint64_t mine = lock_word(cn_id, ++ticket);
  uint64_t seen = 0;
  auto since = Clock::now();
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    const uint64_t old = ep.compare_swap(p, 0, mine);
    if (old == 0) return mine;
    const auto now = Clock::now();
    if (old != seen) {
      seen = old;
      since = now;
      if (waits) ++*waits;
    } else if (now - since > std::chrono::milliseconds(lease_ms)) {
      if (ep.compare_swap(p, old, mine) == old) {
        if (takeovers) ++*takeovers;
        spdlog::warn("dhnsw: took over the lock of the group of sub-HNSW {} from computenode {} (unchanged for {} ms)",
                     slot0, lock_owner(old), lease_ms);
        return mine;
      }
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(2000));
  }
}

void unlock_group(fabric::Endpoint& ep, const Index& idx, uint32_t slot0, uint64_t mine) {
  const RemotePtr p(idx.subs.at(slot0).memnode, live_desc_offset(idx.header, slot0) + offsetof(SubDesc, lock));
  const uint64_t old = ep.compare_swap(p, mine, 0);
  if (old != mine)
    spdlog::warn("dhnsw: the lock of the group of sub-HNSW {} was taken over while held (now {:#x})", slot0, old);
}

GroupLock::~GroupLock() {
  try {
    unlock_group(ep_, idx_, slot0_, mine_);
  } catch (const std::exception& e) {
    spdlog::warn("dhnsw {}: releasing the lock of sub-HNSW {}'s group: {}", who_, slot0_, e.what());
  }
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
  ack();
}

namespace {

constexpr size_t kIdLanes = 16;  // id index operations in flight at once

compute::Task<void> find_lane(IdIndex& x, const int64_t* ids, size_t n, size_t lane, std::vector<RemotePtr>& out) {
  for (size_t i = lane; i < n; i += kIdLanes) {
    const RemotePtr p = co_await x.find(static_cast<uint64_t>(ids[i]));
    out[i] = p;
  }
}

compute::Task<void> map_lane(IdIndex& x, const std::vector<std::pair<int64_t, RemotePtr>>& items, bool replace, size_t lane,
                             std::vector<IdIndex::PutResult>& out) {
  for (size_t i = lane; i < items.size(); i += kIdLanes) {
    const IdIndex::PutResult r = co_await x.insert(static_cast<uint64_t>(items[i].first), items[i].second, replace);
    out[i] = r;
  }
}

compute::Task<void> erase_lane(IdIndex& x, const std::vector<std::pair<int64_t, RemotePtr>>& items,
                               const std::vector<char>& which, size_t lane) {
  for (size_t i = lane; i < items.size(); i += kIdLanes) {
    if (!which[i]) continue;
    const RemotePtr was = co_await x.erase(static_cast<uint64_t>(items[i].first), items[i].second);
    (void)was;  // null: the entry was already gone or names another place (an upsert moved it)
  }
}

}  // namespace

std::vector<RemotePtr> Inserter::lookup(const int64_t* ids, size_t n) {
  std::vector<RemotePtr> out(n);
  if (!ids_ || n == 0) return out;
  for (size_t l = 0; l < std::min(n, kIdLanes); ++l) sched_->spawn(find_lane(*ids_, ids, n, l, out));
  sched_->run();
  st_.id_lookups += n;
  return out;
}

void Inserter::map_ids(const std::vector<std::pair<int64_t, RemotePtr>>& placed) {
  if (!ids_ || placed.empty()) return;
  std::vector<IdIndex::PutResult> r(placed.size(), IdIndex::PutResult{IdIndex::Put::Inserted, {}});
  for (size_t l = 0; l < std::min(placed.size(), kIdLanes); ++l)
    sched_->spawn(map_lane(*ids_, placed, upsert_, l, r));
  sched_->run();
  for (size_t i = 0; i < placed.size(); ++i) {
    if (r[i].what == IdIndex::Put::Replaced && r[i].old != placed[i].second) {
      replaced_.emplace_back(placed[i].first, r[i].old);
    } else if (r[i].what == IdIndex::Put::Present && r[i].old != placed[i].second) {
      lost_.push_back(placed[i]);  // another computenode inserted the id meanwhile: it keeps it
    }
  }
}

namespace {
/// Deletes mark the live epoch in place while it is idle, and while a rebuild builds until its
/// master closes them to carry them into the new epoch (compute/dhnsw/epoch.hpp).
bool deletes_open(const Control& c) { return c.phase == kIdle || (c.phase == kBuilding && c.deletes_closed == 0); }
}  // namespace

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

void Inserter::ack() {
  fabric::Buffer w = ep_.alloc(8);
  const uint64_t a = ack_word(index_->header.epoch, ++beat_);
  std::memcpy(w.data(), &a, 8);
  ep_.write(RemotePtr(0, control_field(offsetof(Control, acks) + 8 * (cn_id_ % kMaxAckSlots))), w.data(), 8);
}

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

Inserter::Outcome Inserter::insert_into(uint32_t sub, const float* x, const int64_t* ids, size_t n) {
  const Index& index_ = *this->index_;
  const SubDesc& sd = index_.subs.at(sub);
  const uint32_t g0 = sd.slot == 0 ? sub : sd.partner;
  const auto t0 = Clock::now();
  const GroupLock lock(ep_, index_, g0, cn_id_, t_.lease_ms, ticket_, &st_.lock_waits, &st_.lock_takeovers, "insert");
  const uint64_t mine = lock.word();
  auto live_ptr = [&](uint32_t id, size_t field = 0) {
    return RemotePtr(index_.subs.at(id).memnode, live_desc_offset(index_.header, id) + field);
  };
  // Under the lock: is this still the live epoch, and is no rebuild snapshotting it?
  const Control ctl = read_control(ep_);
  if (ctl.epoch != index_.header.epoch) return Outcome::EpochMoved;
  if (ctl.phase == kBuilding && !merge_) return Outcome::UseBuffer;

  // 1. Live descriptors: the sub's and its partner's (for the shared gap).
  const uint32_t partner = sd.partner;
  fabric::Buffer dbuf = ep_.alloc(2 * sizeof(SubDesc));
  std::vector<fabric::Op> ops{fabric::Op::read(live_ptr(sub), dbuf.data(), sizeof(SubDesc), 0)};
  if (partner != kNoPartner) ops.push_back(fabric::Op::read(live_ptr(partner), dbuf.data() + sizeof(SubDesc), sizeof(SubDesc), 1));
  if (ep_.post(ops) != fabric::Status::Ok) throw fabric::FabricError("dhnsw insert: reading descriptors failed");
  ep_.wait_all(ops.size());
  SubDesc d, pd{};
  std::memcpy(&d, dbuf.data(), sizeof d);
  if (partner != kNoPartner) std::memcpy(&pd, dbuf.data() + sizeof(SubDesc), sizeof pd);
  // The live copy must be the same sub in the same place as the table cached at load.
  if (static_part(d).block_offset != sd.block_offset || d.id != sub || d.overflow_used > d.overflow_bytes)
    throw std::runtime_error("dhnsw insert: the live descriptor of sub-HNSW " + num(sub) + " on memnode " +
                             num(sd.memnode) + " does not match the metadata block (was the index rebuilt?)");
  const bool repair = (d.version & 1) != 0;

  // 2. Fetch and deserialize.
  const auto [off, len] = fetch_range(d);
  fabric::Buffer fb = ep_.alloc(std::max<uint64_t>(len, 64));
  if (len > 0) ep_.read(RemotePtr(d.memnode, off), fb.data(), len);
  st_.bytes_fetched += len;
  const std::string what = "memnode " + num(d.memnode);
  SubIndex s = deserialize_sub(fb.data(), len, d, index_.header, what, repair);
  if (repair) {
    ++st_.repairs;
    st_.sanitized_entries += s.sanitized;
    spdlog::warn("dhnsw insert: sub-HNSW {} was left inside a commit (version {}); repaired ({} neighbour entries "
                 "dropped)", sub, d.version, s.sanitized);
  }
  const ArraySegments segs = array_segments(fb.data(), len, d);
  std::vector<int32_t> old_nb(d.arrays[kNeighbors].used / 4);
  {
    const std::vector<char> raw = gather(fb.data(), d, segs[kNeighbors]);
    old_nb.resize(raw.size() / 4);
    std::memcpy(old_nb.data(), raw.data(), raw.size());
  }
  fb.reset();

  // 3. Local insert.
  std::vector<float> kept_x;
  std::vector<int64_t> kept_ids;
  {
    std::unordered_set<int64_t> have(s.labels.begin(), s.labels.end());
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
  n = kept_ids.size();
  s.index->add(static_cast<faiss::Index::idx_t>(n), kept_x.data());
  s.labels.insert(s.labels.end(), kept_ids.begin(), kept_ids.end());

  // 4. Commit.
  const UpdateCommit cm = prepare_commit(d, segs, old_nb, s, partner != kNoPartner ? &pd : nullptr, index_.header.dim);
  if (ep_.compare_swap(live_ptr(g0, offsetof(SubDesc, lock)), mine, mine) != mine)
    throw std::runtime_error("dhnsw insert: lost the lock of sub-HNSW " + num(sub) + "'s group before committing");
  fabric::Buffer word = ep_.alloc(8);
  auto put_version = [&](uint64_t v) {
    std::memcpy(word.data(), &v, 8);
    ep_.write(live_ptr(sub, offsetof(SubDesc, version)), word.data(), 8);
    ++st_.writes, ++st_.doorbells, st_.bytes_written += 8;
  };
  if (!repair) put_version(d.version + 1);
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
  post_writes(d.memnode, {{live_desc_offset(index_.header, sub) + kLiveFieldsBegin, &live}});
  put_version(cm.desc.version);
  // The label entries of the new vectors, for the id index (mapped after the lock is released).
  placed_.clear();
  for (size_t j = 0; j < n; ++j) {
    const uint64_t at = 8 * (d.count + j);
    for (const Segment& sg : cm.label_tail)
      if (at >= sg.logical && at < sg.logical + sg.bytes) {
        placed_.emplace_back(kept_ids[j], RemotePtr(d.memnode, sg.region + (at - sg.logical)));
        break;
      }
  }

  ++st_.commits;
  st_.inserted += n;
  st_.appended_bytes += cm.appended_bytes;
  st_.overwritten_bytes += cm.overwritten_bytes;
  st_.overflow_records += cm.overflow_records;
  st_.commit_us.push_back(seconds_since(t0) * 1e6);
  return Outcome::Done;
}

Inserter::Outcome Inserter::commit_rows(uint32_t sub, const float* x, const int64_t* ids, const std::vector<size_t>& rows,
                                         std::vector<char>& done) {
  const uint32_t dim = index_->header.dim;
  std::vector<float> xs(rows.size() * dim);
  std::vector<int64_t> is(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) {
    std::memcpy(xs.data() + j * dim, x + rows[j] * dim, 4ull * dim);
    is[j] = ids[rows[j]];
  }
  try {
    placed_.clear();
    const Outcome r = insert_into(sub, xs.data(), is.data(), rows.size());
    if (r == Outcome::Done) {
      map_ids(placed_);
      for (size_t row : rows) done[row] = 1;
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
  {
    std::unordered_set<int64_t> seen;
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] < 0) throw std::invalid_argument("dhnsw insert: id " + std::to_string(ids[i]) + " is negative");
      if (!seen.insert(ids[i]).second)
        throw std::invalid_argument("dhnsw insert: id " + std::to_string(ids[i]) + " appears twice in one batch");
    }
  }
  if (upsert && !ids_)
    throw std::invalid_argument("dhnsw upsert: the index has no id index (built by an earlier version); build it again");
  upsert_ = upsert && !merge_;
  replaced_.clear();
  lost_.clear();
  if (upsert_) wait_for_idle();  // the buffer takes no upserts: they go in place
  if (ids_ && !merge_ && !upsert_) {
    // Refused before anything is inserted: an id the index holds.
    const std::vector<RemotePtr> at = lookup(ids, n);
    for (size_t i = 0; i < n; ++i)
      if (!at[i].is_null())
        throw std::invalid_argument("id " + std::to_string(ids[i]) + " is already in the index (an upsert replaces it)");
  }
  std::vector<size_t> pending(n);
  for (size_t i = 0; i < n; ++i) pending[i] = i;
  std::vector<float> xs, D;
  std::vector<faiss::Index::idx_t> I;
  while (!pending.empty()) {
    const uint32_t dim = index_->header.dim;
    // Route: each vector to its nearest partition (the meta-HNSW's top 1).
    xs.resize(pending.size() * dim);
    for (size_t j = 0; j < pending.size(); ++j) std::memcpy(xs.data() + j * dim, x + pending[j] * dim, 4ull * dim);
    D.resize(pending.size());
    I.resize(pending.size());
    index_->meta->hnsw.efSearch = static_cast<int>(t_.meta_ef_search);
    index_->meta->search(static_cast<faiss::Index::idx_t>(pending.size()), xs.data(), 1, D.data(), I.data());
    std::map<uint32_t, std::vector<size_t>> by_sub;
    for (size_t j = 0; j < pending.size(); ++j) {
      if (I[j] < 0 || I[j] >= static_cast<faiss::Index::idx_t>(index_->header.num_subs))
        throw std::runtime_error("dhnsw insert: the meta-HNSW routed a vector to partition " + std::to_string(I[j]));
      by_sub[static_cast<uint32_t>(I[j])].push_back(pending[j]);
    }
    std::vector<char> done(n, 0);
    bool reroute = false;
    for (const auto& [sub, rows] : by_sub) {
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
        reroute = true;
        break;
      }
      if (r == Outcome::Done) {
        skipped_since_.reset();
      } else if (r == Outcome::EpochMoved) {
        skipped_since_.reset();
        ++st_.epoch_moves;
        reload();
        reroute = true;
        break;
      } else if (upsert_) {  // a rebuild runs: an upsert waits for it, then goes in place
        wait_for_idle();
        reroute = true;
        break;
      } else {  // a rebuild runs: into the insert buffer
        const Control ctl = read_control(ep_);
        for (size_t j = 0; j < rows.size(); ++j) {
          if (done[rows[j]]) continue;
          const AppendResult a = buffer_append(ep_, ctl, x + rows[j] * dim, dim, ids[rows[j]]);
          if (a == AppendResult::Ok) {
            done[rows[j]] = 1;
            ++st_.buffered;
            ++st_.inserted;
          } else {
            if (a == AppendResult::Full) {
              // The buffer is full: the master may be dead. Watch its word (taking over a dead
              // one's rebuild), else wait for the live one to publish.
              spdlog::warn("dhnsw insert: the insert buffer's bucket is full while a rebuild runs; waiting for it");
              rebuild(true);
              reload();
            }
            reroute = true;
          }
        }
        if (reroute) break;
      }
    }
    (void)reroute;
    std::vector<size_t> next;
    for (size_t i : pending)
      if (!done[i]) next.push_back(i);
    pending.swap(next);
  }
  // Upserted ids: their old vectors are marked deleted now that the new ones answer; and a
  // vector of ours whose id another computenode inserted meanwhile is withdrawn.
  const size_t n_replaced = replaced_.size();
  std::vector<std::pair<int64_t, RemotePtr>> drop = replaced_;
  const std::vector<std::pair<int64_t, RemotePtr>> lost = lost_;
  drop.insert(drop.end(), lost.begin(), lost.end());
  std::vector<char> done(drop.size(), 0), gone(drop.size(), 0);
  bool rebuild = false;
  const Marked m = drop.empty() ? Marked::Done : mark_deleted(drop, done, gone, rebuild);
  std::vector<int64_t> redo;
  for (size_t i = 0; i < n_replaced; ++i) {
    if (done[i] || gone[i]) ++st_.replaced;
    else redo.push_back(drop[i].first);
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
    const uint64_t acknowledged = st_.inserted;  // these were counted once already
    insert(xr.data(), redo.data(), redo.size(), true);
    st_.redone += redo.size();
    st_.inserted = acknowledged;
  }
  if (rebuild) rebuild_for_deletes();
  ack();  // the epoch this computenode uses, and a sign of life
  if (!lost.empty() && !merge_)  // a merge withdraws its copy and goes on: the id is in the index
    throw std::invalid_argument("dhnsw insert: id " + std::to_string(lost.front().first) +
                                " was inserted by another computenode meanwhile (" + std::to_string(lost.size()) +
                                " such ids); it keeps that vector");
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
      throw std::runtime_error("dhnsw delete: lost the lock of sub-HNSW " + num(g0) + "'s group before committing");
    // Seqlocked as a commit: version odd, the labels and the counts, version even. A version
    // found odd (a writer died inside a commit) stays odd for the next inserter to repair.
    // Words: up to 2 odd versions, the labels, up to 2 counts, up to 2 even versions.
    fabric::Buffer w = ep_.alloc(8 * (writes.size() + 6));
    auto post = [&](std::vector<fabric::Op>& o) {
      if (o.empty()) return;
      if (ep_.post(o) != fabric::Status::Ok) throw fabric::FabricError("dhnsw delete: posting to memnode " + num(mem) + " failed");
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
    st_.deleted += writes.size();
  }
  return Marked::Done;
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
  bool rebuild = false;
  while (!pending.empty() || !later.empty()) {
    uint64_t phase;
    if (pending.empty()) {
      // Ids the id index lacked while a rebuild ran may be in its insert buffer, which the merge
      // empties into the index: they are looked up again once it is idle.
      pending.swap(later);
      phase = wait_for_idle(false);
    } else {
      phase = wait_for_idle(true);
    }
    const std::vector<RemotePtr> at = lookup(pending.data(), pending.size());
    std::vector<std::pair<int64_t, RemotePtr>> e;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (!at[i].is_null()) e.emplace_back(pending[i], at[i]);
      else if (phase == kIdle) missing.push_back(pending[i]);
      else later.push_back(pending[i]);
    }
    std::vector<char> done(e.size(), 0), gone(e.size(), 0);
    const Marked m = mark_deleted(e, done, gone, rebuild);
    // Unmapped second: a delete cut short here leaves a marked entry, which no lookup matches.
    for (size_t l = 0; l < std::min(e.size(), kIdLanes); ++l) sched_->spawn(erase_lane(*ids_, e, done, l));
    sched_->run();
    pending.clear();
    for (size_t i = 0; i < e.size(); ++i) {
      if (gone[i]) missing.push_back(e[i].first);
      else if (!done[i]) pending.push_back(e[i].first);  // the epoch moved or a rebuild began: again
    }
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

nlohmann::json run_insert(const compute::RunContext& rc, const InsertOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  FloatMatrix data;
  try {
    data = load_vectors_as_float(o.data);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--data: ") + e.what());
  }
  if (!data.contiguous()) data = data.copy();
  auto ep = c.make_endpoint(64u << 20);
  std::unique_ptr<Index> probe = std::make_unique<Index>(load_index(c, *ep));
  const Index& index = *probe;
  if (data.d() != index.header.dim)
    throw std::invalid_argument("--data " + o.data + " has dimension " + std::to_string(data.d()) +
                                ", the d-HNSW index on the memnodes " + std::to_string(index.header.dim));
  uint64_t max_fetch = 0;
  for (const auto& s : index.subs) max_fetch = std::max(max_fetch, s.block_bytes + s.overflow_bytes);
  // Room for a fetch, and for a rebuild's 32 MiB of WRITEs in flight.
  if (max_fetch + (40u << 20) > (64u << 20)) ep = c.make_endpoint(max_fetch + (40u << 20));
  const size_t end = o.end == 0 ? data.n() : std::min(o.end, data.n());
  if (o.begin >= end)
    throw std::invalid_argument("--begin " + std::to_string(o.begin) + " is past the data's " + std::to_string(end) + " rows");
  if (!o.ids.empty() && o.ids.size() < end)
    throw std::invalid_argument("--ids holds " + std::to_string(o.ids.size()) + " ids; rows [" + std::to_string(o.begin) +
                                ", " + std::to_string(end) + ") of --data " + o.data + " need one each");
  std::vector<size_t> mine;
  for (size_t i = o.begin; i < end; ++i)
    if (i % o.share_count == o.share_index) mine.push_back(i);
  probe.reset();
  Inserter ins(c, *ep, rc.cn_id, o.tuning);
  const auto t0 = Clock::now();
  auto last = t0;
  std::vector<float> xs;
  std::vector<int64_t> ids;
  std::vector<double> batch_ms;
  const uint32_t B = std::max<uint32_t>(1, o.batch);
  for (size_t at = 0; at < mine.size(); at += B) {
    const size_t n = std::min<size_t>(B, mine.size() - at);
    xs.resize(n * data.d());
    ids.resize(n);
    for (size_t j = 0; j < n; ++j) {
      std::memcpy(xs.data() + j * data.d(), data.row(mine[at + j]), sizeof(float) * data.d());
      ids[j] = o.ids.empty() ? o.id_offset + static_cast<int64_t>(mine[at + j]) : o.ids[mine[at + j]];
    }
    const auto b0 = Clock::now();
    ins.insert(xs.data(), ids.data(), n, o.upsert);
    batch_ms.push_back(seconds_since(b0) * 1e3);
    if (seconds_since(last) > 2) {
      last = Clock::now();
      spdlog::info("dhnsw insert: {} / {} acknowledged ({:.0f} inserts/s)", at + n, mine.size(),
                   static_cast<double>(at + n) / seconds(last - t0));
    }
  }
  const double s = seconds_since(t0);
  leave_epochs(*ep, rc.cn_id);
  nlohmann::json r;
  r["tool"] = "computenode dhnsw insert";
  r["mode"] = "dhnsw";
  r["kind"] = o.upsert ? "upsert" : "insert";
  r["cn_id"] = rc.cn_id;
  r["num_cns"] = rc.num_cns;
  r["provider"] = rc.provider;
  r["data"] = o.data;
  r["rows"] = {{"begin", o.begin}, {"end", end}, {"mine", mine.size()}, {"id_offset", o.id_offset},
               {"ids", o.ids.empty() ? "row + id_offset" : "--ids"},
               {"share", std::to_string(o.share_index) + "/" + std::to_string(o.share_count)}};
  r["batch"] = B;
  r["insert"] = ins.stats().to_json(s);
  r["batch_ms"] = {{"p50", percentile(batch_ms, 0.5)}, {"p99", percentile(batch_ms, 0.99)}};
  return r;
}

void print_insert(const nlohmann::json& r) {
  const auto& i = r["insert"];
  std::printf("dhnsw insert (computenode %u): %llu vectors in %.2f s (%.0f inserts/s), %llu commits; per insert "
              "%.2f WRITEs, %.3f doorbells, %.0f bytes; lock waits %llu, takeovers %llu, repairs %llu\n",
              r["cn_id"].get<unsigned>(), static_cast<unsigned long long>(i["inserted"].get<uint64_t>()),
              i["seconds"].get<double>(), i["inserts_per_s"].get<double>(),
              static_cast<unsigned long long>(i["commits"].get<uint64_t>()), i["per_insert"]["writes"].get<double>(),
              i["per_insert"]["doorbells"].get<double>(), i["per_insert"]["bytes_written"].get<double>(),
              static_cast<unsigned long long>(i["lock_waits"].get<uint64_t>()),
              static_cast<unsigned long long>(i["lock_takeovers"].get<uint64_t>()),
              static_cast<unsigned long long>(i["repairs"].get<uint64_t>()));
  if (r["kind"] == "upsert")
    std::printf("  %llu of them replaced an id's vector (its old one is marked deleted)\n",
                static_cast<unsigned long long>(i["replaced"].get<uint64_t>()));
}

}  // namespace dmhnsw::dhnsw

namespace dmhnsw::dhnsw {

nlohmann::json run_delete(const compute::RunContext& rc, const DeleteOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  auto ep = c.make_endpoint(64u << 20);
  {
    const Index probe = load_index(c, *ep);
    uint64_t max_fetch = 0;
    for (const auto& s : probe.subs) max_fetch = std::max(max_fetch, s.block_bytes + s.overflow_bytes);
    if (max_fetch + (40u << 20) > (64u << 20)) ep = c.make_endpoint(max_fetch + (40u << 20));  // a rebuild's
  }
  std::vector<int64_t> mine;
  for (size_t j = rc.cn_id; j < o.ids.size(); j += std::max<uint32_t>(1, rc.num_cns)) mine.push_back(o.ids[j]);
  Inserter ins(c, *ep, rc.cn_id, o.tuning);
  const auto t0 = Clock::now();
  std::vector<int64_t> missing;
  const uint32_t B = std::max<uint32_t>(1, o.batch);
  for (size_t at = 0; at < mine.size(); at += B) {
    const size_t n = std::min<size_t>(B, mine.size() - at);
    const std::vector<int64_t> m = ins.remove(mine.data() + at, n);
    missing.insert(missing.end(), m.begin(), m.end());
  }
  const double s = seconds_since(t0);
  leave_epochs(*ep, rc.cn_id);
  nlohmann::json r;
  r["tool"] = "computenode dhnsw delete";
  r["mode"] = "dhnsw";
  r["kind"] = "delete";
  r["cn_id"] = rc.cn_id;
  r["num_cns"] = rc.num_cns;
  r["provider"] = rc.provider;
  r["requested"] = mine.size();
  r["deleted"] = ins.stats().deleted;
  r["not_found"] = missing.size();
  if (missing.size() > 1000) missing.resize(1000);
  r["not_found_ids"] = missing;
  r["seconds"] = s;
  r["deletes_per_s"] = s > 0 ? static_cast<double>(ins.stats().deleted) / s : 0.0;
  r["insert"] = ins.stats().to_json(s);
  return r;
}

void print_delete(const nlohmann::json& r) {
  std::printf("dhnsw delete (computenode %u): %llu of %llu ids deleted, %llu not in the index, %.2f s (%.0f deletes/s), "
              "%llu rebuilds\n",
              r["cn_id"].get<unsigned>(), static_cast<unsigned long long>(r["deleted"].get<uint64_t>()),
              static_cast<unsigned long long>(r["requested"].get<uint64_t>()),
              static_cast<unsigned long long>(r["not_found"].get<uint64_t>()), r["seconds"].get<double>(),
              r["deletes_per_s"].get<double>(), static_cast<unsigned long long>(r["insert"]["rebuilds"].get<uint64_t>()));
  if (r["not_found"].get<uint64_t>() > 0) {
    std::printf("  not in the index:");
    size_t shown = 0;
    for (const auto& id : r["not_found_ids"])
      if (shown++ < 20) std::printf(" %lld", static_cast<long long>(id.get<int64_t>()));
    if (r["not_found"].get<uint64_t>() > 20)
      std::printf(" ... (%llu in all)", static_cast<unsigned long long>(r["not_found"].get<uint64_t>()));
    std::printf("\n");
  }
}

}  // namespace dmhnsw::dhnsw
