// Provider selection (providers.hpp): names, and which provider's code serves each side.
#include "common/fabric/providers.hpp"

#include <iterator>
#include <stdexcept>

#include "common/fabric/cluster.hpp"
#include "common/fabric/region_backend.hpp"
#include "common/fabric/replicas.hpp"

namespace dmhnsw::fabric {

namespace {
// The providers of processes, with what each is for.
struct Known {
  Provider p;
  const char* name;
  const char* about;
};
constexpr Known kKnown[] = {
    {Provider::Shm, "shm", "one host"},
    {Provider::Tcp, "tcp", "any IP network"},
    {Provider::Verbs, "verbs", "RDMA NICs, soft-RoCE"},
    {Provider::Cxl, "cxl", "one host: the memnodes' regions mapped, a shared memory device"},
};
}  // namespace

std::vector<std::string> provider_names() {
  std::vector<std::string> out;
  for (const Known& k : kKnown) out.emplace_back(k.name);
  return out;
}

std::string provider_help() {
  std::string out;
  for (const Known& k : kKnown) out += std::string(out.empty() ? "" : ", ") + k.name + " (" + k.about + ")";
  return out;
}

Provider parse_provider(const std::string& name) {
  std::string expected;
  for (size_t i = 0; i < std::size(kKnown); ++i) {
    if (name == kKnown[i].name) return kKnown[i].p;
    expected += std::string(i == 0 ? "" : i + 1 == std::size(kKnown) ? " or " : ", ") + kKnown[i].name;
  }
  throw FabricError("--provider: unknown provider '" + name + "' (expected " + expected + ")");
}

const char* provider_name(Provider p) {
  for (const Known& k : kKnown)
    if (k.p == p) return k.name;
  return p == Provider::Local ? "local" : "?";
}

namespace {
std::shared_ptr<Cluster> connect_physical(const ClusterOptions& opts) {
  switch (opts.provider) {
    case Provider::Shm:
    case Provider::Tcp: return connect_lf_cluster(opts);
    case Provider::Verbs: return connect_verbs_cluster(opts);
    case Provider::Cxl: return connect_cxl_cluster(opts);
    case Provider::Local: break;
  }
  throw FabricError(std::string("--provider ") + provider_name(opts.provider) +
                    ": not a provider of memnode processes (LocalFabric is built in-process by unit tests)");
}
}  // namespace

std::shared_ptr<Cluster> connect_cluster(const ClusterOptions& opts) {
  auto c = connect_physical(opts);
  // Memnodes started with --replicas R form sets of R copies (ordered by id, then copy).
  const unsigned copies = c->memnodes().empty() ? 1u : c->memnodes().front().copies;
  return with_replicas(std::move(c), copies, opts.cn_id);
}

std::unique_ptr<RegionBackend> make_region_backend(Provider p, const std::string& listen_host, char* region,
                                                   uint64_t size, uint16_t memnode_id, unsigned rma_lanes,
                                                   int region_fd) {
  switch (p) {
    case Provider::Shm:
    case Provider::Tcp: return make_lf_region_server(p, listen_host, region, size, memnode_id, rma_lanes);
    // The NIC serves one-sided operations itself: there are no lanes to spread over.
    case Provider::Verbs: return make_verbs_region_server(listen_host, region, size, memnode_id);
    // Computenodes map the region: no thread here serves their operations.
    case Provider::Cxl: return make_cxl_region_server(size, memnode_id, region_fd);
    case Provider::Local: break;
  }
  throw FabricError(std::string("--provider ") + provider_name(p) + ": a memnode cannot serve it");
}

}  // namespace dmhnsw::fabric
