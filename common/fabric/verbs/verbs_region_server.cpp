// verbs provider, memory side: the region registered once with the NIC (which picks the
// rkey), an rdma_cm listener that accepts queue pairs only from joined computenodes, and
// messages over SEND/RECV on those queue pairs. One-sided operations never reach this process:
// the NIC serves them, so the progress thread sleeps on the completion channel and the
// rdma_cm event channel unless a message arrives.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "common/fabric/region_backend.hpp"
#include "common/fabric/verbs/verbs.hpp"

namespace dmhnsw::fabric {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint32_t kSrqDepth = 256;        // receive buffers shared by every queue pair
constexpr uint32_t kConnSendDepth = 64;    // send-queue entries per computenode queue pair
constexpr size_t kMaxQueuedPerConn = 256;  // replies waiting for one computenode; beyond: dropped
constexpr uint64_t kSendBit = uint64_t{1} << 63;

struct Conn {
  verbs::CmId cm;
  uint32_t idx = 0;        // in VerbsRegionServer::conns_
  uint32_t cn_id = 0;
  std::string nonce;
  uint32_t gen = 0;
  bool live = false;       // established
  uint32_t sending = 0;    // SENDs posted, not completed
  std::deque<Buffer> queued;  // replies waiting for send-queue room
};

class VerbsRegionServer final : public RegionBackend {
 public:
  VerbsRegionServer(const std::string& listen_host, char* region, uint64_t size, uint16_t memnode_id);
  ~VerbsRegionServer() override;
  std::vector<char> fabric_address() const override;
  std::vector<std::vector<char>> rma_lane_addresses() const override { return {}; }
  uint64_t remote_base() const override { return reinterpret_cast<uintptr_t>(region_); }
  uint64_t key() const override { return region_mr_->rkey; }
  std::string describe() const override { return description_; }
  void add_client(uint32_t cn_id, const std::vector<char>& fabric_addr) override;
  void remove_client(uint32_t cn_id) override;
  void set_handler(RegionServer::Handler h) override {
    std::lock_guard g(mu_);
    handler_ = std::move(h);
  }
  void send_to(uint64_t sender, const void* data, size_t len) override;
  void set_tick(std::function<void()> tick, int period_ms) override {
    std::lock_guard g(mu_);
    tick_ = std::move(tick);
    tick_ms_ = period_ms;
  }
  void run(const std::atomic<bool>& stop) override;
  RegionServer::Stats stats() const override { return {0, waits_.load(), messages_.load(), 0, {}}; }
  double progress_stalled_seconds() const override {
    const int64_t t = loop_ns_.load(std::memory_order_relaxed);
    if (t == 0) return 0;
    return std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(t))).count();
  }

 private:
  void post_recv(uint32_t buf);
  bool drive_cq();
  bool drive_cm();
  void on_connect_request(rdma_cm_event* ev);
  void on_message(Conn& c, uint32_t idx, const char* p, size_t len);
  void flush(Conn& c);
  void drop_conn(uint32_t idx);
  Conn* conn_of(uint64_t handle);

  char* region_;
  uint64_t size_;
  uint16_t id_;
  verbs::EventChannelPtr events_;
  verbs::CmId listen_;
  ibv_context* ctx_ = nullptr;
  verbs::DeviceLimits limits_;
  verbs::PdPtr pd_;
  verbs::MrPtr region_mr_;
  verbs::ChannelPtr channel_;
  verbs::CqPtr cq_;
  verbs::SrqPtr srq_;
  BufferPool bufs_{48u << 20};  // receives, and the queued and sending replies of 32 stalled computenodes
  verbs::MrPtr bufs_mr_;
  std::vector<Buffer> recv_bufs_;
  uint16_t port_ = 0;
  std::string description_;

  std::vector<std::unique_ptr<Conn>> conns_;   // progress thread only
  std::map<uint32_t, uint32_t> by_qp_;         // qp_num → conns_ index
  std::map<uint64_t, std::pair<uint32_t, Buffer>> sending_;  // wr_id → (connection, buffer) of a posted SEND
  uint64_t next_send_ = 0;
  uint32_t conn_gens_ = 0;
  uint32_t max_conns_ = 0;
  std::map<std::string, uint32_t> clients_;    // nonce → computenode id (guarded by mu_)
  std::vector<uint32_t> leaving_;              // computenodes whose queue pairs to close (mu_)
  std::mutex mu_;
  RegionServer::Handler handler_;
  std::function<void()> tick_;
  int tick_ms_ = 50;
  std::atomic<uint64_t> waits_{0}, messages_{0};
  std::atomic<int64_t> loop_ns_{0};
};

