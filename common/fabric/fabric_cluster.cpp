// libfabric transport: compute-side cluster and endpoints, memory-side region server.
#include "common/fabric/fabric_cluster.hpp"

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

#include "common/fabric/lf.hpp"

namespace dmhnsw::fabric {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kRegionKey = 0xD4'0000;  // requested key (providers without FI_MR_PROV_KEY)
constexpr size_t kRecvDepth = 16;           // posted receive buffers per endpoint

struct PeerState {
  MemnodeInfo info;
  std::vector<char> fabric_addr;
  std::vector<std::vector<char>> rma_lanes;  // empty: one-sided operations go to fabric_addr
  uint64_t base = 0, key = 0;
  std::atomic<bool> dead{false};
  std::string why;  // guarded by FabricCluster::mu_
};

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

class FabricCluster final : public Cluster, public std::enable_shared_from_this<FabricCluster> {
 public:
  explicit FabricCluster(const ClusterOptions& o) : opts_(o) {}
  ~FabricCluster() override {
    stop_.store(true);
    if (monitor_.joinable()) monitor_.join();
  }

  void connect() {
    if (opts_.memnodes.empty()) throw FabricError("--memnodes: no memory node given");
    // Fail at start, before any connection, when the provider cannot work on this machine.
    if (opts_.provider == Provider::Verbs) lf::Domain::open(Provider::Verbs, "");
    std::vector<std::unique_ptr<PeerState>> peers;
    for (const auto& hp : opts_.memnodes) {
      auto cc = std::make_unique<ControlClient>(hp, opts_.control_version);
      if (!domain_) {
        domain_ = lf::Domain::open(opts_.provider, cc->local_ip());
        // The messaging endpoint: its address is what memnodes answer messages to.
        primary_ = std::make_unique<lf::RawEndpoint>(domain_, false);
        spdlog::debug("fabric: {}", domain_->describe());
      }
      Hello h;
      h.mode = opts_.mode;
      h.provider = opts_.provider;
      h.cn_id = opts_.cn_id;
      h.token = opts_.token;
      h.fabric_addr = primary_->name();
      Welcome w = cc->handshake(h);
      auto p = std::make_unique<PeerState>();
      p->info.id = w.memnode_id;
      p->info.address = hp;
      p->info.region_size = w.region_size;
      p->info.header = w.header;
      p->fabric_addr = w.fabric_addr;
      p->rma_lanes = w.rma_lanes;
      p->base = w.region_base;
      p->key = w.region_key;
      peers.push_back(std::move(p));
      controls_.push_back(std::move(cc));
    }
    // Memnode ids must be exactly 0..N-1; order peers by id.
    std::vector<size_t> order(peers.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return peers[a]->info.id < peers[b]->info.id; });
    for (size_t i = 0; i < order.size(); ++i) {
      auto& p = peers[order[i]];
      if (p->info.id != i) {
        std::string ids;
        for (auto& q : peers) ids += (ids.empty() ? "" : ", ") + std::to_string(q->info.id);
        throw FabricError("--memnodes: memnode ids must be 0.." + std::to_string(peers.size() - 1) +
                          " (each once); these memnodes have ids " + ids);
      }
    }
    std::vector<std::unique_ptr<ControlClient>> ordered_controls;
    for (size_t i : order) {
      peers_.push_back(std::move(peers[i]));
      ordered_controls.push_back(std::move(controls_[i]));
      infos_.push_back(peers_.back()->info);
    }
    controls_ = std::move(ordered_controls);
    monitor_ = std::thread([this] { monitor(); });
  }

