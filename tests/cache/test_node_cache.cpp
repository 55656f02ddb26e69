// Unit tests of the SHINE node cache (single thread): hits, admission policy, capacity,
// replacement through the cooling table, statistics.
#include <catch2/catch.hpp>

#include <cstdint>
#include <thread>
#include <vector>

#include "cache/node_cache.hpp"
#include "cache_test_util.hpp"

using namespace dmhnsw;
using namespace dmhnsw::cache;
using namespace dmhnsw::cache::test;

namespace {

bool has(NodeCache& c, uint64_t k) {
  std::vector<float> v(c.dim() + 1);
  uint64_t label = 0;
  return c.lookup(key_ptr(k), v.data(), &label);
}

void admit_key(NodeCache& c, uint64_t k, unsigned level = 1) {
  const auto v = key_vector(k, c.dim());
  c.admit(key_ptr(k), level, v.data(), static_cast<uint32_t>(k * 7));
}

}  // namespace

TEST_CASE("NodeCache: a hit after admit returns the key's vector and label", "[cache]") {
  for (uint32_t dim : {1u, 3u, 16u, 128u, 385u}) {
    INFO("dim " << dim);
    NodeCache c(config_for(100, dim));
    CHECK(c.capacity_entries() == 100);
    CHECK(c.dim() == dim);
    std::vector<float> out(dim, -1.0f);
    uint64_t label = 0;
    CHECK_FALSE(c.lookup(key_ptr(5), out.data(), &label));
    for (uint64_t k = 1; k <= 50; ++k) {
      const auto v = key_vector(k, dim);
      REQUIRE(c.admit(key_ptr(k), 1, v.data(), static_cast<uint32_t>(k * 7)));
    }
    for (uint64_t k = 1; k <= 50; ++k) {
      REQUIRE(c.lookup(key_ptr(k), out.data(), &label));
      CHECK(out == key_vector(k, dim));
      CHECK(label == k * 7);
    }
    CHECK_FALSE(c.lookup(key_ptr(51), out.data(), &label));
    // Admitting a cached key again is a no-op that reports "cached".
    const auto v = key_vector(1, dim);
    CHECK(c.admit(key_ptr(1), 0, v.data(), 7));
    const NodeCacheStats s = c.stats();
    CHECK(s.admissions == 50);
    CHECK(s.entries == 50);
    CHECK(s.evictions == 0);
    CHECK(s.lookups == 52);
    CHECK(s.hits == 50);
  }
}

TEST_CASE("NodeCache: the null label pointer is allowed and entry_bytes covers the vector", "[cache]") {
  CHECK(NodeCache::entry_bytes(128) >= 128 * sizeof(float) + 8);
  CHECK(NodeCache::entry_bytes(384) > NodeCache::entry_bytes(128));
  NodeCache c(config_for(4, 8));
  admit_key(c, 9);
  std::vector<float> out(8);
  REQUIRE(c.lookup(key_ptr(9), out.data(), nullptr));
  CHECK(out == key_vector(9, 8));
}

TEST_CASE("NodeCache: level-0 nodes are admitted with probability p", "[cache]") {
  const double p = 0.2;
  const uint64_t n = 20000;
  NodeCache c(config_for(n + 10, 4, p, 42));
  uint64_t admitted = 0;
  for (uint64_t k = 1; k <= n; ++k) {
    const auto v = key_vector(k, 4);
    admitted += c.admit(key_ptr(k), 0, v.data(), 0) ? 1 : 0;
  }
  // Binomial(20000, 0.2): mean 4000, sd 57; +-6 sd.
  CHECK(admitted > 3650);
  CHECK(admitted < 4350);
  const NodeCacheStats s = c.stats();
  CHECK(s.admissions == admitted);
  CHECK(s.rejections == n - admitted);
  CHECK(s.entries == admitted);
  uint64_t present = 0;
  for (uint64_t k = 1; k <= n; ++k) present += has(c, k) ? 1 : 0;
  CHECK(present == admitted);
}

