#pragma once
// The write gate's words in memnode 0's header page (compute/write_gate.hpp has the protocol):
// a snapshot closes the gate, every process that writes to the index holds a slot saying
// whether it may be writing, and the snapshot stores the regions once no live slot is active.
//
//   freeze word: 0 open; else closed by a snapshot: its nonce << 32 | a beat it renews
//   slot i:      0 free; else beat << 1 | active (the holder renews the beat, so a slot that
//                stays unchanged for a lease is a dead process's)
//
// Changed by COMPARE_SWAP only (docs/architecture.md, "Words that atomics touch"). A region
// image stores them as they were; a memnode that loads an image clears them.
#include <cstdint>

#include "common/region.hpp"

namespace dmhnsw {

inline constexpr uint64_t kWriteGateOffset = 1024;  // memnode 0: the freeze word
inline constexpr uint32_t kWriterSlots = 64;
inline constexpr uint64_t kWriterSlotsOffset = kWriteGateOffset + 8;
inline constexpr uint64_t kWriteGateEnd = kWriterSlotsOffset + 8ull * kWriterSlots;
// After the region header; d-HNSW's control block starts at 2048 (compute/dhnsw/control.hpp).
static_assert(kWriteGateOffset >= sizeof(RegionHeader) && kWriteGateEnd <= 2048);

constexpr bool slot_active(uint64_t w) { return (w & 1) != 0; }

}  // namespace dmhnsw
