// d-HNSW across real processes: tools/dhnsw-build writes one image per memnode, memnodes
// serve them with --load, computenodes query them on shm and tcp (full pipeline and the
// ablation switches give the same answers); a memnode killed mid-query fails the run fast.
#include <catch2/catch.hpp>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "proc.hpp"

using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::seconds;

namespace {

std::vector<std::string> cn(const std::string& provider, const std::string& memnodes, int id, int k,
                            std::vector<std::string> rest) {
  rest.insert(rest.begin(), "query");
  return computenode_args("dhnsw", provider, memnodes, id, k, rest);
}

/// SmallData plus a d-HNSW image of it over 2 memnodes (8 partitions).
struct Built {
  SmallData d;
  std::string img, build_json;
  Built() {
    img = d.dir.file("idx.img");
    build_json = d.dir.file("build.json");
    auto r = run({bin("dhnsw-build"), "--data", d.base, "--partitions", "8", "--m", "16", "--ef-construction", "80",
                  "--memnodes", "2", "--out", img, "--json", build_json},
                 d.dir, "dhnsw-build", seconds(300));
    if (r.code != 0) throw std::runtime_error("dhnsw-build failed:\n" + r.output);
  }
  std::string image(int id) const { return img + "." + std::to_string(id); }
};

}  // namespace

TEST_CASE("dhnsw: 2 computenodes query an index built by dhnsw-build over 2 memnodes (shm, tcp)",
          "[integration][dhnsw]") {
  Built b;
  auto br = load_json(b.build_json);
  INFO(br.dump());
  for (std::string provider : {"shm", "tcp"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m0(dir, 0, provider, "127.0.0.1:0", {"--load", b.image(0)});
      Memnode m1(dir, 1, provider, "127.0.0.1:0", {"--load", b.image(1)});
      std::string mns = m0.address + "," + m1.address;
      std::string rep = dir.file("q.json");
      std::vector<std::string> common{"--workload", b.d.wl, "--k", "10", "--batch", "64", "--probe", "3",
                                      "--ef-search", "16,64"};
      auto a0 = common, a1 = common;
      a0.insert(a0.end(), {"--report", rep});
      Proc q0(cn(provider, mns, 0, 2, a0), dir.file("q0.log"));
      Proc q1(cn(provider, mns, 1, 2, a1), dir.file("q1.log"));
      int c0 = q0.wait(seconds(300)), c1 = q1.wait(seconds(300));
      INFO(q0.output() << q1.output() << m0.proc->output());
      REQUIRE(c0 == 0);
      REQUIRE(c1 == 0);
      CHECK_THAT(q0.output(), Contains("R@10") && Contains("pipelined"));
      auto r = load_json(rep);
      REQUIRE(r["runs"].size() == 2);
      CHECK(r["mode"] == "dhnsw");
      CHECK(r["index"]["partitions"] == 8);
      for (auto& run : r["runs"]) {
        CHECK(run["queries"] == 400);
        CHECK(run["per_cn"].size() == 2);
        auto& bt = run["batches"];
        CHECK(bt["needed"].get<double>() <= 8.0);
        CHECK(bt["fetched"].get<double>() + bt["cache_hits"].get<double>() == Approx(bt["needed"].get<double>()));
        CHECK(run["per_query"]["bytes"].get<double>() > 0);
        CHECK(run["stages_us"]["search"].get<double>() > 0);
      }
      CHECK(r["runs"][1]["recall"].get<double>() >= 0.9);
      CHECK(r["runs"][1]["recall"].get<double>() >= r["runs"][0]["recall"].get<double>() - 0.01);
    }
  }
}

