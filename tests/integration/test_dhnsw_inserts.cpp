// d-HNSW's dynamic half across real processes: `computenode --mode dhnsw build` writes the
// index into empty memnodes over the fabric, two computenodes insert the last 20 % of the data
// while a third queries, and every inserted vector is then found; a writer killed inside a
// commit holds its group for one lease, after which another computenode repairs it and goes on.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "proc.hpp"

using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::seconds;

namespace {

constexpr int kBuilt = 2400;  // of SmallData's 3000 rows; the rest are inserted

std::vector<std::string> dhnsw_cn(const std::string& provider, const std::string& memnodes, int id, int k,
                                  std::vector<std::string> rest) {
  return computenode_args("dhnsw", provider, memnodes, id, k, rest);
}

/// A query run's first report entry; `probe` partitions per query at efSearch `ef`.
nlohmann::json query(const std::string& provider, const std::string& mns, const TempDir& dir, const std::string& wl,
                     const std::string& name, const std::string& probe = "3", const std::string& ef = "64") {
  std::vector<std::string> a{"query", "--workload", wl, "--k", "10", "--batch", "64", "--probe", probe, "--ef-search",
                             ef, "--report", dir.file(name + ".json")};
  auto r = run(dhnsw_cn(provider, mns, 0, 1, a), dir, name, seconds(300));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, !Contains("sanitized copy"));
  return load_json(dir.file(name + ".json"))["runs"][0];
}

/// Computenodes 1 and 2 (of 3) inserting rows kBuilt.. in halves (--share 0/2, 1/2), batches of
/// 20, reports at ins.json.cn1 / .cn2.
std::vector<std::unique_ptr<Proc>> start_inserters(const std::string& provider, const std::string& mns,
                                                   const SmallData& d, const TempDir& dir) {
  std::vector<std::unique_ptr<Proc>> ins;
  for (int i = 0; i < 2; ++i)
    ins.push_back(std::make_unique<Proc>(
        dhnsw_cn(provider, mns, 1 + i, 3,
                 {"insert", "--data", d.base, "--begin", std::to_string(kBuilt), "--share", std::to_string(i) + "/2",
                  "--batch", "20", "--report", dir.file("ins.json")}),
        dir.file("ins" + std::to_string(i) + ".log")));
  return ins;
}

std::vector<std::string> build_args(const SmallData& d, int rows, double internal_gap, double overflow_gap) {
  return {"build", "--data", d.base, "--max-elements", std::to_string(rows), "--partitions", "8", "--m", "16",
          "--ef-construction", "80", "--internal-gap", std::to_string(internal_gap), "--overflow-gap",
          std::to_string(overflow_gap)};
}

}  // namespace

