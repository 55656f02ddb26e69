// The d-HNSW query engine on LocalFabric: an index built in process and placed into two
// LocalFabric memnodes; the pipeline's answers against brute force and against each
// ablation; the cache across batches; injected delays; a failed fetch and a dead memnode.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <random>

#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/pipeline.hpp"
#include "tests/dhnsw/local_index.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;
using Catch::Contains;

namespace {

constexpr uint32_t kDim = 16, kN = 4000, kQ = 120, kP = 8;

std::vector<float> blobs(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> centers(16 * kDim);
  for (auto& c : centers) c = g(rng) * 4.f;
  std::vector<float> x(n * kDim);
  for (size_t i = 0; i < n; ++i) {
    size_t c = rng() % 16;
    for (uint32_t j = 0; j < kDim; ++j) x[i * kDim + j] = centers[c * kDim + j] + g(rng);
  }
  return x;
}

/// An index over 2 LocalFabric memnodes, its data and queries.
struct Fixture {
  std::vector<float> data = blobs(kN, 1), queries = blobs(kQ, 2);
  std::shared_ptr<fabric::LocalCluster> cluster;
  Fixture() {
    BuildOptions bo;
    bo.partitions = kP;
    bo.m = 16;
    bo.ef_construction = 80;
    bo.memnodes = 2;
    BuiltIndex b = build_index(data.data(), kN, kDim, Metric::L2, bo);
    uint64_t size = 0;
    for (const auto& r : b.regions) {
      RegionHeader h;
      std::memcpy(&h, r.data(), sizeof h);
      size = std::max(size, h.region_size);
    }
    cluster = testing::into_local_cluster(b, size);
  }
  /// Exact top-k ids of query q.
  std::vector<int64_t> exact(uint32_t q, uint32_t k) const {
    std::vector<std::pair<float, int64_t>> d(kN);
    for (uint32_t i = 0; i < kN; ++i) {
      float s = 0;
      for (uint32_t j = 0; j < kDim; ++j) {
        float t = queries[q * kDim + j] - data[i * kDim + j];
        s += t * t;
      }
      d[i] = {s, i};
    }
    std::partial_sort(d.begin(), d.begin() + k, d.end());
    std::vector<int64_t> out;
    for (uint32_t i = 0; i < k; ++i) out.push_back(d[i].second);
    return out;
  }
  double recall(const std::vector<Answer>& a, uint32_t k) const {
    double hits = 0;
    for (uint32_t q = 0; q < kQ; ++q) {
      auto gt = exact(q, k);
      for (const auto& [dist, id] : a[q])
        if (std::find(gt.begin(), gt.end(), id) != gt.end()) hits += 1;
    }
    return hits / (kQ * k);
  }
};

std::vector<int64_t> ids(const Answer& a) {
  std::vector<int64_t> v;
  for (const auto& [d, id] : a) v.push_back(id);
  return v;
}

}  // namespace

TEST_CASE("dhnsw pipeline: answers match brute force, and every ablation answers the same", "[dhnsw]") {
  Fixture f;
  auto ep = f.cluster->make_endpoint();
  Index idx = load_index(*f.cluster, *ep);
  REQUIRE(idx.subs.size() == kP);
  EngineOptions o;
  o.batch = 32;
  o.probe = 3;
  o.ef_search = 48;
  std::vector<Answer> full;
  RunStats rs = Engine(*f.cluster, idx, o).run(f.queries.data(), kQ, full);
  {  // probing every partition, the result is as good as one HNSW's
    EngineOptions all = o;
    all.probe = kP;
    std::vector<Answer> a;
    Engine(*f.cluster, idx, all).run(f.queries.data(), kQ, a);
    CHECK(f.recall(a, 10) >= 0.95);
    CHECK(f.recall(full, 10) < f.recall(a, 10) + 1e-9);
  }
  REQUIRE(rs.batches.size() == (kQ + 31) / 32);
  for (const auto& b : rs.batches) {
    CHECK(b.needed <= kP);
    CHECK(b.fetched + b.cache_hits == b.needed);  // each needed sub-HNSW once per batch
    CHECK(b.doorbells <= (b.fetched + o.doorbell_subs - 1) / o.doorbell_subs);
  }
  for (auto [regroup, doorbell, pipeline] : {std::tuple{false, false, false}, std::tuple{true, false, true},
                                             std::tuple{true, true, false}, std::tuple{false, true, true}}) {
    EngineOptions v = o;
    v.regroup = regroup;
    v.doorbell = doorbell;
    v.pipeline = pipeline;
    std::vector<Answer> a;
    RunStats s = Engine(*f.cluster, idx, v).run(f.queries.data(), kQ, a);
    INFO("regroup " << regroup << " doorbell " << doorbell << " pipeline " << pipeline);
    for (uint32_t q = 0; q < kQ; ++q) CHECK(ids(a[q]) == ids(full[q]));
    uint64_t fetched = 0, reads = 0, doorbells = 0;
    for (const auto& b : s.batches) {
      fetched += b.fetched;
      reads += b.reads;
      doorbells += b.doorbells;
    }
    if (!regroup) CHECK(fetched == uint64_t{kQ} * o.probe);
    if (!doorbell) CHECK(doorbells == reads);
  }
  // LocalFabric maps its regions: by default every sub-HNSW was searched where it lies, with
  // no READ of it; fetched and deserialized (--no-in-place), the answers are the same.
  uint64_t in_place = 0, bytes = 0;
  for (const auto& b : rs.batches) {
    in_place += b.in_place;
    bytes += b.bytes;
    if (testing::kLocalMaps) CHECK(b.in_place + b.cache_hits == b.needed);
    CHECK(b.in_place_copies == 0);
  }
  CHECK((in_place > 0) == testing::kLocalMaps);
  CHECK(bytes > 0);  // in place, the bytes the fetches would have read
  for (bool pipeline : {true, false}) {
    EngineOptions v = o;
    v.in_place = false;
    v.pipeline = pipeline;
    v.cache_subs = 0;  // every needed sub-HNSW fetched, as every one is searched in place
    std::vector<Answer> a;
    RunStats s = Engine(*f.cluster, idx, v).run(f.queries.data(), kQ, a);
    for (uint32_t q = 0; q < kQ; ++q) {
      CHECK(ids(a[q]) == ids(full[q]));
      CHECK(a[q] == full[q]);  // distances too: the same search over the same arrays
    }
    uint64_t fetched_bytes = 0;
    for (const auto& b : s.batches) {
      CHECK(b.in_place == 0);
      fetched_bytes += b.bytes;
    }
    // In place, the same sub-HNSWs' fetch ranges (under TSan LocalFabric maps nothing and the
    // run above fetched, through its cache).
    if (testing::kLocalMaps) CHECK(fetched_bytes == bytes);
  }
}

