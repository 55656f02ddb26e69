// The computenode's side of a rejoin (docs/replication.md, "Replacing a memnode"): a thread that
// reads every set's RejoinBlock and follows the copier's phases. Marking: from now on changes to
// the set mark their chunks; acknowledged once no unmarked change is in flight. Frozen: the set
// takes no new operation; acknowledged once none is in flight and the joining copy is connected.
// Idle after a rejoin: the joining copy is full, reads and writes go to it too.
#include <spdlog/spdlog.h>

#include <cstring>

#include "common/fabric/replicated.hpp"

namespace dmhnsw::fabric {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(10);
constexpr auto kDrainLimit = std::chrono::seconds(10);  // in-flight operations finish well within this
constexpr auto kFrozenLimit = std::chrono::seconds(20);  // a copier gone while the set is frozen
}  // namespace

class ReplicaWatch {
 public:
  explicit ReplicaWatch(ReplicatedCluster& c) : c_(c), acked_(c.memnodes().size(), 0), frozen_at_(acked_.size()) {
    ep_ = c_.make_control_endpoint(1u << 20);
    block_ = ep_->alloc(sizeof(RejoinBlock));
    pep_ = c_.p_->make_endpoint(1u << 20);
    word_ = pep_->alloc(8);
  }

  /// One look at every set; true when some set is in a rejoin (poll faster).
  bool round() {
    bool busy = false;
    for (uint16_t l = 0; l < c_.memnodes().size(); ++l) {
      revived(l);
      if (!c_.alive(l)) continue;
      RejoinBlock b{};
      try {
        ep_->read(RemotePtr(l, kRejoinBlockOffset), block_.data(), sizeof b);
      } catch (const FabricError&) {
        continue;  // the set's last copy died meanwhile: its operations say so
      }
      std::memcpy(&b, block_.data(), sizeof b);
      b.dead = dead_word(l);
      busy = step(l, b) || busy;
    }
    return busy;
  }

 private:
  /// The set's dead word from every copy this computenode reaches: a copy that was cut off
  /// (stopped, partitioned) missed the bits the others set about it, so a computenode that
  /// joins must not take its word for the set's. The words of copies that another copy's word
  /// names dead are left out (their bits are stale); the rest are OR-ed.
  uint64_t dead_word(uint16_t l) {
    std::vector<uint64_t> w(c_.copies(), 0);
    std::vector<bool> read(c_.copies(), false);
    for (unsigned c = 0; c < c_.copies(); ++c) {
      const uint16_t p = c_.phys(l, c);
      if (!c_.p_->alive(p)) continue;
      try {
        pep_->read(RemotePtr(p, kRejoinBlockOffset + offsetof(RejoinBlock, dead)), word_.data(), 8);
        w[c] = *word_.as<uint64_t>();
        read[c] = true;
      } catch (const FabricError&) {
      }
    }
    // Trusted: copies no trusted copy names dead (a copy named by another is dropped in turn).
    uint64_t trusted = 0;
    for (unsigned c = 0; c < c_.copies(); ++c)
      if (read[c]) trusted |= uint64_t{1} << c;
    for (bool dropped = true; dropped;) {
      dropped = false;
      for (unsigned c = 0; c < c_.copies() && !dropped; ++c)
        for (unsigned d = 0; d < c_.copies() && !dropped; ++d)
          if (d != c && (trusted >> c & 1) && (trusted >> d & 1) && (w[d] >> c & 1)) {
            trusted &= ~(uint64_t{1} << c);
            dropped = true;
          }
    }
    uint64_t dead = 0;
    for (unsigned c = 0; c < c_.copies(); ++c) {
      if (trusted >> c & 1) dead |= w[c];
      else if (read[c]) dead |= uint64_t{1} << c;  // named dead by a trusted copy
    }
    return dead;
  }

  /// The join word of physical memnode `p` (set by `memnode --rejoin`, cleared by the copier
  /// when the copy is full); a copy that cannot be read counts as joining.
  bool still_joining(uint16_t p) {
    try {
      pep_->read(RemotePtr(p, kJoinWordOffset), word_.data(), 8);
      return *word_.as<uint64_t>() != 0;
    } catch (const FabricError&) {
      return true;
    }
  }

  /// A copy seen dead whose place a new memnode took (the physical cluster revived it) joins.
  void revived(uint16_t l) {
    for (unsigned c = 0; c < c_.copies(); ++c) {
      const uint16_t p = c_.phys(l, c);
      uint8_t dead = ReplicatedCluster::kDead;
      if (c_.p_->alive(p) && c_.state_[p].compare_exchange_strong(dead, ReplicatedCluster::kJoining))
        spdlog::info("memnode {} copy {} ({}): joining its set; read once `computenode rejoin` has filled it", l, c,
                     c_.phys_info(l, c).address);
    }
  }

