#pragma once
// Sanitized builds (DMHNSW_SANITIZE): tests/catch_main.cpp collects the sanitizer reports of
// child processes in the directory named by DMHNSW_SANITIZER_REPORTS (through the runtimes'
// log_path) and fails the test on any. gcc links UBSan as a shared runtime of its own beside
// ASan's, and in an ASan+UBSan build that one writes its reports to stderr whatever log_path
// says; so the helpers that capture a child's stderr (proc.hpp, test_util.hpp) pass it here,
// and a UBSan report in it joins the others. Without the variable this does nothing.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

namespace dmhnsw::sanitizer_reports {

/// `output`: what child `what` wrote to stderr (and stdout).
inline void collect_child_output(const std::string& output, const std::string& what) {
  const char* dir = std::getenv("DMHNSW_SANITIZER_REPORTS");
  if (dir == nullptr || output.find("runtime error: ") == std::string::npos) return;
  static std::atomic<int> n{0};
  std::ofstream(std::string(dir) + "/ubsan-" + std::to_string(::getpid()) + "-" + std::to_string(n++))
      << what << " wrote:\n"
      << output;
}

}  // namespace dmhnsw::sanitizer_reports
