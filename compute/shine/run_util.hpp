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

#include "common/timing.hpp"
#include "common/fabric/transport.hpp"
#include "compute/coro.hpp"
#include "compute/pinning.hpp"

namespace dmhnsw::shine {



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
        compute::pin_worker(t, threads);  // first: the endpoint's pool is then touched on its core's node
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

/// Runs `body(worker, i, ctx)` (a coroutine) for every i in [0, n): `threads` threads, each with
/// a Scheduler and a `W(g, scheduler, seed + thread)`, run `coroutines` coroutines that take
/// the next i until none is left or `stop`. Returns every coroutine's context (statistics).
template <class W, class Ctx, class G, class Body>
std::vector<Ctx> each_item(fabric::Cluster& c, const G& g, uint32_t threads, uint32_t coroutines, uint64_t seed,
                           size_t n, std::atomic<bool>& stop, Body body) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<Ctx> all;
  parallel(c, threads, stop, [&](uint32_t t, fabric::Endpoint& ep) {
    compute::Scheduler s(ep);
    W w(g, s, seed + t);
    std::vector<Ctx> ctxs(coroutines);
    auto loop = [&](Ctx& ctx) -> compute::Task<void> {
      for (;;) {
        if (stop.load()) co_return;
        const size_t i = next.fetch_add(1);
        if (i >= n) co_return;
        co_await body(w, i, ctx);
      }
    };
    for (auto& ctx : ctxs) s.spawn(loop(ctx));
    s.run();
    std::lock_guard l(mu);
    for (auto& x : ctxs) all.push_back(std::move(x));
  });
  return all;
}

inline nlohmann::json io_json(const compute::IoStats& s) {
  return {{"reads", s.reads}, {"writes", s.writes}, {"atomics", s.atomics}, {"bytes", s.bytes}, {"doorbells", s.doorbells}};
}


}  // namespace dmhnsw::shine
