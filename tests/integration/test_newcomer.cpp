// What a new user meets first, each checked by its text: --version on every binary, regions too
// small for the index refused before anything is written (naming the size to use), a memnode
// started too small warning so, flags of another subcommand named, a query before any build
// pointing at the build, and each run's summary naming what it did.
#include <catch2/catch.hpp>

#include <fstream>

#include "proc.hpp"

using namespace dmhnsw::testing;
using namespace std::chrono;
using Catch::Contains;

namespace {

/// Region headers as `computenode` without a subcommand prints them.
std::string headers(const TempDir& dir, const std::string& mns) {
  auto r = run({bin("computenode"), "--memnodes", mns}, dir, "headers", seconds(30));
  INFO(r.output);
  REQUIRE(r.code == 0);
  return r.output;
}

/// A memnode with a region of `region` (Memnode's is 128 MiB): its process and address.
std::pair<std::unique_ptr<Proc>, std::string> small_memnode(const TempDir& dir, int id, const std::string& region) {
  const std::string ready = dir.file("small" + std::to_string(id) + ".addr");
  auto p = std::make_unique<Proc>(std::vector<std::string>{bin("memnode"), "--id", std::to_string(id), "--listen",
                                                           "127.0.0.1:0", "--region", region, "--ready-file", ready},
                                  dir.file("small" + std::to_string(id) + ".log"));
  const auto deadline = steady_clock::now() + seconds(20);
  while (!std::filesystem::exists(ready)) {
    if (!p->running() || steady_clock::now() > deadline) throw std::runtime_error("memnode: " + p->output());
    std::this_thread::sleep_for(milliseconds(5));
  }
  std::string address;
  std::ifstream(ready) >> address;
  return {std::move(p), address};
}

}  // namespace

TEST_CASE("newcomer: every binary answers --version with the project's version and commit", "[integration][newcomer]") {
  TempDir dir;
  for (const std::string b : {"memnode", "computenode", "datagen", "groundtruth", "workload", "kmeans", "dhnsw-build",
                              "shine-import", "csp-report", "shine-route-sim", "fabric-bench", "cache-bench",
                              "hnswlib-bench", "faiss-bench", "serve-bench"}) {
    auto r = run({bin(b), "--version"}, dir, "version-" + b, seconds(30));
    INFO(b << ": " << r.output);
    CHECK(r.code == 0);
    CHECK_THAT(r.output, Contains(b + " (dmhnsw) 0.") && Contains(", commit "));
  }
}

TEST_CASE("newcomer: a build that cannot fit is refused before anything is written, naming the --region to use",
          "[integration][newcomer]") {
  TempDir dir;
  SECTION("shine, memnodes of 64 MiB (too small for the coordination board)") {
    SmallData d(100, 2000);
    auto [p0, a0] = small_memnode(dir, 0, "64MiB");
    auto [p1, a1] = small_memnode(dir, 1, "64MiB");
    CHECK_THAT(p0->output(), Contains("--region 64 MiB: below 128 MiB") && Contains("Sizing regions"));
    const std::string mns = a0 + "," + a1;
    auto r = run(computenode_args("shine", "shm", mns, 0, 1, {"build", "--data", d.base}), dir, "shine-build", seconds(60));
    INFO(r.output);
    CHECK(r.code != 0);
    CHECK_THAT(r.output, Contains("build: memnode 0 (" + a0 + ") has a region of 64 MiB") &&
                             Contains("needs about") && Contains("Start the memnodes with --region 128MiB") &&
                             Contains("Nothing was written"));
    const std::string h = headers(dir, mns);
    CHECK_THAT(h, Contains("memnode 0: region 64 MiB, format v1, mode none"));
    CHECK_THAT(h, Contains("memnode 1: region 64 MiB, format v1, mode none"));
  }
  SECTION("dhnsw, 16,000 x 1024 floats in a memnode of 128 MiB, refused before building") {
    const std::string base = dir.file("wide.fvecs");
    auto g = run({bin("datagen"), "--n", "16000", "--d", "1024", "--clusters", "8", "--queries", "10", "--out-base", base,
                  "--out-queries", dir.file("wq.fvecs")},
                 dir, "datagen-wide", seconds(120));
    REQUIRE(g.code == 0);
    Memnode m0(dir, 0, "shm");
    const std::string mns = m0.address;
    auto r = run(computenode_args("dhnsw", "shm", mns, 0, 1, {"build", "--data", base, "--partitions", "8"}), dir,
                 "dhnsw-build", seconds(120));
    INFO(r.output);
    CHECK(r.code != 0);
    CHECK_THAT(r.output, Contains("has a region of 128 MiB; this d-HNSW index (16000 vectors of dimension 1024, 8 "
                                  "partitions") &&
                             Contains("Start the memnodes with --region ") && Contains("leaves room for rebuilds") &&
                             Contains("Nothing was built"));
    CHECK_THAT(r.output, !Contains("partitions built"));
    CHECK_THAT(headers(dir, mns), Contains("mode none"));
  }
}

