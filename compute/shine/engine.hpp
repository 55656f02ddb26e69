#pragma once
// SHINE control of a run: build (insert a share of a base set with T threads x C
// coroutines) and query (a workload with T threads x C coroutines); reports as JSON.
#include <nlohmann/json.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/shine/graph.hpp"
#include "compute/shine/options.hpp"
#include "compute/run_context.hpp"

namespace dmhnsw::shine {

using compute::RunContext;

struct BuildOptions {
  std::string data;          // base vectors, any format load_vectors_as_float reads
  size_t max_elements = 0;   // 0 = all rows
  size_t begin = 0;          // insert rows [begin, end) (end 0 = all); labels are row ids
  size_t end = 0;
  GraphParams params;
  uint32_t threads = 2;
  uint32_t coroutines = 1;
  ReadMode mode = ReadMode::Batch;
  // Where the provider maps the memnodes' regions (cxl): the inserts' searches read lists and
  // vectors where they lie (locks, list writes and headers stay one-sided operations).
  bool in_place = true;
  bool format = true;        // false: the index must exist (insert into it)
  uint64_t cache_bytes = 2ull << 30;  // process-wide cache of vectors read while inserting
  bool progress = true;
  /// The rows' ids (row i gets ids[i]; needs an id index); empty: a row's id is its number.
  std::vector<uint64_t> ids;
  bool upsert = false;  // an id the index holds gets the row's vector (its old node is deleted)
  /// Formatting: compressed vectors to train (on up to compute::kCodesTrainRows of this computenode's
  /// rows) and store with the index.
  compute::CodesSpec codes;
};

struct DeleteOptions {
  std::vector<uint64_t> ids;  // computenode i of K deletes ids[j] for j % K == i
  uint32_t threads = 2;
  uint32_t coroutines = 4;
  bool progress = true;
};

struct ConsolidateOptions {
  uint32_t threads = 2;
  uint32_t coroutines = 4;
  float alpha = 1.0f;  // RobustPrune's alpha for the rewritten lists (1: hnswlib's heuristic)
  bool progress = true;
};

struct QueryOptions {
  std::string workload;
  uint32_t k = 10;
  std::vector<uint32_t> ef_search{64};
  SearchOptions search;  // threads, coroutines, the node cache, routing: as `serve` has them
  ReadMode mode = ReadMode::Batch;
  double repeat_seconds = 0;  // > 0: cycle through the measured part for at least this long
  std::string trace_dir;         // record node-cache accesses here (tools/csp-report)
  /// Called with the finished report before the run's connections are torn down (so the
  /// report is out even if the teardown fails).
  std::function<void(const nlohmann::json&)> on_report;
};

/// Inserts this computenode's share; returns the build report (merged on computenode 0).
nlohmann::json run_build(const RunContext& rc, const BuildOptions& o);
/// Deletes this computenode's share of the ids; returns the report (merged on computenode 0):
/// counts, and the ids that were not in the index (not an error).
nlohmann::json run_delete(const RunContext& rc, const DeleteOptions& o);
void print_delete(const nlohmann::json& r);
/// `computenode --mode shine consolidate`: every live node (this computenode's share of the id
/// index's entries, and the entry point) has its edges to deleted nodes replaced
/// (Worker::consolidate), so that reusing their records leaves no live list pointing at them.
nlohmann::json run_consolidate(const RunContext& rc, const ConsolidateOptions& o);
void print_consolidate(const nlohmann::json& r);
/// Runs the workload; returns the query report (merged on computenode 0).
nlohmann::json run_query(const RunContext& rc, const QueryOptions& o);
/// A short human table of a report on stdout.
void print_build(const nlohmann::json& r);
void print_query(const nlohmann::json& r);

}  // namespace dmhnsw::shine
