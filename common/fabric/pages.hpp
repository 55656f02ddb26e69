#pragma once
// The pages behind registered memory. A NIC translates every registered page through its
// own table and cache, and a CPU that reads a mapped region in place through its TLB: fewer,
// larger pages help both. Memnodes' regions and computenodes' buffer pools use 2 MiB
// hugepages where the host has them reserved, transparent hugepages otherwise.
#include <cstdint>
#include <string>

namespace dmhnsw::fabric {

/// Bytes of 2 MiB hugepages this host has reserved and not handed out (HugePages_Free x
/// Hugepagesize in /proc/meminfo; 0 when it has none or says nothing).
uint64_t free_hugepage_bytes();

/// What the buffer pools of this process's endpoints are mapped on.
enum class PoolPages {
  Auto,    // reserved hugepages when enough are free, else normal pages advised for transparent ones
  Huge,    // reserved hugepages; normal pages with a warning when there are not enough
  Normal,  // normal pages, no advice
};
/// Process-wide; endpoints made afterwards follow it (computenode --hugepages / --no-hugepages).
void set_pool_pages(PoolPages p);
PoolPages pool_pages();
const char* to_string(PoolPages p);
/// Buffer pools this process has mapped so far, on reserved hugepages and on normal pages.
struct PoolCounts {
  uint64_t hugepages = 0, normal = 0;
};
PoolCounts pool_counts();
void count_pool(bool on_hugepages);  // BufferPool's constructor

}  // namespace dmhnsw::fabric
