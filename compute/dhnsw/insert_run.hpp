#pragma once
// `computenode --mode dhnsw insert`, `upsert` and `delete`: this computenode's share of the rows
// or ids, in batches through an Inserter (compute/dhnsw/insert.hpp), and their reports.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/dhnsw/insert.hpp"
#include "compute/run_context.hpp"

namespace dmhnsw::dhnsw {

struct InsertOptions {
  std::string data;
  size_t begin = 0, end = 0;  // rows [begin, end) (end 0: all); this computenode takes i % share_count == share_index
  uint32_t share_index = 0, share_count = 1;
  int64_t id_offset = 0;      // a row's id is id_offset + row, unless `ids`
  std::vector<int64_t> ids;   // row i's id (as many as the data's rows), from --ids
  bool upsert = false;        // an id the index holds gets the row's vector
  uint32_t batch = 1000;      // vectors routed and committed together
  InsertTuning tuning;
};

/// `computenode --mode dhnsw insert` (and `upsert`): this computenode's share of the rows, in
/// batches.
nlohmann::json run_insert(const compute::RunContext& rc, const InsertOptions& o);
void print_insert(const nlohmann::json& r);

struct DeleteOptions {
  std::vector<int64_t> ids;  // computenode i of K deletes ids[j] for j % K == i
  uint32_t batch = 1000;     // ids looked up and marked together
  InsertTuning tuning;
};
/// `computenode --mode dhnsw delete`: this computenode's share of the ids; those the index does
/// not hold are reported (count, and up to 1,000 listed), not an error.
nlohmann::json run_delete(const compute::RunContext& rc, const DeleteOptions& o);
void print_delete(const nlohmann::json& r);

}  // namespace dmhnsw::dhnsw