TEST_CASE("dhnsw inserts: online build then two computenodes insert 20 % while one queries and every insert is found",
          "[integration][dhnsw][insert]") {
  SmallData d;
  for (std::string provider : {"shm", "tcp"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      const std::string mns = m0.address + "," + m1.address;
      auto b = run(dhnsw_cn(provider, mns, 0, 1, build_args(d, kBuilt, 0.05, 0.5)), dir, "build", seconds(300));
      INFO(b.output);
      REQUIRE(b.code == 0);
      CHECK_THAT(b.output, Contains("2400 vectors in 8 partitions"));
      const double before = query(provider, mns, dir, d.wl, "before")["recall"].get<double>();

      // A querier that keeps answering (queries arrive at 150/s: about 3 s) while two computenodes insert.
      Proc q(dhnsw_cn(provider, mns, 0, 1,
                      {"query", "--workload", d.wl, "--k", "10", "--batch", "16", "--probe", "3", "--ef-search", "64",
                       "--arrival-qps", "150", "--max-wait-us", "20000"}),
             dir.file("during.log"));
      REQUIRE(wait_for_output(q, "d-HNSW index", seconds(30)));
      auto ins = start_inserters(provider, mns, d, dir);
      uint64_t inserted = 0, commits = 0;
      for (int i = 0; i < 2; ++i) {
        const int code = ins[static_cast<size_t>(i)]->wait(seconds(300));
        INFO(ins[static_cast<size_t>(i)]->output());
        REQUIRE(code == 0);
        const auto r = load_json(dir.file("ins.json.cn" + std::to_string(1 + i)));
        CHECK(r["mode"] == "dhnsw");
        CHECK(r["kind"] == "insert");
        inserted += r["insert"]["inserted"].get<uint64_t>();
        commits += r["insert"]["commits"].get<uint64_t>();
        CHECK(r["insert"]["overwritten_bytes"].get<uint64_t>() > 0);
        CHECK(r["insert"]["repairs"] == 0);
      }
      CHECK(inserted == 600);
      CHECK(commits >= 8);
      const int qc = q.wait(seconds(300));
      INFO(q.output());
      CHECK(qc == 0);  // the querier never failed a query
      CHECK_THAT(q.output(), !Contains("sanitized copy"));

      // Every inserted vector, queried by itself, is its own nearest neighbour.
      const std::string own = self_workload(d, dir, kBuilt, 3000);
      const auto self = query(provider, mns, dir, own, "self");
      CHECK(self["recall_at_1"].get<double>() >= 0.99);  // the search's recall at probe 3
      // Every insert is in the index: every partition, efSearch above a partition's size (375-450).
      CHECK(query(provider, mns, dir, own, "all", "8", "1000")["recall_at_1"].get<double>() == 1.0);
      const double after = query(provider, mns, dir, d.wl, "after")["recall"].get<double>();
      CHECK(after > before + 0.05);  // the ground truth covers all 3000 rows

      // Within 0.02 of a fresh build of all 3000 rows with the same parameters.
      TempDir fresh_dir;
      Memnode f0(fresh_dir, 0, provider), f1(fresh_dir, 1, provider);
      const std::string fresh_mns = f0.address + "," + f1.address;
      auto fb = run(dhnsw_cn(provider, fresh_mns, 0, 1, build_args(d, 3000, 0.05, 0.5)), fresh_dir, "fresh",
                    seconds(300));
      REQUIRE(fb.code == 0);
      const double fresh = query(provider, fresh_mns, fresh_dir, d.wl, "fresh")["recall"].get<double>();
      CHECK(after >= fresh - 0.02);
    }
  }
}

TEST_CASE("dhnsw inserts: a writer killed inside a commit blocks its group for one lease and the next one repairs it",
          "[integration][dhnsw][insert]") {
  SmallData d;
  TempDir dir;
  Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
  const std::string mns = m0.address + "," + m1.address;
  auto b = run(dhnsw_cn("shm", mns, 0, 1, build_args(d, kBuilt, 0.05, 0.5)), dir, "build", seconds(300));
  REQUIRE(b.code == 0);
  // The victim stops after its commit's WRITEs, before it publishes the descriptor.
  Proc victim(dhnsw_cn("shm", mns, 1, 2, {"insert", "--data", d.base, "--begin", "2400", "--end", "2700", "--batch",
                                          "300"}),
              dir.file("victim.log"), {"DMHNSW_TEST_PAUSE_IN_COMMIT_MS=60000"});
  REQUIRE(wait_for_output(victim, "paused inside the commit", seconds(60)));
  victim.signal(SIGKILL);
  victim.wait(seconds(10));

  // A query meanwhile answers from a sanitized copy of the torn sub-HNSW, without failing.
  auto torn = run(dhnsw_cn("shm", mns, 0, 1, {"query", "--workload", d.wl, "--k", "10", "--batch", "400", "--probe",
                                              "8", "--ef-search", "64"}),
                  dir, "torn-query", seconds(120));
  INFO(torn.output);
  CHECK(torn.code == 0);
  CHECK_THAT(torn.output, Contains("sanitized copy"));

  // The next writer takes the lock over after the lease and repairs the group.
  auto t0 = std::chrono::steady_clock::now();
  auto next = run(dhnsw_cn("shm", mns, 0, 1, {"insert", "--data", d.base, "--begin", "2400", "--batch", "600",
                                              "--lease-ms", "500", "--report", dir.file("next.json")}),
                  dir, "next", seconds(120));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(next.output);
  REQUIRE(next.code == 0);
  const auto r = load_json(dir.file("next.json"));
  CHECK(r["insert"]["inserted"] == 600);
  CHECK(r["insert"]["lock_takeovers"].get<uint64_t>() >= 1);
  CHECK(r["insert"]["repairs"].get<uint64_t>() >= 1);
  CHECK(secs < 30);
  // Consistent again: every vector it inserted is found, from clean (unsanitized) copies.
  const std::string own = self_workload(d, dir, kBuilt, 3000);
  const auto self = query("shm", mns, dir, own, "self");
  CHECK(self["recall_at_1"].get<double>() >= 0.99);
  CHECK(query("shm", mns, dir, own, "all", "8", "1000")["recall_at_1"].get<double>() == 1.0);  // none lost
}

