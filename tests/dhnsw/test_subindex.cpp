// Sub-HNSW (de)serialization (compute/dhnsw/subindex.hpp) and the index build
// (compute/dhnsw/build.hpp): a Faiss IndexHNSWFlat written into a region per the layout, read
// back with a LocalFabric READ of its fetch range, searched with identical results; corrupted
// and truncated buffers refused naming the array and the byte; overflow records applied; the
// meta-HNSW round trip; a whole build validated and searched; the search in a sub-HNSW
// (compute/dhnsw/sub_search.hpp) in place and on a copy, against brute force and Faiss.
#include <catch2/catch.hpp>

#include <faiss/IndexFlatCodes.h>
#include <faiss/IndexHNSW.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../common/test_util.hpp"
#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "compute/codes.hpp"
#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/sub_search.hpp"
#include "compute/dhnsw/subindex.hpp"
#include "memory/image.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;
using Catch::Contains;
using idx_t = faiss::Index::idx_t;

namespace {

constexpr uint32_t kDim = 16;

std::vector<float> random_vectors(size_t n, uint32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n * dim);
  for (float& x : v) x = u(rng);
  return v;
}

struct Source {
  std::vector<float> data;
  std::unique_ptr<faiss::IndexHNSWFlat> index;
  std::vector<int64_t> labels;
};

Source make_source(size_t n, int m, uint64_t seed, int64_t label_base,
                   faiss::MetricType metric = faiss::METRIC_L2) {
  Source s;
  s.data = random_vectors(n, kDim, seed);
  s.index = std::make_unique<faiss::IndexHNSWFlat>(static_cast<int>(kDim), m, metric);
  s.index->hnsw.efConstruction = 40;
  s.index->add(static_cast<idx_t>(n), s.data.data());
  for (size_t i = 0; i < n; ++i) s.labels.push_back(label_base + static_cast<int64_t>(i) * 3);
  return s;
}

MetaHeader header_for(const RegionPlan& plan, uint32_t m, uint8_t metric, uint32_t memnodes = 1) {
  MetaHeader h{};
  h.metadata_offset = kMetadataOffset;
  h.dim = kDim;
  h.metric = metric;
  h.num_memnodes = memnodes;
  h.m = m;
  h.ef_construction = 40;
  h.meta_m = 8;
  std::vector<char> block = encode_metadata(h, plan.subs, nullptr, 0);
  MetaHeader out;
  std::memcpy(&out, block.data(), sizeof out);
  return out;
}

/// Searches both indexes with the same efSearch; ids compared as global labels.
void check_same_search(faiss::IndexHNSWFlat& a, const std::vector<int64_t>& la, faiss::IndexHNSWFlat& b,
                       const std::vector<int64_t>& lb, size_t nq = 100, int k = 10) {
  const std::vector<float> q = random_vectors(nq, kDim, 4242);
  a.hnsw.efSearch = 64;
  b.hnsw.efSearch = 64;
  std::vector<float> da(nq * k), db(nq * k);
  std::vector<idx_t> ia(nq * k), ib(nq * k);
  a.search(static_cast<idx_t>(nq), q.data(), k, da.data(), ia.data());
  b.search(static_cast<idx_t>(nq), q.data(), k, db.data(), ib.data());
  size_t same_ids = 0, same_d = 0;
  for (size_t j = 0; j < nq * static_cast<size_t>(k); ++j) {
    const int64_t ga = ia[j] < 0 ? -1 : la[static_cast<size_t>(ia[j])];
    const int64_t gb = ib[j] < 0 ? -1 : lb[static_cast<size_t>(ib[j])];
    same_ids += ga == gb;
    // Not bitwise: a deserialized sub-HNSW computes distances with the SIMD kernel chosen at
    // start-up (common/distance.hpp), Faiss with its own; they sum in different orders, and
    // which orders depends on the CPU (equal here before, 20-45% equal on an AVX2 AMD EPYC).
    same_d += std::fabs(da[j] - db[j]) <= 1e-5f * std::max(1.0f, std::fabs(da[j]));
  }
  CHECK(same_ids == nq * static_cast<size_t>(k));
  CHECK(same_d == nq * static_cast<size_t>(k));
}

std::vector<char> fetch(fabric::Endpoint& ep, const SubDesc& d) {
  auto [off, len] = fetch_range(d);
  std::vector<char> buf(len);
  ep.read(RemotePtr(d.memnode, off), buf.data(), len);
  return buf;
}

/// Two subs in one group (A slot 0, B slot 1) serialized into a LocalFabric region.
struct Fixture {
  Source a = make_source(2000, 16, 1, 1000000);
  Source b = make_source(1500, 16, 2, 5000000);
  RegionPlan plan;
  MetaHeader h{};
  std::shared_ptr<fabric::LocalCluster> cluster;
  std::unique_ptr<fabric::Endpoint> ep;

  Fixture() {
    std::vector<SubShape> shapes{shape_of(*a.index), shape_of(*b.index)};
    plan = plan_region(shapes, 1, 0, LayoutParams{});
    plan.subs[0].entry_point = a.index->hnsw.entry_point;
    plan.subs[0].max_level = a.index->hnsw.max_level;
    plan.subs[1].entry_point = b.index->hnsw.entry_point;
    plan.subs[1].max_level = b.index->hnsw.max_level;
    h = header_for(plan, 16, 0);
    cluster = fabric::LocalCluster::create(1, plan.data_end[0]);
    ep = cluster->make_endpoint(8u << 20);
    char* region = cluster->region(0);
    std::memset(region + plan.subs[0].group_offset, 0x5A, plan.subs[0].group_bytes);  // serialize must zero gaps
    serialize_sub(*a.index, a.labels.data(), plan.subs[0], region + plan.subs[0].block_offset);
    serialize_sub(*b.index, b.labels.data(), plan.subs[1], region + plan.subs[1].block_offset);
    std::memset(region + plan.subs[0].overflow_offset, 0, plan.subs[0].overflow_bytes);
  }
};

