#pragma once
// d-HNSW epochs and the shared insert buffer (paper section 4.5, Figure 10): the control block
// in memnode 0's header page and the layout of the buffer it describes.
//
// Control block: memnode 0, region offset kControlOffset (inside the header page, after the
// RegionHeader). One computenode at a time is the rebuild master (`master`, a lock word taken
// with COMPARE_SWAP, renewed while it works, taken over when it stays unchanged for a lease).
// `phase` says where a rebuild is:
//   kIdle       inserts commit in place into the current epoch;
//   kBuilding   the master re-partitions and rebuilds the index into a shadow area; inserts go
//               to the insert buffer, which every query also searches; deletes mark the live
//               epoch in place until `deletes_closed`, when the master carries the ones its
//               snapshot missed into the shadow (later deletes wait for the epoch to move);
//   kPublished  the new epoch is live (memnode headers and `epoch` switched); the master merges
//               the buffer into it (inserts commit in place again), then empties it.
// The area of the previous epoch is kept (old_base/old_end) until every computenode that is
// alive acknowledged the new epoch in `acks`, so queries in flight never read reused memory.
//
// Insert buffer: on memnode 0, `buckets` buckets of `bucket_capacity` entries, a bucket per
// sign pattern of `lsh_bits` random hyperplanes (lsh_bucket). Each bucket's word in
// bucket_words is state << 48 | count: an inserter FETCH_ADDs 1 and owns the slot if the state
// it got back is kBucketActive, WRITEs the entry, then its commit word (= `generation`): only
// then is the insert acknowledged. A reader takes entries [0, count) whose commit word equals
// the current generation.
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include "common/fabric/rejoin_layout.hpp"
#include "common/write_gate.hpp"
#include "common/fabric/transport.hpp"

