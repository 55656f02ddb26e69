// libfabric's compute side (shm, tcp): the cluster and its endpoints (lf_region_server.cpp: the
// memory side).
#include "common/fabric/cluster.hpp"

#include <poll.h>
#include <sched.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/fabric/control_cluster.hpp"
#include "common/fabric/libfabric/lf.hpp"

namespace dmhnsw::fabric {

using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kRecvDepth = 16;           // posted receive buffers per endpoint

// Context of one posted operation. fi_context2 must come first (FI_CONTEXT2 mode).
struct OpCtx {
  fi_context2 fi;
  uint64_t tag = 0;
  OpKind kind = OpKind::Read;
  uint16_t node = 0;
  enum : uint8_t { kOp, kRecv, kSend } role = kOp;
  bool orphaned = false;  // already reported failed (memnode died); free when the provider returns it
  bool in_use = false;
  char* buf = nullptr;    // recv/send buffer
  uint32_t index = 0;
};

class FabricCluster;

class FabricEndpoint final : public Endpoint {
 public:
  FabricEndpoint(std::shared_ptr<FabricCluster> c, size_t pool_bytes);
  ~FabricEndpoint() override;
  Status post(std::span<const Op> ops) override;
  Status send(uint16_t node, const void* data, size_t len) override;
  bool try_recv(Message& out) override;

 protected:
  BufferPool& pool() override { return pool_; }
  std::string node_name(uint16_t node) const override;
  size_t poll_impl(std::span<Completion> out) override;
  size_t in_flight_impl() const override { return in_flight_; }

 private:
  OpCtx* get_ctx();
  void put_ctx(OpCtx* c);
  ssize_t post_one(const Op& op, OpCtx* ctx, uint64_t flags);
  void post_recv(OpCtx* ctx);
  size_t read_cq(std::span<Completion> out);
  size_t fail_dead(std::span<Completion> out);
  bool live_in_flight() const;
  /// For a loop waiting on `node` since `since`: every 256 calls, if the wait is older than
  /// the stall timeout, declares the memnode dead and returns true.
  bool stalled(uint16_t node, Clock::time_point since, uint32_t& calls);
  /// poll_impl found nothing: with operations in flight and no completion for the stall
  /// timeout, declares the memnodes they wait on dead.
  void check_in_flight_stall();

  std::shared_ptr<FabricCluster> cluster_;
  lf::RawEndpoint raw_;
  BufferPool pool_;
  lf::MemoryRegion pool_mr_;
  std::vector<fi_addr_t> addr_;      // by memnode id: messages
  std::vector<fi_addr_t> rma_addr_;  // by memnode id: one-sided operations (a lane, or addr_)
  std::vector<uint64_t> gens_;       // PeerState::generation the addresses are of
  uint64_t ordinal_ = 0;
  void set_peer_addr(uint16_t i);
  std::deque<OpCtx> ctxs_;       // stable addresses
  std::vector<OpCtx*> free_;
  size_t in_flight_ = 0;
  uint64_t seen_deaths_ = 0;
  uint64_t empty_polls_ = 0;
  std::optional<Clock::time_point> waiting_since_;  // first empty poll with operations in flight
  std::deque<Message> inbox_;
  std::vector<Buffer> msg_bufs_;
  std::vector<char> my_name_;  // this endpoint's fabric address, carried by its messages
};

class FabricCluster final : public ControlledCluster, public std::enable_shared_from_this<FabricCluster> {
 public:
  explicit FabricCluster(const ClusterOptions& o)
      : ControlledCluster(o), fault_stuck_on_death_(std::getenv("DMHNSW_FAULT_STUCK_ON_DEATH") != nullptr) {
    if (fault_stuck_on_death_)
      spdlog::warn("DMHNSW_FAULT_STUCK_ON_DEATH: an endpoint that sees a memnode die never returns (fault injection)");
  }
  /// Fault injection for tests: a call into the provider stuck for ever once a memnode died (what
  /// libfabric's shm can do when the dead process held one of its shared locks).
  bool fault_stuck_on_death() const { return fault_stuck_on_death_; }
  ~FabricCluster() override { stop_monitor(); }

  void connect() {
    connect_all([this](const ControlClient& cc) {
      if (!domain_) {
        domain_ = lf::Domain::open(options().provider, cc.local_ip());
        // The messaging endpoint: its address is what memnodes answer messages to.
        primary_ = std::make_unique<lf::RawEndpoint>(domain_, false);
        spdlog::debug("fabric: {}", domain_->describe());
      }
      return primary_->name();
    });
  }

