// verbs provider, compute side: an endpoint's queue pairs, one per memnode, created and
// connected with rdma_cm after the control handshake (verbs_endpoint.hpp), and its receive
// buffers.
#include "common/fabric/verbs/verbs_endpoint.hpp"

namespace dmhnsw::fabric::verbs_detail {

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

}  // namespace dmhnsw::fabric::verbs_detail
