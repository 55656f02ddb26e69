#include "compute/board.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "common/presence.hpp"
#include "common/region.hpp"
#include "compute/selftest.hpp"

namespace dmhnsw::compute {

namespace {
// The barrier page holds one block per run size K = 1..kMaxCns: the counter of K's barriers,
// then word i: generation + 1 of the last barrier computenode i arrived at (who is still
// missing). The counter outlives a run (it lives in memnode 0's region, and in its image): a
// counter shared by runs of different sizes would leave a run of K started after a run of
// another size off a multiple of K, and its computenodes on different generations.
constexpr uint64_t kBlockBytes = 128;
constexpr uint64_t kBarrierWord = 0;
constexpr uint64_t kArrivedWords = 8;
constexpr uint64_t kSlotsStart = 4096;
static_assert(kArrivedWords + 8 * Board::kMaxCns <= kBlockBytes && kBlockBytes * Board::kMaxCns <= kSlotsStart);
// The board fits the upper half of the scratch area of the smallest useful region.
static_assert(std::min<uint64_t>(64u << 20, kMinUsefulRegionBytes / 4) / 2 >=
              Board::kGroups * (kSlotsStart + uint64_t{Board::kMaxCns} * Board::kSlotBytes));
// A slot's stamp: K in the top byte, generation + 1 below, so that a slot left by a run of
// another size never passes for this run's.
uint64_t slot_stamp(uint32_t k, uint64_t gen) { return (uint64_t{k} << 56) | (gen + 1); }
// A missing peer's presence is checked this often while waiting: one small READ.
constexpr auto kPresencePoll = std::chrono::milliseconds(250);
// `stamp` (slot_stamp) holds the generation + 1: a slot nobody wrote yet (all zeros) never
// matches, not even for the first barrier's generation 0.
struct SlotHeader {
  uint64_t stamp;
  uint64_t len;
};
static_assert(sizeof(SlotHeader) == 16);
}  // namespace

std::vector<uint64_t> Board::departures(fabric::Endpoint& ep) {
  Presence p{};
  ep.read(RemotePtr(0, kPresenceOffset), &p, sizeof p);
  return std::vector<uint64_t>(p.departed, p.departed + kPresenceIds);
}

Board::Board(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, uint32_t num_cns, const std::string& group,
             const std::vector<uint64_t>& departed_since)
    : c_(c), ep_(ep), cn_(cn_id), k_(num_cns), departed_(departed_since) {
  if (num_cns == 0 || num_cns > kMaxCns)
    throw std::invalid_argument("--num-cns " + std::to_string(num_cns) + ": 1 to " + std::to_string(kMaxCns) +
                                " computenodes per run");
  RegionHeader h = header_from_blob(c.memnodes()[0].header, "memnode 0");
  // The board lives in the upper half of the scratch area (the selftest uses the lower half):
  // kGroups areas of [barrier page][kMaxCns slots].
  const uint64_t area = kSlotsStart + uint64_t{kMaxCns} * kSlotBytes;
  if (h.scratch_size / 2 < kGroups * area)
    throw fabric::FabricError("memnode 0: scratch area of " + std::to_string(h.scratch_size) +
                              " bytes too small for the coordination board (start it with --region " +
                              std::to_string(kMinUsefulRegionBytes >> 20) + "MiB or more; docs/operations.md, \"Sizing regions\")");
  // One area per kind of run (build, insert, query): runs of different kinds may share the
  // memnodes at the same time; two runs of the same kind at once are not supported.
  uint64_t index = group == "build" ? 0 : group == "insert" ? 1 : group == "query" ? 2 : 3;
  base_ = RemotePtr(0, h.scratch_offset + h.scratch_size / 2 + index * area);
  // Departures before that point are a previous run's, or a peer that left before this
  // process came: that one is waited for like a peer not started yet (up to the timeout).
  if (departed_.empty()) departed_ = departures(ep_);
  departed_.resize(std::max<size_t>(departed_.size(), k_), 0);
}

std::optional<uint32_t> Board::gone_peer(const std::function<bool(uint32_t)>& missing) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_presence_) return std::nullopt;
  next_presence_ = now + kPresencePoll;
  Presence p{};
  ep_.read(RemotePtr(0, kPresenceOffset), &p, sizeof p);
  for (uint32_t i = 0; i < k_; ++i)
    if (i != cn_ && presence_gone(p, i, departed_[i]) && missing(i)) return i;
  return std::nullopt;
}

