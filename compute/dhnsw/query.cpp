#include "compute/dhnsw/query.hpp"

#include "compute/dhnsw/control.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "common/distance.hpp"
#include "common/workload.hpp"
#include "compute/board.hpp"
#include "common/timing.hpp"

namespace dmhnsw::dhnsw {
namespace {

using json = nlohmann::json;

const char* metric_text(uint8_t m) { return m == 1 ? "ip" : "l2"; }


json report_header(const RunContext& rc, const QueryOptions& o, const Workload& wl, const Index& index,
                   const EngineOptions& eo, const Engine& engine) {
  const MetaHeader& h = index.header;
  const std::string kernel = DistanceComputer(parse_metric(metric_text(h.metric)), h.dim).kernel_name();
  return {{"mode", "dhnsw"}, {"kind", "query"}, {"provider", rc.provider}, {"workload", o.workload},
          {"distribution", wl.distribution}, {"k", o.engine.k}, {"num_cns", rc.num_cns},
          {"memnodes", rc.cluster->memnodes().size()},
          {"index", {{"partitions", h.num_subs}, {"vectors", h.num_vectors}, {"dim", h.dim}, {"m", h.m},
                     {"ef_construction", h.ef_construction}, {"meta_m", h.meta_m},
                     {"metric", metric_text(h.metric)}, {"metadata_bytes", index.metadata_bytes},
                     {"distance_kernel", kernel}}},
          {"settings", {{"batch", eo.batch}, {"probe", eo.probe}, {"probe_ratio", eo.probe_ratio}, {"meta_ef_search", eo.meta_ef_search},
                        {"cache_subs", engine.cache_capacity()}, {"doorbell_subs", eo.doorbell_subs},
                        {"max_wait_us", eo.max_wait_us}, {"arrival_qps", eo.arrival_qps},
                        {"regroup", eo.regroup}, {"doorbell", eo.doorbell}, {"pipeline", eo.pipeline},
                        {"in_place", eo.in_place},
                        {"queue_depth", eo.queue_depth}, {"search_threads", eo.search_threads}}},
          {"codes", index.codes ? json{{"kind", index.codes->spec().to_string()},
                                       {"code_size", index.codes->code_size()},
                                       {"rerank", eo.rerank}}
                                : json(nullptr)},
          {"runs", json::array()}};
}

/// This computenode's share of one measured run, as it travels to computenode 0.
json my_share(uint32_t self, size_t queries, const RunStats& rs, double r1, double rk) {
  json batches = json::array();
  for (const auto& b : rs.batches)
    batches.push_back({b.queries, b.needed, b.fetched, b.cache_hits, b.bytes, b.reads, b.doorbells, b.seconds,
                       b.meta_s, b.fetch_s, b.deserialize_s, b.search_s, b.version_reads, b.version_doorbells,
                       b.refetches, b.reranked, b.rerank_reads, b.rerank_bytes, b.rerank_doorbells, b.rerank_s,
                       b.probed, b.in_place, b.in_place_copies, b.in_place_retries});
  return {{"cn_id", self}, {"queries", queries}, {"seconds", rs.seconds}, {"recall1_sum", r1},
          {"recall_sum", rk}, {"meta_s", rs.meta_s}, {"fetch_s", rs.fetch_s},
          {"deserialize_s", rs.deserialize_s}, {"search_s", rs.search_s}, {"rerank_s", rs.rerank_s},
          {"cache_evictions", rs.cache_evictions}, {"batches", batches}};
}

/// Computenode 0: every computenode's share of one run merged into the report's run.
json merge_run(uint32_t ef, const std::vector<std::string>& texts) {
  uint64_t queries = 0, nb = 0, needed = 0, fetched = 0, hits = 0, bytes = 0, reads = 0, doorbells = 0;
  uint64_t vreads = 0, vdoorbells = 0, refetches = 0, reranked = 0, rr_reads = 0, rr_bytes = 0, rr_doorbells = 0;
  uint64_t probed = 0, in_place = 0, in_place_copies = 0, in_place_retries = 0;
  double max_secs = 0, r1s = 0, rks = 0, meta = 0, fetch = 0, deser = 0, search = 0, rerank = 0, per_q_wall = 0;
  std::vector<float> lat;  // per-query latency amortised over its batch
  json per_cn = json::array();
  for (const auto& t : texts) {
    json j = json::parse(t);
    uint64_t q = j["queries"].get<uint64_t>();
    double s = j["seconds"].get<double>();
    queries += q;
    max_secs = std::max(max_secs, s);
    r1s += j["recall1_sum"].get<double>();
    rks += j["recall_sum"].get<double>();
    meta += j["meta_s"].get<double>();
    fetch += j["fetch_s"].get<double>();
    deser += j["deserialize_s"].get<double>();
    search += j["search_s"].get<double>();
    rerank += j["rerank_s"].get<double>();
    per_q_wall += s;
    for (const auto& b : j["batches"]) {
      ++nb;
      uint64_t bq = b[0].get<uint64_t>();
      needed += b[1].get<uint64_t>();
      fetched += b[2].get<uint64_t>();
      hits += b[3].get<uint64_t>();
      bytes += b[4].get<uint64_t>();
      reads += b[5].get<uint64_t>();
      doorbells += b[6].get<uint64_t>();
      vreads += b[12].get<uint64_t>();
      vdoorbells += b[13].get<uint64_t>();
      refetches += b[14].get<uint64_t>();
      reranked += b[15].get<uint64_t>();
      rr_reads += b[16].get<uint64_t>();
      rr_bytes += b[17].get<uint64_t>();
      rr_doorbells += b[18].get<uint64_t>();
      probed += b[20].get<uint64_t>();
      in_place += b[21].get<uint64_t>();
      in_place_copies += b[22].get<uint64_t>();
      in_place_retries += b[23].get<uint64_t>();
      if (bq > 0) lat.push_back(static_cast<float>(b[7].get<double>() * 1e6 / static_cast<double>(bq)));
    }
    json pc = {{"cn_id", j["cn_id"]}, {"queries", q}, {"seconds", s},
               {"qps", static_cast<double>(q) / std::max(s, 1e-9)}, {"batches", j["batches"].size()},
               {"cache_evictions", j["cache_evictions"]}};
    per_cn.push_back(pc);
  }
  const double nq = static_cast<double>(std::max<uint64_t>(queries, 1)), nbd = static_cast<double>(std::max<uint64_t>(nb, 1));
  double lat_mean = 0;
  for (float x : lat) lat_mean += x;
  lat_mean /= static_cast<double>(std::max<size_t>(lat.size(), 1));
  const double us = 1e6 / nq;
  return {{"ef_search", ef},
          {"queries", queries},
          {"seconds", max_secs},
          {"qps", static_cast<double>(queries) / std::max(max_secs, 1e-9)},
          {"recall", rks / nq},
          {"recall_at_1", r1s / nq},
          {"latency_us", {{"p50", percentile(lat, 0.5)}, {"p99", percentile(lat, 0.99)}, {"mean", lat_mean}}},
          {"per_query", {{"bytes", static_cast<double>(bytes) / nq}, {"reads", static_cast<double>(reads) / nq},
                         {"partitions", static_cast<double>(probed) / nq},
                         {"doorbells", static_cast<double>(doorbells) / nq},
                         {"fetches", static_cast<double>(fetched) / nq},
                         {"version_reads", static_cast<double>(vreads) / nq},
                         {"version_doorbells", static_cast<double>(vdoorbells) / nq},
                         {"reranked", static_cast<double>(reranked) / nq},
                         {"rerank_reads", static_cast<double>(rr_reads) / nq},
                         {"rerank_bytes", static_cast<double>(rr_bytes) / nq},
                         {"rerank_doorbells", static_cast<double>(rr_doorbells) / nq},
                         {"total_bytes", static_cast<double>(bytes + rr_bytes) / nq}}},
          {"network_bound_qps", {{"56Gbps", 56e9 / 8 / std::max(static_cast<double>(bytes + rr_bytes) / nq, 1.0)},
                                 {"100Gbps", 100e9 / 8 / std::max(static_cast<double>(bytes + rr_bytes) / nq, 1.0)}}},
          {"batches", {{"count", nb}, {"queries", nq / nbd}, {"needed", static_cast<double>(needed) / nbd},
                       {"fetched", static_cast<double>(fetched) / nbd},
                       {"cache_hits", static_cast<double>(hits) / nbd},
                       {"bytes", static_cast<double>(bytes) / nbd}, {"reads", static_cast<double>(reads) / nbd},
                       {"doorbells", static_cast<double>(doorbells) / nbd},
                       {"version_doorbells", static_cast<double>(vdoorbells) / nbd},
                       {"refetches", static_cast<double>(refetches) / nbd},
                       {"in_place", static_cast<double>(in_place) / nbd},
                       {"in_place_copies", static_cast<double>(in_place_copies) / nbd},
                       {"in_place_retries", static_cast<double>(in_place_retries) / nbd}}},
          {"stages_us", {{"meta", meta * us}, {"fetch", fetch * us}, {"deserialize", deser * us},
                         {"search", search * us}, {"rerank", rerank * us},
                         {"sum", (meta + fetch + deser + search + rerank) * us},
                         {"pipelined_total", per_q_wall * us}}},
          {"per_cn", per_cn}};
}

}  // namespace

std::pair<double, double> recall_sums(const std::vector<Answer>& answers, const std::vector<uint64_t>& rows,
                                      const Workload& wl, uint32_t k) {
  double r1 = 0, rk = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t* gt = wl.groundtruth.row(rows[i]);
    const Answer& a = answers[i];
    if (!a.empty() && a[0].second == gt[0]) r1 += 1;
    uint32_t hits = 0;
    for (uint32_t j = 0; j < std::min<size_t>(k, a.size()); ++j)
      for (uint32_t g = 0; g < k; ++g)
        if (a[j].second == gt[g]) {
          ++hits;
          break;
        }
    rk += static_cast<double>(hits) / k;
  }
  return {r1, rk};
}

