#pragma once
// A query engine's view of d-HNSW's epochs (paper section 4.5): before each batch it READs the
// control block and WRITEs its ack word in one doorbell (the epoch it planned the last batch
// with, and a beat the rebuild master sees move while this computenode lives); when the epoch
// moved it loads the new index and acknowledges it at once, so the master may free the old area.
#include <cstdint>
#include <memory>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/index.hpp"

namespace dmhnsw::dhnsw {

class EpochWatcher {
 public:
  /// `ack_slot`: this computenode's id (its ack word), or -1: read only, acknowledge nothing.
  EpochWatcher(fabric::Cluster& c, std::shared_ptr<const Index> index, int64_t ack_slot);

  struct Seen {
    Control control;
    bool moved = false;  // the epoch moved: current() is the new epoch's index
  };
  /// Reads the control block (acknowledging as above); throws naming memnode 0 when it fails.
  /// With `ack_move` false a new epoch is loaded but not acknowledged: the caller calls ack()
  /// once nothing reads the old epoch's area any more.
  Seen poll(fabric::Endpoint& ep, bool ack_move = true);
  /// Writes this computenode's ack word for the current epoch (nothing without an ack slot).
  void ack(fabric::Endpoint& ep);
  /// The index of the epoch seen last; a batch keeps the one it was planned with.
  const std::shared_ptr<const Index>& current() const { return cur_; }

 private:
  uint64_t next_ack() { return ack_word(cur_->header.epoch, ++beat_); }
  fabric::Cluster& c_;
  std::shared_ptr<const Index> cur_;
  int64_t ack_slot_;
  uint64_t beat_ = 0;
};

}  // namespace dmhnsw::dhnsw
