#pragma once
// serve-bench's internals, shared by its translation units: main.cpp (the command line and the
// run), loops.cpp (the closed- and open-loop clients), report.cpp (scoring, percentiles, the
// report). What the tool does is described at the top of main.cpp.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/timing.hpp"
#include "common/dataset.hpp"
#include "common/workload.hpp"
#include "dmhnsw.grpc.pb.h"

namespace dmhnsw::serve_bench {

using json = nlohmann::json;
namespace pb = dmhnsw::v1;

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

inline double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

/// "OK", "UNAVAILABLE", ...: the name errors are counted and reported under.
const char* code_name(grpc::StatusCode c);

struct Options {
  std::vector<std::string> targets;
  std::string workload, token_file, json_out, arrival = "poisson", token;
  uint32_t clients = 4, batch = 1, k = 10, ef = 0, probe = 0, rerank = 0, max_in_flight = 128;
  double rate = 0, seconds = 0, connect_timeout = 5, deadline = 10;
  uint64_t requests = 0, warmup_requests = 0, seed = 1;
  bool seconds_given = false, requests_given = false, warmup_given = false;
  // the inserter (inserts.cpp)
  std::string insert_data;
  uint64_t insert_begin = 0, insert_first_id = 0;
  uint32_t insert_batch = 10, insert_verify_ef = 200, insert_verify_probe = 0;
  double insert_rate = 0;
};

/// Which workload rows the requests carry: request r holds the queries at stream positions
/// [r * batch, r * batch + batch), cut at query_limit; position p is row first_row + p % rows.
struct Plan {
  const Workload* wl = nullptr;
  uint64_t first_row = 0, rows = 0, batch = 1;
  uint64_t query_limit = kUnlimited;    // positions beyond are not asked
  uint64_t request_limit = kUnlimited;  // requests beyond are not sent
  uint32_t k = 10, ef = 0, probe = 0, rerank = 0;

  uint64_t row(uint64_t pos) const { return first_row + pos % rows; }
  uint64_t size(uint64_t r) const { return std::min(batch, query_limit - r * batch); }
  void fill(pb::SearchRequest& req, uint64_t r) const {
    const size_t dim = wl->dim(), n = size(r);
    std::string* v = req.mutable_vectors();
    v->resize(n * dim * sizeof(float));
    for (size_t j = 0; j < n; ++j)
      std::memcpy(v->data() + j * dim * sizeof(float), wl->queries.row(row(r * batch + j)), dim * sizeof(float));
    req.set_dim(static_cast<uint32_t>(dim));
    req.set_k(k);
    req.set_ef_search(ef);
    req.set_probe(probe);
    req.set_rerank(rerank);
  }
};

struct ErrorInfo {
  uint64_t count = 0;
  std::string first_message;
};

struct Stats {
  uint64_t sent = 0, ok = 0, queries = 0;
  double recall_sum = 0, recall1_sum = 0;
  std::vector<double> latency_us;  // per answered request (open loop: from its intended send time)
  std::vector<double> service_us;  // open loop: from its actual send time
  std::vector<double> lag_us;      // open loop: actual send time - intended send time
  std::map<std::string, ErrorInfo> errors;
  Clock::time_point last_send{}, last_done{};
  bool cap_hit = false;
  uint64_t not_sent = 0;  // open loop with --seconds: due before the end but not sent by then
  double max_wake_late_us = 0;  // open loop: latest return from a wait past its deadline

  uint64_t error_count() const {
    uint64_t n = 0;
    for (const auto& [code, e] : errors) n += e.count;
    return n;
  }
  void error(const std::string& code, const std::string& message) {
    ErrorInfo& e = errors[code];
    if (e.count++ == 0) e.first_message = message;
  }
  void merge(const Stats& o);
  /// One finished call: its status, or its answer checked and scored against the ground truth.
  void finish(const Plan& plan, uint64_t r, const grpc::Status& s, const pb::SearchResponse& resp, double lat_us);
};

struct Client {
  size_t target = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Search::Stub> stub;
};

// ---- loops.cpp: connections and the clients' request loops

std::shared_ptr<grpc::Channel> make_channel(const std::string& address);
/// The token and the deadline every call carries.
void prepare(grpc::ClientContext& ctx, const Options& o);
/// Waits until every channel is connected (all connect at once, one deadline for all); throws
/// naming the target of the first that is not, with the reason gRPC gives for it.
void connect_all(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const std::vector<std::string>& names,
                 const Options& o);
/// Closed loop: the next request when the previous one is answered (10 ms after an UNAVAILABLE).
void closed_loop(Client& cl, const Plan& plan, const Options& o, std::atomic<uint64_t>& next, Clock::time_point t0,
                 Clock::time_point stop_at, Stats& st);
/// Open loop: this client's share of the arrivals (rate / clients per second), sent on
/// schedule whatever is still in flight (up to --max-in-flight), answers taken from the
/// client's own completion queue in between.
void open_loop(Client& cl, size_t index, const Plan& plan, const Options& o, std::atomic<uint64_t>& next_request,
               Clock::time_point t0, Clock::time_point stop_at, Stats& st);

// ---- inserts.cpp: Insert requests beside the searches, and the check of what was acknowledged

class Inserter {
 public:
  /// Reads --insert-data (throws naming the flag); `channel`: a connection of its own.
  Inserter(const Options& o, std::shared_ptr<grpc::Channel> channel);
  /// Rows --insert-begin.. in order, --insert-batch per request with ids --insert-first-id +
  /// row, closed loop or --insert-rate requests/s, until the rows, the time or the searches end.
  void run(Clock::time_point t0, Clock::time_point stop_at, const std::atomic<bool>& searches_done);
  /// Searches every acknowledged row (k 1): each must answer its own id. A row the search misses
  /// is searched again exhaustively (found then: a search miss); not found, it is unreachable if
  /// the index still holds its id (an insert of it is refused), else lost (and inserted again).
  void verify();
  uint64_t error_count() const;
  uint64_t missing() const { return verified_ ? acked_.size() - found_ : 0; }
  json report();

 private:
  const Options& o_;
  std::unique_ptr<pb::Search::Stub> stub_;
  FloatMatrix rows_;
  std::vector<uint64_t> acked_;  // rows the service acknowledged
  std::vector<double> latency_us_;
  std::map<std::string, ErrorInfo> errors_;
  void recheck(uint64_t row, int64_t id);
  static constexpr uint32_t kExhaustiveEf = 100000;  // compute/serve/requests.hpp kMaxEfSearch
  uint64_t requests_ = 0, found_ = 0, search_misses_ = 0, unreachable_ = 0, lost_ = 0;
  std::vector<int64_t> missing_ids_;  // the first few
  bool verified_ = false;
};

// ---- report.cpp: the measurement's report

/// Nearest-rank percentiles of `v` (sorted here).
json percentiles(std::vector<double>& v);

/// The measured run, as the report needs it.
struct Run {
  std::vector<Stats> per;    // per client, in client order
  Stats all;                 // every client's merged
  Clock::time_point t0{};    // the measurement's start
  double wall = 0;           // seconds from t0 to the last answer
  std::string stop;          // what ends the measurement: "one pass", "N requests" or "S s"
};

/// The JSON report (--json); sorts the run's latency samples for their percentiles.
json make_report(const Options& o, const Workload& wl, const std::vector<pb::InfoResponse>& infos,
                 const std::vector<Client>& clients, Run& run, const json& warm_json);
/// The report's table, the open loop's line (and warning when it fell behind), the errors.
void print_report(const Options& o, const json& report, const Stats& all);

}  // namespace dmhnsw::serve_bench
