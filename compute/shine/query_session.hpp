#pragma once
// One computenode's part of a shine query run, in the parts the paper names: the node cache
// (section 5, cache/), the partitioning oracle over balanced k-means (section 6,
// router/partition), the relay exchange that carries routed queries between computenodes
// (section 7, query_exchange.hpp), the traces csp-report replays, and the run loop: per phase
// a router thread (route) feeding the workers (answer), then the report (query_report.cpp).
#include <nlohmann/json.hpp>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cache/node_cache.hpp"
#include "cache/trace.hpp"
#include "common/workload.hpp"
#include "compute/board.hpp"
#include "compute/relay_client.hpp"
#include "compute/shine/codes_log.hpp"
#include "compute/shine/engine.hpp"
#include "compute/shine/query_exchange.hpp"
#include "compute/shine/run_util.hpp"
#include "router/partition.hpp"
#include "router/policy.hpp"

namespace dmhnsw::shine::query_detail {

struct PerQuery {
  float latency_us;
  float recall;
  compute::IoStats io;
  SearchStats ss;
};

struct PhaseResult {
  double seconds = 0;
  uint64_t input = 0, routed_away = 0, received = 0, bounced = 0, syncs = 0;
  std::vector<uint64_t> routed_to;
};

/// The node cache's counters over a phase (entries as at its end).
cache::NodeCacheStats stats_since(const cache::NodeCacheStats& now, const cache::NodeCacheStats& before);

/// The router's buffers, reused by every routing batch of a phase.
struct RouteScratch {
  std::vector<uint32_t> ranks;  // gather x K: each query's computenodes, best first
  std::vector<const uint32_t*> ranked;
  std::vector<float> regret, scores;
};

/// What the router thread and the workers of one phase share.
struct PhaseRun {
  uint32_t phase = 0;
  const std::vector<uint32_t>* items = nullptr;  // this computenode's share of the stream
  uint32_t ef = 0;
  double min_seconds = 0;  // > 0: cycle through `items` until then
  bool is_measured = false;
  bool need_done = false;  // routing between computenodes: wait for the peers' done counts
  Clock::time_point t0, deadline;
  std::atomic<bool> stop{false}, router_done{false};
  std::exception_ptr router_error;
  PhaseResult result;
  std::atomic<uint64_t> answered{0};
  // Nothing to route (need_done false): the workers draw the stream themselves (QuerySession::draw).
  std::atomic<uint64_t> drawn{0}, input{0};
  std::atomic<int64_t> next_note{0};
  std::atomic<int64_t> next_sync{0};  // steady-clock ns of the next sync round (ask_owed)
  std::atomic<uint64_t> syncs{0};     // SyncMsgs sent in this phase
  uint64_t failovers_at_start = 0;  // replica copies seen dead before the phase (replicas.hpp)
};

class QuerySession {
 public:
  QuerySession(const RunContext& rc, const QueryOptions& o);
  QuerySession(const QuerySession&) = delete;
  QuerySession& operator=(const QuerySession&) = delete;
  /// The warm-up phase, then one measured phase per efSearch; the merged report on
  /// computenode 0 (the others' reports hold the header only).
  nlohmann::json run();

 private:
  // ---- set-up, in this order (query.cpp)
  void make_node_cache();
  void make_partition_oracle();
  compute::RelayClient::Callbacks relay_callbacks();
  void open_traces();
  // ---- the run loop (query_phase.cpp)
  PhaseResult run_phase(uint32_t phase, const std::vector<uint32_t>& items, uint32_t ef, double min_seconds,
                        bool is_measured, std::vector<PerQuery>& out);
  void route(PhaseRun& run);
  /// The next query of this computenode's own share when nothing is routed; false once the
  /// share (or its --repeat-seconds window) is through.
  bool draw(PhaseRun& run, uint32_t& pos);
  std::vector<uint32_t> choose_targets(const std::vector<uint32_t>& batch, router::RoutingPolicy& rp,
                                       RouteScratch& sc);
  void share_queue_length(PhaseRun& run, router::RoutingPolicy& rp, uint64_t& batch_no);
  void answer(PhaseRun& run, std::vector<PerQuery>& out);
  void note_progress(PhaseRun& run);
  /// After a replica copy died: ask the peers that still owe this phase queries or a done
  /// count for them (query_exchange.hpp), at most every kSyncEvery while idle.
  void ask_owed(PhaseRun& run);
  /// A peer's SyncMsg: send again the queries it lacks and the done count (I/O thread).
  void resend(uint32_t to, uint32_t phase, uint32_t next, const std::vector<uint32_t>& missing);
  void send_query(uint32_t to, uint32_t phase, uint32_t pos, uint32_t seq, std::vector<char>& msg);
  // ---- the report (query_report.cpp)
  nlohmann::json report_header() const;
  nlohmann::json my_share(const std::vector<PerQuery>& rows, const PhaseResult& pr, const cache::NodeCacheStats& cs,
                          double cpu_secs) const;
  nlohmann::json merge_run(uint32_t ef, const std::vector<std::string>& texts);

  const RunContext& rc_;
  const QueryOptions& o_;
  fabric::Cluster& c_;
  Workload wl_;
  router::Policy policy_;
  std::unique_ptr<fabric::Endpoint> control_;
  GraphParams p_;
  std::optional<Graph> g_;
  std::optional<compute::Board> board_;
  uint32_t K_, self_;
  // the node cache
  std::unique_ptr<cache::NodeCache> ncache_;
  bool cache_lists_ = false;  // ncache_ holds neighbour lists (SearchOptions::cache_lists), else vectors
  bool in_place_ = false;     // --in-place and the endpoints map the regions (Endpoint::mapped)
  // the codes (--rerank): every node's code, loaded once
  std::optional<LocalCodes> codes_;
  double codes_load_s_ = 0;
  uint64_t idx_bytes_ = 0;
  cache::NodeCacheConfig cc_;
  // the partitioning oracle
  router::Oracle oracle_;
  nlohmann::json partition_ = nullptr;
  // the relay exchange
  Exchange ex_;
  std::atomic<uint32_t> bounce_resends_{0};
  std::atomic<compute::RelayClient*> relay_ptr_{nullptr};
  std::mutex gone_mu_;
  nlohmann::json gone_list_ = nlohmann::json::array();
  std::optional<compute::RelayClient> relay_;
  // the traces, one per thread
  std::vector<std::unique_ptr<cache::TraceWriter>> traces_;
};

}  // namespace dmhnsw::shine::query_detail
