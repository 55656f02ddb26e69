// SHINE across real processes: 2 memnodes, 2 computenodes x 2 threads building one graph,
// then querying it, on shm and tcp; a memnode killed mid-query; inserts during queries.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <fstream>

#include "proc.hpp"

using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::seconds;

namespace {

using Data = SmallData;

std::vector<std::string> cn(const std::string& provider, const std::string& memnodes, int id, int k,
                            std::vector<std::string> rest) {
  return computenode_args("shine", provider, memnodes, id, k, rest);
}

}  // namespace

TEST_CASE("shine: 2 computenodes x 2 threads build over 2 memnodes, then query (shm, tcp)", "[integration][shine]") {
  Data d(200, 1200);  // a multi-process test: small data
  for (std::string provider : {"shm", "tcp"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      std::string mns = m0.address + "," + m1.address;
      std::string rep = dir.file("build.json");
      Proc b0(cn(provider, mns, 0, 2, {"build", "--data", d.base, "--m", "12", "--ef-construction", "80", "--threads", "2",
                                       "--coroutines", "4", "--report", rep}),
              dir.file("b0.log"));
      // Both given the same --report, as in the README: computenode 0 writes the merged report
      // there, computenode 1 its own next to it (one writer per file).
      Proc b1(cn(provider, mns, 1, 2, {"build", "--data", d.base, "--m", "12", "--ef-construction", "80", "--threads", "2",
                                       "--coroutines", "4", "--report", rep}),
              dir.file("b1.log"));
      int c0 = b0.wait(seconds(300)), c1 = b1.wait(seconds(300));
      INFO(b0.output() << b1.output());
      REQUIRE(c0 == 0);
      REQUIRE(c1 == 0);
      auto br = load_json(rep);
      CHECK(br["inserted"] == 1200);
      CHECK(br["index_nodes"] == 1200);
      CHECK(br["per_cn"].size() == 2);
      CHECK(br["memnode_usage"][0]["bytes_used"].get<uint64_t>() > 0);
      CHECK(br["memnode_usage"][1]["bytes_used"].get<uint64_t>() > 0);  // spread over both memnodes
      uint64_t n0 = br["memnode_usage"][0]["nodes_inserted_here"], n1 = br["memnode_usage"][1]["nodes_inserted_here"];
      CHECK(n0 + n1 == 1200);
      CHECK(n0 > 480);  // a random memnode per node
      CHECK(n1 > 480);
      auto own1 = load_json(rep + ".cn1");
      CHECK(own1["cn"]["cn_id"] == 1);
      CHECK(own1["cn"]["inserted"] == 600);

      std::string qrep = dir.file("query.json");
      Proc q0(cn(provider, mns, 0, 2, {"query", "--workload", d.wl, "--k", "10", "--ef-search", "16,64", "--threads", "2",
                                       "--coroutines", "2", "--report", qrep}),
              dir.file("q0.log"));
      Proc q1(cn(provider, mns, 1, 2, {"query", "--workload", d.wl, "--k", "10", "--ef-search", "16,64", "--threads", "2",
                                       "--coroutines", "2", "--read-mode", "per-read"}),
              dir.file("q1.log"));
      c0 = q0.wait(seconds(300));
      c1 = q1.wait(seconds(300));
      INFO(q0.output() << q1.output());
      REQUIRE(c0 == 0);
      REQUIRE(c1 == 0);
      CHECK_THAT(q0.output(), Contains("efSearch") && Contains("recall"));
      auto qr = load_json(qrep);
      REQUIRE(qr["runs"].size() == 2);
      CHECK(qr["runs"][0]["queries"] == 200);
      CHECK(qr["runs"][1]["recall"].get<double>() >= 0.9);
      CHECK(qr["runs"][1]["recall"].get<double>() >= qr["runs"][0]["recall"].get<double>() - 0.01);
      auto& pq = qr["runs"][1]["per_query"];
      CHECK(pq["reads"].get<double>() > pq["visited"].get<double>());  // lists + vectors
      CHECK(pq["bytes"].get<double>() >= pq["vector_bytes"].get<double>());
      CHECK(qr["runs"][1]["network_bound_qps"]["100Gbps"].get<double>() > 0);

      // Building again over the index is refused, naming what is there and what to do; the
      // index keeps its 1200 nodes (it used to insert rows 0..n-1 a second time).
      Proc again(cn(provider, mns, 0, 1, {"build", "--data", d.base, "--m", "12", "--ef-construction", "80"}),
                 dir.file("again.log"));
      CHECK(again.wait(seconds(60)) != 0);
      CHECK_THAT(again.output(), Contains("already hold a shine index of 1200 nodes") && Contains("insert"));
      Proc info(computenode_args("shine", provider, mns, 0, 1, {}), dir.file("info.log"));
      CHECK(info.wait(seconds(60)) == 0);
      CHECK_THAT(info.output(), Contains("mode shine"));
      std::string qrep2 = dir.file("query2.json");
      Proc q2(cn(provider, mns, 0, 1, {"query", "--workload", d.wl, "--k", "10", "--ef-search", "64", "--threads", "1",
                                       "--coroutines", "2", "--report", qrep2}),
              dir.file("q2.log"));
      REQUIRE(q2.wait(seconds(300)) == 0);
      CHECK(load_json(qrep2)["runs"][0]["recall"].get<double>() ==
            Approx(qr["runs"][1]["recall"].get<double>()).margin(1e-9));
    }
  }
}