std::string refusal(const std::vector<char>& buf, size_t len, const SubDesc& d, const MetaHeader& h) {
  try {
    deserialize_sub(buf.data(), len, d, h, "test sub");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "accepted";
}

/// Moves the last `tail` vectors of a serialized sub into overflow records (two records per
/// array, interleaved, written in time order), scribbles over the freed internal bytes and
/// returns the updated descriptor.
SubDesc move_tail_to_overflow(char* region, SubDesc d, const Source& s, uint64_t tail) {
  const faiss::HNSW& g = s.index->hnsw;
  const auto* storage = dynamic_cast<const faiss::IndexFlatCodes*>(s.index->storage);
  REQUIRE(storage != nullptr);
  const uint64_t n = d.count, first = n - tail, half = first + tail / 2;
  struct Piece {
    uint32_t array;
    const char* src;
    uint64_t bytes;
  };
  auto pieces_of = [&](uint64_t lo, uint64_t hi) {  // nodes [lo, hi)
    return std::vector<Piece>{
        {kLevels, reinterpret_cast<const char*>(g.levels.data() + lo), (hi - lo) * 4},
        {kVectors, reinterpret_cast<const char*>(storage->codes.data() + lo * kDim * 4), (hi - lo) * kDim * 4},
        {kOffsets, reinterpret_cast<const char*>(g.offsets.data() + lo + 1), (hi - lo) * 8},
        {kNeighbors, reinterpret_cast<const char*>(g.neighbors.data() + g.offsets[lo]),
         (g.offsets[hi] - g.offsets[lo]) * 4},
        {kLabels, reinterpret_cast<const char*>(s.labels.data() + lo), (hi - lo) * 8},
    };
  };
  std::vector<Piece> records = pieces_of(first, half);
  for (const Piece& p : pieces_of(half, n)) records.push_back(p);
  for (const Piece& p : records) {
    const uint64_t rb = overflow_record_bytes(p.bytes);
    REQUIRE(overflow_free(d, nullptr) >= rb);
    const uint64_t off = next_overflow_record_offset(d, rb);
    OverflowRecord r{p.array, 0, p.bytes};
    std::memset(region + off, 0, rb);
    std::memcpy(region + off, &r, sizeof r);
    std::memcpy(region + off + sizeof r, p.src, p.bytes);
    d.overflow_used += rb;
  }
  // The internal arrays lose their tails; the freed bytes become garbage the reader must ignore.
  uint64_t cut[kNumArrays] = {};
  cut[kLevels] = tail * 4;
  cut[kOffsets] = tail * 8;
  cut[kNeighbors] = (g.offsets[n] - g.offsets[first]) * 4;
  cut[kVectors] = tail * kDim * 4;
  cut[kLabels] = tail * 8;
  for (uint32_t a = 0; a < kNumArrays; ++a) {
    d.arrays[a].used -= cut[a];
    std::memset(region + d.block_offset + d.arrays[a].offset + d.arrays[a].used, 0xAB,
                d.arrays[a].capacity - d.arrays[a].used);
  }
  return d;
}

}  // namespace

TEST_CASE("subindex: a sub-HNSW read back through LocalFabric searches identically (both slots)",
          "[dhnsw][subindex]") {
  Fixture f;
  for (int slot = 0; slot < 2; ++slot) {
    const SubDesc& d = f.plan.subs[slot];
    Source& src = slot == 0 ? f.a : f.b;
    REQUIRE(d.slot == slot);
    std::vector<char> buf = fetch(*f.ep, d);
    // The gap bytes of the block were zeroed by serialize_sub.
    const ArraySlot& lv = d.arrays[kLevels];
    for (uint64_t i = lv.used; i < lv.capacity; ++i) REQUIRE(buf[lv.offset + i] == 0);
    SubIndex s = deserialize_sub(buf.data(), buf.size(), d, f.h, "test sub");
    CHECK(s.id == d.id);
    CHECK(s.labels == src.labels);
    CHECK(s.index->ntotal == src.index->ntotal);
    CHECK(s.index->storage->ntotal == src.index->ntotal);
    CHECK(s.index->hnsw.entry_point == src.index->hnsw.entry_point);
    CHECK(s.index->hnsw.max_level == src.index->hnsw.max_level);
    CHECK(s.index->hnsw.levels == src.index->hnsw.levels);
    CHECK(s.index->hnsw.offsets == src.index->hnsw.offsets);
    CHECK(s.index->hnsw.efConstruction == 40);
    CHECK(s.memory_bytes() > src.data.size() * sizeof(float));
    check_same_search(*src.index, src.labels, *s.index, s.labels);
  }
}

namespace {

/// An inner-product sub-HNSW of 500 vectors (M 8) serialized alone into a block without gaps.
struct IpSub {
  Source src = make_source(500, 8, 7, 0, faiss::METRIC_INNER_PRODUCT);
  RegionPlan plan = plan_region(std::vector<SubShape>{shape_of(*src.index)}, 1, 0, LayoutParams{0.0, 0.0});
  MetaHeader h{};
  std::vector<char> block;
  IpSub() {
    SubDesc& d = plan.subs[0];
    d.entry_point = src.index->hnsw.entry_point;
    d.max_level = src.index->hnsw.max_level;
    h = header_for(plan, 8, 1);
    block.resize(d.block_bytes);
    serialize_sub(*src.index, src.labels.data(), d, block.data());
  }
  const SubDesc& desc() const { return plan.subs[0]; }
};

}  // namespace

