#pragma once
// What a shine query run's computenodes tell each other through the memnodes' relays: routed
// queries, queue lengths for adaptive routing, and per-phase done counts; and the working
// queue they land in (Exchange), shared by the relay's I/O thread, the router and the workers.
//
// A relay is a memnode process: with replica sets, a copy that dies takes the messages it
// held with it. So each routed query carries its number in the sender's stream to that
// receiver (seq); the receiver drops repeats, and after a copy died a receiver still missing
// queries or a done count asks the sender (SyncMsg: the numbers it lacks, and from where on it
// has nothing), which sends those again and its done count.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace dmhnsw::shine::query_detail {

// ---- application messages carried by the relay (computenode to computenode)
enum : uint32_t {
  kQueryMsg = 0x5155'0001u,
  kProgressMsg = 0x5155'0002u,
  kDoneMsg = 0x5155'0003u,
  kSyncMsg = 0x5155'0004u,
};
struct QueryMsg {  // followed by dim floats
  uint32_t kind;
  uint32_t phase;
  uint32_t pos;  // position in the workload stream (its ground truth)
  uint32_t seq;  // the sender's count of queries routed to this receiver in this phase, before this one
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
struct SyncMsg {  // receiver -> sender; followed by `missing` uint32 seqs below `next`
  uint32_t kind;
  uint32_t phase;
  uint32_t next;     // every seq from here on is missing too
  uint32_t missing;  // at most kSyncMissingMax
};
inline constexpr uint32_t kSyncMissingMax = 8000;  // 32 KB: one relay message
inline constexpr uint32_t kMaxSeq = 1u << 28;       // bounds a receiver's seen-bitmap per sender (32 MiB)
static_assert(sizeof(QueryMsg) == 24 && sizeof(ProgressMsg) == 24 && sizeof(DoneMsg) == 16 && sizeof(SyncMsg) == 16);
static_assert(std::is_trivially_copyable_v<QueryMsg> && std::is_trivially_copyable_v<ProgressMsg> &&
              std::is_trivially_copyable_v<SyncMsg>);

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
    bool wake = false;
    {
      std::lock_guard g(mu_);
      auto& p = ph(phase);
      if (p.queue.empty()) return false;
      out = std::move(p.queue.front());
      p.queue.pop_front();
      ++p.in_service;
      wake = p.wake_at != kNoWaiter && p.queue.size() <= p.wake_at;
      if (wake) p.wake_at = kNoWaiter;
    }
    if (wake) shorter_.notify_all();
    return true;
  }
  /// Blocks while the phase's queue is longer than `len`, at most `most`; true once it is not.
  /// The router waits here rather than polling: a worker wakes it once, at `len`, so a
  /// router kept 2 len ahead wakes once per len queries (its 100 us poll took 2.6 % of a
  /// 1-thread run's samples).
  bool wait_shorter(uint32_t phase, size_t len, std::chrono::milliseconds most) {
    std::unique_lock g(mu_);
    auto& p = ph(phase);
    // Armed again on every wake: a peer's routed queries may refill the queue between the pop
    // that woke this waiter (and disarmed it) and this check.
    return shorter_.wait_for(g, most, [&] {
      if (p.queue.size() <= len) return true;
      p.wake_at = std::min(p.wake_at, len);
      return false;
    });
  }
  void served(uint32_t phase) {
    std::lock_guard g(mu_);
    --ph(phase).in_service;
  }
  size_t queue_len(uint32_t phase) {
    std::lock_guard g(mu_);
    return ph(phase).queue.size();
  }
  /// A routed query arrived; false for a repeat (sent again after a sync), which is dropped.
  bool on_query(uint32_t from, uint32_t phase, uint32_t seq, Item it) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    std::vector<bool>& seen = p.seen[from];
    if (seq >= seen.size()) seen.resize(std::max<size_t>(seq + 1, seen.size() * 2), false);
    if (seen[seq]) return false;
    seen[seq] = true;
    p.next[from] = std::max(p.next[from], seq + 1);
    ++p.received[from];
    ++p.received_total;
    p.queue.push_back(std::move(it));
    return true;
  }
  /// Sender side: numbers a query routed to `to` (its seq) and keeps its position for a resend.
  uint32_t log_sent(uint32_t phase, uint32_t to, uint32_t pos) {
    std::lock_guard g(mu_);
    auto& log = ph(phase).sent[to];
    log.push_back(pos);
    return static_cast<uint32_t>(log.size() - 1);
  }
  /// The positions of the queries routed to `to` with the seqs in `missing` or from `next` on.
  std::vector<std::pair<uint32_t, uint32_t>> to_resend(uint32_t phase, uint32_t to, uint32_t next,
                                                       const std::vector<uint32_t>& missing) {
    std::lock_guard g(mu_);
    const auto& log = ph(phase).sent[to];
    std::vector<std::pair<uint32_t, uint32_t>> out;  // (seq, pos)
    for (uint32_t q : missing)
      if (q < log.size() && q < next) out.emplace_back(q, log[q]);
    for (size_t q = next; q < log.size(); ++q) out.emplace_back(static_cast<uint32_t>(q), log[q]);
    return out;
  }
  /// Sender side: the done count sent to `to` in this phase, once sent.
  void note_done_sent(uint32_t phase, uint32_t to, uint64_t sent) {
    std::lock_guard g(mu_);
    ph(phase).done_sent[to] = sent;
  }
  std::optional<uint64_t> done_sent(uint32_t phase, uint32_t to) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    auto it = p.done_sent.find(to);
    if (it == p.done_sent.end()) return std::nullopt;
    return it->second;
  }
  /// Receiver side: a sync for every live peer still owing queries or its done count; the
  /// seqs missing below the highest one seen (at most kSyncMissingMax), and that seq + 1.
  struct Owed {
    uint32_t from, next;
    std::vector<uint32_t> missing;
  };
  std::vector<Owed> owed(uint32_t phase, uint32_t self) {
    std::lock_guard g(mu_);
    auto& p = ph(phase);
    std::vector<Owed> out;
    for (uint32_t c = 0; c < k_; ++c) {
      if (c == self || gone_.count(c)) continue;
      if (p.done[c] && p.received[c] >= p.promised[c]) continue;
      Owed o{c, p.next[c], {}};
      const std::vector<bool>& seen = p.seen[c];
      for (uint32_t q = 0; q < o.next && o.missing.size() < kSyncMissingMax; ++q)
        if (!seen[q]) o.missing.push_back(q);
      out.push_back(std::move(o));
    }
    return out;
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
    std::map<uint32_t, std::vector<bool>> seen;       // by sender: seqs received
    std::map<uint32_t, uint32_t> next;                // by sender: highest seq received + 1
    std::map<uint32_t, std::vector<uint32_t>> sent;   // by receiver: positions routed there, by seq
    std::map<uint32_t, uint64_t> done_sent;           // by receiver: the done count sent
    uint64_t received_total = 0, bounced = 0;
    int64_t in_service = 0;
    size_t wake_at = kNoWaiter;  // a pop that leaves the queue this short wakes wait_shorter
  };
  static constexpr size_t kNoWaiter = ~size_t{0};
  Phase& ph(uint32_t phase) { return phases_[phase]; }
  uint32_t k_;
  std::mutex mu_;
  std::condition_variable shorter_;
  std::map<uint32_t, Phase> phases_;
  std::vector<uint64_t> progress_;
  std::set<uint32_t> gone_;
};

}  // namespace dmhnsw::shine::query_detail
