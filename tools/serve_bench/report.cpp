// serve-bench's report: status-code names, scoring an answer against the ground truth, merging
// the clients' stats, latency percentiles, the JSON report (--json) and its printed form.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>

#include "tools/serve_bench/serve_bench.hpp"

namespace dmhnsw::serve_bench {

namespace {

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

/// Per target: what it said of itself (Info), its clients, their requests and errors.
json targets_json(const Options& o, const std::vector<pb::InfoResponse>& infos, const std::vector<Client>& clients,
                  const std::vector<Stats>& per) {
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
  return tj;
}

/// Open loop: whether the generator kept to its schedule (send rate, send lag, in-flight cap)
/// and the latency from the actual send.
json open_loop_json(const Options& o, Stats& all, Clock::time_point t0) {
  const double span = all.last_send > t0 ? seconds(all.last_send - t0) : 0.0;
  const double send_rate = span > 0 ? static_cast<double>(all.sent) / span : 0.0;
  json lag = percentiles(all.lag_us);
  const double max_lag_us = lag["max"].get<double>();
  // Behind: the in-flight cap stopped sends, requests due before the end of --seconds were
  // not sent by then, or some request left later than 10 ms (or 5 % of the schedule's span,
  // when longer) after its intended time.
  const bool kept_up = !all.cap_hit && all.not_sent == 0 && max_lag_us <= std::max(10e3, 0.05 * span * 1e6);
  return {{"rate", o.rate}, {"send_rate", send_rate}, {"kept_up", kept_up},
          {"in_flight_cap_hit", all.cap_hit}, {"not_sent", all.not_sent}, {"send_lag_us", lag},
          {"max_wake_late_us", all.max_wake_late_us},
          {"service_latency_us", percentiles(all.service_us)}};
}

/// The open loop's line, and a warning when it could not keep up with --rate.
void print_open_loop(const Options& o, const json& open_json, const Stats& all) {
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
  if (!open_json["kept_up"].get<bool>())
    spdlog::warn("open loop could not keep up with --rate {}: sends ran up to {} late{}{}, its threads woke up "
                 "to {} late (the server is saturated, or the generator or its host: more --clients, a lower "
                 "--rate or a higher --max-in-flight)",
                 o.rate, fmt_us(lag["max"].get<double>()), all.cap_hit ? ", hit --max-in-flight" : "", unsent,
                 fmt_us(all.max_wake_late_us));
}

}  // namespace

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

void Stats::merge(const Stats& o) {
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

void Stats::finish(const Plan& plan, uint64_t r, const grpc::Status& s, const pb::SearchResponse& resp, double lat_us) {
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

json make_report(const Options& o, const Workload& wl, const std::vector<pb::InfoResponse>& infos,
                 const std::vector<Client>& clients, Run& run, const json& warm_json) {
  Stats& all = run.all;
  const bool open = o.rate > 0;
  json report;
  report["tool"] = "serve-bench";
  report["mode"] = infos[0].mode();
  report["workload"] = o.workload;
  report["distribution"] = wl.distribution;
  report["k"] = o.k;
  report["settings"] = {{"clients", o.clients}, {"batch", o.batch}, {"k", o.k}, {"ef_search", o.ef},
                        {"probe", o.probe}, {"rerank", o.rerank}, {"loop", open ? "open" : "closed"}, {"rate", o.rate},
                        {"arrival", o.arrival}, {"max_in_flight", o.max_in_flight}, {"deadline_s", o.deadline},
                        {"stop", run.stop}};
  report["targets"] = targets_json(o, infos, clients, run.per);
  report["warmup"] = warm_json;
  report["requests"] = all.sent;
  report["requests_ok"] = all.ok;
  report["queries"] = all.queries;
  report["errors"] = all.error_count();
  json by_code = json::object();
  for (const auto& [code, e] : all.errors) by_code[code] = {{"count", e.count}, {"first_message", e.first_message}};
  report["errors_by_code"] = by_code;
  report["seconds"] = run.wall;
  report["qps"] = run.wall > 0 ? static_cast<double>(all.queries) / run.wall : 0.0;
  report["requests_per_s"] = run.wall > 0 ? static_cast<double>(all.ok) / run.wall : 0.0;
  report["latency_us"] = percentiles(all.latency_us);
  report["recall"] = all.queries ? all.recall_sum / static_cast<double>(all.queries) : 0.0;
  report["recall_at_1"] = all.queries ? all.recall1_sum / static_cast<double>(all.queries) : 0.0;
  report["open_loop"] = open ? open_loop_json(o, all, run.t0) : json(nullptr);
  return report;
}

void print_report(const Options& o, const json& report, const Stats& all) {
  const json& L = report["latency_us"];
  char recall_head[24];
  std::snprintf(recall_head, sizeof recall_head, "recall@%u", o.k);
  std::printf("\n%10s %10s %8s %11s %11s %10s %10s %10s %10s %10s\n", "requests", "queries", "errors", "requests/s",
              "queries/s", "p50 us", "p99 us", "p99.9 us", "max us", recall_head);
  std::printf("%10llu %10llu %8llu %11.1f %11.1f %10.0f %10.0f %10.0f %10.0f %10.4f\n",
              static_cast<unsigned long long>(all.sent), static_cast<unsigned long long>(all.queries),
              static_cast<unsigned long long>(all.error_count()), report["requests_per_s"].get<double>(),
              report["qps"].get<double>(), L["p50"].get<double>(), L["p99"].get<double>(), L["p999"].get<double>(),
              L["max"].get<double>(), report["recall"].get<double>());
  if (o.rate > 0) print_open_loop(o, report["open_loop"], all);
  for (const auto& [code, e] : all.errors)
    std::printf("errors: %llu x %s, first: %s\n", static_cast<unsigned long long>(e.count), code.c_str(),
                e.first_message.c_str());
}

}  // namespace dmhnsw::serve_bench