TEST_CASE("subindex: inner-product sub-HNSW round trip", "[dhnsw][subindex]") {
  IpSub ip;
  SubIndex s = deserialize_sub(ip.block.data(), ip.block.size(), ip.desc(), ip.h, "ip sub");
  CHECK(s.index->metric_type == faiss::METRIC_INNER_PRODUCT);
  check_same_search(*ip.src.index, ip.src.labels, *s.index, s.labels, 50);
}

TEST_CASE("subindex: serialize_sub refuses a descriptor that does not fit the index", "[dhnsw][subindex]") {
  Source src = make_source(100, 8, 3, 0);
  RegionPlan plan = plan_region(std::vector<SubShape>{SubShape{99, shape_of(*src.index).neighbor_entries, kDim}}, 1, 0,
                                LayoutParams{});
  std::vector<char> block(plan.subs[0].block_bytes);
  CHECK_THROWS_AS(serialize_sub(*src.index, src.labels.data(), plan.subs[0], block.data()), std::invalid_argument);
}

TEST_CASE("subindex: truncated and corrupted buffers are refused naming the array and byte", "[dhnsw][subindex]") {
  Fixture f;
  const SubDesc d0 = f.plan.subs[1];  // slot 1: the block starts at block_offset_in_fetch
  const std::vector<char> good = fetch(*f.ep, d0);
  const uint64_t base = block_offset_in_fetch(d0);
  std::vector<char> buf = good;
  SubDesc d = d0;
  auto at = [&](uint32_t a, uint64_t byte) { return std::to_string(base + d.arrays[a].offset + byte); };
  auto put32 = [&](uint32_t a, uint64_t index, int32_t v) {
    std::memcpy(buf.data() + base + d.arrays[a].offset + index * 4, &v, 4);
  };

  SECTION("truncated fetch") {
    CHECK_THAT(refusal(buf, buf.size() - 1, d, f.h), Contains("test sub: sub 1: fetched buffer: truncated"));
  }
  SECTION("levels: a level beyond max_level + 1") {
    put32(kLevels, 5, 99);
    CHECK_THAT(refusal(buf, buf.size(), d, f.h), Contains("levels array at byte " + at(kLevels, 20)));
  }
  SECTION("offsets: not matching the node's level") {
    uint64_t v;
    std::memcpy(&v, buf.data() + base + d.arrays[kOffsets].offset + 80, 8);
    v += 1;
    std::memcpy(buf.data() + base + d.arrays[kOffsets].offset + 80, &v, 8);
    CHECK_THAT(refusal(buf, buf.size(), d, f.h), Contains("offsets array at byte " + at(kOffsets, 80)));
  }
  SECTION("neighbors: an id beyond the sub") {
    put32(kNeighbors, 7, static_cast<int32_t>(d.count + 5));
    const std::string msg = refusal(buf, buf.size(), d, f.h);
    CHECK_THAT(msg, Contains("neighbors array at byte " + at(kNeighbors, 28)));
    CHECK_THAT(msg, Contains("neighbour id " + std::to_string(d.count + 5)));
  }
  SECTION("neighbors: used beyond capacity") {
    d.arrays[kNeighbors].used = d.arrays[kNeighbors].capacity + 4;
    const std::string msg = refusal(buf, buf.size(), d, f.h);
    CHECK_THAT(msg, Contains("neighbors array at byte " + at(kNeighbors, 0)));
    CHECK_THAT(msg, Contains("capacity"));
  }
  SECTION("vectors: a size that is no whole number of vectors") {
    d.arrays[kVectors].used -= 4;
    const std::string msg = refusal(buf, buf.size(), d, f.h);
    CHECK_THAT(msg, Contains("vectors array at byte " + at(kVectors, 0)));
    CHECK_THAT(msg, Contains("element size 64"));
  }
  SECTION("vectors: fewer vectors than the count") {
    d.arrays[kVectors].used -= 64;
    CHECK_THAT(refusal(buf, buf.size(), d, f.h), Contains("vectors array at byte"));
  }
  SECTION("labels: a negative label is a deleted vector, searched through but never returned") {
    const int64_t del = static_cast<int64_t>(uint64_t{5} | kDeletedLabel);
    std::memcpy(buf.data() + base + d.arrays[kLabels].offset + 24, &del, 8);
    const SubIndex s = deserialize_sub(buf.data(), buf.size(), d, f.h, "test");
    CHECK(s.deleted == 1);
    REQUIRE(s.live);
    CHECK_FALSE(s.live->is_member(3));
    CHECK(s.live->is_member(2));
  }
  SECTION("labels: an array outside the block") {
    d.arrays[kLabels].offset = d.block_bytes - 64;
    CHECK_THAT(refusal(buf, buf.size(), d, f.h), Contains("labels array at byte"));
  }
  SECTION("count disagreeing with the arrays") {
    d.count += 1;
    CHECK_THAT(refusal(buf, buf.size(), d, f.h), Contains("levels array at byte"));
  }
  SECTION("entry point not a top-level node") {
    d.entry_point = d.entry_point == 0 ? 1 : 0;
    if (f.b.index->hnsw.levels[static_cast<size_t>(d.entry_point)] == d.max_level + 1) d.entry_point += 1;
    CHECK_THAT(refusal(buf, buf.size(), d, f.h), Contains("entry point"));
  }
  SECTION("unknown metric") {
    MetaHeader h = f.h;
    h.metric = 9;
    CHECK_THAT(refusal(buf, buf.size(), d, h), Contains("metric"));
  }
  SECTION("the untouched buffer is accepted") { CHECK(refusal(buf, buf.size(), d, f.h) == "accepted"); }
}

