#pragma once
// A d-HNSW index built in process over 2 LocalFabric memnodes, and the checks of its answers
// against the live set, for the delete and boundary-copy tests.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/pipeline.hpp"

namespace dmhnsw::dhnsw::testing {

constexpr uint32_t kDim = 16, kN = 3000, kP = 6;

// LocalFabric maps its regions (Endpoint::mapped) except under TSan, where every access is a
// READ (common/fabric/local/local_fabric.cpp): the in-place searches run only outside it.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kLocalMaps = false;
#else
inline constexpr bool kLocalMaps = true;
#endif

/// n vectors around 12 fixed centres `spread` apart (in units of the clusters' own deviation).
inline std::vector<float> blobs(size_t n, uint64_t seed, float spread = 4.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> centers(12 * kDim);
  std::mt19937_64 crng(99);  // the same clusters for every seed
  for (auto& c : centers) c = g(crng) * spread;
  std::vector<float> x(n * kDim);
  for (size_t i = 0; i < n; ++i) {
    const size_t c = rng() % 12;
    for (uint32_t j = 0; j < kDim; ++j) x[i * kDim + j] = centers[c * kDim + j] + g(rng);
  }
  return x;
}

/// A built index in 2 LocalFabric memnodes, each region `region_size` bytes.
inline std::shared_ptr<fabric::LocalCluster> into_local_cluster(const BuiltIndex& b, uint64_t region_size) {
  auto c = fabric::LocalCluster::create(static_cast<uint16_t>(b.regions.size()), region_size);
  for (uint16_t m = 0; m < b.regions.size(); ++m) {
    std::memcpy(c->region(m), b.regions[m].data(), b.regions[m].size());
    RegionHeader h;
    std::memcpy(&h, c->region(m), sizeof h);
    h.region_size = region_size;
    std::memcpy(c->region(m), &h, sizeof h);
  }
  c->refresh_headers();
  return c;
}

/// The index in 2 LocalFabric memnodes with room for two more epochs.
inline std::shared_ptr<fabric::LocalCluster> place(const std::vector<float>& data, const std::vector<int64_t>& ids,
                                                   const BoundaryRule& copies = {}) {
  BuildOptions bo;
  bo.partitions = kP;
  bo.m = 12;
  bo.ef_construction = 60;
  bo.memnodes = 2;
  bo.insert_buffer_bytes = 1 << 20;
  bo.boundary = copies;
  BuiltIndex b = build_index(data.data(), ids.size(), kDim, Metric::L2, bo, ids.data());
  REQUIRE(b.header.id_buckets > 0);
  uint64_t size = 0;
  for (uint64_t s : b.region_bytes) size = std::max(size, 4 * s);
  return into_local_cluster(b, size);
}

/// The live set: id -> vector.
using Live = std::unordered_map<int64_t, std::vector<float>>;

inline std::vector<Answer> search(fabric::Cluster& c, const std::vector<float>& q, uint32_t probe = kP,
                                  bool in_place = true) {
  auto ep = c.make_endpoint();
  Index idx = load_index(c, *ep);
  EngineOptions o;
  o.batch = 64;
  o.probe = probe;  // kP: every partition, what is not found is not there
  o.ef_search = 64;
  o.cache_subs = 0;
  o.in_place = in_place;
  std::vector<Answer> a;
  Engine(c, idx, o).run(q.data(), q.size() / kDim, a);
  return a;
}

/// Every live vector finds itself (in place as fetched) (top 1 at distance 0, or a tie), no answer names an id that
/// is not live, and an answer's distance is the distance to the id's live vector.
inline void check_live(fabric::Cluster& c, const Live& live) {
  std::vector<float> q;
  std::vector<int64_t> who;
  for (const auto& [id, v] : live) {
    q.insert(q.end(), v.begin(), v.end());
    who.push_back(id);
  }
  const std::vector<Answer> a = search(c, q);
  // Where the regions are mapped the sub-HNSWs were searched in place (those with overflow
  // records copied out of the mapping): the answers are those of fetching them.
  CHECK(a == search(c, q, kP, false));
  size_t self = 0, foreign = 0, stale = 0, twice = 0;
  for (size_t i = 0; i < who.size(); ++i) {
    std::set<int64_t> seen;
    for (const auto& [d, id] : a[i]) twice += !seen.insert(id).second;
    for (const auto& [d, id] : a[i]) {
      auto it = live.find(id);
      if (it == live.end()) {
        ++foreign;
        continue;
      }
      float t = 0;
      for (uint32_t j = 0; j < kDim; ++j) t += (q[i * kDim + j] - it->second[j]) * (q[i * kDim + j] - it->second[j]);
      if (std::abs(t - d) > 1e-3f * std::max(1.f, t)) ++stale;
    }
    self += !a[i].empty() && (a[i][0].second == who[i] || a[i][0].first < 1e-6f);
  }
  CHECK(foreign == 0);  // a deleted id never comes back
  CHECK(stale == 0);    // nor an upserted id's old vector
  CHECK(twice == 0);    // nor an id twice (boundary copies)
  CHECK(static_cast<double>(self) >= 0.99 * static_cast<double>(who.size()));
}

}  // namespace dmhnsw::dhnsw::testing
