// faiss-bench: the single-machine Faiss reference beside hnswlib-bench, for dmhnsw's codes
// (`--codes sq8|pq:M` with `--rerank R`). One unit: a tool whose steps (load, build, queries,
// report) are its functions.
//
// Search: every query is one Faiss search call (n = 1) on --threads std::threads, each thread
// taking its own contiguous part of the query list and holding OpenMP to 1 thread inside its
// calls, exactly as hnswlib-bench splits its queries. QPS (queries / wall time) is therefore
// comparable with hnswlib-bench at the same --threads, and p50/p99 are per-query latencies
// measured inside each thread. (A batch search with OpenMP over the queries would also use
// --threads cores, but has no per-query latency and amortises what Faiss does once per call: a
// visited table of ntotal bytes and a distance computer per thread.)
//
// Build: the Faiss index (--index) over --base with --threads OpenMP threads, all rows in one
// add() (Faiss's order: the points of the highest levels first), levels drawn from --seed.
//   hnsw-flat   faiss::IndexHNSWFlat: the vectors themselves.
//   hnsw-sq8    faiss::IndexHNSWSQ, ScalarQuantizer::QT_8bit: one byte per dimension.
//   hnsw-pq:M   faiss::IndexHNSWPQ: M sub-quantizers of 8 bits (M bytes per vector; M divides
//               the dimension). Faiss 1.7.3's IndexHNSWPQ is L2 only (no metric argument; its
//               code-to-code table, which prunes the links, holds L2 distances): for --metric ip
//               the index is a faiss::IndexHNSW over an inner-product faiss::IndexPQ whose
//               code-to-code table holds the centroids' inner products instead.
// The graph is built on the codes: each link is chosen by code-to-code distances (unlike
// dmhnsw's --codes, whose sub-HNSWs are built on the vectors and store codes beside them). SQ8
// and PQ are trained on up to 65,536 rows spread evenly over --base (row i * n / rows), as
// dmhnsw's --codes is for dhnsw; PQ with Faiss's k-means defaults and min_points_per_centroid 1,
// as dmhnsw's. Training runs with one OpenMP thread (k-means works in BLAS, with BLAS's threads);
// the add with --threads. build_seconds counts both, inserts/s the add alone.
//
// --rerank R (the coded kinds; comma-separated, one set of runs each, 0: none): the index is
// wrapped in a faiss::IndexRefineFlat holding a copy of the vectors, k_factor = R / k, so the
// HNSW search returns its best R by code distance (Faiss's HNSW searches with max(efSearch, R)
// candidates) and those R are re-ranked with exact distances to keep the best k: what dmhnsw's
// --rerank R does with each query's best R candidates.
//
// Metric: l2 (squared Euclidean) or ip. For ip Faiss returns similarities (larger is closer),
// not hnswlib's 1 - <a,b>; recall@k compares ids only, so it is the same measure for both.
//
// Not reported: distance computations and hops (Faiss's hnsw_stats is a global updated without
// a lock by concurrent search calls).
#include <CLI/CLI.hpp>
#include <faiss/Index.h>
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexPQ.h>
#include <faiss/IndexRefine.h>
#include <faiss/IndexScalarQuantizer.h>
#include <faiss/utils/distances.h>
#include <faiss/utils/random.h>
#include <faiss/utils/utils.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/version.hpp"
#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "common/json_file.hpp"
#include "common/query_set.hpp"
#include "common/timing.hpp"
#include "tools/bench_flags.hpp"

namespace {

using dmhnsw::Clock;
using dmhnsw::QuerySet;
using dmhnsw::seconds_since;

constexpr std::size_t kTrainRows = 65536;  // as dmhnsw's --codes (compute/dhnsw/build.hpp)

/// --index: hnsw-flat, hnsw-sq8 or hnsw-pq:M.
struct IndexKind {
  enum Kind { Flat, Sq8, Pq } kind = Flat;
  int pq_m = 0;
  std::string text;
  bool coded() const { return kind != Flat; }
};

IndexKind parse_index(const std::string& text) {
  IndexKind k;
  k.text = text;
  const std::string pq = "hnsw-pq:";
  if (text == "hnsw-flat") {
    k.kind = IndexKind::Flat;
  } else if (text == "hnsw-sq8") {
    k.kind = IndexKind::Sq8;
  } else if (text.rfind(pq, 0) == 0) {
    k.kind = IndexKind::Pq;
    const char* begin = text.data() + pq.size();
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(begin, end, k.pq_m);
    if (ec != std::errc() || ptr != end || begin == end || k.pq_m < 1 || k.pq_m > 65536)
      throw std::invalid_argument("--index " + text + ": M of hnsw-pq:M must be a number of sub-quantizers "
                                  "from 1 to 65536");
  } else {
    throw std::invalid_argument("--index " + text + ": want hnsw-flat, hnsw-sq8 or hnsw-pq:M");
  }
  return k;
}

struct Flags : dmhnsw::bench::BenchFlags {
  std::string index_text = "hnsw-flat";
  std::vector<std::size_t> rerank = {0};

