#pragma once
// Which computenodes a memnode can hear: the presence table at the end of every memnode's
// header page, written by the memnode only (its control server admits and drops computenodes)
// and READ by computenodes. Computenodes of one run never talk to each other; this is how one
// of them waiting at a barrier tells a peer that left (killed, or dropped after going silent)
// from one that is only slow, and fails at once naming it instead of waiting out the timeout.
//
// connected[id]: control connections open under computenode id `id` now (two processes may
// share an id, e.g. a query run and an insert run). departed[id]: how many such connections
// closed since the memnode started. Ids from kPresenceIds on are not tracked.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/region.hpp"

namespace dmhnsw {

inline constexpr uint32_t kPresenceIds = 32;
struct Presence {
  uint64_t connected[kPresenceIds];
  uint64_t departed[kPresenceIds];
};
inline constexpr uint64_t kPresenceOffset = kHeaderPageBytes - sizeof(Presence);
static_assert(std::is_trivially_copyable_v<Presence> && sizeof(Presence) == 512);
static_assert(kPresenceOffset == 3584 && kPresenceOffset >= sizeof(RegionHeader));
static_assert(offsetof(Presence, departed) == 8 * kPresenceIds);

/// Whether computenode `id`, whose departures numbered `departed_before` when the caller
/// started, has left since: no connection open under its id, and one of them closed since.
inline bool presence_gone(const Presence& p, uint32_t id, uint64_t departed_before) {
  return id < kPresenceIds && p.connected[id] == 0 && p.departed[id] > departed_before;
}

/// Memnode side: the table inside its own region (`region` = byte 0). Stores are whole aligned
/// words, so a computenode's READ sees each counter old or new, never torn.
class PresenceWriter {
 public:
  explicit PresenceWriter(char* region) : p_(reinterpret_cast<uint64_t*>(region + kPresenceOffset)) {}
  /// A region loaded from an image carries the table of the memnode that stored it.
  void reset() {
    for (uint32_t i = 0; i < 2 * kPresenceIds; ++i) word(i).store(0, std::memory_order_relaxed);
  }
  void joined(uint32_t id) {
    if (id < kPresenceIds) word(id).fetch_add(1, std::memory_order_relaxed);
  }
  void left(uint32_t id) {
    if (id >= kPresenceIds) return;
    word(kPresenceIds + id).fetch_add(1, std::memory_order_relaxed);  // first: never "gone" with departures unseen
    word(id).fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  std::atomic_ref<uint64_t> word(uint32_t i) { return std::atomic_ref<uint64_t>(p_[i]); }
  uint64_t* p_;
};

}  // namespace dmhnsw
