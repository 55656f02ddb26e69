#include "common/timing.hpp"
#include "compute/dhnsw/epoch.hpp"

#include <faiss/IndexFlatCodes.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <stdexcept>
#include <thread>

#include "common/distance.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/commit.hpp"
#include "compute/dhnsw/insert.hpp"
#include "compute/dhnsw/online.hpp"
#include "compute/id_index.hpp"

namespace dmhnsw::dhnsw {

namespace {

std::string num(uint64_t v) { return std::to_string(v); }

/// Entries of the insert buffer are buffer_entry_bytes(dim) long (make_control); entry_bytes
/// comes from memnode 0, and readers size their reads by it.
void check_entry_bytes(const Control& c, uint32_t dim) {
  if (c.entry_bytes != buffer_entry_bytes(dim))
    throw std::runtime_error("memnode 0: d-HNSW control block at offset " +
                             num(control_field(offsetof(Control, entry_bytes))) + ": insert buffer entries of " +
                             num(c.entry_bytes) + " bytes, but those of vectors of dimension " + num(dim) + " are " +
                             num(buffer_entry_bytes(dim)));
}

RemotePtr cfield(size_t field) { return RemotePtr(0, control_field(field)); }
RemotePtr bucket_ptr(uint32_t b) { return cfield(offsetof(Control, bucket_words) + 8 * size_t{b}); }

void put_word(fabric::Endpoint& ep, RemotePtr p, uint64_t v) {
  fabric::Buffer b = ep.alloc(8);
  std::memcpy(b.data(), &v, 8);
  ep.write(p, b.data(), 8);
}

/// Fault injection for the tests (DMHNSW_TEST_PAUSE_REBUILD=before|after publishing): a master
/// killed there must leave the index serving and nothing acknowledged lost.
void test_pause(const char* where) {
  const char* p = std::getenv("DMHNSW_TEST_PAUSE_REBUILD");
  if (p == nullptr || std::string(p) != where) return;
  std::printf("dhnsw rebuild: paused %s publishing\n", where);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::minutes(10));
}

/// Lost the master word to a takeover (this computenode stalled longer than the lease).
struct MasterLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The master word, renewed (a fresh ticket) every lease / 4 by a thread of its own.
class Mastership {
 public:
  Mastership(fabric::Cluster& c, uint32_t cn_id, uint32_t lease_ms) : c_(c), cn_(cn_id), lease_ms_(lease_ms) {}
  ~Mastership() { release(); }
  /// True when this computenode is the master now. A word that stays unchanged for a lease is
  /// taken over; with `wait`, a live master (its word moving) is watched for two leases first.
  bool acquire(fabric::Endpoint& ep, bool wait) {
    word_ = lock_word(cn_, static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
    uint64_t seen = 0;
    auto since = Clock::now();
    const auto start = Clock::now();
    for (;;) {
      const uint64_t old = ep.compare_swap(cfield(offsetof(Control, master)), 0, word_);
      if (old == 0) break;
      if (old != seen) {
        if (!wait || seconds_since(start) * 1000 > 2.0 * lease_ms_) return false;  // a live master works
        seen = old;
        since = Clock::now();
      } else if (seconds_since(since) * 1000 > lease_ms_) {
        if (ep.compare_swap(cfield(offsetof(Control, master)), old, word_) == old) {
          spdlog::warn("dhnsw rebuild: took over from master computenode {} (its word unchanged for {} ms)",
                       lock_owner(old), lease_ms_);
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    held_ = true;
    renewer_ = std::thread([this] { renew(); });
    return true;
  }
  /// Throws MasterLost once the renewer found the word taken over.
  void check() const {
    if (lost_.load()) throw MasterLost("dhnsw rebuild: another computenode took the master word over");
  }
  void release() {
    if (!held_) return;
    stop_.store(true);
    if (renewer_.joinable()) renewer_.join();
    try {
      auto ep = c_.make_endpoint(1u << 20);
      ep->compare_swap(cfield(offsetof(Control, master)), word_, 0);
    } catch (const std::exception& e) {
      spdlog::warn("dhnsw rebuild: releasing the master word: {}", e.what());
    }
    held_ = false;
  }

 private:
  void renew() {
    try {
      auto ep = c_.make_endpoint(1u << 20);
      uint64_t ticket = word_;
      while (!stop_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::max<uint32_t>(10, lease_ms_ / 4)));
        const uint64_t next = lock_word(cn_, ++ticket);
        if (ep->compare_swap(cfield(offsetof(Control, master)), word_, next) != word_) {
          lost_.store(true);
          return;
        }
        word_ = next;
      }
    } catch (const std::exception& e) {
      spdlog::warn("dhnsw rebuild: renewing the master word: {}", e.what());
      lost_.store(true);
    }
  }
  fabric::Cluster& c_;
  uint32_t cn_;
  uint32_t lease_ms_;
  std::atomic<uint64_t> word_{0};
  std::atomic<bool> stop_{false}, lost_{false};
  bool held_ = false;
  std::thread renewer_;
};

/// Every vector of the live epoch, read group by group under each group's lock, and (with
/// `buffer`) the insert buffer's committed entries that no sub-HNSW holds yet.
struct Snapshot {
  std::vector<float> x;
  std::vector<int64_t> ids;
  std::vector<RemotePtr> where;  // the label entry of each vector read from a sub-HNSW
  uint64_t bytes = 0, from_buffer = 0, dropped = 0;  // dropped: deleted vectors left out
  uint64_t duplicates = 0;  // copies of an id left out (an upsert cut short by this rebuild)
  /// The label entries of each group as read (deleted ones too): carry_deletes reads them again.
  struct LabelRun {
    uint32_t group;  // its slot-0 sub
    RemotePtr at;
    uint64_t bytes;
  };
  std::vector<LabelRun> label_runs;
};

/// An id live twice (an upsert whose old vector this snapshot read before it was marked, or two
/// computenodes inserting one id at once): keep the copy the id index names, drop the others.
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
  std::vector<char> keep(s.ids.size(), 1);
  for (int64_t id : twice) {
    const RemotePtr named = compute::run_sync(sched, ids.find(static_cast<uint64_t>(id)));
    const std::vector<size_t>& r = rows[id];
    size_t kept = r.back();  // none named (a cut-short insert): the last read
    for (size_t i : r)
      if (s.where[i] == named) kept = i;
    for (size_t i : r)
      if (i != kept) keep[i] = 0, ++s.duplicates;
  }
  const uint32_t dim = idx.header.dim;
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

constexpr size_t kCarryLanes = 16;  // id index operations in flight at once

compute::Task<void> carry_lane(IdIndex& x, const std::vector<int64_t>& ids, size_t lane, std::vector<RemotePtr>& at) {
  for (size_t i = lane; i < ids.size(); i += kCarryLanes) {
    const RemotePtr p = co_await x.find(static_cast<uint64_t>(ids[i]));
    if (!p.is_null()) co_await x.erase(static_cast<uint64_t>(ids[i]), p);
    at[i] = p;
  }
}

/// Deletes acknowledged while the rebuild ran mark the live epoch in place; those that came
/// after the snapshot read their group are carried into the shadow `b` (not yet published, so
/// written without locks): with deletes closed, each group's label entries are read again under
/// its lock, and every vector the snapshot kept whose entry now has the deleted bit loses its
/// id index entry, gets the bit and counts in its sub's `deleted`. Returns their ids.
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
  std::vector<RemotePtr> at(gone.size());
  for (size_t l = 0; l < std::min(gone.size(), kCarryLanes); ++l) sched.spawn(carry_lane(ids, gone, l, at));
  sched.run();
  std::map<uint32_t, uint64_t> per_sub;
  std::vector<std::pair<RemotePtr, uint64_t>> words;  // the labels, then the subs' counts
  for (size_t i = 0; i < gone.size(); ++i) {
    if (at[i].is_null()) throw std::runtime_error("dhnsw rebuild: id " + std::to_string(gone[i]) +
                                                  " is not in the new epoch's id index");
    words.emplace_back(at[i], static_cast<uint64_t>(gone[i]) | kDeletedLabel);
    bool found = false;
    for (const SubDesc& d : b.subs)
      if (d.memnode == at[i].node() && at[i].offset() >= d.block_offset && at[i].offset() < d.block_offset + d.block_bytes) {
        ++per_sub[d.id];
        found = true;
        break;
      }
    if (!found) throw std::runtime_error("dhnsw rebuild: the new epoch's id index names memnode " +
                                         num(at[i].node()) + " offset " + num(at[i].offset()) + ", in no sub-HNSW");
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

/// Moves a rebuilt index (laid out at kMetadataOffset) to `base`: every offset in its metadata.
void relocate(BuiltIndex& b, uint64_t base) {
  const uint64_t from = b.header.metadata_offset;
  if (base == from) return;
  const int64_t delta = static_cast<int64_t>(base) - static_cast<int64_t>(from);
  for (SubDesc& d : b.subs) {
    d.block_offset += delta;
    d.group_offset += delta;
    d.overflow_offset += delta;
  }
  // The id index's entries name label entries by region offset: they move too (the table keeps
  // its place relative to the metadata block, as both bases are 4096-aligned).
  const IdTable t = id_table(b.header);
  for (auto& r : b.regions) {
    if (t.buckets == 0) break;
    for (uint64_t at = t.offset - b.region_base; at < t.offset - b.region_base + t.bytes_per_memnode(); at += 8) {
      uint64_t w;
      std::memcpy(&w, r.data() + at, 8);
      if (w == 0 || at % IdSlot::kBucketBytes == 0) continue;  // free, or a bucket's lock word
      const RemotePtr p = IdSlot::node(w);
      w = IdSlot::make(IdSlot::fingerprint(w), RemotePtr(p.node(), static_cast<uint64_t>(p.offset() + delta)));
      std::memcpy(r.data() + at, &w, 8);
    }
  }
  MetaHeader h = b.header;
  h.metadata_offset = base;
  const std::vector<char>& r0 = b.regions[0];
  const std::vector<char> meta(r0.begin() + static_cast<std::ptrdiff_t>(h.meta_index_offset),
                               r0.begin() + static_cast<std::ptrdiff_t>(h.meta_index_offset + h.meta_index_bytes));
  const std::vector<char> block = encode_metadata(h, b.subs, meta.data(), meta.size());
  std::memcpy(&b.header, block.data(), sizeof b.header);
  for (auto& r : b.regions) std::memcpy(r.data(), block.data(), block.size());
  b.region_base = base;
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
    put_word(ep, cfield(offsetof(Control, phase)), kBuilding);
    return false;
  }
  // Inserters FETCH_ADD the bucket words: they are set by COMPARE_SWAP, never WRITE.
  for (uint32_t b = 0; b < ctl.buckets; ++b) ep.atomic_store(bucket_ptr(b), bucket_word(kBucketIdle, 0), ctl.bucket_words[b]);
  put_word(ep, cfield(offsetof(Control, phase)), kIdle);
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
  put_word(ep, cfield(offsetof(Control, old_base)), 0);
  put_word(ep, cfield(offsetof(Control, old_end)), 0);
  rep["acks_s"] = seconds_since(t0);
  rep["ack_slots_given_up"] = waited_for_dead;
  rep["old_area_freed"] = true;
  return true;
}

}  // namespace

void leave_epochs(fabric::Endpoint& ep, uint32_t cn_id) {
  try {
    put_word(ep, cfield(offsetof(Control, acks) + 8 * (cn_id % kMaxAckSlots)), 0);
  } catch (const std::exception& e) {
    spdlog::warn("dhnsw: clearing this computenode's epoch acknowledgement: {}", e.what());
  }
}

Control read_control(fabric::Endpoint& ep) {
  Control c;
  ep.read(RemotePtr(0, kControlOffset), &c, sizeof c);
  check_control(c);
  return c;
}

void check_control(const Control& c) {
  const std::string where = "memnode 0: d-HNSW control block at offset " + num(kControlOffset) + ": ";
  // lsh_bucket and probe_buckets shift by every bit: more than the buckets need is corruption.
  if (c.lsh_bits > kMaxLshBits)
    throw std::runtime_error(where + "lsh_bits " + num(c.lsh_bits) + " at offset " +
                             num(control_field(offsetof(Control, lsh_bits))) + " (at most " + num(kMaxLshBits) + ")");
  // The buffer: buckets x bucket_capacity entries of entry_bytes, inside [buffer_offset, +buffer_bytes),
  // every offset addressable by a RemotePtr. (Checked without overflow: each factor is 32-bit.)
  const uint64_t bucket_bytes = uint64_t{c.bucket_capacity} * c.entry_bytes;
  const bool bad_buffer =
      c.buffer_bytes > 0 &&
      (c.buckets == 0 || c.entry_bytes < sizeof(BufferEntryHeader) || c.bucket_capacity == 0 ||
       bucket_bytes > c.buffer_bytes / c.buckets || c.buffer_offset > RemotePtr::kOffsetMask ||
       c.buffer_bytes > RemotePtr::kOffsetMask + 1 - c.buffer_offset);
  if (c.buckets > kMaxBuckets || bad_buffer)
    throw std::runtime_error(where + num(c.buckets) + " buckets of " + num(c.bucket_capacity) + " entries of " +
                             num(c.entry_bytes) + " bytes at offset " + num(c.buffer_offset) + " (" +
                             num(c.buffer_bytes) + " bytes) is not a valid insert buffer");
}

AppendResult buffer_append(fabric::Endpoint& ep, const Control& c, const float* x, uint32_t dim, int64_t id) {
  if (c.buffer_bytes == 0 || c.buckets == 0) return AppendResult::Full;
  check_entry_bytes(c, dim);
  const uint32_t b = lsh_bucket(x, dim, c.lsh_bits, c.lsh_seed) % c.buckets;
  const uint64_t old = ep.fetch_add(bucket_ptr(b), 1);
  if (bucket_state(old) != kBucketActive) return AppendResult::NotActive;
  const uint64_t i = bucket_count(old);
  if (i >= c.bucket_capacity) return AppendResult::Full;
  fabric::Buffer e = ep.alloc(c.entry_bytes);
  std::memset(e.data(), 0, c.entry_bytes);
  BufferEntryHeader h{0, id};
  std::memcpy(e.data(), &h, sizeof h);
  std::memcpy(e.data() + sizeof h, x, sizeof(float) * dim);
  const uint64_t at = buffer_entry_offset(c, b, i);
  ep.write(RemotePtr(0, at), e.data(), c.entry_bytes);
  put_word(ep, RemotePtr(0, at), c.generation);  // the commit word: the insert is acknowledged after it
  return AppendResult::Ok;
}

std::vector<BufferedVector> buffer_read(fabric::Endpoint& ep, const Control& c, uint32_t dim,
                                        const std::vector<uint32_t>& buckets) {
  std::vector<BufferedVector> out;
  if (c.buffer_bytes == 0) return out;
  check_entry_bytes(c, dim);
  std::vector<uint32_t> bs = buckets;
  if (bs.empty())
    for (uint32_t b = 0; b < c.buckets; ++b) bs.push_back(b);
  // Entries are read kReadChunk bytes at a time at most: their count comes from memnode 0.
  constexpr uint64_t kReadChunk = 4u << 20;
  const uint64_t per_read = std::max<uint64_t>(1, kReadChunk / c.entry_bytes);
  std::vector<char> buf;
  for (uint32_t b : bs) {
    const uint64_t w = c.bucket_words[b];
    if (bucket_state(w) == kBucketIdle) continue;
    const uint64_t n = std::min<uint64_t>(bucket_count(w), c.bucket_capacity);
    for (uint64_t first = 0; first < n; first += per_read) {
      const uint64_t m = std::min(per_read, n - first);
      buf.resize(m * c.entry_bytes);
      ep.read(RemotePtr(0, buffer_entry_offset(c, b, first)), buf.data(), buf.size());
      for (uint64_t i = 0; i < m; ++i) {
        BufferEntryHeader h;
        std::memcpy(&h, buf.data() + i * c.entry_bytes, sizeof h);
        if (h.commit != c.generation) continue;  // being written, or left by an inserter that died
        BufferedVector v;
        v.id = h.id;
        v.v.resize(dim);
        std::memcpy(v.v.data(), buf.data() + i * c.entry_bytes + sizeof h, sizeof(float) * dim);
        out.push_back(std::move(v));
      }
    }
  }
  return out;
}

uint64_t buffer_search(fabric::Endpoint& ep, const Control& ctl, uint32_t dim, bool ip, uint32_t k, const float* queries,
                       size_t n, Answer* answers) {
  bool any = false;
  for (uint32_t b = 0; b < ctl.buckets; ++b)
    any = any || (bucket_state(ctl.bucket_words[b]) != kBucketIdle && bucket_count(ctl.bucket_words[b]) > 0);
  if (!any) return 0;
  std::vector<std::vector<uint32_t>> probes(n);
  std::vector<char> want(ctl.buckets, 0);
  for (size_t q = 0; q < n; ++q) {
    probes[q] = probe_buckets(ctl, queries + q * dim, dim);
    for (uint32_t b : probes[q]) want[b] = 1;
  }
  std::map<uint32_t, std::vector<BufferedVector>> by_bucket;
  for (uint32_t b = 0; b < ctl.buckets; ++b)
    if (want[b]) by_bucket[b] = buffer_read(ep, ctl, dim, {b});
  const DistanceComputer dist(ip ? Metric::IP : Metric::L2, dim);
  auto better = [ip](const std::pair<float, int64_t>& u, const std::pair<float, int64_t>& v) {
    if (u.first != v.first) return ip ? u.first > v.first : u.first < v.first;
    return u.second < v.second;
  };
  uint64_t scanned = 0;
  for (size_t q = 0; q < n; ++q) {
    const float* x = queries + q * dim;
    Answer& a = answers[q];
    for (uint32_t b : probes[q])
      for (const auto& e : by_bucket[b]) {
        // Faiss's scale: squared L2, or the inner product itself (larger is better).
        a.emplace_back(ip ? 1.0f - dist(x, e.v.data()) : dist(x, e.v.data()), e.id);
        ++scanned;
      }
    std::sort(a.begin(), a.end(), better);
    if (a.size() > k) a.resize(k);
  }
  return scanned;
}

std::vector<uint32_t> probe_buckets(const Control& c, const float* q, uint32_t dim) {
  const uint32_t b = lsh_bucket(q, dim, c.lsh_bits, c.lsh_seed) % std::max<uint32_t>(1, c.buckets);
  std::vector<uint32_t> out{b};
  for (uint32_t i = 0; i < c.lsh_bits; ++i)
    if ((b ^ (1u << i)) < c.buckets) out.push_back(b ^ (1u << i));
  return out;
}

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
    // 1. Inserts go to the buffer from here on (a master that died in kBuilding left it active).
    if (ctl.phase == kIdle) {
      put_word(ep, cfield(offsetof(Control, generation)), ctl.generation + 1);
      for (uint32_t b = 0; b < ctl.buckets; ++b)
        ep.atomic_store(bucket_ptr(b), bucket_word(kBucketActive, 0), ctl.bucket_words[b]);
      put_word(ep, cfield(offsetof(Control, phase)), kBuilding);
    }
    // Deletes mark the live epoch in place while this snapshot and build run (a master that
    // died while carrying them left them closed: this one reads them all again).
    put_word(ep, cfield(offsetof(Control, deletes_closed)), 0);
    if (ctl.old_end > ctl.old_base)  // the previous epoch's area, once every live computenode left it
      free_old_area(ep, ctl.epoch, cn_id, o, rep, true);
    ctl = read_control(ep);
    // 2. Snapshot and rebuild.
    const Index idx = load_index(c, ep);
    auto ts = Clock::now();
    Snapshot snap = snapshot(ep, idx, cn_id, true);
    ms.check();
    const double snap_s = seconds_since(ts);
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
    bo.threads = o.threads;
    bo.epoch = h.epoch + 1;
    bo.image = false;
    bo.id_index = h.id_buckets > 0;
    const size_t n = snap.ids.size();
    ts = Clock::now();
    BuiltIndex built = build_index(snap.x.data(), n, h.dim, h.metric == 1 ? Metric::IP : Metric::L2, bo, snap.ids.data());
    const double build_s = seconds_since(ts);
    ms.check();
    std::vector<uint64_t> span(built.regions.size());
    for (size_t m = 0; m < span.size(); ++m) span[m] = built.regions[m].size();
    const uint64_t base = place(c, ep, ctl, span);
    relocate(built, base);
    // 3. Write the shadow area, then publish.
    ts = Clock::now();
    WriteStats ws;
    for (uint16_t m = 0; m < built.regions.size(); ++m)
      write_bytes(ep, m, base, built.regions[m].data(), built.regions[m].size(), ws);
    ms.check();
    if (o.on_snapshot_written) o.on_snapshot_written();
    const auto tc = Clock::now();
    put_word(ep, cfield(offsetof(Control, deletes_closed)), 1);
    const std::vector<int64_t> carried = carry_deletes(ep, idx, cn_id, snap, built);
    const double carry_s = seconds_since(tc);
    if (o.on_deletes_closed) o.on_deletes_closed();
    ms.check();
    test_pause("before");
    uint64_t area_end = 0;
    for (size_t m = 0; m < span.size(); ++m) area_end = std::max(area_end, base + span[m]);
    for (size_t i = 0; i < built.regions.size(); ++i) {  // memnode 0 last: its header is the switch
      const uint16_t m = static_cast<uint16_t>(built.regions.size() - 1 - i);
      RegionHeader rh;
      ep.read(RemotePtr(m, 0), &rh, sizeof rh);
      rh.epoch = bo.epoch;
      rh.mode_words[dhnsw_word::kMetadataOffset] = base;
      rh.mode_words[dhnsw_word::kMetadataSize] = built.header.block_bytes;
      rh.mode_words[dhnsw_word::kDataEnd] =
          std::max<uint64_t>({rh.mode_words[dhnsw_word::kDataEnd], base + span[m], ctl.buffer_offset + ctl.buffer_bytes});
      fabric::Buffer hb = ep.alloc(sizeof rh);
      std::memcpy(hb.data(), &rh, sizeof rh);
      ep.write(RemotePtr(m, 0), hb.data(), sizeof rh);
    }
    put_word(ep, cfield(offsetof(Control, old_base)), ctl.cur_base);
    put_word(ep, cfield(offsetof(Control, old_end)), ctl.cur_end);
    put_word(ep, cfield(offsetof(Control, cur_base)), base);
    put_word(ep, cfield(offsetof(Control, cur_end)), area_end);
    put_word(ep, cfield(offsetof(Control, epoch)), bo.epoch);
    put_word(ep, cfield(offsetof(Control, acks) + 8 * (cn_id % kMaxAckSlots)), ack_word(bo.epoch, 0));
    put_word(ep, cfield(offsetof(Control, phase)), kPublished);
    const double write_s = seconds_since(ts);
    test_pause("after");
    spdlog::info("dhnsw rebuild: epoch {} published: {} vectors in {} partitions at offset {} (snapshot {:.2f} s, "
                 "build {:.2f} s, write {:.2f} s)", bo.epoch, n, bo.partitions, base, snap_s, build_s, write_s);
    rep["epoch"] = bo.epoch;
    rep["vectors"] = n;
    rep["base_offset"] = base;
    rep["seconds"] = {{"snapshot", snap_s}, {"build", build_s}, {"write", write_s}, {"carry", carry_s}};
    rep["bytes_written"] = ws.bytes;
    rep["bytes_read"] = snap.bytes;
    // 4. Merge the buffer, 5. free the old area if every computenode moved already (else the
    //    next rebuild frees it before it needs the room).
    rep["from_buffer"] = snap.from_buffer;
    rep["deleted_dropped"] = snap.dropped;
    rep["duplicates_dropped"] = snap.duplicates;
    rep["deletes_carried"] = carried.size();
    // A carried id may be in the buffer again (inserted after its delete): the merge takes it.
    std::unordered_set<int64_t> known(snap.ids.begin(), snap.ids.end());
    for (int64_t id : carried) known.erase(id);
    if (merge_buffer(c, ep, cn_id, ms, rep, std::move(known))) {
      free_old_area(ep, bo.epoch, cn_id, o, rep, false);
      break;
    }
    // Inserts arrived faster than the new epoch's gaps take them: rebuild again (with them).
    if (round >= 20) throw std::runtime_error("dhnsw rebuild: the buffered inserts did not fit after 20 rebuilds");
  }
  {
    const Control ctl = read_control(ep);
    put_word(ep, cfield(offsetof(Control, rebuilds)), ctl.rebuilds + 1);
  }
  rep["seconds_total"] = seconds_since(t0);
  return rep;
}

}  // namespace dmhnsw::dhnsw