json run_query(const RunContext& rc, const QueryOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  auto control = c.make_endpoint(16u << 20);
  Index index = load_index(c, *control);
  const MetaHeader& h = index.header;
  Workload wl = read_workload(o.workload);
  if (wl.dim() != h.dim)
    throw std::invalid_argument("--workload " + o.workload + " has dimension " + std::to_string(wl.dim()) +
                                ", the index " + std::to_string(h.dim));
  if (o.engine.k > wl.k())
    throw std::invalid_argument("--k " + std::to_string(o.engine.k) + ": the workload's ground truth has only " +
                                std::to_string(wl.k()) + " ids per query");
  if (o.ef_search.empty()) throw std::invalid_argument("--ef-search: no value");
  const uint32_t K = rc.num_cns, self = rc.cn_id, dim = h.dim, k = o.engine.k;
  compute::Board board(c, *control, self, K, "query", rc.departed_at_connect);

  std::vector<uint64_t> warm, measured;
  for (uint64_t i = self; i < wl.total(); i += K) (wl.is_warmup(i) ? warm : measured).push_back(i);
  auto gather = [&](const std::vector<uint64_t>& rows) {
    std::vector<float> x(rows.size() * dim);
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(x.data() + i * dim, wl.queries.row(rows[i]), 4ull * dim);
    return x;
  };
  const std::vector<float> xw = gather(warm), xm = gather(measured);

  EngineOptions eo = o.engine;
  eo.ack_slot = rc.cn_id;
  eo.ef_search = o.ef_search.front();
  Engine engine(c, index, eo);
  spdlog::info("d-HNSW index: {} sub-HNSWs over {} memnode(s), {} vectors, dim {}, metadata {} KiB; batch {}, probe {}, "
               "cache {} sub-HNSWs{}{}{}",
               h.num_subs, h.num_memnodes, h.num_vectors, dim, index.metadata_bytes >> 10, eo.batch, eo.probe,
               engine.cache_capacity(), eo.regroup ? "" : ", no regroup", eo.doorbell ? "" : ", no doorbell",
               eo.pipeline ? "" : ", no pipeline");
  json report = report_header(rc, o, wl, index, eo, engine);

  board.barrier();
  if (!warm.empty()) {
    std::vector<Answer> ignored;
    RunStats ws = engine.run(xw.data(), warm.size(), ignored);
    spdlog::info("warm-up: {} queries in {:.2f} s", warm.size(), ws.seconds);
  }
  for (uint32_t ef : o.ef_search) {
    engine.set_ef_search(ef);
    board.barrier();  // the measured part starts together
    std::vector<Answer> answers;
    RunStats rs = engine.run(xm.data(), measured.size(), answers);
    const auto [r1, rk] = recall_sums(answers, measured, wl, k);
    json mine = my_share(self, measured.size(), rs, r1, rk);
    uint64_t gen = board.barrier();
    board.publish(gen, mine.dump());
    if (self != 0) continue;
    report["runs"].push_back(merge_run(ef, board.gather(gen, 120)));
  }
  leave_epochs(*control, rc.cn_id);
  if (o.on_report) o.on_report(report);
  return report;
}

