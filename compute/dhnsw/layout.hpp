#pragma once
// d-HNSW region layout (docs/formats.md "d-HNSW regions"; paper section 4.2, Figure 7).
//
// Every memnode's region:
//
//   [RegionHeader page][metadata block][group][group]...[scratch]
//
// (the metadata block at kMetadataOffset = 4096, the scratch area of kScratchBytes after the
// last group, at RegionHeader mode word dhnsw_word::kDataEnd; see RegionPlan.)
//
// The metadata block is the same on every memnode (a computenode reads it from memnode 0):
//
//   [MetaHeader, 128 B][SubDesc x num_subs, 256 B each][serialized meta-HNSW (Faiss)]
//
// A group holds two sub-HNSWs: the first (slot 0) at the group's start, growing forward; the
// second (slot 1) at the group's end, growing backward; between them the shared overflow gap.
// The first's overflow grows from the gap's start upwards, the second's from the gap's end
// downwards, so a sub-HNSW and the part of the gap it uses are always one contiguous range
// (fetch_range). Groups are placed on memnodes round-robin (group g on memnode g % N); a
// group holds subs 2g and 2g+1 (the last group holds one sub when their number is odd).
//
// Inside a sub-HNSW block the six arrays follow each other, each followed by an internal gap
// (default 10 % of the array) so it can grow in place:
//
//   levels   int32  x count              (Faiss HNSW::levels: levels a node is in, >= 1)
//   offsets  uint64 x (count + 1)        (Faiss HNSW::offsets into neighbors)
//   neighbors int32 x offsets[count]     (Faiss HNSW::neighbors, -1 = empty slot)
//   labels   int64  x count              (global ids)
//   codes    uint8  x code_size x count  (compressed vectors, MetaHeader::code_size; empty
//                                         and without capacity in an index without codes)
//   vectors  float  x dim x count        (IndexFlat codes)
//
// The vectors come last so that a search over codes READs the block up to them (and the
// overflow) and reads only the vectors of the candidates it re-ranks.
//
// The overflow part of a sub-HNSW (used by in-place inserts once an internal gap is full) is
// a sequence of records, each an OverflowRecord header followed by `bytes` of elements that
// extend array `array`. Offsets in ArraySlot are relative to the block start; every other
// offset is a byte offset into the region. All integers little-endian.
//
// Overflow records, precisely. A record occupies overflow_record_bytes(bytes) =
// round_up(16 + bytes, kAlign) bytes: the 16-byte header, the payload, zero padding; so every
// record starts kAlign-aligned and SubDesc::overflow_used (the sum of the sub's record sizes)
// is a multiple of kAlign. `bytes` is a multiple of the array's element size (element_bytes:
// 4 for levels and neighbours, 8 for offsets and labels, code_size for codes, 4 * dim for
// vectors). The used part
// of the gap is [overflow_offset, overflow_offset + overflow_used) for slot 0 (right after
// its block) and [block_offset - overflow_used, block_offset) for slot 1 (right before its
// block). Readers always parse the records in increasing address order, from the start of
// the used part to its end (they must tile it exactly). Records are written in time order
// away from the block: slot 0 appends each new record at the end of its used part (so
// address order is time order), slot 1 puts each new record in front of its used part
// (next_overflow_record_offset; so address order is reverse time order). An array's
// elements are, in order: its internal [offset, offset + used) bytes, then the payloads of
// its records in time order, i.e. in address order for slot 0 and in reverse address order
// for slot 1. SubDesc::count is the vector count including the vectors held in overflow
// records.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/id_table.hpp"

