#pragma once
// `memnode --health-listen HOST:PORT`: a plain HTTP endpoint for probes that hold no cluster
// token (Kubernetes, Slurm scripts, load balancers). It says only whether the memnode is
// ready and live, nothing of the region's contents:
//   GET /ready  200 once the region is allocated, registered and the control port serves; 503 before
//   GET /live   200 while the fabric progress thread comes round; 503 once it has been stuck for 5 s
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace dmhnsw::memory {

class HealthServer {
 public:
  /// Binds HOST:PORT at once (port 0: any free one; throws naming --health-listen when it cannot)
  /// and serves on a thread of its own; `live` tells whether the progress thread comes round.
  HealthServer(const std::string& listen, std::function<bool()> live);
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;
  void set_ready() { ready_.store(true); }
  int port() const { return port_; }

 private:
  std::atomic<bool> ready_{false};
  std::function<bool()> live_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace dmhnsw::memory
