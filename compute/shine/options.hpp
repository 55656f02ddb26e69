#pragma once
// How a computenode searches a shine index: one definition of each idea (its flag, its
// default) for every command that searches, `query` and `serve` alike.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "common/fabric/transport.hpp"

namespace dmhnsw::shine {

/// Routing of queries between computenodes by logical partition (router/policy.hpp).
struct RoutingOptions {
  std::string policy = "none";    // none | best-fit | balanced | adaptive
  uint32_t batch = 1000;          // b: queries per routing batch (balanced, adaptive)
  uint32_t threshold = 1000;      // t: a working queue no longer than this is not backlog (adaptive)
  uint64_t kmeans_seed = 1;       // the partitioning's seed: the same on every computenode
  std::string oracle = "balanced";  // balanced | nearest (router::balance_offsets)
  // adaptive: what the queue weights scale (router::QuotaBase). demand: each computenode's
  // first-choice demand, so with no backlog queries go to their best fit; even: equal shares
  // (the paper's Algorithm 2), which swing a whole batch to the shorter queue.
  std::string quota = "demand";
};

/// Whether `ep` maps the memnodes' regions into this process (cxl): the first bytes of memnode
/// 0's, its header, are mapped whenever any are.
inline bool maps_regions(const fabric::Endpoint& ep) { return ep.mapped(RemotePtr(0, 0), 8) != nullptr; }

struct SearchOptions {
  uint32_t threads = 2;        // worker threads, each with its own endpoint
  uint32_t coroutines = 4;     // queries in flight per thread
  double cache_ratio = 0;      // node cache as a share of the index size (0 and cache_bytes 0: none)
  uint64_t cache_bytes = 0;    // node cache in bytes (overrides cache_ratio)
  double admit_probability = 0.01;  // level-0 nodes enter the cache with this probability
  // What the node cache holds: vectors (they never change), neighbour lists (read afresh after
  // any insert; what a search over codes reads on every hop), or auto: lists when the search
  // runs over codes (rerank > 0), vectors otherwise.
  std::string cache_holds = "auto";
  // Where the provider maps the memnodes' regions (cxl): lists and vectors read where they lie
  // (Endpoint::mapped), as hnswlib reads its own memory, instead of copied out by READs.
  bool in_place = true;
  // ef of the search at each level above 0 (1: the greedy descent of HNSW). A wider descent
  // reaches level 0 with that many starting points: it keeps recall on a graph worn by
  // steady churn (experiments/churn), at a few more READs per query.
  uint32_t upper_ef = 1;
  // With an index built with --codes: 0 reads full vectors throughout; R > 0 compares nodes by
  // this computenode's copy of their codes (no READ) and re-reads the best R exactly.
  uint32_t rerank = 0;
  RoutingOptions routing;

  /// Whether the node cache holds neighbour lists (else vectors).
  bool cache_lists() const { return cache_holds == "lists" || (cache_holds == "auto" && rerank > 0); }
  /// Whether searches read in place over `ep`: --in-place, and the provider maps the regions.
  bool reads_in_place(const fabric::Endpoint& ep) const { return in_place && maps_regions(ep); }
  /// The node cache's capacity for an index of `index_bytes`.
  uint64_t cache_capacity(uint64_t index_bytes) const {
    return cache_bytes > 0 ? cache_bytes : static_cast<uint64_t>(cache_ratio * static_cast<double>(index_bytes));
  }
  /// Registers --threads, --coroutines, --cache-ratio, --cache-bytes, --cache-holds, --in-place, --admit-probability, --upper-ef, --rerank,
  /// --routing, --route-batch, --route-threshold, --kmeans-seed, --oracle and --adaptive-quota on
  /// `cmd`. `cache_ratio_also` ends --cache-ratio's help (another mode may read it too).
  void add_flags(CLI::App& cmd, const std::string& cache_ratio_also = "");
};

}  // namespace dmhnsw::shine