TEST_CASE("NodeCache: upper-level nodes are always admitted, p = 0 admits no level-0 node", "[cache]") {
  NodeCache c(config_for(2000, 4, 0.0));
  for (uint64_t k = 1; k <= 1000; ++k) {
    const auto v = key_vector(k, 4);
    CHECK(c.admit(key_ptr(k), 1 + k % 3, v.data(), 0));
    CHECK_FALSE(c.admit(key_ptr(k + 5000), 0, v.data(), 0));
  }
  const NodeCacheStats s = c.stats();
  CHECK(s.admissions == 1000);
  CHECK(s.rejections == 1000);
  for (uint64_t k = 1; k <= 1000; ++k) CHECK(has(c, k));
}

TEST_CASE("NodeCache: the capacity is never exceeded", "[cache]") {
  for (uint64_t cap : {1ull, 2ull, 3ull, 7ull, 50ull, 333ull}) {
    INFO("capacity " << cap);
    NodeCache c(config_for(cap, 8));
    REQUIRE(c.capacity_entries() == cap);
    const uint64_t n = 20 * cap + 100;
    for (uint64_t k = 1; k <= n; ++k) {
      admit_key(c, k);
      REQUIRE(has(c, k));  // the node just admitted is hot
      REQUIRE(c.stats().entries <= cap);
    }
    const NodeCacheStats s = c.stats();
    CHECK(s.entries == cap);
    CHECK(s.admissions == n);
    CHECK(s.evictions == n - cap);
    uint64_t present = 0;
    for (uint64_t k = 1; k <= n; ++k) present += has(c, k) ? 1 : 0;
    CHECK(present == cap);
  }
}

TEST_CASE("NodeCache: a capacity below one entry caches nothing", "[cache]") {
  NodeCacheConfig cfg = config_for(1, 16);
  cfg.capacity_bytes -= 1;
  NodeCache c(cfg);
  CHECK(c.capacity_entries() == 0);
  const auto v = key_vector(1, 16);
  CHECK_FALSE(c.admit(key_ptr(1), 1, v.data(), 0));
  CHECK_FALSE(has(c, 1));
  CHECK(c.stats().lookups == 1);
}

TEST_CASE("NodeCache: eviction goes through the cooling FIFO", "[cache]") {
  // 80 entries, cooling share 10%: one FIFO of 8 keys.
  NodeCache c(config_for(80, 8));
  for (uint64_t k = 1; k <= 80; ++k) admit_key(c, k);
  CHECK(c.stats().evictions == 0);
  // The 81st admission cools random hot entries: 8 fill the FIFO, the 9th pushes the first
  // one out, which is evicted and reused.
  admit_key(c, 81);
  NodeCacheStats s = c.stats();
  CHECK(s.evictions == 1);
  CHECK(s.entries == 80);
  uint64_t present = 0;
  for (uint64_t k = 1; k <= 80; ++k) present += has(c, k) ? 1 : 0;
  CHECK(present == 79);
  CHECK(has(c, 81));
  s = c.stats();
  CHECK(s.cooling_hits == 8);  // the 8 keys still in the FIFO turned hot again on their hit
  // Nothing is cooling any more: the next admission again needs 9 cooling steps for 1 eviction.
  admit_key(c, 82);
  CHECK(c.stats().evictions == 2);
}

TEST_CASE("NodeCache: a hit on a cooling entry makes it hot again, so a hot key survives", "[cache]") {
  NodeCache c(config_for(80, 8));
  for (uint64_t k = 1; k <= 100; ++k) admit_key(c, k);  // full, cooling FIFO full
  uint64_t hot = 0;
  for (uint64_t k = 100; k >= 1 && hot == 0; --k)
    if (has(c, k)) hot = k;
  REQUIRE(hot != 0);
  // Every admission cools at most 2 entries now, a key needs 8 more after it to fall off the
  // FIFO: touching the hot key after every admission keeps it cached.
  for (uint64_t k = 1000; k < 3000; ++k) {
    admit_key(c, k);
    REQUIRE(has(c, hot));
  }
  const NodeCacheStats s = c.stats();
  CHECK(s.cooling_hits > 0);
  CHECK(s.entries == 80);
  // The keys nobody touched are (almost) all gone: 2000 evictions in an 80-entry cache.
  uint64_t survivors = 0;
  for (uint64_t k = 1; k <= 100; ++k) survivors += (k != hot && has(c, k)) ? 1 : 0;
  CHECK(survivors <= 3);
}

