// verbs provider, compute side: one reliable-connected queue pair per (endpoint, memnode),
// connected with rdma_cm after the control handshake. READ, WRITE and the two atomics are RDMA
// work requests the NICs execute; a post() is one linked work-request list per memnode, one
// ibv_post_send (one doorbell), with only the last request signalled.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <random>

#include "common/fabric/control_cluster.hpp"
#include "common/fabric/verbs.hpp"

namespace dmhnsw::fabric {

using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRecvDepth = 16;                 // receive buffers posted per queue pair
constexpr int kMaxSendDepth = 1024;            // send-queue entries per queue pair (fewer if the device says so)
constexpr uint32_t kMaxChunk = 4096;           // work requests per doorbell (the wr_id keeps 16 bits of index)
constexpr int kConnectTimeoutMs = 5000;        // rdma_cm address, route and connection each
constexpr uint32_t kWantInline = 128;          // inline WRITE bytes asked of the device

// wr_id layout. Operations: [63]=0 [62..32] chunk slot [31..16] slot generation [15..0] index.
// Messages: [63]=1 [62] send [47..32] memnode [31..16] connection generation [15..0] buffer.
constexpr uint64_t kMsgBit = uint64_t{1} << 63, kSendBit = uint64_t{1} << 62;
uint64_t op_wr_id(uint32_t slot, uint32_t gen, uint32_t idx) {
  return (uint64_t{slot} << 32) | (uint64_t{gen & 0xffff} << 16) | idx;
}
uint64_t msg_wr_id(bool send, uint16_t node, uint32_t gen, uint32_t buf) {
  return kMsgBit | (send ? kSendBit : 0) | (uint64_t{node} << 32) | (uint64_t{gen & 0xffff} << 16) | buf;
}

class VerbsCluster final : public ControlledCluster, public std::enable_shared_from_this<VerbsCluster> {
 public:
  explicit VerbsCluster(const ClusterOptions& o) : ControlledCluster(o) {}
  ~VerbsCluster() override { stop_monitor(); }

  void connect() {
    verbs::require_device();  // before any connection: a clear error on hosts without RDMA
    std::random_device rd;
    for (auto& b : nonce_) b = static_cast<uint8_t>(rd());
    connect_all([this](const ControlClient&) { return std::vector<char>(nonce_.begin(), nonce_.end()); });
    for (uint16_t i = 0; i < num_peers(); ++i) {
      verbs::ListenAddress la{};
      const auto& fa = peer(i).fabric_addr;
      if (fa.size() == sizeof la) std::memcpy(&la, fa.data(), sizeof la);
      if (fa.size() != sizeof la || la.magic != verbs::kConnectMagic)
        throw FabricError(node_name(i) + ": its welcome carries no verbs listen address (is it a --provider verbs "
                                         "memnode of this version?)");
      ports_.push_back(la.port);
      const uint8_t* ip = la.ipv4;
      hosts_.push_back(ip[0] == 0 && ip[1] == 0 && ip[2] == 0 && ip[3] == 0
                           ? peer(i).host
                           : std::to_string(ip[0]) + "." + std::to_string(ip[1]) + "." + std::to_string(ip[2]) + "." +
                                 std::to_string(ip[3]));
    }
    open_device();
  }

  std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes) override;

  ibv_context* context() const { return probe_.id->verbs; }
  ibv_pd* pd() const { return pd_.get(); }
  const verbs::DeviceLimits& limits() const { return limits_; }
  uint16_t port(uint16_t node) const { return ports_[node]; }
  /// The IP of the memnode's rdma_cm listener.
  const std::string& host(uint16_t node) const { return hosts_[node]; }
  const std::array<uint8_t, verbs::kNonceBytes>& nonce() const { return nonce_; }
  const std::string& device_description() const { return description_; }