TEST_CASE("dhnsw inserts: tiny gaps force online rebuilds while two computenodes insert and one queries",
          "[integration][dhnsw][insert][rebuild]") {
  SmallData d;
  TempDir dir;
  Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
  const std::string mns = m0.address + "," + m1.address;
  REQUIRE(run(dhnsw_cn("shm", mns, 0, 1, build_args(d, kBuilt, 0.02, 0.02)), dir, "build", seconds(300)).code == 0);
  Proc q(dhnsw_cn("shm", mns, 0, 1,
                  {"query", "--workload", d.wl, "--k", "10", "--batch", "16", "--probe", "3", "--ef-search", "64",
                   "--arrival-qps", "150", "--max-wait-us", "20000"}),
         dir.file("during.log"));
  REQUIRE(wait_for_output(q, "d-HNSW index", seconds(30)));
  auto ins = start_inserters("shm", mns, d, dir);
  uint64_t inserted = 0, rebuilds = 0, buffered = 0;
  for (int i = 0; i < 2; ++i) {
    const int code = ins[static_cast<size_t>(i)]->wait(seconds(300));
    INFO(ins[static_cast<size_t>(i)]->output());
    REQUIRE(code == 0);
    const auto r = load_json(dir.file("ins.json.cn" + std::to_string(1 + i)))["insert"];
    inserted += r["inserted"].get<uint64_t>();
    rebuilds += r["rebuilds"].get<uint64_t>();
    buffered += r["buffered"].get<uint64_t>();
  }
  CHECK(inserted == 600);
  CHECK(rebuilds >= 1);
  INFO("inserts that went to the buffer while a rebuild ran: " << buffered);
  const int qc = q.wait(seconds(300));
  INFO(q.output());
  CHECK(qc == 0);  // queries never stopped answering across the epochs
  CHECK_THAT(q.output(), Contains("metadata refreshed"));
  // Nothing lost: searching every partition exhaustively finds every inserted vector (the
  // rebuilds re-partitioned them with balanced k-means, so 3 of 8 partitions may miss a few).
  const std::string self = self_workload(d, dir, kBuilt, 3000);
  CHECK(query("shm", mns, dir, self, "all", "8", "400")["recall_at_1"].get<double>() == 1.0);
}

