// workload: a query stream (warm-up + measured) drawn from a query pool, written as a
// dmhnsw workload file (common/workload.hpp), with a summary of its skew.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/version.hpp"
#include "common/dataset.hpp"
#include "common/workload.hpp"

int main(int argc, char** argv) {
  CLI::App app{"workload: generate a query workload file from a query pool and its ground truth"};
  app.set_version_flag("--version", dmhnsw::version_line("workload"));
  std::string queries_path, gt_path, out_path, dist_text = "uniform";
  std::uint64_t count = 0, warmup = 0, seed = 1;
  std::size_t clusters = 0, gt_k = 0;
  app.add_option("--queries", queries_path, "query pool vectors (.fvecs .fbin .bvecs .u8bin .i8bin)")->required();
  app.add_option("--groundtruth", gt_path, "ground truth of the pool (.ivecs or .ibin), one row per pool vector")->required();
  app.add_option("--dist", dist_text, "distribution: uniform | zipf:S | hot-clusters:S (Zipf exponent S)")
      ->capture_default_str();
  app.add_option("--count", count, "measured queries (>= 1)")->required()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--warmup", warmup, "warm-up queries before the measured ones")
      ->capture_default_str()->check(CLI::Range(std::uint64_t{0}, std::uint64_t{1} << 40));
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--out", out_path, "output workload file")->required();
  app.add_option("--clusters", clusters, "hot-clusters: k-means clusters (0: about sqrt(pool size))")
      ->capture_default_str();
  app.add_option("--gt-k", gt_k, "ground-truth ids kept per query (0: all)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    const auto t0 = std::chrono::steady_clock::now();
    dmhnsw::WorkloadSpec spec;
    try {
      spec.distribution = dmhnsw::Distribution::parse(dist_text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--dist: ") + e.what());
    }
    if (clusters != 0 && spec.distribution.kind != dmhnsw::Distribution::Kind::HotClusters)
      throw std::invalid_argument("--clusters only applies to --dist hot-clusters:S");
    spec.count = count;
    spec.warmup = warmup;
    spec.seed = seed;
    spec.clusters = clusters;
    spec.gt_k = gt_k;

    const dmhnsw::FloatMatrix pool = dmhnsw::load_vectors_as_float(queries_path);
    const dmhnsw::IdMatrix gt = dmhnsw::load_ids(gt_path);
    if (gt.n() != pool.n())
      throw std::invalid_argument(gt_path + " has " + std::to_string(gt.n()) +
                                  " rows but " + queries_path + " has " +
                                  std::to_string(pool.n()) + " queries");
    if (gt_k > gt.d())
      throw std::invalid_argument("--gt-k " + std::to_string(gt_k) + " exceeds k=" +
                                  std::to_string(gt.d()) + " of " + gt_path);

    const dmhnsw::Workload w = dmhnsw::generate_workload(pool, gt, spec);
    dmhnsw::write_workload(out_path, w);
    const auto all = dmhnsw::summarize(w);
    const auto measured = dmhnsw::summarize(
        std::span<const std::uint32_t>(w.pool_index).subspan(w.warmup_count), w.pool_size);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::printf("workload: %s\n", out_path.c_str());
    std::printf("  distribution   %s (seed %llu)%s\n", w.distribution.c_str(),
                static_cast<unsigned long long>(w.seed),
                w.clusters ? (" over " + std::to_string(w.clusters) + " clusters").c_str() : "");
    std::printf("  pool           %llu queries x %zu dims, ground truth k=%zu\n",
                static_cast<unsigned long long>(w.pool_size), w.dim(), w.k());
    std::printf("  stream         %llu warm-up + %llu measured\n",
                static_cast<unsigned long long>(w.warmup_count),
                static_cast<unsigned long long>(w.measured_count));
    std::printf("  distinct       %llu (all), %llu (measured)\n",
                static_cast<unsigned long long>(all.distinct),
                static_cast<unsigned long long>(measured.distinct));
    std::printf("  top 1%% share   %.1f%% (all), %.1f%% (measured); top 1%% = %llu queries\n",
                100.0 * all.top1pct_share, 100.0 * measured.top1pct_share,
                static_cast<unsigned long long>(all.top_count));
    std::printf("  file           %.2f MiB, %.2fs\n",
                std::filesystem::file_size(out_path) / double(1 << 20), secs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
