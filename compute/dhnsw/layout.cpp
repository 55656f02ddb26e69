#include "compute/dhnsw/layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <tuple>

#include "common/checksum.hpp"

namespace dmhnsw::dhnsw {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kMaxDimension = 65536;
constexpr int32_t kMaxLevelLimit = 64;  // Faiss levels are small (M >= 2: a few dozen at most)

[[noreturn]] void fail(const std::string& what, uint64_t offset, const std::string& problem) {
  throw std::runtime_error(what + ": metadata at offset " + std::to_string(offset) + ": " + problem);
}

std::string num(uint64_t v) { return std::to_string(v); }

/// a + b, or max when it overflows (so a bounds check against it fails).
uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

void check_gap(double g, const char* name) {
  if (!std::isfinite(g) || g < 0.0 || g > 1000.0)
    throw std::invalid_argument(std::string("layout: ") + name + " gap " + std::to_string(g) +
                                " must be a finite share in [0, 1000]");
}

uint64_t with_gap(uint64_t used, double gap) {
  const double extra = std::ceil(static_cast<double>(used) * gap);
  return std::max(align_up(used + static_cast<uint64_t>(extra), kAlign), kAlign);
}

/// Region offset of a MetaHeader field.
uint64_t hoff(const MetaHeader& h, size_t field) { return h.metadata_offset + field; }

/// Region offset of field `field` of sub i.
uint64_t soff(const MetaHeader& h, size_t i, size_t field) {
  return h.metadata_offset + h.sub_table_offset + i * sizeof(SubDesc) + field;
}
uint64_t aoff(const MetaHeader& h, size_t i, uint32_t a, size_t field) {
  return soff(h, i, offsetof(SubDesc, arrays) + a * sizeof(ArraySlot) + field);
}

/// Header checks that need nothing but the header.
void check_header_fields(const MetaHeader& h, uint64_t region_size, const std::string& what) {
  if (std::memcmp(h.magic, kMetaMagic, sizeof h.magic) != 0)
    fail(what, hoff(h, offsetof(MetaHeader, magic)), "bad magic (not a d-HNSW metadata block)");
  if (h.version != kMetaFormatVersion && h.version != kMetaFormatVersionNoCopies)
    fail(what, hoff(h, offsetof(MetaHeader, version)),
         "format version " + num(h.version) + ", this build reads versions " + num(kMetaFormatVersionNoCopies) +
             " and " + num(kMetaFormatVersion));
  if ((h.max_copies > 1) != (h.version == kMetaFormatVersion))
    fail(what, hoff(h, offsetof(MetaHeader, version)),
         "format version " + num(h.version) + " with boundary copies in at most " + num(h.max_copies) +
             " partitions (version 4 has copies, version 3 none)");
  if (h.dim == 0 || h.dim > kMaxDimension)
    fail(what, hoff(h, offsetof(MetaHeader, dim)), "dimension " + num(h.dim) + " outside [1, " + num(kMaxDimension) + "]");
  if (h.metric > 1) fail(what, hoff(h, offsetof(MetaHeader, metric)), "unknown metric code " + num(h.metric));
  if (h.num_memnodes == 0 || h.num_memnodes > 0xFFFF)
    fail(what, hoff(h, offsetof(MetaHeader, num_memnodes)), "memnode count " + num(h.num_memnodes) + " outside [1, 65535]");
  if (h.m < 2) fail(what, hoff(h, offsetof(MetaHeader, m)), "HNSW M " + num(h.m) + " below 2");
  if (h.ef_construction == 0) fail(what, hoff(h, offsetof(MetaHeader, ef_construction)), "efConstruction 0");
  if (h.meta_m < 2) fail(what, hoff(h, offsetof(MetaHeader, meta_m)), "meta-HNSW M " + num(h.meta_m) + " below 2");
  if (h.metadata_offset < kMetadataOffset || h.metadata_offset % 4096 != 0 || h.metadata_offset > region_size)
    fail(what, kMetadataOffset + offsetof(MetaHeader, metadata_offset),
         "metadata block offset " + num(h.metadata_offset) + " is not a 4096-aligned offset in [" +
             num(kMetadataOffset) + ", region size " + num(region_size) + "]");
  if (h.block_bytes < sizeof(MetaHeader) || h.block_bytes % kAlign != 0 ||
      sat_add(h.metadata_offset, h.block_bytes) > region_size)
    fail(what, hoff(h, offsetof(MetaHeader, block_bytes)),
         "block size " + num(h.block_bytes) + " is not a multiple of " + num(kAlign) + " in [" +
             num(sizeof(MetaHeader)) + ", region size " + num(region_size) + " - " + num(h.metadata_offset) + "]");
  const uint64_t table_bytes = uint64_t{h.num_subs} * sizeof(SubDesc);
  if (h.sub_table_offset < sizeof(MetaHeader) || h.sub_table_offset % 8 != 0 ||
      sat_add(h.sub_table_offset, table_bytes) > h.block_bytes)
    fail(what, hoff(h, offsetof(MetaHeader, sub_table_offset)),
         "sub table [" + num(h.sub_table_offset) + ", +" + num(table_bytes) + ") (" + num(h.num_subs) +
             " subs) outside the block of " + num(h.block_bytes) + " bytes");
  const uint64_t mi_end = sat_add(h.meta_index_offset, h.meta_index_bytes);
  if (h.meta_index_offset < sizeof(MetaHeader) || mi_end > h.block_bytes)
    fail(what, hoff(h, offsetof(MetaHeader, meta_index_offset)),
         "meta-HNSW [" + num(h.meta_index_offset) + ", +" + num(h.meta_index_bytes) + ") outside the block of " +
             num(h.block_bytes) + " bytes");
  if (h.max_copies > kMaxCopies)
    fail(what, hoff(h, offsetof(MetaHeader, max_copies)),
         "boundary copies in up to " + num(h.max_copies) + " partitions per vector; the bound is " + num(kMaxCopies));
  if (h.max_copies > 1 && h.id_buckets == 0)
    fail(what, hoff(h, offsetof(MetaHeader, max_copies)),
         "boundary copies without an id index (deletes and rebuilds find copies through it)");
  if (h.max_copies > 1 && (h.boundary_ratio_ppm < 1000000 || h.boundary_ratio_ppm > 100000000))
    fail(what, hoff(h, offsetof(MetaHeader, boundary_ratio_ppm)),
         "boundary copies: ratio " + num(h.boundary_ratio_ppm) + " ppm outside [1, 100]");
  if (h.codes_bytes > 0 || h.code_size > 0) {
    const uint64_t c_end = sat_add(h.codes_offset, h.codes_bytes);
    if (h.codes_bytes == 0 || h.code_size == 0 || h.code_size > 4 * kMaxDimension)
      fail(what, hoff(h, offsetof(MetaHeader, code_size)),
           "code size " + num(h.code_size) + " with a quantizer block of " + num(h.codes_bytes) + " bytes");
    if (h.codes_offset < mi_end || c_end > h.block_bytes || h.codes_offset < h.sub_table_offset + table_bytes)
      fail(what, hoff(h, offsetof(MetaHeader, codes_offset)),
           "quantizer block [" + num(h.codes_offset) + ", +" + num(h.codes_bytes) +
               ") not between the meta-HNSW's end " + num(mi_end) + " and the block's end " + num(h.block_bytes));
  }
  if (h.meta_index_bytes > 0 && h.meta_index_offset < h.sub_table_offset + table_bytes &&
      h.sub_table_offset < mi_end)
    fail(what, hoff(h, offsetof(MetaHeader, meta_index_offset)),
         "meta-HNSW [" + num(h.meta_index_offset) + ", " + num(mi_end) + ") overlaps the sub table [" +
             num(h.sub_table_offset) + ", " + num(h.sub_table_offset + table_bytes) + ")");
}

}  // namespace

