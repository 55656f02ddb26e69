#pragma once
// Resource accounting for reports. The memnodes' process CPU time over a run: with RDMA NICs
// (verbs) or cxl the memory side serves one-sided operations without its CPU; with libfabric
// shm and tcp its progress thread serves them. Asked with admin StatsRequests on an endpoint
// of its own. And this process's memory, split so that a cxl mapping of a memnode's region
// (shared pages, RssShmem) is not mistaken for the computenode's own memory (RssAnon).
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

/// {"peak_rss_mib", "rss_mib", "anon_mib", "file_mib", "shmem_mib", "hugetlb_mib"} of this
/// process from /proc/self/status (VmHWM, VmRSS, RssAnon, RssFile, RssShmem, HugetlbPages: a
/// mapping on hugetlbfs counts in none of the others); fields it lacks are null.
nlohmann::json process_memory();

class MemnodeCpuMeter {
 public:
  /// Reads every memnode's CPU time now (the start of the run).
  explicit MemnodeCpuMeter(fabric::Cluster& cluster);
  /// {"seconds": [per memnode CPU s since the start], "wall_s": s since the start}; memnodes
  /// that do not answer (dead) get null.
  nlohmann::json since_start();

 private:
  std::vector<double> read();
  fabric::Cluster& cluster_;
  std::unique_ptr<fabric::Endpoint> ep_;
  std::vector<double> start_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace dmhnsw::compute
