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

namespace {

/// Rows `rows` of `all` as one matrix.
FloatMatrix pick(const FloatMatrix& all, const std::vector<std::size_t>& rows) {
  FloatMatrix m(rows.size(), all.d());
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::copy(all.row(rows[i]), all.row(rows[i]) + all.d(), m.mutable_row(i));
  return m;
}

void write_id_lines(const std::string& path, const std::vector<std::uint64_t>& ids) {
  std::ofstream out(path);
  for (std::uint64_t id : ids) out << id << "\n";
}

}  // namespace

TEST_CASE("hnswlib-bench churn steps: labels, deletes, inserts into deleted elements, upserts", "[tools]") {
  TempDir tmp;
  const FloatMatrix all = load_vectors_as_float(kBase);
  const FloatMatrix queries = load_vectors_as_float(kQueries, {.max_rows = 100});
  // 5,000 rows under sparse labels; delete the first 1,500; insert rows 5,000-6,499 under new
  // labels; upsert labels 1,500-1,599 with the vectors of rows 6,500-6,599.
  std::vector<std::size_t> base_rows, new_rows, up_rows;
  std::vector<std::uint64_t> base_ids, gone, new_ids, up_ids;
  for (std::size_t r = 0; r < 5000; ++r) {
    base_rows.push_back(r);
    base_ids.push_back(1'000'000 + 3 * r);
  }
  for (std::size_t r = 0; r < 1500; ++r) gone.push_back(base_ids[r]);
  for (std::size_t r = 5000; r < 6500; ++r) {
    new_rows.push_back(r);
    new_ids.push_back(2'000'000 + r);
  }
  for (std::size_t r = 0; r < 100; ++r) {
    up_rows.push_back(6500 + r);
    up_ids.push_back(base_ids[1500 + r]);
  }
  write_fvecs(tmp.file("base.fvecs"), pick(all, base_rows));
  write_id_lines(tmp.file("base_ids.txt"), base_ids);
  write_id_lines(tmp.file("gone.txt"), gone);
  write_fvecs(tmp.file("new.fvecs"), pick(all, new_rows));
  write_id_lines(tmp.file("new_ids.txt"), new_ids);
  write_fvecs(tmp.file("up.fvecs"), pick(all, up_rows));
  write_id_lines(tmp.file("up_ids.txt"), up_ids);
  write_fvecs(tmp.file("q.fvecs"), queries);

  // The live set (label -> row) and its exact top 10 per query.
  std::vector<std::pair<std::uint64_t, std::size_t>> live;
  for (std::size_t r = 1500; r < 5000; ++r) live.emplace_back(base_ids[r], r < 1600 ? 6500 + (r - 1500) : r);
  for (std::size_t i = 0; i < new_rows.size(); ++i) live.emplace_back(new_ids[i], new_rows[i]);
  IdMatrix truth(queries.n(), 10);
  for (std::size_t q = 0; q < queries.n(); ++q) {
    std::vector<std::pair<float, std::uint64_t>> d;
    for (const auto& [id, row] : live) {
      float s = 0;
      for (std::size_t j = 0; j < all.d(); ++j) {
        const float t = queries.row(q)[j] - all.row(row)[j];
        s += t * t;
      }
      d.emplace_back(s, id);
    }
    std::partial_sort(d.begin(), d.begin() + 10, d.end());
    for (std::size_t j = 0; j < 10; ++j) truth.mutable_row(q)[j] = static_cast<std::int32_t>(d[j].second);
  }
  write_ivecs(tmp.file("gt.ivecs"), truth);

  const std::string common = "--base " + tmp.file("base.fvecs") + " --ids " + tmp.file("base_ids.txt") +
                             " --queries " + tmp.file("q.fvecs") + " --groundtruth " + tmp.file("gt.ivecs") +
                             " --m 16 --ef-construction 100 --ef-search 64 --k 10 --threads 2" +
                             " --step delete:" + tmp.file("gone.txt") + " --step insert:" + tmp.file("new.fvecs") +
                             ":" + tmp.file("new_ids.txt") + " --step upsert:" + tmp.file("up.fvecs") + ":" +
                             tmp.file("up_ids.txt");
  for (const bool reuse : {true, false}) {
    const std::string json_path = tmp.file(reuse ? "reuse.json" : "grow.json");
    const auto r = run_bench(tmp, common + " --json " + json_path + (reuse ? "" : " --no-replace-deleted"));
    INFO("reuse " << reuse << "\nstdout: " << r.out << "\nstderr: " << r.err);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(slurp(json_path));
    const auto& steps = j.at("steps");
    REQUIRE(steps.size() == 3);
    CHECK(steps[0].at("op") == "delete");
    CHECK(steps[0].at("done") == 1500);
    CHECK(steps[1].at("op") == "insert");
    CHECK(steps[1].at("done") == 1500);
    CHECK(steps[1].at("reused") == (reuse ? 1500 : 0));
    CHECK(steps[2].at("op") == "upsert");
    CHECK(steps[2].at("done") == 100);
    CHECK(j.at("elements") == (reuse ? 5000 : 6500));
    CHECK(j.at("deleted_elements") == (reuse ? 0 : 1500));
    // recall against the live set: the upserted labels answer with their new vectors, no
    // deleted label answers
    CHECK(j.at("runs").at(0).at("recall").get<double>() >= 0.9);
  }

  // a deleted label cannot be upserted, a live one cannot be inserted again: counted, not applied
  const std::string json_path = tmp.file("na.json");
  const auto r = run_bench(tmp, "--base " + tmp.file("base.fvecs") + " --ids " + tmp.file("base_ids.txt") +
                                    " --queries " + tmp.file("q.fvecs") + " --groundtruth " + tmp.file("gt.ivecs") +
                                    " --threads 2 --ef-search 16 --step delete:" + tmp.file("gone.txt") +
                                    " --step upsert:" + tmp.file("new.fvecs") + ":" + tmp.file("gone.txt") +
                                    " --step insert:" + tmp.file("up.fvecs") + ":" + tmp.file("up_ids.txt") +
                                    " --step insert:" + tmp.file("new.fvecs") + ":" + tmp.file("new_ids.txt") +
                                    " --step query --json " + json_path);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(json_path));
  CHECK(j.at("steps")[1].at("done") == 0);
  CHECK(j.at("steps")[1].at("not_applicable") == 1500);
  CHECK(j.at("steps")[2].at("done") == 0);
  CHECK(j.at("steps")[2].at("not_applicable") == 100);
  CHECK(j.at("steps")[3].at("reused") == 1500);
  CHECK(j.at("elements") == 5000);
  CHECK(j.at("runs").size() == 1);
  // before the insert of the new labels the ground truth names labels the index does not hold
  const auto early = run_bench(tmp, "--base " + tmp.file("base.fvecs") + " --ids " + tmp.file("base_ids.txt") +
                                        " --queries " + tmp.file("q.fvecs") + " --groundtruth " +
                                        tmp.file("gt.ivecs") + " --threads 2 --step query");
  CHECK(early.code != 0);
  CHECK(early.err.find("not a live label") != std::string::npos);

  auto fails_with = [&](const std::string& args, const std::string& needle) {
    const auto f = run_bench(tmp, args);
    INFO("hnswlib-bench " << args << "\nstdout: " << f.out << "\nstderr: " << f.err);
    CHECK(f.code != 0);
    CHECK((f.err + f.out).find(needle) != std::string::npos);
  };
  const std::string qg = " --queries " + tmp.file("q.fvecs") + " --groundtruth " + tmp.file("gt.ivecs");
  fails_with("--base " + tmp.file("base.fvecs") + qg + " --step remove:" + tmp.file("gone.txt"), "--step remove");
  fails_with("--base " + tmp.file("base.fvecs") + qg + " --step insert:" + tmp.file("new.fvecs"), "--step insert");
  fails_with("--base " + tmp.file("base.fvecs") + qg + " --ids " + tmp.file("gone.txt"), "--ids");
  fails_with("--base " + tmp.file("base.fvecs") + " --ids " + tmp.file("base_ids.txt") + qg + " --step insert:" +
                 tmp.file("q.fvecs") + ":" + tmp.file("new_ids.txt"),
             "q.fvecs");
}