void print_query(const json& r) {
  if (!r.contains("runs")) return;
  const auto& s = r["settings"];
  std::printf("dhnsw query: %s, k=%u, %u computenode(s), %u sub-HNSWs, batch %u, probe %u, cache %u sub-HNSWs%s%s%s, "
              "provider %s\n",
              r["distribution"].get<std::string>().c_str(), r["k"].get<unsigned>(), r["num_cns"].get<unsigned>(),
              r["index"]["partitions"].get<unsigned>(), s["batch"].get<unsigned>(), s["probe"].get<unsigned>(),
              s["cache_subs"].get<unsigned>(), s["regroup"].get<bool>() ? "" : ", no regroup",
              s["doorbell"].get<bool>() ? "" : ", no doorbell", s["pipeline"].get<bool>() ? "" : ", no pipeline",
              r["provider"].get<std::string>().c_str());
  std::printf("%8s %8s %8s %9s %10s %10s %9s %9s %10s | %8s %8s %8s %8s %8s %9s\n", "efSearch", "R@1", "R@10", "QPS",
              "p50 us", "p99 us", "fetched", "hits", "KiB/query", "meta", "fetch", "deser", "search", "sum", "pipelined");
  for (const auto& run : r["runs"]) {
    const auto& st = run["stages_us"];
    std::printf("%8u %8.4f %8.4f %9.0f %10.1f %10.1f %9.1f %9.1f %10.1f | %8.1f %8.1f %8.1f %8.1f %8.1f %9.1f\n",
                run["ef_search"].get<unsigned>(), run["recall_at_1"].get<double>(), run["recall"].get<double>(),
                run["qps"].get<double>(), run["latency_us"]["p50"].get<double>(),
                run["latency_us"]["p99"].get<double>(), run["batches"]["fetched"].get<double>(),
                run["batches"]["cache_hits"].get<double>(), run["per_query"]["bytes"].get<double>() / 1024,
                st["meta"].get<double>(), st["fetch"].get<double>(), st["deserialize"].get<double>(),
                st["search"].get<double>(), st["sum"].get<double>(), st["pipelined_total"].get<double>());
  }
  std::printf("  (latency: per query, amortised over its batch; fetched/hits: sub-HNSWs per batch; stage columns: "
              "us per query)\n");
}

}  // namespace dmhnsw::dhnsw
