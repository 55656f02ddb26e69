// Dataset readers/writers: round trips, malformed inputs, real data.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dataset.hpp"
#include "test_util.hpp"

using namespace dmhnsw;
using dmhnsw::test::Bytes;
using dmhnsw::test::TempDir;

namespace {

template <typename T>
Matrix<T> random_matrix(std::size_t n, std::size_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Matrix<T> m(n, d);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < d; ++j) {
      T* r = m.mutable_row(i);
      if constexpr (std::is_same_v<T, float>)
        r[j] = static_cast<float>(static_cast<std::int64_t>(rng() % 2000001) - 1000000) / 1000.0f;
      else if constexpr (std::is_same_v<T, std::int32_t>)
        r[j] = static_cast<std::int32_t>(rng() % 1000000);
      else if constexpr (std::is_same_v<T, std::int8_t>)
        r[j] = static_cast<std::int8_t>(static_cast<int>(rng() % 256) - 128);
      else
        r[j] = static_cast<T>(rng() % 256);
    }
  return m;
}

template <typename A, typename B>
void require_equal(const Matrix<A>& a, const Matrix<B>& b) {
  REQUIRE(a.n() == b.n());
  REQUIRE(a.d() == b.d());
  for (std::size_t i = 0; i < a.n(); ++i)
    for (std::size_t j = 0; j < a.d(); ++j)
      REQUIRE(static_cast<double>(a.row(i)[j]) == static_cast<double>(b.row(i)[j]));
}

using test::require_format_error;

std::vector<float> row_values(std::size_t d, float base) {
  std::vector<float> v(d);
  for (std::size_t j = 0; j < d; ++j) v[j] = base + static_cast<float>(j);
  return v;
}

/// fvecs with n rows of dimension d built by hand.
Bytes fvecs_bytes(std::size_t n, std::size_t d) {
  Bytes b;
  for (std::size_t i = 0; i < n; ++i)
    b.put(static_cast<std::int32_t>(d)).put_all(row_values(d, static_cast<float>(i)));
  return b;
}

Bytes fbin_bytes(std::uint32_t n, std::uint32_t d) {
  Bytes b;
  b.put(n).put(d);
  for (std::uint32_t i = 0; i < n; ++i) b.put_all(row_values(d, static_cast<float>(i)));
  return b;
}

}  // namespace

TEST_CASE("format detection by extension", "[dataset]") {
  CHECK(format_from_path("a/b.fvecs") == FileFormat::Fvecs);
  CHECK(format_from_path("x.BVECS") == FileFormat::Bvecs);
  CHECK(format_from_path("x.ivecs") == FileFormat::Ivecs);
  CHECK(format_from_path("x.fbin") == FileFormat::Fbin);
  CHECK(format_from_path("x.u8bin") == FileFormat::U8bin);
  CHECK(format_from_path("x.i8bin") == FileFormat::I8bin);
  CHECK(format_from_path("x.ibin") == FileFormat::Ibin);
  for (const char* bad : {"data.txt", "data", "data.fvecs.gz", "dir.fvecs/file"}) {
    try {
      format_from_path(bad);
      FAIL("accepted " << bad);
    } catch (const FormatError& e) {
      CHECK(std::string(e.what()).find(bad) != std::string::npos);
    }
  }
  TempDir tmp;
  CHECK_THROWS_WITH(load_vectors_as_float(tmp.file("v.npy")), Catch::Contains("v.npy"));
  CHECK_THROWS_WITH(load_vectors_as_float(tmp.file("missing.fvecs")),
                    Catch::Contains("missing.fvecs"));
}

TEST_CASE("round trip: float formats", "[dataset]") {
  TempDir tmp;
  for (std::size_t d : {1u, 3u, 16u, 100u}) {
    const FloatMatrix m = random_matrix<float>(37, d, d);
    for (const char* ext : {"fvecs", "fbin"}) {
      const std::string path = tmp.file("m." + std::string(ext));
      write_vectors(path, m);
      const FloatMatrix r = load_vectors_as_float(path);
      require_equal(m, r);
      CHECK(r.is_view());
      const FloatMatrix c = load_vectors_as_float(path, {.allow_view = false});
      CHECK_FALSE(c.is_view());
      CHECK(c.contiguous());
      require_equal(m, c);
      require_equal(m, load_matrix<float>(path));
      const FileShape s = probe(path);
      CHECK(s.n == 37);
      CHECK(s.d == d);
      // prefix
      const FloatMatrix p = load_vectors_as_float(path, {.max_rows = 5});
      REQUIRE(p.n() == 5);
      require_equal(m.copy(5), p);
      CHECK(load_vectors_as_float(path, {.max_rows = 1000}).n() == 37);
    }
  }
}

