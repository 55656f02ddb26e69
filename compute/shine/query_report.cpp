// The shine query report (docs/reports.md): the run's settings, then per efSearch one run
// merged on computenode 0 from every computenode's share, published on the board.
#include <algorithm>

#include "compute/shine/query_session.hpp"

namespace dmhnsw::shine::query_detail {

using nlohmann::json;

namespace {
json cache_json(const cache::NodeCacheStats& s) {
  return {{"lookups", s.lookups}, {"hits", s.hits}, {"hit_rate", s.hit_rate()}, {"cooling_hits", s.cooling_hits},
          {"admissions", s.admissions}, {"rejections", s.rejections}, {"evictions", s.evictions}, {"entries", s.entries}};
}
}  // namespace

cache::NodeCacheStats stats_since(const cache::NodeCacheStats& now, const cache::NodeCacheStats& before) {
  cache::NodeCacheStats d = now;
  d.lookups -= before.lookups;
  d.hits -= before.hits;
  d.cooling_hits -= before.cooling_hits;
  d.admissions -= before.admissions;
  d.rejections -= before.rejections;
  d.evictions -= before.evictions;
  return d;
}

json QuerySession::report_header() const {
  return {{"mode", "shine"}, {"kind", "query"}, {"provider", rc_.provider}, {"workload", o_.workload},
          {"distribution", wl_.distribution}, {"k", o_.k}, {"num_cns", K_}, {"threads", o_.search.threads},
          {"coroutines", o_.search.coroutines}, {"read_mode", o_.mode == ReadMode::Batch ? "batch" : "per-read"},
          {"upper_ef", o_.search.upper_ef}, {"in_place", in_place_},
          {"memnodes", c_.memnodes().size()}, {"routing", router::policy_name(policy_)},
          {"route_batch", o_.search.routing.batch}, {"route_threshold", o_.search.routing.threshold},
          {"adaptive_quota", o_.search.routing.quota},
          {"cache", {{"enabled", ncache_ != nullptr}, {"holds", cache_lists_ ? "lists" : "vectors"},
                     {"capacity_bytes", cc_.capacity_bytes},
                     {"capacity_entries", ncache_ ? ncache_->capacity_entries() : 0},
                     {"index_bytes", idx_bytes_}, {"admit_probability", o_.search.admit_probability}}},
          {"partition", partition_},
          {"codes", codes_ ? json{{"kind", p_.codes->spec().to_string()}, {"code_size", p_.codes->code_size()},
                                  {"rerank", o_.search.rerank}, {"nodes", codes_->size()},
                                  {"bytes", codes_->bytes()}, {"load_seconds", codes_load_s_}}
                           : json(nullptr)},
          {"index", {{"dim", p_.dim}, {"m", p_.m}, {"ef_construction", p_.ef_construction},
                     {"metric", std::string(to_string(p_.metric))},
                     {"distance_kernel", g_->distance().kernel_name()}}}};
}

// This computenode's share of one measured phase, as it travels to computenode 0.
json QuerySession::my_share(const std::vector<PerQuery>& rows, const PhaseResult& pr, const cache::NodeCacheStats& cs,
                            double cpu_secs) const {
  std::vector<float> lat;
  double recall = 0;
  compute::IoStats io;
  SearchStats ss;
  for (const auto& r : rows) {
    lat.push_back(r.latency_us);
    recall += r.recall;
    io += r.io;
    ss.visited += r.ss.visited;
    ss.hops += r.ss.hops;
    ss.skipped += r.ss.skipped;
    ss.stale += r.ss.stale;
    ss.coded += r.ss.coded;
    ss.reranked += r.ss.reranked;
    ss.cached_lists += r.ss.cached_lists;
    ss.list_bytes += r.ss.list_bytes;
  }
  if (lat.size() > 8192) {  // at most 8192 latencies per computenode travel (an even subsample)
    std::vector<float> sub;
    for (size_t i = 0; i < 8192; ++i) sub.push_back(lat[i * lat.size() / 8192]);
    lat.swap(sub);
  }
  return {{"cn_id", self_}, {"queries", rows.size()}, {"seconds", pr.seconds}, {"recall_sum", recall},
          {"io", io_json(io)}, {"visited", ss.visited}, {"hops", ss.hops}, {"skipped", ss.skipped},
          {"stale", ss.stale}, {"coded", ss.coded}, {"reranked", ss.reranked},
          {"cached_lists", ss.cached_lists}, {"list_bytes", ss.list_bytes}, {"input", pr.input}, {"routed_away", pr.routed_away}, {"received", pr.received},
          {"bounced", pr.bounced}, {"syncs", pr.syncs}, {"routed_to", pr.routed_to}, {"cache", cache_json(cs)},
          {"cpu_seconds", cpu_secs},
          {"latencies_us", lat}};
}

// Computenode 0: every share of one phase (empty text: that computenode is gone) into one run.
json QuerySession::merge_run(uint32_t ef, const std::vector<std::string>& texts) {
  std::vector<float> all_lat;
  double max_secs = 0, recall_sum = 0;
  uint64_t queries = 0, visited = 0, hops = 0, skipped = 0, stale = 0, lookups = 0, chits = 0, coded = 0, reranked = 0,
           cached_lists = 0, list_bytes = 0;
  compute::IoStats all_io;
  json per_cn = json::array();
  for (uint32_t cn = 0; cn < texts.size(); ++cn) {
    if (texts[cn].empty()) continue;  // gone
    json j = json::parse(texts[cn]);
    auto l = j["latencies_us"].get<std::vector<float>>();
    all_lat.insert(all_lat.end(), l.begin(), l.end());
    max_secs = std::max(max_secs, j["seconds"].get<double>());
    recall_sum += j["recall_sum"].get<double>();
    queries += j["queries"].get<uint64_t>();
    visited += j["visited"].get<uint64_t>();
    hops += j["hops"].get<uint64_t>();
    skipped += j["skipped"].get<uint64_t>();
    stale += j["stale"].get<uint64_t>();
    coded += j["coded"].get<uint64_t>();
    reranked += j["reranked"].get<uint64_t>();
    cached_lists += j["cached_lists"].get<uint64_t>();
    list_bytes += j["list_bytes"].get<uint64_t>();
    lookups += j["cache"]["lookups"].get<uint64_t>();
    chits += j["cache"]["hits"].get<uint64_t>();
    all_io.reads += j["io"]["reads"].get<uint64_t>();
    all_io.bytes += j["io"]["bytes"].get<uint64_t>();
    all_io.doorbells += j["io"]["doorbells"].get<uint64_t>();
    j.erase("latencies_us");
    j["qps"] = j["queries"].get<double>() / std::max(j["seconds"].get<double>(), 1e-9);
    per_cn.push_back(j);
  }
  double nq = static_cast<double>(std::max<uint64_t>(queries, 1));
  double bytes_per_q = static_cast<double>(all_io.bytes) / nq;
  double mean_lat = 0;
  for (float x : all_lat) mean_lat += x;
  mean_lat /= static_cast<double>(std::max<size_t>(all_lat.size(), 1));
  json gone_now;
  {
    std::lock_guard gl(gone_mu_);
    gone_now = gone_list_;
  }
  return {{"ef_search", ef},
          {"queries", queries},
          {"seconds", max_secs},
          {"qps", static_cast<double>(queries) / std::max(max_secs, 1e-9)},
          {"recall", recall_sum / nq},
          {"latency_us", {{"p50", percentile(all_lat, 0.5)}, {"p99", percentile(all_lat, 0.99)}, {"mean", mean_lat}}},
          {"per_query",
           {{"visited", static_cast<double>(visited) / nq},
            {"hops", static_cast<double>(hops) / nq},
            {"cached_lists", static_cast<double>(cached_lists) / nq},
            {"list_bytes", static_cast<double>(list_bytes) / nq},
            {"reads", static_cast<double>(all_io.reads) / nq},
            {"bytes", bytes_per_q},
            {"doorbells", static_cast<double>(all_io.doorbells) / nq},
            {"coded", static_cast<double>(coded) / nq},
            {"reranked", static_cast<double>(reranked) / nq},
            {"vector_bytes", static_cast<double>(visited - coded) / nq *
                                 static_cast<double>(g_->layout().vector_read_bytes())},
            {"rerank_bytes", static_cast<double>(reranked) / nq * static_cast<double>(g_->layout().vector_read_bytes())}}},
          {"network_bound_qps", {{"56Gbps", 56e9 / 8 / std::max(bytes_per_q, 1.0)}, {"100Gbps", 100e9 / 8 / std::max(bytes_per_q, 1.0)}}},
          {"cache_hit_rate", lookups ? static_cast<double>(chits) / static_cast<double>(lookups) : 0.0},
          {"invalid_pointers_skipped", skipped},
          {"stale_results_dropped", stale},
          {"computenodes_gone", gone_now},
          {"per_cn", per_cn}};
}

}  // namespace dmhnsw::shine::query_detail
