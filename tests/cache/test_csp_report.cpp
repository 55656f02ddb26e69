// csp-report, run as a process on hand-made trace directories with known answers.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../common/test_util.hpp"
#include "cache_test_util.hpp"

using namespace dmhnsw::cache;
using namespace dmhnsw::cache::test;
using dmhnsw::test::run_tool;
using dmhnsw::test::slurp;
using dmhnsw::test::TempDir;

namespace {

// Run 2: one computenode, 2 threads; own cache hit 2 of 4 measured accesses; the replay
// (same capacity, 4 entries, keys 1..3) hits 3 of 4 (first access of key 1 is warm-up).
void write_single_cn_run(const std::string& dir) {
  const uint64_t cap = run_capacity();
  write_trace_file(dir + "/cn0-t0.trace", meta(0, 1, 0, kRunDim, cap, kRunStart, "adaptive"),
                   {rec(run_key(1), 0, false), rec(run_key(1), 10, true, true), rec(run_key(2), 20, true)});
  write_trace_file(dir + "/cn0-t1.trace", meta(0, 1, 1, kRunDim, cap, kRunStart, "adaptive"),
                   {rec(run_key(2), 25, true, true), rec(run_key(1), 30, true)});
}

}  // namespace

TEST_CASE("csp-report: per-cn CHR, CHR_max and CSP of two runs, text and JSON", "[cache][tools]") {
  TempDir tmp;
  const std::string run1 = tmp.file("run1"), run2 = tmp.file("run2");
  std::filesystem::create_directories(run1);
  std::filesystem::create_directories(run2);
  write_known_run(run1, "none");
  write_single_cn_run(run2);
  std::filesystem::create_directories(run1 + "/not-a-trace");  // ignored: not a *.trace file

  const std::string json = tmp.file("report.json");
  const auto r = run_tool(tmp, "csp-report", "'" + run1 + "' '" + run2 + "' --json '" + json + "'");
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("CSP 0.4286") != std::string::npos);
  CHECK(r.out.find("CHR_max 0.7000") != std::string::npos);
  CHECK(r.out.find("aggregate CHR 0.4000") != std::string::npos);
  CHECK(r.out.find("0.6000") != std::string::npos);  // cn0
  CHECK(r.out.find("0.2000") != std::string::npos);  // cn1
  CHECK(r.out.find("adaptive") != std::string::npos);

  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  REQUIRE(j["runs"].size() == 2);
  const auto& a = j["runs"][0];
  CHECK(a["label"] == "none");
  CHECK(a["num_cns"] == 2);
  CHECK(a["files"].size() == 3);
  CHECK(a["records"] == 12);
  CHECK(a["accesses"] == 10);
  CHECK(a["hits"] == 4);
  CHECK(a["shared_accesses"] == 10);
  CHECK(a["shared_hits"] == 7);
  CHECK(a["shared_capacity_bytes"] == 2 * run_capacity());
  CHECK(a["chr"].get<double>() == Approx(0.4));
  CHECK(a["chr_max"].get<double>() == Approx(0.7));
  CHECK(a["csp"].get<double>() == Approx(3.0 / 7.0));
  REQUIRE(a["per_cn"].size() == 2);
  CHECK(a["per_cn"][0]["cn_id"] == 0);
  CHECK(a["per_cn"][0]["chr"].get<double>() == Approx(0.6));
  CHECK(a["per_cn"][1]["cn_id"] == 1);
  CHECK(a["per_cn"][1]["chr"].get<double>() == Approx(0.2));
  CHECK(a["per_cn"][1]["capacity_bytes"] == run_capacity());

  const auto& b = j["runs"][1];
  CHECK(b["label"] == "adaptive");
  CHECK(b["num_cns"] == 1);
  CHECK(b["accesses"] == 4);
  CHECK(b["hits"] == 2);
  CHECK(b["shared_hits"] == 3);
  CHECK(b["chr"].get<double>() == Approx(0.5));
  CHECK(b["chr_max"].get<double>() == Approx(0.75));
  CHECK(b["csp"].get<double>() == Approx(1.0 / 3.0));
}

TEST_CASE("csp-report: bad inputs fail with a message naming the file", "[cache][tools]") {
  TempDir tmp;
  const std::string empty = tmp.file("empty"), bad = tmp.file("bad");
  std::filesystem::create_directories(empty);
  std::filesystem::create_directories(bad);
  write_known_run(bad);
  std::filesystem::resize_file(bad + "/cn1-t0.trace", 128 + 16 + 3);

  auto r = run_tool(tmp, "csp-report", "'" + empty + "'");
  CHECK(r.code != 0);
  CHECK(r.err.find(empty) != std::string::npos);
  CHECK(r.err.find("no *.trace files") != std::string::npos);

  r = run_tool(tmp, "csp-report", "'" + bad + "'");
  CHECK(r.code != 0);
  CHECK(r.err.find(bad + "/cn1-t0.trace") != std::string::npos);
  CHECK(r.err.find("byte offset 144") != std::string::npos);

  r = run_tool(tmp, "csp-report", "'" + tmp.file("missing") + "'");
  CHECK(r.code != 0);
  CHECK(r.err.find("not a directory") != std::string::npos);

  r = run_tool(tmp, "csp-report", "'" + empty + "' --x bogus");
  CHECK(r.code != 0);
}

TEST_CASE("csp-report --png: a plot when matplotlib is there, else a clear message", "[cache][tools]") {
  TempDir tmp;
  const std::string run1 = tmp.file("run1");
  std::filesystem::create_directories(run1);
  write_known_run(run1, "none");
  const char* probe = " -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"matplotlib\") is None)' >/dev/null 2>&1";
  const bool have_matplotlib = std::system((std::string("/usr/bin/python3") + probe).c_str()) == 0 ||
                               std::system((std::string("python3") + probe).c_str()) == 0;
  for (const char* x : {"num_cns", "label"}) {
    const std::string png = tmp.file(std::string("csp-") + x + ".png");
    const auto r = run_tool(tmp, "csp-report", "'" + run1 + "' --png '" + png + "' --x " + x);
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    if (have_matplotlib) {
      CHECK(r.code == 0);
      REQUIRE(std::filesystem::exists(png));
      CHECK(std::filesystem::file_size(png) > 1000);
    } else {
      CHECK(r.code != 0);
      CHECK(r.err.find("matplotlib") != std::string::npos);
    }
  }
  // DMHNSW_PYTHON names the only interpreter to use: one without matplotlib (here: none at all)
  // gives a clear message and no plot.
  const std::string png = tmp.file("none.png"), err = tmp.file("none.err");
  const std::string cmd = "DMHNSW_PYTHON=/nonexistent/python3 '" + dmhnsw::test::kBinDir + "/csp-report' '" + run1 +
                          "' --png '" + png + "' >/dev/null 2>'" + err + "'";
  CHECK(std::system(cmd.c_str()) != 0);
  const std::string msg = slurp(err);
  INFO("stderr: " << msg);
  CHECK(msg.find("matplotlib") != std::string::npos);
  CHECK(msg.find("/nonexistent/python3") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(png));
}
