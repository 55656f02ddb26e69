// Routing policies (router/policy.hpp; paper section 7.2, Algorithm 2).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "router/policy.hpp"

using namespace dmhnsw::router;

namespace {

uint64_t sum(const std::vector<uint32_t>& v) {
  return std::accumulate(v.begin(), v.end(), uint64_t{0});
}

/// Routes one whole batch whose queries all rank the computenodes as `ranked`.
std::vector<uint32_t> route_batch(RoutingPolicy& p, const std::vector<uint32_t>& ranked,
                                  uint32_t batch) {
  std::vector<uint32_t> got(ranked.size(), 0);
  for (uint32_t i = 0; i < batch; ++i) {
    CHECK_FALSE(p.batch_full());
    ++got[p.choose(ranked.data())];
  }
  CHECK(p.batch_full());
  return got;
}

}  // namespace

TEST_CASE("parse_policy and policy_name round-trip", "[router][policy]") {
  for (Policy p : {Policy::None, Policy::BestFit, Policy::Balanced, Policy::Adaptive})
    CHECK(parse_policy(policy_name(p)) == p);
  CHECK(std::string(policy_name(Policy::BestFit)) == "best-fit");
  CHECK(parse_policy("Adaptive") == Policy::Adaptive);
  try {
    parse_policy("roundrobin");
    FAIL("unknown policy accepted");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("--routing") != std::string::npos);
    CHECK(msg.find("roundrobin") != std::string::npos);
  }
}

