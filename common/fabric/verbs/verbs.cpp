// rdma-core helpers shared by both sides of the verbs provider.
#include "common/fabric/verbs/verbs.hpp"

#include <netdb.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace dmhnsw::fabric::verbs {

void require_device() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  const int err = errno;
  if (list != nullptr) ibv_free_device_list(list);
  if (n > 0) return;
  throw FabricError(std::string("--provider verbs: no RDMA device found (ibv_get_device_list: ") +
                    (list == nullptr ? std::strerror(err) : "none listed") +
                    "; no RDMA NIC and no soft-RoCE link). Load soft-RoCE (modprobe rdma_rxe; rdma link add rxe0 "
                    "type rxe netdev IFACE) or run with --provider shm (all processes on one host) or --provider "
                    "tcp (across hosts).");
}

void fail_errno(const std::string& what) {
  const int err = errno;
  throw FabricError(what + ": " + std::strerror(err));
}

DeviceLimits query_device(ibv_context* ctx) {
  ibv_device_attr a{};
  if (ibv_query_device(ctx, &a) != 0) fail_errno("ibv_query_device");
  DeviceLimits d;
  d.name = ibv_get_device_name(ctx->device);
  d.max_cqe = a.max_cqe;
  d.max_qp_wr = a.max_qp_wr;
  d.max_qp_rd_atom = a.max_qp_rd_atom;
  d.max_qp_init_rd_atom = a.max_qp_init_rd_atom;
  d.max_srq_wr = a.max_srq_wr;
  d.atomics = a.atomic_cap != IBV_ATOMIC_NONE;
  return d;
}

int device_numa_node(ibv_device* dev) {
  std::ifstream in(std::string(dev->ibdev_path) + "/device/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

std::string describe(const DeviceLimits& d) {
  return "rdma-core verbs on " + d.name + " (max_cqe " + std::to_string(d.max_cqe) + ", max_qp_wr " +
         std::to_string(d.max_qp_wr) + ", rd_atom " + std::to_string(d.max_qp_rd_atom) + "/" +
         std::to_string(d.max_qp_init_rd_atom) + ", atomics " + (d.atomics ? "yes" : "no") + ")";
}

PdPtr alloc_pd(ibv_context* ctx) {
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) fail_errno("ibv_alloc_pd");
  return PdPtr(pd, Deleters{});
}

CmId& CmId::operator=(CmId&& o) noexcept {
  if (this != &o) {
    reset();
    id = o.id;
    o.id = nullptr;
  }
  return *this;
}

void CmId::reset() {
  if (id == nullptr) return;
  if (id->qp != nullptr) rdma_destroy_qp(id);
  rdma_destroy_id(id);
  id = nullptr;
}

sockaddr_storage resolve(const std::string& host, uint16_t port, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string h = host.empty() ? "0.0.0.0" : host;
  int rc = getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) throw FabricError(what + ": cannot resolve '" + h + "': " + gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return ss;
}

std::string wc_status(ibv_wc_status s) { return ibv_wc_status_str(s); }

}  // namespace dmhnsw::fabric::verbs
