#pragma once
// `computenode --mode dhnsw query`: every computenode answers its share of a workload
// (queries i with i mod K == cn id) through its own d-HNSW pipeline; a warm-up part fills
// the sub-HNSW cache and is not measured; computenode 0 merges the reports (one JSON, the
// same family as shine's).
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/pipeline.hpp"
#include "common/workload.hpp"
#include "compute/run_context.hpp"

namespace dmhnsw::dhnsw {

using compute::RunContext;

struct QueryOptions {
  std::string workload;
  std::vector<uint32_t> ef_search{64};
  EngineOptions engine;
  /// Called with the finished report (computenode 0: merged) before teardown.
  std::function<void(const nlohmann::json&)> on_report;
};

nlohmann::json run_query(const RunContext& rc, const QueryOptions& o);
/// A short human table of a report on stdout.
void print_query(const nlohmann::json& r);

/// Recall@1 and recall@k summed over queries `rows` of the workload, answers[i] being row
/// rows[i]'s, against the workload's ground truth.
std::pair<double, double> recall_sums(const std::vector<Answer>& answers, const std::vector<uint64_t>& rows,
                                      const Workload& wl, uint32_t k);

}  // namespace dmhnsw::dhnsw
