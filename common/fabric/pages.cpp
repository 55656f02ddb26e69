#include "common/fabric/pages.hpp"

#include <atomic>
#include <fstream>

namespace dmhnsw::fabric {

namespace {
constexpr uint64_t kHugePage = 2u << 20;
std::atomic<PoolPages> g_pool_pages{PoolPages::Auto};
std::atomic<uint64_t> g_huge_pools{0}, g_normal_pools{0};
}  // namespace

uint64_t free_hugepage_bytes() {
  std::ifstream in("/proc/meminfo");
  uint64_t free_pages = 0, page_kib = 0;
  for (std::string key; in >> key;) {
    uint64_t v = 0;
    in >> v;
    if (key == "HugePages_Free:") free_pages = v;
    if (key == "Hugepagesize:") page_kib = v;
    in.ignore(1 << 10, '\n');
  }
  return page_kib == kHugePage / 1024 ? free_pages * kHugePage : 0;
}

void set_pool_pages(PoolPages p) { g_pool_pages.store(p); }
PoolPages pool_pages() { return g_pool_pages.load(); }

PoolCounts pool_counts() { return {g_huge_pools.load(), g_normal_pools.load()}; }
void count_pool(bool on_hugepages) { (on_hugepages ? g_huge_pools : g_normal_pools).fetch_add(1); }

const char* to_string(PoolPages p) {
  switch (p) {
    case PoolPages::Auto: return "auto";
    case PoolPages::Huge: return "hugepages";
    case PoolPages::Normal: return "normal";
  }
  return "?";
}

}  // namespace dmhnsw::fabric