  Provider provider() const override { return opts_.provider; }
  const std::vector<MemnodeInfo>& memnodes() const override { return infos_; }
  std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes) override {
    return std::make_unique<FabricEndpoint>(shared_from_this(), pool_bytes);
  }
  bool alive(uint16_t node) const override { return node < peers_.size() && !peers_[node]->dead.load(); }
  std::string dead_reason(uint16_t node) const override {
    std::lock_guard g(mu_);
    return node < peers_.size() ? peers_[node]->why : "unknown memnode";
  }

  uint64_t deaths() const { return deaths_.load(); }
  const std::shared_ptr<lf::Domain>& domain() const { return domain_; }
  const PeerState& peer(uint16_t i) const { return *peers_[i]; }
  size_t num_peers() const { return peers_.size(); }
  uint32_t cn_id() const { return opts_.cn_id; }
  uint32_t num_cns() const { return opts_.num_cns; }
  uint64_t next_endpoint_ordinal() { return endpoints_made_.fetch_add(1); }
  std::chrono::milliseconds stall_timeout() const { return std::chrono::milliseconds(opts_.stall_timeout_ms); }
  /// An endpoint found the memnode's fabric stalled (see ClusterOptions::stall_timeout_ms).
  void declare_stalled(uint16_t node, const std::string& what) {
    mark_dead(node, what + " got no progress from its fabric endpoint for " + std::to_string(opts_.stall_timeout_ms) +
                        " ms while its control connection lives (the memnode's endpoint is stuck; with the shm "
                        "provider a computenode killed inside libfabric can leave it so: restart that memnode, or "
                        "use --provider tcp)");
  }

 private:
  void mark_dead(size_t i, const std::string& why) {
    {
      std::lock_guard g(mu_);
      if (peers_[i]->dead.load()) return;
      peers_[i]->why = why;
      peers_[i]->dead.store(true);
    }
    deaths_.fetch_add(1);
    spdlog::error("memnode {} ({}) is unreachable: {}", i, peers_[i]->info.address, why);
  }

  // Heartbeats over the control connections; a closed connection or a silent memnode marks
  // it dead, which fails its pending and later operations.
  void monitor() {
    // A memnode is silent when a ping we sent has had no answer for the timeout; counting
    // from the ping (not from the last answer) keeps a starved monitor thread from blaming it.
    std::vector<std::optional<Clock::time_point>> unanswered(peers_.size());
    auto next_ping = Clock::now();
    while (!stop_.load()) {
      auto now = Clock::now();
      if (now >= next_ping) {
        for (size_t i = 0; i < controls_.size(); ++i) {
          if (peers_[i]->dead.load()) continue;
          if (!controls_[i]->send_ping()) mark_dead(i, "control connection failed");
          if (!unanswered[i]) unanswered[i] = now;
        }
        next_ping = now + std::chrono::milliseconds(500);
      }
      std::vector<pollfd> fds;
      for (auto& c : controls_) fds.push_back({c->fd(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), 100);
      now = Clock::now();
      for (size_t i = 0; i < controls_.size(); ++i) {
        if (peers_[i]->dead.load()) continue;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          std::string why;
          if (!controls_[i]->drain(why))
            mark_dead(i, why);
          else
            unanswered[i].reset();
        } else if (unanswered[i] && now - *unanswered[i] > std::chrono::milliseconds(opts_.heartbeat_timeout_ms)) {
          mark_dead(i, "no heartbeat answer for " + std::to_string(opts_.heartbeat_timeout_ms) + " ms");
        }
      }
    }
  }

  ClusterOptions opts_;
  std::shared_ptr<lf::Domain> domain_;
  std::unique_ptr<lf::RawEndpoint> primary_;
  std::vector<std::unique_ptr<ControlClient>> controls_;
  std::vector<std::unique_ptr<PeerState>> peers_;
  std::vector<MemnodeInfo> infos_;
  mutable std::mutex mu_;
  std::atomic<uint64_t> deaths_{0};
  std::atomic<uint64_t> endpoints_made_{0};
  std::atomic<bool> stop_{false};
  std::thread monitor_;
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
  // Endpoints spread over the memnodes' RMA lanes. With K computenodes and L ≥ K lanes,
  // computenode c owns lanes c, c + K, c + 2K, ... and its e-th endpoint takes the e-th of
  // them (cyclically): no two computenodes share a lane, so one that dies inside a READ (and
  // leaves its lane's lock held, libfabric shm) stops nobody else's READs. Otherwise endpoint e
  // takes lane (c + kLaneStride·e) mod L: the first endpoints of different computenodes get
  // different lanes and one computenode's later endpoints step away from its neighbours'.
  const uint64_t ordinal = cluster_->next_endpoint_ordinal();
  for (uint16_t i = 0; i < cluster_->num_peers(); ++i) {
    const PeerState& p = cluster_->peer(i);
    addr_.push_back(raw_.insert(p.fabric_addr));
    if (p.rma_lanes.empty()) {
      rma_addr_.push_back(addr_.back());
    } else {
      const uint64_t lane = rma_lane_for(cluster_->cn_id(), cluster_->num_cns(), ordinal, p.rma_lanes.size());
      rma_addr_.push_back(raw_.insert(p.rma_lanes[lane]));
    }
  }
  seen_deaths_ = cluster_->deaths();
  for (size_t i = 0; i < kRecvDepth; ++i) {
    msg_bufs_.push_back(pool_.alloc(lf::kWireMsgBytes));
    OpCtx* ctx = get_ctx();
    ctx->role = OpCtx::kRecv;
    ctx->buf = msg_bufs_.back().data();
    post_recv(ctx);
  }
}

