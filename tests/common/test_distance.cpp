// Distance kernels (hnswlib SIMD spaces) against the scalar reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
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

TEST_CASE("SIMD kernels match the scalar reference", "[distance]") {
  std::mt19937_64 rng(42);
  // multiples of 16 and 4, residual paths above and below 16, tiny dims
  const std::size_t dims[] = {1, 2, 3, 4, 5, 7, 8, 12, 15, 16, 17, 20, 31, 32, 33,
                              37, 48, 96, 100, 127, 128, 129, 200, 384, 385, 960};
  for (Metric metric : {Metric::L2, Metric::IP}) {
    for (std::size_t d : dims) {
      const DistanceComputer dist(metric, d);
      CHECK(dist.dim() == d);
      CHECK(dist.metric() == metric);
      INFO("metric " << to_string(metric) << " dim " << d << " kernel " << dist.kernel_name());
      for (int trial = 0; trial < 20; ++trial) {
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