namespace dmhnsw::dhnsw {

inline constexpr char kMetaMagic[8] = {'D', 'M', 'H', 'D', 'H', 'N', 'S', 'W'};
// 4: boundary copies (MetaHeader::max_copies > 1), which a reader of version 3 would not delete;
// 3: the codes array and block (2: live descriptors). An index without copies is written as 3.
inline constexpr uint32_t kMetaFormatVersion = 4;
inline constexpr uint32_t kMetaFormatVersionNoCopies = 3;
inline constexpr uint32_t kMaxCopies = 8;  // partitions a vector may be in (boundary copies)
inline constexpr uint64_t kAlign = 64;  // every block, array and gap starts 64-byte aligned

// In address order inside a block.
enum Array : uint32_t { kLevels = 0, kOffsets = 1, kNeighbors = 2, kLabels = 3, kCodes = 4, kVectors = 5 };
inline constexpr uint32_t kNumArrays = 6;
const char* array_name(uint32_t a);

struct MetaHeader {
  char magic[8];              // kMetaMagic
  uint32_t version;           // kMetaFormatVersion
  uint32_t num_subs;          // P
  uint32_t dim;
  uint8_t metric;             // MetricCode (common/region.hpp)
  uint8_t reserved0[3];
  uint32_t num_memnodes;
  uint32_t m;                 // HNSW M of the sub-HNSWs
  uint32_t ef_construction;   // of the sub-HNSWs
  uint32_t meta_m;            // HNSW M of the meta-HNSW
  uint64_t num_vectors;       // sum of the subs' counts at build time
  uint64_t block_bytes;       // the whole metadata block: header, table, meta-HNSW
  uint64_t sub_table_offset;  // from the block start
  uint64_t meta_index_offset; // from the block start
  uint64_t meta_index_bytes;
  uint64_t epoch;             // build epoch (rebuilds bump it)
  uint64_t internal_gap_ppm;  // internal gap share, parts per million of each array
  uint64_t overflow_gap_ppm;  // shared gap share, parts per million of the group's two blocks
  uint64_t metadata_offset;   // region offset of this block, the same on every memnode (epochs move it)
  uint64_t id_buckets;        // buckets of the epoch's id index (id_table()); 0: the index has none
  uint64_t checksum;          // metadata_checksum(): checksum64 (common/checksum.hpp) of the block with this field 0
  uint32_t code_size;         // bytes per vector of the codes arrays; 0: the index has no codes
  uint32_t reserved1;
  uint64_t codes_offset;      // the quantizer's block (compute/codes.hpp) from the block start (0: none)
  uint64_t codes_bytes;
  /// Boundary copies (compute/dhnsw/build.hpp): a vector is also in each other partition whose
  /// centroid is within `boundary_ratio_ppm` / 1e6 of its nearest centroid's distance, in at most
  /// `max_copies` partitions in all. 0 / 0 (or max_copies 1): none.
  uint32_t max_copies;
  uint32_t boundary_ratio_ppm;
  uint64_t reserved2[4];
};
static_assert(std::is_trivially_copyable_v<MetaHeader> && std::is_standard_layout_v<MetaHeader>);
static_assert(sizeof(MetaHeader) == 192);
static_assert(offsetof(MetaHeader, version) == 8);
static_assert(offsetof(MetaHeader, num_subs) == 12);
static_assert(offsetof(MetaHeader, dim) == 16);
static_assert(offsetof(MetaHeader, metric) == 20);
static_assert(offsetof(MetaHeader, num_memnodes) == 24);
static_assert(offsetof(MetaHeader, num_vectors) == 40);
static_assert(offsetof(MetaHeader, block_bytes) == 48);
static_assert(offsetof(MetaHeader, sub_table_offset) == 56);
static_assert(offsetof(MetaHeader, meta_index_offset) == 64);
static_assert(offsetof(MetaHeader, meta_index_bytes) == 72);
static_assert(offsetof(MetaHeader, epoch) == 80);
static_assert(offsetof(MetaHeader, metadata_offset) == 104);
static_assert(offsetof(MetaHeader, id_buckets) == 112);
static_assert(offsetof(MetaHeader, checksum) == 120);
static_assert(offsetof(MetaHeader, code_size) == 128);
static_assert(offsetof(MetaHeader, codes_offset) == 136);
static_assert(offsetof(MetaHeader, codes_bytes) == 144);
static_assert(offsetof(MetaHeader, max_copies) == 152);
static_assert(offsetof(MetaHeader, boundary_ratio_ppm) == 156);

/// One array of a sub-HNSW: [offset, offset + used) holds elements, [offset + used,
/// offset + capacity) is its internal gap. Offsets relative to the block start.
struct ArraySlot {
  uint64_t offset;
  uint64_t used;      // bytes
  uint64_t capacity;  // bytes, >= used
};
static_assert(std::is_trivially_copyable_v<ArraySlot> && sizeof(ArraySlot) == 24);

struct SubDesc {
  uint32_t id;               // partition id, 0..P-1
  uint16_t memnode;          // memnode holding its group
  uint8_t slot;              // 0: group start, grows forward; 1: group end, grows backward
  uint8_t reserved0;
  uint32_t group;
  uint32_t partner;          // the other sub of the group, or kNoPartner
  uint64_t count;            // vectors
  int32_t entry_point;       // Faiss HNSW::entry_point (-1 when empty)
  int32_t max_level;         // Faiss HNSW::max_level
  uint64_t block_offset;     // region offset of the block
  uint64_t block_bytes;      // sum of the array capacities
  ArraySlot arrays[kNumArrays];
  uint64_t group_offset;     // region offset of the group
  uint64_t group_bytes;
  uint64_t overflow_offset;  // region offset of the group's shared gap
  uint64_t overflow_bytes;   // its size (shared with the partner)
  uint64_t overflow_used;    // bytes of the gap this sub uses, from its side
  uint64_t version;          // seqlock: odd while an in-place commit is in flight, +2 per commit
  uint64_t lock;             // group lock (slot-0 sub only): 0 free, else lock_word(owner, ticket)
  uint64_t deleted;          // vectors marked deleted (their label's kDeletedLabel bit), of `count`
};
inline constexpr uint32_t kNoPartner = ~uint32_t{0};
static_assert(std::is_trivially_copyable_v<SubDesc> && std::is_standard_layout_v<SubDesc>);
static_assert(sizeof(SubDesc) == 256);
static_assert(offsetof(SubDesc, memnode) == 4);
static_assert(offsetof(SubDesc, slot) == 6);
static_assert(offsetof(SubDesc, group) == 8);
static_assert(offsetof(SubDesc, count) == 16);
static_assert(offsetof(SubDesc, entry_point) == 24);
static_assert(offsetof(SubDesc, block_offset) == 32);
static_assert(offsetof(SubDesc, arrays) == 48);
static_assert(offsetof(SubDesc, group_offset) == 192);
static_assert(offsetof(SubDesc, overflow_used) == 224);
static_assert(offsetof(SubDesc, version) == 232);
static_assert(offsetof(SubDesc, lock) == 240);
static_assert(offsetof(SubDesc, deleted) == 248);

// Deletes. A deleted vector stays in its sub-HNSW (it keeps guiding searches, as hnswlib's
// markDelete) with the top bit of its label set; searches never return it, a rebuild drops it.
// Ids are 0 .. 2^63 - 1, so a label with the bit set (negative as int64) is never an id.
inline constexpr uint64_t kDeletedLabel = uint64_t{1} << 63;
constexpr bool label_deleted(int64_t label) { return label < 0; }

// The id index (common/id_table.hpp, compute/id_index.hpp) of an epoch: right after its
// metadata block, at the same offset on every memnode; an entry names the 8-byte label entry
// (in a block's labels array or an overflow record) that holds the id. In-place inserts add
// entries, deletes remove them, a rebuild writes the next epoch's table whole.

// Live descriptors. The metadata block is written to every memnode, but the copy of SubDesc i
// on memnode subs[i].memnode (the one holding its group) is the live one: in-place inserts
// change its mutable fields (count, entry_point, max_level, arrays[].used, overflow_used,
// version, lock) and no other copy. The checksum treats those fields as zero, so it stays valid.
// Readers READ the live descriptor before and after fetching a sub (seqlock on `version`);
// writers hold the group lock, in the group's slot-0 descriptor, taken with COMPARE_SWAP.
/// Region offset of the live SubDesc of sub `id` (on memnode subs[id].memnode).
uint64_t live_desc_offset(const MetaHeader& h, uint32_t id);
/// Bytes [kLiveFieldsBegin, kLiveFieldsEnd) of a SubDesc are what a commit publishes (before
/// it makes `version` even again); they include the static fields between them unchanged.
inline constexpr size_t kLiveFieldsBegin = offsetof(SubDesc, count);
inline constexpr size_t kLiveFieldsEnd = offsetof(SubDesc, version);
/// `d` with its mutable fields zeroed (what the checksum covers): the live fields, version, lock
/// and deleted.
SubDesc static_part(const SubDesc& d);
/// The group lock word: owner computenode id + 1 in the top 16 bits, a ticket below (a holder
/// takes a fresh one whenever it renews; a waiter that sees one value for a whole lease takes
/// the lock over).
constexpr uint64_t lock_word(uint32_t owner, uint64_t ticket) {
  return (uint64_t{owner + 1} << 48) | (ticket & ((uint64_t{1} << 48) - 1)) | (ticket == 0 ? 1 : 0);
}
constexpr uint32_t lock_owner(uint64_t word) { return static_cast<uint32_t>(word >> 48) - 1; }

/// Header of one record in a sub-HNSW's overflow part.
struct OverflowRecord {
  uint32_t array;     // Array the bytes extend
  uint32_t reserved;  // 0
  uint64_t bytes;     // payload bytes that follow (a multiple of the array's element size;
                      // the record is padded to overflow_record_bytes(bytes), see the top)
};
static_assert(std::is_trivially_copyable_v<OverflowRecord> && sizeof(OverflowRecord) == 16);

/// Gap shares of the layout.
struct LayoutParams {
  double internal_gap = 0.10;  // of each array
  double overflow_gap = 0.10;  // of the two blocks of a group
};

/// What a sub-HNSW holds, i.e. the used bytes of its arrays.
struct SubShape {
  uint64_t count = 0;             // vectors
  uint64_t neighbor_entries = 0;  // int32 entries of the neighbors array (Faiss offsets[count])
  uint32_t dim = 0;
  uint32_t code_size = 0;  // 0: no codes
};
/// Used bytes of each array for `s`.
void array_bytes(const SubShape& s, uint64_t out[kNumArrays]);

/// Array slots of one block: each array's capacity is its used bytes plus the internal gap,
/// rounded up to kAlign (an empty array still gets kAlign bytes, but the codes array of an
/// index without codes none); returns the block size.
uint64_t plan_arrays(const SubShape& s, const LayoutParams& p, ArraySlot out[kNumArrays]);

/// The metadata block starts right after the header page (RegionHeader::data_offset); the
/// groups follow it. The scratch area (self-tests, the coordination board) comes AFTER the
/// last group, kScratchBytes long, so a region image (which holds bytes [0, data end),
/// RegionHeader mode word dhnsw_word::kDataEnd) carries no scratch bytes:
///   [header page][metadata block][groups][scratch, kScratchBytes]
/// RegionPlan::region_bytes includes the scratch area; RegionPlan::data_end is per memnode.
inline constexpr uint64_t kScratchBytes = 64ull << 20;
inline constexpr uint64_t kMetadataOffset = 4096;

/// The layout of a whole index: sub descriptors (with memnode, group and offsets filled in)
/// and, per memnode, the region size it needs. The metadata block starts at kMetadataOffset
/// in every region; its size covers the header, the table and `meta_index_bytes`, rounded up
/// to kAlign; groups follow it, kAlign-aligned; then the scratch area. plan_region leaves
/// SubDesc::entry_point and max_level at -1 (the builder copies them from the sub-HNSWs) and
/// overflow_used and version at 0.
struct RegionPlan {
  std::vector<SubDesc> subs;
  std::vector<uint64_t> region_bytes;  // per memnode: data end + kScratchBytes
  std::vector<uint64_t> data_end;      // per memnode: end of its last group (4096-aligned) = scratch offset
  uint64_t metadata_offset = 0;        // region offset of the metadata block (every memnode)
  uint64_t metadata_bytes = 0;
  uint64_t id_buckets = 0;             // the id index right after the metadata block (0: none)
};
/// `base`: region offset of the metadata block (4096-aligned, at least kMetadataOffset); an
/// online rebuild lays the next epoch out in a free part of the regions.
/// `id_capacity` > 0: room for an id index of that many ids between the metadata block and the
/// groups (IdTable::sized_for).
/// `codes_bytes`: the quantizer's block in the metadata block (0: no codes).
RegionPlan plan_region(std::span<const SubShape> subs, uint32_t num_memnodes, uint64_t meta_index_bytes,
                       const LayoutParams& p, uint64_t base = kMetadataOffset, uint64_t id_capacity = 0,
                       uint64_t codes_bytes = 0);
/// The id index of the epoch whose metadata header is `h` (buckets 0 when it has none): after
/// the metadata block, kAlign-aligned.
IdTable id_table(const MetaHeader& h);

/// Region bytes [offset, offset + length) to READ to get sub `d` with the overflow it uses.
std::pair<uint64_t, uint64_t> fetch_range(const SubDesc& d);
/// The parts of fetch_range(d) a search over codes READs: all of it but the vectors array's
/// internal part (the overflow's vector records are read: they are small and interleaved).
/// Each pair is (offset in the fetch range, length).
std::vector<std::pair<uint64_t, uint64_t>> coded_fetch_parts(const SubDesc& d);
/// Where sub `d`'s block starts inside a buffer holding fetch_range(d).
uint64_t block_offset_in_fetch(const SubDesc& d);
/// Free bytes of the shared gap of a group whose subs are `a` and `b` (b may be null).
uint64_t overflow_free(const SubDesc& a, const SubDesc* b);

/// round_up(v, a) for a power of two a.
constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }
/// Size of one element of array `a` for dimension `dim` (levels 4, offsets 8, neighbors 4,
/// labels 8, codes `code_size`, vectors 4 * dim).
uint64_t element_bytes(uint32_t a, uint32_t dim, uint32_t code_size);
/// Bytes an overflow record with `payload` bytes occupies: round_up(16 + payload, kAlign).
constexpr uint64_t overflow_record_bytes(uint64_t payload) {
  return align_up(sizeof(OverflowRecord) + payload, kAlign);
}
/// Region offset where the next overflow record of sub `d`, `record_bytes` long
/// (overflow_record_bytes), goes: right after the used part for slot 0, right before it for
/// slot 1. The caller checks overflow_free() first.
uint64_t next_overflow_record_offset(const SubDesc& d, uint64_t record_bytes);

