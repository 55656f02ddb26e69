#pragma once
// Internal to common/fabric: rdma-core (libibverbs + librdmacm) pieces shared by the verbs
// provider's two sides. RC queue pairs connected with rdma_cm; the NIC executes READ, WRITE,
// FETCH_ADD and COMPARE_SWAP, so the memnode's CPU takes no part in one-sided operations.
// Only files in this folder include it.
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric::verbs {

/// Throws the "no RDMA device" error (naming the other providers) when this host has none.
void require_device();
/// "<what>: <strerror(errno)>" as a FabricError.
[[noreturn]] void fail_errno(const std::string& what);
/// Device limits and name, for sizing queues and for messages.
struct DeviceLimits {
  std::string name;
  int max_cqe = 0;
  int max_qp_wr = 0;
  int max_qp_rd_atom = 0;       // incoming READs/atomics a QP accepts in flight
  int max_qp_init_rd_atom = 0;  // outgoing READs/atomics a QP keeps in flight
  int max_srq_wr = 0;
  bool atomics = false;         // 8-byte FETCH_ADD and COMPARE_SWAP executed by the device
};
DeviceLimits query_device(ibv_context* ctx);
/// The NUMA node of the device's PCI function (sysfs device/numa_node); -1 when it has none
/// (soft-RoCE) or the host does not say.
int device_numa_node(ibv_device* dev);
std::string describe(const DeviceLimits& d);

// The computenode's proof, carried in rdma_cm's connect private data: its id and the random
// nonce it sent in its hello over the token-checked control connection. The memnode accepts a
// queue pair only for a (cn_id, nonce) of a computenode that has joined and not left.
inline constexpr uint32_t kConnectMagic = 0x564D4844;  // "DHMV" little-endian
inline constexpr uint16_t kConnectVersion = 1;
inline constexpr size_t kNonceBytes = 16;
struct ConnectRequest {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint32_t cn_id;
  uint32_t reserved2;
  uint8_t nonce[kNonceBytes];
};
static_assert(std::is_trivially_copyable_v<ConnectRequest> && std::is_standard_layout_v<ConnectRequest>);
static_assert(sizeof(ConnectRequest) == 32 && offsetof(ConnectRequest, cn_id) == 8 &&
              offsetof(ConnectRequest, nonce) == 16);
static_assert(sizeof(ConnectRequest) <= 56);  // rdma_cm's connect private data limit (RDMA_PS_TCP)

// The welcome's fabric address for verbs: where the memnode's rdma_cm listener is bound. Its
// IP may differ from the control port's (without a token the control port stays on loopback,
// which no RDMA device routes); a wildcard listener (0.0.0.0) means "the control port's host".
struct ListenAddress {
  uint32_t magic;    // kConnectMagic
  uint16_t port;     // host byte order
  uint16_t reserved;
  uint8_t ipv4[4];   // network byte order; all zero: the control host
};
static_assert(sizeof(ListenAddress) == 12 && offsetof(ListenAddress, port) == 4 &&
              offsetof(ListenAddress, ipv4) == 8);

// Header of every SEND. The receiver knows the sender from the queue pair it arrived on:
// the header carries no address and is not trusted for identity.
inline constexpr uint32_t kMsgMagic = 0x4D564D44;  // "DMVM"
struct MsgHeader {
  uint32_t magic;
  uint16_t from_node;  // memnode id, or 0xffff from a computenode
  uint16_t reserved;
  uint32_t len;        // payload bytes that follow
  uint32_t reserved2;
};
static_assert(sizeof(MsgHeader) == 16 && offsetof(MsgHeader, len) == 8);
inline constexpr size_t kMsgBytes = 4096;  // receive buffer size
static_assert(sizeof(MsgHeader) + kMaxMessage <= kMsgBytes);

// RAII for the handful of verbs objects.
struct Deleters {
  void operator()(ibv_cq* p) const { ibv_destroy_cq(p); }
  void operator()(ibv_mr* p) const { ibv_dereg_mr(p); }
  void operator()(ibv_pd* p) const { ibv_dealloc_pd(p); }
  void operator()(ibv_srq* p) const { ibv_destroy_srq(p); }
  void operator()(ibv_comp_channel* p) const { ibv_destroy_comp_channel(p); }
  void operator()(rdma_event_channel* p) const { rdma_destroy_event_channel(p); }
};
using CqPtr = std::unique_ptr<ibv_cq, Deleters>;
using MrPtr = std::unique_ptr<ibv_mr, Deleters>;
using SrqPtr = std::unique_ptr<ibv_srq, Deleters>;
using ChannelPtr = std::unique_ptr<ibv_comp_channel, Deleters>;
using EventChannelPtr = std::unique_ptr<rdma_event_channel, Deleters>;
using PdPtr = std::shared_ptr<ibv_pd>;
PdPtr alloc_pd(ibv_context* ctx);

/// An rdma_cm id with its queue pair (destroyed in the right order).
struct CmId {
  rdma_cm_id* id = nullptr;
  CmId() = default;
  explicit CmId(rdma_cm_id* i) : id(i) {}
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;
  CmId(CmId&& o) noexcept : id(o.id) { o.id = nullptr; }
  CmId& operator=(CmId&& o) noexcept;
  ~CmId() { reset(); }
  void reset();
};

/// "a.b.c.d:port" → sockaddr, resolving host names; throws naming `what`.
sockaddr_storage resolve(const std::string& host, uint16_t port, const std::string& what);
std::string wc_status(ibv_wc_status s);

}  // namespace dmhnsw::fabric::verbs
