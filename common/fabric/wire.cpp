#include "common/fabric/wire.hpp"

#include "common/fabric/replicas.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dmhnsw::fabric {

namespace {

using Clock = std::chrono::steady_clock;

/// The links of one computenode: one per memnode, shared by its endpoints.
struct Links {
  explicit Links(size_t n) : busy_until(n, Clock::time_point{}) {}
  std::mutex mu;
  std::vector<Clock::time_point> busy_until;
};

}  // namespace

class WireEndpoint final : public Endpoint {
 public:
  WireEndpoint(std::unique_ptr<Endpoint> inner, WireModel m, std::shared_ptr<Links> links)
      : inner_(std::move(inner)), m_(std::move(m)), links_(std::move(links)) {}

  Status post(std::span<const Op> ops) override {
    const Clock::time_point now = Clock::now();
    std::vector<Clock::time_point> ready(ops.size());
    {
      std::lock_guard g(links_->mu);
      for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const uint16_t node = op.remote.node();
        const size_t bytes = op.kind == OpKind::Read || op.kind == OpKind::Write ? op.len : 8;
        Clock::time_point start = now;
        if (node < links_->busy_until.size()) {
          start = std::max(now, links_->busy_until[node]);
          links_->busy_until[node] = start + m_.transfer(bytes);
        }
        ready[i] = start + m_.transfer(bytes) +
                   std::chrono::nanoseconds(static_cast<int64_t>(std::llround(m_.latency_us * 1000.0)));
      }
    }
    const Status s = inner_->post(ops);
    counters_ = inner_->counters();
    if (s != Status::Ok) return s;
    for (size_t i = 0; i < ops.size(); ++i) due_.push_back({ops[i].tag, ready[i]});
    return s;
  }

  std::string describe(const Completion& c) const override { return inner_->describe(c); }
  Status send(uint16_t node, const void* data, size_t len) override {
    const Status s = inner_->send(node, data, len);
    counters_ = inner_->counters();
    return s;
  }
  bool try_recv(Message& out) override {
    const bool got = inner_->try_recv(out);
    counters_ = inner_->counters();
    return got;
  }

 protected:
  BufferPool& pool() override { return inner_->pool(); }

  size_t poll_impl(std::span<Completion> out) override {
    drain();
    size_t n = release(out);
    if (n == 0 && !held_.empty()) {
      // Nothing is due yet: sleep until the first completion is (at most 1 ms at a time, to
      // notice failures and new completions), like a worker blocked on a NIC. A wait shorter
      // than a sleep's own cost is spun by the caller's next poll instead.
      const auto now = Clock::now(), next = held_.top().ready;
      if (next - now > kSpinBelow) {
        if (!slack_set_) {  // this thread's timer slack: 1 us instead of 50 us
          prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
          slack_set_ = true;
        }
        std::this_thread::sleep_until(std::min(next - kWakeEarly, now + std::chrono::milliseconds(1)));
        drain();
        n = release(out);
      }
    }
    return n;
  }
  size_t in_flight_impl() const override { return inner_->in_flight() + held_.size(); }

 private:
  struct Held {
    Clock::time_point ready;
    uint64_t seq;
    Completion c;
    bool operator>(const Held& o) const { return ready != o.ready ? ready > o.ready : seq > o.seq; }
  };

  /// Completions of the provider, each held until its operation's due time (failures at once).
  void drain() {
    Completion cs[32];
    for (;;) {
      const size_t got = inner_->poll(cs);
      for (size_t i = 0; i < got; ++i) {
        Clock::time_point ready = Clock::time_point{};
        // The earliest posted op of that tag (a provider completes one tag's ops in post order).
        auto it = std::find_if(due_.begin(), due_.end(), [&](const Due& d) { return d.tag == cs[i].tag; });
        if (it != due_.end()) {
          ready = it->ready;
          due_.erase(it);
        }
        if (cs[i].status != Status::Ok) ready = Clock::time_point{};
        held_.push({ready, seq_++, cs[i]});
      }
      if (got < std::size(cs)) break;
    }
    counters_ = inner_->counters();
  }

  size_t release(std::span<Completion> out) {
    const Clock::time_point now = Clock::now();
    size_t n = 0;
    while (n < out.size() && !held_.empty() && held_.top().ready <= now) {
      out[n++] = held_.top().c;
      held_.pop();
    }
    return n;
  }

  static constexpr std::chrono::microseconds kSpinBelow{30}, kWakeEarly{8};
  std::unique_ptr<Endpoint> inner_;
  WireModel m_;
  std::shared_ptr<Links> links_;
  bool slack_set_ = false;
  // In post order. A flat list searched from the front: tens of operations are in flight, and a
  // map of queues allocated twice per tag (a replica set gives every operation a tag of its own).
  struct Due {
    uint64_t tag;
    Clock::time_point ready;
  };
  std::vector<Due> due_;
  std::priority_queue<Held, std::vector<Held>, std::greater<>> held_;
  uint64_t seq_ = 0;
};

