#pragma once
// Small helpers shared by the shine build and query runs.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/coro.hpp"

namespace dmhnsw::shine {

using Clock = std::chrono::steady_clock;

inline double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// CPU time this process has used (every thread, user + system), in seconds.
inline double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// Runs `body(thread_index, endpoint)` on T threads; the first exception stops the others
/// (through `stop`) and is rethrown.
template <class F>
void parallel(fabric::Cluster& c, uint32_t threads, std::atomic<bool>& stop, F body) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      try {
        auto ep = c.make_endpoint(64u << 20);
        body(t, *ep);
      } catch (...) {
        std::lock_guard g(mu);
        if (!first) first = std::current_exception();
        stop.store(true);
      }
    });
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

inline nlohmann::json io_json(const compute::IoStats& s) {
  return {{"reads", s.reads}, {"writes", s.writes}, {"atomics", s.atomics}, {"bytes", s.bytes}, {"doorbells", s.doorbells}};
}

inline double percentile(std::vector<float>& v, double p) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(i), v.end());
  return v[i];
}

}  // namespace dmhnsw::shine