TEST_CASE("dhnsw: the ablation switches change how sub-HNSWs are loaded, never the answers", "[integration][dhnsw]") {
  Built b;
  TempDir dir;
  Memnode m0(dir, 0, "shm", "127.0.0.1:0", {"--load", b.image(0)});
  Memnode m1(dir, 1, "shm", "127.0.0.1:0", {"--load", b.image(1)});
  std::string mns = m0.address + "," + m1.address;
  auto query = [&](const std::string& name, std::vector<std::string> extra) {
    std::string rep = dir.file(name + ".json");
    std::vector<std::string> a{"--workload", b.d.wl, "--k", "10", "--batch", "50", "--probe", "2", "--ef-search", "32",
                               "--report", rep};
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run(cn("shm", mns, 0, 1, a), dir, name, seconds(300));
    INFO(r.output);
    REQUIRE(r.code == 0);
    return load_json(rep)["runs"][0];
  };
  auto full = query("full", {});
  auto naive = query("naive", {"--no-regroup", "--no-doorbell", "--no-pipeline"});
  auto seq = query("no-pipeline", {"--no-pipeline", "--cache-subs", "0"});
  CHECK(naive["recall"].get<double>() == Approx(full["recall"].get<double>()).margin(1e-9));
  CHECK(seq["recall"].get<double>() == Approx(full["recall"].get<double>()).margin(1e-9));
  CHECK(naive["recall_at_1"].get<double>() == Approx(full["recall_at_1"].get<double>()).margin(1e-9));
  // naive loading: one fetch per (query, partition), one READ per doorbell
  CHECK(naive["per_query"]["fetches"].get<double>() == Approx(2.0));
  CHECK(naive["per_query"]["doorbells"].get<double>() == Approx(naive["per_query"]["reads"].get<double>()));
  CHECK(full["per_query"]["fetches"].get<double>() < 1.0);  // a batch of 50 shares its partitions
  CHECK(full["per_query"]["doorbells"].get<double>() < full["per_query"]["reads"].get<double>());
  CHECK(naive["per_query"]["bytes"].get<double>() > 5 * full["per_query"]["bytes"].get<double>());
}

