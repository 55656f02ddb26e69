// The coordination board (barrier + result slots in memnode 0's scratch) on LocalFabric.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "common/presence.hpp"
#include "compute/board.hpp"

using namespace dmhnsw;

namespace {
std::shared_ptr<fabric::LocalCluster> board_cluster() {
  const uint64_t bytes = 128u << 20;
  auto c = fabric::LocalCluster::create(1, bytes);
  RegionHeader h = make_region_header(0, bytes);
  std::memcpy(c->region(0), &h, sizeof h);
  c->refresh_headers();
  return c;
}
}  // namespace

TEST_CASE("board: gather of the first generation waits for a late publisher", "[board]") {
  auto c = board_cluster();
  auto ep0 = c->make_endpoint(1u << 20), ep1 = c->make_endpoint(1u << 20);
  compute::Board b0(*c, *ep0, 0, 2, "insert"), b1(*c, *ep1, 1, 2, "insert");
  uint64_t gen1 = 0;
  std::thread late([&] {
    gen1 = b1.barrier();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // cn 0 gathers meanwhile
    b1.publish(gen1, "{\"cn\":1}");
  });
  uint64_t gen0 = b0.barrier();
  CHECK(gen0 == 0);  // the first generation: its slot stamp must differ from a zeroed slot
  b0.publish(gen0, "{\"cn\":0}");
  auto texts = b0.gather(gen0, 10);
  late.join();
  CHECK(gen1 == gen0);
  REQUIRE(texts.size() == 2);
  CHECK(texts[0] == "{\"cn\":0}");
  CHECK(texts[1] == "{\"cn\":1}");

  // The next generation does not see the previous one's results.
  std::thread again([&] { b1.publish(b1.barrier(), "second"); });
  uint64_t g = b0.barrier();
  CHECK(g == 1);
  b0.publish(g, "first-of-two");
  again.join();
  auto t2 = b0.gather(g, 10);
  CHECK(t2[1] == "second");
}

TEST_CASE("board: a missing computenode makes the barrier fail naming how many arrived", "[board]") {
  auto c = board_cluster();
  auto ep = c->make_endpoint(1u << 20);
  compute::Board b(*c, *ep, 0, 3, "query");
  CHECK_THROWS_WITH(b.barrier(1), Catch::Contains("only 1 of 3 computenodes arrived"));
}

TEST_CASE("board: a computenode that left per memnode 0's presence table fails the barrier and the gather at once naming it",
          "[board]") {
  using namespace std::chrono;
  auto c = board_cluster();
  PresenceWriter presence(c->region(0));  // what memnode 0's control server does
  presence.joined(0);
  presence.joined(1);
  presence.joined(2);
  auto ep = c->make_endpoint(1u << 20), ep2 = c->make_endpoint(1u << 20);
  compute::Board b(*c, *ep, 0, 3, "build"), b2(*c, *ep2, 2, 3, "build");
  // cn 2 arrives, cn 1 never does. Catch2's assertions are not thread-safe (TSan reported this
  // thread's CHECK_THROWS racing the main thread's on Catch's RunContext): the thread records
  // whether the barrier threw and the main thread checks it after join.
  bool arrives_threw = false;
  std::thread arrives([&] {
    try {
      b2.barrier(3);
    } catch (const std::exception&) {
      arrives_threw = true;
    }
  });
  std::this_thread::sleep_for(milliseconds(300));
  presence.left(1);  // cn 1's control connection closed (killed)
  auto t0 = steady_clock::now();
  CHECK_THROWS_WITH(b.barrier(60), Catch::Contains("computenode 1 left the run") && Catch::Contains("before arriving"));
  CHECK(steady_clock::now() - t0 < seconds(2));
  arrives.join();
  CHECK(arrives_threw);

  // cn 2 went too, sharing its id with another process still connected: not gone.
  presence.joined(2);
  presence.left(2);
  compute::Board g(*c, *ep, 0, 3, "insert");
  g.publish(0, "mine");
  CHECK_THROWS_WITH(g.gather(0, 1, {1}), Catch::Contains("computenode 2 did not publish its results within 1 s"));
  presence.left(2);  // now no process holds id 2 and one left since the board started
  t0 = steady_clock::now();
  CHECK_THROWS_WITH(g.gather(0, 60, {1}), Catch::Contains("computenode 2 left the run") &&
                                              Catch::Contains("before it published its results"));
  CHECK(steady_clock::now() - t0 < seconds(2));
}