  Flags() { seed = 12345; }
  void add(CLI::App& app) {
    add_common(app, {"distance: l2 (squared Euclidean) or ip (inner product; recall compares ids)",
                     "comma-separated candidate list sizes to search with, one run each "
                     "(Faiss uses max(ef, k), with --rerank max(ef, R))",
                     "threads for building (OpenMP) and for searching (0: all hardware threads)",
                     "seed of Faiss's HNSW level draws (12345: Faiss's own)"});
    app.add_option("--index", index_text,
                   "hnsw-flat (IndexHNSWFlat), hnsw-sq8 (IndexHNSWSQ, 8 bits per dimension) or hnsw-pq:M "
                   "(IndexHNSWPQ, M bytes per vector; M divides the dimension)")
        ->capture_default_str();
    app.add_option("--rerank", rerank,
                   "hnsw-sq8 and hnsw-pq:M: comma-separated R, one set of runs each: re-rank each query's "
                   "best R (by codes) with exact distances (IndexRefineFlat, k_factor R/k); 0: none, else "
                   "R >= --k")
        ->delimiter(',')->capture_default_str()
        ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 20));
  }
};

/// The built index and what it cost.
struct Built {
  std::unique_ptr<faiss::IndexHNSW> hnsw;
  std::unique_ptr<faiss::IndexRefineFlat> refine;  // over hnsw (not owned), when a --rerank is > 0
  std::size_t train_rows = 0;
  double train_seconds = 0, add_seconds = 0, refine_seconds = 0;
};

std::unique_ptr<faiss::IndexHNSW> make_index(const IndexKind& kind, int dim, int m, dmhnsw::Metric metric) {
  const faiss::MetricType fm = metric == dmhnsw::Metric::IP ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2;
  switch (kind.kind) {
    case IndexKind::Flat:
      return std::make_unique<faiss::IndexHNSWFlat>(dim, m, fm);
    case IndexKind::Sq8:
      return std::make_unique<faiss::IndexHNSWSQ>(dim, faiss::ScalarQuantizer::QT_8bit, m, fm);
    case IndexKind::Pq: {
      std::unique_ptr<faiss::IndexHNSW> index;
      if (metric == dmhnsw::Metric::L2) {
        index = std::make_unique<faiss::IndexHNSWPQ>(dim, kind.pq_m, m);
      } else {  // see the file's first comment: the code-to-code table is filled after training
        index = std::make_unique<faiss::IndexHNSW>(new faiss::IndexPQ(dim, kind.pq_m, 8, fm), m);
        index->own_fields = true;
      }
      dynamic_cast<faiss::IndexPQ&>(*index->storage).pq.cp.min_points_per_centroid = 1;
      return index;
    }
  }
  throw std::logic_error("make_index: unknown kind");
}

/// Inner products of each sub-quantizer's centroids, where IndexHNSWPQ keeps L2 distances.
void fill_ip_sdc_table(faiss::ProductQuantizer& pq) {
  const std::size_t ksub = pq.ksub;
  pq.sdc_table.assign(pq.M * ksub * ksub, 0.0f);
  for (std::size_t s = 0; s < pq.M; ++s)
    for (std::size_t i = 0; i < ksub; ++i)
      for (std::size_t j = 0; j < ksub; ++j)
        pq.sdc_table[(s * ksub + j) * ksub + i] =
            faiss::fvec_inner_product(pq.get_centroids(s, i), pq.get_centroids(s, j), pq.dsub);
}

