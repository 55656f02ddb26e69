// d-HNSW region layout (compute/dhnsw/layout.hpp): gap arithmetic, groups and slots, memnode
// round-robin, fetch ranges with overflow, and the metadata checks naming the bad offset.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/checksum.hpp"
#include "compute/dhnsw/layout.hpp"

using namespace dmhnsw::dhnsw;
using Catch::Contains;

namespace {

/// A plan whose subs have entry points (as the builder fills them), with its header.
struct Planned {
  RegionPlan plan;
  MetaHeader h{};
};

Planned make_plan(const std::vector<SubShape>& shapes, uint32_t memnodes, uint64_t meta_bytes = 1000,
                  LayoutParams p = {}) {
  Planned r;
  r.plan = plan_region(shapes, memnodes, meta_bytes, p);
  for (auto& d : r.plan.subs) {
    d.entry_point = d.count > 0 ? 0 : -1;
    d.max_level = d.count > 0 ? 0 : -1;
  }
  std::vector<char> meta(meta_bytes, 'x');
  MetaHeader h{};
  h.metadata_offset = kMetadataOffset;
  h.dim = shapes.empty() ? 8 : shapes[0].dim;
  h.num_memnodes = memnodes;
  h.m = 16;
  h.ef_construction = 40;
  h.meta_m = 8;
  std::vector<char> block = encode_metadata(h, r.plan.subs, meta.data(), meta.size());
  std::memcpy(&r.h, block.data(), sizeof r.h);
  return r;
}

uint64_t max_region(const RegionPlan& p) { return *std::max_element(p.region_bytes.begin(), p.region_bytes.end()); }

/// Region offset of field `field` of sub i in the metadata block of `h`.
uint64_t sub_field(const MetaHeader& h, size_t i, size_t field) {
  return kMetadataOffset + h.sub_table_offset + i * sizeof(SubDesc) + field;
}

void expect_refused(const MetaHeader& h, const std::vector<SubDesc>& subs, uint64_t region, uint64_t offset,
                    const std::string& problem) {
  try {
    validate_metadata(h, subs, region, kAnyMemnode, "test index");
    FAIL("accepted: " << problem);
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Contains("test index: metadata at offset " + std::to_string(offset) + ": "));
    CHECK_THAT(msg, Contains(problem));
  }
}

}  // namespace

