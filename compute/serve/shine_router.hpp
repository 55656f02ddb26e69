#pragma once
// SHINE's adaptive routing (paper section 6.2) for live requests: a search that arrives at one
// serving computenode goes, query by query, to the computenode whose node cache fits it (the
// logical partition its nearest centroid names, chosen by the same RoutingPolicy as
// `query --routing`), through the memnodes' relay, and the answer comes back the same way.
// Every serving computenode computes the same partitioning (same sample, same seed), so they
// agree on who holds what without talking. A target that is gone, bounces the message, fails
// or does not answer within --route-timeout-ms is routed around: the query runs here.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compute/relay_client.hpp"
#include "compute/run_context.hpp"
#include "compute/serve/metrics.hpp"
#include "compute/shine/graph.hpp"
#include "compute/shine/options.hpp"
#include "router/partition.hpp"
#include "router/policy.hpp"

namespace dmhnsw::serve {

/// What live routing adds to shine::RoutingOptions.
struct LiveRouteOptions {
  uint32_t timeout_ms = 5000;  // a routed query not answered this long runs here
  uint32_t wait_us = 1000;     // queries of concurrent requests gathered this long into one choice
};

/// One query of a request, wherever it runs; `done` is called exactly once.
struct LiveQuery {
  const float* q = nullptr;
  uint32_t k = 0, ef = 0;
  int64_t* ids = nullptr;  // k
  float* dist = nullptr;   // k
  std::function<void(std::exception_ptr)> done;
  uint32_t rerank = 0;  // an index with codes: traverse on them, re-read the best this many (0: full vectors)
};

class LiveRouter {
 public:
  struct Hooks {
    std::function<void(LiveQuery)> run_here;  // queue on this computenode's workers (never blocks)
    std::function<uint64_t()> queue_len;      // this computenode's working queue
  };
  /// Samples the index, partitions it (balanced k-means, as `query`), joins the relay.
  LiveRouter(const compute::RunContext& rc, const shine::Graph& g, fabric::Endpoint& control,
             const shine::RoutingOptions& o, const LiveRouteOptions& live, Hooks h, Registry& metrics);
  ~LiveRouter();
  LiveRouter(const LiveRouter&) = delete;
  LiveRouter& operator=(const LiveRouter&) = delete;

  /// Queues the queries for routing; the router thread sends each where the policy says
  /// (those for this computenode go to run_here). Never blocks on the network.
  void route(std::vector<LiveQuery>& qs);

 private:
  struct Pending {
    LiveQuery q;
    uint32_t target;
    std::chrono::steady_clock::time_point sent;
  };
  /// Gathers queued queries (up to the rest of the routing batch, or wait_us after the first
  /// arrived) so that the policy chooses for many at once: within a choice, the queries moved
  /// off a full computenode are those nearest a partition boundary (least regret), as in
  /// `query`'s router, which routes whole batches.
  void router_loop();
  void dispatch(std::vector<LiveQuery>& qs);
  void deliver(uint32_t from, const char* body, size_t len);
  void bounce(uint32_t to, const char* body, size_t len);
  void gone(uint32_t cn);
  /// Takes pending query `req` back and runs it here (why: a metrics label).
  void take_back(uint64_t req, const char* why);
  void watch();  // timeouts, and this computenode's queue length to the others (adaptive)

  compute::RunContext rc_;
  uint32_t dim_;
  shine::RoutingOptions o_;
  LiveRouteOptions live_;
  Hooks h_;
  router::Oracle oracle_;
  std::mutex policy_mu_;
  std::unique_ptr<router::RoutingPolicy> policy_;
  uint32_t in_batch_ = 0;
  std::vector<uint64_t> loads_;  // the others' queue lengths, as last heard (policy_mu_)
  std::vector<char> gone_;       // policy_mu_
  std::mutex pending_mu_;
  std::map<uint64_t, Pending> pending_;
  uint64_t next_req_ = 1;
  Counter &to_self_, &to_peer_, &routed_in_, &bounced_, &timed_out_, &failed_, &peer_gone_;
  std::unique_ptr<compute::RelayClient> relay_;
  bool stop_ = false;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::thread watcher_;
  std::mutex rq_mu_;
  std::condition_variable rq_cv_;
  std::vector<LiveQuery> rq_;  // waiting for the router thread
  std::chrono::steady_clock::time_point first_at_;
  bool stop_router_ = false;
  std::thread router_;
};

}  // namespace dmhnsw::serve
