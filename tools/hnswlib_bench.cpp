// hnswlib-bench: the single-machine reference that dmhnsw's shine mode is compared against.
// One unit: a tool whose steps (load, build, churn steps, queries, report) are its functions.
//
// Builds an hnswlib 0.6.2 HierarchicalNSW (label = base row id) with --threads threads, the way
// hnswlib's own ParallelFor does it (the first vector alone, then an atomic counter over the
// remaining ids), then for each --ef-search value searches every query with --threads threads,
// each thread taking its own contiguous part of the query list. Reports recall@k against the
// ground truth, QPS (queries / wall time), per-query latency p50/p99 measured inside each thread,
// and hnswlib's own counters (metric_distance_computations, metric_hops) per query.
//
// With --ids the base rows take the application's labels, and --step runs deletes, inserts (into
// deleted elements, as hnswlib 0.7's replace_deleted) and upserts after the build, in order
// (tools/hnswlib_churn.hpp): the churn reference of experiments/churn. A `query` step searches
// at that point; without one the queries run after the last step.
//
// Queries come from a dmhnsw workload file (its measured part only; the ground truth is the
// file's) or from a vector file plus a ground-truth file (one row per query).
//
// Note on reproducibility: with --threads 1 the index is a deterministic function of the data
// and --seed. With more threads the insertion order interleaves, and hnswlib 0.6.2 draws levels
// from its shared generator without a lock (as with its Python bindings), so graphs and recall
// vary slightly between runs.
//
// Distances: hnswlib's own kernels, but the copy of them chosen at run time for this CPU
// (common/distance.hpp), as the index's space. This file's copy of hnswlib is compiled for the
// build's baseline (SSE2 in the default, portable build), and would make the reference slower
// than shine, which uses the dispatched kernels.
//
// <hnswlib/hnswlib.h> defines non-inline functions and mutable globals: this must stay the only
// translation unit of this binary that includes it at global scope (common/distance_hnswlib.inc
// wraps its copies in an anonymous namespace).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/version.hpp"
#include "common/timing.hpp"
#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "tools/hnswlib_space.hpp"
#include "common/json_file.hpp"
#include "common/progress.hpp"
#include "common/query_set.hpp"
#include "common/workload.hpp"
#include "hnswlib_churn.hpp"
#include "tools/bench_flags.hpp"

