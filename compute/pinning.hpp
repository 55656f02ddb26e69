#pragma once
// Worker threads pinned to cores, as SHINE's computenodes pin theirs: a worker that stays on
// one core keeps its caches and its NIC's node-local memory, and is never moved in the middle
// of a batch of in-flight READs. The order of the cores is NUMA- and NIC-aware.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dmhnsw::compute {

/// --pin: auto pins only where the process may run on more cores than it has workers; with
/// no spare core a pinned worker could not move away from the other processes on its core.
enum class PinMode { Auto, On, Off };
PinMode parse_pin(const std::string& text);  // throws std::invalid_argument naming --pin
const char* to_string(PinMode m);

/// One hardware thread as the host describes it (sysfs topology, libnuma).
struct CpuInfo {
  int id, node, package, core;
};

/// The order workers take `cpus` in: those of the NIC's NUMA node first (`nic_node` >= 0), then
/// the other nodes nearest first (`distance(nic_node, node)`, libnuma's: 10 for itself); within a
/// node one hardware thread of every physical core before any core's second.
std::vector<int> order_cores(const std::vector<CpuInfo>& cpus, int nic_node,
                             const std::function<int(int, int)>& distance);

/// The cores this process may run on (its affinity mask), in order_cores' order over this host's
/// topology.
std::vector<int> core_order(int nic_node);

/// Process-wide, once the cluster is known (computenode --pin, Cluster::nic_numa_node(),
/// --cn-id).
void configure_pinning(PinMode mode, int nic_node, uint32_t cn_id = 0);

/// Pins the calling thread, worker `index` of `workers`, to core `cn_id x workers + index` of the
/// order (modulo its length): the computenodes of one run sharing a host take distinct cores
/// while there are enough. Returns that core, or -1 when it does not pin (off, or auto without a spare
/// core) or the kernel refused (logged once).
int pin_worker(uint32_t index, uint32_t workers);

/// For reports: {"mode", "nic_numa_node", "cores" (the order), "pinned" (cores workers were
/// pinned to so far, ascending)}.
nlohmann::json pinning_json();

}  // namespace dmhnsw::compute
