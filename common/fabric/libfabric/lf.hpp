#pragma once
// Internal to common/fabric: RAII wrappers over libfabric objects. Only files in this
// folder include it; nothing outside common/fabric names a libfabric type.
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric::lf {

/// Throws FabricError "<what>: <fi_strerror>" when rc < 0.
void check(ssize_t rc, const std::string& what);

/// Closes any fid on destruction.
struct FidCloser {
  void operator()(fid* f) const;
};
template <class T>
struct FidPtr {
  T* p = nullptr;
  FidPtr() = default;
  FidPtr(const FidPtr&) = delete;
  FidPtr& operator=(const FidPtr&) = delete;
  ~FidPtr() { reset(); }
  void reset() {
    if (p != nullptr) FidCloser{}(&p->fid);
    p = nullptr;
  }
  T* get() const { return p; }
  T** out() { return &p; }
};

/// Fabric + domain for one provider, with the memory-registration mode it asked for.
class Domain {
 public:
  /// Opens the provider (shm or tcp). `src_host` (may be empty) picks the local interface (tcp).
  /// `rma_events`: ask for FI_RMA_EVENT (a counter of one-sided operations served here;
  /// falls back silently when the provider lacks it — see has_rma_events()).
  /// `source`: ask for FI_SOURCE, so a receive completion names its sender's AV entry (a
  /// memnode tells members from strangers by it); required when asked.
  static std::shared_ptr<Domain> open(Provider p, const std::string& src_host, bool rma_events = false,
                                      bool source = false);
  bool has_rma_events() const { return (info_->caps & FI_RMA_EVENT) != 0; }
  ~Domain();

  Provider provider() const { return provider_; }
  fi_info* info() const { return info_; }
  fid_domain* domain() const { return domain_.get(); }
  bool mr_local() const { return (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0; }
  bool mr_virt_addr() const { return (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0; }
  bool mr_prov_key() const { return (info_->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0; }
  bool mr_endpoint() const { return (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0; }
  std::string describe() const;  // "provider tcp;ofi_rxm, mr_mode 0x0, ..."
  /// A requested key not used before in this domain (local buffers; keys must be unique
  /// per domain when the provider does not pick them).
  uint64_t next_local_key() { return kLocalKeyBase + next_key_.fetch_add(1); }
  static constexpr uint64_t kLocalKeyBase = 0x1000'0000;

 private:
  Provider provider_ = Provider::Shm;
  fi_info* info_ = nullptr;
  std::atomic<uint64_t> next_key_{0};
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
};

/// A registered memory region (RAII).
class MemoryRegion {
 public:
  MemoryRegion(const std::shared_ptr<Domain>& d, void* base, size_t len, uint64_t access, uint64_t requested_key);
  void bind(fid_ep* ep);  // for FI_MR_ENDPOINT providers; no-op otherwise
  void* desc() const;
  uint64_t key() const;
  /// The address a peer puts in fi_rma_iov for byte 0 of this region.
  uint64_t remote_base() const;

 private:
  std::shared_ptr<Domain> d_;
  void* base_;
  uint64_t requested_key_;
  FidPtr<fid_mr> mr_;
};

/// Endpoint + completion queue + address vector (RAII).
class RawEndpoint {
 public:
  /// `waitable_cq`: the CQ gets a wait object (fi_cq_sread). With a domain that has RMA
  /// events, a counter of remote READ/WRITE/atomics served by this endpoint is bound too.
  RawEndpoint(const std::shared_ptr<Domain>& d, bool waitable_cq);
  /// Remote operations served so far (0 when the provider has no RMA events).
  uint64_t remote_ops() const;
  bool counts_remote_ops() const { return cntr_.get() != nullptr; }
  fid_ep* ep() const { return ep_.get(); }
  fid_cq* cq() const { return cq_.get(); }
  std::vector<char> name() const;
  fi_addr_t insert(const std::vector<char>& addr);
  /// Removes an address inserted before (rxm also closes its connection to that peer);
  /// returns the provider's code, 0 on success.
  int remove(fi_addr_t a);
  const std::shared_ptr<Domain>& domain() const { return d_; }
  /// Closes the endpoint, then its counter, CQ and AV. An owner whose receive buffers or
  /// memory registrations are destroyed before this object calls it first: a provider may
  /// still deliver into a posted buffer while the endpoint is open (rxm over tcp did,
  /// into freed memory, when a message arrived during a computenode's exit).
  void close() {
    ep_.reset();
    cntr_.reset();
    cq_.reset();
    av_.reset();
  }

 private:
  std::shared_ptr<Domain> d_;
  FidPtr<fid_av> av_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_cntr> cntr_;
  FidPtr<fid_ep> ep_;
};

/// Header of every SEND/RECV message on the fabric.
/// A computenode's message carries its endpoint's fabric address (addr_len bytes right after
/// the header) so the memnode can answer that very endpoint; then `len` payload bytes.
struct WireMsgHeader {
  uint32_t magic;
  uint16_t from_node;  // memnode id, or 0xffff from a computenode
  uint16_t addr_len;
  uint32_t from_cn;
  uint32_t len;
};
static_assert(sizeof(WireMsgHeader) == 16);
inline constexpr uint32_t kWireMsgMagic = 0x4D57'4D44;  // "DMWM"
inline constexpr size_t kMaxAddrBytes = 128;
inline constexpr size_t kWireMsgBytes = sizeof(WireMsgHeader) + kMaxAddrBytes + kMaxMessage;
static_assert(kWireMsgBytes == 4096);

}  // namespace dmhnsw::fabric::lf
