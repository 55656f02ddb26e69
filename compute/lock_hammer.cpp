#include "compute/lock_hammer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/region.hpp"
#include "compute/coro.hpp"

namespace dmhnsw::compute {

using fabric::Op;
using Clock = std::chrono::steady_clock;

uint64_t lock_hammer_word_offset(uint32_t i) { return 64 + 8 * uint64_t{i}; }
uint64_t lock_hammer_counter_offset(uint32_t i) { return 64 + 8 * uint64_t{LockHammerOptions::kMaxWords} + 8 * uint64_t{i}; }

namespace {

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%#llx", static_cast<unsigned long long>(v));
  return b;
}

struct Shared {
  const LockHammerOptions& o;
  uint64_t scratch = 0;
  Clock::time_point end;
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string failure;
  std::atomic<uint64_t> acquisitions{0}, cas_failures{0};
  std::atomic<int64_t> max_wait_ns{0};
  void fail(const std::string& why) {
    std::lock_guard g(mu);
    if (failure.empty()) failure = why;
    failed.store(true);
  }
  RemotePtr word(uint32_t i) const { return RemotePtr(0, scratch + lock_hammer_word_offset(i)); }
  RemotePtr counter(uint32_t i) const { return RemotePtr(0, scratch + lock_hammer_counter_offset(i)); }
};

class Client {
 public:
  Client(Shared& sh, Scheduler& s, uint64_t id) : sh_(sh), s_(s), id_(id), rng_(id * 0x9e3779b97f4a7c15ULL) {}

  Task<void> run() {
    uint64_t seq = 0;
    while (Clock::now() < sh_.end && !sh_.failed.load()) {
      const uint32_t w = static_cast<uint32_t>(rng_() % sh_.o.words);
      const uint64_t mine = (id_ << 40) | (++seq & ((uint64_t{1} << 40) - 1));  // unique per acquisition
      const auto t0 = Clock::now();
      uint64_t seen = 0;
      auto since = t0;
      for (;;) {
        const uint64_t old = co_await op(Op::compare_swap(sh_.word(w), 0, mine, nullptr));
        if (old == 0) break;
        sh_.cas_failures.fetch_add(1, std::memory_order_relaxed);
        const auto now = Clock::now();
        if (old != seen) {
          seen = old, since = now;
        } else if (now - since > std::chrono::duration<double>(sh_.o.stuck_seconds)) {
          sh_.fail("lock word " + std::to_string(w) + " held as " + hex(old) + " (client " + std::to_string(old >> 40) +
                   ") unchanged for " + std::to_string(sh_.o.stuck_seconds) + " s: its release was lost");
          co_return;
        }
        if (sh_.failed.load() || now > sh_.end + std::chrono::seconds(30)) co_return;
        co_await s_.yield();
      }
      const int64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      for (int64_t m = sh_.max_wait_ns.load(); waited > m && !sh_.max_wait_ns.compare_exchange_weak(m, waited);) {
      }
      // The critical section: a plain read-modify-write that only exclusion keeps exact.
      uint64_t v = co_await op(Op::read(sh_.counter(w), nullptr, 8));
      ++v;
      co_await op(Op::write(sh_.counter(w), &v, 8));
      if (sh_.o.release_by_write) {
        const uint64_t zero = 0;
        co_await op(Op::write(sh_.word(w), &zero, 8));
      } else if (const uint64_t old = co_await op(Op::compare_swap(sh_.word(w), mine, 0, nullptr)); old != mine) {
        sh_.fail("lock word " + std::to_string(w) + " was " + hex(old) + ", not its holder's " + hex(mine) +
                 ", when the holder released it");
        co_return;
      }
      sh_.acquisitions.fetch_add(1, std::memory_order_relaxed);
    }
  }

 private:
  /// One operation; returns the 8 bytes at its local buffer (the old value of an atomic, the word read).
  Task<uint64_t> op(Op o) {
    fabric::Buffer b = s_.endpoint().alloc(8);
    if (o.kind == fabric::OpKind::Write) std::memcpy(b.data(), o.local, 8);
    o.local = b.data();
    o.len = 8;
    const fabric::Completion c = co_await s_.io(std::span<Op>(&o, 1), true);
    if (c.status != fabric::Status::Ok) throw fabric::FabricError("lock hammer: " + s_.endpoint().describe(c));
    co_return *b.as<uint64_t>();
  }

  Shared& sh_;
  Scheduler& s_;
  uint64_t id_;
  std::mt19937_64 rng_;
};

std::vector<uint64_t> read_counters(fabric::Endpoint& ep, const Shared& sh) {
  std::vector<uint64_t> c(sh.o.words);
  for (uint32_t i = 0; i < sh.o.words; ++i) ep.read(sh.counter(i), &c[i], 8);
  return c;
}

}  // namespace

LockHammerResult run_lock_hammer(fabric::Cluster& cluster, const LockHammerOptions& o) {
  if (o.words == 0 || o.words > LockHammerOptions::kMaxWords)
    throw std::invalid_argument("--lock-words " + std::to_string(o.words) + ": want 1.." +
                                std::to_string(LockHammerOptions::kMaxWords));
  if (o.threads == 0 || o.coroutines == 0) throw std::invalid_argument("--lock-threads and --lock-coroutines: want >= 1");
  const RegionHeader h = header_from_blob(cluster.memnodes().at(0).header, "memnode 0");
  Shared sh{o};
  sh.scratch = h.scratch_offset;
  auto ep = cluster.make_endpoint(1u << 20);
  for (uint32_t i = 0; i < o.words; ++i) ep->atomic_store(sh.word(i), 0);  // a previous run's failure may have left one held
  const std::vector<uint64_t> before = read_counters(*ep, sh);

  const auto t0 = Clock::now();
  sh.end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < o.threads; ++t)
    threads.emplace_back([&, t] {
      try {
        auto tep = cluster.make_endpoint(1u << 20);
        Scheduler s(*tep);
        std::vector<std::unique_ptr<Client>> clients;
        for (uint32_t c = 0; c < o.coroutines; ++c) {
          clients.push_back(std::make_unique<Client>(sh, s, uint64_t{t} * o.coroutines + c + 1));
          s.spawn(clients.back()->run());
        }
        s.run();
      } catch (const std::exception& e) {
        sh.fail(e.what());
      }
    });
  for (auto& t : threads) t.join();

  LockHammerResult r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.acquisitions = sh.acquisitions.load();
  r.cas_failures = sh.cas_failures.load();
  r.max_wait_ms = static_cast<double>(sh.max_wait_ns.load()) / 1e6;
  r.failure = sh.failure;
  const std::vector<uint64_t> after = read_counters(*ep, sh);
  for (uint32_t i = 0; i < o.words; ++i) r.counter_delta += after[i] - before[i];
  if (r.failure.empty() && r.counter_delta != r.acquisitions)
    r.failure = "the counters grew by " + std::to_string(r.counter_delta) + " under " +
                std::to_string(r.acquisitions) + " acquisitions: two holders at once";
  for (uint32_t i = 0; i < o.words && r.failure.empty(); ++i) {
    uint64_t w = 0;
    ep->read(sh.word(i), &w, 8);
    // Every client has released what it took, so a held word is a release overwritten.
    if (w != 0)
      r.failure = "lock word " + std::to_string(i) + " is still held as " + hex(w) +
                  " after every holder released it: its release was lost";
  }
  return r;
}

}  // namespace dmhnsw::compute