const char* array_name(uint32_t a) {
  switch (a) {
    case kLevels: return "levels";
    case kOffsets: return "offsets";
    case kNeighbors: return "neighbors";
    case kLabels: return "labels";
    case kCodes: return "codes";
    case kVectors: return "vectors";
    default: return "unknown array";
  }
}

uint64_t element_bytes(uint32_t a, uint32_t dim, uint32_t code_size) {
  switch (a) {
    case kLevels: return sizeof(int32_t);
    case kOffsets: return sizeof(uint64_t);
    case kNeighbors: return sizeof(int32_t);
    case kLabels: return sizeof(int64_t);
    case kCodes: return std::max<uint64_t>(code_size, 1);  // never 0: callers divide by it
    case kVectors: return uint64_t{sizeof(float)} * dim;
    default: throw std::invalid_argument("element_bytes: unknown array " + std::to_string(a));
  }
}

void array_bytes(const SubShape& s, uint64_t out[kNumArrays]) {
  out[kLevels] = s.count * sizeof(int32_t);
  out[kOffsets] = (s.count + 1) * sizeof(uint64_t);
  out[kNeighbors] = s.neighbor_entries * sizeof(int32_t);
  out[kLabels] = s.count * sizeof(int64_t);
  out[kCodes] = s.count * s.code_size;
  out[kVectors] = s.count * s.dim * sizeof(float);
}

