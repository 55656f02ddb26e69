#include "compute/shine/free_list.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::shine {

using fabric::Buffer;
using fabric::FabricError;
using fabric::Op;
using fabric::Status;

namespace {
// A state word is held for two round trips: one unchanged this long is a dead holder's.
constexpr auto kFreeListLease = std::chrono::seconds(2);
}  // namespace

FreeTable FreeTable::sized_for(uint64_t ids, uint16_t memnodes, uint64_t offset) {
  if (memnodes == 0) throw std::invalid_argument("free lists: no memnodes");
  FreeTable t;
  t.memnodes = memnodes;
  t.offset = offset;
  t.capacity = std::max<uint64_t>(64, (2 * ids + memnodes - 1) / memnodes);
  return t;
}

compute::Task<uint64_t> FreeLists::cas(RemotePtr word, uint64_t expect, uint64_t want, compute::IoStats* io) {
  const uint64_t old = co_await compute::compare_swap(s_, word, expect, want, io, "free list");
  co_return old;
}

compute::Task<FreeLists::Taken> FreeLists::take(uint16_t m, uint64_t guess, compute::IoStats* io) {
  const RemotePtr word = t_.state(m);
  const uint64_t nonce = rng_();
  uint64_t expect = FreeState::count(guess), seen = ~uint64_t{0};
  auto since = std::chrono::steady_clock::now();
  for (;;) {
    const uint64_t mine = FreeState::holding(expect, nonce);
    const uint64_t old = co_await cas(word, expect, mine, io);
    if (old == expect && !FreeState::held(old)) co_return Taken{old, mine};
    const auto now = std::chrono::steady_clock::now();
    if (!FreeState::held(old)) {
      expect = old;  // unheld, another count: try again from it
      continue;
    }
    if (old != seen) {
      seen = old;
      since = now;
    } else if (now - since > kFreeListLease) {
      const uint64_t back = FreeState::count(old);
      if (co_await cas(word, old, back, io) == old)
        spdlog::warn("free list: the state word of memnode {} was held for over {} s; released (its holder died?)", m,
                     std::chrono::duration_cast<std::chrono::seconds>(kFreeListLease).count());
      expect = back;
      seen = ~uint64_t{0};
      continue;
    }
    expect = FreeState::count(old);
    co_await s_.yield();
  }
}

compute::Task<void> FreeLists::release(uint16_t m, uint64_t mine, uint64_t count, compute::IoStats* io) {
  guess_[m] = count;
  const RemotePtr word = t_.state(m);
  const uint64_t old = co_await cas(word, mine, count, io);
  if (old != mine)
    spdlog::warn("free list: the state word of memnode {} was released by another while held here (a stall over {} s)",
                 m, std::chrono::duration_cast<std::chrono::seconds>(kFreeListLease).count());
}

compute::Task<bool> FreeLists::push(RemotePtr n, compute::IoStats* io) {
  if (!enabled() || n.node() >= t_.memnodes) co_return false;
  const Taken t = co_await take(n.node(), guess_[n.node()], io);
  const uint64_t was = t.was, mine = t.mine;
  const uint64_t count = FreeState::count(was);
  if (count >= t_.capacity) {
    co_await release(n.node(), mine, count, io);
    co_return false;
  }
  Buffer b = s_.endpoint().alloc(8);
  const uint64_t raw = n.raw();
  std::memcpy(b.data(), &raw, 8);
  Op op = Op::write(t_.slot(n.node(), count), b.data(), 8);
  const auto c = co_await s_.io(std::span<Op>(&op, 1), true, io);
  if (c.status != Status::Ok) throw FabricError("free list: " + s_.endpoint().describe(c));
  co_await release(n.node(), mine, count + 1, io);
  co_return true;
}

compute::Task<RemotePtr> FreeLists::pop(uint16_t prefer, compute::IoStats* io) {
  if (!enabled()) co_return RemotePtr{};
  // Every stack's state word in one doorbell: the preferred memnode if it has a record, else the
  // fullest (so that no memnode grows while another keeps deleted records).
  Buffer b = s_.endpoint().alloc(8ull * t_.memnodes);
  std::vector<Op> ops;
  for (uint16_t m = 0; m < t_.memnodes; ++m) ops.push_back(Op::read(t_.state(m), b.data() + 8ull * m, 8));
  const auto c = co_await s_.io(ops, true, io);
  if (c.status != Status::Ok) throw FabricError("free list: " + s_.endpoint().describe(c));
  std::vector<uint64_t> counts(t_.memnodes);
  for (uint16_t m = 0; m < t_.memnodes; ++m) {
    uint64_t w = 0;
    std::memcpy(&w, b.data() + 8ull * m, 8);
    counts[m] = FreeState::count(w);
  }
  uint16_t m = prefer < t_.memnodes && counts[prefer] > 0
                   ? prefer
                   : static_cast<uint16_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
  if (counts[m] == 0) co_return RemotePtr{};
  const Taken t = co_await take(m, counts[m], io);
  const uint64_t was = t.was, mine = t.mine;
  const uint64_t count = FreeState::count(was);
  if (count == 0) {  // emptied meanwhile
    co_await release(m, mine, 0, io);
    co_return RemotePtr{};
  }
  Buffer s = s_.endpoint().alloc(8);
  Op op = Op::read(t_.slot(m, count - 1), s.data(), 8);
  const auto c2 = co_await s_.io(std::span<Op>(&op, 1), true, io);
  if (c2.status != Status::Ok) throw FabricError("free list: " + s_.endpoint().describe(c2));
  uint64_t raw = 0;
  std::memcpy(&raw, s.data(), 8);
  co_await release(m, mine, count - 1, io);
  const RemotePtr n = RemotePtr::from_raw(raw);
  if (n.node() != m || n.offset() % 8 != 0)
    throw FabricError("free list: slot " + std::to_string(count - 1) + " of memnode " + std::to_string(m) +
                      " names memnode " + std::to_string(n.node()) + " offset " + std::to_string(n.offset()) +
                      " (a corrupt free list?)");
  co_return n;
}

}  // namespace dmhnsw::shine