TEST_CASE("RoutingPolicy rejects bad arguments", "[router][policy]") {
  CHECK_THROWS_AS(RoutingPolicy(Policy::Balanced, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(RoutingPolicy(Policy::Balanced, 3, 3), std::invalid_argument);
  CHECK_THROWS_AS(RoutingPolicy(Policy::Balanced, 3, 0, 0), std::invalid_argument);
  RoutingPolicy a(Policy::Adaptive, 3, 0, 30);
  CHECK_THROWS_AS(a.end_batch({1, 2}), std::invalid_argument);
}

TEST_CASE("none keeps every query, best-fit follows the oracle", "[router][policy]") {
  RoutingPolicy none(Policy::None, 4, 2, 10);
  RoutingPolicy best(Policy::BestFit, 4, 2, 10);
  const std::vector<std::vector<uint32_t>> rankings{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 0, 3, 2},
                                                    {2, 3, 0, 1}};
  for (int round = 0; round < 25; ++round)
    for (const auto& r : rankings) {
      CHECK(none.choose(r.data()) == 2);
      CHECK(best.choose(r.data()) == r[0]);
    }
  // No batches for these two policies; the histogram still counts the choices.
  CHECK_FALSE(none.batch_full());
  CHECK_FALSE(best.batch_full());
  CHECK(none.histogram() == std::vector<uint32_t>{0, 0, 100, 0});
  CHECK(best.histogram() == std::vector<uint32_t>{25, 25, 25, 25});
  best.end_batch({});
  CHECK(best.histogram() == std::vector<uint32_t>{0, 0, 0, 0});
}

TEST_CASE("balanced: limits b/K summing to b, each computenode gets exactly its limit",
          "[router][policy]") {
  for (uint32_t self = 0; self < 3; ++self) {
    RoutingPolicy p(Policy::Balanced, 3, self, 1000);
    REQUIRE(p.limits().size() == 3);
    CHECK(sum(p.limits()) == 1000);
    for (uint32_t i = 0; i < 3; ++i) CHECK(p.limits()[i] == (i == self ? 334u : 333u));

    // Every query prefers CN 0, then 1, then 2: the quotas still hold exactly.
    for (int batch = 0; batch < 3; ++batch) {
      const std::vector<uint32_t> got = route_batch(p, {0, 1, 2}, 1000);
      CHECK(got == p.limits());
      CHECK(p.histogram() == p.limits());
      p.end_batch({});
      CHECK(p.histogram() == std::vector<uint32_t>{0, 0, 0});
      CHECK_FALSE(p.batch_full());
      CHECK(sum(p.limits()) == 1000);  // equal limits kept
      for (uint32_t i = 0; i < 3; ++i) CHECK(p.limits()[i] == (i == self ? 334u : 333u));
    }
  }
}

TEST_CASE("balanced: goes down the ranking in order and overflows to ranked[0]", "[router][policy]") {
  RoutingPolicy p(Policy::Balanced, 4, 0, 8);
  CHECK(p.limits() == std::vector<uint32_t>{2, 2, 2, 2});
  const uint32_t r[4] = {2, 0, 3, 1};
  std::vector<uint32_t> seq;
  for (int i = 0; i < 8; ++i) seq.push_back(p.choose(r));
  CHECK(seq == std::vector<uint32_t>{2, 2, 0, 0, 3, 3, 1, 1});
  CHECK(p.batch_full());
  // Past the batch every computenode is at its limit: ranked[0].
  CHECK(p.choose(r) == 2);
  // Mixed rankings: each query takes its best computenode with room left.
  p.end_batch({});
  const uint32_t a[4] = {1, 2, 3, 0}, b[4] = {1, 3, 2, 0};
  CHECK(p.choose(a) == 1);
  CHECK(p.choose(b) == 1);
  CHECK(p.choose(a) == 2);
  CHECK(p.choose(b) == 3);
}

TEST_CASE("balanced with fewer queries per batch than computenodes", "[router][policy]") {
  RoutingPolicy p(Policy::Balanced, 5, 3, 2);
  CHECK(p.limits() == std::vector<uint32_t>{0, 0, 0, 1, 1});  // extras from self on
  const uint32_t r[5] = {0, 1, 2, 3, 4};
  CHECK(p.choose(r) == 3);
  CHECK(p.choose(r) == 4);
  CHECK(p.batch_full());
}

TEST_CASE("K = 1: every policy keeps every query", "[router][policy]") {
  for (Policy pol : {Policy::None, Policy::BestFit, Policy::Balanced, Policy::Adaptive}) {
    RoutingPolicy p(pol, 1, 0, 10);
    CHECK(p.limits() == std::vector<uint32_t>{10});
    const uint32_t r[1] = {0};
    for (int i = 0; i < 25; ++i) {
      CHECK(p.choose(r) == 0);
      if (p.batch_full()) p.end_batch({7});
    }
    CHECK(p.limits() == std::vector<uint32_t>{10});
  }
}

TEST_CASE("adaptive: the worked example of Algorithm 2", "[router][policy]") {
  // K = 4, b = 1000, queue lengths P = (100, 200, 300, 400): σ = 1000,
  // Σ(σ − p) = 900 + 800 + 700 + 600 = 3000, ω = 4·(900, 800, 700, 600)/3000
  // = (1.2, 1.0667, 0.9333, 0.8), limits ω·b/K = (300, 266.67, 233.33, 200):
  // floors (300, 266, 233, 200) sum to 999; the largest remainder (2/3, CN 1) gets the last.
  RoutingPolicy p(Policy::Adaptive, 4, 0, 1000);
  CHECK(p.limits() == std::vector<uint32_t>{250, 250, 250, 250});
  route_batch(p, {3, 2, 1, 0}, 1000);
  p.end_batch({100, 200, 300, 400});
  CHECK(p.limits() == std::vector<uint32_t>{300, 267, 233, 200});
  CHECK(p.histogram() == std::vector<uint32_t>{0, 0, 0, 0});

  // All queries prefer the busiest CN 3: each CN still gets exactly its limit.
  const std::vector<uint32_t> got = route_batch(p, {3, 2, 1, 0}, 1000);
  CHECK(got == std::vector<uint32_t>{300, 267, 233, 200});

  // One busy computenode, two idle ones: (σ − P) = (0, 10, 10), Σ = 20 → (0, 500, 500).
  RoutingPolicy q(Policy::Adaptive, 3, 0, 1000);
  q.end_batch({10, 0, 0});
  CHECK(q.limits() == std::vector<uint32_t>{0, 500, 500});
  const uint32_t r[3] = {0, 1, 2};
  CHECK(q.choose(r) == 1);  // CN 0 has no quota in this batch
}

TEST_CASE("adaptive: equal or empty queues give equal limits", "[router][policy]") {
  RoutingPolicy p(Policy::Adaptive, 3, 1, 1000);
  CHECK(p.limits() == std::vector<uint32_t>{333, 334, 333});
  p.end_batch({0, 0, 0});
  CHECK(p.limits() == std::vector<uint32_t>{333, 334, 333});
  p.end_batch({5, 5, 5});
  CHECK(p.limits() == std::vector<uint32_t>{333, 334, 333});
  p.end_batch({123456789, 123456789, 123456789});
  CHECK(p.limits() == std::vector<uint32_t>{333, 334, 333});
  RoutingPolicy q(Policy::Adaptive, 4, 2, 1000);
  q.end_batch({7, 7, 7, 7});
  CHECK(q.limits() == std::vector<uint32_t>{250, 250, 250, 250});
  q.end_batch({0, 0, 0, 0});
  CHECK(q.limits() == std::vector<uint32_t>{250, 250, 250, 250});
}

TEST_CASE("adaptive: limits sum to b, the longest queue gets the smallest limit", "[router][policy]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    const uint32_t k = 2 + static_cast<uint32_t>(rng() % 7);
    const uint32_t b = 1 + static_cast<uint32_t>(rng() % 5000);
    RoutingPolicy p(Policy::Adaptive, k, static_cast<uint32_t>(rng() % k), b);
    std::vector<uint64_t> queues(k);
    for (auto& q : queues) q = rng() % 3000;
    queues[rng() % k] = 3000 + rng() % 1000;  // a unique longest queue
    p.end_batch(queues);
    INFO("trial " << trial << " k=" << k << " b=" << b);
    REQUIRE(sum(p.limits()) == b);
    const auto longest = std::max_element(queues.begin(), queues.end()) - queues.begin();
    const uint32_t smallest = *std::min_element(p.limits().begin(), p.limits().end());
    CHECK(p.limits()[static_cast<size_t>(longest)] == smallest);
    // Longer queue → no larger limit.
    for (uint32_t i = 0; i < k; ++i)
      for (uint32_t j = 0; j < k; ++j)
        if (queues[i] > queues[j]) CHECK(p.limits()[i] <= p.limits()[j]);
    // Each limit is ω_i·b/K rounded down or up.
    double sigma = 0;
    for (auto q : queues) sigma += static_cast<double>(q);
    for (uint32_t i = 0; i < k; ++i) {
      const double exact = b * (sigma - static_cast<double>(queues[i])) / ((k - 1) * sigma);
      CHECK(p.limits()[i] >= std::floor(exact) - 1e-9);
      CHECK(p.limits()[i] <= std::ceil(exact) + 1e-9);
    }
    // A whole batch fills every limit exactly.
    std::vector<uint32_t> ranked(k);
    std::iota(ranked.begin(), ranked.end(), 0u);
    std::shuffle(ranked.begin(), ranked.end(), rng);
    std::vector<uint32_t> got(k, 0);
    for (uint32_t i = 0; i < b; ++i) ++got[p.choose(ranked.data())];
    CHECK(got == p.limits());
    CHECK(p.batch_full());
  }
}

