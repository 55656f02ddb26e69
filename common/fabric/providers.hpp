#pragma once
// Provider selection: the one unit (with providers.cpp) that knows every provider. Each
// provider lives in its own folder (libfabric/ for shm and tcp, verbs/, cxl/, local/) and is
// reached only through the factories below. A new provider adds its folder, a value and a name
// here and its lines in providers.cpp; nothing else in the transport or above it changes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dmhnsw::fabric {

enum class Provider : uint8_t { Shm = 1, Tcp = 2, Verbs = 3, Local = 4, Cxl = 5 };
Provider parse_provider(const std::string& name);  // "shm" | "tcp" | "verbs" | "cxl"; throws naming --provider
const char* provider_name(Provider p);             // "shm", "tcp", "verbs", "cxl", "local"
/// The providers memnode and computenode processes take (--provider's choices), and the same
/// with what each is for ("shm (one host), tcp (any IP network), ...", --provider's help).
std::vector<std::string> provider_names();
std::string provider_help();

class Cluster;
struct ClusterOptions;
class RegionBackend;

// The compute side of each real provider (connect_cluster picks one): connects to every memnode.
std::shared_ptr<Cluster> connect_lf_cluster(const ClusterOptions& opts);     // libfabric/: shm, tcp
std::shared_ptr<Cluster> connect_verbs_cluster(const ClusterOptions& opts);  // verbs/
std::shared_ptr<Cluster> connect_cxl_cluster(const ClusterOptions& opts);    // cxl/: maps the regions

// The memory side of each (make_region_backend picks one; RegionServer forwards to it).
std::unique_ptr<RegionBackend> make_lf_region_server(Provider p, const std::string& listen_host, char* region,
                                                     uint64_t size, uint16_t memnode_id, unsigned rma_lanes);
std::unique_ptr<RegionBackend> make_verbs_region_server(const std::string& listen_host, char* region, uint64_t size,
                                                        uint16_t memnode_id);
std::unique_ptr<RegionBackend> make_cxl_region_server(uint64_t size, uint16_t memnode_id, int region_fd);
/// The backend of provider `p` (RegionServer's constructor).
std::unique_ptr<RegionBackend> make_region_backend(Provider p, const std::string& listen_host, char* region,
                                                   uint64_t size, uint16_t memnode_id, unsigned rma_lanes,
                                                   int region_fd);

}  // namespace dmhnsw::fabric
