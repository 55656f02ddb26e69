// SHINE query run: a workload over T threads x C coroutines per computenode, with the node
// cache, logical partitioning (balanced k-means, oracle) and query routing through the
// memnodes' relays (paper sections 5-7). Control path of the query side; the datapath is
// graph.cpp. This file sets a session up and runs its phases; query_phase.cpp is one phase
// (route and answer), query_report.cpp the report.
#include <spdlog/spdlog.h>

#include <cstring>
#include <filesystem>

#include "compute/shine/query_session.hpp"
#include "compute/shine/sample.hpp"

namespace dmhnsw::shine {

using nlohmann::json;

namespace query_detail {

QuerySession::QuerySession(const RunContext& rc, const QueryOptions& o)
    : rc_(rc), o_(o), c_(*rc.cluster), wl_(read_workload(o.workload)), policy_(router::Policy::None),
      K_(rc.num_cns), self_(rc.cn_id), ex_(rc.num_cns) {
  if (o.k > wl_.k())
    throw std::invalid_argument("--k " + std::to_string(o.k) + ": the workload's ground truth has only " +
                                std::to_string(wl_.k()) + " ids per query");
  policy_ = router::parse_policy(o.search.routing.policy);
  control_ = c_.make_endpoint(16u << 20);
  p_ = format_or_attach(c_, *control_, nullptr);
  if (p_.dim != wl_.dim())
    throw std::invalid_argument("--workload " + o.workload + " has dimension " + std::to_string(wl_.dim()) +
                                ", the index " + std::to_string(p_.dim));
  g_.emplace(c_, p_);
  board_.emplace(c_, *control_, self_, K_, "query", rc.departed_at_connect);
  make_node_cache();
  in_place_ = o.search.reads_in_place(*control_);
  if (in_place_)
    spdlog::info("lists and vectors read in place (the provider maps the memnodes' regions){}",
                 ncache_ && cache_lists_ ? "; the node cache of lists is not used" : "");
  if (o.search.rerank > 0) {
    const auto t0 = Clock::now();
    codes_.emplace(LocalCodes::load(*control_, p_));
    codes_load_s_ = seconds_since(t0);
    spdlog::info("codes {}: {} nodes' codes loaded ({} MiB) in {:.2f} s; the best {} re-ranked", p_.codes->spec().to_string(),
                 codes_->size(), codes_->bytes() >> 20, codes_load_s_, o.search.rerank);
  }
  make_partition_oracle();
  relay_.emplace(c_, self_, K_, relay_callbacks());
  relay_ptr_.store(&*relay_);
  open_traces();
}

void QuerySession::make_node_cache() {
  idx_bytes_ = index_bytes(*g_, *control_);
  cache_lists_ = o_.search.cache_lists();
  cc_.dim = cache_entry_floats(g_->layout(), cache_lists_);
  cc_.admit_probability = o_.search.admit_probability;
  cc_.seed = p_.seed * 1000;  // the same policy on every computenode (csp-report replays it)
  cc_.capacity_bytes = o_.search.cache_capacity(idx_bytes_);
  if (cc_.capacity_bytes > 0) {
    ncache_ = std::make_unique<cache::NodeCache>(cc_);
    spdlog::info("node cache: {} {} ({} MiB; index {} MiB), level-0 admission p={}", ncache_->capacity_entries(),
                 cache_lists_ ? "neighbour lists" : "vectors", cc_.capacity_bytes >> 20, idx_bytes_ >> 20,
                 o_.search.admit_probability);
  }
}

// The same centroids on every computenode: the sample and k-means are seeded alike.
void QuerySession::make_partition_oracle() {
  if (policy_ == router::Policy::None || K_ <= 1) return;
  auto t0 = Clock::now();
  LevelSample smp = sample_level(*g_, *control_, 1000, 100000, o_.search.routing.kmeans_seed);
  router::BalancedKMeansOptions ko;
  ko.seed = o_.search.routing.kmeans_seed;
  ko.balance_oracle = o_.search.routing.oracle == "balanced";
  size_t n = smp.size(p_.dim);
  router::Clustering cl = router::balanced_kmeans(smp.vectors.data(), n, p_.dim, K_, p_.metric, ko);
  oracle_ = router::Oracle(cl.centroids, K_, p_.dim, p_.metric, cl.offsets);
  partition_ = {{"level", smp.level},
                {"nodes_at_level", smp.nodes_at_level},
                {"sample", n},
                {"sizes", cl.sizes},
                {"imbalance", cl.imbalance()},
                {"oracle", o_.search.routing.oracle},
                {"offsets", cl.offsets},
                {"oracle_load_nearest", cl.oracle_load_nearest},
                {"oracle_load", ko.balance_oracle ? cl.oracle_load_balanced : cl.oracle_load_nearest},
                {"seconds", seconds_since(t0)}};
  spdlog::info("partitioning: level {} ({} nodes, {} sampled), {} clusters of sizes {}; {} oracle splits the "
               "sample {:.2f}x the mean at most (nearest centroid: {:.2f}x); {:.2f} s",
               smp.level, smp.nodes_at_level, n, K_, partition_["sizes"].dump(), o_.search.routing.oracle,
               partition_["oracle_load"].get<double>(), cl.oracle_load_nearest, partition_["seconds"].get<double>());
}

// The relay: routed queries, progress, done counts, liveness.
compute::RelayClient::Callbacks QuerySession::relay_callbacks() {
  compute::RelayClient::Callbacks cb;
  cb.deliver = [this](uint32_t from, const char* body, size_t len) {
    uint32_t kind = 0;
    if (len >= 4) std::memcpy(&kind, body, 4);
    if (kind == kQueryMsg && len >= sizeof(QueryMsg)) {
      QueryMsg m;
      std::memcpy(&m, body, sizeof m);
      if (m.dim != p_.dim || len != sizeof m + 4ull * m.dim || m.pos >= wl_.total() || m.seq >= kMaxSeq)
        return;
      Item it{m.pos, true, std::vector<float>(m.dim)};
      std::memcpy(it.vec.data(), body + sizeof m, 4ull * m.dim);
      ex_.on_query(from, m.phase, m.seq, std::move(it));
    } else if (kind == kProgressMsg && len == sizeof(ProgressMsg)) {
      ProgressMsg m;
      std::memcpy(&m, body, sizeof m);
      ex_.set_progress(from, m.queue_len);
    } else if (kind == kDoneMsg && len == sizeof(DoneMsg)) {
      DoneMsg m;
      std::memcpy(&m, body, sizeof m);
      ex_.on_done(from, m.phase, m.sent);
    } else if (kind == kSyncMsg && len >= sizeof(SyncMsg)) {
      SyncMsg m;
      std::memcpy(&m, body, sizeof m);
      if (m.missing > kSyncMissingMax || len != sizeof m + 4ull * m.missing) return;
      std::vector<uint32_t> missing(m.missing);
      std::memcpy(missing.data(), body + sizeof m, 4ull * m.missing);
      resend(from, m.phase, m.next, missing);
    }
  };
  cb.bounce = [this](uint32_t to, const char* body, size_t len) {
    uint32_t kind = 0;
    if (len >= 4) std::memcpy(&kind, body, 4);
    const bool is_done = kind == kDoneMsg && len == sizeof(DoneMsg);
    QueryMsg m{};
    const bool is_query = kind == kQueryMsg && len >= sizeof m && (std::memcpy(&m, body, sizeof m), true) &&
                          m.dim == p_.dim && len == sizeof m + 4ull * m.dim;
    if (!is_done && !is_query) return;
    // The relay took `to` for gone while it is not (a stalled host, or a relay that has not
    // seen it join yet): the message must still arrive, or `to` would wait for it. Resend a
    // while; a computenode really gone is reported gone by the relays and nobody waits for it.
    if (!ex_.gone(to) && relay_ptr_.load() != nullptr && bounce_resends_.fetch_add(1) < 2000) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      try {
        relay_ptr_.load()->forward(to, body, len);
        return;
      } catch (const std::exception& e) {
        spdlog::debug("resending a message to computenode {}: {}", to, e.what());
      }
    }
    if (!is_query) return;
    spdlog::debug("a query routed to computenode {} came back: processing it here", to);
    ex_.on_bounce(m.phase, Item{m.pos, false, {}});
  };
  cb.gone = [this](uint32_t cn, const std::string& why) {
    ex_.set_gone(cn);
    if (why != "left") {
      std::lock_guard gl(gone_mu_);
      gone_list_.push_back({{"cn_id", cn}, {"why", why}});
    }
  };
  return cb;
}

void QuerySession::open_traces() {
  traces_.resize(o_.search.threads);
  if (o_.trace_dir.empty()) return;
  if (!ncache_)
    throw std::invalid_argument("--trace " + o_.trace_dir + ": needs a node cache (--cache-ratio or --cache-bytes)");
  if (cache_lists_)
    throw std::invalid_argument("--trace " + o_.trace_dir +
                                ": traces a node cache of vectors; this one holds neighbour lists (--cache-holds vectors)");
  std::filesystem::create_directories(o_.trace_dir);
  cache::TraceMeta meta;
  meta.cn_id = self_;
  meta.num_cns = K_;
  meta.dim = p_.dim;
  meta.capacity_bytes = cc_.capacity_bytes;
  meta.admit_probability = o_.search.admit_probability;
  meta.cooling_share = cc_.cooling_share;
  meta.seed = cc_.seed;
  meta.start_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
  std::snprintf(meta.label, sizeof meta.label, "%s", router::policy_name(policy_));
  for (uint32_t t = 0; t < o_.search.threads; ++t) {
    meta.thread = t;
    traces_[t] = std::make_unique<cache::TraceWriter>(
        o_.trace_dir + "/cn" + std::to_string(self_) + "-t" + std::to_string(t) + ".trace", meta);
  }
}

json QuerySession::run() {
  std::vector<uint32_t> warm, measured;
  for (uint64_t i = self_; i < wl_.total(); i += K_)
    (wl_.is_warmup(i) ? warm : measured).push_back(static_cast<uint32_t>(i));
  json report = report_header();
  uint32_t phase = 0;
  relay_->barrier(120);  // the run's first barrier: every computenode must come
  // The board's barrier numbers this run the same on every computenode (a counter in memnode
  // 0's region, so its copies agree: a relay's release numbers barriers per memnode process).
  // A phase's results are published under the run's number and the phase: unique over the
  // region's life, and above any number a board barrier hands out.
  const uint64_t run_gen = board_->barrier(120);
  auto results_gen = [run_gen](uint32_t ph) { return (uint64_t{1} << 54) | (run_gen << 12) | ph; };
  if (wl_.warmup_count > 0) {  // every computenode runs the warm-up phase (maybe with no input)
    std::vector<PerQuery> ignored;
    auto wr = run_phase(phase++, warm, o_.ef_search.front(), 0, false, ignored);
    spdlog::info("warm-up: {} queries answered here in {:.2f} s", ignored.size(), wr.seconds);
  }
  for (uint32_t ef : o_.ef_search) {
    if (codes_)  // the codes of nodes other computenodes inserted since (else read as vectors)
      if (const uint64_t got = codes_->refresh(*control_, p_); got > 0) spdlog::info("codes: {} new entries read", got);
    relay_->barrier();  // the measured part starts together (after everyone's warm-up)
    cache::NodeCacheStats before = ncache_ ? ncache_->stats() : cache::NodeCacheStats{};
    std::vector<PerQuery> rows;
    const double cpu0 = process_cpu_seconds();
    PhaseResult pr = run_phase(phase++, measured, ef, o_.repeat_seconds, true, rows);
    const double cpu_secs = process_cpu_seconds() - cpu0;
    cache::NodeCacheStats cs = ncache_ ? stats_since(ncache_->stats(), before) : cache::NodeCacheStats{};
    json mine = my_share(rows, pr, cs, cpu_secs);
    compute::RelayClient::Release rel = relay_->barrier();
    board_->publish(results_gen(phase - 1), mine.dump());
    if (self_ != 0) continue;
    report["runs"].push_back(merge_run(ef, board_->gather(results_gen(phase - 1), 60, rel.gone)));
  }
  for (auto& t : traces_)
    if (t) t->close();  // complete: renamed to its name
  if (o_.on_report) o_.on_report(report);
  return report;
}

}  // namespace query_detail

json run_query(const RunContext& rc, const QueryOptions& o) {
  query_detail::QuerySession session(rc, o);
  return session.run();
}

}  // namespace dmhnsw::shine
