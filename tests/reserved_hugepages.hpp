// Hugepages a test reserves for its life (shared by the tests of common/fabric and the
// integration tests).
#pragma once
#include <fstream>

namespace dmhnsw::test {

/// Reserves `pages` more 2 MiB hugepages (/proc/sys/vm/nr_hugepages) for its life where this
/// process may (root), and puts the count back after, so that the hugepage paths run on any host
/// that allows it. ok(): the kernel reserved them all.
class ReservedHugepages {
 public:
  explicit ReservedHugepages(long pages) {
    long n = 0;
    if (!(std::ifstream(kPath) >> n)) return;
    std::ofstream out(kPath);
    if (!(out << n + pages << std::flush)) return;
    before_ = n;
    long now = 0;
    ok_ = static_cast<bool>(std::ifstream(kPath) >> now) && now >= n + pages;  // fewer when memory is fragmented
  }
  ~ReservedHugepages() {
    if (before_ >= 0) std::ofstream(kPath) << before_;
  }
  ReservedHugepages(const ReservedHugepages&) = delete;
  ReservedHugepages& operator=(const ReservedHugepages&) = delete;
  bool ok() const { return ok_; }

 private:
  static constexpr const char* kPath = "/proc/sys/vm/nr_hugepages";
  long before_ = -1;
  bool ok_ = false;
};

}  // namespace dmhnsw::test
