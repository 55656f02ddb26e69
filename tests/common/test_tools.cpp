// The data tools (datagen, groundtruth, workload), run as processes from DMHNSW_BIN_DIR.
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "common/workload.hpp"
#include "test_util.hpp"

using namespace dmhnsw;
using dmhnsw::test::TempDir;

namespace {

using test::RunResult;
using test::slurp;

RunResult run(const TempDir& tmp, const std::string& tool, const std::string& args) {
  return test::run_tool(tmp, tool, args);
}

double exact_distance(Metric metric, const float* a, const float* b, std::size_t d) {
  double acc = 0;
  for (std::size_t i = 0; i < d; ++i) {
    if (metric == Metric::L2) {
      const double t = static_cast<double>(a[i]) - b[i];
      acc += t * t;
    } else {
      acc += static_cast<double>(a[i]) * b[i];
    }
  }
  return acc;
}

/// Brute-force top-k (ids sorted by distance; ip: by descending inner product).
std::vector<std::vector<int>> brute_force(const FloatMatrix& base, const FloatMatrix& q,
                                          std::size_t k, Metric metric) {
  std::vector<std::vector<int>> out(q.n());
  std::vector<double> dist(base.n());
  std::vector<int> idx(base.n());
  for (std::size_t i = 0; i < q.n(); ++i) {
    for (std::size_t j = 0; j < base.n(); ++j) {
      const double v = exact_distance(metric, q.row(i), base.row(j), base.d());
      dist[j] = metric == Metric::L2 ? v : -v;
    }
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(),
                      [&](int a, int b) { return dist[a] < dist[b] || (dist[a] == dist[b] && a < b); });
    out[i].assign(idx.begin(), idx.begin() + static_cast<long>(k));
  }
  return out;
}

/// Ids may differ only between (near-)ties: compare the distances at each rank.
void require_same_neighbours(const FloatMatrix& base, const FloatMatrix& q, const IdMatrix& got,
                             const std::vector<std::vector<int>>& want, std::size_t k,
                             Metric metric, double tol) {
  std::size_t differing = 0;
  for (std::size_t i = 0; i < q.n(); ++i)
    for (std::size_t j = 0; j < k; ++j) {
      const int g = got.row(i)[j], w = want[i][j];
      if (g == w) continue;
      ++differing;
      const double dg = exact_distance(metric, q.row(i), base.row(static_cast<std::size_t>(g)), base.d());
      const double dw = exact_distance(metric, q.row(i), base.row(static_cast<std::size_t>(w)), base.d());
      INFO("query " << i << " rank " << j << ": id " << g << " (" << dg << ") vs " << w << " ("
                    << dw << ")");
      REQUIRE(std::abs(dg - dw) <= tol * (1.0 + std::abs(dw)));
    }
  // ties are rare: most ids agree exactly
  CHECK(differing <= q.n() * k / 20);
}

}  // namespace

TEST_CASE("datagen + groundtruth agree with brute force", "[tools]") {
  TempDir tmp;
  const std::string base = tmp.file("base.fvecs"), queries = tmp.file("q.fbin");
  auto r = run(tmp, "datagen",
               "--n 3000 --d 24 --clusters 6 --spread 0.3 --seed 5 --queries 40 --out-base " +
                   base + " --out-queries " + queries);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("3000 x 24") != std::string::npos);
  const FloatMatrix b = load_vectors_as_float(base), q = load_vectors_as_float(queries);
  REQUIRE(b.n() == 3000);
  REQUIRE(q.n() == 40);
  REQUIRE(q.d() == 24);

  SECTION("l2, ivecs") {
    const std::string gt = tmp.file("gt.ivecs");
    r = run(tmp, "groundtruth", "--base " + base + " --queries " + queries +
                                    " --k 10 --metric l2 --threads 2 --batch 16 --base-block 700 --out " + gt);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    const IdMatrix ids = load_ids(gt);
    REQUIRE(ids.n() == 40);
    REQUIRE(ids.d() == 10);
    require_same_neighbours(b, q, ids, brute_force(b, q, 10, Metric::L2), 10, Metric::L2, 1e-4);
  }
  SECTION("ip, ibin with distances") {
    const std::string gt = tmp.file("gt.ibin");
    r = run(tmp, "groundtruth",
            "--base " + base + " --queries " + queries + " --k 7 --metric ip --base-block 5 --out " + gt);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    const GroundTruth g = load_groundtruth(gt);
    REQUIRE(g.ids.n() == 40);
    REQUIRE(g.ids.d() == 7);
    REQUIRE(g.distances.has_value());
    require_same_neighbours(b, q, g.ids, brute_force(b, q, 7, Metric::IP), 7, Metric::IP, 1e-4);
    for (std::size_t i = 0; i < 40; ++i)
      for (std::size_t j = 0; j < 7; ++j) {
        const double ip = exact_distance(Metric::IP, q.row(i), b.row(g.ids.row(i)[j]), 24);
        REQUIRE(g.distances->row(i)[j] == Approx(ip).margin(1e-3));
      }
  }
}

