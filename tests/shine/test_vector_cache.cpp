// shine::VectorCache: what the build's inserts look vectors up in. Found entries hold the
// vector, level and label that went in; a full cache says so instead of growing; threads
// caching the same and different nodes at once all get correct views.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "compute/shine/vector_cache.hpp"

using dmhnsw::RemotePtr;
using dmhnsw::shine::VectorCache;

namespace {
std::vector<float> vec_of(uint64_t id, uint32_t dim) {
  std::vector<float> v(dim);
  for (uint32_t j = 0; j < dim; ++j) v[j] = static_cast<float>(id * 1000 + j);
  return v;
}
RemotePtr node_of(uint64_t id) { return RemotePtr(static_cast<uint16_t>(id % 3), 4096 + 832 * id); }
}  // namespace

TEST_CASE("vector cache: entries come back as they went in and a full cache refuses", "[shine][vcache]") {
  constexpr uint32_t kDim = 37;  // not a multiple of the 16-float row
  VectorCache c(1 << 20, kDim);
  REQUIRE(c.capacity() > 1000);
  CHECK_FALSE(c.find(node_of(1)));
  for (uint64_t id = 0; id < 1000; ++id) {
    auto v = vec_of(id, kDim);
    auto e = c.insert(node_of(id), v.data(), static_cast<unsigned>(id % 5), static_cast<uint32_t>(id + 7));
    REQUIRE(e);
  }
  CHECK(c.entries() == 1000);
  for (uint64_t id = 0; id < 1000; ++id) {
    auto e = c.find(node_of(id));
    REQUIRE(e);
    CHECK(e->level == id % 5);
    CHECK(e->label == id + 7);
    CHECK(std::vector<float>(e->v, e->v + kDim) == vec_of(id, kDim));
  }
  CHECK_FALSE(c.find(RemotePtr(0, 4096 + 832 * 1001)));
  // Caching a node again returns the first copy and adds nothing.
  auto other = vec_of(5000, kDim);
  auto again = c.insert(node_of(3), other.data(), 0, 0);
  REQUIRE(again);
  CHECK(again->v[0] == vec_of(3, kDim)[0]);
  CHECK(c.entries() == 1000);

  VectorCache small(4096, kDim);  // room for a handful
  uint64_t held = 0;
  for (uint64_t id = 0; id < 100; ++id) {
    auto v = vec_of(id, kDim);
    if (small.insert(node_of(id), v.data(), 0, 0)) ++held;
  }
  CHECK(held == small.capacity());
  CHECK(held < 100);
  VectorCache none(0, kDim);
  auto v = vec_of(1, kDim);
  CHECK_FALSE(none.insert(node_of(1), v.data(), 0, 0));
}

TEST_CASE("vector cache: four threads caching overlapping nodes all see correct vectors", "[shine][vcache]") {
  constexpr uint32_t kDim = 16;
  constexpr uint64_t kNodes = 20000;
  VectorCache c(64 << 20, kDim);
  std::atomic<uint64_t> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (uint64_t k = 0; k < kNodes; ++k) {
        const uint64_t id = (k * 7919 + static_cast<uint64_t>(t) * 104729) % kNodes;
        auto v = vec_of(id, kDim);
        auto e = c.find(node_of(id));
        if (!e) e = c.insert(node_of(id), v.data(), 1, static_cast<uint32_t>(id));
        if (!e || e->label != id || e->v[kDim - 1] != v[kDim - 1]) wrong.fetch_add(1);
      }
    });
  for (auto& t : ts) t.join();
  CHECK(wrong.load() == 0);
  CHECK(c.entries() == kNodes);
  for (uint64_t id = 0; id < kNodes; ++id) {
    auto e = c.find(node_of(id));
    REQUIRE(e);
    CHECK(e->v[0] == static_cast<float>(id * 1000));
  }
}

TEST_CASE("vector cache: a reused record's vector is forgotten and cached anew", "[shine][vcache]") {
  constexpr uint32_t kD = 8;
  VectorCache c(1 << 20, kD);
  std::vector<float> a(kD, 1.0f), b(kD, 2.0f);
  for (uint64_t i = 1; i <= 100; ++i) REQUIRE(c.insert(RemotePtr(0, 64 * i), a.data(), 0, i));
  const RemotePtr p(0, 64 * 17);
  c.invalidate(p);
  CHECK_FALSE(c.find(p));
  for (uint64_t i = 1; i <= 100; ++i)
    if (i != 17) CHECK(c.find(RemotePtr(0, 64 * i)));  // the others (also those past p's cell) stay
  auto e = c.insert(p, b.data(), 2, 9017);
  REQUIRE(e);
  auto f = c.find(p);
  REQUIRE(f);
  CHECK(f->v[0] == 2.0f);
  CHECK(f->label == 9017);
  CHECK(f->level == 2);
  c.invalidate(RemotePtr(1, 64));  // never cached: nothing happens
  CHECK(c.applied() == 0);
  c.set_applied(5);
  c.set_applied(3);
  CHECK(c.applied() == 5);
}