TEST_CASE("balanced ignores queue lengths and end_batch resets the counters", "[router][policy]") {
  RoutingPolicy p(Policy::Balanced, 2, 0, 10);
  const uint32_t r[2] = {1, 0};
  for (int i = 0; i < 4; ++i) p.choose(r);
  CHECK_FALSE(p.batch_full());
  p.end_batch({100, 0});
  CHECK(p.limits() == std::vector<uint32_t>{5, 5});
  CHECK(p.histogram() == std::vector<uint32_t>{0, 0});
  for (int i = 0; i < 9; ++i) p.choose(r);
  CHECK_FALSE(p.batch_full());
  p.choose(r);
  CHECK(p.batch_full());
}

TEST_CASE("choose_batch: the queries that lose most by moving keep their first choice", "[router][policy]") {
  // 2 computenodes, limits 2 + 2. Three queries prefer 0; the one with the smallest regret
  // (closest to the boundary) is the one moved to 1, wherever it stands in the batch.
  const uint32_t to0[2] = {0, 1}, to1[2] = {1, 0};
  std::vector<const uint32_t*> ranked{to0, to0, to1, to0};
  const std::vector<float> regret{0.5f, 0.1f, 0.3f, 0.9f};
  RoutingPolicy p(Policy::Balanced, 2, 0, 4);
  CHECK(p.choose_batch(ranked, regret) == std::vector<uint32_t>{0, 1, 1, 0});
  CHECK(p.batch_full());
  CHECK(p.histogram() == std::vector<uint32_t>{2, 2});
  // In arrival order (choose() one by one) the last of them would have moved instead.
  RoutingPolicy q(Policy::Balanced, 2, 0, 4);
  std::vector<uint32_t> seq;
  for (const uint32_t* r : ranked) seq.push_back(q.choose(r));
  CHECK(seq == std::vector<uint32_t>{0, 0, 1, 1});
  // A query moved off a full computenode does not take the place of one whose first choice
  // it is: limits 1 + 1 + 1; A and B prefer 0 (then 1), C prefers 1 but has the smallest
  // regret. B, moved, goes on to 2 rather than taking C's place at 1.
  const uint32_t r012[3] = {0, 1, 2}, r102[3] = {1, 0, 2};
  RoutingPolicy d(Policy::Balanced, 3, 0, 3);
  CHECK(d.choose_batch({r012, r012, r102}, {0.9f, 0.8f, 0.1f}) == std::vector<uint32_t>{0, 2, 1});
  // Equal regrets keep the input order; adaptive does the same under its limits.
  RoutingPolicy a(Policy::Adaptive, 2, 0, 4);
  CHECK(a.choose_batch(ranked, std::vector<float>(4, 1.0f)) == seq);
  // Best-fit and none ignore regrets and limits.
  RoutingPolicy b(Policy::BestFit, 2, 1, 4);
  CHECK(b.choose_batch(ranked, regret) == std::vector<uint32_t>{0, 0, 1, 0});
  RoutingPolicy n(Policy::None, 2, 1, 4);
  CHECK(n.choose_batch(ranked, regret) == std::vector<uint32_t>{1, 1, 1, 1});
  CHECK_THROWS_WITH(p.choose_batch(ranked, {1.0f}), Catch::Contains("1 regrets for 4 queries"));
}

