// Worker threads pinned to cores (computenode --pin).
#include <catch2/catch.hpp>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "compute/pinning.hpp"

using namespace dmhnsw;
using namespace dmhnsw::compute;

namespace {
std::vector<int> allowed_cores() {
  cpu_set_t s;
  CPU_ZERO(&s);
  REQUIRE(sched_getaffinity(0, sizeof s, &s) == 0);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &s)) out.push_back(c);
  return out;
}

// Runs pin_worker on a new thread (the test's own thread keeps its mask) and returns the core it
// gave and the cores the thread may then run on.
std::pair<int, std::vector<int>> pin_on_new_thread(uint32_t index, uint32_t workers) {
  int core = -2;
  std::vector<int> mask;
  std::thread([&] {
    core = pin_worker(index, workers);
    cpu_set_t s;
    CPU_ZERO(&s);
    pthread_getaffinity_np(pthread_self(), sizeof s, &s);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &s)) mask.push_back(c);
  }).join();
  return {core, mask};
}
}  // namespace

TEST_CASE("pinning: the core order holds every allowed core once, and workers are pinned by --pin", "[pinning]") {
  const std::vector<int> allowed = allowed_cores();
  std::vector<int> order = core_order(-1);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == allowed);
  // The NIC's node first: on a one-node host every core is on it, the order unchanged.
  CHECK(core_order(0).size() == allowed.size());

  CHECK_THROWS_WITH(parse_pin("sometimes"), Catch::Contains("--pin") && Catch::Contains("sometimes"));
  CHECK(parse_pin("auto") == PinMode::Auto);

  configure_pinning(PinMode::On, -1);
  for (uint32_t i = 0; i < 3; ++i) {
    const auto [core, mask] = pin_on_new_thread(i, 64);  // on: pins even with more workers than cores
    CHECK(core == order[i % order.size()]);
    CHECK(mask == std::vector<int>{core});
  }
  CHECK(pinning_json().at("pinned").size() == std::min<size_t>(3, order.size()));
  CHECK(pinning_json().at("mode") == "on");
  // Computenode 1 of a run, one worker each: its worker takes the order's second core (the
  // first, were --cn-id ignored: distinct whenever the host has two cores).
  configure_pinning(PinMode::On, -1, 1);
  CHECK(pin_on_new_thread(0, 1).first == order[1 % order.size()]);

  configure_pinning(PinMode::Off, -1);
  {
    const auto [core, mask] = pin_on_new_thread(0, 1);
    CHECK(core == -1);
    CHECK(mask == allowed);
  }
  // auto: only with a spare core
  configure_pinning(PinMode::Auto, -1);
  {
    const auto [core, mask] = pin_on_new_thread(0, static_cast<uint32_t>(allowed.size()));
    CHECK(core == -1);
    CHECK(mask == allowed);
  }
  if (allowed.size() >= 2) {
    const auto [core, mask] = pin_on_new_thread(1, static_cast<uint32_t>(allowed.size() - 1));
    CHECK(core == order[1]);
    CHECK(mask == std::vector<int>{core});
  }
  CHECK(pinning_json().at("pinned").size() == (allowed.size() >= 2 ? 1u : 0u));
  configure_pinning(PinMode::Auto, -1);
}

TEST_CASE("pinning: the order takes the NIC's node first, then the nearest, one thread of every core first",
          "[pinning]") {
  // Two sockets of two cores with two hardware threads each, numbered as Linux does: every
  // core's first thread, then the second threads.
  const std::vector<CpuInfo> two = {{0, 0, 0, 0}, {1, 0, 0, 1}, {2, 1, 1, 0}, {3, 1, 1, 1},
                                    {4, 0, 0, 0}, {5, 0, 0, 1}, {6, 1, 1, 0}, {7, 1, 1, 1}};
  const auto flat = [](int a, int b) { return a == b ? 10 : 20; };
  CHECK(order_cores(two, 1, flat) == std::vector<int>{2, 3, 6, 7, 0, 1, 4, 5});
  CHECK(order_cores(two, 0, flat) == std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7});
  CHECK(order_cores(two, -1, flat) == std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7});  // no NIC: node by node
  // Three nodes, one core each: from the NIC's node 0, node 2 is nearer than node 1.
  const std::vector<CpuInfo> three = {{0, 0, 0, 0}, {1, 1, 1, 0}, {2, 2, 2, 0}};
  const auto far = [](int a, int b) { return a == b ? 10 : (a + b == 2 ? 12 : 21); };
  CHECK(order_cores(three, 0, far) == std::vector<int>{0, 2, 1});
  CHECK(order_cores(three, 1, far) == std::vector<int>{1, 0, 2});  // 1 to 0: 21, 1 to 2: 21, by node
}
