#pragma once
// d-HNSW query engine (paper sections 4.3-4.4, appendix A.1): queries in batches; the cached
// meta-HNSW picks each query's top-b partitions; each needed sub-HNSW is fetched once per
// batch (most-demanded first, several per doorbell, together with the overflow it uses);
// an LRU keeps c deserialized sub-HNSWs across batches; a fetch stage, a deserialize stage
// and a search stage run on their own threads with bounded queues, so fetching one batch
// overlaps searching the previous one; each query's top-k is merged across its partitions.
#include <faiss/IndexHNSW.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/index.hpp"

namespace dmhnsw::dhnsw {

inline constexpr uint32_t kMaxRerank = 256;  // --rerank's bound: a query's candidates fit one doorbell

struct EngineOptions {
  uint32_t k = 10;
  uint32_t batch = 1000;            // B: queries per batch
  uint32_t max_wait_us = 1000;      // a batch closes this long after its first query arrived
  double arrival_qps = 0;           // > 0: queries arrive at this rate (else all at once)
  uint32_t probe = 2;               // b: partitions searched per query (at most, with probe_ratio)
  /// >= 1: of its top b partitions a query searches those whose centroid is within this ratio of
  /// the nearest one's distance (L2, not squared; SPANN's query-side pruning); 0: all b.
  double probe_ratio = 0;
  uint32_t ef_search = 64;          // efSearch in the sub-HNSWs
  uint32_t meta_ef_search = 64;     // efSearch in the meta-HNSW (at least b)
  int64_t cache_subs = -1;          // c: deserialized sub-HNSWs kept across batches (-1: cache_ratio x P)
  double cache_ratio = 0.10;
  uint32_t doorbell_subs = 8;       // sub-HNSW fetches posted with one doorbell
  uint64_t max_read_bytes = 4u << 20;  // a fetch larger than this is split into several READs
  uint32_t queue_depth = 4;         // items between two stages
  uint32_t search_threads = 0;      // OpenMP threads of a Faiss search (0: every core)
  bool regroup = true;              // false: each query fetches its own partitions (no cache)
  bool doorbell = true;             // false: one READ per post, each waited for
  bool pipeline = true;             // false: the stages of a batch run in sequence on one thread
  /// Where the provider maps the memnodes' regions (cxl): a sub-HNSW without overflow records is
  /// searched where it lies (no READ, no deserialized copy; its seqlock version checked after),
  /// one with overflow records is copied out of the mapping and deserialized. false: fetched.
  bool in_place = true;
  int64_t ack_slot = -1;            // computenode id: acknowledge epochs in the control block (-1: no)
  /// > 0: search over the sub-HNSWs' codes (an index built with --codes): fetches skip the
  /// vectors, and each query's best `rerank` candidates are compared again with their vectors,
  /// READ in doorbells of up to 256 READs.
  uint32_t rerank = 0;
};

struct BatchStats {
  uint32_t queries = 0;
  uint64_t needed = 0, fetched = 0, cache_hits = 0, bytes = 0, reads = 0, doorbells = 0;
  // Seqlock checks (live descriptor READs around the fetches; not counted in reads/doorbells/
  // bytes above) and fetches repeated because a commit moved the version (their READs and bytes
  // are in reads/bytes: they crossed the network).
  uint64_t version_reads = 0, version_doorbells = 0, refetches = 0;
  uint64_t buffered_scanned = 0;  // insert-buffer entries compared while a rebuild runs
  // Searches over codes: candidates re-ranked, the vector READs and bytes that took (not in
  // reads/bytes above; a vector several queries of the batch re-rank is read once, one that
  // came with the fetch in an overflow record not at all) and their doorbells.
  uint64_t reranked = 0, rerank_reads = 0, rerank_bytes = 0, rerank_doorbells = 0;
  uint64_t epoch = 0;             // the epoch the batch was planned with
  uint64_t probed = 0;            // partitions searched, summed over the queries
  // Where the regions are mapped (EngineOptions::in_place): sub-HNSWs searched where they lie,
  // those copied out of the mapping instead (overflow records), and in-place searches repeated
  // because a commit moved the version meanwhile, and the bytes of the fetches they replace.
  // Written by the search stage only; in_place_bytes is added to bytes once the batch is done
  // (the fetch stage writes bytes meanwhile).
  uint64_t in_place = 0, in_place_copies = 0, in_place_retries = 0, in_place_bytes = 0;
  double seconds = 0;  // from the batch's close to its last query's answer
  double meta_s = 0, fetch_s = 0, deserialize_s = 0, search_s = 0, rerank_s = 0;
};

struct RunStats {
  std::vector<BatchStats> batches;
  double seconds = 0;  // wall time of the whole run
  double meta_s = 0, fetch_s = 0, deserialize_s = 0, search_s = 0, rerank_s = 0;  // busy time per stage
  uint64_t cache_capacity = 0, cache_evictions = 0;
};

class Engine {
 public:
  Engine(fabric::Cluster& c, const Index& index, EngineOptions o);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  /// Answers n queries (n x dim, row-major) into answers[0..n). Throws on a failed fetch
  /// (naming the partition and the memnode) after every stage stopped.
  RunStats run(const float* queries, size_t n, std::vector<Answer>& answers);
  const EngineOptions& options() const { return o_; }
  void set_ef_search(uint32_t ef);
  uint64_t cache_capacity() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  EngineOptions o_;
};

}  // namespace dmhnsw::dhnsw