Built build(const Flags& f, const IndexKind& kind, dmhnsw::Metric metric, const dmhnsw::FloatMatrix& base,
            bool refine) {
  const std::size_t n = base.n(), dim = base.d();
  Built b;
  b.hnsw = make_index(kind, static_cast<int>(dim), static_cast<int>(f.m), metric);
  b.hnsw->hnsw.efConstruction = static_cast<int>(f.ef_construction);
  b.hnsw->hnsw.rng = faiss::RandomGenerator(static_cast<std::int64_t>(f.seed));
  const auto t_train = Clock::now();
  if (kind.coded()) {  // on rows spread over the data
    b.train_rows = std::min(n, kTrainRows);
    std::vector<float> sample(b.train_rows * dim);
    for (std::size_t i = 0; i < b.train_rows; ++i)
      std::copy_n(base.row(i * n / b.train_rows), dim, sample.data() + i * dim);
    // One OpenMP thread: k-means spends its time in BLAS (OpenBLAS's own threads), and idle OpenMP
    // threads spinning beside them made PQ training of 2,000 rows take 3-6 s instead of 0.2 s on a
    // busy 2-core machine.
    omp_set_num_threads(1);
    b.hnsw->train(static_cast<faiss::Index::idx_t>(b.train_rows), sample.data());
    if (kind.kind == IndexKind::Pq && metric == dmhnsw::Metric::IP)
      fill_ip_sdc_table(dynamic_cast<faiss::IndexPQ&>(*b.hnsw->storage).pq);
  }
  b.train_seconds = seconds_since(t_train);

  omp_set_num_threads(static_cast<int>(f.threads));
  const auto t_add = Clock::now();
  b.hnsw->add(static_cast<faiss::Index::idx_t>(n), base.data());
  b.add_seconds = seconds_since(t_add);

  if (refine) {
    const auto t_refine = Clock::now();
    b.refine = std::make_unique<faiss::IndexRefineFlat>(b.hnsw.get(), base.data());
    b.refine->own_fields = false;
    b.refine_seconds = seconds_since(t_refine);
  }
  const double total = b.train_seconds + b.add_seconds + b.refine_seconds;
  std::printf("build: %zu vectors in %.3f s (train %.3f s on %zu rows; add %.3f s, %.0f inserts/s), %u threads\n", n,
              total, b.train_seconds, b.train_rows, b.add_seconds, static_cast<double>(n) / b.add_seconds, f.threads);
  std::fflush(stdout);
  return b;
}

/// Bytes the index holds, by part.
struct Memory {
  std::size_t codes = 0, quantizer = 0, graph = 0, refine = 0;
  std::size_t total() const { return codes + quantizer + graph + refine; }
};

Memory memory_of(const Built& b) {
  Memory mem;
  const auto& codes = dynamic_cast<const faiss::IndexFlatCodes&>(*b.hnsw->storage);
  mem.codes = codes.codes.size();
  if (const auto* sq = dynamic_cast<const faiss::IndexScalarQuantizer*>(&codes))
    mem.quantizer = sq->sq.trained.size() * sizeof(float);
  if (const auto* pq = dynamic_cast<const faiss::IndexPQ*>(&codes))
    mem.quantizer = (pq->pq.centroids.size() + pq->pq.sdc_table.size()) * sizeof(float);
  const faiss::HNSW& g = b.hnsw->hnsw;
  mem.graph = g.neighbors.size() * sizeof(faiss::HNSW::storage_idx_t) + g.offsets.size() * sizeof(std::size_t) +
              g.levels.size() * sizeof(int);
  if (b.refine) mem.refine = dynamic_cast<const faiss::IndexFlatCodes&>(*b.refine->refine_index).codes.size();
  return mem;
}

struct RunResult {
  std::size_t ef = 0, rerank = 0;
  double recall = 0, qps = 0, p50_us = 0, p99_us = 0;
};

