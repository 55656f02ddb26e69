// shine-route-sim: what each routing would do to the computenodes' node caches, offline.
//
// Connects to the memnodes serving a shine index (like a computenode, over the real
// transport), runs every distinct query of a workload once and records the node accesses of
// its search. Then feeds those accesses, in workload order, to K simulated computenode caches
// (the real cache/node_cache.hpp policy) under several routings, and to one cache of the
// summed capacity (CHR_max), and prints CHR, CHR_max, CSP, the level-0 hit rate and the
// load per routing:
//   none      query i to computenode i mod K (no routing);
//   nearest   best fit by the paper's oracle: the nearest partition centroid;
//   balanced  best fit by the balanced oracle (centroid distance + offsets, --oracle balanced);
//   bound     a routing chosen with every query's accesses known in advance (no oracle can
//             know them): queries clustered by the level-0 nodes they share, each computenode
//             within 5 % of an even load. An estimate of what any per-query routing can reach.
// A query's accesses do not depend on where it runs or on caching, so replaying them is
// exact up to the interleaving of concurrent queries. Routing is best-fit without quotas;
// the live adaptive policy moves part of the load to second choices.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/version.hpp"
#include "cache/node_cache.hpp"
#include "cache/trace.hpp"
#include "common/fabric/cluster.hpp"
#include "common/json_file.hpp"
#include "common/units.hpp"
#include "common/workload.hpp"
#include "compute/shine/graph.hpp"
#include "compute/shine/sample.hpp"
#include "router/partition.hpp"
#include "router/policy.hpp"

using namespace dmhnsw;
using nlohmann::json;

