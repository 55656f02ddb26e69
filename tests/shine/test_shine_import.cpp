// shine-import's hnswlib reader and writer: a file saved by hnswlib 0.6.2 parses; truncated or
// inconsistent files are refused naming the file and an offset; the imported graph, searched
// by shine's Worker on LocalFabric, returns hnswlib's own answers; inserts into it work; with
// --codes every node's code is in its memnode's log and searches on them keep the recall.
//
// <hnswlib/hnswlib.h> defines non-inline functions: this is the only translation unit of
// this test binary that includes it.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <set>

#include "tools/hnswlib_space.hpp"
#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "gaussian.hpp"
#include "compute/shine/codes_log.hpp"
#include "compute/shine/graph.hpp"
#include "compute/shine/import.hpp"

using namespace dmhnsw;
using namespace dmhnsw::shine;
using dmhnsw::testing::gaussian;
using Catch::Contains;

namespace {

struct Fixture {
  const size_t n, d, m = 8;
  std::filesystem::path dir;
  std::string good;
  std::vector<float> base;
  DispatchedSpace space;
  std::unique_ptr<hnswlib::HierarchicalNSW<float>> index;
  explicit Fixture(size_t n_ = 1500, size_t d_ = 16) : n(n_), d(d_), base(gaussian(n, d, 11)), space(Metric::L2, d) {
    char tmpl[] = "/tmp/dmhnsw-import-XXXXXX";
    dir = ::mkdtemp(tmpl);
    good = (dir / "good.hnsw").string();
    index = std::make_unique<hnswlib::HierarchicalNSW<float>>(&space, n, m, 60, 100);
    for (size_t i = 0; i < n; ++i) index->addPoint(&base[i * d], i);
    index->saveIndex(good);
  }
  ~Fixture() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::vector<char> bytes() const {
    std::ifstream in(good, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  /// A copy of the good file, changed by `edit`.
  std::string variant(const std::string& name, const std::function<void(std::vector<char>&)>& edit) const {
    auto b = bytes();
    edit(b);
    std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return p;
  }
};

template <class T>
void put(std::vector<char>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

std::shared_ptr<fabric::LocalCluster> make_cluster(uint16_t nodes, uint64_t bytes) {
  auto c = fabric::LocalCluster::create(nodes, bytes);
  for (uint16_t i = 0; i < nodes; ++i) {
    RegionHeader h = make_region_header(i, bytes);
    std::memcpy(c->region(i), &h, sizeof h);
  }
  c->refresh_headers();
  return c;
}

}  // namespace

TEST_CASE("hnswlib import: a file saved by hnswlib parses with its parameters, levels, labels and links",
          "[shine][import]") {
  Fixture fx;
  HnswlibFile f(fx.good, 16);
  CHECK(f.count() == fx.n);
  CHECK(f.dim() == fx.d);
  CHECK(f.m() == fx.m);
  CHECK(f.ef_construction() == 60);
  CHECK(f.max_level() == fx.index->maxlevel_);
  CHECK(f.entry() == fx.index->enterpoint_node_);
  for (uint32_t i = 0; i < fx.n; ++i) {
    REQUIRE(f.level(i) == static_cast<unsigned>(fx.index->element_levels_[i]));
    REQUIRE(f.label(i) == fx.index->getExternalLabel(i));
    REQUIRE(std::memcmp(f.vector(i), &fx.base[fx.index->getExternalLabel(i) * fx.d], 4 * fx.d) == 0);
    for (unsigned l = 0; l <= f.level(i); ++l) {
      auto* ll = fx.index->get_linklist_at_level(i, static_cast<int>(l));
      REQUIRE(f.list_count(i, l) == fx.index->getListCount(ll));
      for (uint32_t j = 0; j < f.list_count(i, l); ++j) REQUIRE(f.neighbour(i, l, j) == ll[1 + j]);
    }
  }
  CHECK_THROWS_WITH(HnswlibFile(fx.good, 17), Contains(fx.good) && Contains("offset 32") && Contains("dimension 16"));
}

TEST_CASE("hnswlib import: truncated and inconsistent files are refused naming the file and the offset",
          "[shine][import]") {
  Fixture fx;
  const auto good = fx.bytes();
  const size_t per = 4 + 2 * fx.m * 4 + 4 * fx.d + 8;  // size_data_per_element_
  const size_t level0_end = 96 + fx.n * per;
  auto expect = [&](const std::string& name, const std::function<void(std::vector<char>&)>& edit,
                    const std::string& offset, const std::string& what) {
    std::string p = fx.variant(name, edit);
    INFO(name);
    CHECK_THROWS_WITH(HnswlibFile(p), Contains(p + ": byte offset " + offset + (offset.empty() ? "" : ":")) && Contains(what));
  };
  expect("empty", [](auto& b) { b.clear(); }, "0", "truncated");
  expect("header", [](auto& b) { b.resize(50); }, "50", "truncated");
  expect("level0", [&](auto& b) { b.resize(level0_end - 3); }, std::to_string(level0_end - 3), "level-0 block");
  expect("last-byte", [](auto& b) { b.pop_back(); }, "", "truncated");
  expect("extra", [](auto& b) { b.push_back(0); }, std::to_string(good.size()), "bytes follow");
  // Wrong counts: one element more than the file holds; more elements than max_elements_.
  expect("count+1", [&](auto& b) { put<uint64_t>(b, 8, fx.n + 1), put<uint64_t>(b, 16, fx.n + 1); }, "", "");
  expect("count>max", [&](auto& b) { put<uint64_t>(b, 16, fx.n + 1); }, "16", "max_elements_");
  expect("count-1", [&](auto& b) { put<uint64_t>(b, 16, fx.n - 1); }, "", "");
  // maxM0_ other than 2*M: shine's level-0 list has 2M slots.
  expect("maxM0", [&](auto& b) { put<uint64_t>(b, 64, 3 * fx.m); }, "64", "maxM0_ = 2*M_");
  expect("maxM", [&](auto& b) { put<uint64_t>(b, 56, fx.m + 1); }, "56", "maxM_");
  expect("M", [&](auto& b) { put<uint64_t>(b, 72, 0); }, "72", "M_");
  expect("label-offset", [&](auto& b) { put<uint64_t>(b, 32, 4 + 2 * fx.m * 4 + 3); }, "32", "float32");
  expect("size-per-element", [&](auto& b) { put<uint64_t>(b, 24, per + 4); }, "24", "size_data_per_element_");
  expect("mult", [&](auto& b) { put<double>(b, 80, 0.5); }, "80", "mult_");
  expect("maxlevel", [&](auto& b) { put<int32_t>(b, 48, 40); }, "48", "maxlevel_");
  expect("entry", [&](auto& b) { put<uint32_t>(b, 52, fx.n); }, "52", "enterpoint_node_");
  // Element 3's level-0 list: too many links, a neighbour id out of range, a deleted mark.
  const size_t list3 = 96 + 3 * per;
  expect("links>cap", [&](auto& b) { put<uint16_t>(b, list3, static_cast<uint16_t>(2 * fx.m + 1)); },
         std::to_string(list3), "capacity is " + std::to_string(2 * fx.m));
  expect("neighbour", [&](auto& b) { put<uint16_t>(b, list3, 1), put<uint32_t>(b, list3 + 4, fx.n + 7); },
         std::to_string(list3 + 4), "neighbour id " + std::to_string(fx.n + 7));
  expect("flags", [&](auto& b) { b[list3 + 2] = 2; }, std::to_string(list3 + 2), "unknown flags 2");
  // hnswlib's delete mark is kept: the element is imported as a deleted node.
  const std::string marked = fx.variant("deleted", [&](auto& b) { b[list3 + 2] = 1; });
  CHECK(HnswlibFile(marked).deleted(3));
  CHECK(HnswlibFile(marked).deleted_count() == 1);
  CHECK_FALSE(HnswlibFile(marked).deleted(4));
  // The first element's upper-level size: not a whole number of lists.
  expect("upper-size", [&](auto& b) { put<uint32_t>(b, level0_end, 5); }, std::to_string(level0_end), "upper-level");
  // Labels are 64-bit ids, as in hnswlib: one beyond 32 bits is kept as it is.
  const size_t label5 = 96 + 5 * per + per - 8;
  const std::string wide = fx.variant("label", [&](auto& b) { put<uint64_t>(b, label5, (uint64_t{1} << 62) + 5); });
  CHECK(HnswlibFile(wide).label(5) == (uint64_t{1} << 62) + 5);
}

TEST_CASE("hnswlib import: shine's search over the imported graph returns hnswlib's answers and takes inserts",
          "[shine][import]") {
  Fixture fx;
  HnswlibFile f(fx.good);
  auto c = make_cluster(2, 8u << 20);
  ImportOptions o;
  o.progress = false;
  o.chunk_bytes = 64u << 10;  // several WRITEs per memnode, several doorbells
  o.writes_per_doorbell = 3;
  auto r = import_hnswlib(*c, f, o);
  CHECK(r["nodes"] == fx.n);
  CHECK(r["record_writes"].get<uint64_t>() > 6);
  CHECK(r["record_doorbells"].get<uint64_t>() < r["record_writes"].get<uint64_t>());
  CHECK(r["memnode_usage"][0]["nodes"].get<uint64_t>() + r["memnode_usage"][1]["nodes"].get<uint64_t>() == fx.n);
  CHECK(r["memnode_usage"][1]["nodes"].get<uint64_t>() > fx.n / 3);

  auto ep = c->make_endpoint(16u << 20);
  GraphParams p = format_or_attach(*c, *ep, nullptr);
  CHECK(p.dim == fx.d);
  CHECK(p.m == fx.m);
  CHECK(p.ef_construction == 60);
  uint64_t count = 0;
  ep->read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &count, 8);
  CHECK(count == fx.n);
  Graph g(*c, p);
  compute::Scheduler s(*ep);
  Worker w(g, s, 5);
  OpContext ctx;
  auto queries = gaussian(200, fx.d, 12);
  size_t same = 0;
  for (uint32_t ef : {10u, 40u}) {
    fx.index->setEf(ef);
    for (size_t q = 0; q < 200; ++q) {
      auto mine = compute::run_sync(s, w.search(&queries[q * fx.d], 10, ef, ctx));
      auto theirs = fx.index->searchKnn(&queries[q * fx.d], 10);
      std::set<uint32_t> a, b;
      for (auto& x : mine) a.insert(x.label);
      for (; !theirs.empty(); theirs.pop()) b.insert(static_cast<uint32_t>(theirs.top().second));
      same += a == b;
    }
  }
  CHECK(same == 400);  // the same graph, walked by the same algorithm with the same kernel
  CHECK(ctx.search.skipped == 0);

  // Further inserts: new labels, found by their own vectors.
  auto extra = gaussian(20, fx.d, 13);
  for (uint32_t i = 0; i < 20; ++i) compute::run_sync(s, w.insert(&extra[i * fx.d], 100000 + i, ctx));
  for (uint32_t i = 0; i < 20; ++i) {
    auto res = compute::run_sync(s, w.search(&extra[i * fx.d], 1, 32, ctx));
    REQUIRE(res.size() == 1);
    CHECK(res[0].label == 100000 + i);
  }
  ep->read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &count, 8);
  CHECK(count == fx.n + 20);