uint64_t plan_arrays(const SubShape& s, const LayoutParams& p, ArraySlot out[kNumArrays]) {
  check_gap(p.internal_gap, "internal");
  uint64_t used[kNumArrays];
  array_bytes(s, used);
  uint64_t at = 0;
  for (uint32_t a = 0; a < kNumArrays; ++a) {
    out[a].offset = at;
    out[a].used = used[a];
    out[a].capacity = a == kCodes && s.code_size == 0 ? 0 : with_gap(used[a], p.internal_gap);
    at += out[a].capacity;
  }
  return at;
}

uint64_t metadata_block_bytes(uint32_t num_subs, uint64_t meta_index_bytes, uint64_t codes_bytes) {
  return align_up(align_up(sizeof(MetaHeader) + uint64_t{num_subs} * sizeof(SubDesc) + meta_index_bytes, 8) + codes_bytes,
                  kAlign);
}

RegionPlan plan_region(std::span<const SubShape> subs, uint32_t num_memnodes, uint64_t meta_index_bytes,
                       const LayoutParams& p, uint64_t base, uint64_t id_capacity, uint64_t codes_bytes) {
  if (base < kMetadataOffset || base % 4096 != 0)
    throw std::invalid_argument("plan_region: base " + std::to_string(base) + " is not 4096-aligned at or after " +
                                std::to_string(kMetadataOffset));
  if (num_memnodes == 0 || num_memnodes > 0xFFFF)
    throw std::invalid_argument("plan_region: memnode count " + std::to_string(num_memnodes) +
                                " outside [1, 65535]");
  if (subs.size() > 0xFFFFFFFEull) throw std::invalid_argument("plan_region: too many subs");
  check_gap(p.internal_gap, "internal");
  check_gap(p.overflow_gap, "overflow");
  RegionPlan plan;
  plan.metadata_offset = base;
  plan.metadata_bytes = metadata_block_bytes(static_cast<uint32_t>(subs.size()), meta_index_bytes, codes_bytes);
  uint64_t first_group = align_up(base + plan.metadata_bytes, kAlign);
  if (id_capacity > 0) {
    const IdTable t = IdTable::sized_for(id_capacity, static_cast<uint16_t>(num_memnodes), first_group);
    plan.id_buckets = t.buckets;
    first_group = align_up(first_group + t.bytes_per_memnode(), kAlign);
  }
  std::vector<uint64_t> cursor(num_memnodes, first_group);

  plan.subs.resize(subs.size());
  const size_t groups = (subs.size() + 1) / 2;
  for (size_t g = 0; g < groups; ++g) {
    const uint16_t mem = static_cast<uint16_t>(g % num_memnodes);
    const size_t ia = 2 * g, ib = 2 * g + 1;
    const bool pair = ib < subs.size();
    SubDesc& a = plan.subs[ia];
    a = SubDesc{};
    const uint64_t bytes_a = plan_arrays(subs[ia], p, a.arrays);
    uint64_t bytes_b = 0;
    if (pair) {
      plan.subs[ib] = SubDesc{};
      bytes_b = plan_arrays(subs[ib], p, plan.subs[ib].arrays);
    }
    const double gap_d = std::ceil(p.overflow_gap * static_cast<double>(bytes_a + bytes_b));
    const uint64_t gap = align_up(static_cast<uint64_t>(gap_d), kAlign);
    const uint64_t start = cursor[mem];
    const uint64_t group_bytes = bytes_a + gap + bytes_b;
    cursor[mem] = start + group_bytes;

    auto fill = [&](SubDesc& d, size_t i, uint8_t slot, uint64_t block_offset, uint64_t block_bytes,
                    uint32_t partner) {
      d.id = static_cast<uint32_t>(i);
      d.memnode = mem;
      d.slot = slot;
      d.group = static_cast<uint32_t>(g);
      d.partner = partner;
      d.count = subs[i].count;
      d.entry_point = -1;  // filled in by the builder from the sub-HNSW
      d.max_level = -1;
      d.block_offset = block_offset;
      d.block_bytes = block_bytes;
      d.group_offset = start;
      d.group_bytes = group_bytes;
      d.overflow_offset = start + bytes_a;
      d.overflow_bytes = gap;
      d.overflow_used = 0;
      d.version = 0;
    };
    fill(a, ia, 0, start, bytes_a, pair ? static_cast<uint32_t>(ib) : kNoPartner);
    if (pair) fill(plan.subs[ib], ib, 1, start + bytes_a + gap, bytes_b, static_cast<uint32_t>(ia));
  }
  plan.region_bytes.resize(num_memnodes);
  plan.data_end.resize(num_memnodes);
  for (uint32_t m = 0; m < num_memnodes; ++m) {
    plan.data_end[m] = align_up(std::max(cursor[m], base + plan.metadata_bytes), kPage);
    plan.region_bytes[m] = plan.data_end[m] + kScratchBytes;
  }
  return plan;
}