TEST_CASE("subindex: overflow records after slot 0 and before slot 1 are applied in time order",
          "[dhnsw][subindex]") {
  Fixture f;
  char* region = f.cluster->region(0);
  SubDesc a = move_tail_to_overflow(region, f.plan.subs[0], f.a, 57);
  SubDesc b = move_tail_to_overflow(region, f.plan.subs[1], f.b, 41);
  REQUIRE(a.overflow_used > 0);
  REQUIRE(b.overflow_used > 0);
  CHECK(overflow_free(a, &b) == a.overflow_bytes - a.overflow_used - b.overflow_used);
  // Both descriptors still validate as a pair.
  std::vector<SubDesc> subs{a, b};
  CHECK_NOTHROW(validate_metadata(f.h, subs, f.plan.data_end[0], 0, "overflow"));

  for (int slot = 0; slot < 2; ++slot) {
    const SubDesc& d = slot == 0 ? a : b;
    Source& src = slot == 0 ? f.a : f.b;
    std::vector<char> buf = fetch(*f.ep, d);
    CHECK(buf.size() == d.block_bytes + d.overflow_used);
    SubIndex s = deserialize_sub(buf.data(), buf.size(), d, f.h, "overflow sub");
    CHECK(s.labels == src.labels);
    CHECK(s.index->hnsw.levels == src.index->hnsw.levels);
    CHECK(s.index->hnsw.offsets == src.index->hnsw.offsets);
    CHECK(s.index->hnsw.neighbors == std::vector<int32_t>(src.index->hnsw.neighbors.begin(),
                                                          src.index->hnsw.neighbors.begin() +
                                                              static_cast<ptrdiff_t>(src.index->hnsw.offsets.back())));
    check_same_search(*src.index, src.labels, *s.index, s.labels);
  }

  SECTION("malformed records are refused") {
    std::vector<char> buf = fetch(*f.ep, a);
    const uint64_t first = a.block_bytes;  // slot 0: the records follow the block
    auto corrupt = [&](size_t field_off, const void* v, size_t n) {
      std::vector<char> c = buf;
      std::memcpy(c.data() + first + field_off, v, n);
      return refusal(c, c.size(), a, f.h);
    };
    const uint32_t nine = 9, one = 1;
    const uint64_t huge = 1ull << 40, odd = 6;
    CHECK_THAT(corrupt(0, &nine, 4), Contains("overflow record at byte " + std::to_string(first)) &&
                                         Contains("unknown array 9"));
    CHECK_THAT(corrupt(4, &one, 4), Contains("reserved word"));
    CHECK_THAT(corrupt(8, &huge, 8), Contains("overflow record at byte " + std::to_string(first)) &&
                                         Contains("left in the overflow part"));
    CHECK_THAT(corrupt(8, &odd, 8), Contains("not a multiple of the element size"));
    SubDesc cut = a;
    cut.overflow_used -= 64;  // the last record no longer fits
    CHECK_THAT(refusal(buf, buf.size() - 64, cut, f.h), Contains("overflow record at byte"));
    // Slot 1: the first record (lowest address) starts the fetched buffer.
    std::vector<char> bb = fetch(*f.ep, b);
    std::memcpy(bb.data(), &nine, 4);
    CHECK_THAT(refusal(bb, bb.size(), b, f.h), Contains("overflow record at byte 0: unknown array 9"));
  }
}

TEST_CASE("subindex: meta-HNSW serialize/deserialize round trip", "[dhnsw][subindex]") {
  const std::vector<float> centroids = random_vectors(64, kDim, 99);
  faiss::IndexHNSWFlat meta(static_cast<int>(kDim), 8);
  meta.add(64, centroids.data());
  const std::vector<char> bytes = serialize_meta(meta);
  REQUIRE(bytes.size() > 64 * kDim * 4);
  auto back = deserialize_meta(bytes.data(), bytes.size(), "meta test");
  REQUIRE(back);
  CHECK(back->ntotal == 64);
  std::vector<int64_t> ids(64);
  for (int i = 0; i < 64; ++i) ids[static_cast<size_t>(i)] = i;
  check_same_search(meta, ids, *back, ids, 50, 5);

  CHECK_THROWS_WITH(deserialize_meta(bytes.data(), bytes.size() / 2, "meta test"), Contains("meta test: meta-HNSW"));
  std::vector<char> garbage(bytes.size(), 'z');
  CHECK_THROWS_WITH(deserialize_meta(garbage.data(), garbage.size(), "meta test"), Contains("meta test: meta-HNSW"));
  std::vector<char> longer = bytes;
  longer.resize(bytes.size() + 16);
  CHECK_THROWS_WITH(deserialize_meta(longer.data(), longer.size(), "meta test"), Contains("unexpected bytes"));
}