 private:
  // The device that routes to memnode 0 (rdma_cm picks it from the IP route); every queue pair
  // and registration of this process lives in one protection domain on it. The probe id keeps
  // rdma_cm's hold on the device for the cluster's lifetime.
  void open_device() {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP) != 0) verbs::fail_errno("rdma_create_id");
    probe_ = verbs::CmId(id);
    sockaddr_storage dst = verbs::resolve(hosts_[0], ports_[0], node_name(0));
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), kConnectTimeoutMs) != 0)
      verbs::fail_errno(node_name(0) + ": rdma_resolve_addr (" + hosts_[0] + " is not reachable through an RDMA "
                        "device: is the memnode's --listen the IP of a RoCE/IPoIB interface?)");
    if (id->verbs == nullptr) throw FabricError(node_name(0) + ": rdma_cm resolved no RDMA device");
    limits_ = verbs::query_device(id->verbs);
    if (!limits_.atomics)
      throw FabricError("--provider verbs: device " + limits_.name + " does not execute atomics (atomic_cap NONE)");
    pd_ = verbs::alloc_pd(id->verbs);
    description_ = verbs::describe(limits_);
    spdlog::debug("fabric: {}", description_);
  }

  std::array<uint8_t, verbs::kNonceBytes> nonce_{};
  std::vector<uint16_t> ports_;
  std::vector<std::string> hosts_;
  verbs::CmId probe_;
  verbs::PdPtr pd_;
  verbs::DeviceLimits limits_;
  std::string description_;
};

// One queue pair to one memnode.
struct Conn {
  verbs::CmId cm;
  ibv_qp* qp = nullptr;
  uint32_t gen = 0;        // bumped on every (re)connection: completions of older ones are ignored
  bool broken = true;      // not connected, or its queue pair went to the error state
  uint32_t sq_used = 0;    // send-queue entries posted and not yet retired
  uint32_t max_inline = 0;
  std::vector<Buffer> recv_bufs;
  // Set when the memnode was declared dead and the queue pair was moved to the error state:
  // its operations are failed by their flush completions (the NIC may still be writing into
  // their buffers until then), or after kFlushWait if the device never flushes.
  std::optional<Clock::time_point> errored_at;
};

constexpr auto kFlushWait = std::chrono::seconds(2);

// Operations posted with one doorbell; the last one is signalled and retires them all.
struct Chunk {
  bool active = false;
  uint16_t node = 0;
  uint32_t gen = 0;
  std::vector<std::pair<uint64_t, OpKind>> ops;  // tag, kind
};

class VerbsEndpoint final : public Endpoint {
 public:
  VerbsEndpoint(std::shared_ptr<VerbsCluster> c, size_t pool_bytes);
  ~VerbsEndpoint() override;
  Status post(std::span<const Op> ops) override;
  Status send(uint16_t node, const void* data, size_t len) override;
  bool try_recv(Message& out) override;

 protected:
  BufferPool& pool() override { return pool_; }
  std::string node_name(uint16_t node) const override { return cluster_->node_name(node); }
  size_t poll_impl(std::span<Completion> out) override;
  size_t in_flight_impl() const override { return in_flight_ + ready_.size(); }

 private:
  void connect_node(uint16_t node);
  rdma_cm_event* wait_event(rdma_cm_id* id, rdma_cm_event_type want, const std::string& what);
  void drain_cm_events();
  void post_recv(uint16_t node, uint32_t buf);
  /// Reads the completion queue into ready_; returns the number of work completions seen.
  int drive();
  void on_wc(const ibv_wc& wc);
  void finish_chunk(uint32_t slot, size_t ok_ops, Status rest);
  void fail_dead();
  /// Makes room for `wrs` more requests on `node`'s send queue; false when it cannot.
  Status room_for(uint16_t node, uint32_t wrs);
  uint32_t take_slot();

