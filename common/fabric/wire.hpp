#pragma once
// A wire model around any provider: each one-sided operation completes no sooner than its
// post time plus the link's latency plus its bytes over the link's bandwidth, the bandwidth
// shared by one computenode's operations to one memnode (a FIFO link per memnode). A worker
// polling while nothing is ready sleeps until the next completion is due, so waiting costs wire
// time and not CPU, as with an RDMA NIC or CXL memory. The real operation still runs on the
// provider underneath (answers do not change); only when its completion is handed out does.
//
// Presets (docs/wire-model.md says where each number comes from): rdma-100g, rdma-56g, cxl.
#include <chrono>
#include <memory>
#include <string>

#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric {

struct WireModel {
  double latency_us = 0;     // per operation, added after its bytes are on the wire
  double gbytes_per_s = 0;   // link bandwidth per (computenode, memnode); 0: unlimited
  std::string name = "none";
  bool enabled() const { return latency_us > 0 || gbytes_per_s > 0; }
  /// Time on the wire of `bytes` (0 when the bandwidth is unlimited).
  std::chrono::nanoseconds transfer(size_t bytes) const;
};

/// none | cxl | rdma-56g | rdma-100g | LAT_US,GBPS (e.g. 2,12.5). Throws std::invalid_argument
/// naming --wire.
WireModel parse_wire(const std::string& text);
/// "rdma-100g (2 us, 12.5 GB/s)" or "none".
std::string describe(const WireModel& m);

/// `inner` with the model applied to every endpoint it makes (its endpoints share the links).
std::shared_ptr<Cluster> with_wire(std::shared_ptr<Cluster> inner, const WireModel& m);

}  // namespace dmhnsw::fabric
