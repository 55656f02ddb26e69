// Replica sets with real memnode and computenode processes (docs/replication.md): every copy
// listed, each transport operation checked; a copy SIGKILLed during a shine build and during
// queries loses no insert and fails no search, for every provider on one host; computenodes
// that join later run with the dead copies left out.
#include <catch2/catch.hpp>

#include <csignal>
#include <fstream>
#include <thread>

#include "proc.hpp"

using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::seconds;

namespace {

/// Copy `copy` of memnode `id` in a set of `copies`; its files are memnode<id>c<copy>.*.
struct Copy {
  std::unique_ptr<Proc> proc;
  std::string address, log;
  Copy(const TempDir& dir, int id, int copy, int copies, const std::string& provider) {
    const std::string name = "memnode" + std::to_string(id) + "c" + std::to_string(copy);
    const std::string ready = dir.file(name + ".ready");
    log = dir.file(name + ".log");
    proc = std::make_unique<Proc>(
        std::vector<std::string>{bin("memnode"), "--listen", "127.0.0.1:0", "--id", std::to_string(id), "--replicas",
                                 std::to_string(copies), "--copy", std::to_string(copy), "--provider", provider,
                                 "--region", "128MiB", "--ready-file", ready},
        log);
    const auto end = std::chrono::steady_clock::now() + seconds(20);
    while (!std::filesystem::exists(ready)) {
      if (!proc->running()) throw std::runtime_error(name + " exited at start: " + proc->output());
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error(name + " not ready in 20 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream(ready) >> address;
  }
};

struct Sets {
  std::vector<std::unique_ptr<Copy>> copies;  // id * r + copy
  int r;
  Sets(const TempDir& dir, int n, int r_, const std::string& provider) : r(r_) {
    for (int id = 0; id < n; ++id)
      for (int c = 0; c < r; ++c) copies.push_back(std::make_unique<Copy>(dir, id, c, r, provider));
  }
  Copy& at(int id, int c) { return *copies[static_cast<size_t>(id * r + c)]; }
  /// Every copy's address, copies listed first (any order is taken).
  std::string list() const {
    std::string s;
    for (int c = r - 1; c >= 0; --c)
      for (size_t id = 0; id < copies.size() / static_cast<size_t>(r); ++id)
        s += (s.empty() ? "" : ",") + copies[id * static_cast<size_t>(r) + static_cast<size_t>(c)]->address;
    return s;
  }
  /// SIGKILL of one copy once it serves a computenode and `ready` holds.
  void kill_when(int id, int c, Proc& cn, const std::string& ready) {
    REQUIRE(wait_for_output(cn, ready, seconds(60)));
    at(id, c).proc->signal(SIGKILL);
  }
};

double recall_of(const std::string& report) { return load_json(report)["runs"][0]["recall"].get<double>(); }

}  // namespace

TEST_CASE("replica sets: R = 2 passes the selftest over every provider, and a missing copy is refused naming them",
          "[integration][replicas]") {
  for (std::string provider : {"shm", "tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Sets s(dir, 2, 2, provider);
      auto r = run({bin("computenode"), "--provider", provider, "--memnodes", s.list(), "selftest", "--atomics", "200"},
                   dir, "cn", seconds(60));
      INFO(r.output);
      CHECK(r.code == 0);
      CHECK_THAT(r.output, Contains("selftest: 16 checks, 0 failed"));
      // Each set is one memnode of the index, named by all its copies' addresses.
      CHECK_THAT(r.output, Contains("memnode 1 (" + s.at(1, 0).address + ", " + s.at(1, 1).address + ")"));
      auto bad = run({bin("computenode"), "--provider", provider, "--memnodes",
                      s.at(0, 0).address + "," + s.at(0, 1).address + "," + s.at(1, 1).address, "selftest"},
                     dir, "cn-bad", seconds(60));
      CHECK(bad.code != 0);
      CHECK_THAT(bad.output, Contains("--replicas 2") && Contains("1 copy 1/2") && Contains("once per copy"));
    }
  }
}

TEST_CASE("replica sets: a copy SIGKILLed during a shine build and another during queries lose nothing (every id "
          "held, at most 0.1 % unreachable by search)",
          "[integration][replicas]") {
  // Not shm: libfabric 1.17's shm endpoint of a computenode stops progressing toward every
  // memnode once one it had operations in flight with is killed (docs/replication.md).
  for (std::string provider : {"tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      SmallData d(300, 2000);
      TempDir dir;
      Sets s(dir, 2, 2, provider);
      auto cn = [&](std::vector<std::string> rest) {
        return computenode_args("shine", provider, s.list(), 0, 1, rest);
      };
      // The build by 2 computenodes: memnode 0's first copy (the primary of the entry point, the
      // format word and the bump pointer) dies after the first progress line. A wire model of
      // 50 us per operation makes the build last seconds on every provider.
      std::vector<std::unique_ptr<Proc>> b;
      for (int i = 0; i < 2; ++i)
        b.push_back(std::make_unique<Proc>(
            computenode_args("shine", provider, s.list(), i, 2,
                             {"--wire", "50,0", "build", "--data", d.base, "--m", "12", "--ef-construction", "64",
                              "--threads", "2", "--coroutines", "4", "--report", dir.file("build.json")}),
            dir.file("build" + std::to_string(i) + ".log"), std::vector<std::string>{"DMHNSW_PROGRESS_SECONDS=1"}));
      s.kill_when(0, 0, *b[0], "/1000 vectors (");
      for (auto& p : b) {
        const int built = p->wait(seconds(120));
        INFO(p->output());
        REQUIRE(built == 0);
        CHECK_THAT(p->output(), Contains("memnode 0 copy 0 (" + s.at(0, 0).address));
      }
      const auto br = load_json(dir.file("build.json"));
      CHECK(br["inserted"] == 2000);
      CHECK(br["index_nodes"] == 2000);

      // Queries routed between 2 computenodes (adaptive routing through the memnodes' relays),
      // no node cache (every vector read remotely): memnode 1's second copy dies while they
      // run, with the relay in it and whatever messages it held. Both cycle through the
      // workload for at least 2 s: one pass over tcp can be shorter than the second before
      // the kill on an idle host. Routing batches of 50 and a threshold of 50 keep the routers
      // near their workers (by default they queue 2,064 ahead: ~30 s to drain over tcp).
      const std::string repeat = "2";
      std::vector<std::unique_ptr<Proc>> q;
      for (int i = 0; i < 2; ++i)
        q.push_back(std::make_unique<Proc>(
            computenode_args("shine", provider, s.list(), i, 2,
                             {"query", "--workload", d.wl, "--k", "10", "--ef-search", "48", "--threads", "1",
                              "--coroutines", "4", "--cache-ratio", "0", "--routing", "adaptive", "--route-batch",
                              "50", "--route-threshold", "50", "--repeat-seconds", repeat, "--report",
                              dir.file("q-kill.json")}),
            dir.file("q-kill" + std::to_string(i) + ".log")));
      REQUIRE(wait_for_output(*q[0], "partitioning: ", seconds(60)));  // the router's oracle is ready
      std::this_thread::sleep_for(seconds(1));                          // into the measured phase
      for (auto& p : q) {
        INFO(p->output());
        REQUIRE(p->running());
      }
      s.at(1, 1).proc->signal(SIGKILL);
      for (auto& p : q) {
        const int queried = p->wait(seconds(90));
        INFO(p->output());
        REQUIRE(queried == 0);
        CHECK_THAT(p->output(), Contains("memnode 1 copy 1 (" + s.at(1, 1).address));  // it saw the death
      }
      const auto qk = load_json(dir.file("q-kill.json"))["runs"][0];
      uint64_t routed = 0, syncs = 0;
      for (const auto& share : qk["per_cn"]) {
        routed += share["routed_away"].get<uint64_t>();
        syncs += share["syncs"].get<uint64_t>();
      }
      CHECK(qk["per_cn"].size() == 2);
      CHECK(routed > 100);
      WARN(provider << ": " << qk["queries"] << " queries, " << routed << " routed, " << syncs
                    << " syncs after memnode 1 copy 1 died");
      // The same queries on the survivors: the same graph, the same answers.
      auto again = run(cn({"query", "--workload", d.wl, "--k", "10", "--ef-search", "48", "--threads", "1",
                           "--cache-ratio", "0", "--report", dir.file("q-after.json")}),
                       dir, "q-after", seconds(60));
      INFO(again.output);
      REQUIRE(again.code == 0);
      const double during = recall_of(dir.file("q-kill.json")), after = recall_of(dir.file("q-after.json"));
      INFO("recall@10 through the kill " << during << ", after it " << after);
      CHECK(after >= 0.9);
      CHECK(during == Approx(after).margin(0.01));
      // Every vector the build acknowledged is in the graph on the surviving copies: each is
      // its own nearest neighbour (2,000 draws of the 2,000 rows). A node cache of the whole
      // index: each vector is read once from the surviving copies, the lists on every hop (over
      // tcp half the READs and time of no cache).
      auto self = run(cn({"query", "--workload", self_workload(d, dir, 0, 2000), "--k", "1", "--ef-search", "200",
                          "--threads", "2", "--coroutines", "32", "--cache-ratio", "1", "--report",
                          dir.file("self.json")}),
                      dir, "q-self", seconds(180));
      INFO(self.output);
      REQUIRE(self.code == 0);
      // Two computenodes building at once leave rows a search misses: 0.994 to 0.999 in 4 runs
      // without the kill, 0.9885 to 0.999 in 18 with it. The images of the surviving copies
      // (--store-index) held every row, each reachable from the entry point, in 3 of the kill
      // runs and 1 without: search misses on this clustered data, not lost nodes. A stale copy
      // read loses far more.
      WARN(provider << ": self recall@1 of the 2,000 built rows " << recall_of(dir.file("self.json")));
      CHECK(recall_of(dir.file("self.json")) >= 0.98);  // the search's recall at efSearch 200
      if (provider == "cxl") {
        // Exhaustive (efSearch above the 2,000 nodes; the mapped regions make it cheap): a row it
        // misses is held (the delete below finds every id) but unreachable from the entry point: a
        // node whose in-edges two concurrent builders' pruning all dropped (1 of 2,000 in one run
        // of 3; hnswlib graphs have such nodes too). The name allows 0.1 %.
        auto all = run(cn({"query", "--workload", self_workload(d, dir, 0, 2000), "--k", "1", "--ef-search", "2500",
                           "--threads", "2", "--report", dir.file("self-all.json")}),
                       dir, "q-self-all", seconds(180));
        INFO(all.output);
        REQUIRE(all.code == 0);
        CHECK(recall_of(dir.file("self-all.json")) >= 0.999);
      }
      // None lost: the id index holds every row's id (a delete of the 2,000 finds each; the
      // last step, as it changes the index).
      {
        std::ofstream f(dir.file("all-ids.txt"));
        for (int i = 0; i < 2000; ++i) f << i << "\n";
      }
      auto del = run(cn({"delete", "--ids", dir.file("all-ids.txt"), "--report", dir.file("del.json")}), dir, "delete-all",
                     seconds(120));
      INFO(del.output);
      REQUIRE(del.code == 0);
      const auto dj = load_json(dir.file("del.json"));
      CHECK(dj["deleted"] == 2000);
      CHECK(dj["not_found"] == 0);
    }
  }
}


namespace {

/// d-HNSW over replica sets: 2,400 of SmallData's 3,000 rows built with tiny gaps, so the inserts
/// force online rebuilds (the control block, the insert buffer and the board live on memnode 0);
/// a querier at 100 queries/s; two computenodes inserting the other 600 under a wire model of
/// 300 us per operation (they take seconds).
struct DhnswLoad {
  const SmallData& d;
  const TempDir& dir;
  Sets& s;
  std::string provider;
  std::unique_ptr<Proc> querier;
  std::vector<std::unique_ptr<Proc>> inserters;
  int querier_qps = 100;  // the querier's arrival rate: one pass of its 450 queries lasts 450 / qps s