TEST_CASE("build: 8 partitions on 2 memnodes validate, hold every vector once, recall@10 >= 0.95",
          "[dhnsw][build]") {
  // Gaussian mixture: 5000 x 16, 12 clusters.
  const size_t n = 5000;
  std::mt19937_64 rng(17);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  std::vector<float> centers(12 * kDim);
  for (float& c : centers) c = u(rng);
  std::vector<float> data(n * kDim);
  for (size_t i = 0; i < n; ++i) {
    const size_t c = rng() % 12;
    for (uint32_t j = 0; j < kDim; ++j) data[i * kDim + j] = centers[c * kDim + j] + gauss(rng);
  }
  BuildOptions o;
  o.partitions = 8;
  o.m = 16;
  o.ef_construction = 64;
  o.meta_m = 8;
  o.memnodes = 2;
  o.threads = 2;
  const BuiltIndex built = build_index(data.data(), n, kDim, Metric::L2, o);
  REQUIRE(built.regions.size() == 2);
  REQUIRE(built.subs.size() == 8);
  REQUIRE(built.partition_sizes.size() == 8);
  uint64_t total = 0;
  for (uint64_t s : built.partition_sizes) total += s;
  CHECK(total == n);
  CHECK(built.header.num_vectors == n);
  CHECK(built.report()["partitions"]["count"] == 8);

  std::vector<Metadata> md;
  for (uint32_t m = 0; m < 2; ++m) {
    const std::vector<char>& r = built.regions[m];
    RegionHeader rh;
    std::memcpy(&rh, r.data(), sizeof rh);
    REQUIRE_NOTHROW(validate_region_header(rh, "region"));
    CHECK(rh.mode == static_cast<uint8_t>(fabric::Mode::Dhnsw));
    CHECK(rh.memnode_id == m);
    CHECK(rh.memnode_count == 2);
    CHECK(rh.dim == kDim);
    CHECK(rh.metric == static_cast<uint8_t>(MetricCode::L2));
    CHECK(rh.region_size == built.region_bytes[m]);
    CHECK(rh.data_offset == kMetadataOffset);
    CHECK(rh.scratch_offset == r.size());
    CHECK(rh.scratch_size == kScratchBytes);
    CHECK(rh.region_size == r.size() + kScratchBytes);
    CHECK(rh.mode_words[dhnsw_word::kMetadataOffset] == kMetadataOffset);
    CHECK(rh.mode_words[dhnsw_word::kMetadataSize] == built.header.block_bytes);
    CHECK(rh.mode_words[dhnsw_word::kDataEnd] == r.size());
    md.push_back(decode_metadata(r.data() + kMetadataOffset, built.header.block_bytes, rh.region_size, m, "region"));
    CHECK(std::memcmp(md.back().subs.data(), built.subs.data(), 8 * sizeof(SubDesc)) == 0);
  }
  CHECK(md[0].meta_index == md[1].meta_index);
  auto meta = deserialize_meta(md[0].meta_index.data(), md[0].meta_index.size(), "meta");
  CHECK(meta->ntotal == 8);

  // Every vector in exactly one sub, with its global label and its own vector.
  std::vector<int> seen(n, 0);
  std::vector<SubIndex> subs;
  for (const SubDesc& d : built.subs) {
    CHECK(d.memnode == (d.group % 2));
    CHECK(d.count == built.partition_sizes[d.id]);
    const std::vector<char>& r = built.regions[d.memnode];
    auto [off, len] = fetch_range(d);
    REQUIRE(off + len <= r.size());
    subs.push_back(deserialize_sub(r.data() + off, len, d, md[0].header, "sub " + std::to_string(d.id)));
    const SubIndex& s = subs.back();
    const auto* storage = dynamic_cast<const faiss::IndexFlatCodes*>(s.index->storage);
    REQUIRE(storage != nullptr);
    for (size_t j = 0; j < s.labels.size(); ++j) {
      const int64_t g = s.labels[j];
      REQUIRE(g >= 0);
      REQUIRE(static_cast<size_t>(g) < n);
      ++seen[static_cast<size_t>(g)];
      CHECK(std::memcmp(storage->codes.data() + j * kDim * 4, data.data() + static_cast<size_t>(g) * kDim,
                        kDim * 4) == 0);
    }
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<ptrdiff_t>(n));

  // Recall@10 of all partitions probed against brute force.
  const size_t nq = 100, k = 10;
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  std::vector<float> queries(nq * kDim);
  for (size_t qi = 0; qi < nq; ++qi) {
    const size_t base = pick(rng);
    for (uint32_t j = 0; j < kDim; ++j) queries[qi * kDim + j] = data[base * kDim + j] + 0.3f * gauss(rng);
  }
  std::vector<std::vector<std::pair<float, int64_t>>> found(nq);
  for (SubIndex& s : subs) {  // one batch of all queries per sub
    s.index->hnsw.efSearch = 64;
    std::vector<float> dist(nq * k);
    std::vector<idx_t> ids(nq * k);
    s.index->search(static_cast<idx_t>(nq), queries.data(), static_cast<idx_t>(k), dist.data(), ids.data());
    for (size_t qi = 0; qi < nq; ++qi)
      for (size_t j = 0; j < k; ++j)
        if (ids[qi * k + j] >= 0)
          found[qi].emplace_back(dist[qi * k + j], s.labels[static_cast<size_t>(ids[qi * k + j])]);
  }
  size_t hits = 0;
  for (size_t qi = 0; qi < nq; ++qi) {
    const float* q = queries.data() + qi * kDim;
    std::vector<std::pair<float, int64_t>> exact;
    for (size_t i = 0; i < n; ++i) {
      float dd = 0;
      for (uint32_t j = 0; j < kDim; ++j) dd += (data[i * kDim + j] - q[j]) * (data[i * kDim + j] - q[j]);
      exact.emplace_back(dd, static_cast<int64_t>(i));
    }
    std::partial_sort(exact.begin(), exact.begin() + k, exact.end());
    REQUIRE(found[qi].size() >= k);
    std::partial_sort(found[qi].begin(), found[qi].begin() + k, found[qi].end());
    std::set<int64_t> truth;
    for (size_t j = 0; j < k; ++j) truth.insert(exact[j].second);
    for (size_t j = 0; j < k; ++j) hits += truth.count(found[qi][j].second);
  }
  const double recall = static_cast<double>(hits) / (nq * k);
  INFO("recall@10 " << recall);
  CHECK(recall >= 0.95);

  // Images: one per memnode, OUT.<id>, loadable by that memnode.
  test::TempDir dir;
  const std::string out = dir.file("index.img");
  const auto infos = write_images(built, out);
  REQUIRE(infos.size() == 2);
  for (uint32_t m = 0; m < 2; ++m) {
    CHECK(infos[m].path == out + "." + std::to_string(m));
    CHECK(std::filesystem::exists(infos[m].path));
    const memory::ImageHeader ih = memory::read_image_header(infos[m].path);
    CHECK(ih.used_bytes == built.regions[m].size());
    CHECK(ih.region_size == built.region_bytes[m]);
    std::vector<char> region(ih.region_size, 0);
    memory::load_image(infos[m].path, region.data(), region.size(), static_cast<uint16_t>(m));
    CHECK(std::memcmp(region.data(), built.regions[m].data(), built.regions[m].size()) == 0);
  }
  CHECK(image_path("x.img", 0, 1) == "x.img");
  CHECK(image_path("x.img", 3, 4) == "x.img.3");
}

