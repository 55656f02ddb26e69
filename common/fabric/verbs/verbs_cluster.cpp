// verbs provider, compute side: one reliable-connected queue pair per (endpoint, memnode),
// connected with rdma_cm after the control handshake. READ, WRITE and the two atomics are RDMA
// work requests the NICs execute; a post() is one linked work-request list per memnode, one
// ibv_post_send (one doorbell), with only the last request signalled.
#include "common/fabric/verbs/verbs_endpoint.hpp"

namespace dmhnsw::fabric {
namespace verbs_detail {

std::unique_ptr<Endpoint> VerbsCluster::make_endpoint(size_t pool_bytes) {
  return std::make_unique<VerbsEndpoint>(shared_from_this(), pool_bytes);
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

Status VerbsEndpoint::check(std::span<const Op> ops) const {
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
  return Status::Ok;
}

void VerbsEndpoint::to_work_request(const Op& op, uint16_t node, uint32_t max_inline, ibv_send_wr& wr,
                                    ibv_sge& sge) const {
  const PeerState& p = cluster_->peer(node);
  sge.addr = reinterpret_cast<uintptr_t>(op.local);
  sge.length = static_cast<uint32_t>(op.kind == OpKind::Read || op.kind == OpKind::Write ? op.len : 8);
  sge.lkey = pool_mr_->lkey;
  wr.sg_list = &sge;
  wr.num_sge = sge.length > 0 ? 1 : 0;
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
      if (op.len <= max_inline) wr.send_flags |= IBV_SEND_INLINE;  // copied at post: no DMA read
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
}

Status VerbsEndpoint::post(std::span<const Op> ops) {
  const size_t nodes = cluster_->num_peers();
  if (Status s = check(ops); s != Status::Ok) return s;
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
        wrs[j].wr_id = op_wr_id(slot, ch.gen, static_cast<uint32_t>(j));
        wrs[j].next = j + 1 < n ? &wrs[j + 1] : nullptr;
        wrs[j].send_flags = j + 1 == n ? IBV_SEND_SIGNALED : 0;
        to_work_request(op, node, c.max_inline, wrs[j], sges[j]);
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

}  // namespace verbs_detail

std::shared_ptr<Cluster> connect_verbs_cluster(const ClusterOptions& opts) {
  auto c = std::make_shared<verbs_detail::VerbsCluster>(opts);
  c->connect();
  return c;
}

}  // namespace dmhnsw::fabric
