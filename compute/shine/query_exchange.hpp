#pragma once
// What a shine query run's computenodes tell each other through the memnodes' relays: routed
// queries, queue lengths for adaptive routing, and per-phase done counts; and the working
// queue they land in (Exchange), shared by the relay's I/O thread, the router and the workers.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace dmhnsw::shine::query_detail {

// ---- application messages carried by the relay (computenode to computenode)
enum : uint32_t { kQueryMsg = 0x5155'0001u, kProgressMsg = 0x5155'0002u, kDoneMsg = 0x5155'0003u };
struct QueryMsg {  // followed by dim floats
  uint32_t kind;
  uint32_t phase;
  uint64_t pos;  // position in the workload stream (its ground truth)
  uint32_t origin;
  uint32_t dim;
};
struct ProgressMsg {
  uint32_t kind;
  uint32_t phase;
  uint64_t batch;
  uint64_t queue_len;
};
struct DoneMsg {
  uint32_t kind;
  uint32_t phase;
  uint64_t sent;  // queries the sender routed to the receiver in this phase
};
static_assert(sizeof(QueryMsg) == 24 && sizeof(ProgressMsg) == 24 && sizeof(DoneMsg) == 16);
static_assert(std::is_trivially_copyable_v<QueryMsg> && std::is_trivially_copyable_v<ProgressMsg>);

struct Item {
  uint32_t pos;
  bool routed;             // arrived from another computenode
  std::vector<float> vec;  // routed: the query as it travelled; local: empty (workload row)
};

/// What the relay's I/O thread, the router thread and the workers share.
class Exchange {
 public:
  explicit Exchange(uint32_t k) : k_(k), progress_(k, 0) {}

  void push(uint32_t phase, Item it) {
    std::lock_guard g(mu_);
    ph(phase).queue.push_back(std::move(it));
  }
  bool pop(uint32_t phase, Item& out) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    if (p.queue.empty()) return false;
    out = std::move(p.queue.front());
    p.queue.pop_front();
    ++p.in_service;
    return true;
  }
  void served(uint32_t phase) {
    std::lock_guard g(mu_);
    --ph(phase).in_service;
  }
  size_t queue_len(uint32_t phase) {
    std::lock_guard g(mu_);
    return ph(phase).queue.size();
  }
  void on_query(uint32_t from, uint32_t phase, Item it) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    ++p.received[from];
    ++p.received_total;
    p.queue.push_back(std::move(it));
  }
  void on_done(uint32_t from, uint32_t phase, uint64_t sent) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    p.done[from] = true;
    p.promised[from] = sent;
  }
  void on_bounce(uint32_t phase, Item it) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    ++p.bounced;
    p.queue.push_back(std::move(it));
  }
  void set_progress(uint32_t cn, uint64_t v) {
    std::lock_guard g(mu_);
    if (cn < k_) progress_[cn] = v;
  }
  std::vector<uint64_t> progress() {
    std::lock_guard g(mu_);
    return progress_;
  }
  void set_gone(uint32_t cn) {
    std::lock_guard g(mu_);
    gone_.insert(cn);
  }
  bool gone(uint32_t cn) {
    std::lock_guard g(mu_);
    return gone_.count(cn) > 0;
  }
  /// The phase is over for this computenode: its router is done, every live peer said how
  /// many it routed here and all of them arrived, nothing queued or in service.
  bool finished(uint32_t phase, uint32_t self, bool need_done, bool router_done) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    if (!router_done || !p.queue.empty() || p.in_service > 0) return false;
    if (!need_done) return true;
    for (uint32_t c = 0; c < k_; ++c) {
      if (c == self || gone_.count(c)) continue;
      if (!p.done[c] || p.received[c] < p.promised[c]) return false;
    }
    return true;
  }
  std::string describe(uint32_t phase) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    std::string out = "phase " + std::to_string(phase) + ": queued " + std::to_string(p.queue.size()) + ", in service " +
                      std::to_string(p.in_service);
    for (uint32_t c = 0; c < k_; ++c)
      out += "; cn " + std::to_string(c) + (gone_.count(c) ? " gone" : "") + " done " + std::to_string(p.done[c]) +
             " received " + std::to_string(p.received[c]) + " of " + std::to_string(p.promised[c]);
    return out;
  }
  uint64_t received(uint32_t phase) {
    std::lock_guard g(mu_);
    return ph(phase).received_total;
  }
  uint64_t bounced(uint32_t phase) {
    std::lock_guard g(mu_);
    return ph(phase).bounced;
  }

 private:
  struct Phase {
    std::deque<Item> queue;
    std::map<uint32_t, uint64_t> received, promised;
    std::map<uint32_t, bool> done;
    uint64_t received_total = 0, bounced = 0;
    int64_t in_service = 0;
  };
  Phase& ph(uint32_t phase) { return phases_[phase]; }
  uint32_t k_;
  std::mutex mu_;
  std::map<uint32_t, Phase> phases_;
  std::vector<uint64_t> progress_;
  std::set<uint32_t> gone_;
};

}  // namespace dmhnsw::shine::query_detail
