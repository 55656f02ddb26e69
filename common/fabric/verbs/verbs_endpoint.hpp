#pragma once
// verbs provider, compute side: the cluster and endpoint classes shared by verbs_cluster.cpp
// (posting, completions, messages) and verbs_connect.cpp (queue pairs connected with rdma_cm).
// Only the verbs provider's sources include this.
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
#include "common/fabric/verbs/verbs.hpp"

namespace dmhnsw::fabric::verbs_detail {

using Clock = std::chrono::steady_clock;

constexpr int kRecvDepth = 16;                 // receive buffers posted per queue pair
constexpr int kMaxSendDepth = 1024;            // send-queue entries per queue pair (fewer if the device says so)
constexpr uint32_t kMaxChunk = 4096;           // work requests per doorbell (the wr_id keeps 16 bits of index)
constexpr int kConnectTimeoutMs = 5000;        // rdma_cm address, route and connection each
constexpr uint32_t kWantInline = 128;          // inline WRITE bytes asked of the device

// wr_id layout. Operations: [63]=0 [62..32] chunk slot [31..16] slot generation [15..0] index.
// Messages: [63]=1 [62] send [47..32] memnode [31..16] connection generation [15..0] buffer.
constexpr uint64_t kMsgBit = uint64_t{1} << 63, kSendBit = uint64_t{1} << 62;
inline uint64_t op_wr_id(uint32_t slot, uint32_t gen, uint32_t idx) {
  return (uint64_t{slot} << 32) | (uint64_t{gen & 0xffff} << 16) | idx;
}
inline uint64_t msg_wr_id(bool send, uint16_t node, uint32_t gen, uint32_t buf) {
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
      if (!alive(i)) {  // a copy already dead when we joined (replica sets): never connected
        ports_.push_back(0);
        hosts_.emplace_back();
        continue;
      }
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
  int nic_numa_node() const override { return verbs::device_numa_node(context()->device); }

  ibv_context* context() const { return probe_.id->verbs; }
  ibv_pd* pd() const { return pd_.get(); }
  const verbs::DeviceLimits& limits() const { return limits_; }
  uint16_t port(uint16_t node) const { return ports_[node]; }
  /// The IP of the memnode's rdma_cm listener.
  const std::string& host(uint16_t node) const { return hosts_[node]; }
  const std::array<uint8_t, verbs::kNonceBytes>& nonce() const { return nonce_; }
  const std::string& device_description() const { return description_; }

 private:
  // The device that routes to the first live memnode (rdma_cm picks it from the IP route);
  // every queue pair and registration of this process lives in one protection domain on it. The
  // probe id keeps rdma_cm's hold on the device for the cluster's lifetime.
  void open_device() {
    uint16_t via = 0;
    while (via < num_peers() && !alive(via)) ++via;
    if (via == num_peers()) throw FabricError("--provider verbs: no memnode is reachable");
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP) != 0) verbs::fail_errno("rdma_create_id");
    probe_ = verbs::CmId(id);
    sockaddr_storage dst = verbs::resolve(hosts_[via], ports_[via], node_name(via));
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), kConnectTimeoutMs) != 0)
      verbs::fail_errno(node_name(via) + ": rdma_resolve_addr (" + hosts_[via] + " is not reachable through an RDMA "
                        "device: is the memnode's --listen the IP of a RoCE/IPoIB interface?)");
    if (id->verbs == nullptr) throw FabricError(node_name(via) + ": rdma_cm resolved no RDMA device");
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
  /// The checks every provider makes before posting (node, bounds, buffer, alignment).
  Status check(std::span<const Op> ops) const;
  /// One operation as a work request into `wr` / `sge` (linked and signalled by the caller).
  void to_work_request(const Op& op, uint16_t node, uint32_t max_inline, ibv_send_wr& wr, ibv_sge& sge) const;
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

}  // namespace dmhnsw::fabric::verbs_detail