TEST_CASE("shine: a builder killed mid-build makes the other fail within seconds naming it or the lock it held",
          "[integration][shine]") {
  // The survivor stops its share once memnode 0's presence table shows its peer left (its
  // watcher reads it every 100 ms), or fails on a node lock the dead builder held (10 s); it
  // never finishes its share first or waits out the barrier's 600 s.
  Data d;
  TempDir dir;
  Memnode m0(dir, 0, "tcp"), m1(dir, 1, "tcp");
  std::string mns = m0.address + "," + m1.address;
  // Computenode 0 first, so that it formats the memnodes (the victim is not the formatter).
  Proc b0(cn("tcp", mns, 0, 2, {"build", "--data", d.base, "--m", "12", "--ef-construction", "80", "--threads", "1"}),
          dir.file("b0.log"));
  wait_for_output(b0, "connected", seconds(30));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Proc b1(cn("tcp", mns, 1, 2, {"build", "--data", d.base, "--m", "12", "--ef-construction", "80", "--threads", "1"}),
          dir.file("b1.log"));
  wait_for_output(b1, "connected", seconds(30));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(b1.running());
  b1.signal(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  int code = b0.wait(seconds(60));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(b0.output());
  CHECK(code > 0);
  CHECK(secs < 20.0);
  const std::string out = b0.output();
  CHECK((out.find("computenode 1 left the run") != std::string::npos ||
         out.find("a computenode died or stopped holding it") != std::string::npos));
  b1.wait(seconds(5));
}

TEST_CASE("shine: a memnode killed mid-query makes the computenode fail within 5 s naming it", "[integration][shine]") {
  // "stuck": a provider call that never returns once the memnode died (DMHNSW_FAULT_STUCK_ON_DEATH;
  // libfabric's shm can do so when the killed process held one of its shared locks): the
  // computenode still ends within seconds, with the error, by itself. Over cxl the query reads
  // lists and vectors in place, from the dead memnode's mapping until it is found dead.
  for (const auto& [provider, stuck] : {std::pair<std::string, bool>{"shm", false}, {"shm", true}, {"cxl", false}}) {
    DYNAMIC_SECTION(provider << (stuck ? ", a provider call stuck on the dead memnode" : ", plain")) {
      Data d;
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      std::string mns = m0.address + "," + m1.address;
      auto b = run(cn(provider, mns, 0, 1, {"build", "--data", d.base, "--max-elements", "1000", "--ef-construction", "40"}),
                   dir, "build", seconds(300));
      INFO(b.output);
      REQUIRE(b.code == 0);
      std::vector<std::string> env;
      if (stuck) env.push_back("DMHNSW_FAULT_STUCK_ON_DEATH=1");
      Proc q(cn(provider, mns, 0, 1, {"query", "--workload", d.wl, "--ef-search", "32", "--repeat-seconds", "60"}),
             dir.file("q.log"), env);
      // Let it get going: the workload is read and the first barrier passed once it has logged.
      wait_for_output(q, "connected", seconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // well into the measured part
      REQUIRE(q.running());
      const auto [code, secs] = kill_then_wait(*m1.proc, q, seconds(15));
      INFO(q.output());
      CHECK(code == 1);
      CHECK(secs < 5.0);
      CHECK_THAT(q.output(), Contains("memnode 1 (" + m1.address + ")"));
      if (stuck) CHECK_THAT(q.output(), Contains("has not finished failing"));
      if (provider == "cxl") CHECK_THAT(q.output(), Contains("read in place"));
    }
  }
}

TEST_CASE("shine: a memnode whose fabric stops progressing while its control connection answers fails the "
          "computenode within the stall timeout, naming it",
          "[integration][shine]") {
  for (std::string provider : {"shm", "tcp"}) {
    DYNAMIC_SECTION(provider) {
      Data d;
      TempDir dir;
      const std::string stall = dir.file("stall-now");
      Memnode m0(dir, 0, provider),
          m1(dir, 1, provider, "127.0.0.1:0", {}, {}, {"DMHNSW_FAULT_STALL_FILE=" + stall, "DMHNSW_TEST_STUCK_REPORT_S=2.5"});
      std::string mns = m0.address + "," + m1.address;
      auto b = run(cn(provider, mns, 0, 1, {"build", "--data", d.base, "--max-elements", "1000", "--ef-construction", "40"}),
                   dir, "build", seconds(300));
      INFO(b.output);
      REQUIRE(b.code == 0);
      Proc q(cn(provider, mns, 0, 1,
                {"--stall-timeout-ms", "2000", "query", "--workload", d.wl, "--ef-search", "32", "--repeat-seconds", "60"}),
             dir.file("q.log"));
      wait_for_output(q, "connected", seconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      REQUIRE(q.running());
      { std::ofstream(stall) << "now\n"; }
      auto t0 = std::chrono::steady_clock::now();
      int code = q.wait(seconds(30));
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      INFO(q.output());
      INFO(m1.proc->output());
      CHECK(code > 0);
      CHECK(secs < 8.0);  // 2 s of stall timeout, plus the 100 ms the memnode takes to see the file
      CHECK_THAT(q.output(), Contains("memnode 1 (" + m1.address + ")"));
      CHECK_THAT(q.output(), Contains("no progress from its fabric endpoint"));
      CHECK(m1.proc->running());  // the memnode itself is alive: only its fabric stopped
      // ... and says so itself once its progress loop has not come round for a while (5 s; 2.5 s here).
      wait_for_output(*m1.proc, "has not come round", seconds(15));
      CHECK_THAT(m1.proc->output(), Contains("the fabric progress thread has not come round"));
    }
  }
}

TEST_CASE("shine: inserts by one computenode while another queries", "[integration][shine]") {
  Data d;
  TempDir dir;
  Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
  std::string mns = m0.address + "," + m1.address;
  auto b = run(cn("shm", mns, 0, 1, {"build", "--data", d.base, "--max-elements", "1500", "--ef-construction", "60"}),
               dir, "build", seconds(300));
  INFO(b.output);
  REQUIRE(b.code == 0);
  std::string qrep = dir.file("during.json");
  Proc q(cn("shm", mns, 0, 1, {"query", "--workload", d.wl, "--ef-search", "48", "--threads", "1", "--coroutines", "2",
                               "--repeat-seconds", "4", "--report", qrep}),
         dir.file("q.log"));
  Proc ins(cn("shm", mns, 1, 2, {"insert", "--data", d.base, "--begin", "1500", "--threads", "1", "--coroutines", "2"}),
           dir.file("ins.log"));
  const std::string irep = dir.file("insert.json");
  Proc ins2(cn("shm", mns, 0, 2, {"insert", "--data", d.base, "--begin", "1500", "--threads", "1", "--report", irep}),
            dir.file("ins2.log"));
  int ci = ins.wait(seconds(300)), ci2 = ins2.wait(seconds(300)), cq = q.wait(seconds(300));
  INFO(q.output() << ins.output() << ins2.output());
  REQUIRE(ci == 0);
  REQUIRE(ci2 == 0);
  REQUIRE(cq == 0);  // no crash, no failed read, no garbage pointer followed
  auto during = load_json(qrep);
  CHECK(during["runs"][0]["queries"].get<uint64_t>() > 0);
  const auto ir = load_json(irep);
  CHECK(ir["kind"] == "insert");
  CHECK(ir["inserted"] == 1500);  // both computenodes' shares, merged by computenode 0
  // After the inserts the index holds every vector and answers the full ground truth.
  std::string after = dir.file("after.json");
  auto q2 = run(cn("shm", mns, 0, 1, {"query", "--workload", d.wl, "--ef-search", "64", "--report", after}), dir, "q2",
                seconds(300));
  INFO(q2.output);
  REQUIRE(q2.code == 0);
  CHECK(load_json(after)["runs"][0]["recall"].get<double>() >= 0.9);
}

TEST_CASE("shine: an index stored with --store-index and served by memnode --load answers exactly as before",
          "[integration][shine]") {
  Data d;
  TempDir dir;
  std::string store = dir.file("images");
  std::string before = dir.file("before.json"), after = dir.file("after.json");
  std::vector<std::string> query{"query", "--workload", d.wl, "--ef-search", "32", "--threads", "1", "--coroutines", "1"};
  {
    Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
    std::string mns = m0.address + "," + m1.address;
    auto b = run(cn("shm", mns, 0, 1, {"build", "--data", d.base, "--max-elements", "1200", "--ef-construction", "40",
                                       "--store-index", store}),
                 dir, "build", seconds(300));
    INFO(b.output);
    REQUIRE(b.code == 0);
    auto q = query;
    q.insert(q.end(), {"--report", before});
    auto r = run(cn("shm", mns, 0, 1, q), dir, "q1", seconds(300));
    INFO(r.output);
    REQUIRE(r.code == 0);
  }
  REQUIRE(std::filesystem::exists(store + "/memnode-0.img"));
  REQUIRE(std::filesystem::exists(store + "/memnode-1.img"));
  Memnode l0(dir, 0, "shm", "127.0.0.1:0", {"--load", store + "/memnode-0.img"});
  Memnode l1(dir, 1, "shm", "127.0.0.1:0", {"--load", store + "/memnode-1.img"});
  auto q = query;
  q.insert(q.end(), {"--report", after});
  auto r = run(cn("shm", l0.address + "," + l1.address, 0, 1, q), dir, "q2", seconds(300));
  INFO(r.output);
  REQUIRE(r.code == 0);
  auto a = load_json(before)["runs"][0], b = load_json(after)["runs"][0];
  CHECK(a["recall"] == b["recall"]);
  CHECK(a["per_query"]["visited"] == b["per_query"]["visited"]);  // the same graph, walked the same way
  CHECK(a["per_query"]["bytes"] == b["per_query"]["bytes"]);
}

TEST_CASE("shine: an index built with --codes answers with --rerank as with full vectors, reading a fraction of "
          "the bytes (bigann10k over shm, wordnet over cxl)",
          "[integration][shine][codes]") {
  // 3,000 rows of each: 2,000 built with codes, 1,000 inserted by another computenode.
  for (auto [set, provider] : {std::pair<std::string, std::string>{"bigann10k", "shm"}, {"wordnet", "cxl"}}) {
    DYNAMIC_SECTION(set << " over " << provider) {
      RealSubset d(set, 3000);
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      std::string mns = m0.address + "," + m1.address;
      auto b = run(cn(provider, mns, 0, 1, {"build", "--data", d.base, "--max-elements", "2000", "--ef-construction", "80",
                                            "--metric", d.metric, "--codes", "sq8", "--report", dir.file("build.json")}),
                   dir, "build", seconds(300));
      INFO(b.output);
      REQUIRE(b.code == 0);
      CHECK(load_json(dir.file("build.json"))["codes"]["code_size"] == d.dim);
      // Inserts by a computenode that did not train the quantizer: it loads it and logs codes too.
      auto ins = run(cn(provider, mns, 0, 1, {"insert", "--data", d.base, "--begin", "2000"}), dir, "insert", seconds(300));
      INFO(ins.output);
      REQUIRE(ins.code == 0);
      auto query = [&](const std::string& rerank, std::vector<std::string> more = {}) {
        const std::string rep = dir.file("q" + rerank + std::to_string(more.size()) + ".json");
        std::vector<std::string> args{"query", "--workload", d.wl, "--ef-search", "48", "--rerank", rerank, "--report", rep};
        args.insert(args.end(), more.begin(), more.end());
        auto q = run(cn(provider, mns, 0, 1, args), dir, "q" + rerank, seconds(300));
        INFO(q.output);
        REQUIRE(q.code == 0);
        return load_json(rep);
      };
      const auto full = query("0"), coded = query("30");
      // A node cache over codes holds neighbour lists (--cache-holds auto): the same searches,
      // fewer READs (over cxl with copies: in place a list costs no READ, and no cache is used).
      const auto listed = query("30", {"--cache-ratio", "0.2", "--admit-probability", "1", "--no-in-place"});
      const auto& l = listed["runs"][0];
      CHECK(listed["cache"]["holds"] == "lists");
      CHECK(l["recall"].get<double>() == Approx(coded["runs"][0]["recall"].get<double>()).margin(1e-9));
      CHECK(l["per_query"]["cached_lists"].get<double>() > 0.5 * l["per_query"]["hops"].get<double>());
      CHECK(l["per_query"]["reads"].get<double>() < 0.7 * coded["runs"][0]["per_query"]["reads"].get<double>());
      const auto& f = full["runs"][0];
      const auto& c = coded["runs"][0];
      INFO("recall full " << f["recall"] << ", codes " << c["recall"] << "; bytes per query " << f["per_query"]["bytes"]
                          << " -> " << c["per_query"]["bytes"]);
      WARN(set << ": recall@10 " << f["recall"] << " -> " << c["recall"] << " on codes, bytes per query "
                << f["per_query"]["bytes"] << " -> " << c["per_query"]["bytes"]);
      CHECK(full["codes"].is_null());
      CHECK(coded["codes"]["nodes"] == 3000);  // every node's code, the inserted ones too
      CHECK(f["recall"].get<double>() >= 0.9);
      CHECK(c["recall"].get<double>() >= f["recall"].get<double>() - 0.01);
      CHECK(c["per_query"]["coded"].get<double>() > 0.9 * c["per_query"]["visited"].get<double>() - 30);
      CHECK(c["per_query"]["reranked"].get<double>() <= 30.0);
      CHECK(c["per_query"]["bytes"].get<double>() < 0.25 * f["per_query"]["bytes"].get<double>());
      // cxl maps the regions: the entry point, lists and vectors are read where they lie (no
      // doorbell), and copying them instead finds the same answers.
      CHECK(full["in_place"] == (provider == "cxl"));
      if (provider == "cxl") {
        const auto copied = query("0", {"--no-in-place"});
        const auto& cp = copied["runs"][0];
        CHECK(copied["in_place"] == false);
        CHECK(cp["recall"].get<double>() == Approx(f["recall"].get<double>()).margin(1e-9));
        CHECK(cp["per_query"]["reads"].get<double>() == Approx(f["per_query"]["reads"].get<double>()));
        CHECK(f["per_query"]["doorbells"].get<double>() == Approx(0.0));
        CHECK(cp["per_query"]["doorbells"].get<double>() > 10.0);
      }
    }
  }
  SECTION("--rerank on an index without codes is refused naming the flag") {
    Data d;
    TempDir dir;
    Memnode m0(dir, 0, "shm");
    REQUIRE(run(cn("shm", m0.address, 0, 1, {"build", "--data", d.base, "--max-elements", "300"}), dir, "plain",
                seconds(120))
                .code == 0);
    auto q = run(cn("shm", m0.address, 0, 1, {"query", "--workload", d.wl, "--rerank", "10"}), dir, "refused", seconds(60));
    CHECK(q.code != 0);
    CHECK_THAT(q.output, Contains("--rerank") && Contains("no codes"));
  }
}
