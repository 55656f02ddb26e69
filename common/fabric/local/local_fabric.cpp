#include "common/fabric/local/local_fabric.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>

namespace dmhnsw::fabric {

using Clock = std::chrono::steady_clock;

namespace {

// A region is memory that other endpoints (threads) read, write and update with atomics at the
// same time, as a NIC would: READ and WRITE copy it in relaxed atomic 8-byte words where
// aligned, bytes elsewhere, so a READ beside another thread's fetch_add or compare_swap (a board
// counter polled while others add to it) is no data race (a plain memcpy was, for TSan and the
// language). Each aligned word is read or written whole; nothing is ordered across words, as
// with RDMA.
template <typename T>
T load_relaxed(const char* p) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(const_cast<char*>(p))).load(std::memory_order_relaxed);
}
template <typename T>
void store_relaxed(char* p, T v) {
  std::atomic_ref<T>(*reinterpret_cast<T*>(p)).store(v, std::memory_order_relaxed);
}

void read_region(char* dst, const char* src, size_t len) {
  for (; len > 0 && reinterpret_cast<uintptr_t>(src) % 8 != 0; --len) *dst++ = load_relaxed<char>(src++);
  for (; len >= 8; len -= 8, src += 8, dst += 8) {
    const uint64_t w = load_relaxed<uint64_t>(src);
    std::memcpy(dst, &w, 8);
  }
  for (; len > 0; --len) *dst++ = load_relaxed<char>(src++);
}

void write_region(char* dst, const char* src, size_t len) {
  for (; len > 0 && reinterpret_cast<uintptr_t>(dst) % 8 != 0; --len) store_relaxed<char>(dst++, *src++);
  for (; len >= 8; len -= 8, src += 8, dst += 8) {
    uint64_t w;
    std::memcpy(&w, src, 8);
    store_relaxed<uint64_t>(dst, w);
  }
  for (; len > 0; --len) store_relaxed<char>(dst++, *src++);
}

}  // namespace

std::shared_ptr<LocalCluster> LocalCluster::create(uint16_t num_nodes, uint64_t region_bytes) {
  return std::shared_ptr<LocalCluster>(new LocalCluster(num_nodes, region_bytes));
}

LocalCluster::LocalCluster(uint16_t num_nodes, uint64_t region_bytes)
    : region_bytes_(region_bytes), dead_(new std::atomic<bool>[num_nodes]), dead_reason_(num_nodes) {
  for (uint16_t i = 0; i < num_nodes; ++i) {
    size_t alloc = (region_bytes + 4095) / 4096 * 4096;
    char* mem = static_cast<char*>(std::aligned_alloc(4096, alloc));
    if (mem == nullptr) throw FabricError("LocalCluster: cannot allocate " + std::to_string(region_bytes) + " bytes");
    std::memset(mem, 0, alloc);
    regions_.emplace_back(mem);
    MemnodeInfo info;
    info.id = i;
    info.address = "local:" + std::to_string(i);
    info.region_size = region_bytes;
    infos_.push_back(info);
    dead_[i].store(false);
  }
  handler_ = [](uint16_t, const Message& in, std::function<void(Message)> reply) { reply(in); };
}

void LocalCluster::refresh_headers() {
  for (auto& info : infos_) std::memcpy(info.header.data(), region(info.id), std::min<uint64_t>(kHeaderBlobBytes, region_bytes_));
}

bool LocalCluster::alive(uint16_t node) const { return node < infos_.size() && !dead_[node].load(); }

std::string LocalCluster::dead_reason(uint16_t node) const {
  std::lock_guard g(mu_);
  return node < dead_reason_.size() ? dead_reason_[node] : "unknown memory node";
}

void LocalCluster::set_failure_rate(double p, uint64_t seed) {
  std::lock_guard g(mu_);
  fail_rng_.seed(seed);
  failure_rate_.store(p);
}

void LocalCluster::disconnect(uint16_t node, const std::string& reason) {
  std::lock_guard g(mu_);
  dead_reason_.at(node) = reason;
  dead_[node].store(true);
}

void LocalCluster::set_message_handler(MessageHandler h) {
  std::lock_guard g(mu_);
  handler_ = std::move(h);
}

bool LocalCluster::should_fail(const Op& op) {
  uint64_t n = fail_next_.load();
  const int node = fail_node_.load(), kind = fail_kind_.load();
  const bool picked =
      (node < 0 || node == op.remote.node()) && (kind < 0 || kind == static_cast<int>(op.kind));
  while (n > 0 && picked) {
    if (fail_next_.compare_exchange_weak(n, n - 1)) return true;
  }
  double p = failure_rate_.load();
  if (p <= 0) return false;
  std::lock_guard g(mu_);
  return static_cast<double>(fail_rng_() >> 11) * 0x1.0p-53 < p;
}

// ------------------------------------------------------------------ endpoint
class LocalEndpoint final : public Endpoint {
 public:
  LocalEndpoint(std::shared_ptr<LocalCluster> c, size_t pool_bytes) : cluster_(std::move(c)), pool_(pool_bytes) {}