TEST_CASE("groundtruth reproduces bigann10k's shipped top-10", "[tools][real]") {
  TempDir tmp;
  const std::string dir = test::kSharedData + "/bigann10k/";
  const std::string gt = tmp.file("gt.ivecs");
  const auto r = run(tmp, "groundtruth", "--base " + dir + "bigann10k_base.bvecs --queries " +
                                             dir + "bigann10k_query.fvecs --k 10 --metric l2 --out " + gt);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const IdMatrix ours = load_ids(gt);
  const IdMatrix shipped = load_ids(dir + "bigann10k_groundtruth.ivecs", {.max_rows = 100});
  const FloatMatrix base = load_vectors_as_float(dir + "bigann10k_base.bvecs");
  const FloatMatrix q = load_vectors_as_float(dir + "bigann10k_query.fvecs", {.max_rows = 100});
  REQUIRE(ours.n() == 100);
  std::vector<std::vector<int>> want(100);
  for (std::size_t i = 0; i < 100; ++i) want[i].assign(shipped.row(i), shipped.row(i) + 10);
  // integer-valued vectors: distances are exact, ties must be exact ties
  require_same_neighbours(base, q, ours, want, 10, Metric::L2, 0.0);
}

TEST_CASE("workload tool writes a readable workload and a summary", "[tools]") {
  TempDir tmp;
  const std::string dir = test::kSharedData + "/bigann10k/";
  const std::string out = tmp.file("w.dmw");
  auto r = run(tmp, "workload", "--queries " + dir + "bigann10k_query.fvecs --groundtruth " + dir +
                                    "bigann10k_groundtruth.ivecs --dist zipf:1 --count 5000 "
                                    "--warmup 1000 --seed 3 --gt-k 10 --out " + out);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("top 1% share") != std::string::npos);
  CHECK(r.out.find("distinct") != std::string::npos);
  const Workload w = read_workload(out);
  CHECK(w.warmup_count == 1000);
  CHECK(w.measured_count == 5000);
  CHECK(w.k() == 10);
  CHECK(w.distribution == "zipf:1");
  // same as the library with the same spec
  const FloatMatrix pool = load_vectors_as_float(dir + "bigann10k_query.fvecs");
  WorkloadSpec spec;
  spec.distribution = Distribution::parse("zipf:1");
  spec.count = 5000;
  spec.warmup = 1000;
  spec.seed = 3;
  CHECK(generate_stream(pool, spec) == w.pool_index);

  r = run(tmp, "workload", "--queries " + dir + "bigann10k_query.fvecs --groundtruth " + dir +
                               "bigann10k_groundtruth.ivecs --dist hot-clusters:1 --clusters 4 "
                               "--count 300 --out " + tmp.file("h.dmw"));
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(read_workload(tmp.file("h.dmw")).clusters <= 4);
}

