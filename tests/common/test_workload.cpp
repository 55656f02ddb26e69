// Workload generation (uniform, zipf, hot-clusters) and the workload file format.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/workload.hpp"
#include "test_util.hpp"

using namespace dmhnsw;
using dmhnsw::test::TempDir;

namespace {

/// `blobs` well separated Gaussian blobs of `per_blob` points each, in d dims; blob of row i is
/// i / per_blob.
FloatMatrix make_blobs(std::size_t blobs, std::size_t per_blob, std::size_t d, std::uint64_t seed) {
  Rng rng(seed);
  FloatMatrix m(blobs * per_blob, d);
  for (std::size_t b = 0; b < blobs; ++b) {
    std::vector<double> centre(d);
    for (double& c : centre) c = 100.0 * rng.normal();
    for (std::size_t i = 0; i < per_blob; ++i) {
      float* row = m.mutable_row(b * per_blob + i);
      for (std::size_t j = 0; j < d; ++j) row[j] = static_cast<float>(centre[j] + rng.normal());
    }
  }
  return m;
}

/// Fake ground truth: row i holds i, i+1, ... (k ids).
IdMatrix fake_gt(std::size_t n, std::size_t k) {
  IdMatrix gt(n, k);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < k; ++j) gt.mutable_row(i)[j] = static_cast<std::int32_t>(i + j);
  return gt;
}

WorkloadSpec spec_of(const std::string& dist, std::uint64_t count, std::uint64_t warmup,
                     std::uint64_t seed) {
  WorkloadSpec s;
  s.distribution = Distribution::parse(dist);
  s.count = count;
  s.warmup = warmup;
  s.seed = seed;
  return s;
}

using test::require_format_error;

}  // namespace

TEST_CASE("distribution parsing", "[workload]") {
  CHECK(Distribution::parse("uniform").kind == Distribution::Kind::Uniform);
  const Distribution z = Distribution::parse("zipf:1.25");
  CHECK(z.kind == Distribution::Kind::Zipf);
  CHECK(z.s == 1.25);
  CHECK(z.to_string() == "zipf:1.25");
  const Distribution h = Distribution::parse("hot-clusters:1");
  CHECK(h.kind == Distribution::Kind::HotClusters);
  CHECK(h.to_string() == "hot-clusters:1");
  CHECK(Distribution::parse(h.to_string()).s == 1.0);
  for (const char* bad : {"", "Uniform", "zipf", "zipf:", "zipf:abc", "zipf:-1", "zipf:nan",
                          "zipf:1x", "zipf:1000", "hot-clusters", "gauss:1"}) {
    INFO(bad);
    CHECK_THROWS_AS(Distribution::parse(bad), std::invalid_argument);
  }
}

TEST_CASE("random numbers are pinned and in range", "[workload]") {
  // std::mt19937_64 is specified by the standard; our derived numbers must not depend on the
  // standard library, so pin a few.
  Rng a(12345);
  std::vector<std::uint64_t> first;
  for (int i = 0; i < 5; ++i) first.push_back(a.uniform(1000));
  Rng b(12345);
  for (int i = 0; i < 5; ++i) CHECK(b.uniform(1000) == first[i]);
  std::mt19937_64 ref(12345);
  Rng c(12345);
  CHECK(c.next() == ref());

  Rng r(1);
  std::vector<int> hist(10, 0);
  for (int i = 0; i < 100000; ++i) {
    const auto x = r.uniform(10);
    REQUIRE(x < 10);
    ++hist[x];
  }
  for (int h : hist) CHECK(std::abs(h - 10000) < 500);
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; ++i) {
    const double x = r.normal();
    sum += x;
    sq += x * x;
  }
  CHECK(std::abs(sum / 100000) < 0.02);
  CHECK(std::abs(sq / 100000 - 1.0) < 0.03);

  Rng p(3);
  auto perm = random_permutation(1000, p);
  std::sort(perm.begin(), perm.end());
  for (std::uint32_t i = 0; i < 1000; ++i) REQUIRE(perm[i] == i);

  const ZipfSampler zipf(100, 1.0);
  std::vector<int> zh(100, 0);
  for (int i = 0; i < 100000; ++i) ++zh[zipf(r)];
  CHECK(zh[0] > zh[1]);
  CHECK(zh[1] > zh[9]);
  // P(rank 0) = 1 / H(100) ~ 0.193
  CHECK(std::abs(zh[0] / 100000.0 - 0.1928) < 0.01);
}

