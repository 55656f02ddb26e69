#pragma once
// The flags both single-machine references take (hnswlib-bench, faiss-bench): the data, the
// queries and their ground truth, the HNSW parameters, the threads and the report, with one
// definition, so that a comparison runs both with the same command line.
#include <CLI/CLI.hpp>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/dataset.hpp"
#include "common/distance.hpp"

namespace dmhnsw::bench {

struct BenchFlags {
  std::string base_path, workload_path, query_path, truth_path, metric_text = "l2", json_path;
  std::size_t m = 16, ef_construction = 200, k = 10, max_elements = 0, seed = 0;
  std::vector<std::size_t> ef_search = {10, 20, 40, 80, 160};
  unsigned threads = 0;

  /// What the tools say differently in their help.
  struct Help {
    std::string metric, ef_search, threads, seed;
  };

  /// Registers --base, --workload | --queries with --groundtruth, --metric, --m,
  /// --ef-construction, --ef-search, --k, --threads, --seed, --max-elements and --json.
  void add_common(CLI::App& app, const Help& h) {
    app.add_option("--base", base_path, "base vectors, label = row id (.fvecs .bvecs .fbin .u8bin .i8bin)")
        ->required();
    auto* workload_opt = app.add_option(
        "--workload", workload_path,
        "dmhnsw workload file: its measured queries and their ground truth (warm-up part skipped)");
    auto* query_opt =
        app.add_option("--queries", query_path, "query vectors (same formats as --base); needs --groundtruth");
    auto* truth_opt = app.add_option(
        "--groundtruth", truth_path,
        "exact neighbour ids of each query (.ivecs .ibin), at least --k per row; needs --queries");
    workload_opt->excludes(query_opt)->excludes(truth_opt);
    query_opt->needs(truth_opt);
    truth_opt->needs(query_opt);
    app.add_option("--metric", metric_text, h.metric)->capture_default_str();
    app.add_option("--m", m, "HNSW M: links per node on upper layers (2*M on layer 0)")
        ->capture_default_str()->check(CLI::Range(std::size_t{2}, std::size_t{10000}));
    app.add_option("--ef-construction", ef_construction, "candidate list size while building")
        ->capture_default_str()->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
    app.add_option("--ef-search", ef_search, h.ef_search)
        ->delimiter(',')->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
    app.add_option("--k", k, "neighbours returned per query; recall@k is measured")
        ->capture_default_str()->check(CLI::Range(std::size_t{1}, dmhnsw::kMaxDim));
    app.add_option("--threads", threads, h.threads)->capture_default_str()->check(CLI::Range(0u, 1024u));
    app.add_option("--seed", seed, h.seed)->capture_default_str()->check(non_negative());
    app.add_option("--max-elements", max_elements,
                   "index only the first N base rows (0: all); the ground truth must refer to those rows only")
        ->capture_default_str()->check(non_negative());
    app.add_option("--json", json_path, "write the parameters and results to this JSON file");
  }

  /// Parses the command line; the exit code when it is not a run (--help, a bad flag).
  std::optional<int> parse(CLI::App& app, int argc, char** argv) {
    try {
      app.parse(argc, argv);
      if (workload_path.empty() && query_path.empty())
        throw CLI::RequiredError("--workload or --queries with --groundtruth");
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    return std::nullopt;
  }

  /// --metric, naming the flag when it is not l2 or ip.
  dmhnsw::Metric metric() const {
    try {
      return dmhnsw::parse_metric(metric_text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--metric: ") + e.what());
    }
  }

  /// CLI11 2.1 would wrap "-1" into a huge unsigned value.
  static CLI::Validator non_negative() {
    return CLI::Validator(
        [](std::string& text) { return text.find('-') == std::string::npos ? std::string() : "must be >= 0, got " + text; },
        "", "non-negative");
  }
};

}  // namespace dmhnsw::bench
