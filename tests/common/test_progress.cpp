// common/progress.hpp: the plain (non-terminal) lines, the final line, DMHNSW_PROGRESS=0,
// DMHNSW_PROGRESS_SECONDS, the terminal redraw, and exact counts from several threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/progress.hpp"
#include "test_util.hpp"

using namespace dmhnsw;
using dmhnsw::test::TempDir;
using namespace std::chrono_literals;

namespace {

/// A file the Progress writes to (stdio) while the test reads it back by path.
struct Capture {
  TempDir tmp;
  std::string path = tmp.file("progress.txt");
  std::FILE* f = std::fopen(path.c_str(), "w");
  ~Capture() {
    if (f != nullptr) std::fclose(f);
  }
  std::string text() const { return test::slurp(path); }
};

ProgressOptions plain(std::FILE* f, std::chrono::milliseconds period) {
  ProgressOptions o;
  o.out = f;
  o.terminal = false;
  o.period = period;
  return o;
}

/// Waits (at most 20 s: sanitized builds on a busy host) until `c` holds `needle`.
bool wait_text(const Capture& c, const std::string& needle) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (c.text().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

size_t count_lines(const std::string& t) { return static_cast<size_t>(std::count(t.begin(), t.end(), '\n')); }

std::vector<std::string> lines_of(const std::string& t) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t nl; (nl = t.find('\n', at)) != std::string::npos; at = nl + 1) out.push_back(t.substr(at, nl - at));
  return out;
}

/// Sets an environment variable for one scope (the tests of this file run one at a time).
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("progress: plain lines every period with done/total, percent and rate, then the final line",
          "[progress]") {
  Capture c;
  REQUIRE(c.f != nullptr);
  {
    Progress p("inserting", 1000, "vectors", plain(c.f, 20ms));
    CHECK(p.enabled());
    CHECK_FALSE(p.terminal());
    p.add(250);
    REQUIRE(wait_text(c, "inserting: 250/1000 vectors (25.0%), "));
    p.add(250);
    REQUIRE(wait_text(c, "inserting: 500/1000 vectors (50.0%), "));
    // One period after another, also while nothing changes.
    const size_t before = count_lines(c.text());
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (count_lines(c.text()) < before + 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    CHECK(count_lines(c.text()) >= before + 2);
    p.add(500);
    p.finish();
    p.finish();  // idempotent: one final line
  }
  const std::string t = c.text();
  INFO(t);
  CHECK(t.find('\r') == std::string::npos);
  const auto lines = lines_of(t);
  REQUIRE(lines.size() >= 5);
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK(lines[i].find("inserting: ") == 0);
    CHECK(lines[i].find("/1000 vectors (") != std::string::npos);
    CHECK(lines[i].find(" vectors/s, ") != std::string::npos);
    CHECK(lines[i].find(" elapsed, ETA ") != std::string::npos);
  }
  // The last line: the whole amount, the time and the mean rate; no ETA.
  CHECK(lines.back().find("inserting: 1000 vectors in ") == 0);
  CHECK(lines.back().find(" vectors/s)") != std::string::npos);
  CHECK(lines.back().find("ETA") == std::string::npos);
}

TEST_CASE("progress: a short job prints only its final line, an unfinished one nothing", "[progress]") {
  Capture c;
  {
    Progress p("groundtruth", 40, "queries", plain(c.f, 1h));
    p.add(40);
    p.finish();
    Progress q("stopped", 10, "rows", plain(c.f, 1h));
    q.add(3);  // destroyed without finish(): an error path
  }
  const auto lines = lines_of(c.text());
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("groundtruth: 40 queries in ") == 0);
}

TEST_CASE("progress: the final line of work that stopped short says of how much", "[progress]") {
  Capture c;
  {
    Progress p("build", 100, "vectors", plain(c.f, 1h));
    p.add(60);
    p.finish();
  }
  CHECK(c.text().find("build: 60 of 100 vectors in ") == 0);
}

TEST_CASE("progress: DMHNSW_PROGRESS=0 and enabled = false print nothing but still count", "[progress]") {
  Capture c;
  {
    ScopedEnv off("DMHNSW_PROGRESS", "0");
    Progress p("silent", 10, "items", plain(c.f, 5ms));
    CHECK_FALSE(p.enabled());
    p.add(7);
    std::this_thread::sleep_for(50ms);
    p.finish();
    CHECK(p.done() == 7);
  }
  {
    ProgressOptions o = plain(c.f, 5ms);
    o.enabled = false;
    Progress p("off", 10, "items", o);
    p.add(3);
    std::this_thread::sleep_for(50ms);
    p.finish();
    CHECK(p.done() == 3);
  }
  std::fflush(c.f);
  CHECK(c.text().empty());
}

TEST_CASE("progress: DMHNSW_PROGRESS_SECONDS sets the period of the plain lines", "[progress]") {
  ProgressOptions o;
  o.out = stderr;
  o.terminal = false;
  {
    ScopedEnv env("DMHNSW_PROGRESS_SECONDS", "0.25");
    Progress p("x", 1, "items", o);
    CHECK(p.period() == 250ms);
  }
  {
    Progress p("x", 1, "items", o);
    CHECK(p.period() == 10s);  // the default
  }
  {
    ScopedEnv env("DMHNSW_PROGRESS_SECONDS", "soon");
    Progress p("x", 1, "items", o);
    CHECK(p.period() == 10s);  // unreadable: the default, with a word on stderr
  }
}

TEST_CASE("progress: on a terminal one line is redrawn in place and the final line ends it", "[progress]") {
  Capture c;
  {
    ProgressOptions o;
    o.out = c.f;
    o.terminal = true;
    o.period = 10ms;
    Progress p("building", 200, "vectors", o);
    p.add(100);
    CHECK(wait_text(c, "100/200 50.0%"));
    p.add(100);
    p.finish();
  }
  const std::string t = c.text();
  INFO(t);
  CHECK(t.find("\rbuilding [") == 0);
  CHECK(t.find("\rbuilding: 200 vectors in ") != std::string::npos);
  CHECK(count_lines(t) == 1);  // only the final line ends a line
  CHECK(t.back() == '\n');
}

TEST_CASE("progress: add() from several threads counts exactly", "[progress]") {
  Capture c;
  constexpr int kThreads = 8, kEach = 100000;
  {
    Progress p("parallel", uint64_t{kThreads} * kEach, "items", plain(c.f, 1ms));
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&] {
        for (int i = 0; i < kEach; ++i) p.add();
      });
    for (auto& t : ts) t.join();
    CHECK(p.done() == uint64_t{kThreads} * kEach);
    p.finish();
  }
  const auto lines = lines_of(c.text());
  REQUIRE_FALSE(lines.empty());
  CHECK(lines.back().find("parallel: 800000 items in ") == 0);
}

TEST_CASE("progress: counts and durations are short", "[progress]") {
  CHECK(format_count(0) == "0");
  CHECK(format_count(2.5) == "2.5");
  CHECK(format_count(950) == "950");
  CHECK(format_count(12345) == "12.3k");
  CHECK(format_count(2.5e6) == "2.50M");
  CHECK(format_duration(4.24) == "4.2s");
  CHECK(format_duration(188) == "3:08");
  CHECK(format_duration(3723) == "1:02:03");
}