FabricEndpoint::~FabricEndpoint() {
  // Give outstanding operations a moment to drain so the provider does not touch freed
  // buffers; operations toward dead memnodes are abandoned.
  auto deadline = Clock::now() + std::chrono::seconds(2);
  std::array<Completion, 32> buf;
  while (in_flight_ > 0 && Clock::now() < deadline) read_cq(buf);
  raw_.close();  // before pool_mr_ and pool_ (declared after raw_) go: posted receives point into pool_
}

std::string FabricEndpoint::node_name(uint16_t node) const {
  if (node >= cluster_->num_peers()) return "memnode " + std::to_string(node) + " (unknown)";
  std::string n = "memnode " + std::to_string(node) + " (" + cluster_->peer(node).info.address + ")";
  if (!cluster_->alive(node)) n += " [" + cluster_->dead_reason(node) + "]";
  return n;
}

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
    size_t m = fail_dead(out.subspan(n));
    n += m;
    if (m == 0) seen_deaths_ = deaths;  // nothing left to fail
  }
  return n;
}

Status FabricEndpoint::send(uint16_t node, const void* data, size_t len) {
  if (node >= cluster_->num_peers()) return Status::UnknownNode;
  if (!cluster_->alive(node)) return Status::PeerDead;
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

std::shared_ptr<Cluster> connect_cluster(const ClusterOptions& opts) {
  auto c = std::make_shared<FabricCluster>(opts);
  c->connect();
  return c;
}

// ================================================================== memory side
struct RegionServer::Impl {
  std::shared_ptr<lf::Domain> domain;
  std::unique_ptr<lf::RawEndpoint> ep;
  std::vector<std::unique_ptr<lf::RawEndpoint>> lanes;  // one-sided operations only
  std::unique_ptr<lf::MemoryRegion> region_mr;
  char* region = nullptr;
  uint64_t size = 0;
  uint16_t id = 0;
  std::mutex mu;  // clients + handler
  std::map<uint32_t, fi_addr_t> clients;
  Handler handler;
  std::function<void()> tick;
  int tick_ms = 50;
  BufferPool bufs{8u << 20};
  std::unique_ptr<lf::MemoryRegion> bufs_mr;
  std::vector<Buffer> recv_bufs;
  std::vector<std::unique_ptr<fi_context2>> recv_ctx;
  std::map<std::string, fi_addr_t> peers;  // sender endpoint address → AV entry (progress thread only)
  struct Outgoing {
    fi_addr_t to;
    Buffer buf;
    size_t len;
    std::unique_ptr<fi_context2> ctx;
    Clock::time_point deadline;
  };
  std::deque<Outgoing> outbox;     // not yet accepted by the provider
  std::vector<Outgoing> in_flight;  // posted, waiting for the send completion
  std::atomic<uint64_t> spins{0}, waits{0}, messages{0}, dropped{0};
  std::atomic<int64_t> loop_ns{0};  // steady-clock time of run()'s last turn (0: not running)

  // The endpoints close before the buffers and registrations declared after them are freed:
  // posted receives point into `bufs`.
  ~Impl() {
    stop_lane_thread();
    if (ep) ep->close();
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (lane_abandoned && lane_abandoned[i].load())
        (void)lanes[i].release();  // closing it would wait for the dead holder's lock: leave it
      else
        lanes[i]->close();
    }
  }

  // RMA lanes post nothing; reading their CQs drives their progress (on shm, the
  // acknowledgements of served READs that free command-queue slots), and reading their
  // counters tells the progress loop that READs are being served. Both take the lane's
  // shared-memory lock on shm, which a computenode killed inside a READ can leave held for
  // ever. So lanes are progressed by their own thread, never by the message loop: a lane
  // found stuck for kLaneStuck is abandoned (its thread too, at idle priority) and a new
  // thread carries on with the other lanes. Each computenode reads through lanes of its own
  // (FabricEndpoint), so only the dead one's lanes are lost.
  static constexpr auto kLaneStuck = std::chrono::seconds(2);
  struct LaneWatch {
    std::atomic<int> current{-1};     // the lane being read, -1 none
    std::atomic<int64_t> since_ns{0}; // when that read started
    std::atomic<pid_t> tid{0};
    std::atomic<bool> superseded{false};
  };
  std::unique_ptr<std::atomic<uint64_t>[]> lane_ops;     // per lane, as last read
  std::unique_ptr<std::atomic<bool>[]> lane_abandoned;   // per lane
  std::shared_ptr<LaneWatch> watch;
  std::thread lane_thread;
  std::atomic<bool> lanes_stop{false};
  std::atomic<bool> fault_stall{false};  // DMHNSW_FAULT_STALL_FILE: no progress at all, lanes included

  void start_lane_thread() {
    watch = std::make_shared<LaneWatch>();
    lane_thread = std::thread([this, w = watch] {
      w->tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
      auto last_work = Clock::now();
      while (!lanes_stop.load(std::memory_order_relaxed) && !w->superseded.load()) {
        if (fault_stall.load(std::memory_order_relaxed)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          continue;
        }
        for (size_t i = 0; i < lanes.size(); ++i) {
          if (lane_abandoned[i].load()) continue;
          w->since_ns.store(Clock::now().time_since_epoch().count());
          w->current.store(static_cast<int>(i));
          fi_cq_msg_entry e[16];
          const ssize_t rc = fi_cq_read(lanes[i]->cq(), e, 16);
          if (rc == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(lanes[i]->cq(), &err, 0) > 0)
              spdlog::debug("memnode {}: an RMA lane reported: {}", id, fi_strerror(err.err));
          }
          const uint64_t ops = lanes[i]->remote_ops();
          if (rc > 0 || ops != lane_ops[i].load(std::memory_order_relaxed)) last_work = Clock::now();
          lane_ops[i].store(ops);
          w->current.store(-1);
          if (w->superseded.load()) {  // taken for stuck, but it was only slow: the lane is fine
            lane_abandoned[i].store(false);
            return;
          }
        }
        // While READs arrive (and 5 ms after), go round again after yielding the core (2-core
        // hosts); when idle, every 50 µs.
        if (Clock::now() - last_work < std::chrono::milliseconds(5))
          sched_yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  // From the message loop, now and then: abandons a lane whose read has not returned.
  void check_lanes() {
    if (!watch) return;
    const int cur = watch->current.load();
    if (cur < 0) return;
    const auto since = Clock::time_point(Clock::duration(watch->since_ns.load()));
    if (watch->current.load() != cur || Clock::now() - since < kLaneStuck) return;
    lane_abandoned[cur].store(true);
    watch->superseded.store(true);
    sched_param sp{};
    ::sched_setscheduler(watch->tid.load(), SCHED_IDLE, &sp);  // it spins on the lock: only on idle CPU
    lane_thread.detach();
    spdlog::error("memnode {}: RMA lane {} did not return for {} s: its lock is held by a process that died "
                  "inside the provider (a computenode killed during a READ); the lane is abandoned, the other "
                  "lanes and messages go on",
                  id, cur, std::chrono::duration_cast<std::chrono::seconds>(kLaneStuck).count());
    start_lane_thread();
  }
  void stop_lane_thread() {
    lanes_stop.store(true);
    if (lane_thread.joinable()) lane_thread.join();
  }
  uint64_t remote_ops() const {
    uint64_t n = ep->remote_ops();
    for (size_t i = 0; i < lanes.size(); ++i) n += lane_ops[i].load(std::memory_order_relaxed);
    return n;
  }
  void post_recv(size_t slot) {
    lf::check(fi_recv(ep->ep(), recv_bufs[slot].data(), lf::kWireMsgBytes, bufs_mr->desc(), FI_ADDR_UNSPEC,
                      recv_ctx[slot].get()),
              "fi_recv");
  }
  // Posts queued replies; never blocks on a computenode that does not progress.
  // Posts queued messages; never blocks on a computenode that does not progress. A
  // destination that refuses (EAGAIN) keeps its messages, in order, for the next pass while
  // the others' go out (a dead computenode must not delay everyone's replies).
  void flush_outbox() {
    if (outbox.empty()) return;
    std::vector<fi_addr_t> refused;
    const auto now = Clock::now();
    for (auto it = outbox.begin(); it != outbox.end();) {
      if (std::find(refused.begin(), refused.end(), it->to) != refused.end()) {
        ++it;
        continue;
      }
      ssize_t rc = fi_send(ep->ep(), it->buf.data(), it->len, bufs_mr->desc(), it->to, it->ctx.get());
      if (rc == -FI_EAGAIN) {
        if (now < it->deadline) {
          refused.push_back(it->to);
          ++it;
          continue;
        }
        ++dropped;
        spdlog::warn("memnode {}: dropped a message: the computenode did not accept it within 5 s", id);
      } else if (rc == 0) {
        in_flight.push_back(std::move(*it));
      } else {
        ++dropped;
        spdlog::warn("memnode {}: message send failed: {}", id, fi_strerror(static_cast<int>(-rc)));
      }
      it = outbox.erase(it);
    }
  }
  void queue_send(fi_addr_t to, const void* data, size_t n) {
    if (to == FI_ADDR_UNSPEC || n > kMaxMessage) return;
    lf::WireMsgHeader rh{lf::kWireMsgMagic, id, 0, 0, static_cast<uint32_t>(n)};
    Outgoing o{to, bufs.alloc(sizeof rh + n), sizeof rh + n, std::make_unique<fi_context2>(),
               Clock::now() + std::chrono::seconds(5)};
    std::memcpy(o.buf.data(), &rh, sizeof rh);
    std::memcpy(o.buf.data() + sizeof rh, data, n);
    outbox.push_back(std::move(o));
  }
  bool complete_send(void* ctx) {
    for (auto it = in_flight.begin(); it != in_flight.end(); ++it)
      if (it->ctx.get() == ctx) {
        in_flight.erase(it);
        return true;
      }
    return false;
  }
  void on_message(size_t slot, size_t len) {
    const char* buf = recv_bufs[slot].data();
    lf::WireMsgHeader h;
    std::memcpy(&h, buf, sizeof h);
    if (h.magic != lf::kWireMsgMagic || h.len > kMaxMessage || h.addr_len > lf::kMaxAddrBytes ||
        len < sizeof h + h.addr_len + h.len) {
      spdlog::warn("memnode {}: dropped a malformed message ({} bytes)", id, len);
      return;
    }
    ++messages;
    fi_addr_t to = FI_ADDR_UNSPEC;
    if (h.addr_len > 0) {
      std::string addr(buf + sizeof h, h.addr_len);
      auto it = peers.find(addr);
      if (it == peers.end()) it = peers.emplace(addr, ep->insert(std::vector<char>(addr.begin(), addr.end()))).first;
      to = it->second;
    }
    Message msg;
    msg.from_node = h.from_node;
    msg.from_cn = h.from_cn;
    const char* p = buf + sizeof h + h.addr_len;
    msg.payload.assign(p, p + h.len);
    Handler hd;
    {
      std::lock_guard g(mu);
      hd = handler;
    }
    msg.sender = to;
    hd(msg, [&](const void* data, size_t n) { queue_send(to, data, n); });
  }
};

RegionServer::RegionServer(Provider p, const std::string& listen_host, char* region, uint64_t size,
                           uint16_t memnode_id, unsigned rma_lanes)
    : impl_(std::make_unique<Impl>()) {
  if (rma_lanes > kMaxRmaLanes)
    throw std::invalid_argument("--rma-lanes " + std::to_string(rma_lanes) + ": at most " +
                                std::to_string(kMaxRmaLanes));
  auto& m = *impl_;
  m.domain = lf::Domain::open(p, listen_host, /*rma_events=*/true);
  // A CQ wait object only where fi_cq_sread really blocks and keeps progressing (tcp,
  // verbs); on shm, activity is seen through the remote-operation counter instead.
  m.ep = std::make_unique<lf::RawEndpoint>(m.domain, p != Provider::Shm);
  m.region = region;
  m.size = size;
  m.id = memnode_id;
  m.region_mr = std::make_unique<lf::MemoryRegion>(m.domain, region, size, FI_REMOTE_READ | FI_REMOTE_WRITE,
                                                   kRegionKey + memnode_id);
  m.region_mr->bind(m.ep->ep());
  for (unsigned i = 0; i < rma_lanes; ++i) {
    m.lanes.push_back(std::make_unique<lf::RawEndpoint>(m.domain, false));
    m.region_mr->bind(m.lanes.back()->ep());
  }
  m.lane_ops = std::make_unique<std::atomic<uint64_t>[]>(rma_lanes);
  m.lane_abandoned = std::make_unique<std::atomic<bool>[]>(rma_lanes);
  for (unsigned i = 0; i < rma_lanes; ++i) {
    m.lane_ops[i].store(0);
    m.lane_abandoned[i].store(false);
  }
  m.bufs_mr = std::make_unique<lf::MemoryRegion>(m.domain, m.bufs.arena(), m.bufs.arena_bytes(),
                                                 FI_SEND | FI_RECV, m.domain->next_local_key());
  m.bufs_mr->bind(m.ep->ep());
  for (size_t i = 0; i < 64; ++i) {
    m.recv_bufs.push_back(m.bufs.alloc(lf::kWireMsgBytes));
    m.recv_ctx.push_back(std::make_unique<fi_context2>());
    m.post_recv(i);
  }
  m.handler = [](const Message& in, const std::function<void(const void*, size_t)>& reply) {
    reply(in.payload.data(), in.payload.size());  // default: echo
  };
}

RegionServer::~RegionServer() = default;

std::vector<char> RegionServer::fabric_address() const { return impl_->ep->name(); }
std::vector<std::vector<char>> RegionServer::rma_lane_addresses() const {
  std::vector<std::vector<char>> out;
  for (const auto& l : impl_->lanes) out.push_back(l->name());
  return out;
}
uint64_t RegionServer::remote_base() const { return impl_->region_mr->remote_base(); }
uint64_t RegionServer::key() const { return impl_->region_mr->key(); }
std::string RegionServer::describe() const { return impl_->domain->describe(); }

void RegionServer::add_client(uint32_t cn_id, const std::vector<char>& addr) {
  fi_addr_t a = impl_->ep->insert(addr);
  std::lock_guard g(impl_->mu);
  impl_->clients[cn_id] = a;
}

void RegionServer::remove_client(uint32_t cn_id) {
  std::lock_guard g(impl_->mu);
  impl_->clients.erase(cn_id);
}

void RegionServer::set_handler(Handler h) {
  std::lock_guard g(impl_->mu);
  impl_->handler = std::move(h);
}

void RegionServer::send_to(uint64_t sender, const void* data, size_t len) {
  impl_->queue_send(static_cast<fi_addr_t>(sender), data, len);
}

void RegionServer::set_tick(std::function<void()> tick, int period_ms) {
  std::lock_guard g(impl_->mu);
  impl_->tick = std::move(tick);
  impl_->tick_ms = period_ms;
}

double RegionServer::progress_stalled_seconds() const {
  const int64_t t = impl_->loop_ns.load(std::memory_order_relaxed);
  if (t == 0) return 0;
  return std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(t))).count();
}

RegionServer::Stats RegionServer::stats() const {
  Stats s{impl_->spins.load(), impl_->waits.load(), impl_->messages.load(), impl_->remote_ops(), {}};
  for (size_t i = 0; i < impl_->lanes.size(); ++i) s.lane_ops.push_back(impl_->lane_ops[i].load());
  return s;
}

void RegionServer::run(const std::atomic<bool>& stop) {
  auto& m = *impl_;
  fid_cq* cq = m.ep->cq();
  // On shm and tcp the target's progress serves one-sided operations, which leave no
  // completion here. Spin while there is a sign of work (a completion, a queued reply, a
  // served remote operation) and for a window after it; when idle, block on the CQ's wait
  // object (tcp, verbs: the provider keeps progressing inside) or, on shm, whose wait does
  // not honour timeouts, poll with a short pause between polls.
  const auto spin_window = std::chrono::milliseconds(5);
  const bool blocking_wait = m.domain->provider() != Provider::Shm && m.lanes.empty();  // lanes need polling
  const bool counted = m.ep->counts_remote_ops();
  uint64_t remote_seen = m.remote_ops();
  auto last_work = Clock::now();
  auto next_tick = Clock::now();
  // Fault injection for tests: with DMHNSW_FAULT_STALL_FILE=PATH all fabric progress stops
  // once PATH exists (looked for every 100 ms); the control connection keeps answering, as
  // with a wedged provider.
  const char* stall_file = std::getenv("DMHNSW_FAULT_STALL_FILE");
  if (stall_file != nullptr && *stall_file == '\0') stall_file = nullptr;
  if (stall_file != nullptr)
    spdlog::warn("memnode {}: DMHNSW_FAULT_STALL_FILE={}: fabric progress stops when it exists (fault injection)",
                 m.id, stall_file);
  auto next_stall_check = Clock::now();
  auto next_lane_check = Clock::now();
  m.lanes_stop.store(false);
  if (!m.lanes.empty()) m.start_lane_thread();
  struct LaneThreadStop {
    Impl& m;
    ~LaneThreadStop() { m.stop_lane_thread(); }
  } lane_thread_stop{m};
  while (!stop.load(std::memory_order_relaxed)) {
    if (stall_file != nullptr && !m.fault_stall.load() && Clock::now() >= next_stall_check) {
      next_stall_check = Clock::now() + std::chrono::milliseconds(100);
      if (std::filesystem::exists(stall_file)) {
        spdlog::warn("memnode {}: {} exists: fabric progress stops (fault injection)", m.id, stall_file);
        m.fault_stall.store(true);
      }
    }
    if (m.fault_stall.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    m.loop_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    if (Clock::now() >= next_tick) {
      std::function<void()> t;
      {
        std::lock_guard g(m.mu);
        t = m.tick;
        next_tick = Clock::now() + std::chrono::milliseconds(m.tick_ms);
      }
      if (t) t();
    }
    m.flush_outbox();
    if (Clock::now() >= next_lane_check) {
      next_lane_check = Clock::now() + std::chrono::milliseconds(100);
      m.check_lanes();
    }
    fi_cq_msg_entry e[16];
    ssize_t rc = fi_cq_read(cq, e, 16);
    if (rc == -FI_EAGAIN) {
      auto now = Clock::now();
      if (counted) {
        uint64_t r = m.remote_ops();
        if (r != remote_seen) {
          remote_seen = r;
          last_work = now;
        }
      }
      if (!m.outbox.empty() || now - last_work < spin_window) {
        ++m.spins;
        sched_yield();  // share the core with local computenodes (2-core hosts)
        continue;
      }
      ++m.waits;
      if (blocking_wait) {
        rc = fi_cq_sread(cq, e, 16, nullptr, 10);
        if (rc == -FI_EAGAIN || rc == -FI_ETIMEDOUT) continue;
        if (rc > 0) last_work = Clock::now();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(counted ? 50 : 5));
        continue;
      }
    }
    if (rc == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq, &err, 0) <= 0) continue;
      if (m.complete_send(err.op_context)) {
        spdlog::debug("memnode {}: a reply failed: {}", m.id, fi_strerror(err.err));
        continue;
      }
      for (size_t i = 0; i < m.recv_ctx.size(); ++i)
        if (err.op_context == m.recv_ctx[i].get() && err.err != FI_ECANCELED) m.post_recv(i);
      continue;
    }
    if (rc < 0) {
      spdlog::error("memnode {}: fi_cq_read: {}", m.id, fi_strerror(static_cast<int>(-rc)));
      continue;
    }
    last_work = Clock::now();
    for (ssize_t i = 0; i < rc; ++i) {
      if (m.complete_send(e[i].op_context)) continue;
      for (size_t slot = 0; slot < m.recv_ctx.size(); ++slot) {
        if (e[i].op_context != m.recv_ctx[slot].get()) continue;
        m.on_message(slot, e[i].len);
        m.post_recv(slot);
        break;
      }
    }
  }
}

}  // namespace dmhnsw::fabric
