#pragma once
// d-HNSW query-aware batched loading (paper section 4.3): which sub-HNSWs a batch of queries
// needs, each once, most-demanded first, and which of them an LRU cache of deserialized
// sub-HNSWs already holds.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace dmhnsw::dhnsw {

/// One sub-HNSW load of a batch and the queries (indexes into the batch) it serves.
struct PlanEntry {
  uint32_t sub = 0;
  std::vector<uint32_t> queries;
  bool cached = false;  // served from the cache: no fetch
};

struct BatchPlan {
  std::vector<PlanEntry> entries;  // in load order
  uint64_t needed = 0;             // distinct sub-HNSWs the batch needs
  uint64_t cache_hits = 0;         // entries served from the cache
  uint64_t fetches() const { return entries.size() - cache_hits; }
};

/// `probes[q]` lists the sub-HNSWs query q must search (its top-b partitions).
/// regroup: every needed sub-HNSW appears once, with all its queries, in order of falling
/// demand (ties: lower id first); `cached(sub)` marks the ones the cache holds (no fetch).
/// !regroup (the paper's naive loading): one entry per (query, sub-HNSW) in query order, no
/// cache.
BatchPlan plan_batch(const std::vector<std::vector<uint32_t>>& probes, bool regroup,
                     const std::function<bool(uint32_t)>& cached);

/// LRU cache of the most recently used `capacity` items by sub-HNSW id (thread-safe).
/// An item stays alive while someone holds its shared_ptr, even after eviction.
template <class T>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : cap_(capacity) {}
  size_t capacity() const { return cap_; }
  /// The item, marked most recently used; null when absent.
  std::shared_ptr<const T> get(uint32_t id) {
    std::lock_guard g(mu_);
    auto it = map_.find(id);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second.pos);
    return it->second.item;
  }
  bool contains(uint32_t id) const {
    std::lock_guard g(mu_);
    return map_.count(id) != 0;
  }
  /// Inserts or replaces; evicts the least recently used beyond capacity. No-op at capacity 0.
  void put(uint32_t id, std::shared_ptr<const T> item) {
    if (cap_ == 0) return;
    std::lock_guard g(mu_);
    auto it = map_.find(id);
    if (it != map_.end()) {
      it->second.item = std::move(item);
      order_.splice(order_.begin(), order_, it->second.pos);
      return;
    }
    order_.push_front(id);
    map_.emplace(id, Slot{std::move(item), order_.begin()});
    while (map_.size() > cap_) {
      map_.erase(order_.back());
      order_.pop_back();
      ++evictions_;
    }
  }
  void clear() {
    std::lock_guard g(mu_);
    map_.clear();
    order_.clear();
  }
  size_t size() const {
    std::lock_guard g(mu_);
    return map_.size();
  }
  uint64_t evictions() const {
    std::lock_guard g(mu_);
    return evictions_;
  }

 private:
  struct Slot {
    std::shared_ptr<const T> item;
    std::list<uint32_t>::iterator pos;
  };
  size_t cap_;
  mutable std::mutex mu_;
  std::list<uint32_t> order_;  // most recent first
  std::unordered_map<uint32_t, Slot> map_;
  uint64_t evictions_ = 0;
};

}  // namespace dmhnsw::dhnsw
