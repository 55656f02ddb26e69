// serve-bench: a load generator for `computenode serve` (proto/dmhnsw.proto). It asks a
// workload's queries of one or more serving computenodes through unary Search calls and
// reports throughput, per-request latency percentiles, errors by status code and recall@k
// against the workload's ground truth (counted as the computenode's own `query` report does).
//
// Closed loop (default): each client thread has its own channel (its own HTTP/2 connection:
// a local subchannel pool) and a synchronous stub, and sends its next request when the previous
// one is answered.
//
// Open loop (--rate R): requests leave at R per second in total (Poisson arrivals, or evenly
// spaced with --arrival fixed), each client thread sending its share through the async API
// with a completion queue of its own. A request's latency is measured from the time it was
// meant to be sent, not from when it was sent, so a server (or a generator) that falls behind
// shows up in the percentiles instead of being hidden (coordinated omission). Whether the
// generator kept up with the schedule is reported (send lag, achieved send rate).
//
// Every call carries a deadline; at start every target must accept a connection within
// --connect-timeout and answer Info, else the run stops with an error naming it.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/fabric/bootstrap.hpp"
#include "common/json_file.hpp"
#include "common/units.hpp"
#include "common/workload.hpp"
#include "dmhnsw.grpc.pb.h"

using namespace dmhnsw;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace pb = dmhnsw::v1;

namespace {

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::chrono::system_clock::time_point system_deadline(double seconds_from_now) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds_from_now));
}

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN_CODE";
  }
}

struct Options {
  std::vector<std::string> targets;
  std::string workload, token_file, json_out, arrival = "poisson", token;
  uint32_t clients = 4, batch = 1, k = 10, ef = 0, probe = 0, max_in_flight = 128;
  double rate = 0, seconds = 0, connect_timeout = 5, deadline = 10;
  uint64_t requests = 0, warmup_requests = 0, seed = 1;
  bool seconds_given = false, requests_given = false, warmup_given = false;
};

/// Which workload rows the requests carry: request r holds the queries at stream positions
/// [r * batch, r * batch + batch), cut at query_limit; position p is row first_row + p % rows.
struct Plan {
  const Workload* wl = nullptr;
  uint64_t first_row = 0, rows = 0, batch = 1;
  uint64_t query_limit = kUnlimited;    // positions beyond are not asked
  uint64_t request_limit = kUnlimited;  // requests beyond are not sent
  uint32_t k = 10, ef = 0, probe = 0;

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
  void merge(const Stats& o) {
    sent += o.sent;
    ok += o.ok;
    queries += o.queries;
    recall_sum += o.recall_sum;
    recall1_sum += o.recall1_sum;
    latency_us.insert(latency_us.end(), o.latency_us.begin(), o.latency_us.end());
    service_us.insert(service_us.end(), o.service_us.begin(), o.service_us.end());
    lag_us.insert(lag_us.end(), o.lag_us.begin(), o.lag_us.end());
    for (const auto& [code, e] : o.errors) {
      ErrorInfo& mine = errors[code];
      if (mine.count == 0) mine.first_message = e.first_message;
      mine.count += e.count;
    }
    last_send = std::max(last_send, o.last_send);
    last_done = std::max(last_done, o.last_done);
    cap_hit = cap_hit || o.cap_hit;
    not_sent += o.not_sent;
    max_wake_late_us = std::max(max_wake_late_us, o.max_wake_late_us);
  }

  /// One finished call: its status, or its answer checked and scored against the ground truth.
  void finish(const Plan& plan, uint64_t r, const grpc::Status& s, const pb::SearchResponse& resp, double lat_us) {
    if (!s.ok()) {
      error(code_name(s.error_code()), s.error_message());
      return;
    }
    const uint64_t n = plan.size(r);
    const uint32_t k = plan.k;
    if (resp.n() != n || resp.ids_size() != static_cast<int>(n * k)) {
      error("BAD_ANSWER", "asked " + std::to_string(n) + " queries with k " + std::to_string(k) + ", got n " +
                              std::to_string(resp.n()) + " and " + std::to_string(resp.ids_size()) + " ids");
      return;
    }
    // recall@k as the computenode's query report counts it: each of the first k ids found
    // among the k first ground-truth ids counts once; recall@1: the first id is the nearest.
    for (uint64_t j = 0; j < n; ++j) {
      const int32_t* gt = plan.wl->groundtruth.row(plan.row(r * plan.batch + j));
      uint32_t hits = 0;
      for (uint32_t a = 0; a < k; ++a) {
        const int64_t id = resp.ids(static_cast<int>(j * k + a));
        if (id < 0) continue;
        for (uint32_t g = 0; g < k; ++g)
          if (id == gt[g]) {
            ++hits;
            break;
          }
      }
      recall_sum += static_cast<double>(hits) / k;
      if (resp.ids(static_cast<int>(j * k)) == gt[0]) recall1_sum += 1;
    }
    ++ok;
    queries += n;
    latency_us.push_back(lat_us);
  }
};

