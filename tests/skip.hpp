#pragma once
// A test case whose precondition is missing on this machine (no QEMU, no hugepages, no network
// namespaces, an RDMA device where none is wanted) is skipped, not passed: DMHNSW_SKIP(why)
// records the reason (WARN) and returns from the test case, and the shared main
// (tests/catch_main.cpp) exits kSkipExitCode when every case it ran was skipped, which ctest
// reports as "Skipped" (dmhnsw_test sets SKIP_RETURN_CODE). tools/test.sh counts the skips and
// fails when there are any, unless DMHNSW_ALLOW_SKIPS=1.
#include <catch2/catch.hpp>

#include <set>
#include <sstream>
#include <string>

namespace dmhnsw::testing {

inline constexpr int kSkipExitCode = 77;

/// Names of the test cases that skipped themselves in this process.
inline std::set<std::string>& skipped_cases() {
  static std::set<std::string> s;
  return s;
}

}  // namespace dmhnsw::testing

#define DMHNSW_SKIP(why)                                                                             \
  do {                                                                                               \
    std::ostringstream dmhnsw_skip_why_;                                                             \
    dmhnsw_skip_why_ << why;                                                                         \
    WARN("SKIPPED: " << dmhnsw_skip_why_.str());                                                     \
    ::dmhnsw::testing::skipped_cases().insert(Catch::getResultCapture().getCurrentTestName());       \
    return;                                                                                          \
  } while (false)
