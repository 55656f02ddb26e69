#include "compute/coro.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

namespace dmhnsw::compute {

using fabric::Completion;
using fabric::Op;
using fabric::OpKind;
using fabric::Status;

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

size_t Scheduler::step() {
  std::array<Completion, 64> out;
  size_t n = ep_.poll(out);
  ready_.clear();
  for (size_t i = 0; i < n; ++i) {
    auto& sl = slots_[out[i].tag];
    if (out[i].status != Status::Ok && sl.fail.status == Status::Ok) sl.fail = out[i];
    if (--sl.pending == 0) ready_.push_back(sl.h);
  }
  const size_t nr = ready_.size();
  // resume() may run a coroutine into its next io(), which never touches ready_.
  for (size_t i = 0; i < nr; ++i) ready_[i].resume();
  size_t woken = 0;
  if (!yielded_.empty()) {
    // Only coroutines that yielded and no I/O in flight: nothing to wait for but time.
    if (nr == 0 && ep_.in_flight() == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
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

Task<uint64_t> compare_swap(Scheduler& s, RemotePtr word, uint64_t expect, uint64_t want, IoStats* io,
                            const char* what) {
  fabric::Buffer b = s.endpoint().alloc(8);
  fabric::Op op = fabric::Op::compare_swap(word, expect, want, b.as<uint64_t>());
  const fabric::Completion c = co_await s.io(std::span<fabric::Op>(&op, 1), true, io);
  if (c.status != fabric::Status::Ok) throw fabric::FabricError(std::string(what) + ": " + s.endpoint().describe(c));
  uint64_t old = 0;
  std::memcpy(&old, b.data(), 8);
  co_return old;
}

}  // namespace dmhnsw::compute