  std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes) override {
    return std::make_unique<FabricEndpoint>(shared_from_this(), pool_bytes);
  }
  const std::shared_ptr<lf::Domain>& domain() const { return domain_; }

 private:
  std::shared_ptr<lf::Domain> domain_;
  std::unique_ptr<lf::RawEndpoint> primary_;
  const bool fault_stuck_on_death_;
};

}  // namespace

uint64_t rma_lane_for(uint32_t cn, uint32_t num_cns, uint64_t ordinal, uint64_t lanes) {
  constexpr uint64_t kLaneStride = 7919;  // a prime: no common factor with any lane count
  const uint64_t k = num_cns, c = cn;
  if (k > 0 && c < k && k <= lanes) return c + (ordinal % ((lanes - c + k - 1) / k)) * k;
  return (c + ordinal * kLaneStride) % lanes;
}

namespace {

// ------------------------------------------------------------------ endpoint
FabricEndpoint::FabricEndpoint(std::shared_ptr<FabricCluster> c, size_t pool_bytes)
    : cluster_(std::move(c)),
      raw_(cluster_->domain(), false),
      pool_(pool_bytes),
      pool_mr_(cluster_->domain(), pool_.arena(), pool_.arena_bytes(), FI_READ | FI_WRITE | FI_SEND | FI_RECV,
               cluster_->domain()->next_local_key()) {
  pool_mr_.bind(raw_.ep());
  my_name_ = raw_.name();
  if (my_name_.size() > lf::kMaxAddrBytes) throw FabricError("fabric address longer than " + std::to_string(lf::kMaxAddrBytes) + " bytes");
  cluster_->register_address(my_name_);  // memnodes take messages only from admitted addresses
  // Endpoints spread over the memnodes' RMA lanes. With K computenodes and L ≥ K lanes,
  // computenode c owns lanes c, c + K, c + 2K, ... and its e-th endpoint takes the e-th of
  // them (cyclically): no two computenodes share a lane, so one that dies inside a READ (and
  // leaves its lane's lock held, libfabric shm) stops nobody else's READs. Otherwise endpoint e
  // takes lane (c + kLaneStride·e) mod L: the first endpoints of different computenodes get
  // different lanes and one computenode's later endpoints step away from its neighbours'.
  ordinal_ = cluster_->next_endpoint_ordinal();
  addr_.assign(cluster_->num_peers(), FI_ADDR_NOTAVAIL);
  rma_addr_.assign(cluster_->num_peers(), FI_ADDR_NOTAVAIL);
  gens_.assign(cluster_->num_peers(), 0);
  for (uint16_t i = 0; i < cluster_->num_peers(); ++i) set_peer_addr(i);
  seen_deaths_ = cluster_->deaths();
  for (size_t i = 0; i < kRecvDepth; ++i) {
    msg_bufs_.push_back(pool_.alloc(lf::kWireMsgBytes));
    OpCtx* ctx = get_ctx();
    ctx->role = OpCtx::kRecv;
    ctx->buf = msg_bufs_.back().data();
    post_recv(ctx);
  }
}

void FabricEndpoint::set_peer_addr(uint16_t i) {
  const PeerState& p = cluster_->peer(i);
  gens_[i] = p.generation.load();
  if (p.fabric_addr.empty()) return;  // a copy of a replica set that was dead when we joined
  addr_[i] = raw_.insert(p.fabric_addr);
  rma_addr_[i] = p.rma_lanes.empty()
                     ? addr_[i]
                     : raw_.insert(p.rma_lanes[rma_lane_for(cluster_->cn_id(), cluster_->num_cns(), ordinal_,
                                                            p.rma_lanes.size())]);
}

FabricEndpoint::~FabricEndpoint() {
  // Give outstanding operations a moment to drain so the provider does not touch freed
  // buffers; operations toward dead memnodes are abandoned.
  auto deadline = Clock::now() + std::chrono::seconds(2);
  std::array<Completion, 32> buf;
  while (live_in_flight() && Clock::now() < deadline) read_cq(buf);
  raw_.close();  // before pool_mr_ and pool_ (declared after raw_) go: posted receives point into pool_
  cluster_->unregister_address(my_name_);
}

// Operations in flight toward memnodes still alive (those toward dead ones may never complete).
bool FabricEndpoint::live_in_flight() const {
  if (in_flight_ == 0) return false;
  for (const auto& c : ctxs_)
    if (c.in_use && c.role == OpCtx::kOp && cluster_->alive(c.node)) return true;
  return false;
}

std::string FabricEndpoint::node_name(uint16_t node) const { return cluster_->node_name(node); }

OpCtx* FabricEndpoint::get_ctx() {
  if (free_.empty()) {
    ctxs_.emplace_back();
    ctxs_.back().index = static_cast<uint32_t>(ctxs_.size() - 1);
    free_.push_back(&ctxs_.back());
  }
  OpCtx* c = free_.back();
  free_.pop_back();
  c->in_use = true;
  c->orphaned = false;
  c->role = OpCtx::kOp;
  return c;
}

void FabricEndpoint::put_ctx(OpCtx* c) {
  c->in_use = false;
  free_.push_back(c);
}

void FabricEndpoint::post_recv(OpCtx* ctx) {
  for (;;) {
    ssize_t rc = fi_recv(raw_.ep(), ctx->buf, lf::kWireMsgBytes, pool_mr_.desc(), FI_ADDR_UNSPEC, &ctx->fi);
    if (rc != -FI_EAGAIN) {
      lf::check(rc, "fi_recv");
      return;
    }
    fi_cq_read(raw_.cq(), nullptr, 0);  // progress
  }
}

ssize_t FabricEndpoint::post_one(const Op& op, OpCtx* ctx, uint64_t flags) {
  const PeerState& p = cluster_->peer(op.remote.node());
  fi_addr_t dst = rma_addr_[op.remote.node()];
  void* desc = pool_mr_.desc();
  uint64_t raddr = p.base + op.remote.offset();
  switch (op.kind) {
    case OpKind::Read:
    case OpKind::Write: {
      iovec iov{op.local, op.len};
      fi_rma_iov riov{raddr, op.len, p.key};
      fi_msg_rma m{&iov, &desc, 1, dst, &riov, 1, &ctx->fi, 0};
      return op.kind == OpKind::Read ? fi_readmsg(raw_.ep(), &m, flags) : fi_writemsg(raw_.ep(), &m, flags);
    }
    case OpKind::FetchAdd: {
      fi_ioc ioc{const_cast<uint64_t*>(&op.operand), 1};
      fi_rma_ioc rioc{raddr, 1, p.key};
      fi_msg_atomic m{&ioc, nullptr, 1, dst, &rioc, 1, FI_UINT64, FI_SUM, &ctx->fi, 0};
      fi_ioc res{op.local, 1};
      return fi_fetch_atomicmsg(raw_.ep(), &m, &res, &desc, 1, flags);
    }
    case OpKind::CompareSwap: {
      fi_ioc ioc{const_cast<uint64_t*>(&op.operand), 1};
      fi_ioc cmp{const_cast<uint64_t*>(&op.compare), 1};
      fi_rma_ioc rioc{raddr, 1, p.key};
      fi_msg_atomic m{&ioc, nullptr, 1, dst, &rioc, 1, FI_UINT64, FI_CSWAP, &ctx->fi, 0};
      fi_ioc res{op.local, 1};
      return fi_compare_atomicmsg(raw_.ep(), &m, &cmp, nullptr, 1, &res, &desc, 1, flags);
    }
  }
  return -FI_EINVAL;
}

Status FabricEndpoint::post(std::span<const Op> ops) {
  for (const Op& op : ops) {
    uint16_t node = op.remote.node();
    if (node >= cluster_->num_peers()) return Status::UnknownNode;
    if (!cluster_->alive(node)) return Status::PeerDead;
    if (cluster_->peer(node).generation.load() != gens_[node]) set_peer_addr(node);  // a new memnode there
    size_t len = (op.kind == OpKind::Read || op.kind == OpKind::Write) ? op.len : 8;
    uint64_t size = cluster_->peer(node).info.region_size;
    if (op.remote.offset() > size || len > size - op.remote.offset()) return Status::OutOfBounds;
    if (!pool_.contains(op.local, len)) return Status::BadLocalBuffer;
    if ((op.kind == OpKind::FetchAdd || op.kind == OpKind::CompareSwap) && op.remote.offset() % 8 != 0)
      return Status::Misaligned;
  }
  // Operand words of atomics must stay valid until completion on some providers: the Op
  // array is the caller's, so copy operands into the context-owned Op below.
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    OpCtx* ctx = get_ctx();
    ctx->tag = op.tag;
    ctx->kind = op.kind;
    ctx->node = op.remote.node();
    uint64_t flags = FI_COMPLETION | (i + 1 < ops.size() ? FI_MORE : 0);
    const auto since = Clock::now();
    uint32_t calls = 0;
    for (;;) {
      ssize_t rc = post_one(op, ctx, flags);
      if (rc == 0) break;
      if (rc != -FI_EAGAIN) {
        put_ctx(ctx);
        spdlog::error("posting {} to {}: {}", op_name(op.kind), node_name(op.remote.node()),
                      fi_strerror(static_cast<int>(-rc)));
        return Status::RemoteError;
      }
      ++counters_.eagain_retries;
      std::array<Completion, 16> buf;
      size_t n = read_cq(buf);
      stash_.insert(stash_.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
      if (!cluster_->alive(op.remote.node()) || stalled(op.remote.node(), since, calls)) {
        put_ctx(ctx);
        return Status::PeerDead;
      }
    }
    ++in_flight_;
    ++counters_.ops[static_cast<int>(op.kind)];
    if (op.kind == OpKind::Read) counters_.bytes_read += op.len;
    if (op.kind == OpKind::Write) counters_.bytes_written += op.len;
  }
  if (!ops.empty()) ++counters_.doorbells;
  return Status::Ok;
}

size_t FabricEndpoint::read_cq(std::span<Completion> out) {
  size_t n = 0;
  while (n < out.size()) {
    fi_cq_msg_entry e[16];
    ssize_t rc = fi_cq_read(raw_.cq(), e, std::min<size_t>(16, out.size() - n));
    if (rc == -FI_EAGAIN) break;
    if (rc == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(raw_.cq(), &err, 0) <= 0) break;
      auto* ctx = reinterpret_cast<OpCtx*>(err.op_context);
      if (ctx == nullptr) continue;
      if (ctx->role != OpCtx::kOp) {
        // A failed receive or send: re-arm receives, free send buffers.
        if (ctx->role == OpCtx::kRecv && err.err != FI_ECANCELED) post_recv(ctx);
        else if (ctx->role == OpCtx::kSend) put_ctx(ctx);
        continue;
      }
      --in_flight_;
      if (!ctx->orphaned) {
        spdlog::debug("{} on {} failed: {}", op_name(ctx->kind), node_name(ctx->node),
                      fi_cq_strerror(raw_.cq(), err.prov_errno, err.err_data, nullptr, 0));
        out[n++] = {ctx->tag, Status::RemoteError, ctx->kind, ctx->node};
      }
      put_ctx(ctx);
      continue;
    }
    if (rc < 0) lf::check(rc, "fi_cq_read");
    for (ssize_t i = 0; i < rc; ++i) {
      auto* ctx = reinterpret_cast<OpCtx*>(e[i].op_context);
      if (ctx->role == OpCtx::kRecv) {
        lf::WireMsgHeader h;
        std::memcpy(&h, ctx->buf, sizeof h);
        if (h.magic == lf::kWireMsgMagic && h.len <= kMaxMessage && h.addr_len <= lf::kMaxAddrBytes &&
            e[i].len >= sizeof h + h.addr_len + h.len) {
          Message m;
          m.from_node = h.from_node;
          m.from_cn = h.from_cn;
          const char* p = ctx->buf + sizeof h + h.addr_len;
          m.payload.assign(p, p + h.len);
          inbox_.push_back(std::move(m));
        }
        post_recv(ctx);
        continue;
      }
      if (ctx->role == OpCtx::kSend) {
        put_ctx(ctx);
        continue;
      }
      --in_flight_;
      if (!ctx->orphaned) out[n++] = {ctx->tag, Status::Ok, ctx->kind, ctx->node};
      put_ctx(ctx);
    }
  }
  return n;
}