std::pair<uint64_t, uint64_t> fetch_range(const SubDesc& d) {
  if (d.slot == 0) return {d.block_offset, d.block_bytes + d.overflow_used};
  return {d.block_offset - d.overflow_used, d.overflow_used + d.block_bytes};
}

uint64_t block_offset_in_fetch(const SubDesc& d) { return d.slot == 0 ? 0 : d.overflow_used; }

std::vector<std::pair<uint64_t, uint64_t>> coded_fetch_parts(const SubDesc& d) {
  const uint64_t base = block_offset_in_fetch(d), len = fetch_range(d).second;
  const ArraySlot& v = d.arrays[kVectors];
  const uint64_t skip_begin = base + v.offset, skip_end = base + v.offset + v.used;
  std::vector<std::pair<uint64_t, uint64_t>> parts;
  if (skip_begin > 0) parts.emplace_back(0, skip_begin);
  if (skip_end < len) parts.emplace_back(skip_end, len - skip_end);
  return parts;
}

uint64_t overflow_free(const SubDesc& a, const SubDesc* b) {
  const uint64_t used = a.overflow_used + (b ? b->overflow_used : 0);
  return used >= a.overflow_bytes ? 0 : a.overflow_bytes - used;
}

uint64_t next_overflow_record_offset(const SubDesc& d, uint64_t record_bytes) {
  if (d.slot == 0) return d.overflow_offset + d.overflow_used;
  return d.block_offset - d.overflow_used - record_bytes;
}

