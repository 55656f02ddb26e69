#include "compute/shine/import.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "common/progress.hpp"
#include "common/region.hpp"
#include "compute/shine/layout.hpp"
#include "compute/shine/engine.hpp"
#include "compute/shine/graph.hpp"

namespace dmhnsw::shine {

using fabric::Buffer;
using fabric::FabricError;
using fabric::Op;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// saveIndex's header, field by field: byte offsets in the file (hnswalg.h, saveIndex order).
namespace field {
constexpr uint64_t kOffsetLevel0 = 0, kMaxElements = 8, kCount = 16, kSizePerElement = 24, kLabelOffset = 32,
                   kOffsetData = 40, kMaxLevel = 48, kEntryPoint = 52, kMaxM = 56, kMaxM0 = 64, kM = 72, kMult = 80,
                   kEfConstruction = 88;
}
static_assert(field::kEfConstruction + 8 == HnswlibFile::kHeaderBytes);
// hnswlib's tableint and linklistsizeint are 32-bit, its labeltype 64-bit.
constexpr uint64_t kLabelBytes = 8, kIdBytes = 4, kListHeaderBytes = 4;
constexpr uint32_t kNoEntry = 0xffffffffu;  // enterpoint_node_ of an empty index (tableint -1)
constexpr uint8_t kDeleteMark = 0x01;       // hnswlib's DELETE_MARK, byte 2 of a level-0 list header

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

// ================================================================== the file
void HnswlibFile::fail(uint64_t offset, const std::string& what) const {
  throw std::runtime_error(path() + ": byte offset " + str(offset) + ": " + what);
}

uint64_t HnswlibFile::u64_at(uint64_t off) const {
  uint64_t v;
  std::memcpy(&v, file_->data() + off, 8);
  return v;
}

uint32_t HnswlibFile::u32_at(uint64_t off) const {
  uint32_t v;
  std::memcpy(&v, file_->data() + off, 4);
  return v;
}

HnswlibFile::HnswlibFile(const std::string& path, uint32_t expect_dim)
    : file_(std::make_unique<MappedFile>(path)) {
  const uint64_t size = file_->size();
  if (size < kHeaderBytes)
    fail(size, "truncated: the file has " + str(size) + " bytes, an hnswlib index header alone has " +
                   str(kHeaderBytes));
  // No magic, no version in the format: each field is checked against the others instead.
  const uint64_t m = u64_at(field::kM);
  if (m < 2 || m > 1024) fail(field::kM, "M_ = " + str(m) + ": out of range (2..1024; not an hnswlib index?)");
  m_ = static_cast<uint32_t>(m);
  if (u64_at(field::kMaxM) != m)
    fail(field::kMaxM, "maxM_ = " + str(u64_at(field::kMaxM)) + " differs from M_ = " + str(m) +
                           " (hnswlib sets maxM_ = M_; not an hnswlib 0.6 index?)");
  if (u64_at(field::kMaxM0) != 2 * m)
    fail(field::kMaxM0, "maxM0_ = " + str(u64_at(field::kMaxM0)) + " but M_ = " + str(m) +
                            ": shine's node layout holds 2*M level-0 links, so it needs maxM0_ = 2*M_ = " + str(2 * m));
  data_offset_ = u64_at(field::kOffsetData);
  if (data_offset_ != kListHeaderBytes + kIdBytes * 2 * m)
    fail(field::kOffsetData, "offsetData_ = " + str(data_offset_) + ", expected " + str(kListHeaderBytes + kIdBytes * 2 * m) +
                                 " (the level-0 list of 2*M_ ids and its count)");
  label_offset_ = u64_at(field::kLabelOffset);
  if (label_offset_ <= data_offset_ || (label_offset_ - data_offset_) % 4 != 0 ||
      (label_offset_ - data_offset_) / 4 > 65536)
    fail(field::kLabelOffset, "label_offset_ = " + str(label_offset_) + " with offsetData_ = " + str(data_offset_) +
                                  ": the vector between them is not 1..65536 float32s");
  dim_ = static_cast<uint32_t>((label_offset_ - data_offset_) / 4);
  if (expect_dim != 0 && dim_ != expect_dim)
    fail(field::kLabelOffset, "the index holds vectors of dimension " + str(dim_) + " ((label_offset_ - offsetData_) / 4), "
                              "the data has dimension " + str(expect_dim));
  per_element_ = u64_at(field::kSizePerElement);
  if (per_element_ != label_offset_ + kLabelBytes)
    fail(field::kSizePerElement, "size_data_per_element_ = " + str(per_element_) + ", expected label_offset_ + 8 = " +
                                     str(label_offset_ + kLabelBytes));
  if (u64_at(field::kOffsetLevel0) != 0)
    fail(field::kOffsetLevel0, "offsetLevel0_ = " + str(u64_at(field::kOffsetLevel0)) + ", hnswlib writes 0");
  count_ = u64_at(field::kCount);
  max_elements_ = u64_at(field::kMaxElements);
  if (count_ > max_elements_)
    fail(field::kCount, "cur_element_count = " + str(count_) + " exceeds max_elements_ = " + str(max_elements_));
  if (count_ > std::numeric_limits<uint32_t>::max())
    fail(field::kCount, "cur_element_count = " + str(count_) + ": hnswlib's 32-bit ids cannot number that many");
  double mult;
  std::memcpy(&mult, file_->data() + field::kMult, 8);
  const double want_mult = 1 / std::log(1.0 * static_cast<double>(m));
  // Later `computenode insert` runs draw levels with 1/ln(M), as hnswlib does.
  if (!(std::fabs(mult - want_mult) <= 1e-9 * want_mult))
    fail(field::kMult, "mult_ = " + std::to_string(mult) + ", hnswlib uses 1/ln(M_) = " + std::to_string(want_mult));
  const uint64_t efc = u64_at(field::kEfConstruction);
  if (efc == 0 || efc > std::numeric_limits<uint32_t>::max())
    fail(field::kEfConstruction, "ef_construction_ = " + str(efc) + ": out of range");
  ef_construction_ = static_cast<uint32_t>(efc);
  int32_t max_level;
  std::memcpy(&max_level, file_->data() + field::kMaxLevel, 4);
  entry_ = u32_at(field::kEntryPoint);
  if (count_ == 0) {
    if (max_level != -1 || entry_ != kNoEntry)
      fail(field::kMaxLevel, "an index of 0 elements has maxlevel_ -1 and no entry point, this one maxlevel_ " +
                                 std::to_string(max_level) + " and entry point " + str(entry_));
  } else {
    if (max_level < 0 || max_level > static_cast<int>(kMaxLevel))
      fail(field::kMaxLevel, "maxlevel_ = " + std::to_string(max_level) + ": out of range (0.." + str(kMaxLevel) + ")");
    if (entry_ >= count_)
      fail(field::kEntryPoint, "enterpoint_node_ = " + str(entry_) + " but the index has " + str(count_) + " elements");
  }
  max_level_ = max_level;

  // The level-0 block, then per element a u32 byte count and its upper-level lists.
  const uint64_t level0_end = kHeaderBytes + count_ * per_element_;  // < 2^32 * 2^19: no overflow
  if (level0_end > size)
    fail(size, "truncated: the level-0 block of " + str(count_) + " elements x " + str(per_element_) + " bytes ends at " +
                   str(level0_end) + ", the file has " + str(size) + " bytes");
  upper_bytes_per_level_ = kListHeaderBytes + kIdBytes * m;
  levels_.resize(count_);
  deleted_.assign(count_, 0);
  upper_.resize(count_);
  uint64_t at = level0_end;
  int top = -1;
  for (uint64_t i = 0; i < count_; ++i) {
    if (at + 4 > size)
      fail(at, "truncated: element " + str(i) + " of " + str(count_) + " has no upper-level link size (the file ends at " +
                   str(size) + ")");
    const uint64_t bytes = u32_at(at);
    if (bytes % upper_bytes_per_level_ != 0 || bytes / upper_bytes_per_level_ > kMaxLevel)
      fail(at, "element " + str(i) + ": " + str(bytes) + " bytes of upper-level links is not 0.." + str(kMaxLevel) +
                   " lists of " + str(upper_bytes_per_level_) + " bytes");
    if (at + 4 + bytes > size)
      fail(at, "truncated: element " + str(i) + "'s " + str(bytes) + " bytes of upper-level links run past the end of the "
               "file at " + str(size));
    levels_[i] = static_cast<uint8_t>(bytes / upper_bytes_per_level_);
    top = std::max<int>(top, levels_[i]);
    upper_[i] = at + 4;
    at += 4 + bytes;
  }
  if (at != size)
    fail(at, str(size - at) + " bytes follow the last element's links: not an hnswlib 0.6 index of " + str(count_) +
                 " elements (or a corrupted one)");
  if (top != max_level_)
    fail(field::kMaxLevel, "maxlevel_ = " + std::to_string(max_level_) + " but the highest element level is " +
                               std::to_string(top));
  if (count_ > 0 && levels_[entry_] != static_cast<unsigned>(max_level_))
    fail(field::kEntryPoint, "enterpoint_node_ " + str(entry_) + " has level " + str(levels_[entry_]) +
                                 ", maxlevel_ is " + std::to_string(max_level_));
  for (uint64_t i = 0; i < count_; ++i) check_lists(i);
}

uint64_t HnswlibFile::list_offset(uint64_t i, unsigned level) const {
  return level == 0 ? element_offset(i) : upper_[i] + (level - 1) * upper_bytes_per_level_;
}

void HnswlibFile::check_lists(uint64_t i) {
  const uint64_t label_at = element_offset(i) + label_offset_;
  if (u64_at(label_at) > (uint64_t{1} << 63) - 1)
    fail(label_at, "element " + str(i) + " has label " + str(u64_at(label_at)) + ": ids are 0 .. 2^63 - 1 (int64 in the "
                   "service)");
  for (unsigned l = 0; l <= levels_[i]; ++l) {
    const uint64_t off = list_offset(i, l);
    const uint32_t head = u32_at(off);
    const uint32_t count = head & 0xffff, cap = l == 0 ? 2 * m_ : m_;
    const uint32_t flags = head >> 16;
    if (l == 0 && (flags & kDeleteMark) != 0) {
      deleted_[i] = 1;
      ++deleted_count_;
    }
    const uint32_t known = l == 0 ? kDeleteMark : 0;
    if ((flags & ~known) != 0) fail(off + 2, "element " + str(i) + ": unknown flags " + str(flags) + " in its level-" + str(l) + " list");
    if (count > cap)
      fail(off, "element " + str(i) + " has " + str(count) + " links at level " + str(l) + ", the capacity is " + str(cap));
    for (uint32_t j = 0; j < count; ++j) {
      const uint64_t id_at = off + kListHeaderBytes + kIdBytes * j;
      const uint32_t id = u32_at(id_at);
      if (id >= count_)
        fail(id_at, "element " + str(i) + ", level " + str(l) + ": neighbour id " + str(id) + " but the index has " +
                        str(count_) + " elements");
      // A shine list read follows the neighbour's record to this level: it must have it.
      if (levels_[id] < l)
        fail(id_at, "element " + str(i) + ", level " + str(l) + ": neighbour " + str(id) + " only reaches level " +
                        str(levels_[id]));
    }
  }
}

uint64_t HnswlibFile::label(uint64_t i) const {
  return u64_at(element_offset(i) + label_offset_);
}

const float* HnswlibFile::vector(uint64_t i) const {
  return reinterpret_cast<const float*>(file_->data() + element_offset(i) + data_offset_);
}

uint32_t HnswlibFile::list_count(uint64_t i, unsigned level) const { return u32_at(list_offset(i, level)) & 0xffff; }

uint32_t HnswlibFile::neighbour(uint64_t i, unsigned level, uint32_t j) const {
  return u32_at(list_offset(i, level) + kListHeaderBytes + kIdBytes * j);
}

// ================================================================== the import
namespace {

std::string memnode_name(const fabric::MemnodeInfo& mn) { return "memnode " + str(mn.id) + " (" + mn.address + ")"; }
uint64_t round64(uint64_t b) { return (b + 63) / 64 * 64; }

/// Every memnode must be empty: an import never merges into, or overwrites, an index.
std::vector<RegionHeader> check_empty(fabric::Cluster& c, fabric::Endpoint& ep) {
  std::vector<RegionHeader> hs;
  for (const auto& mn : c.memnodes()) {
    RegionHeader h;
    ep.read(RemotePtr(mn.id, 0), &h, sizeof h);
    validate_region_header(h, memnode_name(mn));
    const auto mode = static_cast<fabric::Mode>(h.mode);
    if (mode == fabric::Mode::Shine) {
      const uint64_t start = round64(h.data_offset), bump = h.mode_words[shine_word::kBump];
      std::string nodes;
      if (mn.id == 0) {
        uint64_t count = h.mode_words[shine_word::kNodeCount];
        nodes = str(count) + " nodes, ";
      }
      throw FabricError(memnode_name(mn) + " already holds a shine index (" + nodes + str(bump > start ? bump - start : 0) +
                        " bytes of nodes): shine-import writes only into empty memnodes (restart them)");
    }
    if (mode != fabric::Mode::None)
      throw FabricError(memnode_name(mn) + " already holds a " + fabric::mode_name(mode) +
                        " index: shine-import writes only into empty memnodes (restart them)");
    if (h.mode_words[shine_word::kFormat] != 0)
      throw FabricError(memnode_name(mn) + " is being formatted by a computenode: shine-import writes only into empty "
                        "memnodes");
    hs.push_back(h);
  }
  return hs;
}

/// The smallest --region (whole MiB) whose data area holds `bytes` of records: the region's
/// own layout (header page, scratch area) decides, so it is asked rather than restated.
uint64_t region_for(uint64_t bytes) {
  uint64_t r = std::max<uint64_t>(kMinRegionBytes, (bytes + (1u << 20) - 1) >> 20 << 20);
  for (;; r += 1u << 20) {
    const RegionHeader h = make_region_header(0, r);
    if (h.region_size - round64(h.data_offset) >= bytes) return r;
  }
}

/// Where each element's record goes: the memnode with the most room left, in element order,
/// so each memnode's records are consecutive (written in large WRITEs).
struct Placement {
  std::vector<uint64_t> addr;            // element -> RemotePtr raw
  std::vector<uint64_t> start, used;     // per memnode: first byte of nodes, bytes of records
  std::vector<std::vector<uint32_t>> elems;  // per memnode, in address order
};

Placement place(const fabric::Cluster& c, const std::vector<RegionHeader>& hs, const HnswlibFile& f, const NodeLayout& L,
                uint64_t first) {
  const size_t n = hs.size();
  Placement p;
  p.addr.resize(f.count());
  p.start.resize(n);
  p.used.assign(n, 0);
  p.elems.resize(n);
  std::vector<uint64_t> room(n);
  uint64_t total = 0, total_room = 0;
  for (size_t j = 0; j < n; ++j) {
    p.start[j] = first;  // where format_or_attach puts the bump pointer
    room[j] = hs[j].region_size > p.start[j] ? hs[j].region_size - p.start[j] : 0;
    total_room += room[j];
  }
  for (uint64_t i = 0; i < f.count(); ++i) total += round64(L.node_bytes(f.level(i)));
  for (uint64_t i = 0; i < f.count(); ++i) {
    const uint64_t bytes = round64(L.node_bytes(f.level(i)));
    size_t best = 0;
    for (size_t j = 1; j < n; ++j)
      if (room[j] - p.used[j] > room[best] - p.used[best]) best = j;
    if (bytes > room[best] - p.used[best]) {
      std::string have;
      for (size_t j = 0; j < n; ++j)
        have += (j ? ", " : "") + memnode_name(c.memnodes()[j]) + " " + str(room[j]) + " bytes";
      throw FabricError("the index needs " + str(total) + " bytes of node records (" + str(f.count()) + " nodes of dimension " +
                        str(f.dim()) + ", M " + str(f.m()) + "), the memnodes hold " + str(total_room) + " (" + have +
                        "): start them with --region of at least " + str(region_for(total / n + bytes) >> 20) +
                        "MiB each, or add memnodes");
    }
    p.addr[i] = RemotePtr(static_cast<uint16_t>(best), p.start[best] + p.used[best]).raw();
    p.used[best] += bytes;
    p.elems[best].push_back(static_cast<uint32_t>(i));
  }
  return p;
}

/// The id index's words on each memnode: every live element's label -> its record.
std::vector<std::vector<uint64_t>> fill_id_table(const IdTable& t, const HnswlibFile& f, const Placement& p) {
  std::vector<std::pair<IdKey, RemotePtr>> entries;
  entries.reserve(f.count());
  for (uint64_t i = 0; i < f.count(); ++i)
    if (!f.deleted(i)) entries.emplace_back(f.label(i), RemotePtr::from_raw(p.addr[i]));
  return dmhnsw::fill_id_table(t, entries, f.path());
}

/// Fills one node record (zeroed, rounded to 64 bytes) at `r`.
void fill_record(char* r, const HnswlibFile& f, const NodeLayout& L, const Placement& p, uint32_t i) {
  const unsigned level = f.level(i);
  std::memset(r, 0, round64(L.node_bytes(level)));
  const NodeFront front{NodeHeader::make(level, false, f.deleted(i)), f.label(i)};
  std::memcpy(r, &front, sizeof front);
  std::memcpy(r + NodeLayout::vector_offset(), f.vector(i), 4ull * f.dim());
  for (unsigned l = 0; l <= level; ++l) {
    char* lp = r + L.list_offset(l);
    const ListFront lf{f.list_count(i, l), 0};
    std::memcpy(lp, &lf, sizeof lf);
    for (uint32_t j = 0; j < lf.count; ++j) std::memcpy(lp + sizeof lf + 8 * j, &p.addr[f.neighbour(i, l, j)], 8);
  }
}

/// The import's compressed vectors: the quantizer (null: none), its block's bytes and the log.
struct Codes {
  std::shared_ptr<const compute::Quantizer> q;
  uint64_t block_bytes = 0;
  CodesLog log;
  uint64_t train_rows = 0;
  double train_seconds = 0;
};

/// Trains the quantizer on up to compute::kCodesTrainRows of the file's elements, spread evenly over all
/// of them (deleted ones included: they are vectors of the same data).
Codes train_codes(const HnswlibFile& f, const ImportOptions& o, size_t memnodes) {
  Codes k;
  if (!o.codes.enabled()) return k;
  const auto t0 = Clock::now();
  const uint64_t rows = std::min<uint64_t>(f.count(), compute::kCodesTrainRows);
  k.q = compute::Quantizer::train_spread(o.codes, f.count(), f.dim(), o.metric, [&](size_t i) { return f.vector(i); });
  k.block_bytes = k.q->serialize().size();
  k.log.capacity = o.codes_capacity > 0 ? o.codes_capacity
                                        : std::max<uint64_t>(1024, 2 * f.count() / std::max<size_t>(1, memnodes));
  k.log.code_size = static_cast<uint32_t>(k.q->code_size());
  k.train_rows = rows;
  k.train_seconds = seconds_since(t0);
  return k;
}

struct CodeWrites {
  uint64_t entries = 0, dropped = 0, bytes = 0;
  double seconds = 0;
};

/// Every element's code into the codes log of the memnode that holds its record, in address
/// order (slot k: the memnode's k-th record), as the inserts of a build append them; then each
/// memnode's count word is raised by the elements it holds (entries past the log's capacity are
/// not written, as an insert leaves them: searches read those nodes' vectors).
CodeWrites write_codes(fabric::Endpoint& ep, const HnswlibFile& f, const Codes& k, const CodesLog& log,
                       const Placement& p, uint64_t chunk) {
  CodeWrites cw;
  if (!k.q) return cw;
  const auto t0 = Clock::now();
  const uint64_t eb = log.entry_bytes();
  const uint64_t per_write = std::max<uint64_t>(1, chunk / eb);
  Buffer b = ep.alloc(per_write * eb);
  std::vector<float> x(per_write * f.dim());
  std::vector<uint8_t> codes(per_write * log.code_size);
  for (size_t j = 0; j < p.elems.size(); ++j) {
    const auto& el = p.elems[j];
    const uint64_t stored = std::min<uint64_t>(el.size(), log.capacity);
    for (uint64_t first = 0; first < stored; first += per_write) {
      const uint64_t cnt = std::min(per_write, stored - first);
      for (uint64_t i = 0; i < cnt; ++i) std::memcpy(x.data() + i * f.dim(), f.vector(el[first + i]), 4ull * f.dim());
      k.q->encode(x.data(), cnt, codes.data());
      std::memset(b.data(), 0, cnt * eb);
      for (uint64_t i = 0; i < cnt; ++i) {
        char* e = b.data() + i * eb;
        const uint64_t label = f.label(el[first + i]);
        std::memcpy(e, &p.addr[el[first + i]], 8);
        std::memcpy(e + 8, &label, 8);
        std::memcpy(e + 16, codes.data() + i * log.code_size, log.code_size);
      }
      ep.write(RemotePtr(static_cast<uint16_t>(j), log.entry_offset(first)), b.data(), cnt * eb);
      cw.bytes += cnt * eb;
    }
    if (!el.empty())
      ep.fetch_add(RemotePtr(static_cast<uint16_t>(j), mode_word_offset(shine_word::kCodesLogCount)), el.size());
    cw.entries += stored;
    cw.dropped += el.size() - stored;
  }
  cw.seconds = seconds_since(t0);
  return cw;
}

/// Formats the regions exactly as `computenode build` does, writes the id index's buckets
/// (nothing reads them until the entry point is set), then takes every memnode's records at once
/// with one FETCH_ADD on its bump pointer (the allocation protocol of inserts).
GraphParams format_and_claim(fabric::Cluster& c, fabric::Endpoint& ep, const HnswlibFile& f, const ImportOptions& o,
                             uint64_t id_capacity, const IndexAreas& areas, const Codes& codes,
                             const std::vector<std::vector<uint64_t>>& table_words, const Placement& p, uint64_t chunk) {
  const size_t n = c.memnodes().size();
  const IdTable& table = areas.ids;
  GraphParams want;
  want.dim = f.dim();
  want.m = f.m();
  want.ef_construction = f.ef_construction();
  want.metric = o.metric;
  want.seed = o.seed;
  want.id_capacity = id_capacity;
  want.codes = codes.q;
  want.codes_capacity = codes.log.capacity;
  const GraphParams got = format_or_attach(c, ep, &want);
  if (got.ids.buckets != table.buckets || (table.buckets > 0 && got.ids.offset != table.offset))
    throw FabricError("the id index was placed at offset " + str(got.ids.offset) + " with " + str(got.ids.buckets) +
                      " buckets, the import computed offset " + str(table.offset) + " with " + str(table.buckets));
  if (codes.q && (got.codes_block != areas.codes_block || got.codes_log.offset != areas.codes_log.offset ||
                  got.codes_log.capacity != areas.codes_log.capacity || got.records != areas.records))
    throw FabricError("the codes were placed at offset " + str(got.codes_block) + " (log at " + str(got.codes_log.offset) +
                      ", " + str(got.codes_log.capacity) + " entries, records from " + str(got.records) +
                      "), the import computed " + str(areas.codes_block) + " (" + str(areas.codes_log.offset) + ", " +
                      str(areas.codes_log.capacity) + ", " + str(areas.records) + ")");
  for (size_t j = 0; j < table_words.size(); ++j) {
    const auto& words = table_words[j];
    const uint64_t bytes = 8 * words.size();
    for (uint64_t at = 0; at < bytes; at += chunk) {
      const uint64_t len = std::min(chunk, bytes - at);
      ep.write(RemotePtr(static_cast<uint16_t>(j), table.offset + at), reinterpret_cast<const char*>(words.data()) + at, len);
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (p.used[j] == 0) continue;
    const uint64_t at = ep.fetch_add(RemotePtr(static_cast<uint16_t>(j), mode_word_offset(shine_word::kBump)), p.used[j]);
    if (at != p.start[j])
      throw FabricError(memnode_name(c.memnodes()[j]) + ": another computenode allocated nodes during the import (bump "
                        "pointer at " + str(at) + ", expected " + str(p.start[j]) + "); the index there is not usable");
  }
  return got;
}

struct RecordWrites {
  uint64_t bytes = 0, writes = 0, doorbells = 0;
  double seconds = 0;
};

/// The records, consecutive per memnode, cut into chunks of one WRITE each, `per_bell` WRITEs
/// per doorbell; one batch is filled while the previous one is in flight.
RecordWrites write_records(fabric::Endpoint& ep, const HnswlibFile& f, const NodeLayout& L, const Placement& p,
                           uint64_t chunk, uint32_t per_bell, bool show_progress) {
  const size_t n = p.elems.size();
  RecordWrites rw;
  const auto t0 = Clock::now();
  std::array<std::vector<Buffer>, 2> bufs;
  for (auto& set : bufs)
    for (uint32_t k = 0; k < per_bell; ++k) set.push_back(ep.alloc(chunk));
  std::array<std::vector<Op>, 2> ops;
  size_t mn = 0, next = 0, in_flight = 0, cur = 0;
  uint64_t nodes_done = 0;
  ProgressOptions po;
  po.enabled = show_progress;
  Progress progress("shine import", f.count(), "nodes", po);
  for (;;) {
    ops[cur].clear();
    while (ops[cur].size() < per_bell) {
      while (mn < n && next >= p.elems[mn].size()) ++mn, next = 0;
      if (mn == n) break;
      char* b = bufs[cur][ops[cur].size()].data();
      const auto& el = p.elems[mn];
      const RemotePtr first = RemotePtr::from_raw(p.addr[el[next]]);
      uint64_t len = 0;
      while (next < el.size()) {
        const uint64_t bytes = round64(L.node_bytes(f.level(el[next])));
        if (len + bytes > chunk) break;
        fill_record(b + len, f, L, p, el[next]);
        len += bytes;
        ++next;
        ++nodes_done;
      }
      ops[cur].push_back(Op::write(first, b, len));
      rw.bytes += len;
    }
    if (ops[cur].empty()) break;
    if (in_flight > 0) ep.wait_all(in_flight);
    const fabric::Status s = ep.post(ops[cur]);
    if (s != fabric::Status::Ok)
      throw FabricError("posting " + str(ops[cur].size()) + " WRITEs of node records failed: " + fabric::status_name(s));
    in_flight = ops[cur].size();
    rw.writes += in_flight;
    ++rw.doorbells;
    cur ^= 1;
    progress.set(nodes_done);
  }
  if (in_flight > 0) ep.wait_all(in_flight);
  progress.finish();
  rw.seconds = seconds_since(t0);
  return rw;
}

/// The index becomes visible only now: node count, then the entry point (pointer + level).
void publish_entry(fabric::Endpoint& ep, const HnswlibFile& f, const Placement& p) {
  if (f.count() == 0) return;
  uint64_t top = 0;
  for (uint64_t i = 0; i < f.count(); ++i) top = std::max<uint64_t>(top, f.label(i));
  raise_id_ceiling(ep, top + 1);
  ep.fetch_add(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), f.count());
  if (f.deleted_count() > 0) ep.fetch_add(RemotePtr(0, mode_word_offset(shine_word::kDeleted)), f.deleted_count());
  Buffer w = ep.alloc(16);
  const uint64_t words[2] = {p.addr[f.entry()], static_cast<uint64_t>(f.max_level())};
  std::memcpy(w.data(), words, 16);
  static_assert(shine_word::kMaxLevel == shine_word::kEntryPoint + 1);  // one 16-byte WRITE
  ep.write(RemotePtr(0, mode_word_offset(shine_word::kEntryPoint)), w.data(), 16);
}

}  // namespace

json import_hnswlib(fabric::Cluster& c, const HnswlibFile& f, const ImportOptions& o) {
  const NodeLayout L(f.dim(), f.m());
  const size_t n = c.memnodes().size();
  const uint32_t per_bell = std::max<uint32_t>(1, o.writes_per_doorbell);
  uint64_t chunk = std::max<uint64_t>(o.chunk_bytes, round64(L.node_bytes(kMaxLevel)));
  uint64_t cls = 64;
  while (cls < chunk) cls *= 2;  // the pool hands out power-of-two blocks
  auto ep = c.make_endpoint(2 * per_bell * cls + (8u << 20));

  const std::vector<RegionHeader> hs = check_empty(c, *ep);
  // The id index (as format_or_attach places it: at one offset on every memnode, records after it).
  const uint64_t id_capacity = o.id_capacity < 0 ? std::max<uint64_t>(1024, 2 * (f.count() - f.deleted_count()))
                                                 : static_cast<uint64_t>(o.id_capacity);
  uint64_t first = 0;
  for (const auto& h : hs) first = std::max(first, round64(h.data_offset));
  const Codes codes = train_codes(f, o, n);
  const IndexAreas areas = plan_areas(id_capacity, static_cast<uint16_t>(n), first, codes.block_bytes, codes.log);
  const IdTable& table = areas.ids;  // the free stacks and the reuse log start empty (zeroed)
  first = areas.records;
  if (id_capacity == 0 && !codes.q) {
    for (const auto& h : hs)
      if (round64(h.data_offset) != first)
        throw FabricError("the memnodes' data areas start at different offsets; import with an id index");
  }
  const Placement p = place(c, hs, f, L, first);
  const auto table_words = id_capacity > 0 ? fill_id_table(table, f, p) : std::vector<std::vector<uint64_t>>{};

  const GraphParams got = format_and_claim(c, *ep, f, o, id_capacity, areas, codes, table_words, p, chunk);
  const RecordWrites rw = write_records(*ep, f, L, p, chunk, per_bell, o.progress);
  const CodeWrites cw = write_codes(*ep, f, codes, got.codes_log, p, chunk);
  publish_entry(*ep, f, p);

  json mems = json::array();
  for (size_t j = 0; j < n; ++j)
    mems.push_back({{"id", j}, {"address", c.memnodes()[j].address}, {"nodes", p.elems[j].size()},
                    {"bytes_used", p.used[j]}, {"region_bytes", hs[j].region_size}});
  const auto& k = ep->counters();
  json r = {{"mode", "shine"},
          {"kind", "import"},
          {"source", f.path()},
          {"source_format", "hnswlib-0.6"},
          {"file_bytes", f.file_bytes()},
          {"provider", fabric::provider_name(c.provider())},
          {"nodes", f.count()},
          {"dim", f.dim()},
          {"m", f.m()},
          {"ef_construction", f.ef_construction()},
          {"metric", std::string(to_string(o.metric))},
          {"seed", o.seed},
          {"max_level", f.max_level()},
          {"record_bytes", rw.bytes},
          {"record_writes", rw.writes},
          {"record_doorbells", rw.doorbells},
          {"write_seconds", rw.seconds},
          {"bytes_written", k.bytes_written},
          {"ops", k.total_ops()},
          {"doorbells", k.doorbells},
          {"memnode_usage", mems}};
  if (codes.q)  // build's fields, and what the import wrote
    r["codes"] = {{"kind", codes.q->spec().to_string()}, {"code_size", codes.q->code_size()},
                  {"log_capacity", got.codes_log.capacity}, {"block_bytes", got.codes_block_bytes},
                  {"train_rows", codes.train_rows}, {"train_seconds", codes.train_seconds},
                  {"entries", cw.entries}, {"dropped", cw.dropped}, {"write_seconds", cw.seconds}};
  return r;
}

}  // namespace dmhnsw::shine