// Operations toward a memnode that died are reported failed at once (the provider may never
// complete them); their contexts stay reserved until the provider returns them, if ever.
size_t FabricEndpoint::fail_dead(std::span<Completion> out) {
  size_t n = 0;
  for (auto& c : ctxs_) {
    if (n == out.size()) break;
    if (!c.in_use || c.orphaned || c.role != OpCtx::kOp || cluster_->alive(c.node)) continue;
    c.orphaned = true;
    out[n++] = {c.tag, Status::PeerDead, c.kind, c.node};
  }
  return n;
}

bool FabricEndpoint::stalled(uint16_t node, Clock::time_point since, uint32_t& calls) {
  if (++calls % 256 != 0 || Clock::now() - since < cluster_->stall_timeout()) return false;
  cluster_->declare_stalled(node, "an operation toward it");
  return true;
}

void FabricEndpoint::check_in_flight_stall() {
  const auto now = Clock::now();
  if (!waiting_since_) {
    waiting_since_ = now;
    return;
  }
  if (now - *waiting_since_ < cluster_->stall_timeout()) return;
  std::set<uint16_t> nodes;
  for (const auto& c : ctxs_)
    if (c.in_use && !c.orphaned && c.role == OpCtx::kOp && cluster_->alive(c.node)) nodes.insert(c.node);
  for (uint16_t node : nodes) cluster_->declare_stalled(node, "operations in flight toward it");
  waiting_since_.reset();
}