TEST_CASE("hnswlib-bench --load searches a saved index as the run that built it, and refuses one of other data", "[tools]") {
  TempDir tmp;
  const std::string common = "--base " + kBase + " --queries " + kQueries + " --groundtruth " + kTruth +
                             " --metric l2 --ef-construction 40 --ef-search 32 --k 10 --threads 2";
  const auto built = run_bench(tmp, common + " --m 8 --save " + tmp.file("i.idx") + " --json " + tmp.file("b.json"));
  INFO("stdout: " << built.out << "\nstderr: " << built.err);
  REQUIRE(built.code == 0);
  const auto loaded = run_bench(tmp, common + " --m 8 --load " + tmp.file("i.idx") + " --json " + tmp.file("l.json"));
  INFO("stdout: " << loaded.out << "\nstderr: " << loaded.err);
  REQUIRE(loaded.code == 0);
  const auto b = nlohmann::json::parse(slurp(tmp.file("b.json"))), l = nlohmann::json::parse(slurp(tmp.file("l.json")));
  CHECK(l.at("build_seconds") == 0);
  CHECK(l.at("loaded_from") == tmp.file("i.idx"));
  CHECK_FALSE(b.contains("loaded_from"));
  CHECK(l.at("runs").at(0).at("recall") == b.at("runs").at(0).at("recall"));
  CHECK(l.at("runs").at(0).at("dist_comps_per_query") == b.at("runs").at(0).at("dist_comps_per_query"));
  auto refused = [&](const std::string& args, const std::string& needle) {
    const auto r = run_bench(tmp, common + " " + args);
    INFO(args << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.code != 0);
    CHECK(r.err.find(needle) != std::string::npos);
  };
  refused("--m 16 --load " + tmp.file("i.idx"), "not --m 16");
  refused("--m 8 --load " + tmp.file("i.idx") + " --save " + tmp.file("j.idx"), "--load: not with --save");
  refused("--m 8 --load " + tmp.file("nothing.idx"), "--load " + tmp.file("nothing.idx") + ": hnswlib cannot load it");
}