std::optional<uint32_t> Board::left_peer(fabric::Endpoint& ep) const {
  Presence p{};
  ep.read(RemotePtr(0, kPresenceOffset), &p, sizeof p);
  for (uint32_t i = 0; i < k_; ++i)
    if (i != cn_ && presence_gone(p, i, departed_[i])) return i;
  return std::nullopt;
}

std::string Board::gone_message(uint32_t i) const {
  return "computenode " + std::to_string(i) + " left the run: its control connection to memnode 0 closed " +
         "(killed, or dropped by the memnode after going silent)";
}

uint64_t Board::barrier(int timeout_s) { return wait_rest(arrive(), timeout_s); }

RemotePtr Board::barrier_block() const { return base_ + kBlockBytes * (k_ - 1); }

Board::Arrival Board::arrive() {
  const RemotePtr block = barrier_block();
  const uint64_t old = ep_.fetch_add(block + kBarrierWord, 1);
  const Arrival a{old / k_, old + 1};
  const uint64_t stamp = a.gen + 1;
  ep_.atomic_store(block + kArrivedWords + 8 * uint64_t{cn_}, stamp, stamp - 1);  // take_back CASes it
  return a;
}

uint64_t Board::wait_rest(const Arrival& a, int timeout_s) {
  const RemotePtr block = barrier_block();
  const uint64_t gen = a.gen, target = (gen + 1) * k_, stamp = gen + 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  uint64_t v = a.count;
  auto fail = [&](const std::string& why) {
    try {
      take_back(stamp);
    } catch (const std::exception&) {
      // memnode 0 unreachable: the error below is the one to report
    }
    return fabric::FabricError("barrier: " + why);
  };
  while (v < target) {
    if (std::chrono::steady_clock::now() > deadline) {
      ep_.read(block + kBarrierWord, &v, 8);
      if (v >= target) break;  // complete after all: the others passed it, so must this one
      throw fail("only " + std::to_string(v - gen * k_) + " of " + std::to_string(k_) +
                 " computenodes arrived within " + std::to_string(timeout_s) + " s");
    }
    const auto gone = gone_peer([&](uint32_t i) {
      uint64_t w = 0;
      ep_.read(block + kArrivedWords + 8 * uint64_t{i}, &w, 8);
      return w < stamp;
    });
    if (gone) throw fail(gone_message(*gone) + " before arriving");
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // bounded poll of a remote word
    ep_.read(block + kBarrierWord, &v, 8);
  }
  return gen;
}

// The counter outlives a run: an arrival left in it by a failed barrier would put the next
// run of this size out of step (its first arrivals on one generation, the rest on the next).
// So a computenode whose barrier fails takes back its own arrival and that of every peer that
// arrived and has left since (killed after arriving, it cannot take its own back). Each
// arrival word is claimed with a COMPARE_SWAP, so each arrival is taken back once, by
// whoever claims it.
void Board::take_back(uint64_t stamp) {
  const RemotePtr block = barrier_block();
  Presence p{};
  ep_.read(RemotePtr(0, kPresenceOffset), &p, sizeof p);
  for (uint32_t i = 0; i < k_; ++i) {
    if (i != cn_ && !presence_gone(p, i, departed_[i])) continue;
    if (ep_.compare_swap(block + kArrivedWords + 8 * uint64_t{i}, stamp, 0) == stamp)
      ep_.fetch_add(block + kBarrierWord, ~uint64_t{0});  // - 1
  }
}

void Board::publish(uint64_t gen, const std::string& text) {
  if (text.size() + sizeof(SlotHeader) > kSlotBytes)
    throw fabric::FabricError("result of computenode " + std::to_string(cn_) + " too large for its board slot (" +
                              std::to_string(text.size()) + " bytes)");
  RemotePtr slot = base_ + kSlotsStart + uint64_t{cn_} * kSlotBytes;
  if (!text.empty()) ep_.write(slot + sizeof(SlotHeader), text.data(), text.size());
  SlotHeader h{slot_stamp(k_, gen), text.size()};
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
      if (h.stamp == slot_stamp(k_, gen) && h.len <= kSlotBytes - sizeof h) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw fabric::FabricError("computenode " + std::to_string(i) + " did not publish its results within " +
                                  std::to_string(timeout_s) + " s");
      if (gone_peer([&](uint32_t j) { return j == i; }))
        throw fabric::FabricError(gone_message(i) + " before it published its results");
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    out[i].resize(h.len);
    if (h.len > 0) ep_.read(slot + sizeof h, out[i].data(), h.len);
  }
  return out;
}

}  // namespace dmhnsw::compute