VerbsRegionServer::VerbsRegionServer(const std::string& listen_host, char* region, uint64_t size,
                                     uint16_t memnode_id)
    : region_(region), size_(size), id_(memnode_id) {
  verbs::require_device();
  events_.reset(rdma_create_event_channel());
  if (!events_) verbs::fail_errno("rdma_create_event_channel");
  fcntl(events_->fd, F_SETFL, fcntl(events_->fd, F_GETFL) | O_NONBLOCK);
  rdma_cm_id* lid = nullptr;
  if (rdma_create_id(events_.get(), &lid, nullptr, RDMA_PS_TCP) != 0) verbs::fail_errno("rdma_create_id");
  listen_ = verbs::CmId(lid);
  sockaddr_storage sa = verbs::resolve(listen_host, 0, "--listen");
  if (rdma_bind_addr(lid, reinterpret_cast<sockaddr*>(&sa)) != 0)
    verbs::fail_errno("--listen " + listen_host + ": rdma_bind_addr (with --provider verbs, --listen must be the IP "
                      "of an RDMA device's interface: a RoCE or IPoIB netdev, or the netdev of a soft-RoCE link)");
  ctx_ = lid->verbs;
  if (ctx_ == nullptr) {
    // A wildcard address binds no device: serve on the first one.
    int n = 0;
    ibv_context** list = rdma_get_devices(&n);
    if (list == nullptr || n == 0) verbs::require_device();
    ctx_ = list[0];
    rdma_free_devices(list);
  }
  limits_ = verbs::query_device(ctx_);
  if (!limits_.atomics)
    throw FabricError("--provider verbs: device " + limits_.name + " does not execute atomics (atomic_cap NONE)");
  pd_ = verbs::alloc_pd(ctx_);
  // The NIC chooses the rkey; it is handed out only in the welcome, after the token check.
  region_mr_.reset(ibv_reg_mr(pd_.get(), region, size,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_ATOMIC));
  if (!region_mr_) verbs::fail_errno("ibv_reg_mr of the " + std::to_string(size) + "-byte region on " + limits_.name);
  channel_.reset(ibv_create_comp_channel(ctx_));
  if (!channel_) verbs::fail_errno("ibv_create_comp_channel");
  fcntl(channel_->fd, F_SETFL, fcntl(channel_->fd, F_GETFL) | O_NONBLOCK);
  // One CQ takes every receive (the SRQ) and every queue pair's signalled SENDs: it bounds
  // how many queue pairs the memnode can accept (rxe: 32,767 entries, about 500 queue pairs).
  const int cqe = std::min(limits_.max_cqe, static_cast<int>(kSrqDepth + kConnSendDepth * 1024));
  cq_.reset(ibv_create_cq(ctx_, cqe, nullptr, channel_.get(), 0));
  if (!cq_) verbs::fail_errno("ibv_create_cq of " + std::to_string(cqe) + " entries");
  max_conns_ = (static_cast<uint32_t>(cqe) - kSrqDepth) / kConnSendDepth;
  ibv_srq_init_attr sa_attr{};
  sa_attr.attr.max_wr = std::min<uint32_t>(kSrqDepth, static_cast<uint32_t>(std::max(1, limits_.max_srq_wr)));
  sa_attr.attr.max_sge = 1;
  srq_.reset(ibv_create_srq(pd_.get(), &sa_attr));
  if (!srq_) verbs::fail_errno("ibv_create_srq");
  bufs_mr_.reset(ibv_reg_mr(pd_.get(), bufs_.arena(), bufs_.arena_bytes(), IBV_ACCESS_LOCAL_WRITE));
  if (!bufs_mr_) verbs::fail_errno("ibv_reg_mr of the message buffers");
  for (uint32_t i = 0; i < sa_attr.attr.max_wr; ++i) {
    recv_bufs_.push_back(bufs_.alloc(verbs::kMsgBytes));
    post_recv(i);
  }
  if (rdma_listen(lid, 64) != 0) verbs::fail_errno("rdma_listen");
  port_ = ntohs(rdma_get_src_port(lid));
  char ip[INET_ADDRSTRLEN] = "?";
  const sockaddr* la = rdma_get_local_addr(lid);
  if (la != nullptr && la->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(la)->sin_addr, ip, sizeof ip);
  description_ = verbs::describe(limits_) + ", rdma_cm on " + ip + ":" + std::to_string(port_);
}