TEST_CASE("workload is deterministic by seed", "[workload]") {
  const FloatMatrix pool = make_blobs(10, 30, 8, 1);
  const IdMatrix gt = fake_gt(pool.n(), 5);
  for (const char* dist : {"uniform", "zipf:1", "hot-clusters:1"}) {
    INFO(dist);
    const Workload a = generate_workload(pool, gt, spec_of(dist, 500, 100, 7));
    const Workload b = generate_workload(pool, gt, spec_of(dist, 500, 100, 7));
    const Workload c = generate_workload(pool, gt, spec_of(dist, 500, 100, 8));
    CHECK(a.pool_index == b.pool_index);
    CHECK(a.pool_index != c.pool_index);
    REQUIRE(a.total() == 600);
    REQUIRE(a.queries.n() == 600);
    for (std::size_t i = 0; i < a.total(); ++i) {
      const std::uint32_t p = a.pool_index[i];
      REQUIRE(p < pool.n());
      REQUIRE(std::equal(pool.row(p), pool.row(p) + 8, a.queries.row(i)));
      REQUIRE(std::equal(gt.row(p), gt.row(p) + 5, a.groundtruth.row(i)));
    }
    CHECK(a.distribution == dist);
    CHECK(a.is_warmup(99));
    CHECK_FALSE(a.is_warmup(100));
  }
  // the warm-up is a prefix of the same stream: more warm-up shifts, does not reshuffle
  const auto s1 = generate_stream(pool, spec_of("zipf:1", 100, 0, 3));
  const auto s2 = generate_stream(pool, spec_of("zipf:1", 50, 50, 3));
  CHECK(s1 == s2);
}

TEST_CASE("zipf skew: the top 1% takes a large share", "[workload]") {
  const FloatMatrix pool = make_blobs(20, 50, 4, 2);  // 1000 queries
  const IdMatrix gt = fake_gt(pool.n(), 1);
  const auto uniform = summarize(generate_workload(pool, gt, spec_of("uniform", 50000, 0, 1)));
  const auto z05 = summarize(generate_workload(pool, gt, spec_of("zipf:0.5", 50000, 0, 1)));
  const auto z1 = summarize(generate_workload(pool, gt, spec_of("zipf:1", 50000, 0, 1)));
  const auto z15 = summarize(generate_workload(pool, gt, spec_of("zipf:1.5", 50000, 0, 1)));
  CHECK(uniform.top_count == 10);
  CHECK(uniform.queries == 50000);
  CHECK(uniform.top1pct_share < 0.03);
  CHECK(uniform.distinct > 990);
  // Zipf(1) over 1000: H(10)/H(1000) ~ 0.39
  CHECK(z1.top1pct_share == Approx(0.39).margin(0.03));
  CHECK(z1.top1pct_share > 10 * uniform.top1pct_share);
  CHECK(z05.top1pct_share < z1.top1pct_share);
  CHECK(z1.top1pct_share < z15.top1pct_share);
  CHECK(z15.distinct < z1.distinct);
  // the hottest queries are a random permutation of the pool, not rows 0, 1, 2, ...
  const auto stream = generate_stream(pool, spec_of("zipf:2", 1000, 0, 5));
  std::map<std::uint32_t, int> freq;
  for (auto q : stream) ++freq[q];
  const auto hottest = std::max_element(freq.begin(), freq.end(),
                                        [](auto& x, auto& y) { return x.second < y.second; });
  const auto other = generate_stream(pool, spec_of("zipf:2", 1000, 0, 6));
  std::map<std::uint32_t, int> freq2;
  for (auto q : other) ++freq2[q];
  const auto hottest2 = std::max_element(freq2.begin(), freq2.end(),
                                         [](auto& x, auto& y) { return x.second < y.second; });
  CHECK(hottest->first != hottest2->first);
}

