#include "common/query_set.hpp"

#include <stdexcept>

namespace dmhnsw {

QuerySet load_queries(const std::string& workload_path, const std::string& query_path,
                      const std::string& truth_path) {
  QuerySet qs;
  if (!workload_path.empty()) {
    qs.workload = read_workload(workload_path);
    const Workload& w = *qs.workload;
    qs.source = qs.groundtruth_source = workload_path;
    qs.dim = w.dim();
    qs.truth_k = w.k();
    for (std::uint64_t i = 0; i < w.total(); ++i) {
      if (w.is_warmup(i)) continue;
      qs.vectors.push_back(w.queries.row(i));
      qs.truth.push_back(w.groundtruth.row(i));
    }
  } else {
    qs.queries = load_vectors_as_float(query_path);
    qs.groundtruth = load_ids(truth_path);
    if (qs.groundtruth.n() != qs.queries.n())
      throw std::invalid_argument(truth_path + " has " + std::to_string(qs.groundtruth.n()) +
                                  " rows but " + query_path + " has " +
                                  std::to_string(qs.queries.n()) + " queries");
    qs.source = query_path;
    qs.groundtruth_source = truth_path;
    qs.dim = qs.queries.d();
    qs.truth_k = qs.groundtruth.d();
    for (std::size_t i = 0; i < qs.queries.n(); ++i) {
      qs.vectors.push_back(qs.queries.row(i));
      qs.truth.push_back(qs.groundtruth.row(i));
    }
  }
  if (qs.vectors.empty()) throw std::invalid_argument(qs.source + ": no queries to measure");
  return qs;
}

void check_queries(const QuerySet& qs, const std::string& base_path, std::size_t n, std::size_t dim,
                   std::size_t k, bool row_ids, std::size_t max_rows) {
  if (qs.dim != dim)
    throw std::invalid_argument("dimension mismatch: " + base_path + " has d=" + std::to_string(dim) + ", " +
                                qs.source + " has d=" + std::to_string(qs.dim));
  if (k > n)
    throw std::invalid_argument("--k " + std::to_string(k) + " exceeds the " + std::to_string(n) +
                                " base vectors indexed from " + base_path);
  if (qs.truth_k < k)
    throw std::invalid_argument("--k " + std::to_string(k) + ": " + qs.groundtruth_source + " has only " +
                                std::to_string(qs.truth_k) + " ground-truth ids per query");
  if (!row_ids) return;
  for (std::size_t q = 0; q < qs.vectors.size(); ++q)
    for (std::size_t j = 0; j < k; ++j)
      if (static_cast<std::size_t>(qs.truth[q][j]) >= n)
        throw std::invalid_argument(
            qs.groundtruth_source + ": query " + std::to_string(q) + " has neighbour id " +
            std::to_string(qs.truth[q][j]) + " but only " + std::to_string(n) + " base rows are indexed" +
            (max_rows > 0 ? " (--max-elements " + std::to_string(max_rows) +
                                "; use a ground truth computed over those rows)"
                          : " (ground truth of another base?)"));
}

}  // namespace dmhnsw