void validate_metadata(const MetaHeader& h, std::span<const SubDesc> subs, uint64_t region_size, uint32_t memnode,
                       const std::string& what) {
  check_header_fields(h, region_size, what);
  if (subs.size() != h.num_subs)
    fail(what, hoff(h, offsetof(MetaHeader, num_subs)),
         "the header says " + num(h.num_subs) + " subs, the table holds " + num(subs.size()));
  uint64_t meta_end = h.metadata_offset + h.block_bytes;
  if (h.id_buckets > 0) {  // the id index lies between the metadata block and the groups
    const IdTable t = id_table(h);
    if (h.id_buckets > (uint64_t{1} << 40) || sat_add(t.offset, t.bytes_per_memnode()) > region_size)
      fail(what, hoff(h, offsetof(MetaHeader, id_buckets)),
           "an id index of " + num(h.id_buckets) + " buckets at offset " + num(t.offset) + " does not fit the region of " +
               num(region_size) + " bytes");
    meta_end = t.offset + t.bytes_per_memnode();
  }

  // (memnode, start, end, sub) of every group, to check that groups do not overlap.
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, size_t>> extents;
  extents.reserve(subs.size());
  for (size_t i = 0; i < subs.size(); ++i) {
    const SubDesc& d = subs[i];
    auto at = [&](size_t field) { return soff(h, i, field); };
    const std::string who = "sub " + num(i) + ": ";
    if (d.id != i) fail(what, at(offsetof(SubDesc, id)), who + "id " + num(d.id) + ", expected " + num(i));
    if (d.memnode >= h.num_memnodes)
      fail(what, at(offsetof(SubDesc, memnode)),
           who + "memnode " + num(d.memnode) + " >= memnode count " + num(h.num_memnodes));
    if (d.slot > 1) fail(what, at(offsetof(SubDesc, slot)), who + "slot " + num(d.slot) + " (0 or 1)");
    if (d.count > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
      fail(what, at(offsetof(SubDesc, count)), who + "count " + num(d.count) + " does not fit Faiss int32 ids");
    if (d.count == 0 ? d.entry_point != -1
                     : (d.entry_point < 0 || static_cast<uint64_t>(d.entry_point) >= d.count))
      fail(what, at(offsetof(SubDesc, entry_point)),
           who + "entry point " + std::to_string(d.entry_point) + " invalid for " + num(d.count) + " vectors");
    if (d.max_level < -1 || d.max_level > kMaxLevelLimit || (d.count > 0) != (d.max_level >= 0))
      fail(what, at(offsetof(SubDesc, max_level)),
           who + "max level " + std::to_string(d.max_level) + " invalid for " + num(d.count) + " vectors");
    // The arrays: aligned, inside the block, in order, used <= capacity.
    uint64_t prev_end = 0;
    for (uint32_t a = 0; a < kNumArrays; ++a) {
      const ArraySlot& s = d.arrays[a];
      const std::string an = who + array_name(a) + " array: ";
      if (s.offset % kAlign != 0 || s.offset < prev_end)
        fail(what, aoff(h, i, a, offsetof(ArraySlot, offset)),
             an + "offset " + num(s.offset) + " is unaligned or overlaps the previous array (ends at " +
                 num(prev_end) + ")");
      if (s.used > s.capacity)
        fail(what, aoff(h, i, a, offsetof(ArraySlot, used)),
             an + "used " + num(s.used) + " bytes > capacity " + num(s.capacity));
      if (sat_add(s.offset, s.capacity) > d.block_bytes)
        fail(what, aoff(h, i, a, offsetof(ArraySlot, capacity)),
             an + "[" + num(s.offset) + ", +" + num(s.capacity) + ") outside the block of " + num(d.block_bytes) +
                 " bytes");
      prev_end = s.offset + s.capacity;
    }
    // The group: after the metadata block, aligned, no wrap-around.
    const uint64_t gend = sat_add(d.group_offset, d.group_bytes);
    if (d.group_offset < meta_end || d.group_offset % kAlign != 0 || gend == std::numeric_limits<uint64_t>::max())
      fail(what, at(offsetof(SubDesc, group_offset)),
           who + "group [" + num(d.group_offset) + ", +" + num(d.group_bytes) +
               ") is unaligned or starts inside the metadata block (ends at " + num(meta_end) + ")");
    if ((memnode == kAnyMemnode || memnode == d.memnode) && gend > region_size)
      fail(what, at(offsetof(SubDesc, group_bytes)),
           who + "group [" + num(d.group_offset) + ", " + num(gend) + ") ends beyond the region of " +
               num(region_size) + " bytes");
    // The block and the gap inside the group, the gap adjacent to the block on its side.
    const uint64_t bend = sat_add(d.block_offset, d.block_bytes);
    const uint64_t oend = sat_add(d.overflow_offset, d.overflow_bytes);
    if (d.block_offset % kAlign != 0 || d.block_offset < d.group_offset || bend > gend ||
        (d.slot == 0 ? d.block_offset != d.group_offset : bend != gend))
      fail(what, at(offsetof(SubDesc, block_offset)),
           who + "block [" + num(d.block_offset) + ", " + num(bend) + ") is not at the " +
               (d.slot == 0 ? "start" : "end") + " of its group [" + num(d.group_offset) + ", " + num(gend) + ")");
    if (d.overflow_offset % kAlign != 0 || d.overflow_offset < d.group_offset || oend > gend ||
        (d.slot == 0 ? d.overflow_offset != bend : oend != d.block_offset))
      fail(what, at(offsetof(SubDesc, overflow_offset)),
           who + "overflow gap [" + num(d.overflow_offset) + ", " + num(oend) + ") is not inside its group next to " +
               "the block [" + num(d.block_offset) + ", " + num(bend) + ")");
    if (d.overflow_used > d.overflow_bytes || d.overflow_used % kAlign != 0)
      fail(what, at(offsetof(SubDesc, overflow_used)),
           who + "overflow used " + num(d.overflow_used) + " bytes: not a multiple of " + num(kAlign) +
               " or more than the gap's " + num(d.overflow_bytes));
    // The partner: mutual, same group, other slot, same group geometry, gap not over-used.
    if (d.partner != kNoPartner) {
      if (d.partner >= subs.size() || d.partner == i)
        fail(what, at(offsetof(SubDesc, partner)), who + "partner " + num(d.partner) + " is not another sub");
      const SubDesc& o = subs[d.partner];
      if (o.partner != i || o.slot == d.slot || o.group != d.group || o.memnode != d.memnode ||
          o.group_offset != d.group_offset || o.group_bytes != d.group_bytes ||
          o.overflow_offset != d.overflow_offset || o.overflow_bytes != d.overflow_bytes)
        fail(what, at(offsetof(SubDesc, partner)),
             who + "partner " + num(d.partner) + " does not describe the same group from the other slot");
      if (d.overflow_used + o.overflow_used > d.overflow_bytes)
        fail(what, at(offsetof(SubDesc, overflow_used)),
             who + "overflow used " + num(d.overflow_used) + " + partner's " + num(o.overflow_used) +
                 " bytes exceed the shared gap of " + num(d.overflow_bytes));
      if (d.slot == 1) continue;  // the group's extent is recorded once, by slot 0
    }
    extents.emplace_back(d.memnode, d.group_offset, gend, i);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t k = 1; k < extents.size(); ++k) {
    const auto& [m0, s0, e0, i0] = extents[k - 1];
    const auto& [m1, s1, e1, i1] = extents[k];
    if (m0 == m1 && s1 < e0)
      fail(what, soff(h, i1, offsetof(SubDesc, group_offset)),
           "sub " + num(i1) + ": group [" + num(s1) + ", " + num(e1) + ") on memnode " + num(m1) +
               " overlaps the group of sub " + num(i0) + " [" + num(s0) + ", " + num(e0) + ")");
  }
}

IdTable id_table(const MetaHeader& h) {
  IdTable t;
  t.memnodes = static_cast<uint16_t>(h.num_memnodes);
  t.offset = align_up(h.metadata_offset + h.block_bytes, kAlign);
  t.buckets = h.id_buckets;
  return t;
}

uint64_t live_desc_offset(const MetaHeader& h, uint32_t id) {
  return h.metadata_offset + h.sub_table_offset + uint64_t{id} * sizeof(SubDesc);
}

SubDesc static_part(const SubDesc& d) {
  SubDesc s = d;
  s.count = 0;
  s.entry_point = 0;
  s.max_level = 0;
  for (auto& a : s.arrays) a.used = 0;
  s.overflow_used = 0;
  s.version = 0;
  s.lock = 0;
  s.deleted = 0;
  return s;
}

uint64_t metadata_checksum(const char* block, size_t bytes) {
  std::vector<char> copy(block, block + bytes);
  constexpr size_t kField = offsetof(MetaHeader, checksum);
  if (bytes >= kField + 8) std::memset(copy.data() + kField, 0, 8);
  if (bytes >= sizeof(MetaHeader)) {
    MetaHeader h;
    std::memcpy(&h, block, sizeof h);
    for (uint64_t i = 0; i < h.num_subs; ++i) {
      const uint64_t at = h.sub_table_offset + i * sizeof(SubDesc);
      if (h.sub_table_offset > bytes || at > bytes || bytes - at < sizeof(SubDesc)) break;  // bounds: decode names them
      SubDesc d;
      std::memcpy(&d, block + at, sizeof d);
      d = static_part(d);
      std::memcpy(copy.data() + at, &d, sizeof d);
    }
  }
  return checksum64(copy.data(), copy.size());
}

std::vector<char> encode_metadata(const MetaHeader& header, std::span<const SubDesc> subs, const char* meta_index,
                                  uint64_t meta_index_bytes, std::span<const char> codes) {
  MetaHeader h = header;
  std::memcpy(h.magic, kMetaMagic, sizeof h.magic);
  h.version = h.max_copies > 1 ? kMetaFormatVersion : kMetaFormatVersionNoCopies;
  h.num_subs = static_cast<uint32_t>(subs.size());
  h.sub_table_offset = sizeof(MetaHeader);
  h.meta_index_offset = sizeof(MetaHeader) + subs.size() * sizeof(SubDesc);
  h.meta_index_bytes = meta_index_bytes;
  h.codes_offset = codes.empty() ? 0 : align_up(h.meta_index_offset + meta_index_bytes, 8);
  h.codes_bytes = codes.size();
  h.block_bytes = metadata_block_bytes(h.num_subs, meta_index_bytes, codes.size());
  h.checksum = 0;
  std::vector<char> block(h.block_bytes, 0);
  std::memcpy(block.data(), &h, sizeof h);
  if (!subs.empty()) std::memcpy(block.data() + h.sub_table_offset, subs.data(), subs.size() * sizeof(SubDesc));
  if (meta_index_bytes > 0) std::memcpy(block.data() + h.meta_index_offset, meta_index, meta_index_bytes);
  if (!codes.empty()) std::memcpy(block.data() + h.codes_offset, codes.data(), codes.size());
  h.checksum = metadata_checksum(block.data(), block.size());
  std::memcpy(block.data() + offsetof(MetaHeader, checksum), &h.checksum, sizeof h.checksum);
  return block;
}

MetaHeader check_meta_header(const char* bytes, size_t len, uint64_t region_size, const std::string& what) {
  if (len < sizeof(MetaHeader))
    fail(what, kMetadataOffset + len,
         "truncated: " + num(len) + " bytes, the header alone is " + num(sizeof(MetaHeader)));
  MetaHeader h;
  std::memcpy(&h, bytes, sizeof h);
  check_header_fields(h, region_size, what);
  return h;
}

Metadata decode_metadata(const char* block, size_t len, uint64_t region_size, uint32_t memnode,
                         const std::string& what) {
  Metadata md;
  md.header = check_meta_header(block, len, region_size, what);
  const MetaHeader& h = md.header;
  if (len < h.block_bytes)
    fail(what, h.metadata_offset + len,
         "truncated: " + num(len) + " bytes read, the block is " + num(h.block_bytes) + " bytes");
  const uint64_t sum = metadata_checksum(block, h.block_bytes);
  if (sum != h.checksum)
    fail(what, hoff(h, offsetof(MetaHeader, checksum)),
         "checksum mismatch (stored " + num(h.checksum) + ", computed " + num(sum) + "): the block is corrupted");
  md.subs.resize(h.num_subs);
  if (h.num_subs > 0)
    std::memcpy(md.subs.data(), block + h.sub_table_offset, uint64_t{h.num_subs} * sizeof(SubDesc));
  md.meta_index.assign(block + h.meta_index_offset, block + h.meta_index_offset + h.meta_index_bytes);
  md.codes.assign(block + h.codes_offset, block + h.codes_offset + h.codes_bytes);
  validate_metadata(h, md.subs, region_size, memnode, what);
  return md;
}

}  // namespace dmhnsw::dhnsw
