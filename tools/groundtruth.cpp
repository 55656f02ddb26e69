// groundtruth: exact top-k neighbours of every query with a Faiss flat index.
//
// L2: squared Euclidean distance (IndexFlatL2); ip: largest inner product (IndexFlatIP).
// The base is searched in blocks of --base-block rows (a 10M-row base is never held whole: the
// file is mapped, one block at a time copied into the flat index), every query against each
// block, the running top-k merged after each; queries go in blocks of --batch, each using all
// OpenMP threads. Output by extension: .ivecs (ids) or .ibin (ids, then the distances as
// Faiss reports them: squared L2, or inner products for ip).
#include <CLI/CLI.hpp>
#include <faiss/IndexFlat.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/version.hpp"
#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "common/progress.hpp"

namespace {

/// Rows [begin, begin + count) as one contiguous block (pointer into m, or copied to scratch).
const float* block(const dmhnsw::FloatMatrix& m, std::size_t begin, std::size_t count,
                   std::vector<float>& scratch) {
  if (m.contiguous()) return m.data() + begin * m.d();
  scratch.resize(count * m.d());
  for (std::size_t i = 0; i < count; ++i)
    std::copy_n(m.row(begin + i), m.d(), scratch.data() + i * m.d());
  return scratch.data();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"groundtruth: exact top-k neighbours with a Faiss flat index"};
  app.set_version_flag("--version", dmhnsw::version_line("groundtruth"));
  std::string base_path, query_path, out_path, metric_text = "l2";
  std::size_t k = 100, batch = 4096;
  int threads = 0;
  app.add_option("--base", base_path, "base vectors (.fvecs .fbin .bvecs .u8bin .i8bin)")->required();
  app.add_option("--queries", query_path, "query vectors (same formats)")->required();
  app.add_option("--k", k, "neighbours per query (1..65536, at most the base size)")
      ->capture_default_str()->check(CLI::Range(std::size_t{1}, dmhnsw::kMaxDim));
  app.add_option("--metric", metric_text, "distance: l2 (squared Euclidean) or ip (inner product)")
      ->capture_default_str();
  app.add_option("--out", out_path, "output file: .ivecs (ids) or .ibin (ids + distances)")->required();
  app.add_option("--threads", threads, "OpenMP threads (0: all available)")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  std::size_t base_block = std::size_t{1} << 20;
  app.add_option("--base-block", base_block, "base rows searched at once (0: the whole base)")
      ->capture_default_str();
  app.add_option("--batch", batch, "queries per search block")
      ->capture_default_str()->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    const auto t0 = std::chrono::steady_clock::now();
    dmhnsw::Metric metric;
    try {
      metric = dmhnsw::parse_metric(metric_text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--metric: ") + e.what());
    }
    if (!dmhnsw::is_id_format(dmhnsw::format_from_path(out_path)))
      throw std::invalid_argument("--out " + out_path + ": must be .ivecs or .ibin");
    if (threads > 0) omp_set_num_threads(threads);

    const dmhnsw::FloatMatrix base = dmhnsw::load_vectors_as_float(base_path);
    const dmhnsw::FloatMatrix queries = dmhnsw::load_vectors_as_float(query_path);
    if (base.d() != queries.d())
      throw std::invalid_argument("dimension mismatch: " + base_path + " has d=" +
                                  std::to_string(base.d()) + ", " + query_path + " has d=" +
                                  std::to_string(queries.d()));
    if (base.n() > static_cast<std::size_t>(INT32_MAX))
      throw std::invalid_argument(base_path + ": more than 2^31-1 vectors; ids do not fit int32");
    if (k > base.n())
      throw std::invalid_argument("--k " + std::to_string(k) + " exceeds the " +
                                  std::to_string(base.n()) + " base vectors in " + base_path);
    const std::size_t d = base.d(), nq = queries.n();
    std::printf("groundtruth: base %zu x %zu, queries %zu, k=%zu, metric=%s, threads=%d\n",
                base.n(), d, nq, k, std::string(dmhnsw::to_string(metric)).c_str(),
                omp_get_max_threads());
    std::fflush(stdout);

    std::unique_ptr<faiss::IndexFlat> index;
    if (metric == dmhnsw::Metric::L2) index = std::make_unique<faiss::IndexFlatL2>(d);
    else index = std::make_unique<faiss::IndexFlatIP>(d);
    const bool ip = metric == dmhnsw::Metric::IP;
    // The running top-k of each query: (distance, id), best first (ties: lower id).
    std::vector<std::vector<std::pair<float, std::int64_t>>> best(nq);
    auto better = [ip](const std::pair<float, std::int64_t>& a, const std::pair<float, std::int64_t>& b) {
      if (a.first != b.first) return ip ? a.first > b.first : a.first < b.first;
      return a.second < b.second;
    };
    std::vector<float> scratch;
    constexpr std::size_t kAddChunk = 1 << 16;
    const std::size_t bb = base_block == 0 ? base.n() : base_block;
    const std::size_t blocks = (base.n() + bb - 1) / bb;
    dmhnsw::Progress progress("groundtruth", nq * blocks, "query x base blocks");
    std::vector<float> bd;
    std::vector<faiss::Index::idx_t> bl;
    for (std::size_t first = 0; first < base.n(); first += bb) {
      const std::size_t rows = std::min(bb, base.n() - first);
      index->reset();
      for (std::size_t b = 0; b < rows; b += kAddChunk) {
        const std::size_t c = std::min(kAddChunk, rows - b);
        index->add(static_cast<faiss::Index::idx_t>(c), block(base, first + b, c, scratch));
      }
      const std::size_t kb = std::min(k, rows);
      bd.resize(batch * kb);
      bl.resize(batch * kb);
      for (std::size_t q = 0; q < nq; q += batch) {
        const std::size_t c = std::min(batch, nq - q);
        index->search(static_cast<faiss::Index::idx_t>(c), block(queries, q, c, scratch),
                      static_cast<faiss::Index::idx_t>(kb), bd.data(), bl.data());
        for (std::size_t i = 0; i < c; ++i) {
          auto& row = best[q + i];
          for (std::size_t j = 0; j < kb; ++j) {
            const auto label = bl[i * kb + j];
            if (label < 0 || static_cast<std::size_t>(label) >= rows)
              throw std::runtime_error("faiss returned no neighbour " + std::to_string(j) + " for query " +
                                       std::to_string(q + i) + " in base rows [" + std::to_string(first) + ", " +
                                       std::to_string(first + rows) + ")");
            row.emplace_back(bd[i * kb + j], static_cast<std::int64_t>(first) + label);
          }
          if (row.size() > k) {
            std::partial_sort(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(k), row.end(), better);
            row.resize(k);
          }
        }
        progress.add(c);
      }
    }
    progress.finish();
    dmhnsw::IdMatrix ids(nq, k);
    dmhnsw::FloatMatrix dist(nq, k);
    for (std::size_t q = 0; q < nq; ++q) {
      std::sort(best[q].begin(), best[q].end(), better);
      std::int32_t* id_row = ids.mutable_row(q);
      float* dist_row = dist.mutable_row(q);
      for (std::size_t j = 0; j < k; ++j) {
        id_row[j] = static_cast<std::int32_t>(best[q][j].second);
        dist_row[j] = best[q][j].first;
      }
    }

    const bool with_dist = dmhnsw::format_from_path(out_path) == dmhnsw::FileFormat::Ibin;
    dmhnsw::write_ids(out_path, ids, with_dist ? &dist : nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("groundtruth: wrote %zu x %zu ids%s to %s in %.2fs\n", nq, k,
                with_dist ? " and distances" : "", out_path.c_str(), secs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