VerbsRegionServer::~VerbsRegionServer() {
  for (auto& c : conns_)
    if (c && c->cm.id != nullptr) rdma_disconnect(c->cm.id);
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(events_.get(), &ev) == 0) rdma_ack_cm_event(ev);
  conns_.clear();  // queue pairs before the SRQ, CQ and registrations
  listen_.reset();
}

std::vector<char> VerbsRegionServer::fabric_address() const {
  verbs::ListenAddress a{verbs::kConnectMagic, port_, 0, {}};
  const sockaddr* sa = rdma_get_local_addr(listen_.id);
  if (sa != nullptr && sa->sa_family == AF_INET)
    std::memcpy(a.ipv4, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, sizeof a.ipv4);
  std::vector<char> out(sizeof a);
  std::memcpy(out.data(), &a, sizeof a);
  return out;
}

void VerbsRegionServer::add_client(uint32_t cn_id, const std::vector<char>& addr) {
  if (addr.size() != verbs::kNonceBytes) return;  // not a verbs computenode: it gets no queue pair
  std::lock_guard g(mu_);
  clients_[std::string(addr.begin(), addr.end())] = cn_id;
}

void VerbsRegionServer::remove_client(uint32_t cn_id) {
  std::lock_guard g(mu_);
  std::erase_if(clients_, [&](const auto& kv) { return kv.second == cn_id; });
  leaving_.push_back(cn_id);
}

void VerbsRegionServer::post_recv(uint32_t buf) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(recv_bufs_[buf].data()), static_cast<uint32_t>(verbs::kMsgBytes),
              bufs_mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = buf;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_srq_recv(srq_.get(), &wr, &bad) != 0) spdlog::error("memnode {}: ibv_post_srq_recv failed", id_);
}

Conn* VerbsRegionServer::conn_of(uint64_t handle) {
  const uint32_t idx = static_cast<uint32_t>(handle >> 32);
  if (idx >= conns_.size() || !conns_[idx] || conns_[idx]->gen != static_cast<uint32_t>(handle)) return nullptr;
  return conns_[idx].get();
}

void VerbsRegionServer::send_to(uint64_t sender, const void* data, size_t len) {
  Conn* c = conn_of(sender);
  if (c == nullptr || len > kMaxMessage) return;  // that computenode's queue pair is gone
  if (c->queued.size() >= kMaxQueuedPerConn) {
    spdlog::warn("memnode {}: dropped a message to computenode {}: {} replies wait for it already", id_, c->cn_id,
                 c->queued.size());
    return;
  }
  Buffer b;
  try {
    b = bufs_.alloc(sizeof(verbs::MsgHeader) + len);
  } catch (const FabricError&) {  // many computenodes' replies wait at once: drop this one, serve on
    spdlog::warn("memnode {}: dropped a message to computenode {}: the send buffers are all waiting", id_, c->cn_id);
    return;
  }
  verbs::MsgHeader h{verbs::kMsgMagic, id_, 0, static_cast<uint32_t>(len), 0};
  std::memcpy(b.data(), &h, sizeof h);
  std::memcpy(b.data() + sizeof h, data, len);
  c->queued.push_back(std::move(b));
  flush(*c);
}

