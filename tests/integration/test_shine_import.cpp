// shine-import across real processes: an hnswlib index saved by hnswlib-bench --save, imported
// into 2 memnodes (shm, cxl), queried by `computenode --mode shine query` with hnswlib's recall
// and, query by query, hnswlib's answers; then `computenode --mode shine insert` adds to it.
// Over cxl it is imported with --codes sq8, and `query --rerank` on the codes keeps the recall.
//
// <hnswlib/hnswlib.h> defines non-inline functions: this is the only translation unit of
// this test binary that includes it (to compare answers query by query).
#include <catch2/catch.hpp>

#include <set>

#include "tools/hnswlib_space.hpp"
#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "common/fabric/cluster.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "common/workload.hpp"
#include "compute/shine/codes_log.hpp"
#include "compute/shine/graph.hpp"
#include "proc.hpp"

using namespace dmhnsw;
using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::seconds;

namespace {

std::shared_ptr<fabric::Cluster> connect(const std::string& provider, const std::string& memnodes) {
  fabric::ClusterOptions co;
  co.provider = fabric::parse_provider(provider);
  co.memnodes = split_commas(memnodes);
  co.mode = fabric::Mode::Shine;
  co.num_cns = 1;
  return fabric::connect_cluster(co);
}

}  // namespace

