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
//
// With --insert-data, one more client inserts rows beside the searches and afterwards searches
// each acknowledged row by itself (inserts.cpp): a mixed load, and a check that no
// acknowledged insert went missing.
//
// The sources: main.cpp (the command line and the run), loops.cpp (the clients' request loops),
// inserts.cpp (the inserter), report.cpp (scoring, percentiles, the report), serve_bench.hpp
// (what they share).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/version.hpp"
#include "common/fabric/bootstrap.hpp"
#include "common/json_file.hpp"
#include "common/units.hpp"
#include "tools/serve_bench/serve_bench.hpp"

namespace dmhnsw::serve_bench {
namespace {

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

/// The flags whose presence, not only their value, matters.
struct GivenFlags {
  CLI::Option *seconds = nullptr, *requests = nullptr, *warmup = nullptr;
};

/// Declares every flag into `o` (the --target list into `targets`, split after parsing).
GivenFlags add_flags(CLI::App& app, Options& o, std::string& targets) {
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
  app.add_option("--rerank", o.rerank,
                 "an index with codes: search over them and re-rank the best R per query with their vectors (0: the "
                 "server's --rerank; shine takes any R, dhnsw only its own)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1024u));
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
  auto* ins = app.add_option("--insert-data", o.insert_data,
                             "also insert these vectors while the searches are measured (one more client with its "
                             "own connection), then search each acknowledged one by itself: it must answer its id");
  app.add_option("--insert-begin", o.insert_begin, "first row of --insert-data to insert")
      ->capture_default_str()
      ->needs(ins);
  app.add_option("--insert-first-id", o.insert_first_id,
                 "row r of --insert-data is inserted with id --insert-first-id + r (ids new to the index)")
      ->capture_default_str()
      ->needs(ins);
  app.add_option("--insert-batch", o.insert_batch, "vectors per Insert request")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16))
      ->needs(ins);
  app.add_option("--insert-rate", o.insert_rate, "Insert requests per second (0: each after the previous answer)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6))
      ->needs(ins);
  app.add_option("--insert-verify-ef", o.insert_verify_ef, "efSearch of the searches that check the inserts")
      ->capture_default_str()
      ->needs(ins);
  app.add_option("--insert-verify-probe", o.insert_verify_probe,
                 "dhnsw: partitions searched by the searches that check the inserts (0: the server's --probe)")
      ->capture_default_str()
      ->needs(ins);
  return {seconds_opt, requests_opt, warmup_opt};
}

Workload load_workload(const Options& o) {
  try {
    return read_workload(o.workload);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--workload: ") + e.what());
  }
}

/// The --target list checked (HOST:PORT, no port 0) and the token read; throws naming the flag.
void resolve_targets(Options& o, const std::string& targets) {
  o.targets = split_commas(targets);
  if (o.targets.empty()) throw std::invalid_argument("--target: no HOST:PORT given");
  for (const auto& t : o.targets) {
    auto [host, port] = fabric::parse_host_port(t, "--target");
    if (port == 0) throw std::invalid_argument("--target: port 0 in '" + t + "' (the server prints its port)");
  }
  o.token = fabric::load_token(o.token_file);
}

/// The targets: reachable, answering Info, serving vectors of the workload's dimension and
/// taking its k and batch; what each said of itself.
std::vector<pb::InfoResponse> probe_targets(const Options& o, const Workload& wl) {
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
  return infos;
}

/// The clients: one channel (connection) each, round-robin over the targets, all connected.
std::vector<Client> make_clients(const Options& o) {
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
  return clients;
}

void print_header(const Options& o, const std::vector<pb::InfoResponse>& infos) {
  const bool open = o.rate > 0;
  std::string targets_text;
  for (size_t i = 0; i < o.targets.size(); ++i) targets_text += (i ? ", " : "") + o.targets[i];
  std::printf("serve-bench: %s (dim %u, %llu vectors, %s) on %zu target%s: %s\n", infos[0].mode().c_str(),
              infos[0].dim(), static_cast<unsigned long long>(infos[0].count()), infos[0].metric().c_str(),
              o.targets.size(), o.targets.size() == 1 ? "" : "s", targets_text.c_str());
  char loop_text[96];
  std::snprintf(loop_text, sizeof loop_text, "open loop at %g requests/s (%s arrivals)", o.rate, o.arrival.c_str());
  std::printf("%u client%s, %s, batch %u, k %u, ef %s, probe %s, rerank %s\n", o.clients, o.clients == 1 ? "" : "s",
              open ? loop_text : "closed loop",
              o.batch, o.k, o.ef ? std::to_string(o.ef).c_str() : "the server's",
              o.probe ? std::to_string(o.probe).c_str() : "the server's",
              o.rerank ? std::to_string(o.rerank).c_str() : "the server's");
}

/// Warm-up: closed loop over the warm-up queries (the measured ones if there are none); its
/// part of the report.
json warm_up(std::vector<Client>& clients, const Workload& wl, const Options& o) {
  Plan warm{&wl, 0, wl.warmup_count, o.batch, kUnlimited, kUnlimited, o.k, o.ef, o.probe, o.rerank};
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
    const double ws = seconds(Clock::now() - w0);
    warm_json = {{"requests", w.sent}, {"errors", w.error_count()}, {"seconds", ws}};
    std::printf("warm-up: %llu requests in %.2f s\n", static_cast<unsigned long long>(w.sent), ws);
    for (const auto& [code, e] : w.errors)
      spdlog::warn("warm-up: {} x {}, first: {}", e.count, code, e.first_message);
  }
  return warm_json;
}

/// The measurement: one pass over the measured queries, --requests or --seconds of them, with
/// the inserter beside them when there is one.
Run measure(std::vector<Client>& clients, const Workload& wl, const Options& o, Inserter* inserter) {
  Run run;
  Plan plan{&wl, wl.warmup_count, wl.measured_count, o.batch, kUnlimited, kUnlimited, o.k, o.ef, o.probe, o.rerank};
  run.stop = "one pass";
  if (o.requests_given) {
    plan.request_limit = o.requests;
    run.stop = std::to_string(o.requests) + " requests";
  } else if (o.seconds_given) {
    char b[48];
    std::snprintf(b, sizeof b, "%g s", o.seconds);
    run.stop = b;
  } else {
    plan.query_limit = wl.measured_count;
    plan.request_limit = (wl.measured_count + o.batch - 1) / o.batch;
  }
  const bool open = o.rate > 0;
  std::atomic<uint64_t> next{0};
  const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(20);  // every thread started by then
  const Clock::time_point stop_at =
      o.seconds_given ? t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds))
                      : Clock::time_point::max();
  std::atomic<bool> searches_done{false};
  std::exception_ptr insert_error;
  std::thread inserting;
  if (inserter)
    inserting = std::thread([&] {
      try {
        inserter->run(t0, stop_at, searches_done);
      } catch (...) {
        insert_error = std::current_exception();
      }
    });
  try {
    run.per = on_clients(clients, [&](Client& cl, size_t c, Stats& st) {
      if (open)
        open_loop(cl, c, plan, o, next, t0, stop_at, st);
      else
        closed_loop(cl, plan, o, next, t0, stop_at, st);
    });
  } catch (...) {
    searches_done.store(true);
    if (inserting.joinable()) inserting.join();
    throw;
  }
  const auto end = Clock::now();
  searches_done.store(true);
  if (inserting.joinable()) inserting.join();
  if (insert_error) std::rethrow_exception(insert_error);
  for (const auto& s : run.per) run.all.merge(s);
  run.t0 = t0;
  run.wall = seconds((run.all.last_done > t0 ? run.all.last_done : end) - t0);
  return run;
}

}  // namespace
}  // namespace dmhnsw::serve_bench

