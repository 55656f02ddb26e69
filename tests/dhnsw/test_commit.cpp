// UpdateCommit (compute/dhnsw/commit.hpp) against a region held in local memory: a commit's
// WRITEs applied to the region and read back give exactly the sub-HNSW the inserter holds,
// through the internal gaps and then overflow records from both ends of the shared gap; a
// commit that does not fit is refused; a half-applied commit is what sanitizing repairs.
#include <catch2/catch.hpp>

#include <faiss/IndexFlatCodes.h>

#include <cstring>
#include <random>

#include "compute/dhnsw/build.hpp"
#include "compute/dhnsw/commit.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;

namespace {

constexpr uint32_t kDim = 8;

std::vector<float> random_vectors(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n * kDim);
  for (auto& x : v) x = g(rng);
  return v;
}

/// One memnode's region in local memory, with the live descriptors in its metadata block.
struct LocalRegion {
  BuiltIndex built;
  std::vector<char> bytes;
  explicit LocalRegion(double internal_gap, double overflow_gap) {
    const std::vector<float> base = random_vectors(600, 1);
    BuildOptions o;
    o.partitions = 2;  // one group: sub 0 at its start (slot 0), sub 1 at its end (slot 1)
    o.m = 8;
    o.ef_construction = 40;
    o.layout.internal_gap = internal_gap;
    o.layout.overflow_gap = overflow_gap;
    o.threads = 1;
    built = build_index(base.data(), 600, kDim, Metric::L2, o);
    bytes = built.regions[0];
    bytes.resize(built.region_bytes[0], 0);
  }
  SubDesc live(uint32_t id) const {
    SubDesc d;
    std::memcpy(&d, bytes.data() + live_desc_offset(built.header, id), sizeof d);
    return d;
  }
  std::vector<char> fetch(const SubDesc& d) const {
    auto [off, len] = fetch_range(d);
    return std::vector<char>(bytes.begin() + static_cast<std::ptrdiff_t>(off),
                             bytes.begin() + static_cast<std::ptrdiff_t>(off + len));
  }
  void apply(const RegionWrite& w) { std::memcpy(bytes.data() + w.offset, w.bytes.data(), w.bytes.size()); }
  void publish(const SubDesc& d) {
    std::memcpy(bytes.data() + live_desc_offset(built.header, d.id) + kLiveFieldsBegin,
                reinterpret_cast<const char*>(&d) + kLiveFieldsBegin, kLiveFieldsEnd - kLiveFieldsBegin);
    std::memcpy(bytes.data() + live_desc_offset(built.header, d.id) + offsetof(SubDesc, version), &d.version, 8);
  }
};

struct Prepared {
  SubIndex local;
  UpdateCommit commit;
};

/// Fetches sub `id`, inserts `n` new vectors (ids from `first_id`) locally, prepares the commit.
Prepared insert_local(const LocalRegion& r, uint32_t id, size_t n, int64_t first_id, uint32_t seed) {
  const SubDesc d = r.live(id), pd = r.live(1 - id);
  const std::vector<char> f = r.fetch(d);
  SubIndex s = deserialize_sub(f.data(), f.size(), d, r.built.header, "test");
  const ArraySegments segs = array_segments(f.data(), f.size(), d);
  const std::vector<char> raw = gather(f.data(), d, segs[kNeighbors]);
  std::vector<int32_t> old_nb(raw.size() / 4);
  std::memcpy(old_nb.data(), raw.data(), raw.size());
  const std::vector<float> x = random_vectors(n, seed);
  s.index->add(static_cast<faiss::Index::idx_t>(n), x.data());
  for (size_t i = 0; i < n; ++i) s.labels.push_back(first_id + static_cast<int64_t>(i));
  UpdateCommit c = prepare_commit(d, segs, old_nb, s, &pd, kDim, 0);
  return {std::move(s), std::move(c)};
}

void require_same(const SubIndex& a, const SubIndex& b) {
  REQUIRE(a.index->ntotal == b.index->ntotal);
  CHECK(a.labels == b.labels);
  CHECK(a.index->hnsw.levels == b.index->hnsw.levels);
  CHECK(a.index->hnsw.offsets == b.index->hnsw.offsets);
  CHECK(a.index->hnsw.neighbors == b.index->hnsw.neighbors);
  CHECK(a.index->hnsw.entry_point == b.index->hnsw.entry_point);
  CHECK(a.index->hnsw.max_level == b.index->hnsw.max_level);
  auto* sa = dynamic_cast<const faiss::IndexFlatCodes*>(a.index->storage);
  auto* sb = dynamic_cast<const faiss::IndexFlatCodes*>(b.index->storage);
  CHECK(sa->codes == sb->codes);
}

}  // namespace