TEST_CASE("datagen is deterministic and writes integer formats", "[tools]") {
  TempDir tmp;
  for (const char* name : {"a", "b"}) {
    const auto r = run(tmp, "datagen",
                       std::string("--n 500 --d 9 --clusters 3 --seed 77 --queries 20 --out-base ") +
                           tmp.file(std::string(name) + ".u8bin") + " --out-queries " +
                           tmp.file(std::string(name) + "_q.i8bin"));
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
  }
  CHECK(test::read_bytes(tmp.file("a.u8bin")) == test::read_bytes(tmp.file("b.u8bin")));
  CHECK(test::read_bytes(tmp.file("a_q.i8bin")) == test::read_bytes(tmp.file("b_q.i8bin")));
  CHECK(load_vectors_as_float(tmp.file("a.u8bin")).n() == 500);
  CHECK(load_vectors_as_float(tmp.file("a_q.i8bin")).d() == 9);
  // a different seed gives different data
  const auto r = run(tmp, "datagen", "--n 500 --d 9 --clusters 3 --seed 78 --queries 0 --out-base " +
                                         tmp.file("c.u8bin"));
  REQUIRE(r.code == 0);
  CHECK(test::read_bytes(tmp.file("a.u8bin")) != test::read_bytes(tmp.file("c.u8bin")));
}

TEST_CASE("tools report bad flags and inputs", "[tools]") {
  TempDir tmp;
  const std::string dir = test::kSharedData + "/bigann10k/";
  auto fails_with = [&](const std::string& tool, const std::string& args, const std::string& needle) {
    const auto r = run(tmp, tool, args);
    INFO(tool << " " << args << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.code != 0);
    CHECK((r.err + r.out).find(needle) != std::string::npos);
  };
  const std::string q = dir + "bigann10k_query.fvecs", b = dir + "bigann10k_base.bvecs";
  const std::string g = dir + "bigann10k_groundtruth.ivecs";
  fails_with("groundtruth", "--base " + tmp.file("nope.fvecs") + " --queries " + q + " --k 5 --out " +
                                tmp.file("x.ivecs"), "nope.fvecs");
  fails_with("groundtruth", "--base " + b + " --queries " + q + " --k 5 --metric cosine --out " +
                                tmp.file("x.ivecs"), "cosine");
  fails_with("groundtruth", "--base " + b + " --queries " + q + " --k 5 --out " + tmp.file("x.fvecs"),
             "--out");
  fails_with("groundtruth", "--base " + b + " --queries " + q + " --k 20000 --out " + tmp.file("x.ivecs"),
             "--k");
  fails_with("groundtruth", "--base " + b + " --queries " + q + " --bogus 1 --out " + tmp.file("x.ivecs"),
             "bogus");
  fails_with("groundtruth", "--base " + b + " --queries " + q + " --k 5", "--out");
  fails_with("workload", "--queries " + q + " --groundtruth " + q + " --count 10 --out " +
                             tmp.file("w.dmw"), "bigann10k_query.fvecs");
  fails_with("workload", "--queries " + q + " --groundtruth " + g + " --dist zipf:x --count 10 --out " +
                             tmp.file("w.dmw"), "--dist");
  fails_with("workload", "--queries " + q + " --groundtruth " + g + " --count 0 --out " +
                             tmp.file("w.dmw"), "--count");
  fails_with("workload", "--queries " + b + " --groundtruth " + g + " --count 10 --out " +
                             tmp.file("w.dmw"), "10000");
  fails_with("datagen", "--n 10 --d 0 --out-base " + tmp.file("x.fvecs") + " --queries 0", "--d");
  fails_with("datagen", "--n 10 --d 4 --out-base " + tmp.file("x.txt") + " --queries 0", "x.txt");
  fails_with("datagen", "--n 10 --d 4 --out-base " + tmp.file("x.fvecs"), "--out-queries");
  // a malformed input file: the error names the file and the offset
  {
    test::Bytes bad;
    bad.put(std::int32_t{4}).put(1.0f).put(2.0f);
    bad.save(tmp.file("bad.fvecs"));
    const auto r = run(tmp, "groundtruth", "--base " + tmp.file("bad.fvecs") + " --queries " + q +
                                               " --k 1 --out " + tmp.file("x.ivecs"));
    CHECK(r.code != 0);
    CHECK(r.err.find("error: ") != std::string::npos);
    CHECK(r.err.find("bad.fvecs: byte offset 0") != std::string::npos);
  }
  const auto help = run(tmp, "groundtruth", "--help");
  CHECK(help.code == 0);
  CHECK(help.out.find("--metric") != std::string::npos);
}