TEST_CASE("hot-clusters concentrates the stream on a few clusters", "[workload]") {
  const std::size_t blobs = 20, per = 50;
  const FloatMatrix pool = make_blobs(blobs, per, 8, 3);
  const IdMatrix gt = fake_gt(pool.n(), 3);
  WorkloadSpec spec = spec_of("hot-clusters:1.5", 20000, 1000, 11);
  spec.clusters = blobs;
  const Workload w = generate_workload(pool, gt, spec);
  CHECK(w.clusters == blobs);
  std::vector<int> per_blob(blobs, 0);
  for (auto q : w.pool_index) ++per_blob[q / per];
  std::sort(per_blob.rbegin(), per_blob.rend());
  // Zipf(1.5) over 20 clusters: the hottest 5 clusters take ~80% of the stream. k-means may
  // merge or split blobs (random initialisation), so measure on blobs with some slack.
  const double top5 = (per_blob[0] + per_blob[1] + per_blob[2] + per_blob[3] + per_blob[4]) / 21000.0;
  CHECK(top5 > 0.6);
  CHECK(per_blob[0] / 21000.0 > 0.12);
  CHECK(per_blob[19] < per_blob[0] / 10);
  // uniform inside the cluster: the hottest cluster's members all appear
  std::set<std::uint32_t> distinct(w.pool_index.begin(), w.pool_index.end());
  const auto st = summarize(w);
  CHECK(st.distinct == distinct.size());
  CHECK(st.distinct > 2 * per);

  WorkloadSpec uni = spec_of("uniform", 20000, 1000, 11);
  const Workload u = generate_workload(pool, gt, uni);
  std::vector<int> per_blob_u(blobs, 0);
  for (auto q : u.pool_index) ++per_blob_u[q / per];
  std::sort(per_blob_u.rbegin(), per_blob_u.rend());
  CHECK(per_blob_u[0] / 21000.0 < 0.07);
  CHECK((per_blob_u[0] + per_blob_u[1] + per_blob_u[2] + per_blob_u[3] + per_blob_u[4]) / 21000.0 < 0.3);

  // automatic cluster count
  const Workload a = generate_workload(pool, gt, spec_of("hot-clusters:1", 100, 0, 1));
  CHECK(a.clusters >= 1);
  CHECK(a.clusters <= 32);
}

TEST_CASE("generation rejects inconsistent inputs", "[workload]") {
  const FloatMatrix pool = make_blobs(2, 10, 4, 1);
  CHECK_THROWS_AS(generate_workload(pool, fake_gt(19, 2), spec_of("uniform", 10, 0, 1)),
                  std::invalid_argument);
  CHECK_THROWS_AS(generate_workload(pool, fake_gt(20, 2), spec_of("uniform", 0, 10, 1)),
                  std::invalid_argument);
  WorkloadSpec s = spec_of("uniform", 10, 0, 1);
  s.gt_k = 3;
  CHECK_THROWS_AS(generate_workload(pool, fake_gt(20, 2), s), std::invalid_argument);
  s = spec_of("hot-clusters:1", 10, 0, 1);
  s.clusters = 21;
  CHECK_THROWS_AS(generate_workload(pool, fake_gt(20, 2), s), std::invalid_argument);
  CHECK_THROWS_AS(generate_workload(FloatMatrix(), IdMatrix(), spec_of("uniform", 10, 0, 1)),
                  std::invalid_argument);
  s = spec_of("uniform", 10, 0, 1);
  s.gt_k = 1;
  CHECK(generate_workload(pool, fake_gt(20, 2), s).k() == 1);
}

TEST_CASE("workload file round trip", "[workload]") {
  TempDir tmp;
  const FloatMatrix pool = make_blobs(5, 20, 13, 4);
  const IdMatrix gt = fake_gt(pool.n(), 7);
  for (const char* dist : {"uniform", "zipf:1.25", "hot-clusters:0.75"}) {
    const Workload w = generate_workload(pool, gt, spec_of(dist, 333, 77, 99));
    const std::string path = tmp.file("w.dmw");
    write_workload(path, w);
    for (bool view : {true, false}) {
      const Workload r = read_workload(path, view);
      CHECK(r.queries.is_view() == view);
      CHECK(r.distribution == w.distribution);
      CHECK(r.seed == 99);
      CHECK(r.warmup_count == 77);
      CHECK(r.measured_count == 333);
      CHECK(r.pool_size == 100);
      CHECK(r.clusters == w.clusters);
      CHECK(r.pool_index == w.pool_index);
      REQUIRE(r.dim() == 13);
      REQUIRE(r.k() == 7);
      for (std::size_t i = 0; i < r.total(); ++i) {
        REQUIRE(std::equal(w.queries.row(i), w.queries.row(i) + 13, r.queries.row(i)));
        REQUIRE(std::equal(w.groundtruth.row(i), w.groundtruth.row(i) + 7, r.groundtruth.row(i)));
      }
      const auto a = summarize(w), b = summarize(r);
      CHECK(a.distinct == b.distinct);
      CHECK(a.top1pct_share == b.top1pct_share);
    }
  }
  WorkloadHeader h;
  const auto bytes = test::read_bytes(tmp.file("w.dmw"));
  std::memcpy(&h, bytes.data(), sizeof h);
  CHECK(std::memcmp(h.magic, kWorkloadMagic.data(), 8) == 0);
  CHECK(h.version == kWorkloadVersion);
  CHECK(h.file_size == bytes.size());
  CHECK(h.vectors_offset % 64 == 0);
  CHECK(h.groundtruth_offset % 64 == 0);
  CHECK(std::string(h.distribution) == "hot-clusters:0.75");
}