  // A second import into the same memnodes is refused, naming the memnode and what it holds.
  CHECK_THROWS_WITH(import_hnswlib(*c, f, o), Contains("memnode 0") && Contains("already holds a shine index") &&
                                                  Contains(std::to_string(fx.n + 20) + " nodes"));
}

TEST_CASE("hnswlib import: memnodes too small are refused before anything is written, naming the bytes",
          "[shine][import]") {
  Fixture fx(3000, 128);  // about 2.3 MB of node records
  HnswlibFile f(fx.good);
  auto c = make_cluster(2, 1u << 20);
  ImportOptions o;
  o.progress = false;
  CHECK_THROWS_WITH(import_hnswlib(*c, f, o), Contains("needs") && Contains("bytes") && Contains("memnode 1") &&
                                                  Contains("--region"));
  RegionHeader h;
  std::memcpy(&h, c->region(0), sizeof h);
  CHECK(h.mode == static_cast<uint8_t>(fabric::Mode::None));  // nothing formatted
  // The --region it suggests is enough.
  std::string msg;
  try {
    import_hnswlib(*c, f, o);
  } catch (const std::exception& e) {
    msg = e.what();
  }
  const auto at = msg.find("--region of at least ");
  REQUIRE(at != std::string::npos);
  const uint64_t mib = std::stoull(msg.substr(at + 21));
  auto big = make_cluster(2, mib << 20);
  CHECK(import_hnswlib(*big, f, o)["nodes"] == fx.n);
}

TEST_CASE("hnswlib import: labels go into an id index, hnswlib's deleted elements come in deleted", "[shine][import]") {
  Fixture fx(1200, 16);
  for (size_t i = 0; i < fx.n; i += 7) fx.index->markDelete(i);
  fx.index->saveIndex(fx.good);
  HnswlibFile f(fx.good);
  REQUIRE(f.deleted_count() == (fx.n + 6) / 7);
  auto c = make_cluster(2, 8u << 20);
  ImportOptions o;
  o.progress = false;
  import_hnswlib(*c, f, o);  // id index: twice the live elements
  auto ep = c->make_endpoint(16u << 20);
  GraphParams p = format_or_attach(*c, *ep, nullptr);
  REQUIRE(p.ids.buckets > 0);
  uint64_t deleted = 0;
  ep->read(RemotePtr(0, mode_word_offset(shine_word::kDeleted)), &deleted, 8);
  CHECK(deleted == f.deleted_count());
  Graph g(*c, p);
  compute::Scheduler s(*ep);
  Worker w(g, s, 5);
  OpContext ctx;
  IdIndex ids(p.ids, offsetof(NodeFront, label), s, 3);
  size_t mapped = 0, absent = 0;
  for (size_t i = 0; i < fx.n; ++i) {
    const RemotePtr n = compute::run_sync(s, ids.find(i));
    if (i % 7 == 0) {
      absent += n.is_null();
    } else if (!n.is_null()) {
      NodeFront front{};
      ep->read(n, &front, sizeof front);
      mapped += front.label == i && !NodeHeader::deleted(front.header);
    }
  }
  CHECK(mapped == fx.n - f.deleted_count());
  CHECK(absent == f.deleted_count());
  // Searches never return a deleted element and agree with hnswlib's (which skips them too).
  size_t same = 0, returned_deleted = 0;
  fx.index->setEf(40);
  for (size_t q = 0; q < 100; ++q) {
    const float* v = &fx.base[q * fx.d];
    auto mine = compute::run_sync(s, w.search(v, 10, 40, ctx));
    auto theirs = fx.index->searchKnn(v, 10);
    std::set<uint64_t> a, b;
    for (auto& x : mine) {
      a.insert(x.label);
      returned_deleted += x.label % 7 == 0;
    }
    for (; !theirs.empty(); theirs.pop()) b.insert(theirs.top().second);
    same += a == b;
  }
  CHECK(returned_deleted == 0);
  CHECK(same >= 95);
  // The imported index takes deletes by label, and the id of a deleted element again.
  const bool gone = compute::run_sync(s, w.remove(1, ctx));
  CHECK(gone);
  REQUIRE_NOTHROW(compute::run_sync(s, w.insert(&fx.base[0], 0, ctx)));
  auto res = compute::run_sync(s, w.search(&fx.base[0], 1, 40, ctx));
  REQUIRE(res.size() == 1);
  CHECK(res[0].label == 0);
  // No id index asked for: none.
  auto plain = make_cluster(2, 8u << 20);
  o.id_capacity = 0;
  import_hnswlib(*plain, f, o);
  auto ep2 = plain->make_endpoint(1u << 20);
  CHECK(format_or_attach(*plain, *ep2, nullptr).ids.buckets == 0);
}

namespace {

/// Recall@k of `got` against the exact k nearest live elements of `base` (l2).
double recall_at(const std::vector<float>& base, size_t n, size_t d, const std::vector<bool>& dead, const float* q,
                 const std::vector<Neighbor>& got, size_t k) {
  std::vector<std::pair<float, uint64_t>> all;
  for (size_t i = 0; i < n; ++i) {
    if (dead[i]) continue;
    float s = 0;
    for (size_t j = 0; j < d; ++j) s += (base[i * d + j] - q[j]) * (base[i * d + j] - q[j]);
    all.emplace_back(s, i);
  }
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end());
  std::set<uint64_t> truth;
  for (size_t i = 0; i < k; ++i) truth.insert(all[i].second);
  size_t hit = 0;
  for (const auto& x : got) hit += truth.count(x.label);
  return static_cast<double>(hit) / static_cast<double>(k);
}

}  // namespace