  /// The set's shared view: copies others found dead are fenced here too; copies found dead here
  /// are published for the others.
  void share_view(uint16_t l, const RejoinBlock& b) {
    uint64_t mine = 0;
    for (unsigned c = 0; c < c_.copies(); ++c) {
      const uint16_t p = c_.phys(l, c);
      const uint8_t st = c_.state_[p].load();
      if ((b.dead >> c & 1) && st == ReplicatedCluster::kLive) {
        c_.fence(l, c, "found dead by another computenode (its set's view)");
      } else if (st == ReplicatedCluster::kDead) {
        mine |= uint64_t{1} << c;
      }
    }
    if ((b.dead & mine) == mine) return;
    // Publish: OR our bits in, by COMPARE_SWAP (the word is the set's, others change it too).
    const RemotePtr word(l, kRejoinBlockOffset + offsetof(RejoinBlock, dead));
    uint64_t seen = b.dead;
    for (int tries = 0; tries < 100 && (seen & mine) != mine; ++tries) {
      const uint64_t old = ep_->compare_swap(word, seen, seen | mine);
      if (old == seen) break;
      seen = old;
    }
  }

  bool step(uint16_t l, const RejoinBlock& b) {
    try {
      share_view(l, b);
    } catch (const FabricError&) {
    }
    auto& s = c_.set(l);
    if (b.magic != kRejoinMagic || b.phase == kRejoinIdle) {
      if (b.magic == kRejoinMagic && b.done_copy > 0 && b.done_copy <= c_.copies()) {
        const uint16_t p = c_.phys(l, static_cast<unsigned>(b.done_copy - 1));
        uint8_t joining = ReplicatedCluster::kJoining;
        // done_copy stays in the block after a rejoin: a copy killed again and replaced by a new,
        // empty memnode would pass for full. The copier clears the copy's own join word last,
        // so a copy still joining is one whose join word reads non-zero.
        const bool full = !(c_.state_[p].load() == joining && c_.p_->alive(p) && still_joining(p));
        if (full && c_.p_->alive(p) && c_.state_[p].compare_exchange_strong(joining, ReplicatedCluster::kLive)) {
          c_.rejoins_.fetch_add(1);
          spdlog::info("memnode {} copy {} ({}): rejoined its set, a full copy again", l, b.done_copy - 1,
                       c_.phys_info(l, static_cast<unsigned>(b.done_copy - 1)).address);
        }
      }
      s.frozen.store(false);
      s.marking.store(false);
      return false;
    }
    s.chunk.store(b.chunk);
    s.marks.store(b.marks);
    s.marking.store(true);
    if (b.phase == kRejoinFrozen) {
      if (!s.frozen.load()) frozen_at_[l] = Clock::now();
      if (Clock::now() - frozen_at_[l] > kFrozenLimit) {  // the copier is gone: go on without it
        if (s.frozen.exchange(false))
          spdlog::warn("memnode {}: frozen by a rejoin for {} s; going on (the copier stopped?)", l,
                       std::chrono::duration_cast<std::chrono::seconds>(kFrozenLimit).count());
        return true;
      }
      s.frozen.store(true);
    }
    if (acked_[l] == b.gen) return true;
    // Acknowledge once what the copier must see has landed.
    const bool frozen = b.phase == kRejoinFrozen;
    const auto until = Clock::now() + kDrainLimit;
    auto count = [&] { return c_.in_flight(l, !frozen); };
    while (count() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (count() > 0) return true;  // try again next round
    if (frozen && b.copy < c_.copies() && !c_.p_->alive(c_.phys(l, static_cast<unsigned>(b.copy))))
      return true;  // not connected to the joining copy yet: it must take our writes once full
    if (c_.cn_id() < std::size(b.acks)) {
      try {
        ep_->write(RemotePtr(l, kRejoinBlockOffset + offsetof(RejoinBlock, acks) + 8 * uint64_t{c_.cn_id()}), &b.gen, 8);
      } catch (const FabricError&) {
        return true;
      }
    }
    acked_[l] = b.gen;
    return true;
  }

  ReplicatedCluster& c_;
  std::unique_ptr<Endpoint> ep_, pep_;  // the set's words; one copy's
  Buffer block_, word_;
  std::vector<uint64_t> acked_;
  std::vector<Clock::time_point> frozen_at_;
};

void ReplicatedCluster::start_watcher() {
  // A first round before anything is posted: a computenode that joins during a rejoin marks
  // (or holds) from its first operation on.
  auto w = std::make_shared<ReplicaWatch>(*this);
  try {
    w->round();
  } catch (const std::exception& e) {
    spdlog::debug("replica watch: {}", e.what());
  }
  watcher_ = std::thread([this, w] {
    while (!stop_.load()) {
      bool busy = false;
      try {
        busy = w->round();
      } catch (const std::exception& e) {
        spdlog::debug("replica watch: {}", e.what());
      }
      std::this_thread::sleep_for(busy ? std::chrono::milliseconds(1) : kPoll);
    }
  });
}

}  // namespace dmhnsw::fabric
