// dhnsw-build: builds a d-HNSW index (balanced partitions, one Faiss sub-HNSW each, the
// meta-HNSW over the centroids) and writes the region images memnodes serve with
// `memnode --load IMAGE --id N`.
//
// With --memnodes 1 the image is exactly --out; with N > 1 memnodes, memnode i's image is
// --out + "." + i (e.g. index.img.0, index.img.1). A short summary goes to stdout, the full
// report (options, partition sizes, times, layout) to --json.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "common/version.hpp"
#include "common/dataset.hpp"
#include "common/json_file.hpp"
#include "common/distance.hpp"
#include "common/units.hpp"
#include "compute/codes.hpp"
#include "compute/dhnsw/build.hpp"

namespace {

/// The short summary on stdout (the full report goes to --json).
void print_summary(const dmhnsw::dhnsw::BuiltIndex& built, const dmhnsw::dhnsw::BuildOptions& o,
                   const nlohmann::json& report, const std::vector<dmhnsw::memory::ImageInfo>& infos) {
  using namespace dmhnsw;
  const auto& p = report["partitions"];
  std::printf("  partitions  %u (%s k-means, seed %llu), sizes min %llu / mean %.1f / max %llu, max/mean %.3f\n",
              built.options.partitions, o.plain_kmeans ? "plain" : "capacity-constrained",
              static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(p["min"].get<uint64_t>()),
              p["mean"].get<double>(), static_cast<unsigned long long>(p["max"].get<uint64_t>()),
              built.partition_max_over_mean);
  std::printf("  sub-HNSW    M %u, efConstruction %u; meta-HNSW M %u over %u centroids (%s)\n", o.m,
              o.ef_construction, o.meta_m, built.options.partitions,
              format_bytes(built.header.meta_index_bytes).c_str());
  std::printf("  layout      gaps internal %.3f, overflow %.3f; metadata block %s at %llu\n",
              o.layout.internal_gap, o.layout.overflow_gap, format_bytes(built.header.block_bytes).c_str(),
              static_cast<unsigned long long>(dhnsw::kMetadataOffset));
  std::printf("  time        partition %.2f s, sub-HNSWs + meta-HNSW %.2f s, layout %.2f s\n",
              built.seconds_partition, built.seconds_build_subs, built.seconds_layout);
  for (const auto& i : infos)
    std::printf("  image       %s: memnode %u, region %s, file %s\n", i.path.c_str(), unsigned{i.memnode_id},
                format_bytes(i.region_size).c_str(), format_bytes(i.file_bytes).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dmhnsw;
  CLI::App app{
      "dhnsw-build: build a d-HNSW index (balanced partitions, sub-HNSWs, meta-HNSW) into region images.\n"
      "With --memnodes 1 the image is --out; with N > 1, memnode i's image is --out.i (serve it with\n"
      "`memnode --load IMAGE --id i`)."};
  app.set_version_flag("--version", dmhnsw::version_line("dhnsw-build"));
  dhnsw::BuildOptions o;
  std::string data_path, out_path, json_path, metric_text = "l2";
  size_t max_vectors = 0;
  app.add_option("--data", data_path, "vectors (.fvecs .fbin .bvecs .u8bin .i8bin); global id = row")->required();
  app.add_option("--partitions", o.partitions, "partitions / sub-HNSWs (0: round(sqrt(n)))")->capture_default_str();
  app.add_option("--m", o.m, "HNSW M of the sub-HNSWs (2..4096)")->capture_default_str()->check(CLI::Range(2u, 4096u));
  app.add_option("--ef-construction", o.ef_construction, "efConstruction of the sub-HNSWs and the meta-HNSW (>= 1)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--out", out_path, "image file (with --memnodes N > 1: OUT.0 .. OUT.<N-1>)")->required();
  app.add_option("--memnodes", o.memnodes, "memnodes the groups are spread over (round-robin)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 65535u));
  app.add_option("--meta-m", o.meta_m, "HNSW M of the meta-HNSW (2..4096)")
      ->capture_default_str()
      ->check(CLI::Range(2u, 4096u));
  app.add_option("--internal-gap", o.layout.internal_gap, "internal gap after each array, share of it (0..1000)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--overflow-gap", o.layout.overflow_gap, "shared overflow gap of a group, share of its two blocks (0..1000)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--seed", o.seed, "partitioning seed")->capture_default_str();
  app.add_flag("--plain-kmeans", o.plain_kmeans, "plain k-means instead of capacity-constrained (unbalanced)");
  app.add_option("--kmeans-iterations", o.kmeans_iterations, "partitioning rounds (>= 1)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  app.add_option("--kmeans-max-train", o.kmeans_max_train, "train centroids on a sample of N vectors (0: all)")
      ->capture_default_str();
  app.add_option("--max-vectors", max_vectors, "index only the first N vectors (0: all)")->capture_default_str();
  app.add_option("--metric", metric_text, "l2 | ip: the search metric of the sub-HNSWs")->capture_default_str();
  std::string partition_metric_text = "l2";
  app.add_option("--partition-metric", partition_metric_text,
                 "l2 | ip: metric of the k-means partitioning and of the meta-HNSW's routing (l2 also suits "
                 "unit-length inner-product data)")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "threads building sub-HNSWs (0: all cores)")->capture_default_str();
  dhnsw::add_boundary_flags(app, o.boundary);
  std::string codes_text = "none";
  app.add_option("--codes", codes_text,
                 "compressed vectors beside the vectors in each sub-HNSW, for `computenode query --rerank`: none, "
                 "sq8 or pq:M (trained on up to 65,536 rows spread over the data)")
      ->capture_default_str();
  app.add_option("--json", json_path, "write the JSON report to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    Metric metric;
    try {
      metric = parse_metric(metric_text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--metric: ") + e.what());
    }
    try {
      o.partition_metric = parse_metric(partition_metric_text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--partition-metric: ") + e.what());
    }
    if (out_path.empty()) throw std::invalid_argument("--out: empty path");
    o.codes = compute::parse_codes(codes_text);

    LoadOptions load;
    if (max_vectors != 0) load.max_rows = max_vectors;
    FloatMatrix m;
    try {
      m = load_vectors_as_float(data_path, load);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--data: ") + e.what());
    }
    if (!m.contiguous()) m = m.copy();
    if (o.partitions > m.n())
      throw std::invalid_argument("--partitions: " + std::to_string(o.partitions) + " partitions for " +
                                  std::to_string(m.n()) + " vectors in " + data_path);
    std::printf("dhnsw-build: %s: %zu x %zu, metric %s\n", data_path.c_str(), m.n(), m.d(),
                std::string(to_string(metric)).c_str());
    std::fflush(stdout);

    o.progress = true;
    const dhnsw::BuiltIndex built = dhnsw::build_index(m.data(), m.n(), static_cast<uint32_t>(m.d()), metric, o);
    const auto infos = dhnsw::write_images(built, out_path);

    nlohmann::json report = built.report();
    report["data"] = data_path;
    nlohmann::json images = nlohmann::json::array();
    for (const auto& i : infos)
      images.push_back({{"path", i.path}, {"memnode", i.memnode_id}, {"region_bytes", i.region_size},
                        {"file_bytes", i.file_bytes}, {"body_checksum", i.body_checksum}});
    report["images"] = images;

    print_summary(built, o, report, infos);
    if (!json_path.empty()) {
      write_json_file(json_path, report, "--json");
      std::printf("  report      %s\n", json_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dhnsw-build: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
