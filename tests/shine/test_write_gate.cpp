// The write gate (compute/write_gate.hpp) on LocalFabric: a snapshot waits for the writes in
// flight and writes wait for the snapshot; dead writers and dead snapshots are leased out; a
// second snapshot and one that cannot pause the writers are refused, leaving the gate open.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/fabric/local/local_fabric.hpp"
#include "common/write_gate.hpp"
#include "compute/write_gate.hpp"

using namespace dmhnsw;
using namespace std::chrono;
using compute::GateTiming;
using compute::WriteGate;

namespace {

constexpr GateTiming kFast{5, 200};  // beat 5 ms, lease 200 ms

uint64_t& word(fabric::LocalCluster& c, uint64_t offset) { return *reinterpret_cast<uint64_t*>(c.region(0) + offset); }
uint64_t load(fabric::LocalCluster& c, uint64_t offset) { return std::atomic_ref<uint64_t>(word(c, offset)).load(); }

}  // namespace

TEST_CASE("write gate: a snapshot waits for the write in flight, and new writes wait for the snapshot", "[write_gate]") {
  auto c = fabric::LocalCluster::create(1, 1u << 20);
  WriteGate gate(*c, kFast);
  CHECK(!gate.closing());
  std::atomic<bool> written{false}, stored{false}, in_store{false};
  std::atomic<int64_t> late_entered_ms{-1};
  const auto t0 = steady_clock::now();
  auto ms = [&] { return duration_cast<milliseconds>(steady_clock::now() - t0).count(); };
  std::thread writer([&] {
    WriteGate::Pass pass(gate);
    std::this_thread::sleep_for(milliseconds(150));  // the snapshot starts meanwhile
    written.store(true);
  });
  std::this_thread::sleep_for(milliseconds(30));
  std::thread late;
  const auto st = compute::with_writes_paused(
      *c, 5000,
      [&] {
        in_store.store(true);
        CHECK(written.load());  // the write that held a pass finished first
        CHECK(gate.closing());
        late = std::thread([&] {
          WriteGate::Pass pass(gate);  // blocks until the gate opens
          late_entered_ms.store(ms());
          CHECK(stored.load());
        });
        std::this_thread::sleep_for(milliseconds(100));
        CHECK(late_entered_ms.load() == -1);
        stored.store(true);
      },
      kFast);
  writer.join();
  late.join();
  CHECK(in_store.load());
  CHECK(late_entered_ms.load() >= 0);
  CHECK(st.writers == 1);
  CHECK(st.dead == 0);
  CHECK(load(*c, kWriteGateOffset) == 0);  // open again
}

TEST_CASE("write gate: a dead writer's slot is passed over once it stays unchanged for a lease", "[write_gate]") {
  auto c = fabric::LocalCluster::create(1, 1u << 20);
  word(*c, kWriterSlotsOffset + 8 * 5) = (7u << 1) | 1;  // active, and nobody renews it
  bool stored = false;
  const auto t0 = steady_clock::now();
  const auto st = compute::with_writes_paused(*c, 5000, [&] { stored = true; }, kFast);
  CHECK(stored);
  CHECK(st.dead == 1);
  CHECK(steady_clock::now() - t0 >= milliseconds(kFast.lease_ms));
  // A new writer takes a free slot, not that one, and writes at once.
  WriteGate gate(*c, kFast);
  CHECK(gate.slot() != 5);
  WriteGate::Pass pass(gate);
}

TEST_CASE("write gate: a dead snapshot's freeze is lifted by a writer after a lease", "[write_gate]") {
  auto c = fabric::LocalCluster::create(1, 1u << 20);
  word(*c, kWriteGateOffset) = (123ull << 32) | 1;  // closed by a snapshot that died
  WriteGate gate(*c, kFast);
  CHECK(gate.closing());
  const auto t0 = steady_clock::now();
  { WriteGate::Pass pass(gate); }
  CHECK(steady_clock::now() - t0 >= milliseconds(kFast.lease_ms / 2));
  CHECK(load(*c, kWriteGateOffset) == 0);
}

TEST_CASE("write gate: a second snapshot is refused, and one whose writers do not pause stores nothing",
          "[write_gate]") {
  auto c = fabric::LocalCluster::create(1, 1u << 20);
  SECTION("a second snapshot while one stores") {
    std::atomic<bool> storing{false};
    std::thread first([&] {
      compute::with_writes_paused(
          *c, 5000,
          [&] {
            storing.store(true);
            std::this_thread::sleep_for(milliseconds(400));
          },
          kFast);
    });
    while (!storing.load()) std::this_thread::sleep_for(milliseconds(1));
    bool ran = false;
    CHECK_THROWS_WITH(compute::with_writes_paused(*c, 5000, [&] { ran = true; }, kFast),
                      Catch::Contains("another snapshot is being taken"));
    CHECK(!ran);
    first.join();
    CHECK(load(*c, kWriteGateOffset) == 0);
  }
  SECTION("a writer that holds its pass past the wait") {
    WriteGate gate(*c, kFast);
    std::atomic<bool> release{false};
    std::thread writer([&] {
      WriteGate::Pass pass(gate);
      while (!release.load()) std::this_thread::sleep_for(milliseconds(1));
    });
    std::this_thread::sleep_for(milliseconds(20));
    bool ran = false;
    CHECK_THROWS_WITH(compute::with_writes_paused(*c, 100, [&] { ran = true; }, kFast),
                      Catch::Contains("1 writing process(es) did not pause") && Catch::Contains("nothing was stored"));
    CHECK(!ran);
    CHECK(load(*c, kWriteGateOffset) == 0);
    release.store(true);
    writer.join();
    const auto t0 = steady_clock::now();
    { WriteGate::Pass pass(gate); }  // the gate opens again for this process within beats
    CHECK(steady_clock::now() - t0 < seconds(5));
  }
}