/// Nearest-rank percentiles of `v` (sorted here).
json percentiles(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) {
    if (v.empty()) return 0.0;
    const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  double sum = 0;
  for (double x : v) sum += x;
  return {{"p50", pct(0.50)}, {"p90", pct(0.90)}, {"p99", pct(0.99)}, {"p999", pct(0.999)},
          {"max", v.empty() ? 0.0 : v.back()}, {"min", v.empty() ? 0.0 : v.front()},
          {"mean", v.empty() ? 0.0 : sum / static_cast<double>(v.size())}, {"count", v.size()}};
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, not one shared by all channels
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

struct Client {
  size_t target = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Search::Stub> stub;
};

void prepare(grpc::ClientContext& ctx, const Options& o) {
  if (!o.token.empty()) ctx.AddMetadata("dmhnsw-token", o.token);
  ctx.set_deadline(system_deadline(o.deadline));
}

/// Waits until every channel is connected (all connect at once, one deadline for all); throws
/// naming the target of the first that is not, with the reason gRPC gives for it.
void connect_all(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const std::vector<std::string>& names,
                 const Options& o) {
  for (const auto& ch : channels) ch->GetState(true);  // start connecting
  const auto deadline = system_deadline(o.connect_timeout);
  for (size_t i = 0; i < channels.size(); ++i) {
    if (channels[i]->WaitForConnected(deadline)) continue;
    // Why: a call that does not wait for the connection fails with gRPC's own reason.
    auto stub = pb::Search::NewStub(channels[i]);
    grpc::ClientContext ctx;
    if (!o.token.empty()) ctx.AddMetadata("dmhnsw-token", o.token);
    ctx.set_deadline(system_deadline(1.0));
    pb::InfoResponse info;
    const grpc::Status s = stub->Info(&ctx, pb::InfoRequest{}, &info);
    std::string why = s.ok() ? "connected only after the deadline"
                             : std::string(code_name(s.error_code())) + ": " + s.error_message();
    char t[32];
    std::snprintf(t, sizeof t, "%g", o.connect_timeout);
    throw std::runtime_error("--target " + names[i] + ": no connection within " + t + " s (--connect-timeout): " + why);
  }
}

/// Closed loop: the next request when the previous one is answered (10 ms after an UNAVAILABLE).
void closed_loop(Client& cl, const Plan& plan, const Options& o, std::atomic<uint64_t>& next, Clock::time_point t0,
                 Clock::time_point stop_at, Stats& st) {
  std::this_thread::sleep_until(t0);
  pb::SearchRequest req;
  pb::SearchResponse resp;
  for (;;) {
    if (Clock::now() >= stop_at) break;
    const uint64_t r = next.fetch_add(1);
    if (r >= plan.request_limit) break;
    plan.fill(req, r);
    resp.Clear();
    grpc::ClientContext ctx;
    prepare(ctx, o);
    const auto s0 = Clock::now();
    const grpc::Status s = cl.stub->Search(&ctx, req, &resp);
    const auto s1 = Clock::now();
    ++st.sent;
    st.last_send = s0;
    st.last_done = s1;
    st.finish(plan, r, s, resp, us(s1 - s0));
    // A target gone (connection refused or closed) fails every call at once: not a busy loop.
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE)
      std::this_thread::sleep_until(std::min(stop_at, Clock::now() + std::chrono::milliseconds(10)));
  }
}

struct AsyncCall {
  grpc::ClientContext ctx;
  pb::SearchRequest req;
  pb::SearchResponse resp;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::SearchResponse>> rpc;
  uint64_t r = 0;
  Clock::time_point intended{}, sent{};
};