  std::shared_ptr<VerbsCluster> cluster_;
  BufferPool pool_;
  verbs::MrPtr pool_mr_;
  verbs::CqPtr cq_;
  verbs::EventChannelPtr events_;
  uint32_t sq_depth_ = 0;
  std::vector<Conn> conns_;  // by memnode id
  std::vector<Chunk> chunks_;
  std::vector<uint32_t> free_chunks_;
  std::vector<uint32_t> chunk_gen_;
  std::deque<Completion> ready_;
  size_t in_flight_ = 0;     // posted operations not yet in ready_
  uint64_t seen_deaths_ = 0;
  uint64_t empty_polls_ = 0;
  std::deque<Message> inbox_;
  std::vector<Buffer> abandoned_;  // SEND buffers of a dead memnode that the device never flushed
  bool dead_pending_ = false;  // chunks toward dead memnodes wait for their flushes
  uint64_t send_wr_ = 0;       // wr_id of the SEND that send() waits for
  uint16_t send_seq_ = 0;
  bool send_done_ = false;
  ibv_wc_status send_status_ = IBV_WC_SUCCESS;
};

std::unique_ptr<Endpoint> VerbsCluster::make_endpoint(size_t pool_bytes) {
  return std::make_unique<VerbsEndpoint>(shared_from_this(), pool_bytes);
}

VerbsEndpoint::VerbsEndpoint(std::shared_ptr<VerbsCluster> c, size_t pool_bytes)
    : cluster_(std::move(c)), pool_(pool_bytes) {
  // The whole pool is registered once: every READ target, WRITE source, atomic result and
  // message buffer comes from it.
  pool_mr_.reset(ibv_reg_mr(cluster_->pd(), pool_.arena(), pool_.arena_bytes(), IBV_ACCESS_LOCAL_WRITE));
  if (!pool_mr_) verbs::fail_errno("ibv_reg_mr of a " + std::to_string(pool_.arena_bytes()) + "-byte buffer pool");
  // Queue sizes from the device's limits: every queue pair's signalled requests and receives
  // must fit the one completion queue.
  const auto& lim = cluster_->limits();
  const int nodes = static_cast<int>(cluster_->num_peers());
  const int per_node_cqe = std::max(2, lim.max_cqe / std::max(1, nodes) - 1);
  sq_depth_ = static_cast<uint32_t>(std::max(1, std::min({kMaxSendDepth, lim.max_qp_wr, per_node_cqe - kRecvDepth})));
  // Twice that: a replaced queue pair's flushes may still sit in the CQ beside the new one's.
  const int cqe = std::min(lim.max_cqe, 2 * nodes * (static_cast<int>(sq_depth_) + kRecvDepth) + 1);
  cq_.reset(ibv_create_cq(cluster_->context(), cqe, nullptr, nullptr, 0));
  if (!cq_) verbs::fail_errno("ibv_create_cq of " + std::to_string(cqe) + " entries on " + lim.name);
  events_.reset(rdma_create_event_channel());
  if (!events_) verbs::fail_errno("rdma_create_event_channel");
  int fl = fcntl(events_->fd, F_GETFL);
  fcntl(events_->fd, F_SETFL, fl | O_NONBLOCK);
  conns_.resize(cluster_->num_peers());
  seen_deaths_ = cluster_->deaths();
  for (uint16_t i = 0; i < cluster_->num_peers(); ++i)
    if (cluster_->alive(i)) connect_node(i);
}

VerbsEndpoint::~VerbsEndpoint() {
  // Let posted operations finish so the device does not write into a freed pool.
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (in_flight_ > 0 && Clock::now() < deadline) {
    drive();
    fail_dead();
  }
  for (auto& c : conns_)
    if (c.cm.id != nullptr && !c.broken) rdma_disconnect(c.cm.id);
  drain_cm_events();
  for (auto& c : conns_) c.cm.reset();  // queue pairs before the CQ and the pool registration
}

