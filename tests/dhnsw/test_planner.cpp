// d-HNSW batch planner and LRU cache of sub-HNSWs.
#include <catch2/catch.hpp>

#include <set>

#include "compute/dhnsw/planner.hpp"

using namespace dmhnsw::dhnsw;

TEST_CASE("planner: each needed sub-HNSW once per batch, most-demanded first", "[dhnsw]") {
  // q0 -> {1,2}, q1 -> {3,4}, q2 -> {2,4}, q3 -> {1,2}  (the paper's Figure 8, 0-based)
  std::vector<std::vector<uint32_t>> probes{{1, 2}, {3, 4}, {2, 4}, {1, 2}};
  BatchPlan p = plan_batch(probes, true, nullptr);
  REQUIRE(p.entries.size() == 4);
  CHECK(p.needed == 4);
  CHECK(p.fetches() == 4);
  std::set<uint32_t> seen;
  for (const auto& e : p.entries) CHECK(seen.insert(e.sub).second);
  // demand: sub 2 by 3 queries, sub 1 and 4 by 2 (tie: lower id first), sub 3 by 1
  CHECK(p.entries[0].sub == 2);
  CHECK(p.entries[0].queries == std::vector<uint32_t>{0, 2, 3});
  CHECK(p.entries[1].sub == 1);
  CHECK(p.entries[2].sub == 4);
  CHECK(p.entries[3].sub == 3);
  CHECK(p.entries[3].queries == std::vector<uint32_t>{1});
}

TEST_CASE("planner: cached sub-HNSWs are marked and not fetched", "[dhnsw]") {
  std::vector<std::vector<uint32_t>> probes{{0, 1}, {1, 2}, {2, 3}};
  std::set<uint32_t> asked;
  BatchPlan p = plan_batch(probes, true, [&](uint32_t s) {
    asked.insert(s);
    return s == 1 || s == 3;
  });
  CHECK(asked == std::set<uint32_t>{0, 1, 2, 3});
  CHECK(p.needed == 4);
  CHECK(p.cache_hits == 2);
  CHECK(p.fetches() == 2);
  for (const auto& e : p.entries) CHECK(e.cached == (e.sub == 1 || e.sub == 3));
}

TEST_CASE("planner: without regrouping every query loads its own partitions", "[dhnsw]") {
  std::vector<std::vector<uint32_t>> probes{{0, 1}, {1, 0}, {1, 2}};
  BatchPlan p = plan_batch(probes, false, [](uint32_t) { return true; });
  REQUIRE(p.entries.size() == 6);
  CHECK(p.cache_hits == 0);
  CHECK(p.fetches() == 6);
  CHECK(p.needed == 3);
  CHECK(p.entries[0].sub == 0);
  CHECK(p.entries[0].queries == std::vector<uint32_t>{0});
  CHECK(p.entries[3].sub == 0);
  CHECK(p.entries[3].queries == std::vector<uint32_t>{1});
}

TEST_CASE("planner: an empty batch and duplicate probes", "[dhnsw]") {
  CHECK(plan_batch({}, true, nullptr).entries.empty());
  BatchPlan p = plan_batch({{5, 5}}, true, nullptr);
  REQUIRE(p.entries.size() == 1);
  CHECK(p.entries[0].queries == std::vector<uint32_t>{0});
}

TEST_CASE("LRU cache keeps the c most recently used sub-HNSWs", "[dhnsw]") {
  LruCache<int> c(2);
  c.put(1, std::make_shared<int>(10));
  c.put(2, std::make_shared<int>(20));
  REQUIRE(c.get(1));  // 1 is now the most recent
  c.put(3, std::make_shared<int>(30));  // evicts 2
  CHECK(c.contains(1));
  CHECK(!c.contains(2));
  CHECK(c.contains(3));
  CHECK(c.evictions() == 1);
  auto pinned = c.get(1);
  c.put(4, std::make_shared<int>(40));
  c.put(5, std::make_shared<int>(50));
  CHECK(!c.contains(1));
  CHECK(*pinned == 10);  // an evicted item lives on while someone holds it
  LruCache<int> none(0);
  none.put(1, std::make_shared<int>(1));
  CHECK(none.size() == 0);
}