TEST_CASE("hnswlib import --codes: every element's code, deleted ones too, in its record's memnode's log",
          "[shine][import][codes]") {
  Fixture fx(1200, 16);
  std::vector<bool> dead(fx.n);
  for (size_t i = 0; i < fx.n; i += 9) fx.index->markDelete(i), dead[i] = true;
  fx.index->saveIndex(fx.good);
  HnswlibFile f(fx.good);
  ImportOptions o;
  o.progress = false;
  o.chunk_bytes = 16u << 10;  // several WRITEs of log entries per memnode

  // A spec the dimension does not take is refused naming the flag, before anything is formatted.
  auto refused = make_cluster(2, 8u << 20);
  o.codes = compute::parse_codes("pq:5");
  CHECK_THROWS_WITH(import_hnswlib(*refused, f, o), Contains("--codes pq:5") && Contains("dimension 16"));
  RegionHeader h;
  std::memcpy(&h, refused->region(0), sizeof h);
  CHECK(h.mode == static_cast<uint8_t>(fabric::Mode::None));

  auto c = make_cluster(2, 8u << 20);
  o.codes = compute::parse_codes("sq8");
  auto r = import_hnswlib(*c, f, o);
  REQUIRE(r.contains("codes"));
  CHECK(r["codes"]["kind"] == "sq8");
  CHECK(r["codes"]["code_size"] == fx.d);
  CHECK(r["codes"]["train_rows"] == fx.n);
  CHECK(r["codes"]["log_capacity"] == 1200);  // twice the elements over the memnodes
  CHECK(r["codes"]["entries"] == fx.n);
  CHECK(r["codes"]["dropped"] == 0);

  auto ep = c->make_endpoint(16u << 20);
  const GraphParams p = format_or_attach(*c, *ep, nullptr);
  REQUIRE(p.codes);
  CHECK(p.codes->spec().to_string() == "sq8");
  const LocalCodes codes = LocalCodes::load(*ep, p);
  CHECK(codes.size() == fx.n);
  for (uint16_t m = 0; m < 2; ++m) CHECK(codes.entries()[m] == r["memnode_usage"][m]["nodes"].get<uint64_t>());
  // Each entry names a record of its own memnode holding its label, and decodes near its vector.
  size_t checked = 0, deleted = 0;
  std::vector<char> e(p.codes_log.entry_bytes());
  for (uint16_t m = 0; m < 2; ++m) {
    for (uint64_t i = 0; i < codes.entries()[m]; ++i) {
      ep->read(RemotePtr(m, p.codes_log.entry_offset(i)), e.data(), e.size());
      uint64_t raw, label;
      std::memcpy(&raw, e.data(), 8);
      std::memcpy(&label, e.data() + 8, 8);
      REQUIRE(label < fx.n);
      const RemotePtr node = RemotePtr::from_raw(raw);
      CHECK(node.node() == m);
      NodeFront front{};
      ep->read(node, &front, sizeof front);
      CHECK(front.label == label);
      deleted += NodeHeader::deleted(front.header);
      std::vector<float> back(fx.d);
      p.codes->decode(codes.find(node), 1, back.data());
      double err = 0;
      for (size_t j = 0; j < fx.d; ++j)
        err = std::max(err, static_cast<double>(std::fabs(back[j] - fx.base[label * fx.d + j])));
      CHECK(err < 0.05);
      ++checked;
    }
  }
  CHECK(checked == fx.n);
  CHECK(deleted == f.deleted_count());

  // Searches on the codes, the best 20 re-read: the recall of the full vectors' search.
  Graph g(*c, p);
  compute::Scheduler s(*ep);
  Worker w(g, s, 5);
  OpContext full, coded;
  coded.codes = &codes;
  coded.rerank = 20;
  const auto queries = gaussian(200, fx.d, 14);
  double rf = 0, rc = 0;
  for (size_t q = 0; q < 200; ++q) {
    const float* v = &queries[q * fx.d];
    rf += recall_at(fx.base, fx.n, fx.d, dead, v, compute::run_sync(s, w.search(v, 10, 40, full)), 10);
    rc += recall_at(fx.base, fx.n, fx.d, dead, v, compute::run_sync(s, w.search(v, 10, 40, coded)), 10);
  }
  INFO("recall full " << rf / 200 << ", codes " << rc / 200);
  CHECK(rc / 200 >= rf / 200 - 0.01);
  CHECK(coded.search.coded > 0);
  CHECK(coded.search.reranked > 0);

  // PQ, with logs too small for every node: the entries past the capacity are left out (their
  // nodes' vectors are read), the count words still say how many were appended.
  auto small = make_cluster(2, 8u << 20);
  o.codes = compute::parse_codes("pq:4");
  o.codes_capacity = 100;
  auto rs = import_hnswlib(*small, f, o);
  CHECK(rs["codes"]["kind"] == "pq:4");
  CHECK(rs["codes"]["code_size"] == 4);
  CHECK(rs["codes"]["entries"] == 200);
  CHECK(rs["codes"]["dropped"] == fx.n - 200);
  auto ep2 = small->make_endpoint(16u << 20);
  const GraphParams ps = format_or_attach(*small, *ep2, nullptr);
  REQUIRE(ps.codes);
  CHECK(ps.codes_log.capacity == 100);
  CHECK(LocalCodes::load(*ep2, ps).size() == 200);
  uint64_t appended = 0;
  ep2->read(RemotePtr(1, mode_word_offset(shine_word::kCodesLogCount)), &appended, 8);
  CHECK(appended == rs["memnode_usage"][1]["nodes"].get<uint64_t>());
}
