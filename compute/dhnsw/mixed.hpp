#pragma once
// `computenode --mode dhnsw query --mix insert:P`: a stream of batches of --batch operations, a
// share P of them inserts (rows of --insert-data, this computenode's share) and the rest
// searches (the workload's measured queries, cycled). Each batch's inserts are committed (or
// buffered while a rebuild runs) and then its searches answered; the report separates search
// and insert latency and throughput and keeps a per-batch timeline with the epoch (paper
// Figures 13 and 18). Every computenode runs its own stream and writes its own report.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "compute/dhnsw/insert.hpp"
#include "compute/dhnsw/query.hpp"

namespace dmhnsw::dhnsw {

struct MixedOptions {
  double insert_share = 0;     // P in [0, 1)
  std::string insert_data;     // vectors to insert
  size_t insert_begin = 0, insert_end = 0;  // rows (end 0: all); this computenode's share i % num_cns == cn_id
  int64_t id_offset = 0;       // a row's id is id_offset + row
  double seconds = 0;          // run at least this long (0: until the inserts or the queries run out once)
  InsertTuning tuning;
};

/// Parses "insert:P" (--mix); throws std::invalid_argument naming --mix.
double parse_mix(const std::string& text);

nlohmann::json run_mixed(const RunContext& rc, const QueryOptions& q, const MixedOptions& m);
void print_mixed(const nlohmann::json& r);

}  // namespace dmhnsw::dhnsw