namespace {

/// A batch of queries with first choices `firsts` (ranking: first choice, then the others
/// in id order), all with regret 1. Returns the targets of choose_batch.
std::vector<uint32_t> choose_firsts(RoutingPolicy& p, uint32_t k, const std::vector<uint32_t>& firsts,
                                    std::vector<std::vector<uint32_t>>& storage) {
  storage.clear();
  for (uint32_t f : firsts) {
    std::vector<uint32_t> r{f};
    for (uint32_t i = 0; i < k; ++i)
      if (i != f) r.push_back(i);
    storage.push_back(r);
  }
  std::vector<const uint32_t*> ranked;
  for (const auto& r : storage) ranked.push_back(r.data());
  return p.choose_batch(ranked, std::vector<float>(firsts.size(), 1.0f));
}

std::vector<uint32_t> repeat_firsts(const std::vector<uint32_t>& counts) {
  std::vector<uint32_t> out;
  for (uint32_t cn = 0; cn < counts.size(); ++cn) out.insert(out.end(), counts[cn], cn);
  return out;
}

}  // namespace

TEST_CASE("parse_quota_base round-trips and names the flag", "[router][policy]") {
  for (QuotaBase b : {QuotaBase::Even, QuotaBase::Demand}) CHECK(parse_quota_base(quota_base_name(b)) == b);
  CHECK_THROWS_WITH(parse_quota_base("greedy"), Catch::Contains("--adaptive-quota") && Catch::Contains("greedy"));
  CHECK(RoutingPolicy(Policy::Adaptive, 2, 0, 10).quota_base() == QuotaBase::Even);
}

TEST_CASE("adaptive, demand quota: equal queues route like best-fit", "[router][policy]") {
  std::vector<std::vector<uint32_t>> st;
  const std::vector<uint32_t> firsts = repeat_firsts({50, 30, 20, 0});
  for (const std::vector<uint64_t>& queues : {std::vector<uint64_t>{}, {0, 0, 0, 0}, {9, 9, 9, 9}}) {
    RoutingPolicy p(Policy::Adaptive, 4, 1, 100, QuotaBase::Demand);
    if (!queues.empty()) p.end_batch(queues);
    CHECK(choose_firsts(p, 4, firsts, st) == firsts);  // every query keeps its first choice
    CHECK(p.limits() == std::vector<uint32_t>{50, 30, 20, 0});
    CHECK(p.batch_full());
  }
  // The Even base (Algorithm 2) gives b/K each whatever the queries prefer.
  RoutingPolicy e(Policy::Adaptive, 4, 1, 100, QuotaBase::Even);
  e.end_batch({9, 9, 9, 9});
  const std::vector<uint32_t> got = choose_firsts(e, 4, firsts, st);
  CHECK(e.limits() == std::vector<uint32_t>{25, 25, 25, 25});
  CHECK(e.histogram() == std::vector<uint32_t>{25, 25, 25, 25});
  CHECK(got != firsts);
}

