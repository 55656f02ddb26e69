#include "compute/dhnsw/group_lock.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "common/timing.hpp"

namespace dmhnsw::dhnsw {

uint64_t lock_group(fabric::Endpoint& ep, const Index& idx, uint32_t slot0, uint32_t cn_id, uint32_t lease_ms,
                    uint64_t& ticket, uint64_t* waits, uint64_t* takeovers) {
  const RemotePtr p(idx.subs.at(slot0).memnode, live_desc_offset(idx.header, slot0) + offsetof(SubDesc, lock));
  const uint64_t mine = lock_word(cn_id, ++ticket);
  uint64_t seen = 0;
  auto since = Clock::now();
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    const uint64_t old = ep.compare_swap(p, 0, mine);
    if (old == 0) return mine;
    const auto now = Clock::now();
    if (old != seen) {
      seen = old;
      since = now;
      if (waits) ++*waits;
    } else if (now - since > std::chrono::milliseconds(lease_ms)) {
      if (ep.compare_swap(p, old, mine) == old) {
        if (takeovers) ++*takeovers;
        spdlog::warn("dhnsw: took over the lock of the group of sub-HNSW {} from computenode {} (unchanged for {} ms)",
                     slot0, lock_owner(old), lease_ms);
        return mine;
      }
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(2000));
  }
}

void unlock_group(fabric::Endpoint& ep, const Index& idx, uint32_t slot0, uint64_t mine) {
  const RemotePtr p(idx.subs.at(slot0).memnode, live_desc_offset(idx.header, slot0) + offsetof(SubDesc, lock));
  const uint64_t old = ep.compare_swap(p, mine, 0);
  if (old != mine)
    spdlog::warn("dhnsw: the lock of the group of sub-HNSW {} was taken over while held (now {:#x})", slot0, old);
}

GroupLock::~GroupLock() {
  try {
    unlock_group(ep_, idx_, slot0_, mine_);
  } catch (const std::exception& e) {
    spdlog::warn("dhnsw {}: releasing the lock of sub-HNSW {}'s group: {}", who_, slot0_, e.what());
  }
}

}  // namespace dmhnsw::dhnsw
