// Distance kernels (hnswlib SIMD spaces, one table per instruction set) against the scalar
// reference, and the run-time choice of instruction set.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/distance.hpp"

using namespace dmhnsw;

namespace {

std::vector<float> random_vector(std::size_t d, std::mt19937_64& rng) {
  std::vector<float> v(d);
  for (float& x : v)
    x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  return v;
}

}  // namespace

TEST_CASE("metric parsing", "[distance]") {
  CHECK(parse_metric("l2") == Metric::L2);
  CHECK(parse_metric("IP") == Metric::IP);
  CHECK(to_string(Metric::L2) == "l2");
  CHECK(to_string(Metric::IP) == "ip");
  CHECK(parse_metric(to_string(Metric::IP)) == Metric::IP);
  CHECK_THROWS_WITH(parse_metric("cosine"), Catch::Contains("cosine"));
  CHECK_THROWS_AS(parse_metric(""), std::invalid_argument);
  CHECK_THROWS_AS(DistanceComputer(Metric::L2, 0), std::invalid_argument);
}

TEST_CASE("the kernels of every usable instruction set match the scalar reference", "[distance]") {
  // 1..130: every kernel shape (x16, x4, their tails, scalar) and every tail length, and 960
  std::vector<std::size_t> dims;
  for (std::size_t d = 1; d <= 130; ++d) dims.push_back(d);
  for (std::size_t d : {200, 384, 385, 960}) dims.push_back(d);
  for (SimdIsa isa : usable_simd_isas()) {
    std::mt19937_64 rng(42);
    for (Metric metric : {Metric::L2, Metric::IP}) {
      for (std::size_t d : dims) {
        const DistanceComputer dist(metric, d, isa);
        CHECK(dist.dim() == d);
        CHECK(dist.metric() == metric);
        CHECK(dist.isa() == isa);
        INFO("metric " << to_string(metric) << " dim " << d << " kernel " << dist.kernel_name());
        for (int trial = 0; trial < 10; ++trial) {
          const auto a = random_vector(d, rng);
          const auto b = random_vector(d, rng);
          const float got = dist(a.data(), b.data());
          const float want = reference_distance(metric, a.data(), b.data(), d);
          // float accumulation vs double: relative to the magnitude of the terms summed
          double scale = 0;
          for (std::size_t i = 0; i < d; ++i)
            scale += metric == Metric::L2 ? (a[i] - b[i]) * (a[i] - b[i]) : std::abs(a[i] * b[i]);
          REQUIRE(std::abs(got - want) <= 1e-5 * (scale + 1.0));
        }
        // identical vectors
        const auto a = random_vector(d, rng);
        if (metric == Metric::L2) REQUIRE(dist(a.data(), a.data()) == 0.0f);
      }
    }
  }
}

TEST_CASE("kernel names report the instruction set", "[distance]") {
  const auto& usable = usable_simd_isas();
  REQUIRE(!usable.empty());
  CHECK(std::is_sorted(usable.begin(), usable.end()));
#if defined(__x86_64__)
  CHECK(usable.front() == SimdIsa::SSE);  // every x86-64 CPU
#endif
  for (SimdIsa isa : usable) {
    const std::string i(to_string(isa));
    INFO("isa " << i);
    if (isa == SimdIsa::Scalar) {
      CHECK(DistanceComputer(Metric::L2, 128, isa).kernel_name() == "l2/scalar");
      continue;
    }
    CHECK(DistanceComputer(Metric::L2, 128, isa).kernel_name() == "l2/" + i + "/x16");
    CHECK(DistanceComputer(Metric::IP, 100, isa).kernel_name() == "ip/" + i + "/x4");
    CHECK(DistanceComputer(Metric::L2, 129, isa).kernel_name() == "l2/" + i + "/x16+tail");
    CHECK(DistanceComputer(Metric::IP, 7, isa).kernel_name() == "ip/" + i + "/x4+tail");
    CHECK(DistanceComputer(Metric::L2, 3, isa).kernel_name() == "l2/scalar");
  }
  for (SimdIsa isa : {SimdIsa::Scalar, SimdIsa::SSE, SimdIsa::AVX2, SimdIsa::AVX512})
    if (std::find(usable.begin(), usable.end(), isa) == usable.end())
      CHECK_THROWS_WITH(DistanceComputer(Metric::L2, 16, isa), Catch::Contains(std::string(to_string(isa))));
}

// ctest also runs this file with DMHNSW_SIMD=sse and =avx2 (tests/common/CMakeLists.txt).
TEST_CASE("the default instruction set is the best usable one, capped by DMHNSW_SIMD", "[distance]") {
  const auto& usable = usable_simd_isas();
  SimdIsa want = usable.back();
  if (const char* env = std::getenv("DMHNSW_SIMD"); env != nullptr && *env != '\0') {
    INFO("DMHNSW_SIMD=" << env);
    const std::string_view e(env);
    const SimdIsa cap = e == "sse" ? SimdIsa::SSE : e == "avx2" ? SimdIsa::AVX2 : SimdIsa::AVX512;
    want = usable.front();
    for (SimdIsa isa : usable)
      if (isa <= cap) want = isa;
  }
  CHECK(simd_isa() == want);
  const DistanceComputer dist(Metric::L2, 128);
  CHECK(dist.isa() == want);
  if (want != SimdIsa::Scalar) CHECK(dist.kernel_name() == "l2/" + std::string(to_string(want)) + "/x16");
  WARN("distance kernels: " << dist.kernel_name() << " (usable: " << usable.size() << " instruction sets)");
}

// Run by ctest with DMHNSW_SIMD=bogus only.
TEST_CASE("an unknown DMHNSW_SIMD value is refused", "[.][distance-bad-env]") {
  CHECK_THROWS_WITH(simd_isa(), Catch::Contains("bogus"));
  CHECK_THROWS_AS(DistanceComputer(Metric::L2, 16), std::invalid_argument);
}

TEST_CASE("inner product convention is 1 - dot", "[distance]") {
  const std::vector<float> a = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<float> b = {0.5f, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const DistanceComputer ip(Metric::IP, 16);
  CHECK(ip(a.data(), b.data()) == Approx(0.5f));
  CHECK(ip(a.data(), a.data()) == Approx(0.0f));
  CHECK(reference_distance(Metric::IP, a.data(), b.data(), 16) == Approx(0.5f));
  const DistanceComputer l2(Metric::L2, 16);
  CHECK(l2(a.data(), b.data()) == Approx(1.25f));
  CHECK(l2.kernel_name().rfind("l2/", 0) == 0);
  CHECK(ip.kernel_name().rfind("ip/", 0) == 0);
}

TEST_CASE("distance computers are plain values usable from many threads", "[distance]") {
  std::mt19937_64 rng(7);
  const std::size_t d = 100;
  std::vector<std::vector<float>> data;
  for (int i = 0; i < 64; ++i) data.push_back(random_vector(d, rng));
  std::vector<float> expected;
  for (int i = 0; i < 63; ++i)
    expected.push_back(reference_distance(Metric::L2, data[i].data(), data[i + 1].data(), d));

  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const DistanceComputer local(Metric::L2, d);  // constructed concurrently
      const DistanceComputer copy = local;
      int good = 0;
      for (int i = 0; i < 63; ++i)
        good += std::abs(copy(data[i].data(), data[i + 1].data()) - expected[i]) < 1e-3f;
      ok[t] = good;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(ok[t] == 63);
}