TEST_CASE("round trip: byte formats", "[dataset]") {
  TempDir tmp;
  const U8Matrix u = random_matrix<std::uint8_t>(50, 19, 1);
  write_bvecs(tmp.file("u.bvecs"), u);
  write_u8bin(tmp.file("u.u8bin"), u);
  for (const char* name : {"u.bvecs", "u.u8bin"}) {
    const std::string path = tmp.file(name);
    require_equal(u, load_matrix<std::uint8_t>(path));
    require_equal(u, load_vectors_as_float(path));
    require_equal(u.copy(7), load_vectors_as_float(path, {.max_rows = 7}));
  }
  const I8Matrix s = random_matrix<std::int8_t>(41, 33, 2);
  write_i8bin(tmp.file("s.i8bin"), s);
  require_equal(s, load_matrix<std::int8_t>(tmp.file("s.i8bin")));
  require_equal(s, load_vectors_as_float(tmp.file("s.i8bin")));

  // float -> integer formats through write_vectors
  FloatMatrix f = load_vectors_as_float(tmp.file("u.bvecs"), {.allow_view = false});
  write_vectors(tmp.file("f.u8bin"), f);
  require_equal(u, load_matrix<std::uint8_t>(tmp.file("f.u8bin")));
  f.mutable_row(3)[4] = 2.5f;
  CHECK_THROWS_AS(write_vectors(tmp.file("g.bvecs"), f), std::invalid_argument);
  f.mutable_row(3)[4] = 256.0f;
  CHECK_THROWS_AS(write_vectors(tmp.file("g.u8bin"), f), std::invalid_argument);
  f.mutable_row(3)[4] = 200.0f;
  CHECK_THROWS_AS(write_vectors(tmp.file("g.i8bin"), f), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(tmp.file("g.bvecs")));
  CHECK_FALSE(std::filesystem::exists(tmp.file("g.u8bin.tmp")));
}

TEST_CASE("round trip: id formats", "[dataset]") {
  TempDir tmp;
  const IdMatrix ids = random_matrix<std::int32_t>(23, 10, 3);
  FloatMatrix dist(23, 10);
  for (std::size_t i = 0; i < 23; ++i)
    for (std::size_t j = 0; j < 10; ++j) dist.mutable_row(i)[j] = static_cast<float>(i * 10 + j);

  write_ivecs(tmp.file("g.ivecs"), ids);
  write_ibin(tmp.file("g.ibin"), ids);
  write_ibin(tmp.file("gd.ibin"), ids, &dist);
  for (const char* name : {"g.ivecs", "g.ibin", "gd.ibin"}) {
    require_equal(ids, load_ids(tmp.file(name)));
    require_equal(ids, load_matrix<std::int32_t>(tmp.file(name)));
    require_equal(ids.copy(4), load_ids(tmp.file(name), {.max_rows = 4}));
  }
  CHECK(std::filesystem::file_size(tmp.file("g.ibin")) == 8 + 23 * 10 * 4);
  CHECK(std::filesystem::file_size(tmp.file("gd.ibin")) == 8 + 2 * 23 * 10 * 4);
  const GroundTruth gt = load_groundtruth(tmp.file("gd.ibin"));
  REQUIRE(gt.distances.has_value());
  require_equal(dist, *gt.distances);
  CHECK(probe(tmp.file("gd.ibin")).has_distances);
  CHECK_FALSE(load_groundtruth(tmp.file("g.ibin")).distances.has_value());
  CHECK_FALSE(load_groundtruth(tmp.file("g.ivecs")).distances.has_value());

  write_ids(tmp.file("w.ibin"), ids, &dist);
  require_equal(dist, *load_groundtruth(tmp.file("w.ibin")).distances);
  CHECK_THROWS_AS(write_ids(tmp.file("w.ivecs"), ids, &dist), std::invalid_argument);
  CHECK_THROWS_AS(write_ids(tmp.file("w.fvecs"), ids), std::invalid_argument);
}

