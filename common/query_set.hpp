#pragma once
// The queries a single-machine benchmark (tools/hnswlib-bench, tools/faiss-bench) measures: the
// measured part of a dmhnsw workload file with its ground truth, or a vector file plus a
// ground-truth file (one row per query).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dataset.hpp"
#include "common/workload.hpp"

namespace dmhnsw {

/// Pointers to the queries' vectors and their ground-truth rows, and the storage they point into.
struct QuerySet {
  std::string source;                      // file the queries come from
  std::string groundtruth_source;          // file the ground truth comes from
  std::vector<const float*> vectors;       // each points at dim floats
  std::vector<const std::int32_t*> truth;  // each points at truth_k ids
  std::size_t dim = 0;
  std::size_t truth_k = 0;
  // keep the storage the pointers point into
  std::optional<Workload> workload;
  FloatMatrix queries;
  IdMatrix groundtruth;
};

/// From `workload_path` (its measured part; the warm-up part is skipped) when not empty, else
/// from `query_path` and `truth_path`. Throws std::invalid_argument naming the files when their
/// row counts differ or no query is left; the readers' errors name the file.
QuerySet load_queries(const std::string& workload_path, const std::string& query_path,
                      const std::string& truth_path);

/// The queries against the base they are measured on (n rows of `dim` from `base_path`): the same
/// dimension, --k at most n and at most the ground truth's ids per query; with `row_ids` (the base
/// rows are the labels) every one of the first k ground-truth ids is an indexed row (`max_rows`:
/// the --max-elements that cut the base, 0 none, named in that error). Throws
/// std::invalid_argument naming the flag or the file.
void check_queries(const QuerySet& qs, const std::string& base_path, std::size_t n, std::size_t dim,
                   std::size_t k, bool row_ids, std::size_t max_rows);

}  // namespace dmhnsw
