#pragma once
// Internal to common/fabric: the classes behind with_replicas() (replicas.hpp). replicas.cpp
// holds the datapath (ReplicatedEndpoint) and the view; replica_watch.cpp the computenode's side
// of the rejoin protocol (docs/replication.md, "Replacing a memnode").
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/fabric/rejoin_layout.hpp"
#include "common/fabric/replicas.hpp"

namespace dmhnsw::fabric {

class ReplicatedCluster;

/// Data operations one endpoint has on one set, posted and not finished. Written only by the
/// endpoint's thread (so the datapath touches no cache line another thread writes), summed by the
/// watcher (ReplicatedCluster::in_flight).
struct alignas(64) SetCount {
  std::atomic<int64_t> in_flight{0};  // every data op
  std::atomic<int64_t> unmarked{0};   // of which changes posted before a rejoin's marking began
};

class ReplicatedEndpoint final : public Endpoint {
 public:
  /// `control`: the rejoin protocol's own endpoint, never held and never marking.
  ReplicatedEndpoint(ReplicatedCluster& c, std::unique_ptr<Endpoint> inner, bool control);
  ~ReplicatedEndpoint() override;

  Status post(std::span<const Op> ops) override;
  std::string describe(const Completion& c) const override;
  Status send(uint16_t node, const void* data, size_t len) override;
  bool try_recv(Message& out) override;

 protected:
  BufferPool& pool() override { return inner_->pool(); }
  size_t poll_impl(std::span<Completion> out) override;
  size_t in_flight_impl() const override { return live_ + (ready_.size() - ready_head_) + held_.size(); }

 private:
  using Clock = std::chrono::steady_clock;
  enum class Stage : uint8_t { First, Mirrors, Mark };
  struct Pending {
    Op op;                   // the caller's operation (logical node)
    Stage stage = Stage::First;
    uint32_t waiting = 0;    // physical completions outstanding
    uint32_t succeeded = 0;  // WRITE copies that took it
    uint32_t tried = 0;      // bit per copy: READ or atomic sent there
    uint8_t primary = 0;     // atomics: the copy that ordered it
    bool marks = false;      // a rejoin runs in its set: mark the chunks it changed when done
    Status status = Status::Ok;
    Clock::time_point mirror_start{};
    std::vector<Buffer> scratch;  // mirrors' old values, by copy
    bool active = false;
  };

  uint32_t open(const Op& op);
  void finish(uint32_t i, Status s);
  bool first_stage(uint32_t i, std::vector<Op>& out);
  void on_completion(const Completion& pc);
  void start_mirrors(uint32_t i);
  /// The op changed its set's bytes: with a rejoin running there, WRITE its chunks' marks to the
  /// set's live copies before it completes; else complete it.
  void changed(uint32_t i);
  void post_now(std::vector<Op>& ops);
  /// Data operations only: counts `ops` in flight in their sets; false (nothing counted) when
  /// one of the sets is frozen.
  bool enter(std::span<const Op> ops);
  /// Posts ops already entered (or a control endpoint's).
  Status post_logical(std::span<const Op> ops);
  void sync_counters() { counters_ = inner_->counters(); }
  /// The owner's update of its own count: a plain store, visible to the watcher's acquire load.
  static void add(std::atomic<int64_t>& n, int64_t d) {
    n.store(n.load(std::memory_order_relaxed) + d, std::memory_order_release);
  }
  /// Undoes what open() and enter() counted for `p`.
  void uncount(const Pending& p);

  ReplicatedCluster& c_;
  std::unique_ptr<Endpoint> inner_;
  bool control_;
  std::vector<Pending> pend_;
  std::vector<uint32_t> free_;
  size_t live_ = 0;
  std::unique_ptr<SetCount[]> counts_;  // by set; registered with the cluster
  std::vector<Completion> ready_;       // a FIFO: ready_[ready_head_ ..]
  size_t ready_head_ = 0;
  std::vector<Op> held_;  // posted while their set was frozen
  std::vector<Op> phys_;          // post_logical's scratch
  std::vector<uint32_t> opened_;
  Buffer ones_;           // mark bytes
};

class ReplicatedCluster final : public Cluster {
 public:
  ReplicatedCluster(std::shared_ptr<Cluster> physical, unsigned copies, uint32_t cn_id);
  ~ReplicatedCluster() override;

