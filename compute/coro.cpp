#include "compute/coro.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

namespace dmhnsw::compute {

using fabric::Completion;
using fabric::Op;
using fabric::OpKind;
using fabric::Status;

void Scheduler::set_emulated_rtt(std::chrono::nanoseconds rtt) {
  rtt_ = rtt.count() > 0 ? rtt : std::chrono::nanoseconds{0};
  // The default slack (50 us) would stretch every sleep by about that much.
  if (rtt_.count() > 0) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}

uint32_t Scheduler::get_slot() {
  if (free_.empty()) {
    slots_.emplace_back();
    free_.push_back(static_cast<uint32_t>(slots_.size() - 1));
  }
  uint32_t i = free_.back();
  free_.pop_back();
  slots_[i] = Slot{};
  slots_[i].in_use = true;
  return i;
}

bool Scheduler::Wait::await_suspend(std::coroutine_handle<> h) {
  slot = s.get_slot();
  auto& sl = s.slots_[slot];
  sl.h = h;
  if (s.rtt_.count() > 0) sl.release = Clock::now() + s.rtt_;
  for (auto& op : ops) {
    op.tag = slot;
    if (stats != nullptr) {
      if (op.kind == OpKind::Read) {
        ++stats->reads;
        stats->bytes += op.len;
      } else if (op.kind == OpKind::Write) {
        ++stats->writes;
        stats->bytes += op.len;
      } else {
        ++stats->atomics;
        stats->bytes += 8;
      }
    }
  }
  if (batch) {
    Status st = s.ep_.post(ops);
    if (st != Status::Ok) {
      early = Completion{0, st, ops[0].kind, ops[0].remote.node()};
      s.slots_[slot].in_use = false;
      s.free_.push_back(slot);
      return false;  // resume at once with the error
    }
    sl.pending = static_cast<uint32_t>(ops.size());
    if (stats != nullptr) ++stats->doorbells;
    return true;
  }
  uint32_t posted = 0;
  for (auto& op : ops) {
    Status st = s.ep_.post(op);
    if (st != Status::Ok) {
      early = Completion{0, st, op.kind, op.remote.node()};
      break;
    }
    ++posted;
    if (stats != nullptr) ++stats->doorbells;
  }
  if (posted == 0) {
    s.slots_[slot].in_use = false;
    s.free_.push_back(slot);
    return false;
  }
  s.slots_[slot].pending = posted;
  s.slots_[slot].fail = early;
  return true;
}

Completion Scheduler::Wait::await_resume() {
  if (ops.empty()) return Completion{};
  if (early.status != Status::Ok && !s.slots_[slot].in_use) return early;
  Completion c = s.slots_[slot].fail;
  s.slots_[slot].in_use = false;
  s.free_.push_back(slot);
  return c;
}

void Scheduler::spawn(Task<void> t) {
  auto h = t.handle();
  roots_.push_back(std::move(t));
  h.resume();
  reap();
}

void Scheduler::reap() {
  for (size_t i = 0; i < roots_.size();) {
    auto h = roots_[i].handle();
    if (h.done()) {
      if (h.promise().exception && !first_error_) first_error_ = h.promise().exception;
      roots_[i] = std::move(roots_.back());
      roots_.pop_back();
    } else {
      ++i;
    }
  }
}

Scheduler::Clock::time_point Scheduler::next_release() const {
  auto t = Clock::time_point::max();
  for (const Delayed& d : delayed_) t = std::min(t, d.at);
  for (const Slot& sl : slots_)
    if (sl.in_use && sl.pending > 0) t = std::min(t, sl.release);
  return t;
}

void Scheduler::release_delayed(bool idle) {
  auto now = Clock::now();
  if (idle && rtt_.count() > 0) {
    // Nothing can resume before next_release(): operations still in flight resume nobody
    // before their release either, so the thread sleeps until then instead of polling (at
    // most 20 us when a coroutine yielded, as below). An operation past its release that has
    // not completed is polled for, as without the emulation.
    const auto at = next_release();
    if (at != Clock::time_point::max() && at > now) {
      std::this_thread::sleep_until(yielded_.empty() ? at : std::min(at, now + std::chrono::microseconds(20)));
      now = Clock::now();
    }
  }
  for (size_t i = 0; i < delayed_.size();) {
    if (delayed_[i].at <= now) {
      ready_.push_back(delayed_[i].h);
      delayed_[i] = delayed_.back();
      delayed_.pop_back();
    } else {
      ++i;
    }
  }
}

size_t Scheduler::step() {
  std::array<Completion, 64> out;
  size_t n = ep_.poll(out);
  ready_.clear();
  const bool emulate = rtt_.count() > 0;
  const auto now = emulate ? Clock::now() : Clock::time_point{};
  for (size_t i = 0; i < n; ++i) {
    auto& sl = slots_[out[i].tag];
    if (out[i].status != Status::Ok && sl.fail.status == Status::Ok) sl.fail = out[i];
    if (--sl.pending == 0) {
      if (emulate && sl.release > now)
        delayed_.push_back(Delayed{sl.release, sl.h});
      else
        ready_.push_back(sl.h);
    }
  }
  // (!delayed_.empty() without emulate: the RTT was switched off while some waited.)
  if (emulate || !delayed_.empty()) release_delayed(/*idle=*/ready_.empty() && n == 0);
  const size_t nr = ready_.size();
  // resume() may run a coroutine into its next io(), which never touches ready_.
  for (size_t i = 0; i < nr; ++i) ready_[i].resume();
  size_t woken = 0;
  if (!yielded_.empty()) {
    // Only coroutines that yielded and no I/O in flight: nothing to wait for but time.
    if (nr == 0 && ep_.in_flight() == 0 && delayed_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    resuming_.swap(yielded_);
    for (auto h : resuming_) h.resume();
    woken = resuming_.size();
    resuming_.clear();
  }
  if (nr > 0 || woken > 0) reap();
  return roots_.size();
}

void Scheduler::run() {
  while (!roots_.empty()) step();
  if (first_error_) std::rethrow_exception(std::exchange(first_error_, nullptr));
}

}  // namespace dmhnsw::compute