  Status post(std::span<const Op> ops) override {
    // Validate the whole batch first: nothing is posted when any op is malformed.
    for (const Op& op : ops) {
      Status s = check(op);
      if (s != Status::Ok) return s;
    }
    auto ready = Clock::now() + std::chrono::microseconds(cluster_->delay_us_.load());
    for (const Op& op : ops) {
      pending_.push_back({op, ready});
      ++counters_.ops[static_cast<int>(op.kind)];
      if (op.kind == OpKind::Read) counters_.bytes_read += op.len;
      if (op.kind == OpKind::Write) counters_.bytes_written += op.len;
    }
    if (!ops.empty()) ++counters_.doorbells;
    return Status::Ok;
  }

  const char* mapped(RemotePtr at, size_t len) const override {
#if defined(__SANITIZE_THREAD__)
    // Plain loads beside other threads' writes are what TSan reports (a READ copies relaxed
    // atomic words): under TSan every access goes through READs.
    (void)at;
    (void)len;
    return nullptr;
#else
    const uint16_t node = at.node();
    // Injected delays and failures apply to operations: while any is set, nothing is in place.
    if (node >= cluster_->infos_.size() || !cluster_->alive(node) || cluster_->delay_us_.load() != 0 ||
        cluster_->fail_next_.load() != 0 || cluster_->failure_rate_.load() > 0)
      return nullptr;
    if (at.offset() > cluster_->region_bytes_ || len > cluster_->region_bytes_ - at.offset()) return nullptr;
    return cluster_->regions_[node].get() + at.offset();
#endif
  }

  Status send(uint16_t node, const void* data, size_t len) override {
    if (node >= cluster_->infos_.size()) return Status::UnknownNode;
    if (!cluster_->alive(node)) return Status::PeerDead;
    if (len > kMaxMessage) return Status::OutOfBounds;
    Message m;
    m.from_node = 0xffff;
    m.payload.assign(static_cast<const char*>(data), static_cast<const char*>(data) + len);
    LocalCluster::MessageHandler h;
    {
      std::lock_guard g(cluster_->mu_);
      h = cluster_->handler_;
    }
    h(node, m, [this, node](Message reply) {
      reply.from_node = node;
      inbox_.push_back(std::move(reply));
    });
    ++counters_.msgs_sent;
    return Status::Ok;
  }

  bool try_recv(Message& out) override {
    if (inbox_.empty()) return false;
    out = std::move(inbox_.front());
    inbox_.pop_front();
    ++counters_.msgs_received;
    return true;
  }

 protected:
  BufferPool& pool() override { return pool_; }
  std::string node_name(uint16_t node) const override {
    std::string n = "memnode " + std::to_string(node) + " (local)";
    if (!cluster_->alive(node)) n += " [" + cluster_->dead_reason(node) + "]";
    return n;
  }
  size_t in_flight_impl() const override { return pending_.size(); }

  size_t poll_impl(std::span<Completion> out) override {
    size_t n = 0;
    auto now = Clock::now();
    while (n < out.size() && !pending_.empty()) {
      auto& [op, ready] = pending_.front();
      bool dead = !cluster_->alive(op.remote.node());
      if (!dead && ready > now) break;  // in order: later ops are not ready either
      out[n++] = execute(op, dead);
      pending_.pop_front();
    }
    return n;
  }

 private:
  Status check(const Op& op) const {
    uint16_t node = op.remote.node();
    if (node >= cluster_->infos_.size()) return Status::UnknownNode;
    if (!cluster_->alive(node)) return Status::PeerDead;
    size_t len = (op.kind == OpKind::Read || op.kind == OpKind::Write) ? op.len : 8;
    if (op.remote.offset() > cluster_->region_bytes_ || len > cluster_->region_bytes_ - op.remote.offset())
      return Status::OutOfBounds;
    if (!pool_.contains(op.local, len)) return Status::BadLocalBuffer;
    if ((op.kind == OpKind::FetchAdd || op.kind == OpKind::CompareSwap) && op.remote.offset() % 8 != 0)
      return Status::Misaligned;
    return Status::Ok;
  }

  Completion execute(const Op& op, bool dead) {
    Completion c{op.tag, Status::Ok, op.kind, op.remote.node()};
    if (dead) {
      c.status = Status::PeerDead;
      return c;
    }
    if (cluster_->should_fail(op)) {
      c.status = Status::RemoteError;
      return c;
    }
    char* remote = cluster_->region(op.remote.node()) + op.remote.offset();
    switch (op.kind) {
      case OpKind::Read: read_region(static_cast<char*>(op.local), remote, op.len); break;
      case OpKind::Write: write_region(remote, static_cast<const char*>(op.local), op.len); break;
      case OpKind::FetchAdd: {
        std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(remote));
        *static_cast<uint64_t*>(op.local) = word.fetch_add(op.operand);
        break;
      }
      case OpKind::CompareSwap: {
        std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(remote));
        uint64_t expected = op.compare;
        word.compare_exchange_strong(expected, op.operand);
        *static_cast<uint64_t*>(op.local) = expected;  // the old value either way
        break;
      }
    }
    return c;
  }

  struct Pending {
    Op op;
    Clock::time_point ready;
  };
  std::shared_ptr<LocalCluster> cluster_;
  BufferPool pool_;
  std::deque<Pending> pending_;
  std::deque<Message> inbox_;
};

std::unique_ptr<Endpoint> LocalCluster::make_endpoint(size_t pool_bytes) {
  return std::make_unique<LocalEndpoint>(shared_from_this(), pool_bytes);
}

}  // namespace dmhnsw::fabric