TEST_CASE("layout: array capacities are used + ceil(used * gap), kAlign-aligned", "[dhnsw][layout]") {
  SubShape s{100, 3200, 16, 16};
  uint64_t used[kNumArrays];
  array_bytes(s, used);
  CHECK(used[kLevels] == 400);
  CHECK(used[kOffsets] == 808);
  CHECK(used[kNeighbors] == 12800);
  CHECK(used[kVectors] == 6400);
  CHECK(used[kLabels] == 800);
  CHECK(used[kCodes] == 1600);

  ArraySlot a[kNumArrays];
  const uint64_t block = plan_arrays(s, LayoutParams{0.10, 0.10}, a);
  CHECK(a[kLevels].capacity == 448);     // 400 + 40 -> 448
  CHECK(a[kOffsets].capacity == 896);    // 808 + 81 -> 896
  CHECK(a[kNeighbors].capacity == 14080);  // 12800 + 1280 = 14080, already aligned
  CHECK(a[kVectors].capacity == 7040);
  CHECK(a[kLabels].capacity == 896);     // 800 + 80 -> 896
  CHECK(a[kCodes].capacity == 1792);     // 1600 + 160 -> 1792
  CHECK(a[kVectors].offset > a[kCodes].offset);  // last: a search over codes reads the block up to it
  uint64_t at = 0;
  for (uint32_t i = 0; i < kNumArrays; ++i) {
    CHECK(a[i].offset == at);
    CHECK(a[i].offset % kAlign == 0);
    CHECK(a[i].used == used[i]);
    at += a[i].capacity;
  }
  CHECK(block == at);

  SECTION("no gap: capacity is the used bytes rounded up") {
    plan_arrays(s, LayoutParams{0.0, 0.0}, a);
    CHECK(a[kLevels].capacity == 448);  // 400 -> 448
    CHECK(a[kNeighbors].capacity == 12800);
    CHECK(a[kVectors].capacity == 6400);
  }
  SECTION("an empty sub still gets kAlign bytes per array") {
    CHECK(plan_arrays(SubShape{0, 0, 16, 8}, LayoutParams{}, a) == kNumArrays * kAlign);
    for (uint32_t i = 0; i < kNumArrays; ++i) CHECK(a[i].capacity == kAlign);
    CHECK(a[kOffsets].used == 8);  // offsets[0]
  }
  SECTION("an index without codes has a codes array of no bytes") {
    CHECK(plan_arrays(SubShape{0, 0, 16}, LayoutParams{}, a) == (kNumArrays - 1) * kAlign);
    CHECK(a[kCodes].capacity == 0);
    CHECK(a[kCodes].offset == a[kVectors].offset);
  }
  SECTION("coded_fetch_parts skips the vectors' internal part, not the overflow") {
    SubDesc d{};
    std::copy(a, a + kNumArrays, d.arrays);
    d.block_bytes = block;
    d.overflow_used = 128;
    auto parts = coded_fetch_parts(d);  // slot 0: the block up to the vectors, then the rest
    REQUIRE(parts.size() == 2);
    CHECK(parts[0] == std::pair<uint64_t, uint64_t>{0, a[kVectors].offset});
    CHECK(parts[1].first == a[kVectors].offset + a[kVectors].used);
    CHECK(parts[1].first + parts[1].second == block + 128);
    d.slot = 1;  // the overflow before the block: one part up to the vectors
    parts = coded_fetch_parts(d);
    CHECK(parts[0] == std::pair<uint64_t, uint64_t>{0, 128 + a[kVectors].offset});
  }
  SECTION("a large gap share") {
    plan_arrays(s, LayoutParams{1.5, 0.1}, a);
    CHECK(a[kVectors].capacity == align_up(6400 + 9600, kAlign));
  }
  SECTION("bad gap shares are refused") {
    CHECK_THROWS_AS(plan_arrays(s, LayoutParams{-0.1, 0.1}, a), std::invalid_argument);
    CHECK_THROWS_AS(plan_region(std::vector<SubShape>{s}, 1, 0, LayoutParams{0.1, -1.0}), std::invalid_argument);
    CHECK_THROWS_AS(plan_region(std::vector<SubShape>{s}, 0, 0, LayoutParams{}), std::invalid_argument);
  }
}

TEST_CASE("layout: overflow records and element sizes", "[dhnsw][layout]") {
  CHECK(overflow_record_bytes(0) == 64);
  CHECK(overflow_record_bytes(48) == 64);
  CHECK(overflow_record_bytes(49) == 128);
  CHECK(element_bytes(kLevels, 16, 0) == 4);
  CHECK(element_bytes(kOffsets, 16, 0) == 8);
  CHECK(element_bytes(kNeighbors, 16, 0) == 4);
  CHECK(element_bytes(kVectors, 16, 0) == 64);
  CHECK(element_bytes(kLabels, 16, 0) == 8);
  CHECK(element_bytes(kCodes, 16, 12) == 12);
  CHECK(std::string(array_name(kNeighbors)) == "neighbors");
}

