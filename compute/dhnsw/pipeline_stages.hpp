#pragma once
// The d-HNSW engine's stages (paper section 4.4), which a run (pipeline.cpp) takes each batch
// through: open_batch plans it (the epoch watched, the insert buffer searched while a rebuild
// runs, the meta-HNSW, the live descriptors, the load plan against the cache), fetch_group
// fetches a doorbell group of the sub-HNSWs it needs, deserialize and search finish each one.
// The stages' bodies are in pipeline_stages.cpp.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/timing.hpp"
#include "compute/dhnsw/epoch_watcher.hpp"
#include "compute/dhnsw/pipeline.hpp"
#include "compute/dhnsw/planner.hpp"
#include "compute/dhnsw/sub_search.hpp"
#include "compute/dhnsw/subindex.hpp"

namespace dmhnsw::dhnsw {
namespace pipeline_detail {

/// A candidate of a search over codes: approximate distance, id, and where its vector is
/// (region offset on `memnode`, or `local` when it came with the fetch).
struct Candidate {
  float dist = 0;
  int64_t id = 0;
  uint16_t memnode = 0;
  uint64_t offset = 0;
  std::vector<float> local;
  uint64_t op = 0;  // the re-rank's READ of its vector
};

/// One batch on its way through the stages.
struct Job {
  size_t first = 0;  // index of the batch's first query in the run
  uint32_t n = 0;
  BatchPlan plan;
  std::map<uint32_t, std::shared_ptr<const SubIndex>> hits;  // cached entries, pinned at plan time
  std::map<uint32_t, SubDesc> live;  // live descriptors of the batch's sub-HNSWs, read at plan time
  std::shared_ptr<const Index> index;  // the epoch the batch was planned with
  Clock::time_point closed;
  size_t remaining = 0;  // entries not searched yet (search stage only)
  std::vector<std::vector<Candidate>> cands;  // per query of the batch, searches over codes only
  bool epoch_moved = false;  // planned with a new epoch: acknowledged once the batches before it are done
  BatchStats st;         // each stage writes its own fields before handing an item on
};

/// One sub-HNSW of a batch: fetched bytes, then deserialized.
struct Item {
  std::shared_ptr<Job> job;
  uint32_t entry = 0;
  fabric::Buffer buf;
  size_t len = 0;
  std::shared_ptr<const SubIndex> sub;
  SubDesc desc{};     // the live descriptor the fetched bytes match
  bool torn = false;  // no consistent copy within the retry budget: sanitized, not cached
  // Searched in place (EngineOptions::in_place): the sub's group and its live descriptor where
  // the provider maps them; nothing was fetched.
  const char* group = nullptr;
  const SubDesc* live = nullptr;
};

/// One sub-HNSW's answers for the queries of a plan entry: up to k per query.
struct Hits {
  uint32_t k = 0;
  std::vector<std::pair<float, int64_t>> r;  // k per query
  std::vector<uint32_t> found;               // per query
};

}  // namespace pipeline_detail

struct Engine::Impl {
  using Job = pipeline_detail::Job;
  using Item = pipeline_detail::Item;

  fabric::Cluster& c;
  EngineOptions o;
  EpochWatcher epochs;  // the epoch's index; a batch keeps the one it was planned with
  LruCache<SubIndex> cache;
  uint64_t max_fetch = 0, buf_bytes = 0;

  static constexpr uint32_t kParallelQueries = 8;
  int omp_threads = 1;

  Impl(fabric::Cluster& cl, const Index& ix, const EngineOptions& opts, size_t cap);

  /// Plans a batch of n queries from `first` (answers[first..] start with the insert buffer's
  /// matches while a rebuild runs).
  std::shared_ptr<Job> open_batch(const float* queries, size_t first, uint32_t n, fabric::Endpoint& ep,
                                  std::vector<Answer>& answers);
  /// Fetches the given entries of a batch (one doorbell, or one READ per post), each checked
  /// against its live descriptor (seqlock).
  std::vector<Item> fetch_group(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& entries,
                                fabric::Endpoint& ep);
  void deserialize(Item& it);
  /// Searches one sub-HNSW for the batch's queries that need it and merges their top-k (over
  /// codes: their best candidates). Returns true when this finished the batch.
  bool search(Item& it, const float* queries, std::vector<Answer>& answers);
  /// Over codes, once a batch's sub-HNSWs are searched: its candidates' vectors READ (in
  /// doorbells of up to a buffer's worth), compared exactly, each query's top-k kept.
  void rerank(Job& job, const float* queries, std::vector<Answer>& answers, fabric::Endpoint& ep);
  bool coded() const { return o.rerank > 0; }
  /// Where `ep` maps sub `d`'s group and live descriptor, and in-place searches are on: the
  /// item is searched there (Item::group, Item::live) and not fetched.
  bool take_in_place(Item& it, const Index& index, fabric::Endpoint& ep) const;

  // ---- one Engine::run: batches through the stages, in sequence or pipelined (pipeline.cpp)
  struct Run;
  RunStats run(const float* queries, size_t n, std::vector<Answer>& answers);
  void run_in_sequence(Run& r);
  void run_pipelined(Run& r);

 private:
  static std::string sub_name(const Index& index, uint32_t id);
  /// READs the live descriptors of `subs` (one doorbell); counts into `st`.
  std::vector<SubDesc> read_live(const Index& index, const std::vector<uint32_t>& subs, fabric::Endpoint& ep,
                                 BatchStats& st);
  void size_buffers(const Index& index);
  /// The queries of plan entry `e` searched in `v` with the SIMD kernel (sub_search.hpp).
  pipeline_detail::Hits search_view(const SubView& v, const Job& job, const PlanEntry& e, const float* queries) const;
  /// Each query's top-k merged with `h` (one answer per id: boundary copies).
  void merge(const Job& job, const PlanEntry& e, const pipeline_detail::Hits& h, std::vector<Answer>& answers) const;
  /// An Item::group item: its live descriptor read where it is mapped (seqlock), the sub
  /// searched in place, or copied out and deserialized when it has overflow records.
  void search_in_place(Item& it, const float* queries, std::vector<Answer>& answers);
};

}  // namespace dmhnsw::dhnsw
