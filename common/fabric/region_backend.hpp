#pragma once
// Internal to common/fabric: the memory side of one provider, behind RegionServer (which
// forwards every call). One implementation per provider folder: libfabric/ (shm, tcp),
// verbs/ (rdma-core) and cxl/; providers.cpp picks it.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/fabric/cluster.hpp"

namespace dmhnsw::fabric {

class RegionBackend {
 public:
  virtual ~RegionBackend() = default;
  virtual std::vector<char> fabric_address() const = 0;
  virtual std::vector<std::vector<char>> rma_lane_addresses() const = 0;
  virtual uint64_t remote_base() const = 0;
  virtual uint64_t key() const = 0;
  /// The key the welcome of the computenode with hello address `addr` carries. Providers that
  /// check keys (tcp) register the region once more for it, under a key of its own, and close
  /// that registration when the address is forgotten (remove_client_address: its control
  /// connection closed), so a computenode that left holds no key that works.
  virtual uint64_t client_key(uint32_t /*cn_id*/, const std::vector<char>& /*addr*/) { return key(); }
  virtual std::string describe() const = 0;
  virtual void add_client(uint32_t cn_id, const std::vector<char>& fabric_addr) = 0;
  virtual void remove_client(uint32_t cn_id) = 0;
  /// Another endpoint of an admitted computenode (registered over its control connection):
  /// messages from it are that computenode's. Providers whose messages come over connections
  /// admitted one by one (verbs, cxl) need nothing here.
  virtual void add_client_address(uint32_t /*cn_id*/, const std::vector<char>& /*fabric_addr*/) {}
  /// That address is no longer computenode `cn_id`'s (its control connection closed).
  virtual void remove_client_address(uint32_t /*cn_id*/, const std::vector<char>& /*fabric_addr*/) {}
  virtual void set_handler(RegionServer::Handler h) = 0;
  virtual void send_to(uint64_t sender, const void* data, size_t len) = 0;
  virtual void set_tick(std::function<void()> tick, int period_ms) = 0;
  virtual void run(const std::atomic<bool>& stop) = 0;
  virtual RegionServer::Stats stats() const = 0;
  virtual double progress_stalled_seconds() const = 0;
};


}  // namespace dmhnsw::fabric
