// RegionServer: the memory side of the transport, forwarded to the provider's backend.
#include <stdexcept>

#include "common/fabric/region_backend.hpp"

namespace dmhnsw::fabric {

RegionServer::RegionServer(Provider p, const std::string& listen_host, char* region, uint64_t size,
                           uint16_t memnode_id, unsigned rma_lanes, int region_fd) {
  if (rma_lanes > kMaxRmaLanes)
    throw std::invalid_argument("--rma-lanes " + std::to_string(rma_lanes) + ": at most " +
                                std::to_string(kMaxRmaLanes));
  impl_ = make_region_backend(p, listen_host, region, size, memnode_id, rma_lanes, region_fd);
}

RegionServer::~RegionServer() = default;

std::vector<char> RegionServer::fabric_address() const { return impl_->fabric_address(); }
std::vector<std::vector<char>> RegionServer::rma_lane_addresses() const { return impl_->rma_lane_addresses(); }
uint64_t RegionServer::remote_base() const { return impl_->remote_base(); }
uint64_t RegionServer::key() const { return impl_->key(); }
uint64_t RegionServer::client_key(uint32_t cn_id, const std::vector<char>& addr) {
  return impl_->client_key(cn_id, addr);
}
std::string RegionServer::describe() const { return impl_->describe(); }
void RegionServer::add_client(uint32_t cn_id, const std::vector<char>& addr) { impl_->add_client(cn_id, addr); }
void RegionServer::remove_client(uint32_t cn_id) { impl_->remove_client(cn_id); }
void RegionServer::add_client_address(uint32_t cn_id, const std::vector<char>& addr) {
  impl_->add_client_address(cn_id, addr);
}
void RegionServer::remove_client_address(uint32_t cn_id, const std::vector<char>& addr) {
  impl_->remove_client_address(cn_id, addr);
}
void RegionServer::set_handler(Handler h) { impl_->set_handler(std::move(h)); }
void RegionServer::send_to(uint64_t sender, const void* data, size_t len) { impl_->send_to(sender, data, len); }
void RegionServer::set_tick(std::function<void()> tick, int period_ms) { impl_->set_tick(std::move(tick), period_ms); }
void RegionServer::run(const std::atomic<bool>& stop) { impl_->run(stop); }
RegionServer::Stats RegionServer::stats() const { return impl_->stats(); }
double RegionServer::progress_stalled_seconds() const { return impl_->progress_stalled_seconds(); }

}  // namespace dmhnsw::fabric
