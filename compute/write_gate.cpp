#include "compute/write_gate.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <random>

#include "common/write_gate.hpp"

namespace dmhnsw::compute {

namespace {

using Clock = std::chrono::steady_clock;
const RemotePtr kFreeze(0, kWriteGateOffset);
RemotePtr slot_ptr(uint32_t i) { return RemotePtr(0, kWriterSlotsOffset + 8ull * i); }
constexpr uint64_t next_beat(uint64_t w, bool active) { return (((w >> 1) + 1) << 1) | (active ? 1 : 0); }

/// Whether a word stayed unchanged for a lease, as seen by one observer. A gap between two
/// observations of over half a lease starts the count again: the observer was stalled (a
/// memnode storing an image serves no operation over shm or tcp meanwhile, nor the owner's
/// renewals), so it cannot tell.
struct Watch {
  uint64_t value = 0;
  Clock::time_point since{}, last{};
  bool stale(uint64_t now_value, int lease_ms) {
    const auto now = Clock::now();
    const bool gap = now - last > std::chrono::milliseconds(lease_ms / 2);
    last = now;
    if (since == Clock::time_point{} || value != now_value || gap) {
      value = now_value;
      since = now;
      return false;
    }
    return now - since >= std::chrono::milliseconds(lease_ms);
  }
};
/// One Watch per writer slot.
struct Staleness {
  std::array<Watch, kWriterSlots> w;
  bool stale(uint32_t i, uint64_t now_value, int lease_ms) { return w[i].stale(now_value, lease_ms); }
};

}  // namespace

WriteGate::WriteGate(fabric::Cluster& c, GateTiming t) : c_(c), t_(t), ep_(c.make_endpoint(1u << 20)) {
  claim_slot();
  // Open at once unless a snapshot runs: active first, then the gate read again.
  uint64_t freeze = 0;
  ep_->read(kFreeze, &freeze, 8);
  if (freeze == 0 && set_slot(true)) {
    ep_->read(kFreeze, &freeze, 8);
    if (freeze == 0)
      open_.store(true);
    else
      set_slot(false);
  }
  monitor_ = std::thread([this] { monitor(); });
}

WriteGate::~WriteGate() {
  stop_.store(true);
  if (monitor_.joinable()) monitor_.join();
  try {
    ep_->compare_swap(slot_ptr(slot_), slot_word_, 0);
  } catch (const std::exception& e) {
    spdlog::debug("write gate: freeing slot {}: {}", slot_, e.what());
  }
}

void WriteGate::claim_slot() {
  Staleness seen;
  const auto deadline = Clock::now() + std::chrono::milliseconds(2 * t_.lease_ms);
  std::array<uint64_t, kWriterSlots> words{};
  for (;;) {
    ep_->read(slot_ptr(0), words.data(), sizeof words);
    for (uint32_t i = 0; i < kWriterSlots; ++i) {
      const uint64_t w = words[i];
      if (w != 0 && !seen.stale(i, w, t_.lease_ms)) continue;
      const uint64_t mine = next_beat(w, false);
      if (ep_->compare_swap(slot_ptr(i), w, mine) == w) {
        if (w != 0) spdlog::info("write gate: took over slot {}, unchanged for {} ms (its process died)", i, t_.lease_ms);
        slot_ = i;
        slot_word_ = mine;
        return;
      }
    }
    if (Clock::now() > deadline)
      throw fabric::FabricError("write gate: all " + std::to_string(kWriterSlots) +
                                " writer slots of memnode 0 are held by live processes; stop a writer first");
    std::this_thread::sleep_for(std::chrono::milliseconds(t_.beat_ms));
  }
}

bool WriteGate::set_slot(bool active) {
  const uint64_t next = next_beat(slot_word_, active);
  const uint64_t was = ep_->compare_swap(slot_ptr(slot_), slot_word_, next);
  if (was != slot_word_) return false;
  slot_word_ = next;
  return true;
}

void WriteGate::enter() {
  for (;;) {
    in_flight_.fetch_add(1);
    if (open_.load()) return;
    in_flight_.fetch_sub(1);
    std::unique_lock g(mu_);
    auto since = Clock::now();
    while (!open_.load()) {
      cv_.wait_for(g, std::chrono::seconds(10));
      if (!open_.load() && Clock::now() - since >= std::chrono::seconds(10)) {
        spdlog::info("write gate: writes have waited {:.0f} s for a snapshot to finish",
                     std::chrono::duration<double>(Clock::now() - since).count());
        since = Clock::now();
      }
    }
  }
}

void WriteGate::monitor() {
  Watch freeze_watch;
  try {
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(t_.beat_ms));
      uint64_t freeze = 0;
      ep_->read(kFreeze, &freeze, 8);
      bool ok = true;
      if (freeze_watch.stale(freeze, t_.lease_ms) && freeze != 0) {
        if (ep_->compare_swap(kFreeze, freeze, 0) == freeze)
          spdlog::warn("write gate: a snapshot's freeze word stayed unchanged for {} ms (its process died); "
                       "writes go on", t_.lease_ms);
        continue;
      }
      if (freeze != 0) {
        open_.store(false);  // no new write starts; those in flight finish
        ok = set_slot(slot_active(slot_word_) && in_flight_.load() != 0);
      } else if (!slot_active(slot_word_)) {
        ok = set_slot(true);
        ep_->read(kFreeze, &freeze, 8);
        if (ok && freeze != 0) {
          ok = set_slot(false);  // a snapshot closed the gate meanwhile: it may have seen us inactive
        } else if (ok) {
          std::lock_guard g(mu_);
          open_.store(true);
          cv_.notify_all();
        }
      } else {
        ok = set_slot(true);  // active since before this read of an open gate: a snapshot will wait for it
        if (ok && !open_.load()) {
          std::lock_guard g(mu_);
          open_.store(true);
          cv_.notify_all();
        }
      }
      if (!ok) {
        // Unchanged for a lease by someone's clock: this process stalled, and a snapshot may have
        // gone on without it. Take a slot again.
        spdlog::error("write gate: slot {} was taken over while this process held it (a stall of over {} ms)",
                      slot_, t_.lease_ms);
        open_.store(false);  // until the new slot is active (the next beat)
        claim_slot();
      }
    }
  } catch (const std::exception& e) {
    // Memnode 0 is gone or unreachable: writes fail on their own operations and say so.
    spdlog::error("write gate: {}", e.what());
    std::lock_guard g(mu_);
    open_.store(true);
    cv_.notify_all();
  }
}