TEST_CASE("corrupted workload files are refused", "[workload][malformed]") {
  TempDir tmp;
  const FloatMatrix pool = make_blobs(2, 10, 4, 5);
  const Workload w = generate_workload(pool, fake_gt(20, 3), spec_of("zipf:1", 50, 10, 1));
  const std::string good = tmp.file("good.dmw");
  write_workload(good, w);
  const auto bytes = test::read_bytes(good);
  WorkloadHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  const std::string path = tmp.file("bad.dmw");

  auto patched = [&](std::size_t offset, const void* value, std::size_t n) {
    auto b = bytes;
    std::memcpy(b.data() + offset, value, n);
    test::write_bytes(path, b);
  };
  SECTION("bad magic") {
    patched(0, "NOTAWLD!", 8);
    require_format_error([&] { read_workload(path); }, path, 0);
  }
  SECTION("unsupported version") {
    const std::uint32_t v = 2;
    patched(offsetof(WorkloadHeader, version), &v, 4);
    require_format_error([&] { read_workload(path); }, path, 8);
    CHECK_THROWS_WITH(read_workload(path), Catch::Contains("version 2"));
  }
  SECTION("impossible dimension") {
    const std::uint32_t d = 0;
    patched(offsetof(WorkloadHeader, dim), &d, 4);
    require_format_error([&] { read_workload(path); }, path, 32);
  }
  SECTION("counts that do not match the layout") {
    const std::uint64_t m = h.measured_count + 1;
    patched(offsetof(WorkloadHeader, measured_count), &m, 8);
    CHECK_THROWS_AS(read_workload(path), FormatError);
    const std::uint64_t huge = ~std::uint64_t{0};
    patched(offsetof(WorkloadHeader, warmup_count), &huge, 8);
    require_format_error([&] { read_workload(path); }, path, 16);
  }
  SECTION("truncated") {
    auto b = bytes;
    b.resize(b.size() - 1);
    test::write_bytes(path, b);
    require_format_error([&] { read_workload(path); }, path, b.size());
    b.resize(100);
    test::write_bytes(path, b);
    require_format_error([&] { read_workload(path); }, path, 0);
  }
  SECTION("trailing bytes") {
    auto b = bytes;
    b.push_back(0);
    test::write_bytes(path, b);
    require_format_error([&] { read_workload(path); }, path, bytes.size());
  }
  SECTION("flipped bit in the payload fails the checksum") {
    for (std::uint64_t off : {h.index_offset + 5, h.vectors_offset + 17, h.groundtruth_offset,
                              std::uint64_t{offsetof(WorkloadHeader, seed)}}) {
      auto b = bytes;
      b[off] ^= 0x10;
      test::write_bytes(path, b);
      require_format_error([&] { read_workload(path); }, path, offsetof(WorkloadHeader, checksum));
    }
  }
  SECTION("unterminated or unknown distribution") {
    char junk[64];
    std::memset(junk, 'x', sizeof junk);
    patched(offsetof(WorkloadHeader, distribution), junk, sizeof junk);
    require_format_error([&] { read_workload(path); }, path, 96);
    patched(offsetof(WorkloadHeader, distribution), "pareto:1", 9);
    require_format_error([&] { read_workload(path); }, path, 96);
  }
  SECTION("reserved fields not zero") {
    const std::uint32_t one32 = 1;
    patched(offsetof(WorkloadHeader, reserved32), &one32, 4);
    require_format_error([&] { read_workload(path); }, path, 164);
    const std::uint64_t one = 1;
    patched(offsetof(WorkloadHeader, reserved) + 8 * 10, &one, 8);
    require_format_error([&] { read_workload(path); }, path, 168 + 80);
    CHECK_THROWS_WITH(read_workload(path), Catch::Contains("reserved"));
  }
  SECTION("not a file at all") {
    CHECK_THROWS_WITH(read_workload(tmp.file("missing.dmw")), Catch::Contains("missing.dmw"));
  }
}

TEST_CASE("workload from real data: bigann10k queries", "[workload][real]") {
  const std::string dir = test::kSharedData + "/bigann10k/";
  const FloatMatrix pool = load_vectors_as_float(dir + "bigann10k_query.fvecs");
  const IdMatrix gt = load_ids(dir + "bigann10k_groundtruth.ivecs");
  WorkloadSpec s = spec_of("hot-clusters:1", 2000, 500, 42);
  s.clusters = 8;
  s.gt_k = 10;
  const Workload w = generate_workload(pool, gt, s);
  CHECK(w.k() == 10);
  CHECK(w.dim() == 128);
  CHECK(w.clusters <= 8);
  TempDir tmp;
  write_workload(tmp.file("b.dmw"), w);
  const Workload r = read_workload(tmp.file("b.dmw"));
  CHECK(r.pool_index == w.pool_index);
}
