#pragma once
// d-HNSW's group lock: a word in the group's slot-0 live descriptor (compute/dhnsw/layout.hpp),
// taken with COMPARE_SWAP (lock_word: owner, ticket) by inserters, deleters and the rebuild
// master's snapshot. A waiter that sees the same word for a whole lease takes the lock over, so
// a computenode killed while holding it blocks the group for about one lease. A holder is
// assumed not to stall longer than a lease between its own checks.
#include <cstdint>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/index.hpp"

namespace dmhnsw::dhnsw {

/// The group lock of the group whose slot-0 sub is `slot0` (lock word in its live descriptor):
/// COMPARE_SWAP 0 -> lock_word(cn_id, ++ticket), taken over when unchanged for `lease_ms`.
/// Returns the word it holds; counts waits and takeovers when given.
uint64_t lock_group(fabric::Endpoint& ep, const Index& idx, uint32_t slot0, uint32_t cn_id, uint32_t lease_ms,
                    uint64_t& ticket, uint64_t* waits, uint64_t* takeovers);
void unlock_group(fabric::Endpoint& ep, const Index& idx, uint32_t slot0, uint64_t mine);

/// lock_group for a scope: unlock_group when it ends (a failure to release is logged, naming
/// `who`: the next holder takes the lock over after its lease).
class GroupLock {
 public:
  GroupLock(fabric::Endpoint& ep, const Index& idx, uint32_t slot0, uint32_t cn_id, uint32_t lease_ms, uint64_t& ticket,
            uint64_t* waits, uint64_t* takeovers, const char* who)
      : ep_(ep), idx_(idx), slot0_(slot0), who_(who),
        mine_(lock_group(ep, idx, slot0, cn_id, lease_ms, ticket, waits, takeovers)) {}
  ~GroupLock();
  GroupLock(const GroupLock&) = delete;
  GroupLock& operator=(const GroupLock&) = delete;
  uint64_t word() const { return mine_; }

 private:
  fabric::Endpoint& ep_;
  const Index& idx_;
  uint32_t slot0_;
  const char* who_;
  uint64_t mine_;
};

}  // namespace dmhnsw::dhnsw
