// tools/hnswlib-bench, run as a process from DMHNSW_BIN_DIR on the real bigann10k data.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/test_util.hpp"
#include "common/dataset.hpp"
#include "common/workload.hpp"

using namespace dmhnsw;
using dmhnsw::test::TempDir;

namespace {

using test::RunResult;
using test::slurp;

RunResult run_bench(const TempDir& tmp, const std::string& args) { return test::run_tool(tmp, "hnswlib-bench", args); }

const std::string kDir = test::kSharedData + "/bigann10k/";
const std::string kBase = kDir + "bigann10k_base.bvecs";
const std::string kQueries = kDir + "bigann10k_query.fvecs";
const std::string kTruth = kDir + "bigann10k_groundtruth.ivecs";

}  // namespace

TEST_CASE("hnswlib-bench reaches high recall on bigann10k and writes its JSON", "[tools]") {
  TempDir tmp;
  const std::string json_path = tmp.file("r.json");
  const auto r = run_bench(tmp, "--base " + kBase + " --queries " + kQueries + " --groundtruth " +
                                    kTruth + " --metric l2 --m 16 --ef-construction 200" +
                                    " --ef-search 100 --k 10 --threads 2 --json " + json_path);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("build: 10000 vectors") != std::string::npos);
  CHECK(r.out.find("recall@10") != std::string::npos);

  const auto j = nlohmann::json::parse(slurp(json_path));
  CHECK(j.at("system") == "hnswlib");
  CHECK(j.at("base") == kBase);
  CHECK(j.at("n") == 10000);
  CHECK(j.at("dim") == 128);
  CHECK(j.at("metric") == "l2");
  CHECK(j.at("m") == 16);
  CHECK(j.at("ef_construction") == 200);
  CHECK(j.at("threads") == 2);
  CHECK(j.at("build_seconds").get<double>() > 0);
  REQUIRE(j.at("runs").size() == 1);
  const auto& run = j.at("runs").at(0);
  CHECK(run.at("ef_search") == 100);
  CHECK(run.at("k") == 10);
  CHECK(run.at("recall").get<double>() >= 0.95);
  CHECK(run.at("recall").get<double>() <= 1.0);
  CHECK(run.at("qps").get<double>() > 0);
  const double p50 = run.at("latency_us").at("p50"), p99 = run.at("latency_us").at("p99");
  CHECK(p50 > 0);
  CHECK(p50 <= p99);
  // at least efSearch distinct candidates are examined on layer 0
  CHECK(run.at("dist_comps_per_query").get<double>() >= 100);
}

TEST_CASE("hnswlib-bench uses only the measured part of a workload", "[tools]") {
  TempDir tmp;
  const FloatMatrix queries = load_vectors_as_float(kQueries);
  const IdMatrix truth = load_ids(kTruth);
  // 10 warm-up queries carrying the ground truth of other queries (recall ~0 if they were
  // measured), then 30 measured queries with their true ground truth.
  constexpr std::size_t kWarmup = 10, kMeasured = 30, kK = 10;
  Workload w;
  w.distribution = "uniform";
  w.seed = 1;
  w.warmup_count = kWarmup;
  w.measured_count = kMeasured;
  w.pool_size = queries.n();
  w.queries = FloatMatrix(kWarmup + kMeasured, queries.d());
  w.groundtruth = IdMatrix(kWarmup + kMeasured, kK);
  for (std::size_t i = 0; i < kWarmup + kMeasured; ++i) {
    const std::size_t q = i < kWarmup ? i : 40 + i;
    const std::size_t t = i < kWarmup ? 99 - i : q;
    w.pool_index.push_back(static_cast<std::uint32_t>(q));
    std::copy_n(queries.row(q), queries.d(), w.queries.mutable_row(i));
    std::copy_n(truth.row(t), kK, w.groundtruth.mutable_row(i));
  }
  const std::string wl = tmp.file("w.dmw"), json_path = tmp.file("w.json");
  write_workload(wl, w);

  const auto r = run_bench(tmp, "--base " + kBase + " --workload " + wl +
                                    " --ef-construction 100 --ef-search 10,100 --threads 2 --json " +
                                    json_path);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(json_path));
  CHECK(j.at("nq") == kMeasured);
  REQUIRE(j.at("runs").size() == 2);
  CHECK(j.at("runs").at(0).at("ef_search") == 10);
  CHECK(j.at("runs").at(1).at("ef_search") == 100);
  CHECK(j.at("runs").at(1).at("recall").get<double>() >= 0.95);
  CHECK(j.at("runs").at(0).at("recall").get<double>() <=
        j.at("runs").at(1).at("recall").get<double>());
}

TEST_CASE("hnswlib-bench reports bad flags and inputs", "[tools]") {
  TempDir tmp;
  auto fails_with = [&](const std::string& args, const std::string& needle) {
    const auto r = run_bench(tmp, args);
    INFO("hnswlib-bench " << args << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.code != 0);
    CHECK((r.err + r.out).find(needle) != std::string::npos);
  };
  const std::string qg = " --queries " + kQueries + " --groundtruth " + kTruth;
  fails_with("--base " + kBase + qg + " --bogus 1", "--bogus");
  fails_with("--base " + tmp.file("nope.bvecs") + qg, "nope.bvecs");
  fails_with("--base " + kBase + " --queries " + kQueries + " --groundtruth " +
                 tmp.file("missing.ivecs"), "missing.ivecs");
  fails_with("--base " + kBase + " --workload " + tmp.file("missing.dmw"), "missing.dmw");
  fails_with("--base " + kBase + qg + " --metric cosine", "cosine");
  fails_with("--base " + kBase, "--workload");
  fails_with("--base " + kBase + " --queries " + kQueries, "--groundtruth");
  fails_with("--base " + kBase + qg + " --ef-search 10,x", "--ef-search");
  fails_with("--base " + kBase + qg + " --k 101", "--k");
  fails_with("--base " + kBase + qg + " --max-elements 1000", "--max-elements");
  fails_with("--base " + kBase + qg + " --json " + tmp.file("no/such/dir/r.json"), "--json");
  fails_with("--base " + kQueries + " --queries " + kBase + " --groundtruth " + kTruth,
             "bigann10k_groundtruth.ivecs");

  const auto help = run_bench(tmp, "--help");
  CHECK(help.code == 0);
  for (const char* flag : {"--base", "--workload", "--queries", "--groundtruth", "--metric", "--m",
                           "--ef-construction", "--ef-search", "--k", "--threads", "--seed",
                           "--max-elements", "--json", "--save-index"})
    CHECK(help.out.find(flag) != std::string::npos);
}