namespace {

struct Accesses {
  std::vector<uint64_t> keys;
  std::vector<uint8_t> levels;
};

struct SimResult {
  uint64_t accesses = 0, hits = 0, shared_hits = 0, level0 = 0, level0_hits = 0;
  std::vector<uint64_t> load;  // queries per computenode (whole stream)
  double chr() const { return accesses ? double(hits) / double(accesses) : 0.0; }
  double chr_max() const { return accesses ? double(shared_hits) / double(accesses) : 0.0; }
  double csp() const { return chr_max() > 0 ? 1.0 - chr() / chr_max() : 0.0; }
  double level0_hit() const { return level0 ? double(level0_hits) / double(level0) : 0.0; }
  double load_max_over_mean() const {
    const double total = std::accumulate(load.begin(), load.end(), 0.0);
    return total > 0 ? double(*std::max_element(load.begin(), load.end())) * double(load.size()) / total : 1.0;
  }
};

/// Replays the stream: query j (distinct query stream[j]) on computenode route[stream[j]]
/// (route empty: j mod K). Records of the first `warmup` queries fill caches, not counted.
SimResult simulate(const std::vector<Accesses>& acc, const std::vector<uint32_t>& stream, uint64_t warmup,
                   const std::vector<uint32_t>& route, uint32_t K, const cache::NodeCacheConfig& cfg,
                   bool by_position = false) {
  std::vector<std::unique_ptr<cache::NodeCache>> caches;
  for (uint32_t i = 0; i < K; ++i) {
    cache::NodeCacheConfig c = cfg;
    c.seed = cfg.seed + i;
    caches.push_back(std::make_unique<cache::NodeCache>(c));
  }
  cache::NodeCacheConfig sc = cfg;
  sc.capacity_bytes = cfg.capacity_bytes * K;
  cache::NodeCache shared(sc);
  std::vector<float> vec(cfg.dim, 0.0f);  // the vectors' values do not matter to the policy
  uint64_t label = 0;
  SimResult r;
  r.load.assign(K, 0);
  for (size_t j = 0; j < stream.size(); ++j) {
    const uint32_t cn = route.empty() ? static_cast<uint32_t>(j % K) : by_position ? route[j] : route[stream[j]];
    ++r.load[cn];
    cache::NodeCache& mine = *caches[cn];
    const Accesses& a = acc[stream[j]];
    const bool measured = j >= warmup;
    for (size_t i = 0; i < a.keys.size(); ++i) {
      const RemotePtr key = RemotePtr::from_raw(a.keys[i]);
      const bool hit = mine.lookup(key, vec.data(), &label);
      if (!hit) mine.admit(key, a.levels[i], vec.data(), 0);
      const bool shared_hit = shared.lookup(key, vec.data(), &label);
      if (!shared_hit) shared.admit(key, a.levels[i], vec.data(), 0);
      if (!measured) continue;
      ++r.accesses;
      r.hits += hit;
      r.shared_hits += shared_hit;
      if (a.levels[i] == 0) {
        ++r.level0;
        r.level0_hits += hit;
      }
    }
  }
  return r;
}

/// Queries clustered by shared level-0 accesses, starting from `route`: each level-0 node is
/// owned by the computenode whose queries touch it most, each query moves to the computenode
/// owning most of its accesses (greedily by score, at most slack x an even share each).
std::vector<uint32_t> access_bound(const std::vector<Accesses>& acc, std::vector<uint32_t> route, uint32_t K,
                                   double slack, int rounds) {
  const size_t n = acc.size();
  const size_t cap = static_cast<size_t>(slack * double(n) / K) + 1;
  for (int round = 0; round < rounds; ++round) {
    std::unordered_map<uint64_t, std::vector<uint32_t>> touches;
    for (size_t q = 0; q < n; ++q)
      for (size_t i = 0; i < acc[q].keys.size(); ++i)
        if (acc[q].levels[i] == 0) {
          auto& t = touches[acc[q].keys[i]];
          if (t.empty()) t.assign(K, 0);
          ++t[route[q]];
        }
    std::unordered_map<uint64_t, uint32_t> owner;
    for (const auto& [key, t] : touches)
      owner[key] = static_cast<uint32_t>(std::max_element(t.begin(), t.end()) - t.begin());
    std::vector<std::tuple<int64_t, uint32_t, uint32_t>> pairs;  // (-score, query, cn)
    for (size_t q = 0; q < n; ++q) {
      std::vector<int64_t> score(K, 0);
      for (size_t i = 0; i < acc[q].keys.size(); ++i)
        if (acc[q].levels[i] == 0) ++score[owner[acc[q].keys[i]]];
      for (uint32_t c = 0; c < K; ++c) pairs.emplace_back(-score[c], static_cast<uint32_t>(q), c);
    }
    std::sort(pairs.begin(), pairs.end());
    std::vector<size_t> load(K, 0);
    std::vector<int64_t> next(n, -1);
    for (const auto& [neg, q, c] : pairs)
      if (next[q] < 0 && load[c] < cap) {
        next[q] = c;
        ++load[c];
      }
    size_t moved = 0;
    for (size_t q = 0; q < n; ++q) {
      moved += route[q] != static_cast<uint32_t>(next[q]);
      route[q] = static_cast<uint32_t>(next[q]);
    }
    if (moved == 0) break;
  }
  return route;
}

struct Flags {
  std::string memnodes, provider = "shm", token_file, wl_path, json_path;
  uint32_t K = 4, k = 10, ef = 64, bound_rounds = 15, route_batch = 200;
  double cache_ratio = 0.05, admit = 0.01;
  uint64_t kmeans_seed = 1, seed = 7;

  void add(CLI::App& app) {
    app.add_option("--memnodes", memnodes, "control addresses of every memnode, HOST:PORT[,HOST:PORT...]")->required();
    app.add_option("--provider", provider, "fabric: " + fabric::provider_help())
        ->capture_default_str()
        ->check(CLI::IsMember(fabric::provider_names()));
    app.add_option("--token-file", token_file, "file holding the cluster token (else the DMHNSW_TOKEN variable)");
    app.add_option("--workload", wl_path, "workload file from tools/workload (warm-up queries fill the caches)")->required();
    app.add_option("--num-cns", K, "K, simulated computenodes")->capture_default_str()->check(CLI::Range(1u, 64u));
    app.add_option("--k", k, "neighbours per query")->capture_default_str();
    app.add_option("--ef-search", ef, "efSearch")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--cache-ratio", cache_ratio, "cache per computenode, share of the index size")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--admit-probability", admit, "level-0 admission probability")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--kmeans-seed", kmeans_seed, "seed of the balanced k-means")->capture_default_str();
    app.add_option("--seed", seed, "seed of the simulated caches")->capture_default_str();
    app.add_option("--bound-rounds", bound_rounds, "rounds of the access clustering behind 'bound' (0: skip it)")->capture_default_str();
    app.add_option("--route-batch", route_batch, "b of the quota routings (0: skip them)")->capture_default_str();
    app.add_option("--json", json_path, "also write the results here");
  }
};

