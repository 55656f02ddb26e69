#pragma once
// Test data for the shine unit tests: n x d values drawn from N(0, 1), the same for a seed.
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace dmhnsw::testing {

inline std::vector<float> gaussian(size_t n, size_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(n * d);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace dmhnsw::testing
