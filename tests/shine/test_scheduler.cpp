// compute::Scheduler over a wire model (fabric::with_wire around LocalFabric): every
// coroutine's operations are held back for the wire latency, the data stays right, the
// coroutines wait at the same time, and the thread sleeps meanwhile.
#include <catch2/catch.hpp>

#include <time.h>

#include <chrono>
#include <memory>
#include <vector>

#include "common/fabric/local/local_fabric.hpp"
#include "common/fabric/wire.hpp"
#include "compute/coro.hpp"

using namespace dmhnsw;
using compute::Scheduler;
using compute::Task;

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A one-memnode LocalCluster whose words from byte 4096 on hold 1000, 1001, ... (`words` of them).
std::shared_ptr<fabric::LocalCluster> counting_cluster(uint64_t words) {
  auto c = fabric::LocalCluster::create(1, 1u << 20);
  auto* w = reinterpret_cast<uint64_t*>(c->region(0) + 4096);
  for (uint64_t i = 0; i < words; ++i) w[i] = 1000 + i;
  return c;
}

// `reads` sequential 8-byte reads of words [first, first + reads) of memnode 0; checks
// each value and counts the ones that matched.
Task<void> reader(Scheduler& s, uint64_t first, uint32_t reads, uint32_t& matched) {
  fabric::Buffer buf = s.endpoint().alloc(8);  // registered
  for (uint32_t i = 0; i < reads; ++i) {
    fabric::Op op = fabric::Op::read(RemotePtr(0, 4096 + 8 * (first + i)), buf.data(), 8);
    fabric::Completion c = co_await s.io(std::span<fabric::Op>(&op, 1), true);
    if (c.status == fabric::Status::Ok && *buf.as<uint64_t>() == 1000 + first + i) ++matched;
  }
}

}  // namespace

TEST_CASE("scheduler: a wire latency delays every operation and keeps the data while the thread sleeps",
          "[coro][wire]") {
  auto local = counting_cluster(256);
  const auto rtt = std::chrono::milliseconds(2);
  auto c = fabric::with_wire(local, fabric::parse_wire("2000,0"));
  auto ep = c->make_endpoint(1u << 20);
  Scheduler s(*ep);
  constexpr uint32_t kCoros = 4, kReads = 10;
  std::vector<uint32_t> matched(kCoros, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  for (uint32_t k = 0; k < kCoros; ++k) s.spawn(reader(s, 32ull * k, kReads, matched[k]));
  s.run();
  const double cpu = thread_cpu_seconds() - cpu0;
  const auto wall = std::chrono::steady_clock::now() - t0;

  for (uint32_t k = 0; k < kCoros; ++k) CHECK(matched[k] == kReads);
  // Each coroutine's reads are sequential: at least kReads round trips.
  CHECK(wall >= kReads * rtt);
  // ... and the coroutines wait at the same time (one after the other would be 4x).
  CHECK(wall < kCoros * kReads * rtt);
  // The thread slept through the emulated wire time instead of polling it.
  CHECK(cpu < 0.5 * std::chrono::duration<double>(wall).count());

  SECTION("without the model: no delay is added") {
    auto plain = local->make_endpoint(1u << 20);
    Scheduler p(*plain);
    uint32_t m = 0;
    const auto t1 = std::chrono::steady_clock::now();
    compute::run_sync(p, reader(p, 0, kReads, m));
    CHECK(std::chrono::steady_clock::now() - t1 < kReads * rtt);
    CHECK(m == kReads);
  }
}

TEST_CASE("scheduler: an operation slower than the wire latency is not delayed again", "[coro][wire]") {
  auto local = counting_cluster(16);
  local->set_delay(std::chrono::milliseconds(20));  // each operation completes 20 ms after posting
  auto c = fabric::with_wire(local, fabric::parse_wire("10000,0"));
  auto ep = c->make_endpoint(1u << 20);
  Scheduler s(*ep);
  uint32_t m = 0;
  const auto t0 = std::chrono::steady_clock::now();
  compute::run_sync(s, reader(s, 0, 3, m));
  const auto wall = std::chrono::steady_clock::now() - t0;
  CHECK(m == 3);
  CHECK(wall >= std::chrono::milliseconds(60));
  CHECK(wall < std::chrono::milliseconds(85));  // not 3 x (20 + 10) ms
}

TEST_CASE("scheduler: a failing operation under a wire model reports the failure at once", "[coro][wire]") {
  auto local = fabric::LocalCluster::create(1, 1u << 20);
  auto c = fabric::with_wire(local, fabric::parse_wire("500000,0"));  // 0.5 s per operation
  auto ep = c->make_endpoint(1u << 20);
  Scheduler s(*ep);
  fabric::Buffer buf = s.endpoint().alloc(8);
  fabric::Completion got{};
  auto task = [&]() -> Task<void> {
    // A valid address, posted fine; its completion carries the injected error.
    fabric::Op op = fabric::Op::read(RemotePtr(0, 4096), buf.data(), 8);
    got = co_await s.io(std::span<fabric::Op>(&op, 1), true);
  };
  local->fail_next(1);
  const auto t0 = std::chrono::steady_clock::now();
  compute::run_sync(s, task());
  // A NIC reports an error as soon as it knows: a failure is not held for the latency.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(250));
  CHECK(got.status != fabric::Status::Ok);
}