TEST_CASE("board: runs of different sizes one after another each agree on their generations", "[board]") {
  auto c = board_cluster();
  // Runs of K computenodes, each thread one computenode: every barrier returns one generation
  // to all of them, and computenode 0 gathers exactly this run's texts.
  auto run = [&](uint32_t K, int barriers) {
    std::vector<std::unique_ptr<fabric::Endpoint>> eps;
    std::vector<std::unique_ptr<compute::Board>> boards;
    for (uint32_t i = 0; i < K; ++i) eps.push_back(c->make_endpoint(1u << 20));
    for (uint32_t i = 0; i < K; ++i) boards.push_back(std::make_unique<compute::Board>(*c, *eps[i], i, K, "query"));
    std::vector<std::vector<uint64_t>> gens(K);
    std::vector<std::string> gathered;
    std::vector<std::thread> ts;
    for (uint32_t i = 0; i < K; ++i)
      ts.emplace_back([&, i] {
        for (int b = 0; b < barriers; ++b) {
          const uint64_t g = boards[i]->barrier(20);
          gens[i].push_back(g);
          boards[i]->publish(g, "K" + std::to_string(K) + "-cn" + std::to_string(i) + "-b" + std::to_string(b));
          if (i == 0) {
            auto texts = boards[0]->gather(g, 20);
            for (auto& t : texts) gathered.push_back(t);
          }
        }
      });
    for (auto& t : ts) t.join();
    for (uint32_t i = 1; i < K; ++i) CHECK(gens[i] == gens[0]);
    std::vector<std::string> want;
    for (int b = 0; b < barriers; ++b)
      for (uint32_t i = 0; i < K; ++i)
        want.push_back("K" + std::to_string(K) + "-cn" + std::to_string(i) + "-b" + std::to_string(b));
    CHECK(gathered == want);
  };
  run(1, 3);  // 3 arrivals: a counter shared with K = 2 would leave the next run off by one
  run(2, 2);
  run(3, 1);
  run(2, 3);
  run(1, 1);
}

TEST_CASE("board: a run that failed at a barrier leaves the next run of its size in step", "[board]") {
  auto c = board_cluster();
  auto ep0 = c->make_endpoint(1u << 20), ep1 = c->make_endpoint(1u << 20);
  {
    compute::Board lonely(*c, *ep0, 0, 2, "query");  // its peer never comes
    CHECK_THROWS_WITH(lonely.barrier(1), Catch::Contains("only 1 of 2 computenodes arrived"));
  }
  // The next run of 2: both on one generation, and computenode 0 gathers this run's texts.
  compute::Board b0(*c, *ep0, 0, 2, "query"), b1(*c, *ep1, 1, 2, "query");
  for (int round = 0; round < 3; ++round) {
    uint64_t g1 = 0;
    std::thread t([&] {
      g1 = b1.barrier(10);
      b1.publish(g1, "cn1-" + std::to_string(round));
    });
    const uint64_t g0 = b0.barrier(10);
    b0.publish(g0, "cn0-" + std::to_string(round));
    t.join();
    CHECK(g0 == g1);
    const auto texts = b0.gather(g0, 10);
    CHECK(texts[1] == "cn1-" + std::to_string(round));
  }
}

TEST_CASE("board: a computenode killed after arriving at a barrier that then fails does not put the next run out of step",
          "[board]") {
  auto c = board_cluster();
  PresenceWriter presence(c->region(0));
  for (uint32_t i = 0; i < 3; ++i) presence.joined(i);
  auto ep0 = c->make_endpoint(1u << 20), ep1 = c->make_endpoint(1u << 20), ep2 = c->make_endpoint(1u << 20);
  {
    compute::Board b0(*c, *ep0, 0, 3, "query"), b2(*c, *ep2, 2, 3, "query");
    b2.arrive();       // computenode 2 arrives ...
    presence.left(2);  // ... and is killed before the barrier completes; computenode 1 never comes
    CHECK_THROWS_WITH(b0.barrier(1), Catch::Contains("only 2 of 3 computenodes arrived"));
  }
  // The next run of 3 (computenode 2 restarted): one generation for all, this run's texts.
  presence.joined(2);
  compute::Board n0(*c, *ep0, 0, 3, "query"), n1(*c, *ep1, 1, 3, "query"), n2(*c, *ep2, 2, 3, "query");
  // Computenodes 1 and 2 on threads; each records its generation (or that it threw) for the
  // main thread to check after join (Catch2's assertions are not thread-safe).
  compute::Board* peers[2] = {&n1, &n2};
  uint64_t gens[2] = {99, 99};
  bool threw[2] = {false, false};
  std::vector<std::thread> ts;
  for (int p = 0; p < 2; ++p)
    ts.emplace_back([&, p] {
      try {
        gens[p] = peers[p]->barrier(10);
        peers[p]->publish(gens[p], "cn" + std::to_string(p + 1));
      } catch (const std::exception&) {
        threw[p] = true;
      }
    });
  uint64_t g0 = 0;
  REQUIRE_NOTHROW(g0 = n0.barrier(10));
  n0.publish(g0, "cn0");
  for (auto& t : ts) t.join();
  CHECK_FALSE(threw[0]);
  CHECK_FALSE(threw[1]);
  CHECK(gens[0] == g0);
  CHECK(gens[1] == g0);
  const auto texts = n0.gather(g0, 10);
  CHECK(texts == std::vector<std::string>{"cn0", "cn1", "cn2"});
}
