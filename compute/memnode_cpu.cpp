#include "compute/memnode_cpu.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "memory/admin.hpp"

namespace dmhnsw::compute {

nlohmann::json process_memory() {
  static constexpr std::pair<const char*, const char*> kFields[] = {
      {"VmHWM:", "peak_rss_mib"}, {"VmRSS:", "rss_mib"}, {"RssAnon:", "anon_mib"},
      {"RssFile:", "file_mib"}, {"RssShmem:", "shmem_mib"}, {"HugetlbPages:", "hugetlb_mib"}};
  nlohmann::json out;
  for (const auto& f : kFields) out[f.second] = nullptr;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    for (const auto& f : kFields) {
      if (line.rfind(f.first, 0) != 0) continue;
      std::istringstream v(line.substr(std::char_traits<char>::length(f.first)));
      double kib = 0;
      if (v >> kib) out[f.second] = kib / 1024.0;  // the kernel prints kB
    }
  }
  return out;
}

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