// Posts queued replies while the computenode's send queue has room; one that does not take
// its messages (RNR) holds up only its own queue pair.
void VerbsRegionServer::flush(Conn& c) {
  while (c.live && !c.queued.empty() && c.sending < kConnSendDepth) {
    Buffer& b = c.queued.front();
    const uint32_t len = static_cast<uint32_t>(sizeof(verbs::MsgHeader) + reinterpret_cast<verbs::MsgHeader*>(b.data())->len);
    ibv_sge sge{reinterpret_cast<uintptr_t>(b.data()), len, bufs_mr_->lkey};
    ibv_send_wr wr{};
    const uint64_t wr_id = kSendBit | next_send_++;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(c.cm.id->qp, &wr, &bad) != 0) {
      spdlog::warn("memnode {}: a message to computenode {} could not be posted", id_, c.cn_id);
      c.queued.clear();
      return;
    }
    ++c.sending;
    sending_.emplace(wr_id, std::make_pair(c.idx, std::move(b)));
    c.queued.pop_front();
  }
}

void VerbsRegionServer::on_message(Conn& c, uint32_t idx, const char* p, size_t len) {
  verbs::MsgHeader h;
  if (len < sizeof h) return;
  std::memcpy(&h, p, sizeof h);
  if (h.magic != verbs::kMsgMagic || h.len > kMaxMessage || len < sizeof h + h.len) {
    spdlog::warn("memnode {}: dropped a malformed message ({} bytes) from computenode {}", id_, len, c.cn_id);
    return;
  }
  ++messages_;
  Message msg;
  msg.from_node = 0xffff;
  msg.from_cn = c.cn_id;  // from the queue pair's admission, not from the message
  msg.sender = (uint64_t{idx} << 32) | c.gen;
  msg.payload.assign(p + sizeof h, p + sizeof h + h.len);
  RegionServer::Handler hd;
  {
    std::lock_guard g(mu_);
    hd = handler_;
  }
  const uint64_t to = msg.sender;
  if (hd) hd(msg, [&](const void* data, size_t n) { send_to(to, data, n); });
}

bool VerbsRegionServer::drive_cq() {
  ibv_wc wc[32];
  const int n = ibv_poll_cq(cq_.get(), 32, wc);
  for (int i = 0; i < n; ++i) {
    const ibv_wc& w = wc[i];
    auto qp = by_qp_.find(w.qp_num);
    Conn* c = qp != by_qp_.end() ? conns_[qp->second].get() : nullptr;
    if (w.wr_id & kSendBit) {
      sending_.erase(w.wr_id);
      if (c != nullptr && c->sending > 0) --c->sending;
      if (w.status != IBV_WC_SUCCESS && w.status != IBV_WC_WR_FLUSH_ERR)
        spdlog::debug("memnode {}: a message to computenode {} failed: {}", id_, c ? c->cn_id : 0,
                      verbs::wc_status(w.status));
      if (c != nullptr) flush(*c);
      continue;
    }
    const uint32_t buf = static_cast<uint32_t>(w.wr_id);
    if (w.status == IBV_WC_SUCCESS && c != nullptr && buf < recv_bufs_.size())
      on_message(*c, qp->second, recv_bufs_[buf].data(), w.byte_len);
    if (buf < recv_bufs_.size()) post_recv(buf);
  }
  return n > 0;
}

