#include "compute/id_index.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/fabric/transport.hpp"

namespace dmhnsw {

using fabric::Buffer;
using fabric::FabricError;
using fabric::Op;
using fabric::Status;

namespace {
// A slot that keeps changing under a writer: give up rather than spin for ever.
constexpr int kMaxAttempts = 1000;
// A lock word unchanged this long is a dead holder's (a critical section is a few round trips).
constexpr auto kIdLockLease = std::chrono::seconds(2);
}  // namespace

void IdIndex::check(const fabric::Completion& c) const {
  if (c.status != Status::Ok) throw FabricError("id index: " + s_.endpoint().describe(c));
}

compute::Task<uint64_t> IdIndex::cas(RemotePtr word, uint64_t expect, uint64_t want, compute::IoStats* io) {
  const uint64_t old = co_await compute::compare_swap(s_, word, expect, want, io, "id index");
  co_return old;
}

compute::Task<IdIndex::Slots> IdIndex::read_buckets(const IdHash& h, compute::IoStats* io) {
  Buffer b = s_.endpoint().alloc(2 * IdSlot::kBucketBytes);
  Op ops[2] = {Op::read(t_.bucket(h.bucket[0]), b.data(), IdSlot::kBucketBytes),
               Op::read(t_.bucket(h.bucket[1]), b.data() + IdSlot::kBucketBytes, IdSlot::kBucketBytes)};
  check(co_await s_.io(ops, true, io));
  Slots s;
  std::memcpy(s.word, b.data(), sizeof s.word);
  co_return s;
}

compute::Task<std::vector<unsigned>> IdIndex::matches(const IdKey& id, const IdHash& h, const Slots& s,
                                                      compute::IoStats* io) {
  std::vector<unsigned> cand;
  for (unsigned p = 0; p < std::size(s.word); ++p)
    if (is_slot(p) && s.word[p] != 0 && IdSlot::fingerprint(s.word[p]) == (h.fingerprint & 0xfff)) {
      const RemotePtr n = IdSlot::node(s.word[p]);
      if (n.node() >= t_.memnodes)
        throw FabricError("id index: the slot at memnode " + std::to_string(slot_ptr(h, p).node()) + " offset " +
                          std::to_string(slot_ptr(h, p).offset()) + " names memnode " + std::to_string(n.node()) +
                          " of " + std::to_string(t_.memnodes) + " (a corrupt table?)");
      cand.push_back(p);
    }
  if (cand.empty()) co_return cand;
  Buffer b = s_.endpoint().alloc(8 * cand.size());
  std::vector<Op> ops;
  for (size_t i = 0; i < cand.size(); ++i)
    ops.push_back(Op::read(IdSlot::node(s.word[cand[i]]) + label_offset_, b.data() + 8 * i, 8));
  check(co_await s_.io(ops, true, io));
  std::vector<unsigned> out;
  for (size_t i = 0; i < cand.size(); ++i) {
    uint64_t label = 0;
    std::memcpy(&label, b.data() + 8 * i, 8);
    if (label == id.label) out.push_back(cand[i]);
  }
  co_return out;
}

compute::Task<RemotePtr> IdIndex::find(IdKey id, compute::IoStats* io) {
  const IdHash h = hash_key(id, t_);
  const Slots s = co_await read_buckets(h, io);
  const auto m = co_await matches(id, h, s, io);
  co_return m.empty() ? RemotePtr{} : IdSlot::node(s.word[m.front()]);
}

namespace {
compute::Task<void> find_lane(IdIndex& x, const std::vector<IdKey>& keys, size_t lane, size_t lanes,
                              std::vector<RemotePtr>& out) {
  for (size_t i = lane; i < keys.size(); i += lanes) {
    const RemotePtr p = co_await x.find(keys[i]);
    out[i] = p;
  }
}
}  // namespace

std::vector<RemotePtr> IdIndex::find_all(const std::vector<IdKey>& keys, size_t lanes) {
  std::vector<RemotePtr> out(keys.size());
  for (size_t l = 0; l < std::min(keys.size(), lanes); ++l) s_.spawn(find_lane(*this, keys, l, lanes, out));
  s_.run();
  return out;
}

compute::Task<uint64_t> IdIndex::lock(const IdHash& h, compute::IoStats* io) {
  const RemotePtr word = t_.bucket(h.bucket[0]);
  const uint64_t mine = rng_() | 1;  // never 0 (free), and another word for each holding
  uint64_t seen = 0;
  auto since = std::chrono::steady_clock::now();
  for (;;) {
    const uint64_t old = co_await cas(word, 0, mine, io);
    if (old == 0) co_return mine;
    const auto now = std::chrono::steady_clock::now();
    if (old != seen) {
      seen = old;
      since = now;
    } else if (now - since > kIdLockLease && co_await cas(word, old, mine, io) == old) {
      spdlog::warn("id index: the lock of bucket {} (memnode {} offset {}) was held for over {} s; taken over "
                   "(its holder died?)", h.bucket[0], word.node(), word.offset(),
                   std::chrono::duration_cast<std::chrono::seconds>(kIdLockLease).count());
      co_return mine;
    }
    co_await s_.yield();
  }
}

compute::Task<void> IdIndex::unlock(const IdHash& h, uint64_t mine, compute::IoStats* io) {
  const RemotePtr word = t_.bucket(h.bucket[0]);
  if (co_await cas(word, mine, 0, io) != mine)
    spdlog::warn("id index: the lock of bucket {} (memnode {} offset {}) was taken over while held here (a stall "
                 "over {} s)", h.bucket[0], word.node(), word.offset(),
                 std::chrono::duration_cast<std::chrono::seconds>(kIdLockLease).count());
}

compute::Task<IdIndex::PutResult> IdIndex::insert(IdKey id, RemotePtr node, bool replace, compute::IoStats* io) {
  if (!IdSlot::fits(node))
    throw std::invalid_argument("id index: memnode " + std::to_string(node.node()) + " offset " +
                                std::to_string(node.offset()) + " cannot be named by an entry");
  const IdHash h = hash_key(id, t_);
  const uint64_t entry = IdSlot::make(h.fingerprint, node);
  const uint64_t mine = co_await lock(h, io);
  // A failure below leaves the lock held: the next writer of this bucket takes it over after
  // kIdLockLease, as from a dead holder.
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    const Slots s = co_await read_buckets(h, io);
    const auto m = co_await matches(id, h, s, io);
    if (!m.empty()) {
      const uint64_t w = s.word[m.front()];
      if (!replace || w == entry) {
        co_await unlock(h, mine, io);
        co_return PutResult{replace ? Put::Replaced : Put::Present, IdSlot::node(w)};
      }
      if (co_await cas(slot_ptr(h, m.front()), w, entry, io) != w) continue;
      co_await unlock(h, mine, io);
      co_return PutResult{Put::Replaced, IdSlot::node(w)};
    }
    // Absent: a random free slot of the emptier bucket (inserts of other ids into it, which hold
    // other locks, seldom pick the same).
    unsigned free_in[2] = {0, 0};
    for (unsigned p = 0; p < std::size(s.word); ++p) free_in[p / IdSlot::kPerBucket] += is_slot(p) && s.word[p] == 0;
    if (free_in[0] == 0 && free_in[1] == 0) {
      co_await unlock(h, mine, io);
      throw FabricError("id index: both buckets of id " + std::to_string(id.label) + " are full (" +
                        std::to_string(t_.buckets) + " buckets): the table is too small for the ids stored");
    }
    const unsigned b = free_in[1] > free_in[0] ? 1 : 0;
    unsigned pos = b * IdSlot::kPerBucket, skip = static_cast<unsigned>(rng_() % free_in[b]);
    while (!is_slot(pos) || s.word[pos] != 0 || skip-- > 0) ++pos;
    if (co_await cas(slot_ptr(h, pos), 0, entry, io) != 0) continue;  // another id's insert took it
    co_await unlock(h, mine, io);
    co_return PutResult{Put::Inserted, {}};
  }
  throw FabricError("id index: id " + std::to_string(id.label) + "'s buckets changed under " + std::to_string(kMaxAttempts) +
                    " attempts to insert it");
}

compute::Task<RemotePtr> IdIndex::erase(IdKey id, RemotePtr only, compute::IoStats* io) {
  const IdHash h = hash_key(id, t_);
  const uint64_t mine = co_await lock(h, io);
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    const Slots s = co_await read_buckets(h, io);
    const auto m = co_await matches(id, h, s, io);
    const uint64_t w = m.empty() ? 0 : s.word[m.front()];
    if (w == 0 || (!only.is_null() && IdSlot::node(w) != only)) {
      co_await unlock(h, mine, io);
      co_return RemotePtr{};
    }
    if (co_await cas(slot_ptr(h, m.front()), w, 0, io) == w) {
      co_await unlock(h, mine, io);
      co_return IdSlot::node(w);
    }
  }
  throw FabricError("id index: id " + std::to_string(id.label) + "'s buckets changed under " + std::to_string(kMaxAttempts) +
                    " attempts to remove it");
}

}  // namespace dmhnsw
