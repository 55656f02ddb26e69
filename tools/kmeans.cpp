// kmeans: SHINE balanced k-means (router/partition.hpp) over the first vectors of a file.
// Prints the cluster sizes, the imbalance and a 64-bit FNV-1a hash of the centroid bytes on
// stdout (deterministic: the same input and seed print the same text in every process); the
// elapsed time goes to stderr.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "common/version.hpp"
#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "router/partition.hpp"
#include "router/partition_detail.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kmeans: balanced k-means of a vector file (SHINE logical partitioning)"};
  app.set_version_flag("--version", dmhnsw::version_line("kmeans"));
  std::string data_path, metric_text = "l2";
  uint32_t k = 0, iterations = dmhnsw::router::BalancedKMeansOptions{}.iterations;
  uint64_t seed = 1;
  std::size_t max_elements = 0;
  double max_imbalance = dmhnsw::router::BalancedKMeansOptions{}.max_imbalance;
  app.add_option("--data", data_path, "vectors (.fvecs .fbin .bvecs .u8bin .i8bin)")->required();
  app.add_option("--k", k, "clusters (>= 1)")->required()->check(CLI::Range(1u, 1u << 20));
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--max-elements", max_elements, "cluster only the first N vectors (0: all)")
      ->capture_default_str();
  app.add_option("--metric", metric_text, "l2 | ip")->capture_default_str();
  app.add_option("--iterations", iterations, "maximum k-means iterations")->capture_default_str();
  app.add_option("--max-imbalance", max_imbalance, "accepted largest/smallest cluster size")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    dmhnsw::Metric metric;
    try {
      metric = dmhnsw::parse_metric(metric_text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--metric: ") + e.what());
    }
    dmhnsw::LoadOptions load;
    if (max_elements != 0) load.max_rows = max_elements;
    load.allow_view = true;
    dmhnsw::FloatMatrix m = dmhnsw::load_vectors_as_float(data_path, load);
    if (!m.contiguous()) m = m.copy();

    dmhnsw::router::BalancedKMeansOptions opts;
    opts.iterations = iterations;
    opts.seed = seed;
    opts.max_imbalance = max_imbalance;
    const auto t0 = std::chrono::steady_clock::now();
    const dmhnsw::router::Clustering c = dmhnsw::router::balanced_kmeans(
        m.data(), m.n(), static_cast<uint32_t>(m.d()), k, metric, opts);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::printf("kmeans: %s\n", data_path.c_str());
    std::printf("  points     %zu x %zu, metric %s\n", m.n(), m.d(),
                std::string(dmhnsw::to_string(metric)).c_str());
    std::printf("  k          %u (seed %llu, iterations <= %u)\n", k,
                static_cast<unsigned long long>(seed), iterations);
    std::printf("  sizes     ");
    for (uint64_t s : c.sizes) std::printf(" %llu", static_cast<unsigned long long>(s));
    std::printf("\n  imbalance  %.4f\n", c.imbalance());
    std::printf("  centroids  fnv1a64 %016llx\n",
                static_cast<unsigned long long>(
                    dmhnsw::router::detail::fnv1a64(c.centroids.data(), c.centroids.size())));
    std::printf("  offsets    fnv1a64 %016llx (oracle: largest/mean load %.4f, nearest centroid %.4f)\n",
                static_cast<unsigned long long>(dmhnsw::router::detail::fnv1a64(c.offsets.data(), c.offsets.size())),
                c.oracle_load_balanced, c.oracle_load_nearest);
    std::fprintf(stderr, "kmeans: %.3f s\n", secs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kmeans: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
