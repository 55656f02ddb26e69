#include "compute/memnode_cpu.hpp"

#include <spdlog/spdlog.h>

#include <cmath>

#include "memory/admin.hpp"

namespace dmhnsw::compute {

MemnodeCpuMeter::MemnodeCpuMeter(fabric::Cluster& cluster)
    : cluster_(cluster), ep_(cluster.make_endpoint(1u << 20)), t0_(std::chrono::steady_clock::now()) {
  start_ = read();
}

std::vector<double> MemnodeCpuMeter::read() {
  std::vector<double> out;
  for (const auto& mn : cluster_.memnodes()) {
    double s = NAN;
    try {
      if (cluster_.alive(mn.id)) s = admin::cpu_seconds(admin::query_stats(*ep_, mn.id, 2000));
    } catch (const std::exception& e) {
      spdlog::debug("memnode {}: no CPU time: {}", mn.id, e.what());
    }
    out.push_back(s);
  }
  return out;
}

nlohmann::json MemnodeCpuMeter::since_start() {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  auto now = read();
  nlohmann::json secs = nlohmann::json::array();
  for (size_t i = 0; i < now.size(); ++i) {
    if (std::isnan(now[i]) || std::isnan(start_[i]))
      secs.push_back(nullptr);
    else
      secs.push_back(now[i] - start_[i]);
  }
  return {{"seconds", secs}, {"wall_s", wall}};
}

}  // namespace dmhnsw::compute