PauseStats with_writes_paused(fabric::Cluster& c, int wait_ms, const std::function<void()>& store, GateTiming t) {
  auto ep = c.make_endpoint(1u << 20);
  const uint64_t nonce = (std::random_device{}() | 1u) & 0x7fffffffu;
  uint64_t mine = nonce << 32 | 1;
  // Close the gate; a freeze word that moves is another live snapshot's.
  Watch other;
  for (uint64_t first = 0;;) {
    const uint64_t was = ep->compare_swap(kFreeze, 0, mine);
    if (was == 0) break;
    if (first == 0) first = was;
    if (was != first)
      throw fabric::FabricError("snapshot: another snapshot is being taken (memnode 0's freeze word moves); "
                                "try again once it finished");
    if (other.stale(was, t.lease_ms)) {
      ep->compare_swap(kFreeze, was, 0);  // a dead snapshot's freeze
      spdlog::warn("snapshot: took over a freeze word unchanged for {} ms (that snapshot's process died)", t.lease_ms);
      first = 0;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(t.beat_ms));
  }
  // Renew the beat from a thread of its own (its own endpoint), so writers know this one lives.
  std::atomic<bool> done{false}, lost{false};
  std::atomic<uint64_t> word{mine};
  std::thread beat([&, bep = c.make_endpoint(1u << 20)] {
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::max(1, t.lease_ms / 10)));
      const uint64_t cur = word.load();
      try {
        if (bep->compare_swap(kFreeze, cur, cur + 1) == cur)
          word.store(cur + 1);
        else
          lost.store(true);
      } catch (const std::exception&) {
        lost.store(true);
      }
      if (lost.load()) return;
    }
  });
  auto open = [&] {
    done.store(true);
    beat.join();
    if (!lost.load()) ep->compare_swap(kFreeze, word.load(), 0);
  };
  PauseStats st;
  try {
    Staleness seen;
    std::array<uint64_t, kWriterSlots> words{};
    const auto w0 = Clock::now();
    for (;;) {
      ep->read(slot_ptr(0), words.data(), sizeof words);
      uint32_t active = 0, held = 0, dead = 0;
      for (uint32_t i = 0; i < kWriterSlots; ++i) {
        if (words[i] == 0) continue;
        ++held;
        if (seen.stale(i, words[i], t.lease_ms)) {
          ++dead;
          continue;
        }
        if (slot_active(words[i])) ++active;
      }
      st.writers = std::max(st.writers, held);
      st.dead = dead;
      if (active == 0) break;
      if (Clock::now() - w0 > std::chrono::milliseconds(wait_ms))
        throw fabric::FabricError("snapshot: " + std::to_string(active) + " writing process(es) did not pause within " +
                                  std::to_string(wait_ms / 1000.0).substr(0, 5) +
                                  " s (a rebuild, a delete or a consolidation run pauses only when it finishes); "
                                  "nothing was stored; try again, or allow longer with --wait-seconds");
      std::this_thread::sleep_for(std::chrono::milliseconds(t.beat_ms / 2 + 1));
    }
    st.wait_s = std::chrono::duration<double>(Clock::now() - w0).count();
    store();
    if (lost.load())
      throw fabric::FabricError("snapshot: this process's freeze word was taken over while it stored (it stalled "
                                "for over " + std::to_string(t.lease_ms) + " ms): writers may have gone on, so the "
                                "images may not be one consistent cut; take the snapshot again");
  } catch (...) {
    open();
    throw;
  }
  open();
  return st;
}

}  // namespace dmhnsw::compute
