#include "compute/shine/options.hpp"

namespace dmhnsw::shine {

void SearchOptions::add_flags(CLI::App& cmd, const std::string& cache_ratio_also) {
  cmd.add_option("--threads", threads, "shine: worker threads (each with its own endpoint)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--coroutines", coroutines, "shine: queries in flight per thread (C++20 coroutines)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--cache-ratio", cache_ratio,
                 "shine: node cache per computenode as a share of the index size, e.g. 0.05 (0: no cache)" +
                     cache_ratio_also)
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--cache-bytes", cache_bytes,
                 "shine: node cache per computenode in bytes, e.g. 64MiB (overrides --cache-ratio; what it holds: "
                 "--cache-holds)")
      ->transform(CLI::AsSizeValue(false));
  cmd.add_option("--cache-holds", cache_holds,
                 "shine: what the node cache holds: vectors, neighbour lists (each dropped once an insert may have "
                 "changed it: for read-mostly indexes), or auto: lists when searching over codes (--rerank), where a "
                 "hop reads a list and no vector, else vectors")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "vectors", "lists"}));
  cmd.add_flag("--in-place,!--no-in-place", in_place,
               "where the provider maps the memnodes' regions into this process (cxl), read them where they lie "
               "instead of copying them out (--no-in-place: copy, as over a network). shine: neighbour lists and "
               "vectors; dhnsw: a sub-HNSW without overflow records is searched in its block, no fetch, no copy")
      ->capture_default_str();
  cmd.add_option("--admit-probability", admit_probability, "shine: level-0 nodes enter the cache with this probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--upper-ef", upper_ef,
                 "shine: ef of the search at the levels above 0 (1: HNSW's greedy descent); a wider descent "
                 "keeps recall after heavy churn at a few more READs per query")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd.add_option("--rerank", rerank,
                 "with an index built or imported with --codes, compare vectors by their codes and re-rank each query's best "
                 "R candidates with their full vectors (0: full vectors throughout). shine: by this computenode's "
                 "copy of every node's code (no vector READs); dhnsw: sub-HNSWs fetched with codes instead of "
                 "vectors (R at most 256)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  cmd.add_option("--routing", routing.policy,
                 "shine: none: every computenode answers its own queries; best-fit: to the computenode whose "
                 "partition fits; balanced: best fit within equal quotas per batch; adaptive: quotas from the "
                 "computenodes' queue lengths (paper Algorithm 2)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "best-fit", "balanced", "adaptive"}));
  cmd.add_option("--route-batch", routing.batch, "shine routing: b, queries per routing batch (balanced, adaptive)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--route-threshold", routing.threshold,
                 "shine adaptive routing: t, a working queue longer than this is backlog (query: the router "
                 "waits while its own queue is longer)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--kmeans-seed", routing.kmeans_seed,
                 "shine routing: seed of the balanced k-means (the same on every computenode)")
      ->capture_default_str();
  cmd.add_option("--oracle", routing.oracle,
                 "shine routing: how a query's computenode is ranked: balanced: distance to the partition "
                 "centroids plus per-partition offsets that split the partitioned sample evenly; nearest: "
                 "distance to the centroids only (the paper)")
      ->capture_default_str()
      ->check(CLI::IsMember({"balanced", "nearest"}));
  cmd.add_option("--adaptive-quota", routing.quota,
                 "shine adaptive routing: what the queue weights scale; demand: the batch's best-fit counts "
                 "(equal queues give best-fit, a computenode with a longer queue keeps less); even: b/K per "
                 "computenode (paper Algorithm 2; equal queues give balanced routing)")
      ->capture_default_str()
      ->check(CLI::IsMember({"demand", "even"}));
}

}  // namespace dmhnsw::shine