TEST_CASE("build: bad options are refused naming the option", "[dhnsw][build]") {
  const std::vector<float> data = random_vectors(100, kDim, 5);
  BuildOptions o;
  o.partitions = 4;
  o.m = 1;
  CHECK_THROWS_WITH(build_index(data.data(), 100, kDim, Metric::L2, o), Contains("--m"));
  o.m = 8;
  o.partitions = 101;
  CHECK_THROWS_WITH(build_index(data.data(), 100, kDim, Metric::L2, o), Contains("--partitions"));
  o.partitions = 4;
  o.memnodes = 0;
  CHECK_THROWS_WITH(build_index(data.data(), 100, kDim, Metric::L2, o), Contains("--memnodes"));
  o.memnodes = 1;
  o.layout.overflow_gap = -1;
  CHECK_THROWS_WITH(build_index(data.data(), 100, kDim, Metric::L2, o), Contains("--overflow-gap"));
  CHECK(resolve_partitions(0, 10000) == 100);
  CHECK(resolve_partitions(0, 1) == 1);
  CHECK(resolve_partitions(7, 10000) == 7);
}

TEST_CASE("subindex: a sub with codes read without its vectors searches on its codes and locates its vectors "
          "(both slots)",
          "[dhnsw][subindex][codes]") {
  Source a = make_source(2000, 16, 1, 1000000), b = make_source(1500, 16, 2, 5000000);
  const auto q = compute::Quantizer::train(compute::parse_codes("sq8"), a.data.data(), 2000, kDim, Metric::L2);
  const uint32_t cs = static_cast<uint32_t>(q->code_size());
  std::vector<uint8_t> ca(2000 * cs), cb(1500 * cs);
  q->encode(a.data.data(), 2000, ca.data());
  q->encode(b.data.data(), 1500, cb.data());
  RegionPlan plan = plan_region(std::vector<SubShape>{shape_of(*a.index, cs), shape_of(*b.index, cs)}, 1, 0, LayoutParams{});
  for (int i = 0; i < 2; ++i) {
    const faiss::IndexHNSWFlat& x = *(i == 0 ? a : b).index;
    plan.subs[static_cast<size_t>(i)].entry_point = x.hnsw.entry_point;
    plan.subs[static_cast<size_t>(i)].max_level = x.hnsw.max_level;
  }
  MetaHeader h = header_for(plan, 16, 0);
  h.code_size = cs;
  auto cluster = fabric::LocalCluster::create(1, plan.data_end[0]);
  auto ep = cluster->make_endpoint(8u << 20);
  char* region = cluster->region(0);
  serialize_sub(*a.index, a.labels.data(), ca.data(), cs, plan.subs[0], region + plan.subs[0].block_offset);
  serialize_sub(*b.index, b.labels.data(), cb.data(), cs, plan.subs[1], region + plan.subs[1].block_offset);
  const std::vector<float> queries = random_vectors(50, kDim, 4242);
  for (int slot = 0; slot < 2; ++slot) {
    DYNAMIC_SECTION("slot " << slot) {
      const SubDesc& d = plan.subs[static_cast<size_t>(slot)];
      const Source& src = slot == 0 ? a : b;
      const std::vector<uint8_t>& codes = slot == 0 ? ca : cb;
      const uint64_t n = src.labels.size();
      // Read whole (inserts): the codes array comes back for the commit to extend.
      const std::vector<char> whole = fetch(*ep, d);
      const SubIndex full = deserialize_sub(whole.data(), whole.size(), d, h, "whole");
      CHECK(full.codes == codes);
      CHECK_FALSE(full.coded);
      // Read for a search over codes: the vectors' part is never read (garbage here).
      const auto [off, len] = fetch_range(d);
      std::vector<char> buf(len, static_cast<char>(0xAB));
      uint64_t read = 0;
      for (const auto& [at, plen] : coded_fetch_parts(d)) {
        ep->read(RemotePtr(d.memnode, off + at), buf.data() + at, plen);
        read += plen;
      }
      CHECK(read == len - n * kDim * 4);
      const SubIndex s = deserialize_sub(buf.data(), len, d, h, "coded", false, q);
      REQUIRE(s.coded);
      CHECK(s.vectors_internal == n);
      CHECK(s.overflow_vectors.empty());
      for (uint64_t i : {uint64_t{0}, n / 2, n - 1}) {  // the vectors are where it says
        std::vector<float> v(kDim);
        ep->read(RemotePtr(s.memnode, s.vectors_offset + i * kDim * 4), v.data(), kDim * 4);
        CHECK(std::equal(v.begin(), v.end(), src.data.begin() + static_cast<std::ptrdiff_t>(i * kDim)));
      }
      // Searching the codes finds what searching the vectors finds (top 10 of 30 candidates).
      s.index->hnsw.efSearch = 64;
      full.index->hnsw.efSearch = 64;
      std::vector<float> dc(50 * 30), df(50 * 10);
      std::vector<idx_t> ic(50 * 30), jf(50 * 10);
      s.index->search(50, queries.data(), 30, dc.data(), ic.data());
      full.index->search(50, queries.data(), 10, df.data(), jf.data());
      size_t found = 0;
      for (size_t qi = 0; qi < 50; ++qi)
        for (size_t j = 0; j < 10; ++j)
          found += std::count(ic.begin() + static_cast<std::ptrdiff_t>(qi * 30),
                              ic.begin() + static_cast<std::ptrdiff_t>(qi * 30 + 30), jf[qi * 10 + j]);
      INFO(found << " of 500 exact top-10 among the codes' top 30");
      CHECK(found >= 490);
      CHECK(std::fabs(dc[0] - df[0]) < 0.1f * std::max(1.0f, df[0]));  // an approximate distance of the same scale
    }
  }
}