TEST_CASE("dhnsw pipeline: a cache of every sub-HNSW serves the next run without fetching", "[dhnsw]") {
  Fixture f;
  auto ep = f.cluster->make_endpoint();
  Index idx = load_index(*f.cluster, *ep);
  EngineOptions o;
  o.batch = 40;
  o.probe = 2;
  o.cache_subs = kP;
  o.in_place = false;  // the cache keeps fetched sub-HNSWs; in place nothing is fetched
  Engine e(*f.cluster, idx, o);
  REQUIRE(e.cache_capacity() == kP);
  std::vector<Answer> a1, a2;
  e.run(f.queries.data(), kQ, a1);
  RunStats s2 = e.run(f.queries.data(), kQ, a2);
  for (const auto& b : s2.batches) {
    CHECK(b.fetched == 0);
    CHECK(b.bytes == 0);
    CHECK(b.cache_hits == b.needed);
  }
  for (uint32_t q = 0; q < kQ; ++q) CHECK(ids(a1[q]) == ids(a2[q]));
  // default: 10 % of P (rounded) sub-HNSWs
  CHECK(Engine(*f.cluster, idx, EngineOptions{}).cache_capacity() == 1);
}

TEST_CASE("dhnsw pipeline: injected delays slow it down but change nothing", "[dhnsw]") {
  Fixture f;
  auto ep = f.cluster->make_endpoint();
  Index idx = load_index(*f.cluster, *ep);
  EngineOptions o;
  o.batch = 30;
  o.probe = 2;
  o.cache_subs = 0;
  std::vector<Answer> fast, slow;
  Engine(*f.cluster, idx, o).run(f.queries.data(), kQ, fast);
  f.cluster->set_delay(std::chrono::microseconds(3000));
  RunStats s = Engine(*f.cluster, idx, o).run(f.queries.data(), kQ, slow);
  f.cluster->set_delay(std::chrono::microseconds(0));
  for (uint32_t q = 0; q < kQ; ++q) CHECK(ids(fast[q]) == ids(slow[q]));
  double fetch = 0;
  for (const auto& b : s.batches) fetch += b.fetch_s;
  CHECK(fetch >= 0.003 * static_cast<double>(s.batches.size()));  // every batch waited for at least one delay
}

TEST_CASE("dhnsw pipeline: a failed fetch fails the run naming the partition and memnode, nothing hangs", "[dhnsw]") {
  Fixture f;
  auto ep = f.cluster->make_endpoint();
  Index idx = load_index(*f.cluster, *ep);
  for (bool pipeline : {true, false}) {
    EngineOptions o;
    o.batch = 20;
    o.probe = 2;
    o.cache_subs = 0;
    o.pipeline = pipeline;
    Engine e(*f.cluster, idx, o);
    std::vector<Answer> a;
    f.cluster->set_delay(std::chrono::microseconds(500));
    f.cluster->fail_next(1);
    auto fut = std::async(std::launch::async, [&] { e.run(f.queries.data(), kQ, a); });
    REQUIRE(fut.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    // The batch's first operation is the control block's READ, then descriptors and fetches.
    REQUIRE_THROWS_WITH(fut.get(), (Contains("partition") || Contains("control block")) && Contains("memnode"));
    f.cluster->set_delay(std::chrono::microseconds(0));
  }
  // a memnode gone: every fetch toward it fails, the run ends with an error naming it
  f.cluster->disconnect(1, "killed by the test");
  EngineOptions o;
  o.batch = 20;
  o.probe = kP;  // every batch needs both memnodes
  o.cache_subs = 0;
  Engine e(*f.cluster, idx, o);
  std::vector<Answer> a;
  auto fut = std::async(std::launch::async, [&] { e.run(f.queries.data(), kQ, a); });
  REQUIRE(fut.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  REQUIRE_THROWS_WITH(fut.get(), Contains("memnode 1") && Contains("sub-HNSW"));
}
