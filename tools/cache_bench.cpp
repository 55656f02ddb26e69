// cache-bench: micro-benchmark of the SHINE node cache (cache/node_cache.hpp).
//  - ns per hit (single thread; dim 128 and 384; a small, cache-resident set of entries and a
//    large one that does not fit in the CPU caches), including the vector copy
//  - ns per miss
//  - admissions and evictions per second on a full cache (every admission evicts)
//  - lookup throughput of 1, 2, 4, 8 threads on a mixed workload (skewed keys; a miss offers
//    the node for admission, level 0 with probability --admit)
// Prints numbers; never fails on speed.
#include <CLI/CLI.hpp>

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/version.hpp"
#include "common/timing.hpp"
#include "cache/node_cache.hpp"

namespace {

using dmhnsw::Clock;
using dmhnsw::RemotePtr;
using dmhnsw::seconds_since;
using dmhnsw::cache::NodeCache;
using dmhnsw::cache::NodeCacheConfig;
using dmhnsw::cache::NodeCacheStats;

RemotePtr key_of(uint64_t k) { return RemotePtr(static_cast<uint16_t>(k % 4), 1024 * (k + 1)); }

struct Lcg {
  uint64_t s;
  uint64_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 17;
  }
};

NodeCacheConfig config(uint64_t entries, uint32_t dim, double p) {
  NodeCacheConfig c;
  c.capacity_bytes = entries * NodeCache::entry_bytes(dim);
  c.dim = dim;
  c.admit_probability = p;
  return c;
}


// CPU time of this thread: single-thread latencies stay meaningful on a busy machine.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

volatile float g_sink;

// ns per lookup over `order` (hits or misses), repeated until `budget` seconds passed.
double time_lookups(NodeCache& c, const std::vector<uint64_t>& order, double budget, uint64_t& hits_out) {
  std::vector<float> out(c.dim() + 1);
  uint64_t label = 0;
  float sink = 0;
  uint64_t ops = 0, hits = 0;
  const double c0 = thread_cpu_seconds();
  do {
    for (uint64_t k : order) {
      hits += c.lookup(key_of(k), out.data(), &label) ? 1 : 0;
      sink += out[0];
    }
    ops += order.size();
  } while (thread_cpu_seconds() - c0 < budget);
  const double s = thread_cpu_seconds() - c0;
  g_sink = sink;
  hits_out = hits;
  return s * 1e9 / static_cast<double>(ops);
}

void bench_hits(uint32_t dim, uint64_t entries, double budget) {
  NodeCache c(config(entries, dim, 1.0));
  std::vector<float> v(dim, 1.0f);
  for (uint64_t k = 0; k < entries; ++k) c.admit(key_of(k), 1, v.data(), static_cast<uint32_t>(k));
  std::vector<uint64_t> order(std::min<uint64_t>(entries * 4, 1 << 20));
  Lcg rng{dim * 7 + entries};
  for (auto& k : order) k = rng.next() % entries;
  uint64_t hits = 0;
  time_lookups(c, order, budget / 4, hits);  // warm
  const double ns = time_lookups(c, order, budget, hits);
  const double mib = static_cast<double>(entries * NodeCache::entry_bytes(dim)) / (1 << 20);
  std::printf("  hit   dim %4u  %7llu entries (%7.1f MiB)  %7.1f ns/hit%s\n", dim,
              static_cast<unsigned long long>(entries), mib, ns, hits == 0 ? "  (no hits?)" : "");
}

void bench_miss(uint32_t dim, uint64_t entries, double budget) {
  NodeCache c(config(entries, dim, 1.0));
  std::vector<float> v(dim, 1.0f);
  for (uint64_t k = 0; k < entries; ++k) c.admit(key_of(k), 1, v.data(), 0);
  std::vector<uint64_t> order(1 << 16);
  Lcg rng{3};
  for (auto& k : order) k = entries + rng.next() % (entries * 8);
  uint64_t hits = 0;
  const double ns = time_lookups(c, order, budget, hits);
  std::printf("  miss  dim %4u  %7llu entries               %7.1f ns/miss\n", dim,
              static_cast<unsigned long long>(entries), ns);
}