TEST_CASE("dhnsw inserts: a rebuild master killed before or after publishing loses no acknowledged insert",
          "[integration][dhnsw][insert][rebuild]") {
  SmallData d;
  for (std::string when : {"before", "after"}) {
    DYNAMIC_SECTION(when << " publishing") {
      TempDir dir;
      Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
      const std::string mns = m0.address + "," + m1.address;
      REQUIRE(run(dhnsw_cn("shm", mns, 0, 1, build_args(d, kBuilt, 0.05, 0.5)), dir, "build", seconds(300)).code == 0);
      Proc master(dhnsw_cn("shm", mns, 3, 4, {"rebuild", "--lease-ms", "500"}), dir.file("master.log"),
                  {"DMHNSW_TEST_PAUSE_REBUILD=" + when});
      REQUIRE(wait_for_output(master, "paused " + when + " publishing", seconds(60)));
      // Meanwhile 300 inserts are acknowledged: into the buffer (before) or in place (after).
      auto a = run(dhnsw_cn("shm", mns, 1, 4, {"insert", "--data", d.base, "--begin", "2400", "--end", "2700",
                                               "--share", "0/1", "--report", dir.file("a.json")}),
                   dir, "insert-a", seconds(120));
      INFO(a.output);
      REQUIRE(a.code == 0);
      if (when == "before") CHECK(load_json(dir.file("a.json.cn1"))["insert"]["buffered"] == 300);
      master.signal(SIGKILL);
      master.wait(seconds(10));
      // Queries go on, and find what was acknowledged (from the buffer where it is there).
      const std::string self_a = self_workload(d, dir, 2400, 2700);
      CHECK(query("shm", mns, dir, self_a, "self-a")["recall_at_1"].get<double>() >= 0.99);
      // The next rebuild takes the master word over after the lease and finishes the work.
      auto next = run(dhnsw_cn("shm", mns, 0, 4, {"rebuild", "--lease-ms", "500", "--report", dir.file("next.json")}),
                      dir, "rebuild", seconds(120));
      INFO(next.output);
      REQUIRE(next.code == 0);
      const auto r = load_json(dir.file("next.json"));
      CHECK_FALSE(r.contains("skipped"));
      // The buffered inserts go into the next epoch (its snapshot, or the merge after it).
      CHECK(r.value("from_buffer", uint64_t{0}) + r["merged"].get<uint64_t>() == (when == "before" ? 300u : 0u));
      auto b = run(dhnsw_cn("shm", mns, 2, 4, {"insert", "--data", d.base, "--begin", "2700", "--share", "0/1"}), dir,
                   "insert-b", seconds(120));
      INFO(b.output);
      REQUIRE(b.code == 0);
      const std::string self_all = self_workload(d, dir, 2400, 3000);
      CHECK(query("shm", mns, dir, self_all, "all", "8", "400")["recall_at_1"]
                .get<double>() == 1.0);
    }
  }
}

TEST_CASE("dhnsw inserts: a duplicate id and a dimension mismatch are refused naming them", "[integration][dhnsw][insert]") {
  SmallData d;
  TempDir dir;
  Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
  const std::string mns = m0.address + "," + m1.address;
  REQUIRE(run(dhnsw_cn("shm", mns, 0, 1, build_args(d, kBuilt, 0.05, 0.5)), dir, "build", seconds(300)).code == 0);
  auto again = run(dhnsw_cn("shm", mns, 0, 1, build_args(d, kBuilt, 0.05, 0.5)), dir, "build-again", seconds(60));
  CHECK(again.code != 0);
  CHECK_THAT(again.output, Contains("memnode 0") && Contains("already holds"));
  auto first = run(dhnsw_cn("shm", mns, 0, 1, {"insert", "--data", d.base, "--begin", "2400", "--end", "2450"}), dir,
                   "insert", seconds(60));
  REQUIRE(first.code == 0);
  auto dup = run(dhnsw_cn("shm", mns, 0, 1, {"insert", "--data", d.base, "--begin", "2440", "--end", "2441"}), dir,
                 "insert-dup", seconds(60));
  CHECK(dup.code != 0);
  CHECK_THAT(dup.output, Contains("id 2440") && Contains("already in the index"));
  const std::string other = dir.file("d16.fvecs");
  REQUIRE(run({bin("datagen"), "--n", "100", "--d", "16", "--clusters", "2", "--seed", "1", "--queries", "1",
               "--out-base", other, "--out-queries", dir.file("q16.fvecs")},
              dir, "datagen16", seconds(60))
              .code == 0);
  auto mismatch = run(dhnsw_cn("shm", mns, 0, 1, {"insert", "--data", other}), dir, "insert-d16", seconds(60));
  CHECK(mismatch.code != 0);
  CHECK_THAT(mismatch.output, Contains(other) && Contains("dimension 16") && Contains("24"));
}