size_t FabricEndpoint::poll_impl(std::span<Completion> out) {
  size_t n = read_cq(out);
  if (n > 0 || in_flight_ == 0)
    waiting_since_.reset();
  else if (empty_polls_ % 256 == 0)
    check_in_flight_stall();
  // On hosts with fewer cores than spinning processes (memnodes serve shm and tcp with
  // their CPU), give the core away now and then while waiting.
  if (n == 0 && ++empty_polls_ % 256 == 0) sched_yield();
  uint64_t deaths = cluster_->deaths();
  if (deaths != seen_deaths_ && n < out.size()) {
    while (cluster_->fault_stuck_on_death()) std::this_thread::sleep_for(std::chrono::seconds(1));
    size_t m = fail_dead(out.subspan(n));
    n += m;
    if (m == 0) seen_deaths_ = deaths;  // nothing left to fail
  }
  return n;
}

Status FabricEndpoint::send(uint16_t node, const void* data, size_t len) {
  if (node >= cluster_->num_peers()) return Status::UnknownNode;
  if (!cluster_->alive(node)) return Status::PeerDead;
  if (cluster_->peer(node).generation.load() != gens_[node]) set_peer_addr(node);
  if (len > kMaxMessage) return Status::OutOfBounds;
  OpCtx* ctx = get_ctx();
  ctx->role = OpCtx::kSend;
  ctx->node = node;
  // Send buffers must be registered on FI_MR_LOCAL providers: take them from the pool.
  Buffer b = pool_.alloc(sizeof(lf::WireMsgHeader) + my_name_.size() + len);
  lf::WireMsgHeader h{lf::kWireMsgMagic, 0xffff, static_cast<uint16_t>(my_name_.size()), cluster_->cn_id(),
                      static_cast<uint32_t>(len)};
  std::memcpy(b.data(), &h, sizeof h);
  std::memcpy(b.data() + sizeof h, my_name_.data(), my_name_.size());
  std::memcpy(b.data() + sizeof h + my_name_.size(), data, len);
  const size_t total = sizeof h + my_name_.size() + len;
  ctx->buf = nullptr;  // `b` lives until the send completes (waited for below)
  const auto since = Clock::now();
  uint32_t calls = 0;
  for (;;) {
    ssize_t rc = fi_send(raw_.ep(), b.data(), total, pool_mr_.desc(), addr_[node], &ctx->fi);
    if (rc == 0) break;
    if (rc != -FI_EAGAIN || !cluster_->alive(node) || stalled(node, since, calls)) {
      put_ctx(ctx);
      return rc == -FI_EAGAIN ? Status::PeerDead : Status::RemoteError;
    }
    std::array<Completion, 16> buf;
    size_t n = read_cq(buf);
    stash_.insert(stash_.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
  }
  // Wait for the send to complete so the buffer can be returned (messages are small and rare).
  while (ctx->in_use && ctx->role == OpCtx::kSend) {
    std::array<Completion, 16> buf;
    size_t n = read_cq(buf);
    stash_.insert(stash_.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
    if (!cluster_->alive(node) || stalled(node, since, calls)) return Status::PeerDead;
  }
  ++counters_.msgs_sent;
  return Status::Ok;
}

bool FabricEndpoint::try_recv(Message& out) {
  if (inbox_.empty()) {
    std::array<Completion, 16> buf;
    size_t n = read_cq(buf);
    stash_.insert(stash_.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
  }
  if (inbox_.empty()) return false;
  out = std::move(inbox_.front());
  inbox_.pop_front();
  ++counters_.msgs_received;
  return true;
}

}  // namespace

std::shared_ptr<Cluster> connect_lf_cluster(const ClusterOptions& opts) {
  auto c = std::make_shared<FabricCluster>(opts);
  c->connect();
  return c;
}

}  // namespace dmhnsw::fabric
