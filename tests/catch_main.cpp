// One Catch2 main for every test executable. In a sanitized build (DMHNSW_SANITIZE, see the top
// CMakeLists.txt) it also makes a sanitizer report in a child process fail the test: the
// memnodes, computenodes and tools a test starts inherit ASAN_/UBSAN_/TSAN_OPTIONS with a
// log_path into a directory of this test process's own, which is read after the tests ran.
// (The test process's own reports go to its stderr and fail it by their exit code; a child's
// exit code is not always checked: memnodes are stopped by SIGTERM at the end of a test.)
// log_path goes into UBSAN_OPTIONS too: with ASan and UBSan, gcc's libubsan sets the report
// path from it at start, and that call lands in libasan (the runtimes export the same
// function). UBSan's own reports still go to stderr there: tests/sanitizer_reports.hpp.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "skip.hpp"

#ifdef DMHNSW_SANITIZE
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#endif

namespace {

#ifdef DMHNSW_SANITIZE
/// Sends the sanitizer reports of every descendant process to files in a fresh directory.
class ChildReports {
 public:
  ChildReports() {
    char tmpl[] = "/tmp/dmhnsw-sanitizer-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return;
    }
    dir_ = tmpl;
    ::setenv("DMHNSW_SANITIZER_REPORTS", tmpl, 1);  // tests/sanitizer_reports.hpp adds UBSan's
    // Read by the child's runtime at its start; this process's runtime read them already.
    // The file of a reporting process is log_path.PID.
    for (const char* var : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS"}) {
      const char* old = std::getenv(var);
      std::string v = old != nullptr && *old != '\0' ? std::string(old) + ":" : std::string();
      v += "log_path=" + (dir_ / "report").string();
      ::setenv(var, v.c_str(), 1);
    }
  }
  ChildReports(const ChildReports&) = delete;
  /// Prints every report found; true when there was one. Removes the directory.
  bool check() {
    if (dir_.empty()) return false;
    bool found = false;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(dir_, ec)) {
      std::ifstream in(f.path());
      std::stringstream ss;
      ss << in.rdbuf();
      std::cerr << "\n==== sanitizer report of a child process (" << f.path().filename().string() << ") ====\n"
                << ss.str() << "==== end of report ====\n";
      found = true;
    }
    std::filesystem::remove_all(dir_, ec);
    return found;
  }

 private:
  std::filesystem::path dir_;
};
#endif

/// Counts the test cases that ran, so that a process whose every case skipped itself exits
/// kSkipExitCode (tests/skip.hpp).
struct CaseCounter : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  static inline int started = 0;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    ++started;
    TestEventListenerBase::testCaseStarting(info);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(CaseCounter)

int main(int argc, char* argv[]) {
#ifdef DMHNSW_SANITIZE
  ChildReports children;
#endif
  int rc = Catch::Session().run(argc, argv);
#ifdef DMHNSW_SANITIZE
  if (children.check()) {
    std::cerr << "FAILED: a child process reported a sanitizer error (" DMHNSW_SANITIZE ")\n";
    if (rc == 0) rc = 1;
  }
#endif
  const auto skipped = static_cast<int>(dmhnsw::testing::skipped_cases().size());
  if (rc == 0 && skipped > 0) {
    std::fprintf(stderr, "%d of %d test case(s) skipped: their precondition is missing on this machine\n", skipped,
                 CaseCounter::started);
    if (skipped == CaseCounter::started) return dmhnsw::testing::kSkipExitCode;
  }
  return rc;
}