TEST_CASE("dhnsw deletes: two computenodes upsert the same ids while a third deletes them, and each id keeps one vector",
          "[integration][dhnsw][delete]") {
  // Rows 0..899 built under sparse ids; rows 0..99 are never touched (sentinels). Computenode 0
  // upserts ids of rows 100..899 with those rows' vectors, computenode 1 the same ids with rows
  // 900..1699, computenode 2 deletes them, all at once and through the rebuilds the upserts'
  // full gaps start. Afterwards the touched ids are deleted and a rebuild counts what is live:
  // exactly the sentinels (no vector left alive without its id) and no id twice.
  SmallData d;
  TempDir dir;
  Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
  const std::string mns = m0.address + "," + m1.address;
  auto id_of = [](int row) { return int64_t{1} << 40 | int64_t{7919} * row; };
  {
    std::ofstream a(dir.file("ids.txt")), b(dir.file("ids2.txt")), del(dir.file("del.txt")), all(dir.file("touched.txt"));
    for (int r = 0; r < 900; ++r) a << id_of(r) << "\n";
    for (int r = 0; r < 1700; ++r) b << (r < 900 ? int64_t{5} << 50 | r : id_of(r - 800)) << "\n";
    for (int r = 100; r < 900; ++r) {
      all << id_of(r) << "\n";
      for (int k = 0; k < 3; ++k)  // computenode 2 of 3 deletes lines j % 3 == 2: every row once
        del << id_of(r) << "\n";
    }
  }
  auto b = run(dhnsw_cn("shm", mns, 0, 1,
                        {"build", "--data", d.base, "--max-elements", "900", "--ids", dir.file("ids.txt"),
                         "--partitions", "4", "--m", "12", "--ef-construction", "60"}),
               dir, "build", seconds(300));
  INFO(b.output);
  REQUIRE(b.code == 0);
  std::vector<std::unique_ptr<Proc>> ps;
  ps.push_back(std::make_unique<Proc>(
      dhnsw_cn("shm", mns, 0, 3,
               {"upsert", "--data", d.base, "--begin", "100", "--end", "900", "--ids", dir.file("ids.txt"), "--share",
                "0/1", "--batch", "50", "--report", dir.file("up.json")}),
      dir.file("up0.log")));
  ps.push_back(std::make_unique<Proc>(
      dhnsw_cn("shm", mns, 1, 3,
               {"upsert", "--data", d.base, "--begin", "900", "--end", "1700", "--ids", dir.file("ids2.txt"),
                "--share", "0/1", "--batch", "50", "--report", dir.file("up.json")}),
      dir.file("up1.log")));
  ps.push_back(std::make_unique<Proc>(dhnsw_cn("shm", mns, 2, 3, {"delete", "--ids", dir.file("del.txt")}),
                                      dir.file("del.log")));
  uint64_t rebuilds = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const int code = ps[i]->wait(seconds(300));
    INFO(ps[i]->output());
    REQUIRE(code == 0);
  }
  for (int cn : {0, 1}) {
    const auto r = load_json(dir.file("up.json.cn" + std::to_string(cn)));
    CHECK(r["kind"] == "upsert");
    CHECK(r["insert"]["inserted"].get<uint64_t>() == 800);
    rebuilds += r["insert"]["rebuilds"].get<uint64_t>();
  }
  CHECK(rebuilds > 0);  // the upserts filled gaps: rebuilds ran under the other writers

  auto gone = run(dhnsw_cn("shm", mns, 0, 1, {"delete", "--ids", dir.file("touched.txt"), "--report",
                                               dir.file("gone.json")}),
                  dir, "delete-touched", seconds(300));
  INFO(gone.output);
  REQUIRE(gone.code == 0);
  const auto g = load_json(dir.file("gone.json"));
  CHECK(g["deleted"].get<uint64_t>() + g["not_found"].get<uint64_t>() == 800);
  CHECK(g["deleted"].get<uint64_t>() > 0);
  auto rb = run(dhnsw_cn("shm", mns, 0, 1, {"rebuild", "--report", dir.file("rebuild.json")}), dir, "rebuild",
                seconds(300));
  INFO(rb.output);
  REQUIRE(rb.code == 0);
  const auto r = load_json(dir.file("rebuild.json"));
  CHECK(r["duplicates_dropped"].get<uint64_t>() == 0);
  CHECK(r["vectors"].get<uint64_t>() == 100);  // the sentinels, nothing else alive
}
