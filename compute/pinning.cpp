#include "compute/pinning.hpp"

#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>

namespace dmhnsw::compute {

namespace {

struct State {
  std::mutex mu;
  PinMode mode = PinMode::Auto;
  int nic_node = -1;
  uint32_t cn_id = 0;
  std::vector<int> order;
  bool configured = false;
  std::set<int> pinned;
};

State& state() {
  static State s;
  return s;
}

int read_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v = fallback;
  if (!(in >> v)) return fallback;
  return v;
}

}  // namespace

PinMode parse_pin(const std::string& text) {
  if (text == "auto") return PinMode::Auto;
  if (text == "on") return PinMode::On;
  if (text == "off") return PinMode::Off;
  throw std::invalid_argument("--pin '" + text + "': want auto, on or off");
}

const char* to_string(PinMode m) {
  switch (m) {
    case PinMode::Auto: return "auto";
    case PinMode::On: return "on";
    case PinMode::Off: return "off";
  }
  return "?";
}

std::vector<int> order_cores(const std::vector<CpuInfo>& cpus, int nic_node,
                             const std::function<int(int, int)>& distance) {
  // A node's rank: the NIC's node first, then by distance from it.
  auto node_rank = [&](int node) {
    if (nic_node < 0 || node == nic_node) return std::make_tuple(0, node);
    return std::make_tuple(std::max(distance(nic_node, node), 1), node);
  };
  // Within a node: the first hardware thread of each physical core, then the second, ...
  std::map<std::tuple<int, int>, int> seen;  // (package, core) -> hardware threads so far
  std::vector<std::tuple<std::tuple<int, int>, int, int>> keyed;  // (node rank, sibling index, cpu)
  for (const CpuInfo& c : cpus) {
    const int sibling = seen[{c.package, c.core}]++;
    keyed.emplace_back(node_rank(c.node), sibling, c.id);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> out;
  out.reserve(keyed.size());
  for (const auto& k : keyed) out.push_back(std::get<2>(k));
  return out;
}

std::vector<int> core_order(int nic_node) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  const bool numa = numa_available() >= 0;
  std::vector<CpuInfo> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    const int node = numa ? std::max(numa_node_of_cpu(c), 0) : 0;
    cpus.push_back({c, node, read_int(topo + "physical_package_id", 0), read_int(topo + "core_id", c)});
  }
  return order_cores(cpus, numa ? nic_node : -1, [](int a, int b) { return numa_distance(a, b); });
}

void configure_pinning(PinMode mode, int nic_node, uint32_t cn_id) {
  State& s = state();
  std::lock_guard g(s.mu);
  s.mode = mode;
  s.nic_node = nic_node;
  s.cn_id = cn_id;
  s.order = core_order(nic_node);
  s.configured = true;
  s.pinned.clear();
}

int pin_worker(uint32_t index, uint32_t workers) {
  State& s = state();
  int core = -1;
  {
    std::lock_guard g(s.mu);
    if (!s.configured) {  // a process that never configured (tests, tools): auto, no NIC
      s.order = core_order(-1);
      s.configured = true;
    }
    if (s.mode == PinMode::Off || s.order.empty()) return -1;
    if (s.mode == PinMode::Auto && s.order.size() <= workers) return -1;
    core = s.order[(static_cast<uint64_t>(s.cn_id) * workers + index) % s.order.size()];
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(core, &one);
  if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof one, &one); rc != 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) spdlog::warn("--pin: cannot pin a worker to core {}: {}", core, std::strerror(rc));
    return -1;
  }
  std::lock_guard g(s.mu);
  s.pinned.insert(core);
  return core;
}

nlohmann::json pinning_json() {
  State& s = state();
  std::lock_guard g(s.mu);
  return {{"mode", to_string(s.mode)},
          {"nic_numa_node", s.nic_node},
          {"cores", s.configured ? s.order : core_order(s.nic_node)},
          {"pinned", std::vector<int>(s.pinned.begin(), s.pinned.end())}};
}

}  // namespace dmhnsw::compute