RunResult run_queries(const faiss::Index& index, faiss::HNSW& graph, const QuerySet& qs, std::size_t k,
                      std::size_t ef, std::size_t rerank, unsigned threads) {
  const std::size_t nq = qs.vectors.size();
  graph.efSearch = static_cast<int>(ef);
  std::vector<double> latency_us(nq), hits(nq);
  std::exception_ptr error;
  std::mutex error_mutex;

  auto worker = [&](std::size_t begin, std::size_t end) {
    try {
      omp_set_num_threads(1);  // this thread's own calls: no OpenMP team per query
      std::vector<faiss::Index::idx_t> labels(k);
      std::vector<float> distances(k);
      std::vector<std::int32_t> truth(k);
      for (std::size_t q = begin; q < end; ++q) {
        const auto t0 = Clock::now();
        index.search(1, qs.vectors[q], static_cast<faiss::Index::idx_t>(k), distances.data(), labels.data());
        latency_us[q] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        std::copy_n(qs.truth[q], k, truth.begin());
        std::sort(truth.begin(), truth.end());
        std::size_t found = 0;
        for (const faiss::Index::idx_t label : labels)  // -1: fewer than k found
          if (label >= 0 && std::binary_search(truth.begin(), truth.end(), static_cast<std::int32_t>(label))) ++found;
        hits[q] = static_cast<double>(found);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };

  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker, nq * t / threads, nq * (t + 1) / threads);
  for (auto& th : pool) th.join();
  const double wall = seconds_since(t0);
  if (error) std::rethrow_exception(error);

  RunResult r;
  r.ef = ef;
  r.rerank = rerank;
  double total_hits = 0;
  for (double h : hits) total_hits += h;
  r.recall = total_hits / (static_cast<double>(nq) * static_cast<double>(k));
  r.qps = static_cast<double>(nq) / wall;
  r.p50_us = dmhnsw::percentile(latency_us, 0.50);
  r.p99_us = dmhnsw::percentile(latency_us, 0.99);
  return r;
}

void write_report(const Flags& f, const QuerySet& qs, std::size_t n, std::size_t dim, const std::string& metric_name,
                  const Built& b, const std::vector<RunResult>& runs) {
  const Memory mem = memory_of(b);
  const double build_seconds = b.train_seconds + b.add_seconds + b.refine_seconds;
  nlohmann::json report;
  report["tool"] = "faiss-bench";
  report["system"] = "faiss";
  report["faiss_version"] = std::to_string(FAISS_VERSION_MAJOR) + "." + std::to_string(FAISS_VERSION_MINOR) + "." +
                            std::to_string(FAISS_VERSION_PATCH);
  report["faiss_compile_options"] = faiss::get_compile_options();
  report["index"] = f.index_text;
  report["code_size"] = b.hnsw->storage->sa_code_size();
  report["base"] = f.base_path;
  report["queries"] = qs.source;
  report["nq"] = qs.vectors.size();
  report["n"] = n;
  report["dim"] = dim;
  report["metric"] = metric_name;
  report["m"] = f.m;
  report["ef_construction"] = f.ef_construction;
  report["k"] = f.k;
  report["threads"] = f.threads;
  report["seed"] = f.seed;
  report["search"] = "per-query calls on threads";
  report["train_rows"] = b.train_rows;
  report["train_seconds"] = b.train_seconds;
  report["add_seconds"] = b.add_seconds;
  report["refine_seconds"] = b.refine_seconds;
  report["build_seconds"] = build_seconds;
  report["inserts_per_s"] = static_cast<double>(n) / b.add_seconds;
  report["memory"] = {{"codes_bytes", mem.codes},
                      {"quantizer_bytes", mem.quantizer},
                      {"graph_bytes", mem.graph},
                      {"refine_bytes", mem.refine},
                      {"total_bytes", mem.total()}};
  report["runs"] = nlohmann::json::array();
  for (const RunResult& r : runs)
    report["runs"].push_back({{"ef_search", r.ef},
                              {"rerank", r.rerank},
                              {"k", f.k},
                              {"recall", r.recall},
                              {"qps", r.qps},
                              {"latency_us", {{"p50", r.p50_us}, {"p99", r.p99_us}}}});
  dmhnsw::write_json_file(f.json_path, report, "--json");
  std::printf("wrote %s\n", f.json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "faiss-bench: build a Faiss HNSW index (flat, SQ8 or PQ codes, optionally re-ranked) on one machine and "
      "measure recall@k, QPS and latency per efSearch (the reference for dmhnsw's --codes and --rerank)"};
  app.set_version_flag("--version", dmhnsw::version_line("faiss-bench"));
  Flags f;
  f.add(app);
  if (const auto code = f.parse(app, argc, argv)) return *code;

  try {
    const dmhnsw::Metric metric = f.metric();
    const IndexKind kind = parse_index(f.index_text);
    if (f.ef_search.empty()) throw std::invalid_argument("--ef-search: no values given");
    if (f.rerank.empty()) throw std::invalid_argument("--rerank: no values given");
    bool refine = false;
    for (const std::size_t r : f.rerank) {
      if (r == 0) continue;
      if (!kind.coded())
        throw std::invalid_argument("--rerank " + std::to_string(r) + ": --index " + f.index_text +
                                    " searches the vectors themselves; re-ranking is for hnsw-sq8 and hnsw-pq:M");
      if (r < f.k)
        throw std::invalid_argument("--rerank " + std::to_string(r) + " is below --k " + std::to_string(f.k) +
                                    ": it re-ranks the best R candidates to keep k");
      refine = true;
    }
    if (f.threads == 0) f.threads = std::max(1u, std::thread::hardware_concurrency());
    dmhnsw::check_writable("--json", f.json_path);

    dmhnsw::LoadOptions base_options;
    if (f.max_elements > 0) base_options.max_rows = f.max_elements;
    dmhnsw::FloatMatrix base = dmhnsw::load_vectors_as_float(f.base_path, base_options);
    if (!base.contiguous()) base = base.copy();  // Faiss takes one n x d array (an fvecs view has row headers)
    const QuerySet qs = dmhnsw::load_queries(f.workload_path, f.query_path, f.truth_path);
    const std::size_t n = base.n(), dim = base.d(), nq = qs.vectors.size();
    dmhnsw::check_queries(qs, f.base_path, n, dim, f.k, true, f.max_elements);
    if (n > static_cast<std::size_t>(INT32_MAX))
      throw std::invalid_argument(f.base_path + ": " + std::to_string(n) + " rows; Faiss's HNSW holds at most 2^31 - 1");
    if (kind.kind == IndexKind::Pq) {
      if (dim % static_cast<std::size_t>(kind.pq_m) != 0)
        throw std::invalid_argument("--index " + f.index_text + ": M=" + std::to_string(kind.pq_m) +
                                    " does not divide the dimension " + std::to_string(dim) + " of " + f.base_path);
      if (std::min(n, kTrainRows) < 256)
        throw std::invalid_argument("--index " + f.index_text + ": PQ trains 256 centroids per sub-quantizer, " +
                                    f.base_path + " has only " + std::to_string(n) + " rows");
    }

    const std::string metric_name(dmhnsw::to_string(metric));
    std::printf("faiss-bench: base %s (%zu x %zu), %s, index %s, %zu queries from %s, k=%zu, M=%zu, "
                "efConstruction=%zu, threads=%u, seed=%zu, Faiss %d.%d.%d (%s)\n",
                f.base_path.c_str(), n, dim, metric_name.c_str(), f.index_text.c_str(), nq, qs.source.c_str(), f.k,
                f.m, f.ef_construction, f.threads, f.seed, FAISS_VERSION_MAJOR, FAISS_VERSION_MINOR,
                FAISS_VERSION_PATCH, faiss::get_compile_options().c_str());
    std::fflush(stdout);

    const Built b = build(f, kind, metric, base, refine);
    const Memory mem = memory_of(b);
    std::printf("memory: %zu bytes (codes %zu, quantizer %zu, graph %zu, re-rank vectors %zu)\n", mem.total(),
                mem.codes, mem.quantizer, mem.graph, mem.refine);

    std::vector<RunResult> runs;
    std::printf("%9s %7s %10s %12s %10s %10s\n", "efSearch", "rerank", ("recall@" + std::to_string(f.k)).c_str(),
                "QPS", "p50 us", "p99 us");
    for (const std::size_t r : f.rerank) {
      const faiss::Index* index = b.hnsw.get();
      if (r > 0) {
        b.refine->k_factor = (static_cast<float>(r) + 0.5f) / static_cast<float>(f.k);  // k * k_factor rounds down to R
        index = b.refine.get();
      }
      for (const std::size_t ef : f.ef_search) {
        const RunResult run = run_queries(*index, b.hnsw->hnsw, qs, f.k, ef, r, f.threads);
        std::printf("%9zu %7zu %10.4f %12.1f %10.1f %10.1f\n", run.ef, run.rerank, run.recall, run.qps, run.p50_us,
                    run.p99_us);
        std::fflush(stdout);
        runs.push_back(run);
      }
    }
    if (!f.json_path.empty()) write_report(f, qs, n, dim, metric_name, b, runs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