/// Every distinct query searched once over the served index, its node accesses recorded.
std::vector<Accesses> record_accesses(const shine::Graph& g, fabric::Endpoint& ep, uint32_t dim,
                                      const std::vector<const float*>& queries, uint32_t k, uint32_t ef) {
  cache::NodeCacheConfig probe;  // the search records accesses only through a node cache
  probe.capacity_bytes = 1u << 20;
  probe.dim = dim;
  cache::NodeCache probe_cache(probe);
  std::vector<Accesses> acc(queries.size());
  compute::Scheduler s(ep);
  shine::Worker w(g, s, 1);
  shine::OpContext ctx;
  ctx.node_cache = &probe_cache;
  std::vector<cache::TraceRecord> recs;
  ctx.accesses = &recs;
  for (size_t q = 0; q < queries.size(); ++q) {
    recs.clear();
    compute::run_sync(s, w.search(queries[q], k, ef, ctx));
    for (const auto& r : recs) {
      acc[q].keys.push_back(r.key);
      acc[q].levels.push_back(r.level);
    }
  }
  return acc;
}

// Quotas: every computenode routes its own share (stream position j mod K) in batches of b
// through RoutingPolicy with balanced limits b/K (adaptive routing with equal queues), the
// batch placed by regret (choose_batch) or, with equal regrets, in arrival order.
std::vector<uint32_t> quota_route(const router::Oracle& balanced, const std::vector<uint32_t>& stream,
                                  const std::vector<const float*>& queries, uint32_t K, uint32_t route_batch,
                                  bool by_regret) {
  std::vector<uint32_t> per_pos(stream.size());
  std::vector<uint32_t> ranks(static_cast<size_t>(route_batch) * K);
  std::vector<float> sc(K);
  for (uint32_t origin = 0; origin < K; ++origin) {
    router::RoutingPolicy rp(router::Policy::Balanced, K, origin, route_batch);
    std::vector<size_t> batch;
    std::vector<const uint32_t*> ranked;
    std::vector<float> regret;
    for (size_t j0 = origin; j0 < stream.size(); j0 += static_cast<size_t>(route_batch) * K) {
      batch.clear();
      ranked.clear();
      regret.clear();
      for (size_t j = j0; j < stream.size() && batch.size() < route_batch; j += K) {
        uint32_t* r = ranks.data() + batch.size() * K;
        balanced.rank(queries[stream[j]], r, sc.data());
        batch.push_back(j);
        ranked.push_back(r);
        regret.push_back(by_regret ? sc[r[1]] - sc[r[0]] : 0.0f);
      }
      const std::vector<uint32_t> targets = rp.choose_batch(ranked, regret);
      for (size_t x = 0; x < batch.size(); ++x) per_pos[batch[x]] = targets[x];
      rp.end_batch({});
    }
  }
  return per_pos;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shine-route-sim: CHR, CHR_max and CSP of K computenode caches under each routing (none, nearest, "
               "balanced, and a bound with the queries' accesses known in advance), from one pass of a workload "
               "over a stored shine index"};
  app.set_version_flag("--version", dmhnsw::version_line("shine-route-sim"));
  Flags f;
  f.add(app);
  CLI11_PARSE(app, argc, argv);
  const uint32_t K = f.K;

  try {
    fabric::ClusterOptions co;
    co.provider = fabric::parse_provider(f.provider);
    co.memnodes = split_commas(f.memnodes);
    co.token = fabric::load_token(f.token_file);
    co.mode = fabric::Mode::Shine;
    auto cluster = fabric::connect_cluster(co);
    auto ep = cluster->make_endpoint(64u << 20);
    const shine::GraphParams gp = shine::format_or_attach(*cluster, *ep, nullptr);
    shine::Graph g(*cluster, gp);
    const uint64_t idx_bytes = shine::index_bytes(g, *ep);
    const shine::LevelSample smp = shine::sample_level(g, *ep, 1000, 100000, f.kmeans_seed);
    const Workload wl = read_workload(f.wl_path);
    if (wl.dim() != gp.dim)
      throw std::invalid_argument("--workload " + f.wl_path + ": queries have dim " + std::to_string(wl.dim()) +
                                  ", the index " + std::to_string(gp.dim));

    // ---- every distinct query once, its accesses recorded
    std::unordered_map<uint32_t, uint32_t> distinct;  // pool index -> distinct query
    std::vector<uint32_t> stream;
    std::vector<const float*> queries;
    for (uint64_t j = 0; j < wl.total(); ++j) {
      auto [it, fresh] = distinct.emplace(wl.pool_index[j], static_cast<uint32_t>(queries.size()));
      if (fresh) queries.push_back(wl.queries.row(j));
      stream.push_back(it->second);
    }
    const std::vector<Accesses> acc = record_accesses(g, *ep, gp.dim, queries, f.k, f.ef);
    double per_query = 0;
    for (const auto& a : acc) per_query += double(a.keys.size());
    per_query /= double(acc.size());

    // ---- routings
    router::BalancedKMeansOptions ko;
    ko.seed = f.kmeans_seed;
    const router::Clustering cl = router::balanced_kmeans(smp.vectors.data(), smp.size(gp.dim), gp.dim, K, gp.metric, ko);
    const router::Oracle nearest(cl.centroids, K, gp.dim, gp.metric);
    const router::Oracle balanced(cl.centroids, K, gp.dim, gp.metric, cl.offsets);
    std::vector<std::pair<std::string, std::vector<uint32_t>>> routings{{"none", {}}};
    std::vector<std::pair<std::string, std::vector<uint32_t>>> quota_routings;  // by stream position
    for (const auto* o : {&nearest, &balanced}) {
      std::vector<uint32_t> r(queries.size());
      for (size_t q = 0; q < queries.size(); ++q) r[q] = o->best(queries[q]);
      routings.emplace_back(o == &nearest ? "nearest" : "balanced", std::move(r));
    }
    if (f.route_batch > 0 && K > 1) {
      quota_routings.emplace_back("quota", quota_route(balanced, stream, queries, K, f.route_batch, false));
      quota_routings.emplace_back("quota-regret", quota_route(balanced, stream, queries, K, f.route_batch, true));
    }
    if (f.bound_rounds > 0 && K > 1)
      routings.emplace_back("bound", access_bound(acc, routings.back().second, K, 1.05, static_cast<int>(f.bound_rounds)));

    cache::NodeCacheConfig cfg;
    cfg.capacity_bytes = static_cast<uint64_t>(f.cache_ratio * double(idx_bytes));
    cfg.dim = gp.dim;
    cfg.admit_probability = f.admit;
    cfg.seed = f.seed;
    std::printf("shine-route-sim: %zu queries (%zu distinct, %llu warm-up), efSearch %u, %.0f node accesses per query\n",
                stream.size(), queries.size(), static_cast<unsigned long long>(wl.warmup_count), f.ef, per_query);
    std::printf("  %u computenodes, cache %.3f of the index (%llu MiB of %llu MiB each), level-0 admission %g\n", K,
                f.cache_ratio, static_cast<unsigned long long>(cfg.capacity_bytes >> 20),
                static_cast<unsigned long long>(idx_bytes >> 20), f.admit);
    std::printf("  %-13s %7s %8s %7s %9s %10s\n", "routing", "CHR", "CHR_max", "CSP", "L0 hits", "load max");
    json out = {{"workload", f.wl_path}, {"queries", stream.size()}, {"distinct", queries.size()},
                {"warmup", wl.warmup_count}, {"ef_search", f.ef}, {"num_cns", K}, {"cache_ratio", f.cache_ratio},
                {"cache_bytes", cfg.capacity_bytes}, {"index_bytes", idx_bytes}, {"admit_probability", f.admit},
                {"accesses_per_query", per_query}, {"routings", json::array()}};
    for (size_t i = 0; i < routings.size() + quota_routings.size(); ++i) {
      const bool by_position = i >= routings.size();
      const auto& [name, route] = by_position ? quota_routings[i - routings.size()] : routings[i];
      const SimResult r = simulate(acc, stream, wl.warmup_count, route, K, cfg, by_position);
      std::printf("  %-13s %6.1f%% %7.1f%% %6.1f%% %8.1f%% %9.2fx\n", name.c_str(), 100 * r.chr(), 100 * r.chr_max(),
                  100 * r.csp(), 100 * r.level0_hit(), r.load_max_over_mean());
      std::fflush(stdout);
      out["routings"].push_back({{"routing", name}, {"chr", r.chr()}, {"chr_max", r.chr_max()}, {"csp", r.csp()},
                                 {"level0_hit_rate", r.level0_hit()}, {"load", r.load},
                                 {"load_max_over_mean", r.load_max_over_mean()}, {"accesses", r.accesses}});
    }
    if (!f.json_path.empty()) write_json_file(f.json_path, out, "--json");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shine-route-sim: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
