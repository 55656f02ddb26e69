#include "memory/health.hpp"

#include <httplib.h>

#include <stdexcept>

#include "common/fabric/bootstrap.hpp"

namespace dmhnsw::memory {

HealthServer::HealthServer(const std::string& listen, std::function<bool()> live)
    : live_(std::move(live)), http_(std::make_unique<httplib::Server>()) {
  auto [host, port] = fabric::parse_host_port(listen, "--health-listen");
  http_->Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = ready_.load();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ready\n" : "starting: the region is not registered yet\n", "text/plain");
  });
  http_->Get("/live", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = live_();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "live\n" : "the fabric progress thread is stuck\n", "text/plain");
  });
  port_ = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0)
    throw std::runtime_error("--health-listen " + listen + ": cannot bind (in use, or not an address of this host)");
  thread_ = std::thread([this] { http_->listen_after_bind(); });
}

HealthServer::~HealthServer() {
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dmhnsw::memory