  std::vector<std::string> cn(int id, int k, std::vector<std::string> rest) const {
    return computenode_args("dhnsw", provider, s.list(), id, k, rest);
  }
  void start() {
    auto b = run(cn(0, 1, {"build", "--data", d.base, "--max-elements", "2400", "--partitions", "8", "--m", "16",
                           "--ef-construction", "80", "--internal-gap", "0.02", "--overflow-gap", "0.02"}),
                 dir, "build", seconds(300));
    INFO(b.output);
    REQUIRE(b.code == 0);
    querier = std::make_unique<Proc>(
        cn(0, 1, {"query", "--workload", d.wl, "--k", "10", "--batch", "16", "--probe", "3", "--ef-search", "64",
                  "--arrival-qps", std::to_string(querier_qps), "--max-wait-us", "20000"}),
        dir.file("during.log"));
    REQUIRE(wait_for_output(*querier, "d-HNSW index", seconds(30)));
    for (int i = 0; i < 2; ++i)
      inserters.push_back(std::make_unique<Proc>(
          cn(1 + i, 3, {"--wire", "300,0", "insert", "--data", d.base, "--begin", "2400", "--share",
                        std::to_string(i) + "/2", "--batch", "10", "--report", dir.file("ins.json")}),
          dir.file("ins" + std::to_string(i) + ".log")));
  }
  /// Rows both inserters acknowledged (each must exit 0); `rebuilds` gets their online rebuilds.
  uint64_t wait_inserters(uint64_t* rebuilds = nullptr) {
    uint64_t inserted = 0;
    for (int i = 0; i < 2; ++i) {
      const int code = inserters[static_cast<size_t>(i)]->wait(seconds(300));
      INFO(inserters[static_cast<size_t>(i)]->output());
      REQUIRE(code == 0);
      const auto r = load_json(dir.file("ins.json.cn" + std::to_string(1 + i)))["insert"];
      inserted += r["inserted"].get<uint64_t>();
      if (rebuilds) *rebuilds += r["rebuilds"].get<uint64_t>();
    }
    return inserted;
  }
  /// Recall@1 of the inserted rows queried by themselves, every partition searched: 1.0 when
  /// every acknowledged insert is on the surviving copies. A search cannot tell a lost row from
  /// one an in-place insert left without in-edges, so below 1.0 (at most 3 of the 600) an online
  /// rebuild, which reads every sub-HNSW's vectors and builds new graphs, decides.
  double self_recall() const {
    const std::string wl = self_workload(d, dir, 2400, 3000);
    auto query = [&](const char* name) {
      auto all = run(cn(0, 1, {"query", "--workload", wl, "--k", "10", "--batch", "64", "--probe", "8",
                               "--ef-search", "400", "--report", dir.file("self.json")}),
                     dir, name, seconds(300));
      INFO(all.output);
      REQUIRE(all.code == 0);
      return load_json(dir.file("self.json"))["runs"][0]["recall_at_1"].get<double>();
    };
    const double searched = query("self");
    if (searched == 1.0) return searched;
    WARN("self recall@1 of the 600 inserted rows " << searched << ": rebuilding to tell lost from unreachable");
    CHECK(searched >= 0.995);
    auto rb = run(cn(0, 1, {"rebuild", "--report", dir.file("self-rebuild.json")}), dir, "rebuild", seconds(120));
    INFO(rb.output);
    REQUIRE(rb.code == 0);
    // Every row in the sub-HNSWs, none left in the insert buffer (which the rebuild would also
    // take, and searches outside a rebuild do not read).
    const auto rr = load_json(dir.file("self-rebuild.json"));
    CHECK(rr["vectors"] == 3000);
    CHECK(rr["from_buffer"] == 0);
    return query("self-rebuilt");
  }
};

}  // namespace

TEST_CASE("replica sets: memnode 0's first copy SIGKILLed under d-HNSW inserts, rebuilds and queries loses nothing",
          "[integration][replicas][dhnsw]") {
  for (std::string provider : {"tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      SmallData d;  // 3,000 rows: 2,400 built, 600 inserted
      TempDir dir;
      Sets s(dir, 2, 2, provider);
      DhnswLoad load{d, dir, s, provider, {}, {}};
      load.start();
      // The copy dies as the first online rebuild starts.
      s.kill_when(0, 0, *load.inserters[0], "starting an online rebuild");
      uint64_t rebuilds = 0;
      CHECK(load.wait_inserters(&rebuilds) == 600);
      WARN(provider << ": " << rebuilds << " rebuild(s) while memnode 0 copy 0 died");
      const int qc = load.querier->wait(seconds(300));
      INFO(load.querier->output());
      CHECK(qc == 0);  // the querier never failed a query
      CHECK_THAT(load.querier->output(), Contains("memnode 0 copy 0 (" + s.at(0, 0).address));  // it saw the death
      CHECK(load.self_recall() == 1.0);
    }
  }
}

TEST_CASE("replica sets: a copy SIGKILLed under serve-bench searches and inserts fails no request and loses no insert "
          "(at most one unreachable by search)",
          "[integration][replicas][serve]") {
  for (std::string provider : {"tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      SmallData d(400);
      TempDir dir;
      Sets s(dir, 2, 2, provider);
      import_shine_index(dir, provider, s.list(), d);
      Proc srv(computenode_args("shine", provider, s.list(), 0, 1,
                                {"serve", "--listen", "127.0.0.1:0", "--ef-search", "64"}),
               dir.file("serve.log"));
      const bool serving = wait_for_output(srv, "serving shine on", seconds(120));
      INFO(srv.output());
      REQUIRE(serving);
      const std::string out = srv.output();
      const auto at = out.find("serving shine on ");
      const std::string addr = out.substr(at + 17, out.find_first_of(" \n", at + 17) - at - 17);
      // Inserts beside the searches: 300 vectors of another mixture (they stay out of the
      // workload's neighbours), 10 per request, 5 requests/s, with ids above the index's; the
      // copy dies 2 s into the 5 s run.
      REQUIRE(run({bin("datagen"), "--n", "300", "--d", "24", "--clusters", "4", "--seed", "11", "--queries", "0",
                   "--out-base", dir.file("ins.fvecs")},
                  dir, "datagen-ins")
                  .code == 0);
      Proc bench({bin("serve-bench"), "--target", addr, "--workload", d.wl, "--clients", "4", "--seconds", "5",
                  "--insert-data", dir.file("ins.fvecs"), "--insert-first-id", "1000000", "--insert-batch", "10",
                  "--insert-rate", "5", "--insert-verify-ef", "200", "--json", dir.file("bench.json")},
                 dir.file("bench.log"));
      std::this_thread::sleep_for(seconds(2));  // into the measured loop (the warm-up takes well under a second)
      REQUIRE(bench.running());
      s.at(1, 0).proc->signal(SIGKILL);  // memnode 1's primary
      const int code = bench.wait(seconds(60));
      INFO(bench.output() << srv.output());
      CHECK((code == 0 || code == 2));  // 2: a row not found even exhaustively (told apart below)
      const auto j = load_json(dir.file("bench.json"));
      CHECK(j["requests"].get<uint64_t>() > 100);
      CHECK(j["errors"] == 0);
      CHECK(j["requests_ok"] == j["requests"]);
      CHECK(j["recall"].get<double>() >= 0.9);
      CHECK_THAT(srv.output(), Contains("memnode 1 copy 0 (" + s.at(1, 0).address));
      // Every acknowledged insert answers its own id afterwards.
      const auto& ins = j["inserts"];
      CHECK(ins["errors"] == 0);
      CHECK(ins["rows_acknowledged"].get<uint64_t>() >= 100);
      // Searched by itself, every acknowledged row answers its own id: a row the first search
      // misses is searched again exhaustively, and one not found then is told apart as held but
      // unreachable (a node whose in-edges later inserts all pruned; the name allows one) or lost.
      INFO("verify: " << ins["verify"].dump());
      CHECK(ins["verify"]["lost"] == 0);
      CHECK(ins["verify"]["unreachable"].get<uint64_t>() <= 1);
      WARN(provider << ": " << j["requests"] << " requests, 0 failed, p99 " << j["latency_us"]["p99"]
                    << " us, max " << j["latency_us"]["max"] << " us through the kill; " << ins["rows_acknowledged"]
                    << " rows inserted, " << ins["verify"]["found"] << " found by themselves");
    }
  }
}

TEST_CASE("replica sets: R = 3 survives two kills of one set, and the third fails the computenode within 5 s naming the set",
          "[integration][replicas]") {
  TempDir dir;
  Sets s(dir, 2, 3, "tcp");
  Proc cn({bin("computenode"), "--provider", "tcp", "--memnodes", s.list(), "selftest", "--atomics", "50", "--loop",
           "60"},
          dir.file("cn.log"));
  REQUIRE(wait_for_output(cn, s.at(1, 2).address + "): all checks passed", seconds(30)));  // in its read loop
  s.at(1, 0).proc->signal(SIGKILL);
  REQUIRE(wait_for_output(cn, "memnode 1 copy 0", seconds(10)));
  s.at(1, 2).proc->signal(SIGKILL);
  REQUIRE(wait_for_output(cn, "memnode 1 copy 2", seconds(10)));
  CHECK(cn.running());  // reading on from copy 1
  s.at(1, 1).proc->signal(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  const int code = cn.wait(seconds(10));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(cn.output());
  CHECK(code > 0);
  CHECK(secs < 5.0);
  CHECK_THAT(cn.output(), Contains("memnode 1 (") && Contains("every copy is gone") &&
                              Contains("copy 1 (" + s.at(1, 1).address + ")"));
}

TEST_CASE("replica sets: a new memnode rejoins twice while d-HNSW inserts go on, then the other copy dies and nothing is lost",
          "[integration][replicas][rejoin]") {
  for (std::string provider : {"tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      SmallData d;  // 3,000 rows: 2,400 built, 600 inserted
      TempDir dir;
      Sets s(dir, 2, 2, provider);
      DhnswLoad load{d, dir, s, provider, {}, {}};
      // ~11 s: it must see the replacement join and become a full copy (about 4 s after it
      // starts on an idle host).
      load.querier_qps = 40;
      load.start();
      // Memnode 0's second copy dies as the inserts begin; a new memnode takes its address.
      s.kill_when(0, 1, *load.inserters[0], "starting an online rebuild");
      const std::string addr = s.at(0, 1).address;
      Proc fresh({bin("memnode"), "--listen", addr, "--id", "0", "--replicas", "2", "--copy", "1", "--rejoin",
                  "--provider", provider, "--region", "128MiB"},
                 dir.file("memnode0c1-new.log"));
      REQUIRE(wait_for_output(*load.querier, "a new memnode took its place", seconds(60)));
      // It is filled while the inserts go on, and becomes a full copy for everyone.
      auto rj = run(load.cn(3, 4, {"rejoin", "--memnode", "0", "--copy", "1", "--report", dir.file("rejoin.json")}), dir,
                    "rejoin", seconds(120));
      INFO(rj.output);
      REQUIRE(rj.code == 0);
      const auto rep = load_json(dir.file("rejoin.json.cn3"));  // computenode i > 0 writes REPORT.cn<i>
      // The whole region was copied, and the inserts' changes during the copy were marked and
      // copied again (in passes, or while frozen when few were left).
      CHECK(rep["first_pass_bytes"].get<uint64_t>() + 4096 >= rep["region_bytes"].get<uint64_t>());
      CHECK(rep["recopied_bytes"].get<uint64_t>() + rep["final_bytes"].get<uint64_t>() > 0);
      CHECK(rep["recopied_bytes"].get<uint64_t>() >= rep["passes"].get<uint64_t>() * rep["chunk_bytes"].get<uint64_t>());
      WARN(provider << ": rejoin copied " << rep["first_pass_bytes"] << " bytes at " << rep["first_pass_gbytes_per_s"]
                    << " GB/s, " << rep["passes"] << " pass(es) over " << rep["recopied_bytes"]
                    << " changed bytes, frozen " << rep["frozen_ms"] << " ms");
      INFO(load.querier->output());
      REQUIRE(wait_for_output(*load.querier, "rejoined its set", seconds(30)));
      // The new copy dies too, and another empty memnode takes its address: the set's rejoin
      // block still names copy 1 as done from the first rejoin, which must not make the new one
      // pass for full (it would be read empty; the second rejoin would find it fenced).
      fresh.signal(SIGKILL);
      REQUIRE(fresh.wait(seconds(10)) != 0);
      std::this_thread::sleep_for(seconds(1));  // seen dead by every computenode (heartbeats, the view)
      const std::string ready2 = dir.file("memnode0c1-new2.ready");
      Proc fresh2({bin("memnode"), "--listen", addr, "--id", "0", "--replicas", "2", "--copy", "1", "--rejoin",
                   "--provider", provider, "--region", "128MiB", "--ready-file", ready2},
                  dir.file("memnode0c1-new2.log"));
      for (int i = 0; i < 1000 && !std::filesystem::exists(ready2) && fresh2.running(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // waiting for a child to listen
      REQUIRE(std::filesystem::exists(ready2));
      auto rj2 = run(load.cn(3, 4, {"rejoin", "--memnode", "0", "--copy", "1", "--ack-timeout", "30"}), dir, "rejoin2",
                     seconds(120));
      INFO(rj2.output);
      REQUIRE(rj2.code == 0);
      // The original copy dies: the newest one holds everything.
      s.at(0, 0).proc->signal(SIGKILL);
      CHECK(load.wait_inserters() == 600);
      const int qc = load.querier->wait(seconds(300));
      INFO(load.querier->output());
      CHECK(qc == 0);
      CHECK(load.self_recall() == 1.0);
    }
  }
}

TEST_CASE("replica sets: a copy stopped and resumed stays out, also for a computenode that joins after it resumed",
          "[integration][replicas]") {
  SmallData d(300, 1200);
  TempDir dir;
  Sets s(dir, 2, 2, "tcp");
  auto cn = [&](std::vector<std::string> rest) { return computenode_args("shine", "tcp", s.list(), 0, 1, rest); };
  REQUIRE(run(cn({"build", "--data", d.base, "--max-elements", "600", "--m", "12", "--ef-construction", "64",
                  "--threads", "2"}),
              dir, "build", seconds(120))
              .code == 0);
  // Memnode 1's first copy stops: the inserts of the other 600 rows fence it and go on.
  s.at(1, 0).proc->signal(SIGSTOP);
  auto ins = run(cn({"--heartbeat-timeout-ms", "1000", "insert", "--data", d.base, "--begin", "600", "--threads", "2"}),
                 dir, "insert", seconds(120));
  s.at(1, 0).proc->signal(SIGCONT);  // back, with none of those inserts
  INFO(ins.output);
  REQUIRE(ins.code == 0);
  CHECK_THAT(ins.output, Contains("memnode 1 copy 0"));
  // A computenode that joins now reaches the stale copy, but the set's view names it dead.
  REQUIRE(run({bin("groundtruth"), "--base", d.base, "--queries", d.base, "--k", "1", "--metric", "l2", "--out",
               dir.file("self.ivecs")},
              dir, "self-gt")
              .code == 0);
  REQUIRE(run({bin("workload"), "--queries", d.base, "--groundtruth", dir.file("self.ivecs"), "--count", "1000",
               "--seed", "2", "--out", dir.file("self.wl")},
              dir, "self-wl")
              .code == 0);
  auto self = run(cn({"query", "--workload", dir.file("self.wl"), "--k", "1", "--ef-search", "100", "--threads", "2",
                      "--coroutines", "8", "--cache-ratio", "1", "--report", dir.file("self.json")}),
                  dir, "q-self", seconds(180));
  INFO(self.output);
  REQUIRE(self.code == 0);
  CHECK_THAT(self.output, Contains("memnode 1 copy 0") && Contains("found dead by another computenode"));
  // The stale copy never got the records and list updates of the inserts that went to memnode 1:
  // read, it would lose many of these self-queries. Two threads inserting leave a few rows
  // unreachable (0.997 seen once, as in the concurrent build above), so the bound is 0.99.
  CHECK(recall_of(dir.file("self.json")) >= 0.99);
}
