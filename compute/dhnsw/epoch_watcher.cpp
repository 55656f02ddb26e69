#include "compute/dhnsw/epoch_watcher.hpp"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace dmhnsw::dhnsw {

EpochWatcher::EpochWatcher(fabric::Cluster& c, std::shared_ptr<const Index> index, int64_t ack_slot)
    : c_(c), cur_(std::move(index)), ack_slot_(ack_slot) {}

void EpochWatcher::ack(fabric::Endpoint& ep) {
  if (ack_slot_ >= 0) write_control_word(ep, ack_ptr(static_cast<uint64_t>(ack_slot_)), next_ack());
}

EpochWatcher::Seen EpochWatcher::poll(fabric::Endpoint& ep, bool ack_move) {
  Seen seen;
  fabric::Buffer b = ep.alloc(sizeof(Control) + 8);
  std::vector<fabric::Op> ops{fabric::Op::read(RemotePtr(0, kControlOffset), b.data(), sizeof(Control), 0)};
  if (ack_slot_ >= 0) {
    const uint64_t a = next_ack();
    std::memcpy(b.data() + sizeof(Control), &a, 8);
    ops.push_back(fabric::Op::write(ack_ptr(static_cast<uint64_t>(ack_slot_)), b.data() + sizeof(Control), 8, 1));
  }
  try {
    if (ep.post(ops) != fabric::Status::Ok) throw fabric::FabricError("memnode 0 is down");
    ep.wait_all(ops.size());
  } catch (const fabric::FabricError& e) {
    throw fabric::FabricError(std::string("reading the d-HNSW control block (epoch, insert buffer) of memnode 0 "
                                          "failed: ") + e.what());
  }
  std::memcpy(&seen.control, b.data(), sizeof seen.control);
  check_control(seen.control);
  if (seen.control.epoch != cur_->header.epoch && seen.control.epoch != 0) {
    cur_ = std::make_shared<Index>(load_index(c_, ep));
    seen.moved = true;
    if (ack_move) ack(ep);
  }
  return seen;
}

}  // namespace dmhnsw::dhnsw