TEST_CASE("adaptive, demand quota: a longer queue keeps less of its demand", "[router][policy]") {
  // Queues (30, 10, 10, 10): σ = 60, weights σ − P = (30, 50, 50, 50); demand (50, 30, 20, 0)
  // → D·w = (1500, 1500, 1000, 0) → limits b·D·w/ΣD·w = (37.5, 37.5, 25, 0); the half goes to
  // the cyclically first of the tied remainders from self = 0, i.e. CN 0.
  std::vector<std::vector<uint32_t>> st;
  RoutingPolicy p(Policy::Adaptive, 4, 0, 100, QuotaBase::Demand);
  p.end_batch({30, 10, 10, 10});
  const std::vector<uint32_t> got = choose_firsts(p, 4, repeat_firsts({50, 30, 20, 0}), st);
  CHECK(p.limits() == std::vector<uint32_t>{38, 37, 25, 0});
  CHECK(p.histogram() == p.limits());
  // The 12 queries CN 0 gives up go to their second choice, CN 1 (room: 37 − 30 = 7), then
  // their third, CN 2 (room 5).
  std::vector<uint32_t> moved(4, 0);
  for (size_t x = 0; x < 50; ++x) ++moved[got[x]];
  CHECK(moved == std::vector<uint32_t>{38, 7, 5, 0});

  // With the threshold t = 50 as queue floor only the backlog beyond t counts: queues
  // (50, 40, 12, 0) are no backlog at all (best-fit); (80, 60, 50, 0) → backlog (30, 10, 0, 0),
  // σ = 40, weights (10, 30, 40, 40), D·w = (500, 900, 800, 0) → b·D·w/2200 = (22.7, 40.9, 36.4, 0).
  RoutingPolicy f(Policy::Adaptive, 4, 0, 100, QuotaBase::Demand, 50);
  f.end_batch({50, 40, 12, 0});
  choose_firsts(f, 4, repeat_firsts({50, 30, 20, 0}), st);
  CHECK(f.limits() == std::vector<uint32_t>{50, 30, 20, 0});
  f.end_batch({80, 60, 50, 0});
  choose_firsts(f, 4, repeat_firsts({50, 30, 20, 0}), st);
  CHECK(f.limits() == std::vector<uint32_t>{23, 41, 36, 0});
  // The floor is Demand's: the Even base (Algorithm 2) counts whole queues.
  RoutingPolicy ev(Policy::Adaptive, 2, 0, 100, QuotaBase::Even, 50);
  ev.end_batch({50, 10});
  CHECK(ev.limits() == std::vector<uint32_t>{17, 83});

  // Every first choice on the only computenode with a queue: its weight is 0, so the queue
  // weights alone decide (as with Even): (0, 50, 50).
  RoutingPolicy q(Policy::Adaptive, 3, 0, 100, QuotaBase::Demand);
  q.end_batch({10, 0, 0});
  choose_firsts(q, 3, std::vector<uint32_t>(100, 0), st);
  CHECK(q.limits() == std::vector<uint32_t>{0, 50, 50});
  CHECK(q.histogram() == q.limits());
}

TEST_CASE("adaptive, demand quota: limits sum to b and follow demand and queues", "[router][policy]") {
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint32_t>> st;
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t k = 2 + static_cast<uint32_t>(rng() % 7);
    const uint32_t b = 1 + static_cast<uint32_t>(rng() % 2000);
    RoutingPolicy p(Policy::Adaptive, k, static_cast<uint32_t>(rng() % k), b, QuotaBase::Demand);
    std::vector<uint64_t> queues(k);
    for (auto& q : queues) q = rng() % 100;
    p.end_batch(queues);
    std::vector<uint32_t> firsts(b);
    for (auto& f : firsts) f = static_cast<uint32_t>(rng() % k);
    const std::vector<uint32_t> got = choose_firsts(p, k, firsts, st);
    INFO("trial " << trial << " k=" << k << " b=" << b);
    REQUIRE(sum(p.limits()) == b);
    CHECK(p.histogram() == p.limits());
    std::vector<uint64_t> demand(k, 0);
    for (uint32_t f : firsts) ++demand[f];
    // A computenode nobody prefers gets no quota (unless nobody wanted any room that is left);
    // with equal queues and demand, no larger limit for the longer queue.
    uint64_t sigma = 0;
    for (auto q : queues) sigma += q;
    bool any_room = false;
    for (uint32_t i = 0; i < k; ++i) any_room |= demand[i] > 0 && queues[i] < sigma;
    for (uint32_t i = 0; i < k; ++i) {
      if (demand[i] == 0 && any_room) CHECK(p.limits()[i] == 0);
      for (uint32_t j = 0; j < k; ++j)
        if (demand[i] == demand[j] && queues[i] > queues[j]) CHECK(p.limits()[i] <= p.limits()[j]);
    }
    // A query leaves its first choice only if that computenode's limit is below its demand,
    // and then exactly the excess leaves (moved queries never displace first choices).
    std::vector<uint64_t> left(k, 0);
    for (size_t x = 0; x < b; ++x)
      if (got[x] != firsts[x]) ++left[firsts[x]];
    for (uint32_t i = 0; i < k; ++i)
      CHECK(left[i] == (demand[i] > p.limits()[i] ? demand[i] - p.limits()[i] : 0));
  }
}