void bench_admit(uint32_t dim, uint64_t entries, double budget) {
  NodeCache c(config(entries, dim, 1.0));
  std::vector<float> v(dim, 1.0f);
  uint64_t k = 0;
  for (; k < entries; ++k) c.admit(key_of(k), 1, v.data(), 0);
  const NodeCacheStats s0 = c.stats();
  uint64_t ops = 0;
  const double c0 = thread_cpu_seconds();
  while (thread_cpu_seconds() - c0 < budget) {
    for (int i = 0; i < 1024; ++i) c.admit(key_of(k++), 1, v.data(), 0);
    ops += 1024;
  }
  const double s = thread_cpu_seconds() - c0;
  const NodeCacheStats s1 = c.stats();
  std::printf("  full cache dim %u, %llu entries: %.2f M admissions/s, %.2f M evictions/s (%.0f ns per admission)\n",
              dim, static_cast<unsigned long long>(entries),
              static_cast<double>(s1.admissions - s0.admissions) / s / 1e6,
              static_cast<double>(s1.evictions - s0.evictions) / s / 1e6, s * 1e9 / static_cast<double>(ops));
}

void bench_threads(uint32_t dim, uint64_t entries, uint64_t keys, double p, double budget, unsigned threads) {
  NodeCache c(config(entries, dim, p));
  std::vector<float> v(dim, 1.0f);
  // Pre-fill with the hottest keys so the numbers show the steady state.
  for (uint64_t k = 0; k < entries; ++k) c.admit(key_of(k), 1, v.data(), 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> total{0};
  std::vector<std::thread> pool;
  const NodeCacheStats s0 = c.stats();
  const auto t0 = Clock::now();
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<float> out(dim), vec(dim, 2.0f);
      uint64_t label = 0;
      Lcg rng{t * 977 + 1};
      uint64_t ops = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 256; ++i) {
          // Skewed: 80% of the accesses to 10% of the keys.
          const uint64_t r = rng.next();
          const uint64_t k = (r % 10 < 8) ? (r >> 8) % (keys / 10) : (r >> 8) % keys;
          if (!c.lookup(key_of(k), out.data(), &label)) c.admit(key_of(k), (k % 32 == 0) ? 1 : 0, vec.data(), 0);
        }
        ops += 256;
      }
      total += ops;
    });
  }
  while (seconds_since(t0) < budget) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  for (auto& th : pool) th.join();
  const double s = seconds_since(t0);
  const NodeCacheStats s1 = c.stats();
  const double lookups = static_cast<double>(s1.lookups - s0.lookups);
  std::printf("  %u thread%s  %8.2f M lookups/s  hit rate %.3f  %.0f evictions/s\n", threads, threads == 1 ? " " : "s",
              lookups / s / 1e6, static_cast<double>(s1.hits - s0.hits) / lookups,
              static_cast<double>(s1.evictions - s0.evictions) / s);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cache-bench: ns per hit and miss, admission/eviction rate and multi-thread lookup throughput of "
               "the SHINE node cache"};
  app.set_version_flag("--version", dmhnsw::version_line("cache-bench"));
  double budget = 0.25;
  uint64_t small = 1024, large = 65536;
  std::vector<unsigned> threads = {1, 2, 4, 8};
  double p = 0.01;
  app.add_option("--seconds", budget, "time per measurement")->capture_default_str();
  app.add_option("--small", small, "entries of the cache-resident hit test")->capture_default_str();
  app.add_option("--large", large, "entries of the large hit test")->capture_default_str();
  app.add_option("--threads", threads, "thread counts of the mixed workload")->capture_default_str()->delimiter(',');
  app.add_option("--admit", p, "level-0 admission probability in the mixed workload")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::printf("node cache, single thread (hit = lookup + copy of the vector and label; per thread CPU time)\n");
  for (uint32_t dim : {128u, 384u}) {
    bench_hits(dim, small, budget);
    bench_hits(dim, large, budget);
  }
  bench_miss(128, large, budget);
  std::printf("admission with eviction (level 1, always admitted)\n");
  bench_admit(128, large, budget);
  std::printf("mixed workload, dim 128, %llu entries, %llu keys, level-0 admission %.3f\n",
              static_cast<unsigned long long>(large / 4), static_cast<unsigned long long>(large * 4), p);
  for (unsigned t : threads) bench_threads(128, large / 4, large * 4, p, budget * 2, t);
  return 0;
}
