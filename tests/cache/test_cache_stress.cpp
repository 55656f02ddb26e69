// Multithreaded stress test of the node cache: 8 threads mix lookups, admissions and (through
// a tiny capacity) constant evictions and entry reuse; every stored vector is derived from its
// key, so a lookup that returned a recycled entry's data is caught. Also built with
// -fsanitize=thread as test_cache_tsan (tests/cache/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "cache/node_cache.hpp"
#include "cache_test_util.hpp"

using namespace dmhnsw;
using namespace dmhnsw::cache;
using namespace dmhnsw::cache::test;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr uint64_t kOpsPerThread = 20000;  // TSAN is ~10x slower
#else
constexpr uint64_t kOpsPerThread = 250000;
#endif

struct Totals {
  std::atomic<uint64_t> lookups{0}, hits{0}, wrong_vector{0}, wrong_label{0}, offers{0}, not_cached{0};
};

void worker(NodeCache& cache, unsigned t, uint64_t key_space, Totals& tot) {
  const uint32_t dim = cache.dim();
  std::vector<float> out(dim), vec(dim);
  uint64_t x = 0x9E3779B97F4A7C15ull * (t + 1);
  uint64_t lookups = 0, hits = 0, wrong_vector = 0, wrong_label = 0, offers = 0, not_cached = 0;
  for (uint64_t i = 0; i < kOpsPerThread; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t r = x >> 20;
    // Half the accesses go to a small hot set (hits and cooling hits), the rest everywhere.
    const uint64_t k = 1 + ((r & 1) != 0 ? (r >> 1) % 24 : (r >> 1) % key_space);
    const RemotePtr key = key_ptr(k);
    uint64_t label = 0;
    ++lookups;
    if (cache.lookup(key, out.data(), &label)) {
      ++hits;
      for (uint32_t d = 0; d < dim; ++d) {
        if (out[d] != static_cast<float>(k * 31 + d)) {
          ++wrong_vector;
          break;
        }
      }
      if (label != k * 7) ++wrong_label;
    } else {
      for (uint32_t d = 0; d < dim; ++d) vec[d] = static_cast<float>(k * 31 + d);
      ++offers;
      const unsigned level = (r >> 40) % 4 == 0 ? 1 : 0;
      if (!cache.admit(key, level, vec.data(), static_cast<uint32_t>(k * 7)) && level > 0) ++not_cached;
    }
  }
  tot.lookups += lookups;
  tot.hits += hits;
  tot.wrong_vector += wrong_vector;
  tot.wrong_label += wrong_label;
  tot.offers += offers;
  tot.not_cached += not_cached;
}

void stress(uint64_t entries, uint32_t dim, double p, uint64_t key_space, unsigned threads) {
  NodeCache cache(config_for(entries, dim, p, 99));
  Totals tot;
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker, std::ref(cache), t, key_space, std::ref(tot));
  for (auto& th : pool) th.join();

  const NodeCacheStats s = cache.stats();
  INFO("lookups " << s.lookups << " hits " << s.hits << " cooling hits " << s.cooling_hits << " admissions "
                  << s.admissions << " rejections " << s.rejections << " evictions " << s.evictions);
  CHECK(tot.wrong_vector == 0);
  CHECK(tot.wrong_label == 0);
  CHECK(s.lookups == tot.lookups);
  CHECK(s.hits == tot.hits);
  CHECK(s.entries == s.admissions - s.evictions);
  CHECK(s.entries <= cache.capacity_entries());
  CHECK(s.admissions + s.rejections <= tot.offers);
  CHECK(s.evictions > 0);
  CHECK(s.cooling_hits > 0);
  CHECK(tot.not_cached == 0);  // an upper-level admission always finds an entry
  // Every key still cached returns its own vector.
  std::vector<float> out(dim);
  uint64_t label = 0;
  uint64_t cached = 0;
  for (uint64_t k = 1; k <= key_space; ++k) {
    if (!cache.lookup(key_ptr(k), out.data(), &label)) continue;
    ++cached;
    CHECK(out == key_vector(k, dim));
    CHECK(label == k * 7);
  }
  CHECK(cached == cache.stats().entries);
}

}  // namespace

TEST_CASE("NodeCache stress: 8 threads, tiny cache, odd dimension", "[cache][stress]") {
  stress(64, 15, 0.5, 400, 8);
}

TEST_CASE("NodeCache stress: 8 threads, long vectors (wide copy window)", "[cache][stress]") {
  stress(40, 256, 1.0, 200, 8);
}

TEST_CASE("NodeCache stress: 8 threads, more buckets and FIFOs", "[cache][stress]") {
  stress(1000, 8, 0.3, 5000, 8);
}
