// SHINE query run: a workload over T threads x C coroutines per computenode, with the node
// cache, logical partitioning (balanced k-means, oracle) and query routing through the
// memnodes' relays (paper sections 5-7). Control path of the query side; the datapath is
// graph.cpp.
#include <spdlog/spdlog.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <random>

#include "common/workload.hpp"
#include "compute/board.hpp"
#include "compute/relay_client.hpp"
#include "compute/shine/engine.hpp"
#include "compute/shine/run_util.hpp"
#include "compute/shine/sample.hpp"
#include "router/partition.hpp"
#include "router/policy.hpp"

namespace dmhnsw::shine {

using nlohmann::json;

namespace {

// ---- application messages carried by the relay (computenode to computenode)
enum : uint32_t { kQueryMsg = 0x5155'0001u, kProgressMsg = 0x5155'0002u, kDoneMsg = 0x5155'0003u };
struct QueryMsg {  // followed by dim floats
  uint32_t kind;
  uint32_t phase;
  uint64_t pos;  // position in the workload stream (its ground truth)
  uint32_t origin;
  uint32_t dim;
};
struct ProgressMsg {
  uint32_t kind;
  uint32_t phase;
  uint64_t batch;
  uint64_t queue_len;
};
struct DoneMsg {
  uint32_t kind;
  uint32_t phase;
  uint64_t sent;  // queries the sender routed to the receiver in this phase
};
static_assert(sizeof(QueryMsg) == 24 && sizeof(ProgressMsg) == 24 && sizeof(DoneMsg) == 16);
static_assert(std::is_trivially_copyable_v<QueryMsg> && std::is_trivially_copyable_v<ProgressMsg>);
/// Adaptive routing: a router waiting for its own queue to drain re-broadcasts its length this often.
constexpr std::chrono::milliseconds kProgressEvery{2};
constexpr std::chrono::seconds kNoteEvery{10};  // a progress line while a phase runs

struct Item {
  uint32_t pos;
  bool routed;             // arrived from another computenode
  std::vector<float> vec;  // routed: the query as it travelled; local: empty (workload row)
};

/// What the relay's I/O thread, the router thread and the workers share.
class Exchange {
 public:
  explicit Exchange(uint32_t k) : k_(k), progress_(k, 0) {}

  void push(uint32_t phase, Item it) {
    std::lock_guard g(mu_);
    ph(phase).queue.push_back(std::move(it));
  }
  bool pop(uint32_t phase, Item& out) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    if (p.queue.empty()) return false;
    out = std::move(p.queue.front());
    p.queue.pop_front();
    ++p.in_service;
    return true;
  }
  void served(uint32_t phase) {
    std::lock_guard g(mu_);
    --ph(phase).in_service;
  }
  size_t queue_len(uint32_t phase) {
    std::lock_guard g(mu_);
    return ph(phase).queue.size();
  }
  void on_query(uint32_t from, uint32_t phase, Item it) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    ++p.received[from];
    ++p.received_total;
    p.queue.push_back(std::move(it));
  }
  void on_done(uint32_t from, uint32_t phase, uint64_t sent) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    p.done[from] = true;
    p.promised[from] = sent;
  }
  void on_bounce(uint32_t phase, Item it) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    ++p.bounced;
    p.queue.push_back(std::move(it));
  }
  void set_progress(uint32_t cn, uint64_t v) {
    std::lock_guard g(mu_);
    if (cn < k_) progress_[cn] = v;
  }
  std::vector<uint64_t> progress() {
    std::lock_guard g(mu_);
    return progress_;
  }
  void set_gone(uint32_t cn) {
    std::lock_guard g(mu_);
    gone_.insert(cn);
  }
  bool gone(uint32_t cn) {
    std::lock_guard g(mu_);
    return gone_.count(cn) > 0;
  }
  /// The phase is over for this computenode: its router is done, every live peer said how
  /// many it routed here and all of them arrived, nothing queued or in service.
  bool finished(uint32_t phase, uint32_t self, bool need_done, bool router_done) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    if (!router_done || !p.queue.empty() || p.in_service > 0) return false;
    if (!need_done) return true;
    for (uint32_t c = 0; c < k_; ++c) {
      if (c == self || gone_.count(c)) continue;
      if (!p.done[c] || p.received[c] < p.promised[c]) return false;
    }
    return true;
  }
  std::string describe(uint32_t phase) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    std::string out = "phase " + std::to_string(phase) + ": queued " + std::to_string(p.queue.size()) + ", in service " +
                      std::to_string(p.in_service);
    for (uint32_t c = 0; c < k_; ++c)
      out += "; cn " + std::to_string(c) + (gone_.count(c) ? " gone" : "") + " done " + std::to_string(p.done[c]) +
             " received " + std::to_string(p.received[c]) + " of " + std::to_string(p.promised[c]);
    return out;
  }
  uint64_t received(uint32_t phase) {
    std::lock_guard g(mu_);
    return ph(phase).received_total;
  }
  uint64_t bounced(uint32_t phase) {
    std::lock_guard g(mu_);
    return ph(phase).bounced;
  }

 private:
  struct Phase {
    std::deque<Item> queue;
    std::map<uint32_t, uint64_t> received, promised;
    std::map<uint32_t, bool> done;
    uint64_t received_total = 0, bounced = 0;
    int64_t in_service = 0;
  };
  Phase& ph(uint32_t phase) { return phases_[phase]; }
  uint32_t k_;
  std::mutex mu_;
  std::map<uint32_t, Phase> phases_;
  std::vector<uint64_t> progress_;
  std::set<uint32_t> gone_;
};