TEST_CASE("writers refuse invalid data", "[dataset]") {
  TempDir tmp;
  FloatMatrix m = random_matrix<float>(4, 4, 9);
  m.mutable_row(1)[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(write_fvecs(tmp.file("a.fvecs"), m), std::invalid_argument);
  CHECK_THROWS_AS(write_fbin(tmp.file("a.fbin"), FloatMatrix()), std::invalid_argument);
  CHECK_THROWS_AS(write_fvecs(tmp.file("a.fbin"), random_matrix<float>(2, 2, 1)),
                  std::invalid_argument);  // extension does not match the writer
  IdMatrix ids(2, 2);
  ids.mutable_row(1)[1] = -1;
  CHECK_THROWS_AS(write_ivecs(tmp.file("a.ivecs"), ids), std::invalid_argument);
  CHECK(std::filesystem::is_empty(std::filesystem::path(tmp.file("a.fvecs")).parent_path()));
  CHECK_THROWS_WITH(write_fvecs(tmp.file("no/such/dir/x.fvecs"), random_matrix<float>(2, 2, 1)),
                    Catch::Contains("no/such/dir/x.fvecs"));
}

TEST_CASE("malformed: truncated files", "[dataset][malformed]") {
  TempDir tmp;
  const std::size_t d = 8, row = 4 + 4 * d;
  SECTION("fvecs with a partial vector at the end") {
    Bytes b = fvecs_bytes(5, d);
    b.raw().resize(b.size() - 3);
    const std::string path = tmp.file("t.fvecs");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 4 * row);
    // a prefix read still refuses a file that is not a whole number of vectors
    require_format_error([&] { load_vectors_as_float(path, {.max_rows = 2}); }, path, 4 * row);
    require_format_error([&] { probe(path); }, path, 4 * row);
  }
  SECTION("bvecs cut inside the dimension header of the last vector") {
    Bytes b;
    for (int i = 0; i < 3; ++i) b.put(std::int32_t{4}).put(std::uint32_t{0x01020304});
    b.put(std::int16_t{4});
    const std::string path = tmp.file("t.bvecs");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 24);
  }
  SECTION("fbin shorter than its header says") {
    Bytes b = fbin_bytes(6, d);
    b.raw().resize(b.size() - 4 * d - 1);
    const std::string path = tmp.file("t.fbin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, b.size());
  }
  SECTION("ibin cut in the ids") {
    Bytes b;
    b.put(std::uint32_t{3}).put(std::uint32_t{2}).put_all(std::vector<std::int32_t>{1, 2, 3, 4, 5});
    const std::string path = tmp.file("t.ibin");
    b.save(path);
    require_format_error([&] { load_ids(path); }, path, b.size());
  }
  SECTION("ibin of a size between ids-only and ids+distances") {
    Bytes b;
    b.put(std::uint32_t{2}).put(std::uint32_t{2}).put_all(std::vector<std::int32_t>{1, 2, 3, 4});
    b.put(1.0f);
    const std::string path = tmp.file("t2.ibin");
    b.save(path);
    require_format_error([&] { load_groundtruth(path); }, path, 8 + 16);
  }
  SECTION("trailing bytes after a u8bin payload") {
    Bytes b;
    b.put(std::uint32_t{2}).put(std::uint32_t{3});
    for (int i = 0; i < 7; ++i) b.put(std::uint8_t{1});
    const std::string path = tmp.file("t.u8bin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 8 + 6);
  }
  SECTION("empty files") {
    for (const char* name : {"e.fvecs", "e.fbin", "e.ibin", "e.bvecs"}) {
      const std::string path = tmp.file(name);
      Bytes().save(path);
      if (format_from_path(path) == FileFormat::Ibin)
        require_format_error([&] { load_ids(path); }, path, 0);
      else
        require_format_error([&] { load_vectors_as_float(path); }, path, 0);
    }
  }
}

TEST_CASE("malformed: header larger than the file", "[dataset][malformed]") {
  TempDir tmp;
  SECTION("bin file smaller than its 8-byte header") {
    Bytes b;
    b.put(std::uint32_t{1}).put(std::uint8_t{4});
    const std::string path = tmp.file("h.fbin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 0);
  }
  SECTION("vecs file smaller than its dimension header") {
    Bytes b;
    b.put(std::uint16_t{4});
    const std::string path = tmp.file("h.fvecs");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 0);
  }
  SECTION("bin header claiming far more vectors than present") {
    Bytes b = fbin_bytes(2, 4);
    b.raw()[0] = 0xff;
    b.raw()[1] = 0xff;  // n = 65535
    const std::string path = tmp.file("big.fbin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, b.size());
  }
  SECTION("n * d at the uint32 limits") {
    Bytes b;
    b.put(std::uint32_t{0xffffffff}).put(std::uint32_t{65536}).put(1.0f);
    const std::string path = tmp.file("huge.fbin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, b.size());
    require_format_error([&] { probe(path); }, path, b.size());
  }
}

TEST_CASE("malformed: zero and impossible counts and dimensions", "[dataset][malformed]") {
  TempDir tmp;
  SECTION("bin n = 0") {
    Bytes b;
    b.put(std::uint32_t{0}).put(std::uint32_t{4});
    const std::string path = tmp.file("z.fbin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 0);
  }
  SECTION("bin d = 0") {
    Bytes b;
    b.put(std::uint32_t{3}).put(std::uint32_t{0});
    const std::string path = tmp.file("z.u8bin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 4);
  }
  SECTION("bin d > 65536") {
    Bytes b;
    b.put(std::uint32_t{1}).put(std::uint32_t{65537});
    const std::string path = tmp.file("z.ibin");
    b.save(path);
    require_format_error([&] { load_ids(path); }, path, 4);
  }
  SECTION("vecs dimension 0, negative, absurd") {
    for (std::int32_t dim : {0, -5, 65537, 1 << 30}) {
      Bytes b;
      b.put(dim).put(1.0f).put(2.0f);
      const std::string path = tmp.file("z" + std::to_string(dim) + ".fvecs");
      b.save(path);
      require_format_error([&] { load_vectors_as_float(path); }, path, 0);
    }
  }
  SECTION("zero max_rows is a caller error") {
    const std::string path = tmp.file("ok.fvecs");
    fvecs_bytes(2, 2).save(path);
    CHECK_THROWS_AS(load_vectors_as_float(path, {.max_rows = 0}), std::invalid_argument);
  }
}

TEST_CASE("malformed: inconsistent per-vector dimension", "[dataset][malformed]") {
  TempDir tmp;
  SECTION("fvecs") {
    const std::size_t d = 6, row = 4 + 4 * d;
    Bytes b = fvecs_bytes(5, d);
    const std::int32_t other = 5;
    std::memcpy(b.raw().data() + 3 * row, &other, 4);
    const std::string path = tmp.file("i.fvecs");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 3 * row);
    // a prefix before the bad vector reads fine (whole-file size still consistent)
    CHECK(load_vectors_as_float(path, {.max_rows = 3}).n() == 3);
  }
  SECTION("ivecs with a shorter vector in the middle") {
    Bytes b;
    b.put(std::int32_t{3}).put_all(std::vector<std::int32_t>{1, 2, 3});
    b.put(std::int32_t{2}).put_all(std::vector<std::int32_t>{4, 5});
    b.put(std::int32_t{3}).put_all(std::vector<std::int32_t>{6, 7, 8});
    const std::string path = tmp.file("i.ivecs");
    b.save(path);
    require_format_error([&] { load_ids(path); }, path, 16);
  }
}

TEST_CASE("malformed: NaN and inf values", "[dataset][malformed]") {
  TempDir tmp;
  const std::size_t d = 7, row = 4 + 4 * d;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SECTION("fvecs") {
    for (float bad : {nan, inf, -inf}) {
      Bytes b = fvecs_bytes(4, d);
      std::memcpy(b.raw().data() + 2 * row + 4 + 5 * 4, &bad, 4);
      const std::string path = tmp.file("n.fvecs");
      b.save(path);
      require_format_error([&] { load_vectors_as_float(path); }, path, 2 * row + 4 + 5 * 4);
      CHECK_THROWS_WITH(load_vectors_as_float(path), Catch::Contains(bad != bad ? "NaN" : "inf"));
      // rows before the bad one can still be read as a prefix
      CHECK(load_vectors_as_float(path, {.max_rows = 2}).n() == 2);
    }
  }
  SECTION("fbin") {
    Bytes b = fbin_bytes(3, d);
    std::memcpy(b.raw().data() + 8 + (1 * d + 6) * 4, &nan, 4);
    const std::string path = tmp.file("n.fbin");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 8 + (1 * d + 6) * 4);
    require_format_error([&] { load_matrix<float>(path); }, path, 8 + (1 * d + 6) * 4);
  }
  SECTION("ibin distances") {
    Bytes b;
    b.put(std::uint32_t{2}).put(std::uint32_t{2}).put_all(std::vector<std::int32_t>{1, 2, 3, 4});
    b.put_all(std::vector<float>{0.5f, 1.0f, inf, 2.0f});
    const std::string path = tmp.file("n.ibin");
    b.save(path);
    require_format_error([&] { load_groundtruth(path); }, path, 8 + 16 + 8);
  }
}

TEST_CASE("malformed: wrong element type", "[dataset][malformed]") {
  TempDir tmp;
  const std::string fv = tmp.file("real.fvecs"), bv = tmp.file("real.bvecs");
  write_fvecs(fv, random_matrix<float>(20, 16, 5));
  write_bvecs(bv, random_matrix<std::uint8_t>(20, 16, 6));

  SECTION("bvecs data named .fvecs") {
    const std::string path = tmp.file("bytes.fvecs");
    std::filesystem::copy_file(bv, path);
    // row of a 16-dim fvecs is 68 bytes; the "header" at 68 lies inside bvecs vector 3
    require_format_error([&] { load_vectors_as_float(path); }, path, 68);
  }
  SECTION("fvecs data named .bvecs") {
    const std::string path = tmp.file("floats.bvecs");
    std::filesystem::copy_file(fv, path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 20);
  }
  SECTION("bvecs whose first dimension is absurd when read as fvecs") {
    Bytes b;
    b.put(1.5f);  // a float where the int32 dimension should be
    for (int i = 0; i < 16; ++i) b.put(std::uint8_t{7});
    const std::string path = tmp.file("f.bvecs");
    b.save(path);
    require_format_error([&] { load_vectors_as_float(path); }, path, 0);
  }
  SECTION("fbin data named .u8bin and u8bin data named .fbin") {
    const std::string f = tmp.file("x.fbin"), u = tmp.file("x.u8bin");
    write_fbin(f, random_matrix<float>(5, 4, 1));
    write_u8bin(u, random_matrix<std::uint8_t>(5, 4, 1));
    const std::string fu = tmp.file("fdata.u8bin"), uf = tmp.file("udata.fbin");
    std::filesystem::copy_file(f, fu);
    std::filesystem::copy_file(u, uf);
    require_format_error([&] { load_vectors_as_float(fu); }, fu, 8 + 20);  // trailing bytes
    require_format_error([&] { load_vectors_as_float(uf); }, uf, 8 + 20);  // file ends early
  }
  SECTION("ids requested from a float file, vectors from an id file") {
    require_format_error([&] { load_ids(fv); }, fv, 0);
    require_format_error([&] { load_groundtruth(fv); }, fv, 0);
    const std::string iv = tmp.file("g.ivecs");
    write_ivecs(iv, random_matrix<std::int32_t>(3, 3, 1));
    require_format_error([&] { load_vectors_as_float(iv); }, iv, 0);
    require_format_error([&] { load_matrix<float>(iv); }, iv, 0);
    require_format_error([&] { load_matrix<std::uint8_t>(fv); }, fv, 0);
  }
  SECTION("float data named .ivecs gives negative ids") {
    Bytes b;
    b.put(std::int32_t{2}).put(1.0f).put(-2.0f);
    const std::string path = tmp.file("neg.ivecs");
    b.save(path);
    require_format_error([&] { load_ids(path); }, path, 8);
  }
}

TEST_CASE("matrix views, copies and moves", "[dataset]") {
  TempDir tmp;
  const FloatMatrix m = random_matrix<float>(10, 5, 4);
  write_fvecs(tmp.file("m.fvecs"), m);
  FloatMatrix v = load_vectors_as_float(tmp.file("m.fvecs"));
  REQUIRE(v.is_view());
  CHECK_FALSE(v.contiguous());  // the per-vector header sits between rows
  CHECK(v.stride() == 6);
  CHECK_THROWS_AS(v.data(), std::logic_error);
  CHECK_THROWS_AS(v.mutable_row(0), std::logic_error);
  FloatMatrix moved = std::move(v);
  require_equal(m, moved);
  FloatMatrix copied = moved;  // views share the mapping
  require_equal(m, copied);
  FloatMatrix owned = m;  // owned copies own their own storage
  owned.mutable_row(0)[0] += 1.0f;
  CHECK(owned.row(0)[0] != m.row(0)[0]);
  FloatMatrix assigned;
  assigned = owned;
  CHECK(assigned.row(0)[0] == owned.row(0)[0]);
  CHECK(assigned.row(0) != owned.row(0));
  CHECK_THROWS_AS(FloatMatrix(2, 2, std::vector<float>(3)), std::invalid_argument);
}

// ---- real data ----

TEST_CASE("real data: bigann10k", "[dataset][real]") {
  const std::string dir = test::kSharedData + "/bigann10k/";
  const FloatMatrix base = load_vectors_as_float(dir + "bigann10k_base.bvecs");
  CHECK(base.n() == 10000);
  CHECK(base.d() == 128);
  const U8Matrix base_u8 = load_matrix<std::uint8_t>(dir + "bigann10k_base.bvecs");
  REQUIRE(base_u8.n() == 10000);
  for (std::size_t i = 0; i < base.n(); i += 997)
    for (std::size_t j = 0; j < 128; ++j) REQUIRE(base.row(i)[j] == base_u8.row(i)[j]);

  const FloatMatrix q = load_vectors_as_float(dir + "bigann10k_query.fvecs");
  CHECK(q.n() == 100);
  CHECK(q.d() == 128);
  for (std::size_t i = 0; i < q.n(); ++i)
    for (std::size_t j = 0; j < q.d(); ++j) {
      const float v = q.row(i)[j];
      REQUIRE((v >= 0 && v <= 255 && std::nearbyint(v) == v));
    }
  const IdMatrix gt = load_ids(dir + "bigann10k_groundtruth.ivecs");
  CHECK(gt.n() == 100);
  CHECK(gt.d() == 100);
  for (std::size_t i = 0; i < gt.n(); ++i)
    for (std::size_t j = 0; j < gt.d(); ++j) REQUIRE(gt.row(i)[j] < 10000);
  const FileShape s = probe(dir + "bigann10k_base.bvecs");
  CHECK(s.format == FileFormat::Bvecs);
  CHECK(s.n == 10000);
}

TEST_CASE("real data: wordnet-minilm-384", "[dataset][real]") {
  const std::string dir = test::kSharedData + "/wordnet-minilm-384/";
  const FloatMatrix base = load_vectors_as_float(dir + "base.fvecs");
  CHECK(base.n() == 50000);
  CHECK(base.d() == 384);
  for (std::size_t i = 0; i < base.n(); i += 4999) {
    double norm = 0;
    for (float v : base[i]) norm += static_cast<double>(v) * v;
    CHECK(std::sqrt(norm) == Approx(1.0).epsilon(1e-3));
  }
  const FloatMatrix q = load_vectors_as_float(dir + "query.fvecs");
  CHECK(q.n() == 1000);
  CHECK(q.d() == 384);
  const IdMatrix gt = load_ids(dir + "groundtruth.ivecs");
  CHECK(gt.n() == 1000);
  CHECK(gt.d() == 100);
  const FloatMatrix head = load_vectors_as_float(dir + "base.fvecs", {.max_rows = 10});
  REQUIRE(head.n() == 10);
  for (std::size_t j = 0; j < 384; ++j) REQUIRE(head.row(9)[j] == base.row(9)[j]);
}
