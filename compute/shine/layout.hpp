#pragma once
// SHINE node layout in remote memory (docs/formats.md "shine node records", SHINE paper Figure 2).
// One fixed-size record per node, sized by the node's top level:
//
//   [u64 header: magic | generation | level | deleted, lock bits][u64 label][d x f32 vector][pad to 8]
//   level 0:        [u32 count][u32 pad][2M x RemotePtr]
//   each level 1..L: [u32 count][u32 pad][ M x RemotePtr]
//
// The vector part (header + label + vector) and each neighbour list are read on their own.
// All offsets come from NodeLayout; the fixed parts are pinned by static_asserts.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/fabric/remote_ptr.hpp"
#include "common/id_table.hpp"

namespace dmhnsw::shine {

/// Node header word: bits 48..63 magic, bits 16..47 the record's generation (bumped when a
/// deleted node's record is reused for another vector), bits 8..15 level, bit 1 deleted (a
/// tombstone: the node still guides searches but is never returned), bit 0 lock.
struct NodeHeader {
  static constexpr uint64_t kMagic = 0x5E1E;
  static constexpr uint64_t kLockBit = 1, kDeletedBit = 2;
  static constexpr uint64_t make(unsigned level, bool locked = false, bool deleted = false, uint32_t generation = 0) {
    return (kMagic << 48) | (uint64_t{generation} << 16) | (uint64_t{level & 0xff} << 8) | (deleted ? kDeletedBit : 0) |
           (locked ? kLockBit : 0);
  }
  static constexpr bool valid(uint64_t h) { return (h >> 48) == kMagic && (h & 0xfcull) == 0; }
  static constexpr unsigned level(uint64_t h) { return static_cast<unsigned>((h >> 8) & 0xff); }
  static constexpr bool locked(uint64_t h) { return (h & kLockBit) != 0; }
  static constexpr bool deleted(uint64_t h) { return (h & kDeletedBit) != 0; }
  static constexpr uint32_t generation(uint64_t h) { return static_cast<uint32_t>(h >> 16); }
  static constexpr uint64_t unlocked(uint64_t h) { return h & ~kLockBit; }
};
static_assert(NodeHeader::valid(NodeHeader::make(3)) && NodeHeader::valid(NodeHeader::make(3, true, true, 0xffffffff)));
static_assert(NodeHeader::level(NodeHeader::make(7, true, true, 9)) == 7);
static_assert(NodeHeader::generation(NodeHeader::make(7, true, true, 0xfedcba98)) == 0xfedcba98);
static_assert(NodeHeader::deleted(NodeHeader::make(1, false, true)) && !NodeHeader::deleted(NodeHeader::make(1, true)));
static_assert(!NodeHeader::valid(0) && !NodeHeader::valid(NodeHeader::make(1) | 0x10));
// Records written before deletes existed (lock bit only, generation 0) read the same.
static_assert(NodeHeader::make(5, true) == ((uint64_t{0x5E1E} << 48) | (5u << 8) | 1));

/// The fixed front of every node record.
struct NodeFront {
  uint64_t header;
  uint64_t label;  // the application's id (records from before 64-bit ids held 32 bits and a zero word)
  // float vector[d] follows
};
static_assert(sizeof(NodeFront) == 16 && offsetof(NodeFront, label) == 8);
static_assert(std::is_trivially_copyable_v<NodeFront> && std::is_standard_layout_v<NodeFront>);

/// The front of every neighbour list.
struct ListFront {
  uint32_t count;
  uint32_t reserved;
  // RemotePtr neighbours[capacity] follow
};
static_assert(sizeof(ListFront) == 8);

inline constexpr unsigned kMaxLevel = 31;

class NodeLayout {
 public:
  NodeLayout() = default;
  NodeLayout(uint32_t dim, uint32_t m) : dim_(dim), m_(m) {
    if (dim == 0 || dim > 65536) throw std::invalid_argument("shine layout: dimension " + std::to_string(dim) + " out of range");
    if (m < 2 || m > 1024) throw std::invalid_argument("--m " + std::to_string(m) + " out of range (2..1024)");
    vector_part_ = (sizeof(NodeFront) + 4ull * dim + 7) / 8 * 8;
  }
  uint32_t dim() const { return dim_; }
  uint32_t m() const { return m_; }
  /// Neighbour capacity of a level: 2M at level 0, M above.
  uint32_t capacity(unsigned level) const { return level == 0 ? 2 * m_ : m_; }
  /// Bytes of header + label + vector (+ padding): what one vector READ fetches.
  uint64_t vector_part_bytes() const { return vector_part_; }
  uint64_t vector_read_bytes() const { return sizeof(NodeFront) + 4ull * dim_; }
  static constexpr uint64_t vector_offset() { return sizeof(NodeFront); }
  /// Bytes of one neighbour list at `level` (front + capacity pointers).
  uint64_t list_bytes(unsigned level) const { return sizeof(ListFront) + 8ull * capacity(level); }
  uint64_t list_offset(unsigned level) const {
    return level == 0 ? vector_part_ : vector_part_ + list_bytes(0) + (level - 1) * list_bytes(1);
  }
  /// Record size of a node whose top level is `level`: 8 + 4d + 4 + 2M*8 + l*(4 + M*8) in the
  /// paper, here with the counts padded to 8 bytes so every RemotePtr is aligned.
  uint64_t node_bytes(unsigned level) const { return list_offset(level) + list_bytes(level); }

 private:
  uint32_t dim_ = 0, m_ = 0;
  uint64_t vector_part_ = 0;
};

/// Every memnode's codes log (shine_word::kCodesLog..kCodesLogCount): the code of each node
/// written there, appended by the insert that wrote the node (a reused record appends again:
/// the later entry holds). An entry is [u64 node (RemotePtr raw; 0: never written)][u64 label]
/// [code, padded to 8]; slots past the capacity are not written (searches read those nodes'
/// vectors instead).
struct CodesLog {
  uint64_t offset = 0;    // on every memnode
  uint64_t capacity = 0;  // entries per memnode; 0: none
  uint32_t code_size = 0;
  uint64_t entry_bytes() const { return 16 + (uint64_t{code_size} + 7) / 8 * 8; }
  uint64_t bytes() const { return (capacity * entry_bytes() + 63) / 64 * 64; }
  uint64_t entry_offset(uint64_t i) const { return offset + i * entry_bytes(); }
};

}  // namespace dmhnsw::shine