TEST_CASE("layout: plan_region places groups, slots and gaps, round-robin over memnodes", "[dhnsw][layout]") {
  // Five subs of different sizes: groups {0,1} -> memnode 0, {2,3} -> memnode 1, {4} -> memnode 0.
  std::vector<SubShape> shapes;
  for (uint64_t i = 0; i < 5; ++i) shapes.push_back(SubShape{100 + 37 * i, (100 + 37 * i) * 40, 16});
  const LayoutParams lp{0.10, 0.25};
  Planned pl = make_plan(shapes, 2, 1000, lp);
  const RegionPlan& p = pl.plan;
  REQUIRE(p.subs.size() == 5);
  CHECK(p.metadata_offset == kMetadataOffset);
  CHECK(p.metadata_bytes == metadata_block_bytes(5, 1000));
  CHECK(p.metadata_bytes == align_up(sizeof(MetaHeader) + 5 * 256 + 1000, kAlign));

  const uint64_t first_group = align_up(kMetadataOffset + p.metadata_bytes, kAlign);
  const uint16_t expect_mem[5] = {0, 0, 1, 1, 0};
  const uint8_t expect_slot[5] = {0, 1, 0, 1, 0};
  const uint32_t expect_partner[5] = {1, 0, 3, 2, kNoPartner};
  for (uint32_t i = 0; i < 5; ++i) {
    const SubDesc& d = p.subs[i];
    INFO("sub " << i);
    CHECK(d.id == i);
    CHECK(d.group == i / 2);
    CHECK(d.memnode == expect_mem[i]);
    CHECK(d.slot == expect_slot[i]);
    CHECK(d.partner == expect_partner[i]);
    CHECK(d.count == shapes[i].count);
    ArraySlot a[kNumArrays];
    CHECK(d.block_bytes == plan_arrays(shapes[i], lp, a));
    for (uint32_t k = 0; k < kNumArrays; ++k) CHECK(std::memcmp(&a[k], &d.arrays[k], sizeof a[k]) == 0);
    CHECK(d.block_offset % kAlign == 0);
    CHECK(d.group_offset % kAlign == 0);
    CHECK(d.overflow_used == 0);
    if (d.slot == 0) {
      CHECK(d.block_offset == d.group_offset);
      CHECK(d.overflow_offset == d.block_offset + d.block_bytes);
    } else {
      CHECK(d.block_offset + d.block_bytes == d.group_offset + d.group_bytes);
      CHECK(d.overflow_offset + d.overflow_bytes == d.block_offset);
    }
  }
  // First group on each memnode right after the metadata block; group 2 after group 0.
  CHECK(p.subs[0].group_offset == first_group);
  CHECK(p.subs[2].group_offset == first_group);
  CHECK(p.subs[4].group_offset == p.subs[0].group_offset + p.subs[0].group_bytes);
  // Shared gap: round_up(overflow_gap * (blockA + blockB)).
  const uint64_t gap01 = align_up(static_cast<uint64_t>(std::ceil(0.25 * (p.subs[0].block_bytes + p.subs[1].block_bytes))), kAlign);
  CHECK(p.subs[0].overflow_bytes == gap01);
  CHECK(p.subs[1].overflow_bytes == gap01);
  CHECK(p.subs[0].group_bytes == p.subs[0].block_bytes + gap01 + p.subs[1].block_bytes);
  // The lone sub of the last group still has a gap after it.
  const uint64_t gap4 = align_up(static_cast<uint64_t>(std::ceil(0.25 * p.subs[4].block_bytes)), kAlign);
  CHECK(p.subs[4].overflow_bytes == gap4);
  CHECK(p.subs[4].group_bytes == p.subs[4].block_bytes + gap4);
  // Region sizes: data end (4096-aligned end of the last group) + scratch.
  REQUIRE(p.region_bytes.size() == 2);
  REQUIRE(p.data_end.size() == 2);
  CHECK(p.data_end[0] == align_up(p.subs[4].group_offset + p.subs[4].group_bytes, 4096));
  CHECK(p.data_end[1] == align_up(p.subs[2].group_offset + p.subs[2].group_bytes, 4096));
  for (int m = 0; m < 2; ++m) CHECK(p.region_bytes[m] == p.data_end[m] + kScratchBytes);

  // No two blocks or gaps overlap on a memnode.
  for (uint16_t m = 0; m < 2; ++m) {
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const SubDesc& d : p.subs) {
      if (d.memnode != m) continue;
      ranges.emplace_back(d.block_offset, d.block_offset + d.block_bytes);
      if (d.slot == 0) ranges.emplace_back(d.overflow_offset, d.overflow_offset + d.overflow_bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t k = 1; k < ranges.size(); ++k) CHECK(ranges[k].first >= ranges[k - 1].second);
    CHECK(ranges.front().first >= kMetadataOffset + p.metadata_bytes);
    CHECK(ranges.back().second <= p.data_end[m]);
  }
  CHECK_NOTHROW(validate_metadata(pl.h, p.subs, max_region(p), kAnyMemnode, "plan"));
  CHECK_NOTHROW(validate_metadata(pl.h, p.subs, p.region_bytes[1], 1, "plan"));

  SECTION("three memnodes, one of them without a group") {
    Planned q = make_plan({shapes[0], shapes[1], shapes[2]}, 3);
    CHECK(q.plan.subs[0].memnode == 0);
    CHECK(q.plan.subs[2].memnode == 1);
    CHECK(q.plan.data_end[2] == align_up(kMetadataOffset + q.plan.metadata_bytes, 4096));
    CHECK_NOTHROW(validate_metadata(q.h, q.plan.subs, max_region(q.plan), kAnyMemnode, "plan"));
  }
  SECTION("no subs at all") {
    Planned q = make_plan({}, 1, 0);
    CHECK(q.plan.subs.empty());
    CHECK(q.plan.region_bytes[0] == align_up(kMetadataOffset + 128, 4096) + kScratchBytes);
    CHECK_NOTHROW(validate_metadata(q.h, q.plan.subs, q.plan.region_bytes[0], 0, "plan"));
  }
}