void VerbsRegionServer::on_connect_request(rdma_cm_event* ev) {
  rdma_cm_id* id = ev->id;
  auto reject = [&](const std::string& why) {
    spdlog::warn("memnode {}: refused a queue pair: {}", id_, why);
    rdma_reject(id, why.c_str(), static_cast<uint8_t>(std::min<size_t>(why.size() + 1, 140)));
    rdma_ack_cm_event(ev);
    rdma_destroy_id(id);
  };
  verbs::ConnectRequest req{};
  if (ev->param.conn.private_data_len < sizeof req) return reject("no connect request in the private data");
  std::memcpy(&req, ev->param.conn.private_data, sizeof req);
  if (req.magic != verbs::kConnectMagic || req.version != verbs::kConnectVersion)
    return reject("connect request of another protocol or version");
  const std::string nonce(reinterpret_cast<const char*>(req.nonce), verbs::kNonceBytes);
  {
    std::lock_guard g(mu_);
    auto it = clients_.find(nonce);
    if (it == clients_.end() || it->second != req.cn_id)
      return reject("computenode " + std::to_string(req.cn_id) + " has not joined through the control port");
  }
  if (id->verbs != ctx_) return reject("request arrived on another RDMA device than the region's");
  const auto open = static_cast<uint32_t>(std::count_if(conns_.begin(), conns_.end(), [](const auto& c) { return c != nullptr; }));
  if (open >= max_conns_)
    return reject("the memnode serves " + std::to_string(open) + " queue pairs already, its completion queue's limit");
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_.get();
  qa.recv_cq = cq_.get();
  qa.srq = srq_.get();
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = std::min<uint32_t>(kConnSendDepth, static_cast<uint32_t>(limits_.max_qp_wr));
  qa.cap.max_send_sge = 1;
  if (rdma_create_qp(id, pd_.get(), &qa) != 0) return reject("the memnode could not create a queue pair");
  rdma_conn_param cp{};
  // Incoming READs and atomics the NIC keeps in flight for this queue pair.
  cp.responder_resources =
      static_cast<uint8_t>(std::clamp<int>(ev->param.conn.initiator_depth, 1, std::max(1, limits_.max_qp_rd_atom)));
  cp.initiator_depth = 0;
  cp.rnr_retry_count = 7;  // a computenode that has not re-posted a receive: wait for it
  if (rdma_accept(id, &cp) != 0) {
    rdma_destroy_qp(id);
    return reject("rdma_accept failed");
  }
  auto c = std::make_unique<Conn>();
  c->cm = verbs::CmId(id);
  c->cn_id = req.cn_id;
  c->nonce = nonce;
  uint32_t idx = 0;
  while (idx < conns_.size() && conns_[idx]) ++idx;
  if (idx == conns_.size()) conns_.emplace_back();
  c->gen = ++conn_gens_;
  c->idx = idx;
  by_qp_[id->qp->qp_num] = idx;
  id->context = reinterpret_cast<void*>(static_cast<uintptr_t>(idx) + 1);
  conns_[idx] = std::move(c);
  rdma_ack_cm_event(ev);
}

void VerbsRegionServer::drop_conn(uint32_t idx) {
  if (idx >= conns_.size() || !conns_[idx]) return;
  Conn& c = *conns_[idx];
  if (c.cm.id != nullptr && c.cm.id->qp != nullptr) by_qp_.erase(c.cm.id->qp->qp_num);
  conns_[idx].reset();  // destroys the queue pair and the id
  std::erase_if(sending_, [&](const auto& kv) { return kv.second.first == idx; });
}