rdma_cm_event* VerbsEndpoint::wait_event(rdma_cm_id* id, rdma_cm_event_type want, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(kConnectTimeoutMs);
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(events_.get(), &ev) == 0) {
      if (ev->id == id) {
        if (ev->event == want) return ev;
        std::string why = rdma_event_str(ev->event);
        if (ev->event == RDMA_CM_EVENT_REJECTED && ev->param.conn.private_data_len > 0) {
          const char* p = static_cast<const char*>(ev->param.conn.private_data);
          why += ": " + std::string(p, strnlen(p, ev->param.conn.private_data_len));
        } else if (ev->status != 0) {
          why += " (status " + std::to_string(ev->status) + ")";
        }
        rdma_ack_cm_event(ev);
        throw FabricError(what + ": " + why);
      }
      // Another queue pair's event: only a disconnection matters.
      for (auto& c : conns_)
        if (c.cm.id == ev->id && ev->event == RDMA_CM_EVENT_DISCONNECTED) c.broken = true;
      rdma_ack_cm_event(ev);
      continue;
    }
    if (errno != EAGAIN) verbs::fail_errno(what + ": rdma_get_cm_event");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw FabricError(what + ": no " + rdma_event_str(want) + " within " +
                                     std::to_string(kConnectTimeoutMs) + " ms");
    pollfd pfd{events_->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<long>(left, 100)));
  }
}

void VerbsEndpoint::drain_cm_events() {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(events_.get(), &ev) == 0) {
    for (auto& c : conns_)
      if (c.cm.id == ev->id && ev->event == RDMA_CM_EVENT_DISCONNECTED) c.broken = true;
    rdma_ack_cm_event(ev);
  }
}

void VerbsEndpoint::connect_node(uint16_t node) {
  const std::string who = node_name(node);
  Conn& c = conns_[node];
  drain_cm_events();
  drive();  // the old queue pair's completions out of the CQ before it goes (rxe keeps them)
  c.cm.reset();
  c.errored_at.reset();
  c.recv_bufs.clear();
  c.broken = true;
  c.sq_used = 0;
  ++c.gen;
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(events_.get(), &id, nullptr, RDMA_PS_TCP) != 0) verbs::fail_errno("rdma_create_id");
  c.cm = verbs::CmId(id);
  sockaddr_storage dst = verbs::resolve(cluster_->host(node), cluster_->port(node), who);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), kConnectTimeoutMs) != 0)
    verbs::fail_errno(who + ": rdma_resolve_addr");
  rdma_ack_cm_event(wait_event(id, RDMA_CM_EVENT_ADDR_RESOLVED, who + ": resolving its RDMA address"));
  if (id->verbs != cluster_->context())
    throw FabricError(who + " is reached through another RDMA device than memnode 0 (one device per computenode)");
  if (rdma_resolve_route(id, kConnectTimeoutMs) != 0) verbs::fail_errno(who + ": rdma_resolve_route");
  rdma_ack_cm_event(wait_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, who + ": resolving the route"));

  ibv_qp_init_attr qa{};
  qa.send_cq = cq_.get();
  qa.recv_cq = cq_.get();
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;  // selective signalling: the last request of a doorbell batch only
  qa.cap.max_send_wr = sq_depth_;
  qa.cap.max_recv_wr = kRecvDepth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = kWantInline;
  if (rdma_create_qp(id, cluster_->pd(), &qa) != 0) {
    qa.cap.max_inline_data = 0;  // the device has no inline data: WRITEs go by DMA
    if (rdma_create_qp(id, cluster_->pd(), &qa) != 0) verbs::fail_errno(who + ": rdma_create_qp");
  }
  c.qp = id->qp;
  c.max_inline = qa.cap.max_inline_data;
  for (uint32_t i = 0; i < kRecvDepth; ++i) {
    c.recv_bufs.push_back(pool_.alloc(verbs::kMsgBytes));
    post_recv(node, i);
  }
  verbs::ConnectRequest req{};
  req.magic = verbs::kConnectMagic;
  req.version = verbs::kConnectVersion;
  req.cn_id = cluster_->cn_id();
  std::memcpy(req.nonce, cluster_->nonce().data(), verbs::kNonceBytes);
  rdma_conn_param cp{};
  cp.private_data = &req;
  cp.private_data_len = sizeof req;
  cp.initiator_depth = static_cast<uint8_t>(std::clamp(cluster_->limits().max_qp_init_rd_atom, 1, 16));
  cp.responder_resources = 1;
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;  // a memnode that has not re-posted a receive yet: wait, do not fail
  if (rdma_connect(id, &cp) != 0) verbs::fail_errno(who + ": rdma_connect");
  rdma_ack_cm_event(wait_event(id, RDMA_CM_EVENT_ESTABLISHED, who + ": connecting a queue pair"));
  c.broken = false;
}

