#include "compute/dhnsw/mastership.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "common/timing.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/layout.hpp"

namespace dmhnsw::dhnsw {

bool Mastership::acquire(fabric::Endpoint& ep, bool wait) {
  word_ = lock_word(cn_, static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  uint64_t seen = 0;
  auto since = Clock::now();
  const auto start = Clock::now();
  for (;;) {
    const uint64_t old = ep.compare_swap(control_ptr(offsetof(Control, master)), 0, word_);
    if (old == 0) break;
    if (old != seen) {
      if (!wait || seconds_since(start) * 1000 > 2.0 * lease_ms_) return false;  // a live master works
      seen = old;
      since = Clock::now();
    } else if (seconds_since(since) * 1000 > lease_ms_) {
      if (ep.compare_swap(control_ptr(offsetof(Control, master)), old, word_) == old) {
        spdlog::warn("dhnsw rebuild: took over from master computenode {} (its word unchanged for {} ms)",
                     lock_owner(old), lease_ms_);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  held_ = true;
  renewer_ = std::thread([this] { renew(); });
  return true;
}

void Mastership::release() {
  if (!held_) return;
  stop_.store(true);
  if (renewer_.joinable()) renewer_.join();
  try {
    auto ep = c_.make_endpoint(1u << 20);
    ep->compare_swap(control_ptr(offsetof(Control, master)), word_, 0);
  } catch (const std::exception& e) {
    spdlog::warn("dhnsw rebuild: releasing the master word: {}", e.what());
  }
  held_ = false;
}

void Mastership::renew() {
  try {
    auto ep = c_.make_endpoint(1u << 20);
    uint64_t ticket = word_;
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::max<uint32_t>(10, lease_ms_ / 4)));
      const uint64_t next = lock_word(cn_, ++ticket);
      if (ep->compare_swap(control_ptr(offsetof(Control, master)), word_, next) != word_) {
        lost_.store(true);
        return;
      }
      word_ = next;
    }
  } catch (const std::exception& e) {
    spdlog::warn("dhnsw rebuild: renewing the master word: {}", e.what());
    lost_.store(true);
  }
}

}  // namespace dmhnsw::dhnsw