/// Bounds checks of a metadata block read from a region of `region_size` bytes held by
/// memnode `memnode` (or any memnode when kAnyMemnode): magic, version, sizes, the table and
/// the meta-HNSW inside the block, every block, array and gap inside its group, groups inside
/// their region (for subs on `memnode`), subs and overflow not overlapping. Throws
/// std::runtime_error naming `what` and the byte offset of the first bad field.
inline constexpr uint32_t kAnyMemnode = ~uint32_t{0};
void validate_metadata(const MetaHeader& h, std::span<const SubDesc> subs, uint64_t region_size, uint32_t memnode,
                       const std::string& what);

/// Size of a metadata block: header, `num_subs` SubDescs, the meta-HNSW, the quantizer's block
/// (8-byte aligned), rounded up to kAlign.
uint64_t metadata_block_bytes(uint32_t num_subs, uint64_t meta_index_bytes, uint64_t codes_bytes = 0);

/// MetaHeader::checksum of a metadata block of `bytes` bytes (the whole block, header
/// included): checksum64 of the block with the checksum field and the mutable fields of every
/// SubDesc (static_part) taken as 0, so in-place commits leave it valid.
uint64_t metadata_checksum(const char* block, size_t bytes);

/// A metadata block ready to be written at kMetadataOffset of every region: `h` with
/// block_bytes, sub_table_offset, meta_index_offset, meta_index_bytes, num_subs and checksum
/// filled in, the table, the meta-HNSW bytes, the quantizer's block `codes` (codes_offset and
/// codes_bytes filled in; h.code_size is the caller's), zero padding to kAlign.
std::vector<char> encode_metadata(const MetaHeader& h, std::span<const SubDesc> subs, const char* meta_index,
                                  uint64_t meta_index_bytes, std::span<const char> codes = {});

/// A parsed metadata block.
struct Metadata {
  MetaHeader header{};
  std::vector<SubDesc> subs;
  std::vector<char> meta_index;  // the serialized meta-HNSW
  std::vector<char> codes;       // the quantizer's block (empty: no codes)
};
/// Checks the header of a metadata block (magic, version, sizes) from its first
/// sizeof(MetaHeader) bytes; returns it (its block_bytes says how much to read for the rest).
MetaHeader check_meta_header(const char* bytes, size_t len, uint64_t region_size, const std::string& what);
/// Parses a whole metadata block read from region offset kMetadataOffset (`len` >= its
/// block_bytes): header, checksum, table, meta-HNSW bytes, then validate_metadata. Throws
/// std::runtime_error naming `what` and the region offset of the first bad field.
Metadata decode_metadata(const char* block, size_t len, uint64_t region_size, uint32_t memnode,
                         const std::string& what);

}  // namespace dmhnsw::dhnsw
