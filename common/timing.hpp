#pragma once
// Time and latency figures as every report gives them: the one clock, seconds as doubles, and
// one percentile. (The transport, below common/, keeps its own steady_clock alias.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dmhnsw {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline double seconds_since(Clock::time_point t0) { return seconds(Clock::now() - t0); }

/// Nearest-rank percentile (p in [0, 1]): the smallest value with at least a share p of the
/// values at or below it; 0 for none. Takes the values by copy (partially reorders them).
template <class T>
double percentile(std::vector<T> v, double p) {
  if (v.empty()) return 0;
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  const size_t i = std::clamp<size_t>(rank, 1, v.size()) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return static_cast<double>(v[i]);
}

}  // namespace dmhnsw