void VerbsEndpoint::post_recv(uint16_t node, uint32_t buf) {
  Conn& c = conns_[node];
  ibv_sge sge{reinterpret_cast<uintptr_t>(c.recv_bufs[buf].data()), static_cast<uint32_t>(verbs::kMsgBytes),
              pool_mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = msg_wr_id(false, node, c.gen, buf);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_recv(c.qp, &wr, &bad) != 0) c.broken = true;
}

uint32_t VerbsEndpoint::take_slot() {
  if (free_chunks_.empty()) {
    chunks_.emplace_back();
    chunk_gen_.push_back(0);
    free_chunks_.push_back(static_cast<uint32_t>(chunks_.size() - 1));
  }
  uint32_t s = free_chunks_.back();
  free_chunks_.pop_back();
  Chunk& ch = chunks_[s];
  ch.active = true;
  ch.gen = ++chunk_gen_[s];
  ch.ops.clear();
  return s;
}

// Ops [0, ok_ops) completed; the rest get `rest`. The chunk's send-queue entries are retired.
void VerbsEndpoint::finish_chunk(uint32_t slot, size_t ok_ops, Status rest) {
  Chunk& ch = chunks_[slot];
  for (size_t i = 0; i < ch.ops.size(); ++i)
    ready_.push_back({ch.ops[i].first, i < ok_ops ? Status::Ok : rest, ch.ops[i].second, ch.node});
  in_flight_ -= ch.ops.size();
  Conn& c = conns_[ch.node];
  c.sq_used -= std::min<uint32_t>(c.sq_used, static_cast<uint32_t>(ch.ops.size()));
  ch.active = false;
  free_chunks_.push_back(slot);
}

void VerbsEndpoint::on_wc(const ibv_wc& wc) {
  if (wc.wr_id & kMsgBit) {
    const uint16_t node = static_cast<uint16_t>(wc.wr_id >> 32);
    const uint32_t gen = static_cast<uint32_t>(wc.wr_id >> 16) & 0xffff;
    const uint32_t buf = static_cast<uint32_t>(wc.wr_id & 0xffff);
    if (node >= conns_.size() || gen != (conns_[node].gen & 0xffff)) return;  // an older connection's
    Conn& c = conns_[node];
    if (wc.wr_id & kSendBit) {
      if (wc.wr_id == send_wr_) {
        send_done_ = true;
        send_status_ = wc.status;
      }
      if (c.sq_used > 0) --c.sq_used;
      if (wc.status != IBV_WC_SUCCESS) c.broken = true;
      return;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      c.broken = true;  // flushed: the queue pair is in the error state
      return;
    }
    verbs::MsgHeader h;
    const char* p = c.recv_bufs[buf].data();
    std::memcpy(&h, p, sizeof h);
    if (h.magic == verbs::kMsgMagic && h.len <= kMaxMessage && wc.byte_len >= sizeof h + h.len) {
      Message m;
      m.from_node = node;  // from the queue pair it came on, not from the header
      m.payload.assign(p + sizeof h, p + sizeof h + h.len);
      inbox_.push_back(std::move(m));
    } else {
      spdlog::warn("dropped a malformed message ({} bytes) from {}", wc.byte_len, node_name(node));
    }
    post_recv(node, buf);
    return;
  }
  const uint32_t slot = static_cast<uint32_t>(wc.wr_id >> 32);
  const uint32_t gen = static_cast<uint32_t>(wc.wr_id >> 16) & 0xffff;
  const uint32_t idx = static_cast<uint32_t>(wc.wr_id & 0xffff);
  if (slot >= chunks_.size() || !chunks_[slot].active || (chunks_[slot].gen & 0xffff) != gen) return;
  if (wc.status == IBV_WC_SUCCESS) {
    finish_chunk(slot, chunks_[slot].ops.size(), Status::Ok);  // in-order: the signalled last one retires all
    return;
  }
  // Requests before the failed one completed (RC completes in order); it and the rest did not,
  // and the queue pair is now in the error state.
  const Chunk& ch = chunks_[slot];
  if (wc.status != IBV_WC_WR_FLUSH_ERR)
    spdlog::debug("{} on {} failed: {}", op_name(ch.ops[std::min<size_t>(idx, ch.ops.size() - 1)].second),
                  node_name(ch.node), verbs::wc_status(wc.status));
  conns_[ch.node].broken = true;
  finish_chunk(slot, idx, cluster_->alive(ch.node) ? Status::RemoteError : Status::PeerDead);
}

