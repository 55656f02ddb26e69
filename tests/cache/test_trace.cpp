// Trace files (writer, validated reader: truncated and corrupted inputs) and the shared-cache
// replay behind the cache segmentation penalty, on hand-made traces with known answers.
#include <catch2/catch.hpp>

#include <time.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/test_util.hpp"
#include "cache/trace.hpp"
#include "cache_test_util.hpp"
#include "common/dataset.hpp"

using namespace dmhnsw;
using namespace dmhnsw::cache;
using namespace dmhnsw::cache::test;
using dmhnsw::test::read_bytes;
using dmhnsw::test::require_format_error;
using dmhnsw::test::TempDir;
using dmhnsw::test::write_bytes;

namespace {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

template <typename T>
void poke(std::vector<unsigned char>& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
}

}  // namespace

TEST_CASE("TraceWriter / read_trace round-trip", "[trace]") {
  TempDir tmp;
  const std::string path = tmp.file("cn1-t2.trace");
  TraceMeta m = meta(1, 3, 2, 96, 123456789, now_ns() - 2'000'000'000, "adaptive", 0.25);
  m.cooling_share = 0.15;
  m.seed = 77;
  const uint64_t n = 10000;  // more than one write buffer
  {
    TraceWriter w(path, m);
    for (uint64_t i = 0; i < n; ++i) w.record(RemotePtr(2, 64 * i), static_cast<unsigned>(i % 5), i % 3 == 0, i >= 100);
    CHECK(w.records() == n);
    w.flush();
    // Written under PATH.tmp until closed: a trace cut short is never read as a whole one.
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK(std::filesystem::file_size(path + ".tmp") == sizeof(TraceFileHeader) + n * sizeof(TraceRecord));
    w.close();
  }
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  const TraceFile tf = read_trace(path);
  CHECK(tf.path == path);
  CHECK(tf.meta.cn_id == 1);
  CHECK(tf.meta.num_cns == 3);
  CHECK(tf.meta.thread == 2);
  CHECK(tf.meta.dim == 96);
  CHECK(tf.meta.capacity_bytes == 123456789);
  CHECK(tf.meta.admit_probability == 0.25);
  CHECK(tf.meta.cooling_share == 0.15);
  CHECK(tf.meta.seed == 77);
  CHECK(tf.meta.start_unix_ns == m.start_unix_ns);
  CHECK(std::string(tf.meta.label) == "adaptive");
  REQUIRE(tf.records.size() == n);
  for (uint64_t i = 0; i < n; ++i) {
    const TraceRecord& r = tf.records[i];
    REQUIRE(r.key == RemotePtr(2, 64 * i).raw());
    REQUIRE(r.level == i % 5);
    REQUIRE(((r.flags & TraceRecord::kHit) != 0) == (i % 3 == 0));
    REQUIRE(((r.flags & TraceRecord::kMeasured) != 0) == (i >= 100));
    if (i > 0) REQUIRE(r.t_us >= tf.records[i - 1].t_us);
  }
  // Started 2 s before the run's start time, well under a minute of work.
  CHECK(tf.records.front().t_us >= 2'000'000);
  CHECK(tf.records.back().t_us < 60'000'000);
}

TEST_CASE("TraceWriter: an empty trace is a valid file, an uncreatable one throws naming the path", "[trace]") {
  TempDir tmp;
  const std::string path = tmp.file("empty.trace");
  { TraceWriter(path, meta(0, 1, 0, 8, 1000, now_ns())).close(); }
  const TraceFile tf = read_trace(path);
  // Destroyed without close() (its run failed): nothing under either name.
  const std::string failed = tmp.file("failed.trace");
  {
    TraceWriter w(failed, meta(0, 1, 0, 8, 1000, now_ns()));
    w.record(RemotePtr(0, 64), 0, true, true);
    w.flush();
  }
  CHECK_FALSE(std::filesystem::exists(failed));
  CHECK_FALSE(std::filesystem::exists(failed + ".tmp"));
  CHECK(tf.records.empty());
  const std::string bad = tmp.file("no-such-dir/x.trace");
  try {
    TraceWriter w(bad, meta(0, 1, 0, 8, 1000, now_ns()));
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find(bad) != std::string::npos);
  }
}

TEST_CASE("read_trace rejects truncated and corrupted files, naming path and offset", "[trace]") {
  TempDir tmp;
  const std::string good = tmp.file("good.trace");
  write_trace_file(good, meta(0, 2, 0, 4, 1000, 1), {rec(1, 0, true), rec(2, 1, true), rec(3, 2, false)});
  const std::vector<unsigned char> bytes = read_bytes(good);
  REQUIRE(bytes.size() == 128 + 3 * 16);
  const std::string path = tmp.file("bad.trace");
  auto with = [&](auto mutate) {
    std::vector<unsigned char> b = bytes;
    mutate(b);
    write_bytes(path, b);
    return [p = path] { read_trace(p); };
  };

  SECTION("truncated record") {
    require_format_error(with([](auto& b) { b.resize(b.size() - 5); }), path, 128 + 2 * 16);
  }
  SECTION("truncated header") {
    require_format_error(with([](auto& b) { b.resize(60); }), path, 60);
    require_format_error(with([](auto& b) { b.resize(3); }), path, 3);
  }
  SECTION("empty file") { require_format_error(with([](auto& b) { b.clear(); }), path, 0); }
  SECTION("bad magic") {
    require_format_error(with([](auto& b) { b[3] = 'X'; }), path, 0);
  }
  SECTION("bad version") {
    require_format_error(with([](auto& b) { poke<uint32_t>(b, 8, 2); }), path, 8);
  }
  SECTION("bad record size") {
    require_format_error(with([](auto& b) { poke<uint32_t>(b, 12, 24); }), path, 12);
  }
  SECTION("cn_id out of range") {
    require_format_error(with([](auto& b) { poke<uint32_t>(b, 16, 2); }), path, 16);
  }
  SECTION("num_cns zero") {
    require_format_error(with([](auto& b) { poke<uint32_t>(b, 20, 0); }), path, 20);
  }
  SECTION("admit probability out of range") {
    require_format_error(with([](auto& b) { poke<double>(b, 16 + 24, 1.5); }), path, 16 + 24);
  }
  SECTION("unknown record flags") {
    require_format_error(with([](auto& b) { b[128 + 16 + 13] = 0x80; }), path, 128 + 16 + 13);
  }
  SECTION("missing file") {
    const std::string missing = tmp.file("missing.trace");
    try {
      read_trace(missing);
      FAIL("no exception");
    } catch (const FormatError& e) {
      CHECK(std::string(e.what()).find(missing) != std::string::npos);
    }
  }
}