namespace {

/// Exact top-k labels of `q` among `src`'s vectors (the recall oracle).
std::vector<int64_t> exact_labels(const Source& src, const float* q, size_t k, Metric metric) {
  std::vector<std::pair<float, int64_t>> d;
  for (size_t i = 0; i < src.labels.size(); ++i)
    d.emplace_back(reference_distance(metric, q, src.data.data() + i * kDim, kDim), src.labels[i]);
  std::partial_sort(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(k), d.end());
  std::vector<int64_t> out;
  for (size_t i = 0; i < k; ++i) out.push_back(d[i].second);
  return out;
}

double overlap(const std::vector<std::pair<float, int64_t>>& got, const std::vector<int64_t>& exact) {
  size_t hits = 0;
  for (const auto& [d, l] : got) hits += std::find(exact.begin(), exact.end(), l) != exact.end();
  return static_cast<double>(hits) / static_cast<double>(exact.size());
}

}  // namespace

TEST_CASE("sub-HNSW search: in place and on the deserialized copy the same answers, recall as Faiss's, exact at "
          "efSearch n",
          "[dhnsw][subindex][sub_search]") {
  Fixture f;
  const std::vector<int> cum = neighbors_per_level(16);
  const DistanceComputer dc(Metric::L2, kDim);
  for (int slot = 0; slot < 2; ++slot) {
    const SubDesc& d = f.plan.subs[slot];
    const Source& src = slot == 0 ? f.a : f.b;
    std::vector<char> buf = fetch(*f.ep, d);
    SubIndex s = deserialize_sub(buf.data(), buf.size(), d, f.h, "test sub");
    const SubView copy = view_of(s);
    const std::optional<SubView> mapped = mapped_view(f.cluster->region(0) + d.block_offset, d, f.h, cum);
    REQUIRE(mapped);
    REQUIRE(copy.count == src.labels.size());
    const size_t nq = 100, k = 10;
    const std::vector<float> q = random_vectors(nq, kDim, 99);
    SubSearcher ss;
    double ours = 0, faiss_recall = 0, full = 0;
    std::vector<float> fd(k);
    std::vector<idx_t> fi(k);
    s.index->hnsw.efSearch = 32;
    for (size_t i = 0; i < nq; ++i) {
      const float* x = q.data() + i * kDim;
      std::vector<std::pair<float, int64_t>> a(k), b(k), all(k);
      a.resize(ss.search(copy, dc, false, x, k, 32, a.data()));
      b.resize(ss.search(*mapped, dc, false, x, k, 32, b.data()));
      CHECK(a == b);  // the same arrays, wherever they lie
      REQUIRE(a.size() == k);
      for (size_t j = 1; j < a.size(); ++j) CHECK(a[j - 1].first <= a[j].first);
      for (const auto& [dist, label] : a) {
        const auto at = std::find(src.labels.begin(), src.labels.end(), label);
        REQUIRE(at != src.labels.end());
        const float* v = src.data.data() + (at - src.labels.begin()) * kDim;
        CHECK(dist == Approx(reference_distance(Metric::L2, x, v, kDim)).epsilon(1e-4));
      }
      const std::vector<int64_t> exact = exact_labels(src, x, k, Metric::L2);
      ours += overlap(a, exact);
      all.resize(ss.search(copy, dc, false, x, k, static_cast<uint32_t>(copy.count), all.data()));
      full += overlap(all, exact);
      s.index->search(1, x, static_cast<idx_t>(k), fd.data(), fi.data());
      std::vector<std::pair<float, int64_t>> fr;
      for (size_t j = 0; j < k; ++j)
        if (fi[j] >= 0) fr.emplace_back(fd[j], s.labels[static_cast<size_t>(fi[j])]);
      faiss_recall += overlap(fr, exact);
    }
    INFO("slot " << slot << ": recall@10 at efSearch 32 " << ours / nq << " (Faiss " << faiss_recall / nq << ")");
    CHECK(ours / nq >= faiss_recall / nq - 0.02);
    CHECK(ours / nq >= 0.85);
    CHECK(full / nq == 1.0);
    // A beam of 32 computes at least its 32 results' distances and, on this sub, well short of
    // a scan of it.
    const uint64_t before = ss.distances();
    std::vector<std::pair<float, int64_t>> one(k);
    ss.search(copy, dc, false, q.data(), k, 32, one.data());
    const uint64_t computed = ss.distances() - before;
    INFO(computed << " distances for one search of " << copy.count << " vectors");
    CHECK(computed >= 32);
    CHECK(computed < copy.count / 2);
  }
}