namespace {

class WireCluster final : public Cluster {
 public:
  WireCluster(std::shared_ptr<Cluster> inner, WireModel m)
      : inner_(std::move(inner)), m_(std::move(m)), links_(std::make_shared<Links>(inner_->memnodes().size())) {}
  Provider provider() const override { return inner_->provider(); }
  const std::vector<MemnodeInfo>& memnodes() const override { return inner_->memnodes(); }
  std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes) override {
    return std::make_unique<WireEndpoint>(inner_->make_endpoint(pool_bytes), m_, links_);
  }
  bool alive(uint16_t node) const override { return inner_->alive(node); }
  std::string dead_reason(uint16_t node) const override { return inner_->dead_reason(node); }
  void declare_dead(uint16_t node, const std::string& why) override { inner_->declare_dead(node, why); }
  int nic_numa_node() const override { return inner_->nic_numa_node(); }

 private:
  std::shared_ptr<Cluster> inner_;
  WireModel m_;
  std::shared_ptr<Links> links_;
};

}  // namespace

std::chrono::nanoseconds WireModel::transfer(size_t bytes) const {
  if (gbytes_per_s <= 0) return std::chrono::nanoseconds{0};
  return std::chrono::nanoseconds(static_cast<int64_t>(std::llround(static_cast<double>(bytes) / gbytes_per_s)));
}

WireModel parse_wire(const std::string& text) {
  WireModel m;
  m.name = text;
  if (text == "none" || text.empty()) return WireModel{};
  if (text == "rdma-100g") return {2.0, 12.5, text};  // ConnectX-5/6 READ round trip, 100 Gb/s
  if (text == "rdma-56g") return {2.5, 7.0, text};    // ConnectX-3 FDR READ round trip, 56 Gb/s
  if (text == "cxl") return {0.35, 32.0, text};       // CXL memory expander load, PCIe 5.0 x8
  const auto comma = text.find(',');
  try {
    if (comma == std::string::npos) throw std::invalid_argument("no comma");
    size_t used = 0;
    m.latency_us = std::stod(text.substr(0, comma), &used);
    if (used != comma) throw std::invalid_argument("latency");
    const std::string bw = text.substr(comma + 1);
    m.gbytes_per_s = std::stod(bw, &used);
    if (used != bw.size()) throw std::invalid_argument("bandwidth");
  } catch (const std::exception&) {
    throw std::invalid_argument("--wire '" + text + "': want none, cxl, rdma-56g, rdma-100g or LAT_US,GBPS (e.g. 2,12.5)");
  }
  if (!(m.latency_us >= 0 && m.latency_us <= 1e6) || !(m.gbytes_per_s >= 0 && m.gbytes_per_s <= 1e4))
    throw std::invalid_argument("--wire '" + text + "': latency in [0, 1e6] us and bandwidth in [0, 1e4] GB/s");
  m.name = "custom";
  return m;
}

std::string describe(const WireModel& m) {
  if (!m.enabled()) return "none";
  char b[128];
  std::snprintf(b, sizeof b, "%s (%g us, %g GB/s)", m.name.c_str(), m.latency_us, m.gbytes_per_s);
  return b;
}

std::shared_ptr<Cluster> with_wire(std::shared_ptr<Cluster> inner, const WireModel& m) {
  if (!m.enabled()) return inner;
  unsigned copies = 1;  // each copy of a replica set has a link of its own: the model goes under the sets
  uint32_t cn = 0;
  if (auto physical = replicas_physical(*inner, &copies, &cn))
    return with_replicas(std::make_shared<WireCluster>(std::move(physical), m), copies, cn);
  return std::make_shared<WireCluster>(std::move(inner), m);
}

}  // namespace dmhnsw::fabric
