#pragma once
// Re-replication (docs/replication.md, "Replacing a memnode") and the set's shared view: where
// a set's rejoin protocol keeps its words. Each set L keeps a RejoinBlock in its header page, and the copier (compute/
// rejoin.cpp) picks where the mark bytes (one per chunk of the region) go and writes it there;
// both are words of L, replicated like all others. The copy that joins keeps its own join word,
// never copied over, in its header page.
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dmhnsw::fabric {

inline constexpr uint64_t kRejoinBlockOffset = 3232;  // header page: after d-HNSW's control block (2048 + 1176)
inline constexpr uint64_t kRejoinMaxChunks = 60u << 10;
inline constexpr uint64_t kRejoinMinChunk = 64u << 10;
/// A joining copy's own word (its header page, just below the presence table): non-zero while
/// it joins, so its welcome tells computenodes not to read it yet.
inline constexpr uint64_t kJoinWordOffset = 3576;
inline constexpr uint64_t kRejoinMagic = 0x4e494f4a45524d44ULL;  // "DMREJOIN"

enum RejoinPhase : uint64_t { kRejoinIdle = 0, kRejoinMarking = 1, kRejoinFrozen = 2 };

struct RejoinBlock {
  uint64_t magic;        // kRejoinMagic once a rejoin ran
  uint64_t phase;        // RejoinPhase
  uint64_t gen;          // +1 per phase change; acks carry it
  uint64_t copy;         // the joining copy
  uint64_t done_copy;    // idle after a rejoin: the copy that became full (+1), 0: none
  uint64_t owner;        // computenode id + 1 of the copier
  uint64_t marks;        // region offset of the mark bytes (one per chunk)
  uint64_t chunk;        // bytes per mark
  uint64_t acks[32];     // per computenode id: the gen it acknowledged
  /// The set's view: bit c set once any computenode found copy c dead. Every computenode's
  /// watcher fences the copies set here (so all agree within a poll); the copier clears the bit
  /// of the copy that rejoined. Changed by COMPARE_SWAP only.
  uint64_t dead;
};
static_assert(std::is_trivially_copyable_v<RejoinBlock> && std::is_standard_layout_v<RejoinBlock>);
static_assert(sizeof(RejoinBlock) == 328 && offsetof(RejoinBlock, phase) == 8 && offsetof(RejoinBlock, marks) == 48 &&
              offsetof(RejoinBlock, acks) == 64 && offsetof(RejoinBlock, dead) == 320);
static_assert(kRejoinBlockOffset + sizeof(RejoinBlock) <= kJoinWordOffset);
static_assert(kJoinWordOffset + 8 <= 3584);  // common/presence.hpp: the presence table starts there
/// Bytes per mark: the region in at most kRejoinMaxChunks chunks of at least kRejoinMinChunk.
inline uint64_t rejoin_chunk(uint64_t region_size) {
  uint64_t c = kRejoinMinChunk;
  while (region_size / c >= kRejoinMaxChunks) c *= 2;
  return c;
}

}  // namespace dmhnsw::fabric