TEST_CASE("sub-HNSW search: inner product gives Faiss's similarity, nearest first", "[dhnsw][subindex][sub_search]") {
  IpSub ip;
  const Source& src = ip.src;
  const std::vector<int> cum = neighbors_per_level(8);
  const std::optional<SubView> v = mapped_view(ip.block.data(), ip.desc(), ip.h, cum);
  REQUIRE(v);
  const DistanceComputer dc(Metric::IP, kDim);
  const std::vector<float> q = random_vectors(20, kDim, 5);
  SubSearcher ss;
  for (size_t i = 0; i < 20; ++i) {
    const float* x = q.data() + i * kDim;
    std::vector<std::pair<float, int64_t>> a(5);
    a.resize(ss.search(*v, dc, true, x, 5, 500, a.data()));
    REQUIRE(a.size() == 5);
    const std::vector<int64_t> exact = exact_labels(src, x, 5, Metric::IP);
    CHECK(overlap(a, exact) == 1.0);
    for (size_t j = 1; j < a.size(); ++j) CHECK(a[j - 1].first >= a[j].first);  // similarity: largest first
    float dot = 0;
    const auto at = std::find(src.labels.begin(), src.labels.end(), a[0].second) - src.labels.begin();
    for (uint32_t j = 0; j < kDim; ++j) dot += x[j] * src.data[static_cast<size_t>(at) * kDim + j];
    CHECK(a[0].first == Approx(dot).margin(1e-4));
  }
}

TEST_CASE("sub-HNSW search: deleted vectors guide the search and are never returned", "[dhnsw][subindex][sub_search]") {
  Fixture f;
  const SubDesc& d = f.plan.subs[0];
  std::vector<char> buf = fetch(*f.ep, d);
  SubIndex s = deserialize_sub(buf.data(), buf.size(), d, f.h, "test sub");
  // Every vector but five deleted: the search goes on through the deleted ones and finds them.
  std::set<int64_t> kept;
  for (size_t i = 0; i < s.labels.size(); ++i) {
    if (i % 400 == 7) {
      kept.insert(s.labels[i]);
      continue;
    }
    s.labels[i] = static_cast<int64_t>(static_cast<uint64_t>(s.labels[i]) | kDeletedLabel);
  }
  REQUIRE(kept.size() == 5);
  const DistanceComputer dc(Metric::L2, kDim);
  const std::vector<float> q = random_vectors(20, kDim, 17);
  SubSearcher ss;
  for (size_t i = 0; i < 20; ++i) {
    std::vector<std::pair<float, int64_t>> a(10);
    a.resize(ss.search(view_of(s), dc, false, q.data() + i * kDim, 10, 32, a.data()));
    CHECK(a.size() == 5);
    for (const auto& [dist, label] : a) CHECK(kept.count(label) == 1);
  }
}

TEST_CASE("sub-HNSW search in place: no view of a sub with overflow records or sizes beyond its block, and ids and "
          "offsets out of range in its lists are skipped",
          "[dhnsw][subindex][sub_search]") {
  Fixture f;
  const std::vector<int> cum = neighbors_per_level(16);
  const SubDesc good = f.plan.subs[0];
  char* block = f.cluster->region(0) + good.block_offset;
  REQUIRE(mapped_view(block, good, f.h, cum));
  CHECK_FALSE(mapped_view(nullptr, good, f.h, cum));
  SubDesc d = good;
  d.overflow_used = kAlign;  // records: copied and deserialized instead
  CHECK_FALSE(mapped_view(block, d, f.h, cum));
  d = good;
  d.arrays[kVectors].used += 4 * kDim;  // one vector more than the count
  CHECK_FALSE(mapped_view(block, d, f.h, cum));
  d = good;
  d.arrays[kNeighbors].offset = d.block_bytes;  // outside the block
  CHECK_FALSE(mapped_view(block, d, f.h, cum));
  d = good;
  d.entry_point = static_cast<int32_t>(d.count);
  CHECK_FALSE(mapped_view(block, d, f.h, cum));
  d = good;
  d.max_level = static_cast<int32_t>(cum.size());
  CHECK_FALSE(mapped_view(block, d, f.h, cum));

  // An in-place writer's half-written lists: wild ids and offsets are skipped, nothing read
  // outside the block (a copy of exactly its size, so that ASan sees a read past it).
  std::vector<char> own(block, block + good.block_bytes);
  const std::optional<SubView> v = mapped_view(own.data(), good, f.h, cum);
  REQUIRE(v);
  auto* nb = reinterpret_cast<int32_t*>(own.data() + good.arrays[kNeighbors].offset);
  auto* off = reinterpret_cast<uint64_t*>(own.data() + good.arrays[kOffsets].offset);
  std::mt19937_64 rng(3);
  for (uint64_t j = 0; j < v->neighbor_entries; j += 5) nb[j] = static_cast<int32_t>(rng() | 0x40000000u);
  for (uint64_t j = 2; j < v->neighbor_entries; j += 7) nb[j] = static_cast<int32_t>(good.count);  // one past the last
  const uint64_t e = v->neighbor_entries, l0 = static_cast<uint64_t>(cum[1]);
  // Offsets whose level-0 list would end just past the array, far past it, or wrap.
  const uint64_t wild[] = {e - l0 + 1, e - 1, e, e + 1, ~uint64_t{0} - 3, ~uint64_t{0} - l0 + 2};
  for (uint64_t i = 1, w = 0; i < good.count; i += 97, ++w) off[i] = wild[w % std::size(wild)];
  const DistanceComputer dc(Metric::L2, kDim);
  const std::vector<float> q = random_vectors(20, kDim, 23);
  const std::set<int64_t> labels(f.a.labels.begin(), f.a.labels.end());
  SubSearcher ss;
  for (size_t i = 0; i < 20; ++i) {
    std::vector<std::pair<float, int64_t>> a(10);
    a.resize(ss.search(*v, dc, false, q.data() + i * kDim, 10, 32, a.data()));
    CHECK(!a.empty());
    for (const auto& [dist, label] : a) CHECK(labels.count(label) == 1);
  }
}