TEST_CASE("commit: applied commits read back as the inserter's sub-HNSW through internal gaps and overflow records",
          "[dhnsw][commit]") {
  LocalRegion r(0.05, 0.5);
  uint64_t records[2] = {0, 0}, internal_only = 0;
  int64_t next_id = 10000;
  for (int round = 0; round < 12; ++round) {
    const uint32_t id = static_cast<uint32_t>(round % 2);
    const uint64_t v0 = r.live(id).version;
    Prepared p = insert_local(r, id, 12, next_id, 100 + round);
    next_id += 12;
    if (p.commit.overflow_records == 0) ++internal_only;
    records[id] += p.commit.overflow_records;
    CHECK(p.commit.desc.version == v0 + 2);
    for (const RegionWrite& w : p.commit.writes) r.apply(w);
    r.publish(p.commit.desc);
    // Every write stays inside the group: the block, or the part of the gap the sub now uses.
    const SubDesc d = r.live(id);
    const auto [off, len] = fetch_range(d);
    for (const RegionWrite& w : p.commit.writes) {
      CHECK(w.offset >= off);
      CHECK(w.offset + w.bytes.size() <= off + len);
    }
    const std::vector<char> f = r.fetch(d);
    const SubIndex back = deserialize_sub(f.data(), f.size(), d, r.built.header, "read back");
    require_same(p.local, back);
    // The partner's live state is untouched.
    const SubDesc other = r.live(1 - id);
    const std::vector<char> of = r.fetch(other);
    CHECK_NOTHROW(deserialize_sub(of.data(), of.size(), other, r.built.header, "partner"));
  }
  CHECK(internal_only >= 1);  // the first commits fit the 5 % internal gaps
  CHECK(records[0] > 0);      // then overflow records, from the gap's start ...
  CHECK(records[1] > 0);      // ... and from its end
  // The metadata block's checksum still holds with the live descriptors changed.
  CHECK_NOTHROW(decode_metadata(r.bytes.data() + kMetadataOffset, r.built.header.block_bytes, r.bytes.size(), 0,
                                "after commits"));
}

TEST_CASE("commit: a commit the shared gap cannot take is refused before anything is written", "[dhnsw][commit]") {
  LocalRegion r(0.0, 0.01);
  bool refused = false;
  for (int round = 0; round < 20 && !refused; ++round) {
    try {
      Prepared p = insert_local(r, 0, 30, 20000 + 30 * round, 7 + round);
      for (const RegionWrite& w : p.commit.writes) r.apply(w);
      r.publish(p.commit.desc);
    } catch (const CommitDoesNotFit& e) {
      refused = true;
      CHECK(e.needed > e.available);
      CHECK_THAT(e.what(), Catch::Contains("sub-HNSW 0") && Catch::Contains("memnode 0") &&
                               Catch::Contains("shared overflow gap"));
    }
  }
  CHECK(refused);
}

TEST_CASE("commit: a half-applied commit is refused as it is and repaired by sanitizing", "[dhnsw][commit]") {
  LocalRegion r(0.05, 0.5);
  const SubDesc before = r.live(0);
  Prepared p = insert_local(r, 0, 20, 30000, 5);
  // The writer dies after its WRITEs landed but before it published the descriptor: the old
  // nodes' lists already point at nodes the descriptor does not have.
  for (const RegionWrite& w : p.commit.writes) r.apply(w);
  const std::vector<char> f = r.fetch(before);
  CHECK_THROWS_WITH(deserialize_sub(f.data(), f.size(), before, r.built.header, "torn"),
                    Catch::Contains("neighbour id"));
  const SubIndex s = deserialize_sub(f.data(), f.size(), before, r.built.header, "torn", true);
  CHECK(s.sanitized > 0);
  CHECK(s.index->ntotal == static_cast<faiss::Index::idx_t>(before.count));
  // The graph stays searchable: an old vector finds itself.
  auto* st = dynamic_cast<const faiss::IndexFlatCodes*>(s.index->storage);
  float dist;
  faiss::Index::idx_t label;
  s.index->search(1, reinterpret_cast<const float*>(st->codes.data() + 5 * st->code_size), 1, &dist, &label);
  CHECK(label == 5);
}