  Provider provider() const override { return p_->provider(); }
  const std::vector<MemnodeInfo>& memnodes() const override { return infos_; }
  std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes) override {
    return std::make_unique<ReplicatedEndpoint>(*this, p_->make_endpoint(pool_bytes), false);
  }
  std::unique_ptr<Endpoint> make_control_endpoint(size_t pool_bytes) {
    return std::make_unique<ReplicatedEndpoint>(*this, p_->make_endpoint(pool_bytes), true);
  }
  bool alive(uint16_t node) const override;
  std::string dead_reason(uint16_t node) const override;
  void declare_dead(uint16_t node, const std::string& why) override {
    for (unsigned c = 0; c < r_; ++c) fence(node, c, why);
  }
  int nic_numa_node() const override { return p_->nic_numa_node(); }

  const std::shared_ptr<Cluster>& physical() const { return p_; }
  unsigned copies() const { return r_; }
  uint32_t cn_id() const { return cn_; }
  enum : uint8_t { kLive = 0, kDead = 1, kJoining = 2 };
  uint16_t phys(uint16_t l, unsigned c) const { return static_cast<uint16_t>(l * r_ + c); }
  const MemnodeInfo& phys_info(uint16_t l, unsigned c) const { return p_->memnodes()[phys(l, c)]; }

  /// A full copy that this computenode reads and writes.
  bool copy_alive(uint16_t l, unsigned c) const;
  /// The lowest live copy, or -1.
  int primary(uint16_t l) const;
  /// Waits until copy `c` of set `l` may order atomics (see kPrimarySettle in replicas.cpp).
  void settle(uint16_t l, unsigned c) const;
  /// A copy that failed an operation leaves this computenode's view until it rejoins.
  void fence(uint16_t l, unsigned c, const std::string& why);
  void count_read_retry() { read_retries_.fetch_add(1, std::memory_order_relaxed); }
  ReplicaView view() const;
  uint64_t failovers() const { return failovers_.load(); }

  // ---- the rejoin protocol's state per set (replica_watch.cpp drives it)
  struct SetState {
    std::atomic<bool> marking{false}, frozen{false};
    std::atomic<uint64_t> marks{0}, chunk{0};    // from the set's RejoinBlock
  };
  SetState& set(uint16_t l) { return *sets_[l]; }
  /// Every endpoint's data ops on set `l` not finished (`unmarked_only`: changes posted before
  /// marking began). A seq_cst fence first: a flag (`frozen`, `marking`) stored before the call
  /// and an endpoint's count stored before its own fence cannot both be missed (Dekker).
  int64_t in_flight(uint16_t l, bool unmarked_only) const;
  void enroll(const SetCount* counts);
  void withdraw(const SetCount* counts);
  /// Starts the watcher thread (replica_watch.cpp); called once the cluster is shared.
  void start_watcher();

 private:
  void note_dead(uint16_t p) const;
  friend class ReplicaWatch;

  std::shared_ptr<Cluster> p_;
  unsigned r_;
  uint32_t cn_;
  std::vector<MemnodeInfo> infos_;
  std::unique_ptr<std::atomic<int64_t>[]> seen_dead_;  // steady-clock ns when first seen dead, 0: never
  mutable std::unique_ptr<std::atomic<uint8_t>[]> state_;  // kLive, kDead, kJoining by physical memnode
  std::vector<std::unique_ptr<SetState>> sets_;
  mutable std::mutex counts_mu_;
  std::vector<const SetCount*> counts_;  // every data endpoint's, by set
  mutable std::atomic<uint64_t> failovers_{0};
  std::atomic<uint64_t> read_retries_{0}, rejoins_{0};
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

}  // namespace dmhnsw::fabric