TEST_CASE("NodeCache: statistics are consistent with the calls", "[cache]") {
  NodeCache c(config_for(200, 16, 0.5, 7));
  uint64_t lookups = 0, hits = 0, offers = 0;
  uint64_t x = 12345;
  for (int i = 0; i < 20000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t k = 1 + (x >> 33) % 600;
    ++lookups;
    if (has(c, k)) {
      ++hits;
    } else {
      ++offers;
      admit_key(c, k, (x >> 20) % 4 == 0 ? 1 : 0);
    }
  }
  const NodeCacheStats s = c.stats();
  CHECK(s.lookups == lookups);
  CHECK(s.hits == hits);
  CHECK(s.admissions + s.rejections == offers);
  CHECK(s.entries == s.admissions - s.evictions);
  CHECK(s.entries <= c.capacity_entries());
  CHECK(s.entries == 200);
  CHECK(s.cooling_hits <= s.hits);
  CHECK(s.hit_rate() == Approx(static_cast<double>(hits) / static_cast<double>(lookups)));
  CHECK(NodeCacheStats{}.hit_rate() == 0.0);
}

TEST_CASE("NodeCache: the same seed gives the same admissions", "[cache]") {
  auto run = [](uint64_t seed) {
    NodeCache c(config_for(100, 4, 0.3, seed));
    std::vector<bool> got;
    for (uint64_t k = 1; k <= 500; ++k) {
      const auto v = key_vector(k, 4);
      got.push_back(c.admit(key_ptr(k), 0, v.data(), 0));
    }
    return got;
  };
  CHECK(run(3) == run(3));
  CHECK(run(3) != run(4));
  // The first thread that uses a cache gets the same RNG whichever thread it is.
  std::vector<bool> other;
  std::thread([&] { other = run(3); }).join();
  CHECK(other == run(3));
}

TEST_CASE("NodeCache: a hit also returns the node's level", "[cache]") {
  NodeCache c(config_for(16, 8));
  for (unsigned level : {1u, 2u, 7u}) {
    const auto v = key_vector(level, 8);
    REQUIRE(c.admit(key_ptr(level), level, v.data(), level));
  }
  std::vector<float> out(8);
  uint64_t label = 0;
  for (unsigned level : {1u, 2u, 7u}) {
    unsigned got = 99;
    REQUIRE(c.lookup(key_ptr(level), out.data(), &label, &got));
    CHECK(got == level);
  }
}

TEST_CASE("NodeCache: lookup_at hits only the generation an entry was admitted with", "[cache]") {
  // A computenode caching neighbour lists admits each at the index's lists version and looks
  // it up at the version of its query: a list of an older version is a miss, then replaced.
  NodeCache c(config_for(10, 66));
  const auto v5 = key_vector(3, 66), v6 = key_vector(4, 66);
  REQUIRE(c.admit(key_ptr(3), 0, v5.data(), 0, 5));
  std::vector<float> out(66);
  REQUIRE(c.lookup_at(key_ptr(3), out.data(), 5));
  CHECK(out == v5);
  CHECK_FALSE(c.lookup_at(key_ptr(3), out.data(), 6));
  CHECK_FALSE(c.lookup_at(key_ptr(8), out.data(), 5));
  REQUIRE(c.admit(key_ptr(3), 0, v6.data(), 0, 6));  // the list read again at version 6
  REQUIRE(c.lookup_at(key_ptr(3), out.data(), 6));
  CHECK(out == v6);
  CHECK_FALSE(c.lookup_at(key_ptr(3), out.data(), 5));
  const NodeCacheStats s = c.stats();
  CHECK(s.hits == 2);
  CHECK(s.lookups == 5);
  CHECK(s.entries == 1);
}