TEST_CASE("layout: fetch_range covers the block and the overflow it uses, for both slots", "[dhnsw][layout]") {
  Planned pl = make_plan({SubShape{500, 500 * 48, 16}, SubShape{300, 300 * 48, 16}}, 1);
  SubDesc a = pl.plan.subs[0], b = pl.plan.subs[1];
  const uint64_t gap = a.overflow_bytes;
  REQUIRE(gap >= 1024);
  CHECK(overflow_free(a, &b) == gap);
  CHECK(overflow_free(a, nullptr) == gap);

  // No overflow: exactly the blocks.
  CHECK(fetch_range(a) == std::make_pair(a.block_offset, a.block_bytes));
  CHECK(fetch_range(b) == std::make_pair(b.block_offset, b.block_bytes));
  CHECK(block_offset_in_fetch(a) == 0);
  CHECK(block_offset_in_fetch(b) == 0);

  a.overflow_used = 256;
  b.overflow_used = 448;
  auto [ao, al] = fetch_range(a);
  CHECK(ao == a.block_offset);
  CHECK(al == a.block_bytes + 256);
  CHECK(ao + al == a.overflow_offset + 256);  // contiguous: block then its overflow
  auto [bo, bl] = fetch_range(b);
  CHECK(bo == b.block_offset - 448);
  CHECK(bo + bl == b.block_offset + b.block_bytes);  // overflow then block, ends at the group end
  CHECK(bo == a.overflow_offset + a.overflow_bytes - 448);
  CHECK(block_offset_in_fetch(a) == 0);
  CHECK(block_offset_in_fetch(b) == 448);
  CHECK(ao + al <= bo);  // the two used parts do not meet
  CHECK(overflow_free(a, &b) == gap - 256 - 448);
  CHECK(overflow_free(b, &a) == gap - 256 - 448);

  // The next record of each side.
  CHECK(next_overflow_record_offset(a, 128) == a.overflow_offset + 256);
  CHECK(next_overflow_record_offset(b, 128) == b.block_offset - 448 - 128);

  pl.plan.subs[0] = a;
  pl.plan.subs[1] = b;
  CHECK_NOTHROW(validate_metadata(pl.h, pl.plan.subs, max_region(pl.plan), kAnyMemnode, "plan"));
  // Over-used shared gap.
  pl.plan.subs[1].overflow_used = gap - 192;
  expect_refused(pl.h, pl.plan.subs, max_region(pl.plan), sub_field(pl.h, 0, offsetof(SubDesc, overflow_used)),
                 "exceed the shared gap");
  CHECK(overflow_free(a, &pl.plan.subs[1]) == 0);
}