bool VerbsRegionServer::drive_cm() {
  bool any = false;
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(events_.get(), &ev) == 0) {
    any = true;
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
      on_connect_request(ev);
      continue;
    }
    const uintptr_t ctx = reinterpret_cast<uintptr_t>(ev->id->context);
    const uint32_t idx = ctx > 0 ? static_cast<uint32_t>(ctx - 1) : UINT32_MAX;
    const rdma_cm_event_type type = ev->event;
    rdma_ack_cm_event(ev);  // before the id may be destroyed below
    if (idx >= conns_.size() || !conns_[idx]) continue;
    Conn& c = *conns_[idx];
    switch (type) {
      case RDMA_CM_EVENT_ESTABLISHED:
        c.live = true;
        spdlog::debug("memnode {}: queue pair from computenode {} established", id_, c.cn_id);
        flush(c);
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_CONNECT_ERROR:
        if (type == RDMA_CM_EVENT_DISCONNECTED) rdma_disconnect(c.cm.id);
        drop_conn(idx);
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        spdlog::error("memnode {}: the RDMA device {} was removed", id_, limits_.name);
        drop_conn(idx);
        break;
      default:
        break;
    }
  }
  return any;
}

void VerbsRegionServer::run(const std::atomic<bool>& stop) {
  // The tick (relay timeouts) runs every tick period while messages arrive, and once a second
  // after a second without any: an idle memnode wakes once a second. (Waking every 50 ms cost
  // a few % of a core as the kernel counts it: a thread woken by the timer tick is charged the
  // whole tick.)
  constexpr auto kIdleAfter = std::chrono::seconds(1);
  constexpr auto kIdleTick = std::chrono::milliseconds(1000);
  auto next_tick = Clock::now();
  auto last_activity = Clock::now();
  auto tick_period = std::chrono::milliseconds(50);  // as set_tick last said, read at each tick
  ibv_req_notify_cq(cq_.get(), 0);
  while (!stop.load(std::memory_order_relaxed)) {
    loop_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    if (Clock::now() >= next_tick) {
      std::function<void()> t;
      {
        std::lock_guard g(mu_);
        t = tick_;
        tick_period = std::chrono::milliseconds(tick_ms_);
      }
      const bool idle = Clock::now() - last_activity > kIdleAfter;
      next_tick = Clock::now() + (idle ? std::chrono::milliseconds(kIdleTick) : tick_period);
      if (t) t();
    }
    std::vector<uint32_t> leaving;
    {
      std::lock_guard g(mu_);
      leaving.swap(leaving_);
    }
    for (uint32_t cn : leaving)  // a computenode that left keeps no queue pair to the region
      for (uint32_t i = 0; i < conns_.size(); ++i) {
        if (!conns_[i] || conns_[i]->cn_id != cn) continue;
        bool revoked;
        {
          std::lock_guard g(mu_);
          revoked = clients_.count(conns_[i]->nonce) == 0;
        }
        if (!revoked) continue;
        rdma_disconnect(conns_[i]->cm.id);
        drop_conn(i);
      }
    bool busy = drive_cq();
    busy |= drive_cm();
    if (busy) {
      last_activity = Clock::now();
      next_tick = std::min(next_tick, last_activity + tick_period);
      continue;
    }
    // Idle: arm the completion channel, look once more (a completion may have slipped in
    // before arming), then sleep until a message, a connection event or the next tick.
    ibv_req_notify_cq(cq_.get(), 0);
    if (drive_cq()) continue;
    ++waits_;
    pollfd fds[2] = {{channel_->fd, POLLIN, 0}, {events_->fd, POLLIN, 0}};
    const auto to_tick = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - Clock::now()).count();
    ::poll(fds, 2, static_cast<int>(std::clamp<long>(to_tick, 1, 1000)));
    if (fds[0].revents & POLLIN) {
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (ibv_get_cq_event(channel_.get(), &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
    }
  }
}

}  // namespace

std::unique_ptr<RegionBackend> make_verbs_region_server(const std::string& listen_host, char* region, uint64_t size,
                                                        uint16_t memnode_id) {
  return std::make_unique<VerbsRegionServer>(listen_host, region, size, memnode_id);
}

}  // namespace dmhnsw::fabric
