#include "common/fabric/libfabric/lf.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

namespace dmhnsw::fabric::lf {

void check(ssize_t rc, const std::string& what) {
  if (rc < 0) throw FabricError(what + ": " + fi_strerror(static_cast<int>(-rc)) + " (" + std::to_string(rc) + ")");
}

void FidCloser::operator()(fid* f) const {
  if (f != nullptr) fi_close(f);
}

namespace {
const char* lf_provider_name(Provider p) {
  switch (p) {
    case Provider::Shm: return "shm";
    case Provider::Tcp: return "tcp;ofi_rxm";
    case Provider::Verbs: break;  // rdma-core directly: verbs.hpp
    case Provider::Local: break;
    case Provider::Cxl: break;  // shared memory mapped directly: cxl.hpp
  }
  throw FabricError(std::string("the ") + provider_name(p) + " provider has no libfabric domain");
}
}  // namespace

namespace {
// libfabric's shm provider names its shared-memory regions /dev/shm/<pid>:<n>:<m>. A process
// that was killed leaves them behind, and a later process that gets the same pid then fails to
// open its endpoints (EBUSY), or crashes on a truncated one. Files named after our own pid can
// only be such leftovers: remove them before the first shm endpoint exists.
void remove_stale_shm_regions() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string prefix = std::to_string(::getpid()) + ":";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) == 0) {
        std::filesystem::remove(e.path(), ec);
        spdlog::debug("removed {}, left by an earlier process with this pid", e.path().string());
      }
    }
  });
}
}  // namespace

std::shared_ptr<Domain> Domain::open(Provider p, const std::string& src_host, bool rma_events, bool source) {
  if (p == Provider::Shm) remove_stale_shm_regions();
  auto d = std::shared_ptr<Domain>(new Domain());
  d->provider_ = p;
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) throw FabricError("fi_allocinfo failed");
  hints->caps = FI_MSG | FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  if (source) hints->caps |= FI_SOURCE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(lf_provider_name(p));
  const char* node = (p != Provider::Shm && !src_host.empty() && src_host != "0.0.0.0") ? src_host.c_str() : nullptr;
  int rc = -FI_ENODATA;
  if (rma_events) {
    hints->caps |= FI_RMA_EVENT;
    rc = fi_getinfo(FI_VERSION(1, 11), node, nullptr, node != nullptr ? FI_SOURCE : 0, hints, &d->info_);
    hints->caps &= ~FI_RMA_EVENT;
  }
  if (rc != 0) rc = fi_getinfo(FI_VERSION(1, 11), node, nullptr, node != nullptr ? FI_SOURCE : 0, hints, &d->info_);
  fi_freeinfo(hints);
  if (rc != 0 || d->info_ == nullptr) {
    std::string why = fi_strerror(-rc);
    throw FabricError(std::string("--provider ") + provider_name(p) + ": libfabric provider '" + lf_provider_name(p) +
                      "' unavailable" + (node ? std::string(" on ") + node : std::string()) + ": " + why);
  }
  check(fi_fabric(d->info_->fabric_attr, d->fabric_.out(), nullptr), "fi_fabric");
  check(fi_domain(d->fabric_.get(), d->info_, d->domain_.out(), nullptr), "fi_domain");
  return d;
}

Domain::~Domain() {
  domain_.reset();
  fabric_.reset();
  if (info_ != nullptr) fi_freeinfo(info_);
}

std::string Domain::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "provider %s, fabric %s, domain %s, mr_mode 0x%x", info_->fabric_attr->prov_name,
                info_->fabric_attr->name, info_->domain_attr->name, info_->domain_attr->mr_mode);
  return buf;
}

MemoryRegion::MemoryRegion(const std::shared_ptr<Domain>& d, void* base, size_t len, uint64_t access,
                           uint64_t requested_key)
    : d_(d), base_(base), requested_key_(requested_key) {
  check(fi_mr_reg(d->domain(), base, len, access, 0, requested_key, 0, mr_.out(), nullptr),
        "fi_mr_reg of " + std::to_string(len) + " bytes");
}

void MemoryRegion::bind(fid_ep* ep) {
  if (!d_->mr_endpoint()) return;
  check(fi_mr_bind(mr_.get(), &ep->fid, 0), "fi_mr_bind");
  check(fi_mr_enable(mr_.get()), "fi_mr_enable");
}

void* MemoryRegion::desc() const { return fi_mr_desc(mr_.get()); }
uint64_t MemoryRegion::key() const { return d_->mr_prov_key() ? fi_mr_key(mr_.get()) : requested_key_; }
uint64_t MemoryRegion::remote_base() const { return d_->mr_virt_addr() ? reinterpret_cast<uint64_t>(base_) : 0; }

RawEndpoint::RawEndpoint(const std::shared_ptr<Domain>& d, bool waitable_cq) : d_(d) {
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  check(fi_av_open(d->domain(), &av_attr, av_.out(), nullptr), "fi_av_open");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.size = 4096;
  cq_attr.wait_obj = waitable_cq ? FI_WAIT_UNSPEC : FI_WAIT_NONE;
  check(fi_cq_open(d->domain(), &cq_attr, cq_.out(), nullptr), "fi_cq_open");
  check(fi_endpoint(d->domain(), d->info(), ep_.out(), nullptr), "fi_endpoint");
  check(fi_ep_bind(ep_.get(), &av_.get()->fid, 0), "fi_ep_bind(av)");
  check(fi_ep_bind(ep_.get(), &cq_.get()->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  if (d->has_rma_events()) {
    fi_cntr_attr ca{};
    ca.events = FI_CNTR_EVENTS_COMP;
    ca.wait_obj = FI_WAIT_NONE;
    check(fi_cntr_open(d->domain(), &ca, cntr_.out(), nullptr), "fi_cntr_open");
    check(fi_ep_bind(ep_.get(), &cntr_.get()->fid, FI_REMOTE_READ | FI_REMOTE_WRITE), "fi_ep_bind(cntr)");
  }
  check(fi_enable(ep_.get()), "fi_enable");
}

uint64_t RawEndpoint::remote_ops() const { return cntr_.get() != nullptr ? fi_cntr_read(cntr_.get()) : 0; }

std::vector<char> RawEndpoint::name() const {
  std::vector<char> buf(256);
  size_t len = buf.size();
  int rc = fi_getname(&ep_.get()->fid, buf.data(), &len);
  if (rc == -FI_ETOOSMALL) {
    buf.resize(len);
    rc = fi_getname(&ep_.get()->fid, buf.data(), &len);
  }
  check(rc, "fi_getname");
  buf.resize(len);
  return buf;
}

fi_addr_t RawEndpoint::insert(const std::vector<char>& addr) {
  fi_addr_t out = FI_ADDR_UNSPEC;
  int n = fi_av_insert(av_.get(), addr.data(), 1, &out, 0, nullptr);
  if (n != 1) check(n < 0 ? n : -FI_EINVAL, "fi_av_insert");
  return out;
}

int RawEndpoint::remove(fi_addr_t a) { return fi_av_remove(av_.get(), &a, 1, 0); }

}  // namespace dmhnsw::fabric::lf