TEST_CASE("newcomer: messages say what to do (a flag of another subcommand, a query before a build, run summaries)",
          "[integration][newcomer]") {
  TempDir dir;
  SmallData d(100, 1000);
  {
    auto r = run({bin("computenode"), "--memnodes", "127.0.0.1:1", "build", "--data", d.base, "--end", "100"}, dir,
                 "build-end", seconds(30));
    INFO(r.output);
    CHECK(r.code != 0);
    CHECK_THAT(r.output, Contains("--end is not a flag of `build` but of `insert, upsert`") &&
                             Contains("`build` takes --max-elements N"));
  }
  {
    Memnode m0(dir, 0, "shm");
    auto r = run(computenode_args("dhnsw", "shm", m0.address, 0, 1, {"query", "--workload", d.wl}), dir, "dhnsw-query",
                 seconds(60));
    INFO(r.output);
    CHECK(r.code != 0);
    CHECK_THAT(r.output, Contains("memnode 0 holds no d-HNSW index") &&
                             Contains("`computenode --mode dhnsw build --data FILE`") && Contains("build/bin/dhnsw-build"));
  }
  {
    std::ofstream(dir.file("ids.txt")) << "0\n1\n2\n";
    for (const std::string mode : {"shine", "dhnsw"}) {
      Memnode m0(dir, 0, "shm");
      const std::string& mns = m0.address;
      std::vector<std::string> build{"build", "--data", d.base, "--max-elements", "900", "--m", "8", "--ef-construction", "40"};
      if (mode == "dhnsw") build.insert(build.end(), {"--partitions", "4"});
      auto b = run(computenode_args(mode, "shm", mns, 0, 1, build), dir, mode + "-build", seconds(120));
      INFO(b.output);
      REQUIRE(b.code == 0);
      CHECK_THAT(b.output, Contains(mode + " build"));
      auto again = run(computenode_args(mode, "shm", mns, 0, 1, build), dir, mode + "-build-again", seconds(120));
      INFO(again.output);
      CHECK(again.code != 0);
      CHECK_THAT(again.output, Contains("already hold") && Contains("`insert"));
      auto ins = run(computenode_args(mode, "shm", mns, 0, 1, {"insert", "--data", d.base, "--begin", "900", "--end", "950"}),
                     dir, mode + "-insert", seconds(60));
      INFO(ins.output);
      CHECK(ins.code == 0);
      CHECK_THAT(ins.output, Contains(mode + " insert") && !Contains(mode + " build"));
      auto up = run(computenode_args(mode, "shm", mns, 0, 1,
                                     {"upsert", "--data", d.queries, "--end", "3", "--ids", dir.file("ids.txt")}),
                    dir, mode + "-upsert", seconds(60));
      INFO(up.output);
      CHECK(up.code == 0);
      CHECK_THAT(up.output, Contains(mode + " upsert") && !Contains(mode + " insert") && !Contains(mode + " build"));
    }
  }
}
