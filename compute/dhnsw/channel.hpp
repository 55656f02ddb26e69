#pragma once
// The bounded queue between two stages of the d-HNSW query pipeline (compute/dhnsw/pipeline.cpp).
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace dmhnsw::dhnsw {

/// A bounded queue between two stages. close() wakes everyone: push then fails, pop drains
/// what is left and then returns nothing.
template <class T>
class Channel {
 public:
  explicit Channel(size_t cap) : cap_(std::max<size_t>(cap, 1)) {}
  bool push(T v) {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return closed_ || q_.size() < cap_; });
    if (closed_) return false;
    q_.push_back(std::move(v));
    cv_.notify_all();
    return true;
  }
  std::optional<T> pop() {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return closed_ || !q_.empty(); });
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    cv_.notify_all();
    return v;
  }
  void close() {
    std::lock_guard g(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  /// Closes and drops what is queued: only once no other thread uses the channel (items may
  /// hold buffers of a pool that is not thread-safe).
  void clear() {
    std::lock_guard g(mu_);
    closed_ = true;
    q_.clear();
    cv_.notify_all();
  }

 private:
  size_t cap_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
  bool closed_ = false;
};

}  // namespace dmhnsw::dhnsw