int VerbsEndpoint::drive() {
  ibv_wc wc[32];
  int total = 0;
  for (;;) {
    int n = ibv_poll_cq(cq_.get(), 32, wc);
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) on_wc(wc[i]);
    total += n;
    if (n < 32) break;
  }
  return total;
}

// A memnode declared dead (control connection lost, heartbeats unanswered) may still have a
// NIC that serves our queue pair: move the queue pair to the error state so the device stops
// and flushes its requests; their flush completions fail the operations (on_wc). A device
// that does not flush within kFlushWait gets them failed anyway.
void VerbsEndpoint::fail_dead() {
  const uint64_t deaths = cluster_->deaths();
  if (deaths != seen_deaths_) {
    seen_deaths_ = deaths;
    for (uint16_t node = 0; node < conns_.size(); ++node) {
      Conn& c = conns_[node];
      if (cluster_->alive(node) || c.errored_at || c.qp == nullptr) continue;
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      ibv_modify_qp(c.qp, &a, IBV_QP_STATE);
      c.errored_at = Clock::now();
      c.broken = true;
      dead_pending_ = true;
    }
  }
  if (!dead_pending_) return;
  bool left = false;
  const auto now = Clock::now();
  for (uint32_t s = 0; s < chunks_.size(); ++s) {
    if (!chunks_[s].active || cluster_->alive(chunks_[s].node)) continue;
    const Conn& c = conns_[chunks_[s].node];
    if (!c.errored_at || now - *c.errored_at > kFlushWait)
      finish_chunk(s, 0, Status::PeerDead);
    else
      left = true;
  }
  dead_pending_ = left;
}

size_t VerbsEndpoint::poll_impl(std::span<Completion> out) {
  if (ready_.size() < out.size()) drive();
  fail_dead();
  size_t n = std::min(out.size(), ready_.size());
  std::copy_n(ready_.begin(), n, out.begin());
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<ptrdiff_t>(n));
  // On hosts with fewer cores than busy processes, give the core away now and then.
  if (n == 0 && ++empty_polls_ % 256 == 0) sched_yield();
  return n;
}

Status VerbsEndpoint::room_for(uint16_t node, uint32_t wrs) {
  Conn& c = conns_[node];
  if (c.broken) {
    // The queue pair failed earlier (a remote error) or was never made: once nothing of it is
    // in flight any more, a fresh one replaces it.
    for (const auto& ch : chunks_)
      if (ch.active && ch.node == node) {
        drive();
        fail_dead();
        return c.broken ? Status::RemoteError : Status::Ok;
      }
    try {
      connect_node(node);
    } catch (const FabricError& e) {
      spdlog::error("{}", e.what());
      return cluster_->alive(node) ? Status::RemoteError : Status::PeerDead;
    }
  }
  while (c.sq_used + wrs > sq_depth_) {
    drive();
    fail_dead();
    if (!cluster_->alive(node)) return Status::PeerDead;
    if (c.broken) return Status::RemoteError;
  }
  return Status::Ok;
}