TEST_CASE("layout: validate_metadata refuses corrupted metadata naming the offset", "[dhnsw][layout]") {
  std::vector<SubShape> shapes;
  for (uint64_t i = 0; i < 4; ++i) shapes.push_back(SubShape{200 + i, (200 + i) * 40, 16});
  Planned pl = make_plan(shapes, 1);
  const uint64_t region = pl.plan.region_bytes[0];
  MetaHeader h = pl.h;
  std::vector<SubDesc> subs = pl.plan.subs;
  REQUIRE_NOTHROW(validate_metadata(h, subs, region, 0, "test index"));

  SECTION("magic") {
    h.magic[3] = 'X';
    expect_refused(h, subs, region, kMetadataOffset, "bad magic");
  }
  SECTION("version") {
    h.version = 7;
    expect_refused(h, subs, region, kMetadataOffset + 8, "format version 7");
  }
  SECTION("boundary copies") {
    h.max_copies = 4;
    h.boundary_ratio_ppm = 1050000;
    expect_refused(h, subs, region, kMetadataOffset + 8, "version 4 has copies");  // written as version 3
    h.version = kMetaFormatVersion;
    h.id_buckets = 0;
    expect_refused(h, subs, region, kMetadataOffset + offsetof(MetaHeader, max_copies), "without an id index");
    h.max_copies = kMaxCopies + 1;
    expect_refused(h, subs, region, kMetadataOffset + offsetof(MetaHeader, max_copies), "the bound is 8");
    h.max_copies = 4;
    h.id_buckets = 64;
    h.boundary_ratio_ppm = 999999;
    expect_refused(h, subs, region, kMetadataOffset + offsetof(MetaHeader, boundary_ratio_ppm), "ratio 999999 ppm");
  }
  SECTION("table size disagrees with the header") {
    subs.pop_back();
    expect_refused(h, subs, region, kMetadataOffset + 12, "table holds 3");
  }
  SECTION("block beyond the region") {
    expect_refused(h, subs, kMetadataOffset + 64, kMetadataOffset + offsetof(MetaHeader, block_bytes), "block size");
  }
  SECTION("meta-HNSW outside the block") {
    h.meta_index_bytes = h.block_bytes;
    expect_refused(h, subs, region, kMetadataOffset + offsetof(MetaHeader, meta_index_offset), "meta-HNSW");
  }
  SECTION("an array offset out of the block") {
    subs[2].arrays[kVectors].offset = subs[2].block_bytes;
    expect_refused(h, subs, region,
                   sub_field(h, 2, offsetof(SubDesc, arrays) + kVectors * sizeof(ArraySlot) + offsetof(ArraySlot, capacity)),
                   "vectors array");
  }
  SECTION("an array used beyond its capacity") {
    subs[1].arrays[kLabels].used = subs[1].arrays[kLabels].capacity + 8;
    expect_refused(h, subs, region,
                   sub_field(h, 1, offsetof(SubDesc, arrays) + kLabels * sizeof(ArraySlot) + offsetof(ArraySlot, used)),
                   "labels array");
  }
  SECTION("overlapping groups") {
    // Move group {2,3} so it starts inside group {0,1}.
    const uint64_t shift = subs[2].group_offset - subs[0].group_offset - 64;
    for (int i : {2, 3}) {
      subs[i].group_offset -= shift;
      subs[i].block_offset -= shift;
      subs[i].overflow_offset -= shift;
    }
    expect_refused(h, subs, region, sub_field(h, 2, offsetof(SubDesc, group_offset)), "overlaps the group of sub 0");
  }
  SECTION("a group beyond the region") {
    expect_refused(h, subs, subs[3].group_offset + 64, sub_field(h, 2, offsetof(SubDesc, group_bytes)),
                   "beyond the region");
  }
  SECTION("a block not at its group's end (slot 1)") {
    subs[1].block_offset -= 64;
    expect_refused(h, subs, region, sub_field(h, 1, offsetof(SubDesc, block_offset)), "not at the end");
  }
  SECTION("partners that disagree") {
    subs[1].partner = 2;  // sub 0 (checked first) names sub 1, which no longer names it back
    expect_refused(h, subs, region, sub_field(h, 0, offsetof(SubDesc, partner)), "partner 1 does not describe");
  }
  SECTION("an entry point outside the sub") {
    subs[3].entry_point = static_cast<int32_t>(subs[3].count);
    expect_refused(h, subs, region, sub_field(h, 3, offsetof(SubDesc, entry_point)), "entry point");
  }
  SECTION("a memnode id beyond the count") {
    subs[0].memnode = 1;
    expect_refused(h, subs, region, sub_field(h, 0, offsetof(SubDesc, memnode)), "memnode 1");
  }
}