TEST_CASE("shine-import: an hnswlib index served by 2 memnodes answers as hnswlib does and takes inserts",
          "[integration][shine][import]") {
  SmallData d;  // 3000 x 24, a workload of 400 measured queries
  TempDir work;
  const std::string idx = work.file("index.hnsw"), hjson = work.file("hnswlib.json");
  const uint32_t ef = 32, k = 10;
  // One build thread: hnswlib's graph is then a function of the data and the seed.
  auto hb = run({bin("hnswlib-bench"), "--base", d.base, "--workload", d.wl, "--k", std::to_string(k), "--ef-search",
                 std::to_string(ef), "--m", "12", "--ef-construction", "80", "--threads", "1", "--save", idx, "--json",
                 hjson},
                work, "hnswlib-bench", seconds(300));
  INFO(hb.output);
  REQUIRE(hb.code == 0);
  const double hnswlib_recall = load_json(hjson)["runs"][0]["recall"].get<double>();

  // hnswlib's own answers, query by query (the measured part of the workload).
  const Workload wl = read_workload(d.wl);
  DispatchedSpace space(Metric::L2, wl.dim());
  hnswlib::HierarchicalNSW<float> ref(&space, idx);
  ref.setEf(ef);
  std::vector<std::set<uint32_t>> expected;
  for (uint64_t i = wl.warmup_count; i < wl.total(); ++i) {
    auto r = ref.searchKnn(wl.queries.row(i), k);
    std::set<uint32_t> s;
    for (; !r.empty(); r.pop()) s.insert(static_cast<uint32_t>(r.top().second));
    expected.push_back(s);
  }

  // 20 new rows after the 3,000 of the base, for the insert afterwards (labels 3000..3019).
  const std::string ext = work.file("ext.fvecs");
  {
    FloatMatrix base = load_vectors_as_float(d.base);
    FloatMatrix all(base.n() + 20, base.d());
    for (size_t i = 0; i < base.n(); ++i) std::copy_n(base.row(i), base.d(), all.mutable_row(i));
    for (size_t i = 0; i < 20; ++i)
      for (size_t j = 0; j < base.d(); ++j) all.mutable_row(base.n() + i)[j] = base.row(i * 7)[j] + 0.25f * static_cast<float>(j % 3);
    write_fvecs(ext, all);
  }

  for (std::string provider : {"shm", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      const std::string mns = m0.address + "," + m1.address;
      const std::string irep = dir.file("import.json");
      // Over cxl with SQ8 codes (one provider is enough: the codes are written as the records are).
      const bool coded = provider == "cxl";
      std::vector<std::string> import_args{bin("shine-import"), "--hnswlib", idx, "--data", d.base, "--memnodes", mns,
                                           "--provider", provider, "--chunk", "256KiB", "--report", irep};
      if (coded) import_args.insert(import_args.end(), {"--codes", "sq8"});
      auto im = run(import_args, dir, "import", seconds(120));
      INFO(im.output);
      REQUIRE(im.code == 0);
      CHECK_THAT(im.output, Contains("3000 nodes") && Contains("doorbells"));
      auto ir = load_json(irep);
      CHECK(ir.contains("codes") == coded);
      if (coded) {
        CHECK_THAT(im.output, Contains("codes sq8: 24 bytes per vector"));
        CHECK(ir["codes"]["entries"] == 3000);
        CHECK(ir["codes"]["dropped"] == 0);
        CHECK(ir["codes"]["train_rows"] == 3000);
      }
      CHECK(ir["nodes"] == 3000);
      CHECK(ir["m"] == 12);
      CHECK(ir["ef_construction"] == 80);
      CHECK(ir["memnode_usage"][0]["nodes"].get<uint64_t>() > 1000);  // spread over both memnodes
      CHECK(ir["memnode_usage"][1]["nodes"].get<uint64_t>() > 1000);
      CHECK(ir["record_doorbells"].get<uint64_t>() < ir["record_writes"].get<uint64_t>());
      CHECK(ir["memnode_cpu"]["seconds"].size() == 2);  // the fields of every computenode report
      CHECK(ir["process_memory"]["peak_rss_mib"].get<double>() > 0);
      CHECK(ir["wire"]["model"] == "none");

      // The unchanged query path: hnswlib's recall.
      const std::string qrep = dir.file("query.json");
      auto q = run(computenode_args("shine", provider, mns, 0, 1,
                                    {"query", "--workload", d.wl, "--k", std::to_string(k), "--ef-search",
                                     std::to_string(ef), "--threads", "1", "--coroutines", "2", "--report", qrep}),
                   dir, "query", seconds(300));
      INFO(q.output);
      REQUIRE(q.code == 0);
      const double shine_recall = load_json(qrep)["runs"][0]["recall"].get<double>();
      INFO("hnswlib recall " << hnswlib_recall << ", shine recall " << shine_recall);
      CHECK(std::abs(shine_recall - hnswlib_recall) <= 0.002);
      if (coded) {  // traversal on the imported codes, the best 20 re-read: the float traversal's recall
        const std::string crep = dir.file("query-rerank.json");
        auto cq = run(computenode_args("shine", provider, mns, 0, 1,
                                       {"query", "--workload", d.wl, "--k", std::to_string(k), "--ef-search",
                                        std::to_string(ef), "--threads", "1", "--coroutines", "2", "--rerank", "20",
                                        "--report", crep}),
                      dir, "query-rerank", seconds(300));
        INFO(cq.output);
        REQUIRE(cq.code == 0);
        const auto cr = load_json(crep);
        const double coded_recall = cr["runs"][0]["recall"].get<double>();
        INFO("recall with --rerank 20 " << coded_recall);
        CHECK(std::abs(coded_recall - shine_recall) <= 0.01);
        CHECK(cr["codes"]["kind"] == "sq8");
        CHECK(cr["codes"]["nodes"] == 3000);
        CHECK(cr["runs"][0]["per_query"]["bytes"].get<double>() <
              0.5 * load_json(qrep)["runs"][0]["per_query"]["bytes"].get<double>());
      }

      // Query by query: shine's search (the query path's Worker::search) against hnswlib's.
      {
        auto c = connect(provider, mns);
        auto ep = c->make_endpoint(16u << 20);
        shine::GraphParams p = shine::format_or_attach(*c, *ep, nullptr);
        shine::Graph g(*c, p);
        compute::Scheduler s(*ep);
        shine::Worker w(g, s, 1);
        shine::OpContext ctx;
        size_t same = 0;
        for (uint64_t i = wl.warmup_count; i < wl.total(); ++i) {
          auto res = compute::run_sync(s, w.search(wl.queries.row(i), k, ef, ctx));
          std::set<uint32_t> got;
          for (auto& r : res) got.insert(r.label);
          same += got == expected[i - wl.warmup_count];
        }
        INFO(same << " of " << expected.size() << " queries with hnswlib's answer");
        CHECK(static_cast<double>(same) >= 0.99 * static_cast<double>(expected.size()));
      }

      // A second import into the same memnodes is refused, naming the memnode.
      auto again = run({bin("shine-import"), "--hnswlib", idx, "--memnodes", mns, "--provider", provider}, dir, "again",
                       seconds(60));
      CHECK(again.code == 1);
      CHECK_THAT(again.output, Contains("memnode 0 (" + m0.address + ") already holds a shine index"));

      // Further inserts through the unchanged insert path; each new row is found by itself.
      auto ins = run(computenode_args("shine", provider, mns, 0, 1,
                                      {"insert", "--data", ext, "--begin", "3000", "--threads", "1", "--coroutines", "2"}),
                     dir, "insert", seconds(300));
      INFO(ins.output);
      REQUIRE(ins.code == 0);
      {
        auto c = connect(provider, mns);
        auto ep = c->make_endpoint(16u << 20);
        shine::GraphParams p = shine::format_or_attach(*c, *ep, nullptr);
        shine::Graph g(*c, p);
        compute::Scheduler s(*ep);
        shine::Worker w(g, s, 1);
        shine::OpContext ctx;
        uint64_t count = 0;
        ep->read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &count, 8);
        CHECK(count == 3020);
        if (coded) CHECK(shine::LocalCodes::load(*ep, p).size() == 3020);  // the inserts appended theirs
        FloatMatrix all = load_vectors_as_float(ext);
        for (uint32_t i = 3000; i < 3020; ++i) {
          auto res = compute::run_sync(s, w.search(all.row(i), 1, 64, ctx));
          REQUIRE(res.size() == 1);
          CHECK(res[0].label == i);
        }
      }
    }
  }
}

TEST_CASE("shine-import: a corrupted hnswlib file is refused naming the file and the offset",
          "[integration][shine][import]") {
  TempDir dir;
  Memnode m0(dir, 0, "shm");
  const std::string bad = dir.file("bad.hnsw");
  {
    std::ofstream out(bad, std::ios::binary);
    std::vector<char> junk(200, 7);
    out.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto r = run({bin("shine-import"), "--hnswlib", bad, "--memnodes", m0.address}, dir, "bad", seconds(60));
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Contains(bad + ": byte offset "));
  // Bad flag values are refused naming the flag, before the file is read.
  for (const std::string v : {"sq4", "pq:", "pq:0", "pq:x"}) {
    auto f = run({bin("shine-import"), "--hnswlib", bad, "--memnodes", m0.address, "--codes", v}, dir, "bad-codes",
                 seconds(60));
    CHECK(f.code != 0);
    CHECK_THAT(f.output, Contains("--codes '" + v + "'"));
  }
  auto cap = run({bin("shine-import"), "--hnswlib", bad, "--memnodes", m0.address, "--codes-capacity", "-3"}, dir,
                 "bad-capacity", seconds(60));
  CHECK(cap.code != 0);
  CHECK_THAT(cap.output, Contains("--codes-capacity"));
}