/// Open loop: this client's share of the arrivals (rate / clients per second), sent on
/// schedule whatever is still in flight (up to --max-in-flight), answers taken from the
/// client's own completion queue in between.
void open_loop(Client& cl, size_t index, const Plan& plan, const Options& o, std::atomic<uint64_t>& next_request,
               Clock::time_point t0, Clock::time_point stop_at, Stats& st) {
  const double client_rate = o.rate / o.clients;
  const bool poisson = o.arrival == "poisson";
  Rng rng(o.seed * 7919 + index);
  auto gap = [&]() -> Clock::duration {
    const double s = poisson ? -std::log1p(-rng.uniform01()) / client_rate : 1.0 / client_rate;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  // Fixed: client c sends at t0 + (c + 1 + i * clients) / rate, the clients interleaved.
  Clock::time_point next =
      poisson ? t0 + gap()
              : t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>((index + 1) / o.rate));
  grpc::CompletionQueue cq;
  uint64_t in_flight = 0;
  bool sending = true;

  auto complete = [&](void* tag) {
    std::unique_ptr<AsyncCall> call(static_cast<AsyncCall*>(tag));
    const auto done = Clock::now();
    --in_flight;
    st.last_done = std::max(st.last_done, done);
    const uint64_t ok_before = st.ok;
    st.finish(plan, call->r, call->status, call->resp, us(done - call->intended));
    if (st.ok > ok_before) st.service_us.push_back(us(done - call->sent));
  };

  for (;;) {
    // Everything due, as long as the in-flight cap allows (a short burst, then answers).
    for (int burst = 0; sending && burst < 16; ++burst) {
      const auto now = Clock::now();
      if (next >= stop_at || now >= stop_at) {  // --seconds: the end of the schedule, or of the time
        sending = false;
        for (; next < stop_at && next_request.fetch_add(1) < plan.request_limit; next += gap()) ++st.not_sent;
        break;
      }
      if (now < next) break;
      if (in_flight >= o.max_in_flight) {
        st.cap_hit = true;
        break;
      }
      const uint64_t r = next_request.fetch_add(1);
      if (r >= plan.request_limit) {
        sending = false;
        break;
      }
      auto call = std::make_unique<AsyncCall>();
      call->r = r;
      call->intended = next;
      plan.fill(call->req, r);
      prepare(call->ctx, o);
      call->sent = Clock::now();
      call->rpc = cl.stub->PrepareAsyncSearch(&call->ctx, call->req, &cq);
      call->rpc->StartCall();
      AsyncCall* raw = call.release();
      raw->rpc->Finish(&raw->resp, &raw->status, raw);
      ++in_flight;
      ++st.sent;
      st.last_send = raw->sent;
      st.lag_us.push_back(us(raw->sent - raw->intended));
      next += gap();
    }
    if (!sending && in_flight == 0) break;
    // Answers until the next send is due (or a while, when nothing is to be sent now).
    const auto now = Clock::now();
    Clock::duration wait = std::chrono::milliseconds(50);
    if (sending && in_flight < o.max_in_flight) wait = std::min(wait, next - now);
    wait = std::max(wait, Clock::duration::zero());
    auto deadline =
        std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(wait);
    const auto wake = now + wait;
    for (;;) {
      void* tag = nullptr;
      bool ok = false;
      const auto ns = cq.AsyncNext(&tag, &ok, deadline);
      if (ns != grpc::CompletionQueue::GOT_EVENT) {
        // How late the thread came back: the generator's own stalls (scheduling, gRPC's poller).
        st.max_wake_late_us = std::max(st.max_wake_late_us, us(Clock::now() - wake));
        break;
      }
      complete(tag);
      if (sending && Clock::now() >= next) break;  // a send is due
      deadline = std::chrono::system_clock::now();  // then only what is already there
    }
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) delete static_cast<AsyncCall*>(tag);
}