TEST_CASE("dhnsw: a memnode killed mid-query makes the computenode fail within 5 s naming it", "[integration][dhnsw]") {
  Built b;
  // Over cxl the sub-HNSWs are searched in place: the dead memnode's mapping stays readable,
  // and the computenode must still stop on it rather than answer from frozen memory.
  for (std::string provider : {"shm", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m0(dir, 0, provider, "127.0.0.1:0", {"--load", b.image(0)});
      Memnode m1(dir, 1, provider, "127.0.0.1:0", {"--load", b.image(1)});
      std::string mns = m0.address + "," + m1.address;
      // Queries arrive at 40 per second in batches of 10: the run lasts about 10 s; no cache, so
      // every batch reads from both memnodes.
      Proc q(cn(provider, mns, 0, 1, {"--workload", b.d.wl, "--batch", "10", "--probe", "3", "--arrival-qps", "40",
                                      "--max-wait-us", "1000000", "--cache-subs", "0", "--report", dir.file("q.json")}),
             dir.file("q.log"));
      wait_for_output(q, "d-HNSW index", seconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      REQUIRE(q.running());
      const auto [code, secs] = kill_then_wait(*m1.proc, q, seconds(15));
      INFO(q.output());
      CHECK(code > 0);
      CHECK(secs < 5.0);
      CHECK_THAT(q.output(), Contains("memnode 1") && Contains("sub-HNSW"));
      CHECK_FALSE(std::filesystem::exists(dir.file("q.json")));  // no report of answers it could not finish
    }
  }
}

TEST_CASE("dhnsw: a querier killed mid-run makes the other fail within seconds naming it", "[integration][dhnsw]") {
  Built b;
  TempDir dir;
  Memnode m0(dir, 0, "shm", "127.0.0.1:0", {"--load", b.image(0)});
  Memnode m1(dir, 1, "shm", "127.0.0.1:0", {"--load", b.image(1)});
  std::string mns = m0.address + "," + m1.address;
  // Two queriers sharing the workload, each at 40 queries per second (~5 s for its half); the
  // second dies mid-run, the first fails at the results' gather naming it (the board judges
  // departures from when this process connected), not after the 120 s gather timeout.
  std::vector<std::string> args{"--workload", b.d.wl, "--batch", "10", "--probe", "3", "--arrival-qps", "40",
                                "--max-wait-us", "1000000"};
  Proc q0(cn("shm", mns, 0, 2, args), dir.file("q0.log"));
  Proc q1(cn("shm", mns, 1, 2, args), dir.file("q1.log"));
  REQUIRE(wait_for_output(q1, "d-HNSW index", seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  REQUIRE(q1.running());
  const auto [code, secs] = kill_then_wait(q1, q0, seconds(60));
  INFO(q0.output());
  CHECK(code > 0);
  CHECK(secs < 20.0);  // its own half first (~5 s), then the gather fails at once
  CHECK_THAT(q0.output(), Contains("computenode 1 left the run"));
}

TEST_CASE("dhnsw: a wire model changes when operations complete, never the answers", "[integration][dhnsw][wire]") {
  Built b;
  TempDir dir;
  Memnode m0(dir, 0, "shm", "127.0.0.1:0", {"--load", b.image(0)});
  Memnode m1(dir, 1, "shm", "127.0.0.1:0", {"--load", b.image(1)});
  std::string mns = m0.address + "," + m1.address;
  auto query = [&](const std::string& wire) {
    std::string rep = dir.file("wire-" + wire + ".json");
    auto args = computenode_args("dhnsw", "shm", mns, 0, 1,
                                 {"--wire", wire, "query", "--workload", b.d.wl, "--k", "10", "--batch", "50",
                                  "--probe", "2", "--ef-search", "32", "--report", rep});
    auto r = run(args, dir, "wire-" + wire, seconds(300));
    INFO(r.output);
    REQUIRE(r.code == 0);
    return load_json(rep);
  };
  // 20 ms per operation, far above what a batch computes (a few ms here), 1 GB/s.
  const auto none = query("none"), rdma = query("20000,1");
  CHECK(rdma["wire"]["latency_us"] == 20000.0);
  CHECK_THAT(rdma["wire"]["model"].get<std::string>(), Contains("custom"));
  CHECK(none["wire"]["model"] == "none");
  CHECK(rdma["runs"][0]["recall"].get<double>() == Approx(none["runs"][0]["recall"].get<double>()).margin(1e-12));
  CHECK(rdma["runs"][0]["recall_at_1"].get<double>() == Approx(none["runs"][0]["recall_at_1"].get<double>()).margin(1e-12));
  // Every batch waits out the model at least once (its control-block READ, one batch after the
  // other), and what it fetches crosses 1 GB/s per memnode link: a floor under the run's wall
  // time that host noise can only raise. (Comparing stage times with the run without the model
  // was a timed test: it failed on a busy host.)
  const auto& rr = rdma["runs"][0];
  const double nb = rr["batches"]["count"].get<double>();
  const double floor_s = std::max(nb * 20e-3, rr["batches"]["bytes"].get<double>() * nb / 2e9);
  INFO(rr.dump(1));
  CHECK(nb > 0);
  CHECK(rr["seconds"].get<double>() >= 0.9 * floor_s);
}

TEST_CASE("dhnsw: an index built with --codes answers with --rerank as with its vectors, also after another "
          "computenode's inserts (bigann10k over shm, wordnet over cxl)",
          "[integration][dhnsw][codes]") {
  // 3,000 rows of each: 2,000 built with codes, 1,000 inserted in place (and by rebuilds).
  for (auto [set, provider] : {std::pair<std::string, std::string>{"bigann10k", "shm"}, {"wordnet", "cxl"}}) {
    DYNAMIC_SECTION(set << " over " << provider) {
      RealSubset d(set, 3000);
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      std::string mns = m0.address + "," + m1.address;
      auto step = [&](const std::string& name, std::vector<std::string> rest) {
        auto r = run(computenode_args("dhnsw", provider, mns, 0, 1, std::move(rest)), dir, name, seconds(300));
        INFO(r.output);
        REQUIRE(r.code == 0);
      };
      step("build", {"build", "--data", d.base, "--max-elements", "2000", "--partitions", "8", "--m", "16",
                     "--ef-construction", "80", "--metric", d.metric, "--codes", "sq8", "--report",
                     dir.file("build.json")});
      const auto built = load_json(dir.file("build.json"));
      CHECK(built["codes"]["kind"] == "sq8");
      CHECK(built["codes"]["code_size"] == d.dim);
      // Another computenode inserts: it encodes with the stored quantizer, and the rebuild after
      // them keeps it.
      step("insert", {"insert", "--data", d.base, "--begin", "2000"});
      step("rebuild", {"rebuild"});
      // Fetched (--no-in-place): the bytes of a fetch with and without vectors compare (no cache:
      // every needed sub-HNSW is fetched in every batch).
      auto query = [&](const std::string& rerank, bool in_place = false) {
        const std::string name = "q" + rerank + (in_place ? "-in-place" : "");
        const std::string rep = dir.file(name + ".json");
        step(name, {"query", "--workload", d.wl, "--k", "10", "--batch", "100", "--probe", "4", "--ef-search", "48",
                    "--rerank", rerank, "--cache-ratio", "0", "--report", rep,
                    in_place ? "--in-place" : "--no-in-place"});
        return load_json(rep);
      };
      const auto full = query("0"), coded = query("30");
      if (provider == "cxl") {  // mapped: searched where they lie, those with overflow records copied out
        const auto placed = query("0", true);
        const auto& p = placed["runs"][0];
        INFO("in place: " << p["batches"]);
        CHECK(placed["settings"]["in_place"] == true);
        CHECK(p["recall"].get<double>() == Approx(full["runs"][0]["recall"].get<double>()).margin(1e-9));
        // Loads counted as the fetches they replace: the fetched run's bytes.
        CHECK(p["per_query"]["bytes"].get<double>() == Approx(full["runs"][0]["per_query"]["bytes"].get<double>()));
        CHECK(p["per_query"]["reads"].get<double>() == 0);
        CHECK(p["batches"]["in_place"].get<double>() + p["batches"]["in_place_copies"].get<double>() ==
              Approx(p["batches"]["fetched"].get<double>()));
        CHECK(p["batches"]["in_place"].get<double>() > 0);
      }
      const auto& f = full["runs"][0];
      const auto& c = coded["runs"][0];
      INFO("recall vectors " << f["recall"] << ", codes " << c["recall"] << "; bytes per query " << f["per_query"]
                             << " -> " << c["per_query"]);
      WARN(set << ": recall@10 " << f["recall"] << " -> " << c["recall"] << " on codes, sub-HNSW bytes per query "
                << f["per_query"]["bytes"] << " -> " << c["per_query"]["bytes"] << " + re-rank "
                << c["per_query"]["rerank_bytes"]);
      CHECK(coded["codes"]["rerank"] == 30);
      CHECK(f["recall"].get<double>() >= 0.85);  // the inserted rows are found (the ground truth holds all 3,000)
      CHECK(c["recall"].get<double>() >= f["recall"].get<double>() - 0.01);
      CHECK(c["per_query"]["reranked"].get<double>() == Approx(30.0));
      CHECK(c["per_query"]["rerank_reads"].get<double>() > 0);
      CHECK(f["per_query"]["reranked"].get<double>() == 0);
      // A sub-HNSW fetch without its vectors: lists, labels and codes of a quarter of their size.
      CHECK(c["per_query"]["bytes"].get<double>() < 0.5 * f["per_query"]["bytes"].get<double>());
    }
  }
  SECTION("--rerank on an index without codes is refused naming the flag") {
    SmallData d;
    TempDir dir;
    Memnode m0(dir, 0, "shm");
    REQUIRE(run(computenode_args("dhnsw", "shm", m0.address, 0, 1, {"build", "--data", d.base, "--max-elements", "300",
                                                                     "--partitions", "2"}),
                dir, "plain", seconds(120))
                .code == 0);
    auto q = run(computenode_args("dhnsw", "shm", m0.address, 0, 1, {"query", "--workload", d.wl, "--rerank", "10"}),
                 dir, "refused", seconds(60));
    CHECK(q.code != 0);
    CHECK_THAT(q.output, Contains("--rerank") && Contains("no codes"));
  }
}