int main(int argc, char** argv) {
  using namespace dmhnsw;
  using namespace dmhnsw::serve_bench;

  CLI::App app{"serve-bench: load generator for `computenode serve`: unary Search calls from --clients threads (each "
               "with its own connection) spread round-robin over the targets, closed loop or at a fixed --rate (open "
               "loop); reports requests, queries, errors by status code, QPS, per-request latency p50/p99/p99.9/max "
               "and recall@k against the workload's ground truth"};
  app.set_version_flag("--version", dmhnsw::version_line("serve-bench"));
  app.footer(
      "Queries: the workload's measured queries in order, --batch per request (cycled when --requests or --seconds "
      "asks for more than one pass); the warm-up requests take its warm-up queries. A closed-loop client waits 10 ms "
      "after an UNAVAILABLE answer (a target gone). Token: --token-file or "
      "DMHNSW_TOKEN, sent as call metadata dmhnsw-token. Exit status: 0 when every measured request was answered "
      "(and, with --insert-data, every insert acknowledged and found by itself afterwards), 2 when some failed (the report is written all the same), 1 when the run could not be made (a bad flag, a "
      "target not reachable, ...).");
  Options o;
  std::string targets;
  const GivenFlags given = add_flags(app, o, targets);
  CLI11_PARSE(app, argc, argv);
  o.seconds_given = given.seconds->count() > 0;
  o.requests_given = given.requests->count() > 0;
  o.warmup_given = given.warmup->count() > 0;
  spdlog::set_pattern("[%H:%M:%S.%e] [serve-bench] [%l] %v");

  try {
    resolve_targets(o, targets);
    const Workload wl = load_workload(o);
    if (o.k > wl.k())
      throw std::invalid_argument("--k " + std::to_string(o.k) + ": the workload's ground truth has only " +
                                  std::to_string(wl.k()) + " ids per query");
    const std::vector<pb::InfoResponse> infos = probe_targets(o, wl);
    std::vector<Client> clients = make_clients(o);
    print_header(o, infos);
    const json warm_json = warm_up(clients, wl, o);
    std::optional<Inserter> inserter;
    if (!o.insert_data.empty()) inserter.emplace(o, make_channel(o.targets[0]));
    Run run = measure(clients, wl, o, inserter ? &*inserter : nullptr);
    json report = make_report(o, wl, infos, clients, run, warm_json);
    print_report(o, report, run.all);
    uint64_t insert_failures = 0;
    if (inserter) {
      inserter->verify();
      report["inserts"] = inserter->report();
      insert_failures = inserter->error_count() + inserter->missing();
      const json& r = report["inserts"];
      const json& v = r["verify"];
      std::printf("inserts: %llu requests, %llu rows acknowledged, %llu failed; searched by themselves: %llu found "
                  "(%llu only by an exhaustive search), %llu missing (%llu unreachable, %llu lost)\n",
                  static_cast<unsigned long long>(r["requests"].get<uint64_t>()),
                  static_cast<unsigned long long>(r["rows_acknowledged"].get<uint64_t>()),
                  static_cast<unsigned long long>(r["errors"].get<uint64_t>()),
                  static_cast<unsigned long long>(v["found"].get<uint64_t>()),
                  static_cast<unsigned long long>(v["search_misses"].get<uint64_t>()),
                  static_cast<unsigned long long>(v["missing"].get<uint64_t>()),
                  static_cast<unsigned long long>(v["unreachable"].get<uint64_t>()),
                  static_cast<unsigned long long>(v["lost"].get<uint64_t>()));
      for (const auto& [code, e] : r["errors_by_code"].items())
        spdlog::warn("inserts: {} x {}, first: {}", e["count"].get<uint64_t>(), code,
                     e["first_message"].get<std::string>());
    }
    if (!o.json_out.empty()) {
      write_json_file(o.json_out, report, "--json");
      std::printf("wrote %s\n", o.json_out.c_str());
    }
    return run.all.error_count() > 0 || insert_failures > 0 ? 2 : 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