/// Runs `fn(client, index, stats)` on one thread per client; the stats of each client.
template <typename Fn>
std::vector<Stats> on_clients(std::vector<Client>& clients, Fn fn) {
  std::vector<Stats> stats(clients.size());
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(clients.size());
  for (size_t c = 0; c < clients.size(); ++c)
    threads.emplace_back([&, c] {
      try {
        fn(clients[c], c, stats[c]);
      } catch (...) {
        errors[c] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return stats;
}

std::string fmt_us(double v) {
  char b[32];
  if (v >= 1e6)
    std::snprintf(b, sizeof b, "%.2f s", v / 1e6);
  else if (v >= 1e4)
    std::snprintf(b, sizeof b, "%.1f ms", v / 1e3);
  else
    std::snprintf(b, sizeof b, "%.0f us", v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"serve-bench: load generator for `computenode serve`: unary Search calls from --clients threads (each "
               "with its own connection) spread round-robin over the targets, closed loop or at a fixed --rate (open "
               "loop); reports requests, queries, errors by status code, QPS, per-request latency p50/p99/p99.9/max "
               "and recall@k against the workload's ground truth"};
  app.footer(
      "Queries: the workload's measured queries in order, --batch per request (cycled when --requests or --seconds "
      "asks for more than one pass); the warm-up requests take its warm-up queries. A closed-loop client waits 10 ms "
      "after an UNAVAILABLE answer (a target gone). Token: --token-file or "
      "DMHNSW_TOKEN, sent as call metadata dmhnsw-token. Exit status: 0 when every measured request was answered, "
      "2 when some failed (the report is written all the same), 1 when the run could not be made (a bad flag, a "
      "target not reachable, ...).");
  Options o;
  std::string targets;
  app.add_option("--target", targets, "HOST:PORT of the serving computenode(s), comma-separated")->required();
  app.add_option("--workload", o.workload, "workload file (tools/workload): queries and their ground truth")
      ->required();
  app.add_option("--clients", o.clients, "client threads, each with its own channel (connection)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--batch", o.batch, "queries per request")->capture_default_str()->check(CLI::Range(1u, 1u << 20));
  app.add_option("--k", o.k, "neighbours asked per query (recall@k; at most the workload's ground-truth k)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  app.add_option("--ef", o.ef, "efSearch of every request (0: the server's --ef-search)")->capture_default_str();
  app.add_option("--probe", o.probe, "dhnsw: partitions searched per query (0: the server's --probe)")
      ->capture_default_str();
  app.add_option("--rate", o.rate,
                 "open loop: requests per second sent in total over all clients, whether or not earlier ones were "
                 "answered; latency counts from each request's intended send time (0: closed loop)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--arrival", o.arrival, "open loop: poisson (exponential gaps) or fixed (even gaps)")
      ->capture_default_str()
      ->check(CLI::IsMember({"poisson", "fixed"}));
  app.add_option("--max-in-flight", o.max_in_flight,
                 "open loop: most requests outstanding per client; beyond it sends wait and the run is reported as "
                 "not keeping up")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  auto* seconds_opt = app.add_option("--seconds", o.seconds, "measure this long (default: one pass over the "
                                                             "workload's measured queries)")
                          ->check(CLI::Range(1e-3, 1e7));
  auto* requests_opt = app.add_option("--requests", o.requests, "measure this many requests (default: one pass)")
                           ->check(CLI::Range(uint64_t{1}, kUnlimited));
  seconds_opt->excludes(requests_opt);
  auto* warmup_opt = app.add_option("--warmup-requests", o.warmup_requests,
                                    "closed-loop requests before the measurement, not counted (default: one pass "
                                    "over the workload's warm-up queries)");
  app.add_option("--token-file", o.token_file, "file holding the cluster token (else DMHNSW_TOKEN)");
  app.add_option("--connect-timeout", o.connect_timeout, "seconds each target has to accept a connection at start")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--deadline", o.deadline, "seconds each call may take before it fails with DEADLINE_EXCEEDED")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--seed", o.seed, "seed of the Poisson arrivals")->capture_default_str();
  app.add_option("--json", o.json_out, "write the report to this JSON file");
  CLI11_PARSE(app, argc, argv);
  o.seconds_given = seconds_opt->count() > 0;
  o.requests_given = requests_opt->count() > 0;
  o.warmup_given = warmup_opt->count() > 0;
  spdlog::set_pattern("[%H:%M:%S.%e] [serve-bench] [%l] %v");

  try {
    o.targets = split_commas(targets);
    if (o.targets.empty()) throw std::invalid_argument("--target: no HOST:PORT given");
    for (const auto& t : o.targets) {
      auto [host, port] = fabric::parse_host_port(t, "--target");
      if (port == 0) throw std::invalid_argument("--target: port 0 in '" + t + "' (the server prints its port)");
    }
    o.token = fabric::load_token(o.token_file);
    const Workload wl = [&] {
      try {
        return read_workload(o.workload);
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string("--workload: ") + e.what());
      }
    }();
    if (o.k > wl.k())
      throw std::invalid_argument("--k " + std::to_string(o.k) + ": the workload's ground truth has only " +
                                  std::to_string(wl.k()) + " ids per query");

    // ---- the targets: reachable, answering Info, serving vectors of the workload's dimension
    std::vector<std::shared_ptr<grpc::Channel>> probe_channels;
    for (const auto& t : o.targets) probe_channels.push_back(make_channel(t));
    connect_all(probe_channels, o.targets, o);
    std::vector<pb::InfoResponse> infos(o.targets.size());
    for (size_t i = 0; i < o.targets.size(); ++i) {
      auto stub = pb::Search::NewStub(probe_channels[i]);
      grpc::ClientContext ctx;
      prepare(ctx, o);
      const grpc::Status s = stub->Info(&ctx, pb::InfoRequest{}, &infos[i]);
      if (!s.ok())
        throw std::runtime_error("--target " + o.targets[i] + ": Info failed: " + code_name(s.error_code()) + ": " +
                                 s.error_message() +
                                 (s.error_code() == grpc::StatusCode::UNAUTHENTICATED
                                      ? " (the cluster's token: DMHNSW_TOKEN or --token-file)"
                                      : ""));
      const auto& in = infos[i];
      if (in.dim() != wl.dim())
        throw std::invalid_argument("--workload " + o.workload + " has dimension " + std::to_string(wl.dim()) +
                                    ", --target " + o.targets[i] + " serves dimension " + std::to_string(in.dim()));
      if (in.max_k() != 0 && o.k > in.max_k())
        throw std::invalid_argument("--k " + std::to_string(o.k) + ": --target " + o.targets[i] +
                                    " answers at most k " + std::to_string(in.max_k()) + " (its --max-k)");
      if (in.max_batch() != 0 && o.batch > in.max_batch())
        throw std::invalid_argument("--batch " + std::to_string(o.batch) + ": --target " + o.targets[i] +
                                    " takes at most " + std::to_string(in.max_batch()) +
                                    " queries per request (its --max-batch)");
    }

    // ---- the clients: one channel (connection) each, round-robin over the targets
    std::vector<Client> clients(o.clients);
    std::vector<std::shared_ptr<grpc::Channel>> client_channels;
    std::vector<std::string> client_names;
    for (size_t c = 0; c < clients.size(); ++c) {
      clients[c].target = c % o.targets.size();
      clients[c].channel = make_channel(o.targets[clients[c].target]);
      clients[c].stub = pb::Search::NewStub(clients[c].channel);
      client_channels.push_back(clients[c].channel);
      client_names.push_back(o.targets[clients[c].target]);
    }
    connect_all(client_channels, client_names, o);

    const bool open = o.rate > 0;
    std::string targets_text;
    for (size_t i = 0; i < o.targets.size(); ++i) targets_text += (i ? ", " : "") + o.targets[i];
    std::printf("serve-bench: %s (dim %u, %llu vectors, %s) on %zu target%s: %s\n", infos[0].mode().c_str(),
                infos[0].dim(), static_cast<unsigned long long>(infos[0].count()), infos[0].metric().c_str(),
                o.targets.size(), o.targets.size() == 1 ? "" : "s", targets_text.c_str());
    char loop_text[96];
    std::snprintf(loop_text, sizeof loop_text, "open loop at %g requests/s (%s arrivals)", o.rate, o.arrival.c_str());
    std::printf("%u client%s, %s, batch %u, k %u, ef %s, probe %s\n", o.clients, o.clients == 1 ? "" : "s",
                open ? loop_text : "closed loop",
                o.batch, o.k, o.ef ? std::to_string(o.ef).c_str() : "the server's",
                o.probe ? std::to_string(o.probe).c_str() : "the server's");

    // ---- warm-up: closed loop over the warm-up queries (the measured ones if there are none)
    Plan warm{&wl, 0, wl.warmup_count, o.batch, kUnlimited, kUnlimited, o.k, o.ef, o.probe};
    if (wl.warmup_count == 0) {
      warm.first_row = wl.warmup_count;
      warm.rows = wl.measured_count;
    }
    uint64_t warm_requests = o.warmup_requests;
    if (!o.warmup_given) {
      warm_requests = (wl.warmup_count + o.batch - 1) / o.batch;
      warm.query_limit = wl.warmup_count;
    }
    warm.request_limit = warm_requests;
    json warm_json = {{"requests", 0}, {"errors", 0}, {"seconds", 0.0}};
    if (warm_requests > 0) {
      std::atomic<uint64_t> next{0};
      const auto w0 = Clock::now();
      auto per = on_clients(clients, [&](Client& cl, size_t, Stats& st) {
        closed_loop(cl, warm, o, next, w0, Clock::time_point::max(), st);
      });
      Stats w;
      for (const auto& s : per) w.merge(s);
      const double ws = secs(Clock::now() - w0);
      warm_json = {{"requests", w.sent}, {"errors", w.error_count()}, {"seconds", ws}};
      std::printf("warm-up: %llu requests in %.2f s\n", static_cast<unsigned long long>(w.sent), ws);
      for (const auto& [code, e] : w.errors)
        spdlog::warn("warm-up: {} x {}, first: {}", e.count, code, e.first_message);
    }

    // ---- measurement
    Plan plan{&wl, wl.warmup_count, wl.measured_count, o.batch, kUnlimited, kUnlimited, o.k, o.ef, o.probe};
    std::string stop = "one pass";
    if (o.requests_given) {
      plan.request_limit = o.requests;
      stop = std::to_string(o.requests) + " requests";
    } else if (o.seconds_given) {
      char b[48];
      std::snprintf(b, sizeof b, "%g s", o.seconds);
      stop = b;
    } else {
      plan.query_limit = wl.measured_count;
      plan.request_limit = (wl.measured_count + o.batch - 1) / o.batch;
    }
    std::atomic<uint64_t> next{0};
    const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(20);  // every thread started by then
    const Clock::time_point stop_at =
        o.seconds_given ? t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds))
                        : Clock::time_point::max();
    auto per = on_clients(clients, [&](Client& cl, size_t c, Stats& st) {
      if (open)
        open_loop(cl, c, plan, o, next, t0, stop_at, st);
      else
        closed_loop(cl, plan, o, next, t0, stop_at, st);
    });
    const auto end = Clock::now();
    Stats all;
    for (const auto& s : per) all.merge(s);
    const double wall = secs((all.last_done > t0 ? all.last_done : end) - t0);
    const uint64_t errors = all.error_count();

    // ---- report
    json report;
    report["tool"] = "serve-bench";
    report["mode"] = infos[0].mode();
    report["workload"] = o.workload;
    report["distribution"] = wl.distribution;
    report["k"] = o.k;
    report["settings"] = {{"clients", o.clients}, {"batch", o.batch}, {"k", o.k}, {"ef_search", o.ef},
                          {"probe", o.probe}, {"loop", open ? "open" : "closed"}, {"rate", o.rate},
                          {"arrival", o.arrival}, {"max_in_flight", o.max_in_flight}, {"deadline_s", o.deadline},
                          {"stop", stop}};
    json tj = json::array();
    for (size_t i = 0; i < o.targets.size(); ++i) {
      uint64_t reqs = 0, errs = 0, nclients = 0;
      for (size_t c = 0; c < clients.size(); ++c)
        if (clients[c].target == i) {
          ++nclients;
          reqs += per[c].sent;
          errs += per[c].error_count();
        }
      const auto& in = infos[i];
      tj.push_back({{"address", o.targets[i]}, {"mode", in.mode()}, {"dim", in.dim()}, {"count", in.count()},
                    {"metric", in.metric()}, {"provider", in.provider()}, {"memnodes", in.memnodes()},
                    {"computenode", in.computenode()}, {"epoch", in.epoch()}, {"clients", nclients},
                    {"requests", reqs}, {"errors", errs}});
    }
    report["targets"] = tj;
    report["warmup"] = warm_json;
    report["requests"] = all.sent;
    report["requests_ok"] = all.ok;
    report["queries"] = all.queries;
    report["errors"] = errors;
    json by_code = json::object();
    for (const auto& [code, e] : all.errors) by_code[code] = {{"count", e.count}, {"first_message", e.first_message}};
    report["errors_by_code"] = by_code;
    report["seconds"] = wall;
    const double qps = wall > 0 ? static_cast<double>(all.queries) / wall : 0.0;
    const double rps = wall > 0 ? static_cast<double>(all.ok) / wall : 0.0;
    report["qps"] = qps;
    report["requests_per_s"] = rps;
    report["latency_us"] = percentiles(all.latency_us);
    report["recall"] = all.queries ? all.recall_sum / static_cast<double>(all.queries) : 0.0;
    report["recall_at_1"] = all.queries ? all.recall1_sum / static_cast<double>(all.queries) : 0.0;
    json open_json = nullptr;
    bool kept_up = true;
    if (open) {
      const double span = all.last_send > t0 ? secs(all.last_send - t0) : 0.0;
      const double send_rate = span > 0 ? static_cast<double>(all.sent) / span : 0.0;
      json lag = percentiles(all.lag_us);
      const double max_lag_us = lag["max"].get<double>();
      // Behind: the in-flight cap stopped sends, requests due before the end of --seconds were
      // not sent by then, or some request left later than 10 ms (or 5 % of the schedule's span,
      // when longer) after its intended time.
      kept_up = !all.cap_hit && all.not_sent == 0 && max_lag_us <= std::max(10e3, 0.05 * span * 1e6);
      open_json = {{"rate", o.rate}, {"send_rate", send_rate}, {"kept_up", kept_up},
                   {"in_flight_cap_hit", all.cap_hit}, {"not_sent", all.not_sent}, {"send_lag_us", lag},
                   {"max_wake_late_us", all.max_wake_late_us},
                   {"service_latency_us", percentiles(all.service_us)}};
    }
    report["open_loop"] = open_json;

    const json& L = report["latency_us"];
    char recall_head[24];
    std::snprintf(recall_head, sizeof recall_head, "recall@%u", o.k);
    std::printf("\n%10s %10s %8s %11s %11s %10s %10s %10s %10s %10s\n", "requests", "queries", "errors", "requests/s",
                "queries/s", "p50 us", "p99 us", "p99.9 us", "max us", recall_head);
    std::printf("%10llu %10llu %8llu %11.1f %11.1f %10.0f %10.0f %10.0f %10.0f %10.4f\n",
                static_cast<unsigned long long>(all.sent), static_cast<unsigned long long>(all.queries),
                static_cast<unsigned long long>(errors), rps, qps, L["p50"].get<double>(), L["p99"].get<double>(),
                L["p999"].get<double>(), L["max"].get<double>(), report["recall"].get<double>());
    if (open) {
      const json& lag = open_json["send_lag_us"];
      const std::string unsent =
          all.not_sent ? ", " + std::to_string(all.not_sent) + " due before the end not sent" : std::string();
      std::printf("open loop: %g requests/s asked, sent at %.1f/s, send lag p50 %s p99 %s max %s%s%s; latency from "
                  "the actual send p50 %.0f us p99 %.0f us\n",
                  o.rate, open_json["send_rate"].get<double>(), fmt_us(lag["p50"].get<double>()).c_str(),
                  fmt_us(lag["p99"].get<double>()).c_str(), fmt_us(lag["max"].get<double>()).c_str(),
                  all.cap_hit ? ", in-flight cap reached" : "", unsent.c_str(),
                  open_json["service_latency_us"]["p50"].get<double>(),
                  open_json["service_latency_us"]["p99"].get<double>());
      if (!kept_up)
        spdlog::warn("open loop could not keep up with --rate {}: sends ran up to {} late{}{}, its threads woke up "
                     "to {} late (the server is saturated, or the generator or its host: more --clients, a lower "
                     "--rate or a higher --max-in-flight)",
                     o.rate, fmt_us(lag["max"].get<double>()), all.cap_hit ? ", hit --max-in-flight" : "", unsent,
                     fmt_us(all.max_wake_late_us));
    }
    for (const auto& [code, e] : all.errors)
      std::printf("errors: %llu x %s, first: %s\n", static_cast<unsigned long long>(e.count), code.c_str(),
                  e.first_message.c_str());
    if (!o.json_out.empty()) {
      write_json_file(o.json_out, report, "--json");
      std::printf("wrote %s\n", o.json_out.c_str());
    }
    return errors > 0 ? 2 : 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
