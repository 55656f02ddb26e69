#include "compute/board.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "common/region.hpp"
#include "compute/selftest.hpp"

namespace dmhnsw::compute {

namespace {
constexpr uint64_t kBarrierWord = 0;
constexpr uint64_t kSlotsStart = 4096;
// `stamp` is the generation + 1: a slot nobody wrote yet (all zeros) never matches, not
// even for the first barrier's generation 0.
struct SlotHeader {
  uint64_t stamp;
  uint64_t len;
};
static_assert(sizeof(SlotHeader) == 16);
}  // namespace

Board::Board(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, uint32_t num_cns, const std::string& group)
    : c_(c), ep_(ep), cn_(cn_id), k_(num_cns) {
  if (num_cns > kMaxCns)
    throw std::invalid_argument("--num-cns " + std::to_string(num_cns) + ": at most " + std::to_string(kMaxCns) +
                                " computenodes per run");
  RegionHeader h = header_from_blob(c.memnodes()[0].header, "memnode 0");
  // The board lives in the upper half of the scratch area (the selftest uses the lower half):
  // kGroups areas of [barrier page][kMaxCns slots].
  const uint64_t area = kSlotsStart + uint64_t{kMaxCns} * kSlotBytes;
  if (h.scratch_size / 2 < kGroups * area)
    throw fabric::FabricError("memnode 0: scratch area of " + std::to_string(h.scratch_size) +
                              " bytes too small for the coordination board (start it with --region 128MiB or more)");
  // One area per kind of run (build, insert, query): runs of different kinds may share the
  // memnodes at the same time; two runs of the same kind at once are not supported.
  uint64_t index = group == "build" ? 0 : group == "insert" ? 1 : group == "query" ? 2 : 3;
  base_ = RemotePtr(0, h.scratch_offset + h.scratch_size / 2 + index * area);
}

uint64_t Board::barrier(int timeout_s) {
  uint64_t old = ep_.fetch_add(base_ + kBarrierWord, 1);
  uint64_t gen = old / k_;
  uint64_t target = (gen + 1) * k_;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  uint64_t v = old + 1;
  while (v < target) {
    if (std::chrono::steady_clock::now() > deadline)
      throw fabric::FabricError("barrier: only " + std::to_string(v - gen * k_) + " of " + std::to_string(k_) +
                                " computenodes arrived within " + std::to_string(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // bounded poll of a remote word
    ep_.read(base_ + kBarrierWord, &v, 8);
  }
  return gen;
}

void Board::publish(uint64_t gen, const std::string& text) {
  if (text.size() + sizeof(SlotHeader) > kSlotBytes)
    throw fabric::FabricError("result of computenode " + std::to_string(cn_) + " too large for its board slot (" +
                              std::to_string(text.size()) + " bytes)");
  RemotePtr slot = base_ + kSlotsStart + uint64_t{cn_} * kSlotBytes;
  if (!text.empty()) ep_.write(slot + sizeof(SlotHeader), text.data(), text.size());
  SlotHeader h{gen + 1, text.size()};
  ep_.write(slot, &h, sizeof h);  // header last: readers see a complete text
}

std::vector<std::string> Board::gather(uint64_t gen, int timeout_s, const std::vector<uint32_t>& skip) {
  std::vector<std::string> out(k_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (uint32_t i = 0; i < k_; ++i) {
    if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
    RemotePtr slot = base_ + kSlotsStart + uint64_t{i} * kSlotBytes;
    SlotHeader h{};
    for (;;) {
      ep_.read(slot, &h, sizeof h);
      if (h.stamp == gen + 1 && h.len <= kSlotBytes - sizeof h) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw fabric::FabricError("computenode " + std::to_string(i) + " did not publish its results within " +
                                  std::to_string(timeout_s) + " s");
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    out[i].resize(h.len);
    if (h.len > 0) ep_.read(slot + sizeof h, out[i].data(), h.len);
  }
  return out;
}

}  // namespace dmhnsw::compute
