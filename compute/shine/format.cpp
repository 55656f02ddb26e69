// The shine index's words in memnode 0's region header: formatting the memnodes for an index
// or attaching to the one they hold (format_or_attach), and the id ceiling (raise_id_ceiling,
// claim_ids). The graph itself is graph.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/presence.hpp"
#include "common/units.hpp"
#include "compute/shine/graph.hpp"
#include "compute/shine/graph_detail.hpp"

namespace dmhnsw::shine {

using fabric::FabricError;
using graph_detail::word_ptr;

void raise_id_ceiling(fabric::Endpoint& ep, uint64_t ceiling) {
  const RemotePtr word(0, mode_word_offset(shine_word::kIdCeiling));
  uint64_t cur = 0;
  ep.read(word, &cur, 8);
  while (cur < ceiling) {
    const uint64_t seen = ep.compare_swap(word, cur, ceiling);
    if (seen == cur) return;
    cur = seen;
  }
}

bool claim_ids(fabric::Endpoint& ep, uint64_t lo, uint64_t hi, uint64_t& ceiling) {
  const RemotePtr word(0, mode_word_offset(shine_word::kIdCeiling));
  ep.read(word, &ceiling, 8);
  while (ceiling <= lo) {
    const uint64_t seen = ep.compare_swap(word, ceiling, hi);
    if (seen == ceiling) return true;
    ceiling = seen;
  }
  return false;
}

IndexAreas plan_areas(uint64_t id_capacity, uint16_t memnodes, uint64_t first, uint64_t codes_block_bytes,
                      CodesLog codes_log) {
  IndexAreas a;
  a.records = first;
  if (id_capacity > 0) {
    a.ids = IdTable::sized_for(id_capacity, memnodes, first);
    a.free = FreeTable::sized_for(id_capacity, memnodes, first + (a.ids.bytes_per_memnode() + 63) / 64 * 64);
    a.reuse_log.offset = a.free.offset + a.free.bytes_per_memnode();
    a.reuse_log.capacity = ReuseLog::kDefaultEntries;
    a.records = a.reuse_log.offset + a.reuse_log.bytes();
  }
  if (codes_block_bytes > 0) {
    a.codes_block = a.records;
    a.codes_block_bytes = codes_block_bytes;
    a.codes_log = codes_log;
    a.codes_log.offset = a.codes_block + (codes_block_bytes + 63) / 64 * 64;
    a.records = a.codes_log.offset + a.codes_log.bytes();
  }
  return a;
}

uint64_t estimate_record_bytes(uint32_t dim, uint32_t m, uint64_t nodes) {
  // Levels are drawn as hnswlib draws them: a node reaches level l with probability M^-l, so
  // it holds 1 / (M - 1) upper lists on average.
  const NodeLayout l(dim, m);
  const double per_node = static_cast<double>(l.node_bytes(0)) + static_cast<double>(l.list_bytes(1)) / (m - 1.0);
  return static_cast<uint64_t>(std::ceil(per_node * static_cast<double>(nodes)));
}

void check_room_for_build(fabric::Cluster& c, const GraphParams& p, uint64_t rows) {
  const auto n = static_cast<uint16_t>(c.memnodes().size());
  std::vector<RegionHeader> hs;
  uint64_t first = 0;
  for (const auto& mn : c.memnodes()) {
    hs.push_back(header_from_blob(mn.header, "memnode " + std::to_string(mn.id) + " (" + mn.address + ")"));
    if (hs.back().mode != static_cast<uint8_t>(Mode::None)) return;  // attaching: format_or_attach says what holds
    first = std::max(first, (hs.back().data_offset + 63) / 64 * 64);
  }
  CodesLog log;
  if (p.codes) log = {0, std::max<uint64_t>(p.codes_capacity, 1), static_cast<uint32_t>(p.codes->code_size())};
  const uint64_t block = p.codes ? p.codes->serialize().size() : 0;
  const IndexAreas areas = plan_areas(p.id_capacity, n, first, block, log);
  // Each node goes to a memnode drawn at random: a share plus three standard deviations.
  const double share = static_cast<double>(rows) / n;
  const auto nodes = static_cast<uint64_t>(std::ceil(share + 3.0 * std::sqrt(share)));
  const uint64_t records = estimate_record_bytes(p.dim, p.m, nodes);
  const uint64_t areas_bytes = areas.records - first;
  for (uint16_t i = 0; i < n; ++i) {
    const RegionHeader& h = hs[i];
    const uint64_t need = areas.records + records;
    const bool board_fits = i != 0 || h.scratch_size >= std::min<uint64_t>(64u << 20, kMinUsefulRegionBytes / 4);
    if (need <= h.region_size && board_fits) continue;
    // The header page, a scratch area of up to 64 MiB, then the index's areas and records.
    const uint64_t whole = kHeaderPageBytes + (64ull << 20) + areas_bytes + records;
    throw std::invalid_argument(
        "build: memnode " + std::to_string(i) + " (" + c.memnodes()[i].address + ") has a region of " +
        format_bytes(h.region_size) + "; this index (" + std::to_string(rows) + " vectors of dimension " +
        std::to_string(p.dim) + ", M " + std::to_string(p.m) + ", over " + std::to_string(n) +
        " memnode(s)) needs about " + format_bytes(whole) + " on each: node records " + format_bytes(records) +
        ", id index, free stacks and codes " + format_bytes(areas_bytes) + ", scratch up to 64 MiB. Start the "
        "memnodes with --region " + suggested_region(whole) + " (or use more memnodes; docs/operations.md, "
        "\"Sizing regions\"). Nothing was written.");
  }
}

namespace {

/// This computenode won the format word: every memnode gets mode, dimension, metric and a bump
/// pointer at its data area, after the id index's share when there is one (at one offset on
/// every memnode); then the word says formatted.
void format_regions(fabric::Cluster& c, fabric::Endpoint& ep, const GraphParams& wanted, int64_t self) {
  const auto n = c.memnodes().size();
  auto read_header = [&](uint16_t i) { return read_live_header(c, ep, i); };
  IndexAreas areas;
  const std::vector<char> block = wanted.codes ? wanted.codes->serialize() : std::vector<char>{};
  if (wanted.id_capacity > 0 || !block.empty()) {
    uint64_t at = 0;
    for (uint16_t i = 0; i < n; ++i) at = std::max(at, (read_header(i).data_offset + 63) / 64 * 64);
    CodesLog log;
    if (wanted.codes) log = {0, std::max<uint64_t>(wanted.codes_capacity, 1), static_cast<uint32_t>(wanted.codes->code_size())};
    areas = plan_areas(wanted.id_capacity, static_cast<uint16_t>(n), at, block.size(), log);
  }
  const IdTable& ids = areas.ids;
  for (uint16_t i = 0; i < n; ++i) {
    RegionHeader h = read_header(i);
    if (h.mode != static_cast<uint8_t>(Mode::None))
      throw FabricError("memnode " + std::to_string(i) + " already holds an index; memnode 0 does not");
    h.mode = static_cast<uint8_t>(Mode::Shine);
    h.metric = static_cast<uint8_t>(wanted.metric == Metric::L2 ? MetricCode::L2 : MetricCode::IP);
    h.elem_type = static_cast<uint8_t>(ElemType::F32);
    h.dim = wanted.dim;
    h.memnode_count = static_cast<uint16_t>(n);
    const bool areas_first = ids.buckets > 0 || !block.empty();
    h.mode_words[shine_word::kBump] = areas_first ? areas.records : (h.data_offset + 63) / 64 * 64;
    if (areas_first && h.mode_words[shine_word::kBump] >= h.region_size)
      throw FabricError("memnode " + std::to_string(i) + " (" + c.memnodes()[i].address + "): its share of the id " +
                        "index (" + std::to_string(wanted.id_capacity) + " ids) and codes log (" +
                        std::to_string(areas.codes_log.capacity) + " entries), " +
                        std::to_string(h.mode_words[shine_word::kBump] - (h.data_offset + 63) / 64 * 64) +
                        " bytes, does not fit its " + std::to_string(h.region_size) + "-byte region");
    if (!block.empty()) {
      h.mode_words[shine_word::kCodes] = areas.codes_block;
      h.mode_words[shine_word::kCodesBytes] = areas.codes_block_bytes;
      h.mode_words[shine_word::kCodesLog] = areas.codes_log.offset;
      h.mode_words[shine_word::kCodesLogCap] = areas.codes_log.capacity;
      if (i == 0) ep.write(RemotePtr(0, areas.codes_block), block.data(), block.size());
    }
    if (ids.buckets > 0) {
      h.mode_words[shine_word::kIdTable] = ids.offset;
      h.mode_words[shine_word::kIdBuckets] = ids.buckets;
      h.mode_words[shine_word::kFreeList] = areas.free.offset;
      h.mode_words[shine_word::kFreeCap] = areas.free.capacity;
      h.mode_words[shine_word::kReuseLog] = areas.reuse_log.offset;
      h.mode_words[shine_word::kReuseLogCap] = areas.reuse_log.capacity;
    }
    h.mode_words[shine_word::kM] = wanted.m;
    h.mode_words[shine_word::kEfConstruction] = wanted.ef_construction;
    h.mode_words[shine_word::kSeed] = wanted.seed;
    h.mode_words[shine_word::kFormat] = i == 0 ? shine_word::formatting_by(self) : shine_word::kFormatted;
    ep.write(RemotePtr(i, 0), &h, sizeof h);
  }
  // Others COMPARE_SWAP this word: the end of formatting is one too.
  if (const uint64_t was = ep.compare_swap(word_ptr(shine_word::kFormat), shine_word::formatting_by(self),
                                           shine_word::kFormatted);
      was != shine_word::formatting_by(self))
    throw FabricError("memnode 0: the shine format word changed to " + std::to_string(was) +
                      " while this computenode formatted");
}

/// Another computenode formats: waits for it (bounded), failing at once if memnode 0 no longer
/// has a control connection from the formatter (it died or was dropped mid-format).
void wait_formatted(fabric::Cluster& c, fabric::Endpoint& ep, uint64_t state, const GraphParams* wanted) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto next_presence = std::chrono::steady_clock::now();
  while (state != shine_word::kFormatted) {
    if (state == 0 && wanted == nullptr) throw FabricError("no shine index on the memnodes: run `computenode build` first");
    if (std::chrono::steady_clock::now() > deadline)
      throw FabricError("memnode 0: index still being formatted by another computenode after 30 s");
    const uint64_t f = state >> 32;
    if (f != 0 && f - 1 < kPresenceIds && std::chrono::steady_clock::now() >= next_presence) {
      next_presence = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
      uint64_t open = 0;
      ep.read(RemotePtr(0, kPresenceOffset + offsetof(Presence, connected) + 8 * (f - 1)), &open, 8);
      if (open == 0)
        throw FabricError("computenode " + std::to_string(f - 1) + " left while formatting the shine index: memnode 0 (" +
                          c.memnodes()[0].address + ") has no control connection from it; the region is half " +
                          "formatted: restart the memnodes");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // bounded wait on a peer's format
    ep.read(word_ptr(shine_word::kFormat), &state, 8);
  }
}

/// The index's parameters and areas from memnode 0's header, each area checked to lie in the
/// region's data area.
GraphParams params_from_header(const RegionHeader& h0, size_t n) {
  GraphParams p;
  p.dim = h0.dim;
  p.m = static_cast<uint32_t>(h0.mode_words[shine_word::kM]);
  p.ef_construction = static_cast<uint32_t>(h0.mode_words[shine_word::kEfConstruction]);
  p.metric = h0.metric == static_cast<uint8_t>(MetricCode::IP) ? Metric::IP : Metric::L2;
  p.seed = h0.mode_words[shine_word::kSeed];
  p.ids.memnodes = static_cast<uint16_t>(n);
  p.ids.offset = h0.mode_words[shine_word::kIdTable];
  p.ids.buckets = h0.mode_words[shine_word::kIdBuckets];
  if (p.ids.buckets > 0 && (p.ids.offset < h0.data_offset || p.ids.offset % 8 != 0 ||
                            p.ids.offset + p.ids.bytes_per_memnode() > h0.region_size))
    throw FabricError("memnode 0: the id index words at region offset " +
                      std::to_string(mode_word_offset(shine_word::kIdTable)) + " say " + std::to_string(p.ids.buckets) +
                      " buckets at offset " + std::to_string(p.ids.offset) + ", outside the " +
                      std::to_string(h0.region_size) + "-byte region's data area (a corrupted region header?)");
  p.free.memnodes = static_cast<uint16_t>(n);
  p.free.offset = h0.mode_words[shine_word::kFreeList];
  p.free.capacity = p.free.offset == 0 ? 0 : h0.mode_words[shine_word::kFreeCap];
  if (p.free.capacity > 0 && (p.ids.buckets == 0 || p.free.offset < h0.data_offset || p.free.offset % 8 != 0 ||
                              p.free.capacity > h0.region_size / 8 ||
                              p.free.offset + p.free.bytes_per_memnode() > h0.region_size))
    throw FabricError("memnode 0: the free stack words at region offset " +
                      std::to_string(mode_word_offset(shine_word::kFreeList)) + " say " +
                      std::to_string(p.free.capacity) + " slots at offset " + std::to_string(p.free.offset) +
                      ", outside the " + std::to_string(h0.region_size) +
                      "-byte region's data area (a corrupted region header?)");
  p.reuse_log.offset = h0.mode_words[shine_word::kReuseLog];
  p.reuse_log.capacity = p.reuse_log.offset == 0 ? 0 : h0.mode_words[shine_word::kReuseLogCap];
  if (p.reuse_log.capacity > 0 && (p.free.capacity == 0 || p.reuse_log.offset < h0.data_offset ||
                                   p.reuse_log.offset % 8 != 0 || p.reuse_log.capacity > h0.region_size / 16 ||
                                   p.reuse_log.offset + p.reuse_log.bytes() > h0.region_size))
    throw FabricError("memnode 0: the reuse log words at region offset " +
                      std::to_string(mode_word_offset(shine_word::kReuseLog)) + " say " +
                      std::to_string(p.reuse_log.capacity) + " entries at offset " +
                      std::to_string(p.reuse_log.offset) + ", outside the " + std::to_string(h0.region_size) +
                      "-byte region's data area (a corrupted region header?)");
  if (p.ids.buckets > 0) {
    p.records = p.ids.offset + (p.ids.bytes_per_memnode() + 63) / 64 * 64;
    if (p.free.capacity > 0) p.records = p.free.offset + p.free.bytes_per_memnode();
    if (p.reuse_log.capacity > 0) p.records = p.reuse_log.offset + p.reuse_log.bytes();
  }
  // Records reused with no log to tell the node caches about it: none are.
  if (p.reuse_log.capacity == 0) p.free.capacity = 0;
  p.codes_block = h0.mode_words[shine_word::kCodes];
  p.codes_block_bytes = p.codes_block == 0 ? 0 : h0.mode_words[shine_word::kCodesBytes];
  p.codes_log.offset = h0.mode_words[shine_word::kCodesLog];
  p.codes_log.capacity = p.codes_block_bytes == 0 ? 0 : h0.mode_words[shine_word::kCodesLogCap];
  if (p.codes_block_bytes > 0 &&
      (p.codes_block < h0.data_offset || p.codes_block_bytes > compute::kMaxCodesBlock ||
       p.codes_block + p.codes_block_bytes > h0.region_size || p.codes_log.offset < p.codes_block + p.codes_block_bytes ||
       p.codes_log.offset % 8 != 0 || p.codes_log.capacity > h0.region_size / 16 ||
       p.codes_log.offset + 16 * p.codes_log.capacity > h0.region_size))
    throw FabricError("memnode 0: the codes words at region offset " + std::to_string(mode_word_offset(shine_word::kCodes)) +
                      " say a block of " + std::to_string(p.codes_block_bytes) + " bytes at offset " +
                      std::to_string(p.codes_block) + " and a log of " + std::to_string(p.codes_log.capacity) +
                      " entries at offset " + std::to_string(p.codes_log.offset) + ", outside the " +
                      std::to_string(h0.region_size) + "-byte region's data area (a corrupted region header?)");
  if (h0.memnode_count != n)
    throw FabricError("the index was formatted over " + std::to_string(h0.memnode_count) + " memnodes, --memnodes names " +
                      std::to_string(n));
  return p;
}

/// The quantizer from memnode 0's codes block; the codes log's entries are sized by it, and the
/// node records start after the log.
void load_codes(fabric::Endpoint& ep, GraphParams& p, uint64_t region_size) {
  std::vector<char> block(p.codes_block_bytes);
  ep.read(RemotePtr(0, p.codes_block), block.data(), block.size());
  p.codes = compute::Quantizer::load(block.data(), block.size(), "memnode 0", p.codes_block);
  if (p.codes->dim() != p.dim || p.codes->metric() != p.metric)
    throw FabricError("memnode 0: the codes block at offset " + std::to_string(p.codes_block) + " is for dimension " +
                      std::to_string(p.codes->dim()) + ", the index has " + std::to_string(p.dim));
  p.codes_log.code_size = static_cast<uint32_t>(p.codes->code_size());
  p.records = p.codes_log.offset + p.codes_log.bytes();
  if (p.records > region_size)  // the words were checked with the smallest entry; now the real one
    throw FabricError("memnode 0: the codes log words at region offset " +
                      std::to_string(mode_word_offset(shine_word::kCodesLog)) + " say " +
                      std::to_string(p.codes_log.capacity) + " entries of " + std::to_string(p.codes_log.entry_bytes()) +
                      " bytes at offset " + std::to_string(p.codes_log.offset) + ", past the " +
                      std::to_string(region_size) + "-byte region (a corrupted region header?)");
}

/// A run that builds or inserts must match the index it attaches to.
void check_wanted(const GraphParams& p, const GraphParams& want) {
  auto mismatch = [](const std::string& what, uint64_t have, uint64_t asked) {
    return FabricError("the shine index on the memnodes has " + what + " " + std::to_string(have) + ", this run asks for " +
                       std::to_string(asked));
  };
  if (p.dim != want.dim) throw mismatch("dimension", p.dim, want.dim);
  if (p.m != want.m) throw mismatch("--m", p.m, want.m);
  if (p.ef_construction != want.ef_construction)
    throw mismatch("--ef-construction", p.ef_construction, want.ef_construction);
  if (want.id_capacity > 0 && p.ids.buckets == 0)
    throw FabricError("the shine index on the memnodes has no id index; this run asks for one (--id-capacity " +
                      std::to_string(want.id_capacity) + ")");
  if (want.codes && !p.codes)
    throw FabricError("the shine index on the memnodes has no codes; this run asks for --codes " +
                      want.codes->spec().to_string());
  if (p.metric != want.metric)
    throw FabricError("the shine index on the memnodes uses metric " + std::string(to_string(p.metric)) +
                      ", this run asks for " + std::string(to_string(want.metric)));
}

}  // namespace

GraphParams format_or_attach(fabric::Cluster& c, fabric::Endpoint& ep, const GraphParams* wanted, int64_t self) {
  const RegionHeader h0 = read_live_header(c, ep, 0);
  if (h0.mode != static_cast<uint8_t>(Mode::None) && h0.mode != static_cast<uint8_t>(Mode::Shine))
    throw FabricError("memnode 0 holds a " + std::string(fabric::mode_name(static_cast<Mode>(h0.mode))) +
                      " index, not shine");
  uint64_t state = h0.mode_words[shine_word::kFormat];
  if (state == 0 && wanted != nullptr &&
      ep.compare_swap(word_ptr(shine_word::kFormat), 0, shine_word::formatting_by(self)) == 0) {
    format_regions(c, ep, *wanted, self);
    state = shine_word::kFormatted;
  }
  // A word no formatter writes is corruption, not a format in progress: no reason to wait.
  if (state != 0 && !shine_word::is_formatting(state) && state != shine_word::kFormatted)
    throw FabricError("memnode 0: shine format word " + std::to_string(state) + " at region offset " +
                      std::to_string(mode_word_offset(shine_word::kFormat)) + " is none of 0, " +
                      std::to_string(shine_word::kFormatting) + " (+ a formatter id), " +
                      std::to_string(shine_word::kFormatted) + " (a corrupted region header?)");
  if (state != shine_word::kFormatted) wait_formatted(c, ep, state, wanted);
  const RegionHeader h = read_live_header(c, ep, 0);
  GraphParams p = params_from_header(h, c.memnodes().size());
  if (p.codes_block_bytes > 0) load_codes(ep, p, h.region_size);
  if (wanted != nullptr) check_wanted(p, *wanted);
  return p;
}

}  // namespace dmhnsw::shine