Status VerbsEndpoint::post(std::span<const Op> ops) {
  const size_t nodes = cluster_->num_peers();
  for (const Op& op : ops) {
    const uint16_t node = op.remote.node();
    if (node >= nodes) return Status::UnknownNode;
    if (!cluster_->alive(node)) return Status::PeerDead;
    const size_t len = (op.kind == OpKind::Read || op.kind == OpKind::Write) ? op.len : 8;
    const uint64_t size = cluster_->peer(node).info.region_size;
    if (op.remote.offset() > size || len > size - op.remote.offset()) return Status::OutOfBounds;
    if (!pool_.contains(op.local, len)) return Status::BadLocalBuffer;
    if ((op.kind == OpKind::FetchAdd || op.kind == OpKind::CompareSwap) &&
        (op.remote.offset() % 8 != 0 || reinterpret_cast<uintptr_t>(op.local) % 8 != 0))
      return Status::Misaligned;
  }
  if (ops.empty()) return Status::Ok;
  // One linked list per memnode (a batch normally reads one), in the caller's order, at most
  // kMaxChunk or a send queue's worth per doorbell. Room is made for all of them before any is
  // posted, so a synchronous error posts nothing.
  std::vector<std::vector<uint32_t>> by_node(nodes);
  for (uint32_t i = 0; i < ops.size(); ++i) by_node[ops[i].remote.node()].push_back(i);
  const uint32_t chunk_max = std::min(kMaxChunk, sq_depth_);
  for (uint16_t node = 0; node < nodes; ++node) {
    if (by_node[node].empty()) continue;
    Status s = room_for(node, std::min<uint32_t>(chunk_max, static_cast<uint32_t>(by_node[node].size())));
    if (s != Status::Ok) return s;
  }
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;
  // Once a chunk is out, a later one that cannot go is not a synchronous error any more (the
  // caller would take the whole batch for unposted): its operations, and all after it, complete
  // with the error instead.
  bool posted_any = false;
  auto fail_from = [&](uint16_t node0, size_t from0, Status st) {
    if (!posted_any) return st;
    for (uint16_t node = node0; node < nodes; ++node)
      for (size_t j = node == node0 ? from0 : 0; j < by_node[node].size(); ++j) {
        const Op& op = ops[by_node[node][j]];
        ready_.push_back({op.tag, st, op.kind, node});
      }
    return Status::Ok;
  };
  for (uint16_t node = 0; node < nodes; ++node) {
    const auto& idxs = by_node[node];
    const PeerState& p = cluster_->peer(node);
    for (size_t from = 0; from < idxs.size(); from += chunk_max) {
      const size_t n = std::min<size_t>(chunk_max, idxs.size() - from);
      Status s = room_for(node, static_cast<uint32_t>(n));  // later chunks of a long batch wait for room
      if (s != Status::Ok) return fail_from(node, from, s);
      Conn& c = conns_[node];
      const uint32_t slot = take_slot();
      Chunk& ch = chunks_[slot];
      ch.node = node;
      wrs.assign(n, ibv_send_wr{});
      sges.assign(n, ibv_sge{});
      for (size_t j = 0; j < n; ++j) {
        const Op& op = ops[idxs[from + j]];
        ibv_send_wr& wr = wrs[j];
        ibv_sge& sge = sges[j];
        sge.addr = reinterpret_cast<uintptr_t>(op.local);
        sge.length = static_cast<uint32_t>(op.kind == OpKind::Read || op.kind == OpKind::Write ? op.len : 8);
        sge.lkey = pool_mr_->lkey;
        wr.wr_id = op_wr_id(slot, ch.gen, static_cast<uint32_t>(j));
        wr.next = j + 1 < n ? &wrs[j + 1] : nullptr;
        wr.sg_list = &sge;
        wr.num_sge = sge.length > 0 ? 1 : 0;
        wr.send_flags = j + 1 == n ? IBV_SEND_SIGNALED : 0;
        const uint64_t raddr = p.base + op.remote.offset();
        const uint32_t rkey = static_cast<uint32_t>(p.key);
        switch (op.kind) {
          case OpKind::Read:
            wr.opcode = IBV_WR_RDMA_READ;
            wr.wr.rdma = {raddr, rkey};
            break;
          case OpKind::Write:
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.wr.rdma = {raddr, rkey};
            if (op.len <= c.max_inline) wr.send_flags |= IBV_SEND_INLINE;  // copied at post: no DMA read
            break;
          case OpKind::FetchAdd:
            wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
            wr.wr.atomic = {raddr, op.operand, 0, rkey};
            break;
          case OpKind::CompareSwap:
            wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
            wr.wr.atomic = {raddr, op.compare, op.operand, rkey};
            break;
        }
        ch.ops.emplace_back(op.tag, op.kind);
        ++counters_.ops[static_cast<int>(op.kind)];
        if (op.kind == OpKind::Read) counters_.bytes_read += op.len;
        if (op.kind == OpKind::Write) counters_.bytes_written += op.len;
      }
      ibv_send_wr* bad = nullptr;
      const int rc = ibv_post_send(c.qp, wrs.data(), &bad);
      ++counters_.doorbells;
      if (rc != 0) {
        // Only a queue pair already in the error state refuses here (room was made above).
        spdlog::error("ibv_post_send to {}: {}", node_name(node), std::strerror(rc));
        c.broken = true;
        ch.active = false;
        free_chunks_.push_back(slot);
        return fail_from(node, from, Status::RemoteError);
      }
      posted_any = true;
      c.sq_used += static_cast<uint32_t>(n);
      in_flight_ += n;
    }
  }
  return Status::Ok;
}

