#pragma once
// The region header: the first page of every memory node's region, readable by any compute
// node with one READ. Pinned by static_asserts; it crosses machines and files.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/fabric/bootstrap.hpp"
#include "common/fabric/transport.hpp"

namespace dmhnsw {

using fabric::Mode;

inline constexpr uint64_t kRegionMagic = 0x47'5257'534E'484D'44;  // "DMHNSWRG" little-endian
inline constexpr uint32_t kRegionFormatVersion = 1;
inline constexpr uint64_t kHeaderPageBytes = 4096;
inline constexpr uint64_t kMinRegionBytes = 1u << 20;
/// The smallest region a shine or d-HNSW run can use: a quarter of a fresh region (up to 64 MiB)
/// is its scratch area, and the computenodes' coordination board (compute/board.hpp) needs
/// 32 MiB of memnode 0's. Smaller regions serve self-tests and benchmarks only.
inline constexpr uint64_t kMinUsefulRegionBytes = 128ull << 20;
/// A --region value for an index that needs `need` bytes of a region: `need` with a tenth more,
/// rounded up to 64 MiB, at least kMinUsefulRegionBytes; as a flag value ("192MiB").
std::string suggested_region(uint64_t need);

enum class ElemType : uint8_t { F32 = 0, U8 = 1, I8 = 2 };
enum class MetricCode : uint8_t { L2 = 0, IP = 1 };

struct RegionHeader {
  uint64_t magic;
  uint32_t version;
  uint8_t mode;       // fabric::Mode
  uint8_t metric;     // MetricCode
  uint8_t elem_type;  // ElemType
  uint8_t reserved0;
  uint32_t dim;
  uint16_t memnode_id;
  uint16_t memnode_count;
  uint64_t region_size;
  uint64_t epoch;
  uint64_t scratch_offset;  // area for self-tests and benchmarks
  uint64_t scratch_size;
  uint64_t data_offset;     // first byte of the mode's data area
  uint64_t reserved1[8];
  // Mode-specific words at fixed 8-byte-aligned offsets (index into mode_words).
  uint64_t mode_words[48];
};
static_assert(std::is_trivially_copyable_v<RegionHeader> && std::is_standard_layout_v<RegionHeader>);
static_assert(sizeof(RegionHeader) == fabric::kHeaderBlobBytes);
static_assert(offsetof(RegionHeader, version) == 8);
static_assert(offsetof(RegionHeader, mode) == 12);
static_assert(offsetof(RegionHeader, dim) == 16);
static_assert(offsetof(RegionHeader, memnode_id) == 20);
static_assert(offsetof(RegionHeader, region_size) == 24);
static_assert(offsetof(RegionHeader, epoch) == 32);
static_assert(offsetof(RegionHeader, scratch_offset) == 40);
static_assert(offsetof(RegionHeader, data_offset) == 56);
static_assert(offsetof(RegionHeader, mode_words) == 128);

/// SHINE mode words (indexes into mode_words). The bump pointer is the FETCH_ADD target.
namespace shine_word {
inline constexpr size_t kBump = 0, kEntryPoint = 1, kMaxLevel = 2, kM = 3, kEfConstruction = 4, kNodeCount = 5,
                        kEntryLock = 6, kFormat = 7, kSeed = 8;
/// One past the largest label in the index (0: none recorded), raised with COMPARE_SWAP by
/// every build, insert and import before it writes nodes. The graph has no id index, so this is
/// how `serve` refuses an id the index may already hold: new ids must be at or above it.
inline constexpr size_t kIdCeiling = 9;
/// The id index (compute/id_index.hpp), when the index has one: its offset on every
/// memnode and its bucket count (0: no id index). Written once, when formatting.
inline constexpr size_t kIdTable = 10, kIdBuckets = 11;
/// Memnode 0: deleted nodes (tombstones) in the graph, raised by FETCH_ADD after each delete.
/// Queries read it with the entry point: while it is 0, no node a cache holds can be deleted.
inline constexpr size_t kDeleted = 12;
/// Every memnode: region offset and capacity (slots) of its stack of deleted records kept for
/// reuse (compute/shine/free_list.hpp; capacity 0: none). Written once, when formatting.
inline constexpr size_t kFreeList = 13, kFreeCap = 14;
/// Memnode 0: deleted records reused by inserts (FETCH_ADD per reuse); the graph's deleted
/// nodes are kDeleted - kReused.
inline constexpr size_t kReused = 15;
/// Every memnode (memnode 0's is used): region offset and entries of the reuse log, a ring of
/// 16-byte entries [reuse number + 1, record] that node caches read to drop reused records.
inline constexpr size_t kReuseLog = 16, kReuseLogCap = 17;
/// Compressed vectors (compute/codes.hpp), when the index has them: the codes block (region
/// offset and bytes, 0: none; read from memnode 0) and every memnode's codes log (offset and
/// entries, the same on every memnode; compute/shine/layout.hpp CodesLog), written once when
/// formatting; kCodesLogCount: every memnode's appended entries (FETCH_ADD per insert).
inline constexpr size_t kCodes = 18, kCodesBytes = 19, kCodesLog = 20, kCodesLogCap = 21, kCodesLogCount = 22;
/// Memnode 0: neighbour-list changes other than new records, raised by FETCH_ADD once their list
/// writes are done (an insert into a reused record, each computenode's consolidation). With
/// kNodeCount (raised last by every insert of a new record) it tells a computenode that caches
/// neighbour lists when a list it holds may have changed.
inline constexpr size_t kListChanges = 23;
/// kFormat values: the region is being formatted by one computenode, then ready. While
/// formatting, the high 32 bits hold the formatter's computenode id + 1 (0: not said), so a
/// waiter can tell from memnode 0's presence table that the formatter left.
inline constexpr uint64_t kFormatting = 1, kFormatted = 2;
constexpr bool is_formatting(uint64_t w) { return (w & 0xffffffffu) == kFormatting; }
constexpr uint64_t formatting_by(int64_t cn_id) {
  return kFormatting | (cn_id >= 0 ? static_cast<uint64_t>(cn_id + 1) << 32 : 0);
}
}
/// d-HNSW mode words.
namespace dhnsw_word {
inline constexpr size_t kMetadataOffset = 0, kMetadataSize = 1, kDataEnd = 2;  // kDataEnd: scratch starts here
/// Claimed (COMPARE_SWAP) by the computenode that builds an index online, in an empty region.
inline constexpr size_t kBuildClaim = 3;
}
/// Byte offset of a mode word inside the region (for one-sided atomics on it).
constexpr uint64_t mode_word_offset(size_t i) { return offsetof(RegionHeader, mode_words) + 8 * i; }

/// Fills a fresh header for a region of `size` bytes (mode None; scratch then data area).
RegionHeader make_region_header(uint16_t memnode_id, uint64_t size);
/// Checks magic, version and internal bounds; throws std::runtime_error naming `what`.
void validate_region_header(const RegionHeader& h, const std::string& what);
/// Memnode `m`'s header as it is now (one READ over `ep`; a rebuild or a format changes it after
/// connect), validated; errors name the memnode and its address. Both modes attach with it.
RegionHeader read_live_header(fabric::Cluster& c, fabric::Endpoint& ep, uint16_t m);
RegionHeader header_from_blob(const std::array<char, fabric::kHeaderBlobBytes>& blob, const std::string& what);
std::string describe(const RegionHeader& h);

}  // namespace dmhnsw