TEST_CASE("layout: metadata block encode/decode round trip and checksum", "[dhnsw][layout]") {
  std::vector<SubShape> shapes{SubShape{10, 400, 8}, SubShape{20, 800, 8}, SubShape{30, 1200, 8}};
  RegionPlan p = plan_region(shapes, 2, 333, LayoutParams{});
  for (auto& d : p.subs) d.entry_point = 0, d.max_level = 0;
  std::vector<char> meta(333);
  for (size_t i = 0; i < meta.size(); ++i) meta[i] = static_cast<char>(i * 7);
  MetaHeader h{};
  h.metadata_offset = kMetadataOffset;
  h.dim = 8;
  h.num_memnodes = 2;
  h.m = 16;
  h.ef_construction = 40;
  h.meta_m = 8;
  h.epoch = 3;
  std::vector<char> block = encode_metadata(h, p.subs, meta.data(), meta.size());
  CHECK(block.size() == p.metadata_bytes);
  MetaHeader eh;
  std::memcpy(&eh, block.data(), sizeof eh);
  CHECK(eh.checksum == metadata_checksum(block.data(), block.size()));
  // The checksum is over the block with the field and every descriptor's mutable fields as zero.
  std::vector<char> zeroed = block;
  std::memset(zeroed.data() + offsetof(MetaHeader, checksum), 0, 8);
  for (size_t i = 0; i < p.subs.size(); ++i) {
    const SubDesc s = static_part(p.subs[i]);
    std::memcpy(zeroed.data() + eh.sub_table_offset + i * sizeof(SubDesc), &s, sizeof s);
  }
  CHECK(eh.checksum == dmhnsw::checksum64(zeroed.data(), zeroed.size()));
  SECTION("a commit's changes to a live descriptor leave the checksum valid") {
    SubDesc d = p.subs[1];
    d.count += 5, d.arrays[kVectors].used += 5 * 32, d.overflow_used += 64, d.version += 2, d.lock = lock_word(3, 77);
    std::vector<char> live = block;
    std::memcpy(live.data() + eh.sub_table_offset + sizeof(SubDesc), &d, sizeof d);
    CHECK(metadata_checksum(live.data(), live.size()) == eh.checksum);
    CHECK(lock_owner(d.lock) == 3);
  }

  const uint64_t region = *std::max_element(p.region_bytes.begin(), p.region_bytes.end());
  Metadata md = decode_metadata(block.data(), block.size(), region, kAnyMemnode, "round trip");
  CHECK(md.header.epoch == 3);
  CHECK(md.header.num_subs == 3);
  REQUIRE(md.subs.size() == 3);
  CHECK(std::memcmp(md.subs.data(), p.subs.data(), 3 * sizeof(SubDesc)) == 0);
  CHECK(md.meta_index == meta);

  SECTION("a flipped byte in the table fails the checksum") {
    block[eh.sub_table_offset + 256 + 40] ^= 1;
    CHECK_THROWS_WITH(decode_metadata(block.data(), block.size(), region, kAnyMemnode, "round trip"),
                      Contains("round trip: metadata at offset " + std::to_string(kMetadataOffset + 120)) &&
                          Contains("checksum mismatch"));
  }
  SECTION("a truncated block") {
    CHECK_THROWS_WITH(decode_metadata(block.data(), block.size() - 64, region, kAnyMemnode, "round trip"),
                      Contains("truncated"));
    CHECK_THROWS_WITH(check_meta_header(block.data(), 100, region, "round trip"), Contains("truncated"));
  }
}