Status VerbsEndpoint::send(uint16_t node, const void* data, size_t len) {
  if (node >= cluster_->num_peers()) return Status::UnknownNode;
  if (!cluster_->alive(node)) return Status::PeerDead;
  if (len > kMaxMessage) return Status::OutOfBounds;
  Status s = room_for(node, 1);
  if (s != Status::Ok) return s;
  Conn& c = conns_[node];
  Buffer b = pool_.alloc(sizeof(verbs::MsgHeader) + len);
  verbs::MsgHeader h{verbs::kMsgMagic, 0xffff, 0, static_cast<uint32_t>(len), 0};
  std::memcpy(b.data(), &h, sizeof h);
  std::memcpy(b.data() + sizeof h, data, len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(b.data()), static_cast<uint32_t>(sizeof h + len), pool_mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = send_wr_ = msg_wr_id(true, node, c.gen, ++send_seq_);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  send_done_ = false;
  if (ibv_post_send(c.qp, &wr, &bad) != 0) {
    c.broken = true;
    return Status::RemoteError;
  }
  ++c.sq_used;
  ++counters_.doorbells;
  // Wait for the send to complete so the buffer can be returned (messages are small and rare).
  // A memnode that dies meanwhile: its queue pair is flushed (fail_dead), which completes the
  // SEND; the buffer is not handed back while the NIC may still read it.
  std::optional<Clock::time_point> dead_since;
  while (!send_done_) {
    drive();
    fail_dead();
    if (cluster_->alive(node)) continue;
    if (!dead_since) dead_since = Clock::now();
    if (Clock::now() - *dead_since > kFlushWait) {
      abandoned_.push_back(std::move(b));  // the device may still read it: kept until the endpoint closes
      return Status::PeerDead;
    }
  }
  if (!cluster_->alive(node)) return Status::PeerDead;
  if (send_status_ != IBV_WC_SUCCESS) {
    spdlog::debug("message to {} failed: {}", node_name(node), verbs::wc_status(send_status_));
    return Status::RemoteError;
  }
  ++counters_.msgs_sent;
  return Status::Ok;
}

bool VerbsEndpoint::try_recv(Message& out) {
  if (inbox_.empty()) drive();
  if (inbox_.empty()) return false;
  out = std::move(inbox_.front());
  inbox_.pop_front();
  ++counters_.msgs_received;
  return true;
}

}  // namespace

std::shared_ptr<Cluster> connect_verbs_cluster(const ClusterOptions& opts) {
  auto c = std::make_shared<VerbsCluster>(opts);
  c->connect();
  return c;
}

}  // namespace dmhnsw::fabric