TEST_CASE("replay: hand-computed shared hit rate, per-cn CHR and CSP", "[trace][replay]") {
  TempDir tmp;
  std::vector<TraceFile> files;
  for (const std::string& p : write_known_run(tmp.file(""))) files.push_back(read_trace(p));
  const CspResult r = replay(files);
  CHECK(r.num_cns == 2);
  REQUIRE(r.per_cn.size() == 2);
  CHECK(r.per_cn[0].cn_id == 0);
  CHECK(r.per_cn[0].accesses == 5);
  CHECK(r.per_cn[0].hits == 3);
  CHECK(r.per_cn[0].chr() == Approx(0.6));
  CHECK(r.per_cn[0].capacity_bytes == run_capacity());
  CHECK(r.per_cn[1].cn_id == 1);
  CHECK(r.per_cn[1].accesses == 5);
  CHECK(r.per_cn[1].hits == 1);
  CHECK(r.accesses == 10);
  CHECK(r.hits == 4);
  CHECK(r.chr() == Approx(0.4));
  CHECK(r.shared_capacity_bytes == 2 * run_capacity());  // cn0 counted once for its 2 files
  CHECK(r.shared_accesses == 10);
  CHECK(r.shared_hits == 7);
  CHECK(r.chr_max() == Approx(0.7));
  CHECK(r.csp() == Approx(3.0 / 7.0));
}

TEST_CASE("replay: microseconds that wrapped around 2^32 are unwrapped per file", "[trace][replay]") {
  // File A: warm-up access of key 2 at 2^32 + 5 us (stored as 5). File B: measured access of
  // key 2 at 2^32 - 8 us: it comes first, so it misses in the shared cache.
  TempDir tmp;
  const uint64_t cap = 10 * NodeCache::entry_bytes(4);
  write_trace_file(tmp.file("a.trace"), meta(0, 2, 0, 4, cap, kRunStart),
                   {rec(run_key(1), 0xFFFFFFF0u, false), rec(run_key(2), 5, false)});
  write_trace_file(tmp.file("b.trace"), meta(1, 2, 0, 4, cap, kRunStart), {rec(run_key(2), 0xFFFFFFF8u, true)});
  const CspResult r = replay({read_trace(tmp.file("a.trace")), read_trace(tmp.file("b.trace"))});
  CHECK(r.shared_accesses == 1);
  CHECK(r.shared_hits == 0);
}

TEST_CASE("replay: a shared cache too small for the working set, deterministic for a seed", "[trace][replay]") {
  TempDir tmp;
  std::vector<TraceRecord> a, b;
  uint64_t x = 5;
  for (uint32_t t = 0; t < 4000; ++t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t k = 1 + (x >> 33) % 300;
    (t % 2 == 0 ? a : b).push_back(rec(run_key(k), t, t >= 1000, false, static_cast<uint8_t>(k % 7 == 0)));
  }
  const uint64_t cap = 50 * NodeCache::entry_bytes(8);
  write_trace_file(tmp.file("a.trace"), meta(0, 2, 0, 8, cap, kRunStart, "x", 0.3), a);
  write_trace_file(tmp.file("b.trace"), meta(1, 2, 0, 8, cap, kRunStart, "x", 0.3), b);
  const std::vector<TraceFile> files = {read_trace(tmp.file("a.trace")), read_trace(tmp.file("b.trace"))};
  const CspResult r1 = replay(files), r2 = replay(files);
  CHECK(r1.shared_accesses == 3000);
  CHECK(r1.shared_hits > 0);
  CHECK(r1.shared_hits < 3000);
  CHECK(r1.shared_hits == r2.shared_hits);
  CHECK(r1.hits == 0);
  CHECK(r1.csp() == Approx(1.0));
}

TEST_CASE("replay: files of one run must share the cache policy", "[trace][replay]") {
  TempDir tmp;
  write_trace_file(tmp.file("a.trace"), meta(0, 2, 0, 4, 1000, kRunStart), {rec(1, 0, true)});
  write_trace_file(tmp.file("b.trace"), meta(1, 2, 0, 8, 1000, kRunStart), {rec(1, 0, true)});
  const std::vector<TraceFile> files = {read_trace(tmp.file("a.trace")), read_trace(tmp.file("b.trace"))};
  try {
    replay(files);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("dim") != std::string::npos);
    CHECK(msg.find(tmp.file("b.trace")) != std::string::npos);
  }
  CHECK(replay({}).shared_accesses == 0);
}