namespace dmhnsw::dhnsw {

inline constexpr uint64_t kControlOffset = 2048;  // memnode 0, inside the header page
static_assert(kControlOffset >= kWriteGateEnd);
inline constexpr uint32_t kMaxBuckets = 64;
inline constexpr uint32_t kMaxLshBits = 6;  // hyperplanes: 2^6 sign patterns = kMaxBuckets
static_assert(uint32_t{1} << kMaxLshBits == kMaxBuckets);
inline constexpr uint32_t kMaxAckSlots = 64;    // computenode id % 64

enum Phase : uint64_t { kIdle = 0, kBuilding = 1, kPublished = 2 };
enum BucketState : uint64_t { kBucketIdle = 0, kBucketActive = 1, kBucketMerging = 2 };
constexpr uint64_t bucket_word(uint64_t state, uint64_t count) { return (state << 48) | count; }
constexpr uint64_t bucket_state(uint64_t w) { return w >> 48; }
constexpr uint64_t bucket_count(uint64_t w) { return w & ((uint64_t{1} << 48) - 1); }
/// An ack word: the epoch a computenode uses, and a counter it bumps with every batch (so the
/// master can tell a live computenode from a dead one).
constexpr uint64_t ack_word(uint64_t epoch, uint64_t beat) { return (epoch << 16) | (beat & 0xFFFF); }
constexpr uint64_t ack_epoch(uint64_t w) { return w >> 16; }

struct Control {
  uint64_t master;           // rebuild master's lock word (lock_word, compute/dhnsw/layout.hpp); 0: none
  uint64_t phase;            // Phase
  uint64_t epoch;            // the live epoch (as memnode 0's region header)
  uint64_t generation;       // of the insert buffer: valid entries carry it as their commit word
  uint64_t buffer_offset;    // memnode 0 region offset of the insert buffer (0: none)
  uint64_t buffer_bytes;
  uint32_t buckets;          // 2^lsh_bits
  uint32_t bucket_capacity;  // entries per bucket
  uint32_t entry_bytes;      // buffer_entry_bytes(dim)
  uint32_t lsh_bits;
  uint64_t lsh_seed;
  uint64_t cur_base, cur_end;  // area of the live epoch: [metadata block, end of its last group) on any memnode
  uint64_t old_base, old_end;  // area of the previous epoch until every computenode left it (0, 0: free)
  uint64_t rebuilds;           // completed rebuilds
  uint64_t deletes_closed;     // 1 while the master carries the live epoch's deletes into the shadow
  uint64_t reserved[4];
  uint64_t bucket_words[kMaxBuckets];
  uint64_t acks[kMaxAckSlots];
};
static_assert(std::is_trivially_copyable_v<Control> && std::is_standard_layout_v<Control>);
static_assert(offsetof(Control, phase) == 8);
static_assert(offsetof(Control, generation) == 24);
static_assert(offsetof(Control, buckets) == 48);
static_assert(offsetof(Control, lsh_seed) == 64);
static_assert(offsetof(Control, cur_base) == 72);
static_assert(offsetof(Control, old_base) == 88);
static_assert(offsetof(Control, rebuilds) == 104);
static_assert(offsetof(Control, deletes_closed) == 112);
static_assert(offsetof(Control, bucket_words) == 152);
static_assert(offsetof(Control, acks) == 664);
static_assert(sizeof(Control) == 1176 && kControlOffset + sizeof(Control) <= fabric::kRejoinBlockOffset);  // the rejoin block, then the presence table follow

/// One buffered insert: commit word, id, then the vector; padded to 64 bytes.
struct BufferEntryHeader {
  uint64_t commit;  // == Control::generation once the entry is complete
  int64_t id;
};
static_assert(sizeof(BufferEntryHeader) == 16);
constexpr uint32_t buffer_entry_bytes(uint32_t dim) { return static_cast<uint32_t>((16 + 4ull * dim + 63) / 64 * 64); }
/// Region offset (memnode 0) of entry `i` of bucket `b`.
constexpr uint64_t buffer_entry_offset(const Control& c, uint32_t b, uint64_t i) {
  return c.buffer_offset + (uint64_t{b} * c.bucket_capacity + i) * c.entry_bytes;
}
constexpr uint64_t control_field(size_t off) { return kControlOffset + off; }

/// The bucket of `x` (dim floats): bit i is set when x lies on the positive side of hyperplane
/// i, whose coefficients are drawn from `seed` (the same on every computenode).
uint32_t lsh_bucket(const float* x, uint32_t dim, uint32_t bits, uint64_t seed);

/// A fresh control block for an index whose buffer is [offset, offset + bytes) of memnode 0.
Control make_control(uint64_t epoch, uint64_t area_base, uint64_t area_end, uint64_t buffer_offset,
                     uint64_t buffer_bytes, uint32_t dim);

/// Deletes mark the live epoch in place while it is idle, and while a rebuild builds until its
/// master closes them to carry them into the new epoch (compute/dhnsw/epoch.hpp).
constexpr bool deletes_open(const Control& c) {
  return c.phase == kIdle || (c.phase == kBuilding && c.deletes_closed == 0);
}

// ---- The control block over the fabric (every reader and writer of it goes through these)

/// The word at byte `field` of the control block (offsetof(Control, ...)).
inline RemotePtr control_ptr(size_t field) { return RemotePtr(0, control_field(field)); }
inline RemotePtr bucket_ptr(uint32_t b) { return control_ptr(offsetof(Control, bucket_words) + 8 * size_t{b}); }
inline RemotePtr ack_ptr(uint64_t cn_id) { return control_ptr(offsetof(Control, acks) + 8 * (cn_id % kMaxAckSlots)); }

/// READs memnode 0's control block and checks it (check_control).
Control read_control(fabric::Endpoint& ep);
/// Bounds checks of a control block read from memnode 0 (throws naming it and the offset).
void check_control(const Control& c);
/// WRITEs one word of it. Bucket words are FETCH_ADDed by inserters: those change only by
/// COMPARE_SWAP, never by this.
void write_control_word(fabric::Endpoint& ep, RemotePtr p, uint64_t v);
/// Clears computenode `cn_id`'s ack slot: it leaves, nobody waits for it (best effort).
void leave_epochs(fabric::Endpoint& ep, uint32_t cn_id);

}  // namespace dmhnsw::dhnsw
