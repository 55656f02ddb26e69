// datagen: a synthetic Gaussian-mixture base set and a query pool drawn from the same mixture.
//
// Cluster centres are N(0, I_d); a point picks a centre uniformly and adds N(0, spread^2 I_d).
// Base, queries and centres come from independent seeded streams, so changing --queries does
// not change the base set and vice versa. Output format by extension (.fvecs .fbin .bvecs
// .u8bin .i8bin); integer formats get a fixed affine quantisation: the range
// +-4*sqrt(1 + spread^2) (four standard deviations of the mixture's marginal) maps onto the
// element type's range, values outside it are clamped (and counted in the summary).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/version.hpp"
#include "common/dataset.hpp"
#include "common/progress.hpp"
#include "common/workload.hpp"

namespace {

using dmhnsw::FloatMatrix;

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) {
  // splitmix64 finaliser: decorrelated seeds for independent streams.
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Quantizer {
  dmhnsw::ElementType type = dmhnsw::ElementType::F32;
  double range = 1.0;  // |x| that maps to the end of the integer range
  std::uint64_t clamped = 0;

  float operator()(double x) {
    if (type == dmhnsw::ElementType::F32) return static_cast<float>(x);
    double v = 0, lo = 0, hi = 0;
    if (type == dmhnsw::ElementType::U8) {
      v = std::nearbyint(127.5 + x * (127.5 / range));
      lo = 0;
      hi = 255;
    } else {
      v = std::nearbyint(x * (127.0 / range));
      lo = -127;
      hi = 127;
    }
    if (v < lo || v > hi) {
      ++clamped;
      v = std::clamp(v, lo, hi);
    }
    return static_cast<float>(v);
  }
};

FloatMatrix sample(const char* what, std::size_t n, std::size_t d, const std::vector<double>& centres,
                   std::size_t clusters, double spread, std::uint64_t seed, Quantizer& quant) {
  dmhnsw::Rng rng(seed);
  FloatMatrix m(n, d);
  dmhnsw::Progress progress(std::string("datagen ") + what, n, "vectors");
  for (std::size_t i = 0; i < n; ++i) {
    const double* c = centres.data() + rng.uniform(clusters) * d;
    float* row = m.mutable_row(i);
    for (std::size_t j = 0; j < d; ++j) row[j] = quant(c[j] + spread * rng.normal());
    progress.add();
  }
  progress.finish();
  return m;
}

std::string human_bytes(std::uintmax_t b) {
  char buf[64];
  if (b >= (1u << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1u << 30));
  else if (b >= (1u << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1u << 20));
  else std::snprintf(buf, sizeof buf, "%ju B", b);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"datagen: Gaussian-mixture base vectors and a query pool from the same mixture"};
  app.set_version_flag("--version", dmhnsw::version_line("datagen"));
  std::size_t n = 0, d = 0, clusters = 16, queries = 1000;
  double spread = 0.5;
  std::uint64_t seed = 1;
  std::string out_base, out_queries;
  app.add_option("--n", n, "number of base vectors")->required()->check(CLI::Range(std::size_t{1}, std::size_t{4294967295}));
  app.add_option("--d", d, "dimension (1..65536)")->required()->check(CLI::Range(std::size_t{1}, dmhnsw::kMaxDim));
  app.add_option("--clusters", clusters, "number of mixture components (>= 1)")
      ->capture_default_str()->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24));
  app.add_option("--spread", spread, "standard deviation of a component around its centre (centres are N(0,1))")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--queries", queries, "number of query-pool vectors (0: no query file)")
      ->capture_default_str()->check(CLI::Range(std::size_t{0}, std::size_t{4294967295}));
  app.add_option("--out-base", out_base, "base output file (.fvecs .fbin .bvecs .u8bin .i8bin)")->required();
  app.add_option("--out-queries", out_queries, "query-pool output file (format by extension; required if --queries > 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (queries > 0 && out_queries.empty())
      throw std::invalid_argument("--out-queries is required when --queries > 0");
    const auto t0 = std::chrono::steady_clock::now();
    auto check_out = [](const std::string& flag, const std::string& path) {
      const auto fmt = dmhnsw::format_from_path(path);
      if (dmhnsw::is_id_format(fmt))
        throw std::invalid_argument(flag + " " + path + ": ." + std::string(dmhnsw::to_string(fmt)) +
                                    " is an id format, not a vector format");
      return dmhnsw::element_type(fmt);
    };
    Quantizer qb, qq;
    qb.type = check_out("--out-base", out_base);
    if (queries > 0) qq.type = check_out("--out-queries", out_queries);
    if (clusters > n) {
      if (app.count("--clusters") > 0) throw std::invalid_argument("--clusters must not exceed --n");
      clusters = n;  // the default exceeds a tiny --n
    }
    qb.range = qq.range = 4.0 * std::sqrt(1.0 + spread * spread);

    dmhnsw::Rng centre_rng(derive_seed(seed, 0));
    std::vector<double> centres(clusters * d);
    for (double& c : centres) c = centre_rng.normal();

    FloatMatrix base = sample("base", n, d, centres, clusters, spread, derive_seed(seed, 1), qb);
    dmhnsw::write_vectors(out_base, base);
    std::printf("datagen: wrote %zu x %zu base vectors to %s (%s)\n", n, d, out_base.c_str(),
                human_bytes(std::filesystem::file_size(out_base)).c_str());
    if (queries > 0) {
      base = FloatMatrix();
      FloatMatrix q = sample("queries", queries, d, centres, clusters, spread, derive_seed(seed, 2), qq);
      dmhnsw::write_vectors(out_queries, q);
      std::printf("datagen: wrote %zu x %zu query vectors to %s (%s)\n", queries, d,
                  out_queries.c_str(), human_bytes(std::filesystem::file_size(out_queries)).c_str());
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("datagen: clusters=%zu spread=%g seed=%llu", clusters, spread,
                static_cast<unsigned long long>(seed));
    if (qb.type != dmhnsw::ElementType::F32 || qq.type != dmhnsw::ElementType::F32)
      std::printf(" quantised(range +-%.3g, clamped %llu values)", qb.range,
                  static_cast<unsigned long long>(qb.clamped + qq.clamped));
    std::printf(" time=%.2fs\n", secs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