namespace {

using dmhnsw::Clock;
using dmhnsw::DispatchedSpace;
using dmhnsw::QuerySet;
using dmhnsw::percentile;
using dmhnsw::seconds_since;


/// Runs body(i) for every i in [begin, end) on `threads` threads pulling ids from an atomic
/// counter; rethrows the first exception after all threads stop.
template <typename Body>
void parallel_for(std::size_t begin, std::size_t end, unsigned threads, Body body) {
  if (threads <= 1) {
    for (std::size_t i = begin; i < end; ++i) body(i);
    return;
  }
  std::atomic<std::size_t> next{begin};
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (;;) {
        const std::size_t i = next.fetch_add(1);
        if (i >= end) break;
        try {
          body(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
          next.store(end);  // stop the other threads
          break;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

struct RunResult {
  std::size_t ef = 0;
  double recall = 0, qps = 0, p50_us = 0, p99_us = 0;
  double dist_comps = 0, hops = 0;
};


RunResult run_queries(hnswlib::HierarchicalNSW<float>& index, const QuerySet& qs, std::size_t k,
                      std::size_t ef, unsigned threads) {
  const std::size_t nq = qs.vectors.size();
  index.setEf(ef);
  index.metric_distance_computations.store(0);
  index.metric_hops.store(0);

  std::vector<double> latency_us(nq);
  std::vector<double> hits(nq);
  std::exception_ptr error;
  std::mutex error_mutex;

  auto worker = [&](std::size_t begin, std::size_t end) {
    try {
      std::vector<std::int32_t> truth(k);
      for (std::size_t q = begin; q < end; ++q) {
        const auto t0 = Clock::now();
        auto result = index.searchKnn(qs.vectors[q], k);
        latency_us[q] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        std::copy_n(qs.truth[q], k, truth.begin());
        std::sort(truth.begin(), truth.end());
        std::size_t found = 0;
        for (; !result.empty(); result.pop()) {
          const auto label = static_cast<std::int32_t>(result.top().second);
          if (std::binary_search(truth.begin(), truth.end(), label)) ++found;
        }
        hits[q] = static_cast<double>(found);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };

  const auto t0 = Clock::now();
  if (threads <= 1) {
    worker(0, nq);
  } else {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      const std::size_t begin = nq * t / threads, end = nq * (t + 1) / threads;
      pool.emplace_back(worker, begin, end);
    }
    for (auto& th : pool) th.join();
  }
  const double wall = seconds_since(t0);
  if (error) std::rethrow_exception(error);

  RunResult r;
  r.ef = ef;
  double total_hits = 0;
  for (double h : hits) total_hits += h;
  r.recall = total_hits / (static_cast<double>(nq) * static_cast<double>(k));
  r.qps = static_cast<double>(nq) / wall;
  std::sort(latency_us.begin(), latency_us.end());
  r.p50_us = percentile(latency_us, 0.50);
  r.p99_us = percentile(latency_us, 0.99);
  r.dist_comps = static_cast<double>(index.metric_distance_computations.load()) /
                 static_cast<double>(nq);
  r.hops = static_cast<double>(index.metric_hops.load()) / static_cast<double>(nq);
  return r;
}

}  // namespace

#if defined(__SANITIZE_THREAD__)
// tools/test.sh --sanitize thread: TSan's lock-order (deadlock) detector is off in this binary.
// hnswlib 0.6.2 takes its per-element link-list locks and its global lock in both orders
// (tools/sanitizers/tsan.supp, deadlock:hnswlib::HierarchicalNSW), but in this binary, whose
// index holds one mutex per element, TSan reports that cycle without its stacks (every frame is
// 0x42, the placeholder TSan's runtime prints when it failed to extract a lock's stack), so no
// suppression can match it. The only locks of this file's own code (parallel_for's and
// run_queries' error_mutex) are never nested.
// Races are still reported. TSAN_OPTIONS=detect_deadlocks=1 turns the detector back on.
extern "C" __attribute__((no_sanitize("thread"), visibility("default"), used)) const char* __tsan_default_options() {
  return "detect_deadlocks=0";
}
#endif

namespace {

struct Flags : dmhnsw::bench::BenchFlags {
  std::string save_path, load_path, ids_path;
  std::vector<std::string> steps;
  bool replace_deleted = true;

  Flags() { seed = 100; }
  void add(CLI::App& app) {
    add_common(app, {"distance: l2 (squared Euclidean) or ip (inner product, hnswlib's 1 - <a,b>)",
                     "comma-separated candidate list sizes to search with, one run each (hnswlib uses max(ef, k))",
                     "threads for building and for searching (0: all hardware threads)",
                     "hnswlib's random_seed for the level draws"});
    app.add_option("--ids", ids_path,
                   "labels of the base rows, one decimal id per line (default: the row numbers); "
                   "the ground truth then holds labels");
    app.add_option("--step", steps,
                   "after the build, in order: delete:IDS (markDelete), insert:DATA:IDS (new "
                   "labels), upsert:DATA:IDS (live labels, updatePoint) or query (search now)")
        ->take_all()->allow_extra_args(false);
    app.add_flag("!--no-replace-deleted", replace_deleted,
                 "inserts take new elements instead of deleted ones (hnswlib 0.6.2's own "
                 "behaviour; by default they reuse deleted elements as 0.7's replace_deleted)");
    app.add_option("--save,--save-index", save_path,
                   "save the built index with hnswlib's saveIndex (for shine-import --hnswlib)");
    app.add_option("--load", load_path,
                   "search the index --save wrote from the same --base, --metric and --m instead of building one "
                   "(report: build_seconds 0, loaded_from; not with --save, --ids or --step)");
  }
};

/// Inserts every row with `threads` threads; returns the seconds it took.
double build(hnswlib::HierarchicalNSW<float>& index, const dmhnsw::FloatMatrix& base,
             const std::vector<std::uint64_t>& labels, unsigned threads) {
  const std::size_t n = base.n();
  const auto build_start = Clock::now();
  dmhnsw::Progress progress("hnswlib build", n, "vectors");
  auto label = [&](std::size_t i) { return labels.empty() ? i : static_cast<std::size_t>(labels[i]); };
  index.addPoint(base.row(0), label(0));  // the entry point, alone (as hnswlib's ParallelFor users do)
  progress.add();
  parallel_for(1, n, threads, [&](std::size_t i) {
    index.addPoint(base.row(i), label(i));
    progress.add();
  });
  progress.finish();
  const double build_seconds = seconds_since(build_start);
  std::printf("build: %zu vectors in %.3f s (%.0f inserts/s), %u threads\n", n, build_seconds,
              static_cast<double>(n) / build_seconds, threads);
  std::fflush(stdout);
  return build_seconds;
}

/// The index --save wrote, checked against the base it must index (hnswlib's loadIndex checks
/// only that the file's lists add up to its size).
std::unique_ptr<hnswlib::HierarchicalNSW<float>> load_index(hnswlib::SpaceInterface<float>& space, const Flags& f,
                                                            std::size_t n, std::size_t dim) {
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument("--load " + f.load_path + ": " + what);
  };
  std::unique_ptr<hnswlib::HierarchicalNSW<float>> index;
  try {
    index = std::make_unique<hnswlib::HierarchicalNSW<float>>(&space, f.load_path, false, n);
  } catch (const std::exception& e) {
    refuse(std::string("hnswlib cannot load it: ") + e.what());
  }
  if (index->cur_element_count != n)
    refuse("holds " + std::to_string(index->cur_element_count) + " vectors, --base " + f.base_path + " has " +
           std::to_string(n));
  if (index->label_offset_ - index->offsetData_ != dim * sizeof(float))
    refuse("its vectors are " + std::to_string((index->label_offset_ - index->offsetData_) / sizeof(float)) +
           " floats long, --base has d = " + std::to_string(dim));
  if (index->M_ != f.m) refuse("was built with M " + std::to_string(index->M_) + ", not --m " + std::to_string(f.m));
  std::printf("loaded %zu vectors from %s (M %zu, efConstruction %zu)\n", n, f.load_path.c_str(), index->M_,
              index->ef_construction_);
  return index;
}

void save_index(hnswlib::HierarchicalNSW<float>& index, const std::string& save_path) {
  // saveIndex checks no write: the file's size tells whether all of it reached the disk.
  const std::string tmp = save_path + ".tmp." + std::to_string(::getpid());
  index.saveIndex(tmp);
  std::uintmax_t want = 96 /* the header */ + index.cur_element_count * index.size_data_per_element_;
  for (std::size_t i = 0; i < index.cur_element_count; ++i)
    want += 4 + static_cast<std::uintmax_t>(index.element_levels_[i]) * index.size_links_per_element_;
  std::error_code ec;
  const auto size = std::filesystem::file_size(tmp, ec);
  if (ec || size != want) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error("--save " + save_path + ": writing " + tmp + " failed (disk full?)");
  }
  std::filesystem::rename(tmp, save_path);
  std::printf("saved index to %s (%ju bytes)\n", save_path.c_str(), static_cast<std::uintmax_t>(size));
}

using dmhnsw::hnswlib_churn::ChurnIndex;
using dmhnsw::hnswlib_churn::Step;
using dmhnsw::hnswlib_churn::StepResult;

/// Runs one delete, insert or upsert step (files read before the clock starts).
StepResult run_step(const Step& s, ChurnIndex& churn, hnswlib::HierarchicalNSW<float>& index, std::size_t dim,
                    unsigned threads) {
  StepResult r;
  r.op = s.op;
  const std::vector<std::uint64_t> ids = dmhnsw::load_id_list(s.ids);
  r.count = ids.size();
  dmhnsw::FloatMatrix data;
  if (s.op != "delete") {
    data = dmhnsw::load_vectors_as_float(s.data);
    if (data.d() != dim)
      throw std::invalid_argument("--step " + s.op + ": " + s.data + " has d=" + std::to_string(data.d()) +
                                  ", the index d=" + std::to_string(dim));
    if (data.n() != ids.size())
      throw std::invalid_argument("--step " + s.op + ": " + s.data + " has " + std::to_string(data.n()) +
                                  " rows but " + s.ids + " has " + std::to_string(ids.size()) + " ids");
  }
  const auto t0 = Clock::now();
  if (s.op == "delete") {
    churn.remove(ids, r);
  } else {
    parallel_for(0, ids.size(), threads, [&](std::size_t i) {
      if (s.op == "insert")
        churn.insert(data.row(i), ids[i], r);
      else
        churn.upsert(data.row(i), ids[i], r);
    });
  }
  r.seconds = seconds_since(t0);
  r.elements = index.cur_element_count;
  std::printf("%s: %zu of %zu ids in %.3f s (%.0f/s), %zu not applicable, %zu deleted elements reused, "
              "%zu elements\n",
              s.op.c_str(), r.done, r.count, r.seconds, static_cast<double>(r.done) / std::max(r.seconds, 1e-9),
              r.missing, r.reused, r.elements);
  std::fflush(stdout);
  return r;
}

/// With labels, every ground-truth id of the measured k must be live when the queries run.
void check_truth_live(const Flags& f, const QuerySet& qs, const ChurnIndex& churn) {
  for (std::size_t q = 0; q < qs.vectors.size(); ++q)
    for (std::size_t j = 0; j < f.k; ++j)
      if (!churn.live(static_cast<std::uint64_t>(qs.truth[q][j])))
        throw std::invalid_argument(qs.groundtruth_source + ": query " + std::to_string(q) + " has neighbour id " +
                                    std::to_string(qs.truth[q][j]) +
                                    ", which is not a live label of the index when the queries run");
}

void write_report(const Flags& f, const QuerySet& qs, std::size_t n, std::size_t dim, const std::string& metric_name,
                  const std::string& kernel, double build_seconds, const std::vector<RunResult>& runs,
                  const std::vector<StepResult>& steps, const hnswlib::HierarchicalNSW<float>& index) {
  nlohmann::json report;
  report["system"] = "hnswlib";
  report["base"] = f.base_path;
  report["queries"] = qs.source;
  report["nq"] = qs.vectors.size();
  report["n"] = n;
  report["dim"] = dim;
  report["metric"] = metric_name;
  report["distance_kernel"] = kernel;
  report["m"] = f.m;
  report["ef_construction"] = f.ef_construction;
  report["threads"] = f.threads;
  report["seed"] = f.seed;
  report["build_seconds"] = build_seconds;
  report["runs"] = nlohmann::json::array();
  for (const RunResult& r : runs)
    report["runs"].push_back({{"ef_search", r.ef},
                              {"k", f.k},
                              {"recall", r.recall},
                              {"qps", r.qps},
                              {"latency_us", {{"p50", r.p50_us}, {"p99", r.p99_us}}},
                              {"dist_comps_per_query", r.dist_comps},
                              {"hops_per_query", r.hops}});
  report["replace_deleted"] = f.replace_deleted;
  report["steps"] = nlohmann::json::array();
  for (const StepResult& s : steps)
    report["steps"].push_back({{"op", s.op},
                               {"ids", s.count},
                               {"done", s.done},
                               {"not_applicable", s.missing},
                               {"reused", s.reused},
                               {"appended", s.appended},
                               {"seconds", s.seconds},
                               {"per_s", static_cast<double>(s.done) / std::max(s.seconds, 1e-9)},
                               {"elements", s.elements}});
  if (!f.load_path.empty()) report["loaded_from"] = f.load_path;
  report["elements"] = index.cur_element_count;
  report["deleted_elements"] = index.num_deleted_;
  report["element_bytes"] = dmhnsw::hnswlib_churn::element_bytes(index);
  dmhnsw::write_json_file(f.json_path, report, "--json");
  std::printf("wrote %s\n", f.json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "hnswlib-bench: build an hnswlib 0.6.2 HNSW index on one machine and measure recall@k, "
      "QPS and latency per efSearch (the reference for dmhnsw's shine mode)"};
  app.set_version_flag("--version", dmhnsw::version_line("hnswlib-bench"));
  Flags f;
  f.add(app);
  if (const auto code = f.parse(app, argc, argv)) return *code;

  try {
    const dmhnsw::Metric metric = f.metric();
    if (f.ef_search.empty()) throw std::invalid_argument("--ef-search: no values given");
    if (f.threads == 0) f.threads = std::max(1u, std::thread::hardware_concurrency());
    dmhnsw::check_writable("--json", f.json_path);
    dmhnsw::check_writable("--save", f.save_path);

    dmhnsw::LoadOptions base_options;
    if (f.max_elements > 0) base_options.max_rows = f.max_elements;
    const dmhnsw::FloatMatrix base = dmhnsw::load_vectors_as_float(f.base_path, base_options);
    const QuerySet qs = dmhnsw::load_queries(f.workload_path, f.query_path, f.truth_path);
    const std::size_t n = base.n(), dim = base.d(), nq = qs.vectors.size();
    // labels (--ids, --step): the ground truth is checked against the live labels when the queries run
    dmhnsw::check_queries(qs, f.base_path, n, dim, f.k, f.ids_path.empty() && f.steps.empty(), f.max_elements);
    std::vector<std::uint64_t> labels;
    if (!f.ids_path.empty()) {
      labels = dmhnsw::load_id_list(f.ids_path);
      if (labels.size() != n)
        throw std::invalid_argument("--ids " + f.ids_path + " has " + std::to_string(labels.size()) +
                                    " ids but " + f.base_path + " has " + std::to_string(n) + " rows");
    }
    std::vector<Step> steps;
    std::size_t capacity = n;  // the build's rows and every insert step's (if none reuses)
    for (const std::string& text : f.steps) {
      steps.push_back(dmhnsw::hnswlib_churn::parse_step(text));
      if (steps.back().op == "insert") capacity += dmhnsw::probe(steps.back().data).n;
    }

    const std::string metric_name(dmhnsw::to_string(metric));
    DispatchedSpace space(metric, dim);
    std::printf("hnswlib-bench: base %s (%zu x %zu), %s, %zu queries from %s, k=%zu, M=%zu, "
                "efConstruction=%zu, threads=%u, seed=%zu, kernel %s\n",
                f.base_path.c_str(), n, dim, metric_name.c_str(), nq, qs.source.c_str(), f.k, f.m,
                f.ef_construction, f.threads, f.seed, space.kernel_name().c_str());
    std::fflush(stdout);

    if (!f.load_path.empty() && (!f.save_path.empty() || !f.ids_path.empty() || !f.steps.empty()))
      throw std::invalid_argument("--load: not with --save, --ids or --step (it searches a saved index as it is)");
    std::unique_ptr<hnswlib::HierarchicalNSW<float>> loaded =
        f.load_path.empty() ? std::make_unique<hnswlib::HierarchicalNSW<float>>(&space, capacity, f.m,
                                                                                 f.ef_construction, f.seed)
                            : load_index(space, f, n, dim);
    hnswlib::HierarchicalNSW<float>& index = *loaded;
    const double build_seconds = f.load_path.empty() ? build(index, base, labels, f.threads) : 0.0;
    if (!f.save_path.empty()) save_index(index, f.save_path);

    ChurnIndex churn(index, f.replace_deleted);
    std::vector<RunResult> runs;
    auto search = [&] {
      if (!labels.empty() || !steps.empty()) check_truth_live(f, qs, churn);
      std::printf("%9s %10s %12s %10s %10s %12s %10s\n", "efSearch",
                  ("recall@" + std::to_string(f.k)).c_str(), "QPS", "p50 us", "p99 us", "dist/query",
                  "hops/query");
      for (std::size_t ef : f.ef_search) {
        const RunResult r = run_queries(index, qs, f.k, ef, f.threads);
        std::printf("%9zu %10.4f %12.1f %10.1f %10.1f %12.1f %10.1f\n", r.ef, r.recall, r.qps,
                    r.p50_us, r.p99_us, r.dist_comps, r.hops);
        std::fflush(stdout);
        runs.push_back(r);
      }
    };
    std::vector<StepResult> results;
    bool searched = false;
    for (const Step& s : steps) {
      if (s.op == "query") {
        search();
        searched = true;
      } else {
        results.push_back(run_step(s, churn, index, dim, f.threads));
      }
    }
    if (!searched) search();
    if (!f.json_path.empty())
      write_report(f, qs, n, dim, metric_name, space.kernel_name(), build_seconds, runs, results, index);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