struct PerQuery {
  float latency_us;
  float recall;
  compute::IoStats io;
  SearchStats ss;
};

json cache_json(const cache::NodeCacheStats& s) {
  return {{"lookups", s.lookups}, {"hits", s.hits}, {"hit_rate", s.hit_rate()}, {"cooling_hits", s.cooling_hits},
          {"admissions", s.admissions}, {"rejections", s.rejections}, {"evictions", s.evictions}, {"entries", s.entries}};
}

cache::NodeCacheStats minus(const cache::NodeCacheStats& a, const cache::NodeCacheStats& b) {
  cache::NodeCacheStats d = a;
  d.lookups -= b.lookups;
  d.hits -= b.hits;
  d.cooling_hits -= b.cooling_hits;
  d.admissions -= b.admissions;
  d.rejections -= b.rejections;
  d.evictions -= b.evictions;
  return d;
}

}  // namespace

json run_query(const RunContext& rc, const QueryOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  Workload wl = read_workload(o.workload);
  if (o.k > wl.k())
    throw std::invalid_argument("--k " + std::to_string(o.k) + ": the workload's ground truth has only " +
                                std::to_string(wl.k()) + " ids per query");
  const router::Policy policy = router::parse_policy(o.routing);
  auto control = c.make_endpoint(16u << 20);
  GraphParams p = format_or_attach(c, *control, nullptr);
  if (p.dim != wl.dim())
    throw std::invalid_argument("--workload " + o.workload + " has dimension " + std::to_string(wl.dim()) +
                                ", the index " + std::to_string(p.dim));
  Graph g(c, p);
  compute::Board board(c, *control, rc.cn_id, rc.num_cns, "query", rc.departed_at_connect);
  const uint32_t K = rc.num_cns, self = rc.cn_id;

  // ---- node cache
  std::unique_ptr<cache::NodeCache> ncache;
  uint64_t idx_bytes = index_bytes(g, *control);
  cache::NodeCacheConfig cc;
  cc.dim = p.dim;
  cc.admit_probability = o.admit_probability;
  cc.seed = p.seed * 1000;  // the same policy on every computenode (csp-report replays it)
  cc.capacity_bytes = o.cache_bytes > 0 ? o.cache_bytes
                                        : static_cast<uint64_t>(o.cache_ratio * static_cast<double>(idx_bytes));
  if (cc.capacity_bytes > 0) {
    ncache = std::make_unique<cache::NodeCache>(cc);
    spdlog::info("node cache: {} entries ({} MiB; index {} MiB), level-0 admission p={}", ncache->capacity_entries(),
                 cc.capacity_bytes >> 20, idx_bytes >> 20, o.admit_probability);
  }

  // ---- logical partitioning (the same centroids on every computenode)
  router::Oracle oracle;
  json partition = nullptr;
  if (policy != router::Policy::None && K > 1) {
    auto t0 = Clock::now();
    LevelSample smp = sample_level(g, *control, 1000, 100000, o.kmeans_seed);
    router::BalancedKMeansOptions ko;
    ko.seed = o.kmeans_seed;
    ko.balance_oracle = o.oracle == "balanced";
    size_t n = smp.size(p.dim);
    router::Clustering cl = router::balanced_kmeans(smp.vectors.data(), n, p.dim, K, p.metric, ko);
    oracle = router::Oracle(cl.centroids, K, p.dim, p.metric, cl.offsets);
    partition = {{"level", smp.level},
                 {"nodes_at_level", smp.nodes_at_level},
                 {"sample", n},
                 {"sizes", cl.sizes},
                 {"imbalance", cl.imbalance()},
                 {"oracle", o.oracle},
                 {"offsets", cl.offsets},
                 {"oracle_load_nearest", cl.oracle_load_nearest},
                 {"oracle_load", ko.balance_oracle ? cl.oracle_load_balanced : cl.oracle_load_nearest},
                 {"seconds", secs_since(t0)}};
    spdlog::info("partitioning: level {} ({} nodes, {} sampled), {} clusters of sizes {}; {} oracle splits the "
                 "sample {:.2f}x the mean at most (nearest centroid: {:.2f}x); {:.2f} s",
                 smp.level, smp.nodes_at_level, n, K, partition["sizes"].dump(), o.oracle,
                 partition["oracle_load"].get<double>(), cl.oracle_load_nearest, partition["seconds"].get<double>());
  }

  // ---- the relay: routed queries, progress, done counts, liveness
  Exchange ex(K);
  compute::RelayClient::Callbacks cb;
  cb.deliver = [&](uint32_t from, const char* body, size_t len) {
    uint32_t kind = 0;
    if (len >= 4) std::memcpy(&kind, body, 4);
    if (kind == kQueryMsg && len >= sizeof(QueryMsg)) {
      QueryMsg m;
      std::memcpy(&m, body, sizeof m);
      if (m.dim != p.dim || len != sizeof m + 4ull * m.dim || m.pos >= wl.total()) return;
      Item it{static_cast<uint32_t>(m.pos), true, std::vector<float>(m.dim)};
      std::memcpy(it.vec.data(), body + sizeof m, 4ull * m.dim);
      ex.on_query(from, m.phase, std::move(it));
    } else if (kind == kProgressMsg && len == sizeof(ProgressMsg)) {
      ProgressMsg m;
      std::memcpy(&m, body, sizeof m);
      ex.set_progress(from, m.queue_len);
    } else if (kind == kDoneMsg && len == sizeof(DoneMsg)) {
      DoneMsg m;
      std::memcpy(&m, body, sizeof m);
      ex.on_done(from, m.phase, m.sent);
    }
  };
  std::atomic<uint32_t> done_resends{0};
  std::atomic<compute::RelayClient*> relay_ptr{nullptr};
  cb.bounce = [&](uint32_t to, const char* body, size_t len) {
    uint32_t kind = 0;
    if (len >= 4) std::memcpy(&kind, body, 4);
    if (kind == kDoneMsg && len == sizeof(DoneMsg)) {
      // The relay took `to` for gone while it is not (a stalled host): its count must still
      // arrive, or it would wait for it. Resend a while; a computenode really gone is
      // reported gone by the relays and nobody waits for it.
      if (!ex.gone(to) && relay_ptr.load() != nullptr && done_resends.fetch_add(1) < 2000) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        try {
          relay_ptr.load()->forward(to, body, len);
        } catch (const std::exception& e) {
          spdlog::debug("resending a done count to computenode {}: {}", to, e.what());
        }
      }
      return;
    }
    QueryMsg m;
    if (len < sizeof m) return;
    std::memcpy(&m, body, sizeof m);
    if (m.kind != kQueryMsg || m.dim != p.dim || len != sizeof m + 4ull * m.dim) return;
    spdlog::debug("a query routed to computenode {} came back: processing it here", to);
    ex.on_bounce(m.phase, Item{static_cast<uint32_t>(m.pos), false, {}});
  };
  std::mutex gone_mu;
  json gone_list = json::array();
  cb.gone = [&](uint32_t cn, const std::string& why) {
    ex.set_gone(cn);
    if (why != "left") {
      std::lock_guard gl(gone_mu);
      gone_list.push_back({{"cn_id", cn}, {"why", why}});
    }
  };
  compute::RelayClient relay(c, self, K, cb);
  relay_ptr.store(&relay);

  // ---- traces
  std::vector<std::unique_ptr<cache::TraceWriter>> traces(o.threads);
  if (!o.trace_dir.empty()) {
    if (!ncache) throw std::invalid_argument("--trace " + o.trace_dir + ": needs a node cache (--cache-ratio or --cache-bytes)");
    std::filesystem::create_directories(o.trace_dir);
    cache::TraceMeta meta;
    meta.cn_id = self;
    meta.num_cns = K;
    meta.dim = p.dim;
    meta.capacity_bytes = cc.capacity_bytes;
    meta.admit_probability = o.admit_probability;
    meta.cooling_share = cc.cooling_share;
    meta.seed = cc.seed;
    meta.start_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
    std::snprintf(meta.label, sizeof meta.label, "%s", router::policy_name(policy));
    for (uint32_t t = 0; t < o.threads; ++t) {
      meta.thread = t;
      traces[t] = std::make_unique<cache::TraceWriter>(
          o.trace_dir + "/cn" + std::to_string(self) + "-t" + std::to_string(t) + ".trace", meta);
    }
  }

  std::vector<uint32_t> warm, measured;
  for (uint64_t i = self; i < wl.total(); i += K) (wl.is_warmup(i) ? warm : measured).push_back(static_cast<uint32_t>(i));

  struct PhaseResult {
    double seconds = 0;
    uint64_t input = 0, routed_away = 0, received = 0, bounced = 0;
    std::vector<uint64_t> routed_to;
  };
  // One phase: this computenode's share of the stream goes through the router; the workers
  // answer whatever lands in the working queue until everyone's routed queries arrived.
  auto run_phase = [&](uint32_t phase, const std::vector<uint32_t>& items, uint32_t ef, double min_seconds,
                       bool is_measured, std::vector<PerQuery>& out) -> PhaseResult {
    PhaseResult pr;
    pr.routed_to.assign(K, 0);
    std::atomic<bool> stop{false}, router_done{false};
    const bool need_done = policy != router::Policy::None && K > 1;
    std::mutex mu;
    std::exception_ptr router_error;
    auto t0 = Clock::now();
    auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(min_seconds));
    // A line every kNoteEvery while queries are answered: on a slow or lossy link a run that
    // goes on is told from one that is stuck (which prints nothing).
    std::atomic<uint64_t> answered{0};
    std::atomic<int64_t> next_progress{(t0 + kNoteEvery).time_since_epoch().count()};
    auto note_progress = [&] {
      if (int64_t due = next_progress.load(); Clock::now().time_since_epoch().count() >= due &&
                                               next_progress.compare_exchange_strong(
                                                   due, (Clock::now() + kNoteEvery).time_since_epoch().count())) {
        const double secs = secs_since(t0);
        const uint64_t n = answered.load();
        spdlog::info("query phase {}: {} answered here in {:.0f} s ({:.1f} per s), {} queued", phase, n, secs,
                     static_cast<double>(n) / secs, ex.queue_len(phase));
      }
    };
    std::thread router_thread([&] {
      try {
        router::RoutingPolicy rp(policy, K, self, o.route_batch, router::parse_quota_base(o.adaptive_quota),
                                 o.route_threshold);
        // Balanced/adaptive route a batch of b queries at once (RoutingPolicy::choose_batch:
        // the queries nearest a partition boundary are the ones moved when a computenode's
        // limit is reached); the others one query at a time.
        const size_t gather = need_done && (policy == router::Policy::Balanced || policy == router::Policy::Adaptive)
                                  ? o.route_batch
                                  : 1;
        std::vector<uint32_t> batch_pos, ranks(gather * K);
        std::vector<const uint32_t*> ranked;
        std::vector<float> regret, scores(K);
        std::vector<char> msg(sizeof(QueryMsg) + 4ull * p.dim);
        uint64_t batch_no = 0;
        for (size_t i = 0; !stop.load();) {
          batch_pos.clear();
          while (batch_pos.size() < gather && !stop.load()) {
            if (items.empty() || (i >= items.size() && (min_seconds <= 0 || Clock::now() >= deadline))) break;
            // Flow control: do not run far ahead of the workers.
            while (ex.queue_len(phase) > 2ull * o.route_threshold + 64 && !stop.load())
              std::this_thread::sleep_for(std::chrono::microseconds(100));
            batch_pos.push_back(items[i % items.size()]);
            ++i;
          }
          if (batch_pos.empty()) break;
          pr.input += batch_pos.size();
          std::vector<uint32_t> targets(batch_pos.size(), self);
          if (need_done) {
            ranked.clear();
            regret.clear();
            for (size_t x = 0; x < batch_pos.size(); ++x) {
              const float* q = wl.queries.row(batch_pos[x]);
              uint32_t* r = ranks.data() + x * K;
              oracle.rank(q, r, scores.data());
              std::stable_partition(r, r + K, [&](uint32_t cn) { return !ex.gone(cn); });  // gone: last resort
              ranked.push_back(r);
              regret.push_back(scores[r[1]] - scores[r[0]]);  // need_done: K >= 2
            }
            targets = rp.choose_batch(ranked, regret);
            for (uint32_t& t : targets)
              if (ex.gone(t)) t = self;
          }
          for (size_t x = 0; x < batch_pos.size(); ++x) {
            const uint32_t pos = batch_pos[x], target = targets[x];
            if (target == self) {
              ex.push(phase, Item{pos, false, {}});
            } else {
              QueryMsg m{kQueryMsg, phase, pos, self, p.dim};
              std::memcpy(msg.data(), &m, sizeof m);
              std::memcpy(msg.data() + sizeof m, wl.queries.row(pos), 4ull * p.dim);
              relay.forward(target, msg.data(), msg.size());
              ++pr.routed_away;
              ++pr.routed_to[target];
            }
          }
          if (need_done && rp.batch_full()) {
            uint64_t mine = ex.queue_len(phase);
            ProgressMsg pm{kProgressMsg, phase, batch_no++, mine};
            relay.broadcast(&pm, sizeof pm);
            if (policy == router::Policy::Adaptive) {
              // The paper's computenodes broadcast their queue length periodically: while
              // this router waits for its queue to drain, the others keep sending to it, so
              // they hear how long it is every kProgressEvery instead of only after its next
              // batch (a slow computenode would otherwise look as short as it last was).
              auto next = Clock::now() + kProgressEvery;
              while (ex.queue_len(phase) > o.route_threshold && !stop.load()) {
                std::this_thread::sleep_for(std::chrono::microseconds(100));
                if (Clock::now() >= next) {
                  pm.queue_len = ex.queue_len(phase);
                  relay.broadcast(&pm, sizeof pm);
                  next = Clock::now() + kProgressEvery;
                }
              }
            }
            std::vector<uint64_t> prog = ex.progress();
            prog[self] = mine;
            for (uint32_t cn = 0; cn < K; ++cn)  // a gone computenode gets no quota
              if (ex.gone(cn)) prog[cn] = uint64_t{1} << 40;
            rp.end_batch(prog);
            spdlog::debug("routing batch {}: queue lengths [{}], next limits [{}]", batch_no - 1, fmt::join(prog, ", "),
                          fmt::join(rp.limits(), ", "));
          }
        }
        if (need_done)
          for (uint32_t cn = 0; cn < K; ++cn) {
            if (cn == self || ex.gone(cn)) continue;
            DoneMsg dm{kDoneMsg, phase, pr.routed_to[cn]};
            relay.forward(cn, &dm, sizeof dm);
          }
      } catch (...) {
        router_error = std::current_exception();
        stop.store(true);
      }
      router_done.store(true);
    });
    try {
      parallel(c, o.threads, stop, [&](uint32_t t, fabric::Endpoint& ep) {
        compute::Scheduler s(ep);
        Worker w(g, s, p.seed + t);
        std::vector<PerQuery> local;
        std::vector<OpContext> ctxs(o.coroutines);
        for (auto& x : ctxs) {
          x.mode = o.mode;
          x.node_cache = ncache.get();
          x.trace = traces[t].get();
          x.measured = is_measured;
        }
        auto next_note = Clock::now() + std::chrono::seconds(2);
        auto loop = [&](OpContext& ctx) -> compute::Task<void> {
          Item it;
          for (;;) {
            if (stop.load()) co_return;
            if (!ex.pop(phase, it)) {
              if (ex.finished(phase, self, need_done, router_done.load())) co_return;
              // Waiting on peers' messages performs no remote operation, so nothing else here
              // would notice a memnode the heartbeat found dead (a partition): the graph spans
              // every memnode, so this run cannot go on without it.
              for (uint16_t m = 0; m < c.memnodes().size(); ++m)
                if (!c.alive(m))
                  throw fabric::FabricError("memnode " + std::to_string(m) + " (" + c.memnodes()[m].address +
                                            ") is gone while waiting for routed queries: " + c.dead_reason(m));
              note_progress();  // also while idle: waiting on a slow peer is not being stuck
              if (Clock::now() > next_note) {
                spdlog::debug("waiting: router {}, {}", router_done.load() ? "done" : "busy", ex.describe(phase));
                next_note = Clock::now() + std::chrono::seconds(2);
              }
              co_await s.yield();
              continue;
            }
            const float* qv = it.vec.empty() ? wl.queries.row(it.pos) : it.vec.data();
            ctx.io = compute::IoStats{};
            ctx.search = SearchStats{};
            auto q0 = Clock::now();
            std::vector<Neighbor> res = co_await w.search(qv, o.k, ef, ctx);
            float lat = static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - q0).count());
            ex.served(phase);
            answered.fetch_add(1);
            note_progress();
            const int32_t* gt = wl.groundtruth.row(it.pos);
            uint32_t hits = 0;
            for (const auto& r : res)
              for (uint32_t j = 0; j < o.k; ++j)
                if (static_cast<uint32_t>(gt[j]) == r.label) {
                  ++hits;
                  break;
                }
            local.push_back({lat, static_cast<float>(hits) / static_cast<float>(o.k), ctx.io, ctx.search});
          }
        };
        for (auto& ctx : ctxs) s.spawn(loop(ctx));
        s.run();
        if (traces[t]) traces[t]->flush();
        std::lock_guard gd(mu);
        out.insert(out.end(), local.begin(), local.end());
      });
    } catch (...) {
      stop.store(true);
      router_thread.join();
      throw;
    }
    router_thread.join();
    if (router_error) std::rethrow_exception(router_error);
    pr.seconds = secs_since(t0);
    pr.received = ex.received(phase);
    pr.bounced = ex.bounced(phase);
    return pr;
  };

  json report = {{"mode", "shine"}, {"kind", "query"}, {"provider", rc.provider}, {"workload", o.workload},
                 {"distribution", wl.distribution}, {"k", o.k}, {"num_cns", K}, {"threads", o.threads},
                 {"coroutines", o.coroutines}, {"read_mode", o.mode == ReadMode::Batch ? "batch" : "per-read"},
                 {"memnodes", c.memnodes().size()}, {"routing", router::policy_name(policy)},
                 {"route_batch", o.route_batch}, {"route_threshold", o.route_threshold},
                 {"adaptive_quota", o.adaptive_quota},
                 {"cache", {{"enabled", ncache != nullptr}, {"capacity_bytes", cc.capacity_bytes},
                            {"capacity_entries", ncache ? ncache->capacity_entries() : 0},
                            {"index_bytes", idx_bytes}, {"admit_probability", o.admit_probability}}},
                 {"partition", partition},
                 {"index", {{"dim", p.dim}, {"m", p.m}, {"ef_construction", p.ef_construction},
                            {"metric", std::string(to_string(p.metric))},
                            {"distance_kernel", g.distance().kernel_name()}}}};
  uint32_t phase = 0;
  relay.barrier(120);  // the run's first barrier: every computenode must come
  if (wl.warmup_count > 0) {  // every computenode runs the warm-up phase (maybe with no input)
    std::vector<PerQuery> ignored;
    auto wr = run_phase(phase++, warm, o.ef_search.front(), 0, false, ignored);
    spdlog::info("warm-up: {} queries answered here in {:.2f} s", ignored.size(), wr.seconds);
  }
  for (uint32_t ef : o.ef_search) {
    relay.barrier();  // the measured part starts together (after everyone's warm-up)
    cache::NodeCacheStats before = ncache ? ncache->stats() : cache::NodeCacheStats{};
    std::vector<PerQuery> rows;
    const double cpu0 = process_cpu_seconds();
    PhaseResult pr = run_phase(phase++, measured, ef, o.repeat_seconds, true, rows);
    const double cpu_secs = process_cpu_seconds() - cpu0;
    cache::NodeCacheStats cs = ncache ? minus(ncache->stats(), before) : cache::NodeCacheStats{};
    std::vector<float> lat;
    double recall = 0;
    compute::IoStats io;
    SearchStats ss;
    for (auto& r : rows) {
      lat.push_back(r.latency_us);
      recall += r.recall;
      io += r.io;
      ss.visited += r.ss.visited;
      ss.hops += r.ss.hops;
      ss.skipped += r.ss.skipped;
    }
    if (lat.size() > 8192) {  // at most 8192 latencies per computenode travel (an even subsample)
      std::vector<float> sub;
      for (size_t i = 0; i < 8192; ++i) sub.push_back(lat[i * lat.size() / 8192]);
      lat.swap(sub);
    }
    json mine = {{"cn_id", self}, {"queries", rows.size()}, {"seconds", pr.seconds}, {"recall_sum", recall},
                 {"io", io_json(io)}, {"visited", ss.visited}, {"hops", ss.hops}, {"skipped", ss.skipped},
                 {"input", pr.input}, {"routed_away", pr.routed_away}, {"received", pr.received},
                 {"bounced", pr.bounced}, {"routed_to", pr.routed_to}, {"cache", cache_json(cs)},
                 {"cpu_seconds", cpu_secs},
                 {"latencies_us", lat}};
    compute::RelayClient::Release rel = relay.barrier();
    board.publish(rel.generation, mine.dump());
    if (self != 0) continue;
    std::vector<float> all_lat;
    double max_secs = 0, recall_sum = 0;
    uint64_t queries = 0, visited = 0, hops = 0, skipped = 0, lookups = 0, chits = 0;
    compute::IoStats all_io;
    json per_cn = json::array();
    std::vector<std::string> texts = board.gather(rel.generation, 60, rel.gone);
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
      std::lock_guard gl(gone_mu);
      gone_now = gone_list;
    }
    json run = {{"ef_search", ef},
                {"queries", queries},
                {"seconds", max_secs},
                {"qps", static_cast<double>(queries) / std::max(max_secs, 1e-9)},
                {"recall", recall_sum / nq},
                {"latency_us", {{"p50", percentile(all_lat, 0.5)}, {"p99", percentile(all_lat, 0.99)}, {"mean", mean_lat}}},
                {"per_query",
                 {{"visited", static_cast<double>(visited) / nq},
                  {"hops", static_cast<double>(hops) / nq},
                  {"reads", static_cast<double>(all_io.reads) / nq},
                  {"bytes", bytes_per_q},
                  {"doorbells", static_cast<double>(all_io.doorbells) / nq},
                  {"vector_bytes", static_cast<double>(visited) / nq * static_cast<double>(g.layout().vector_read_bytes())}}},
                {"network_bound_qps", {{"56Gbps", 56e9 / 8 / std::max(bytes_per_q, 1.0)}, {"100Gbps", 100e9 / 8 / std::max(bytes_per_q, 1.0)}}},
                {"cache_hit_rate", lookups ? static_cast<double>(chits) / static_cast<double>(lookups) : 0.0},
                {"invalid_pointers_skipped", skipped},
                {"computenodes_gone", gone_now},
                {"per_cn", per_cn}};
    report["runs"].push_back(run);
  }
  if (o.on_report) o.on_report(report);
  return report;
}

}  // namespace dmhnsw::shine
