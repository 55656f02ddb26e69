// Buffer pools' pages: hugepages where the host has them reserved, normal pages otherwise.
#include <catch2/catch.hpp>

#include "../skip.hpp"

#include <sys/mman.h>

#include <cstring>

#include "common/fabric/pages.hpp"
#include "common/fabric/transport.hpp"
#include "memory/region_memory.hpp"
#include "../reserved_hugepages.hpp"

using namespace dmhnsw;
using namespace dmhnsw::fabric;

namespace {
struct RestorePages {
  PoolPages saved = pool_pages();
  ~RestorePages() { set_pool_pages(saved); }
};

// A pool hands out writable, disjoint buffers whatever its pages are.
void check_usable(BufferPool& pool) {
  Buffer a = pool.alloc(1u << 20), b = pool.alloc(100);
  REQUIRE(pool.contains(a.data(), 1u << 20));
  REQUIRE(pool.contains(b.data(), 100));
  std::memset(a.data(), 0xab, 1u << 20);
  std::memset(b.data(), 0xcd, 100);
  CHECK(static_cast<unsigned char>(a.data()[(1u << 20) - 1]) == 0xab);
  CHECK(static_cast<unsigned char>(b.data()[0]) == 0xcd);
}
}  // namespace

TEST_CASE("buffer pools: normal pages when asked, hugepages when asked and reserved, else normal ones", "[pages]") {
  RestorePages restore;
  const uint64_t free_huge = free_hugepage_bytes();
  INFO("free hugepages on this host: " << free_huge << " bytes");
  CHECK(free_huge % (2u << 20) == 0);

  set_pool_pages(PoolPages::Normal);
  PoolCounts before = pool_counts();
  {
    BufferPool pool(8u << 20);
    CHECK_FALSE(pool.on_hugepages());
    CHECK(pool_counts().normal == before.normal + 1);
    check_usable(pool);
  }
  // Asked for: on hugepages exactly when enough are free, else normal pages (a warning), still usable.
  set_pool_pages(PoolPages::Huge);
  before = pool_counts();
  {
    BufferPool pool((4u << 20) + 5);  // not a multiple of 2 MiB: the mapping is rounded up, the arena is not
    CHECK(pool.arena_bytes() == (4u << 20) + 5);
    CHECK(pool.on_hugepages() == (free_huge >= (6u << 20)));
    CHECK(pool_counts().hugepages + pool_counts().normal == before.hugepages + before.normal + 1);
    check_usable(pool);
  }
  // By default: hugepages only when enough are free; a pool larger than every reserved page is
  // on normal pages, without failing.
  set_pool_pages(PoolPages::Auto);
  {
    BufferPool pool(free_huge + (64u << 20));
    CHECK_FALSE(pool.on_hugepages());
    check_usable(pool);
  }
  CHECK(std::string(to_string(PoolPages::Auto)) == "auto");
}

TEST_CASE("hugepages the test reserves: pools and memnode regions (private and shared) take them, else normal pages",
          "[pages]") {
  constexpr uint64_t kMiB = 1u << 20;
  test::ReservedHugepages reserved(12);
  if (!reserved.ok()) {
    DMHNSW_SKIP("cannot reserve hugepages on this host (/proc/sys/vm/nr_hugepages, needs root)");
  }
  RestorePages restore;
  const uint64_t free0 = free_hugepage_bytes();
  REQUIRE(free0 >= 24 * kMiB);
  for (PoolPages p : {PoolPages::Huge, PoolPages::Auto}) {
    set_pool_pages(p);
    BufferPool pool(4 * kMiB);
    CHECK(pool.on_hugepages());
    check_usable(pool);
  }
  {
    memory::RegionMemory priv(6 * kMiB, true, -1);
    CHECK(priv.on_hugepages());
    CHECK_THAT(priv.describe(), Catch::Contains("on 2 MiB hugepages"));
    CHECK(free_hugepage_bytes() == free0 - 6 * kMiB);  // populated up front
    std::memset(priv.data(), 0x5a, 6 * kMiB);
    CHECK(priv.data()[6 * kMiB - 1] == 0x5a);

    // A cxl memnode's region: a memory object on hugetlbfs that another mapping (a computenode's)
    // sees write for write.
    memory::RegionMemory shared(6 * kMiB, true, -1, true);
    CHECK(shared.on_hugepages());
    REQUIRE(shared.fd() >= 0);
    void* other = ::mmap(nullptr, 6 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, shared.fd(), 0);
    REQUIRE(other != MAP_FAILED);
    shared.data()[12345] = 7;
    static_cast<char*>(other)[6 * kMiB - 1] = 9;
    CHECK(static_cast<char*>(other)[12345] == 7);
    CHECK(shared.data()[6 * kMiB - 1] == 9);
    ::munmap(other, 6 * kMiB);
    CHECK(free_hugepage_bytes() == free0 - 12 * kMiB);

    // More than the free hugepages: normal pages (with a warning), private or shared, usable.
    const uint64_t more = free_hugepage_bytes() + 8 * kMiB;
    memory::RegionMemory big(more, true, -1);
    CHECK_FALSE(big.on_hugepages());
    big.data()[more - 1] = 1;
    memory::RegionMemory big_shared(more, true, -1, true);
    CHECK_FALSE(big_shared.on_hugepages());
    CHECK_THAT(big_shared.describe(), Catch::Contains("on normal pages"));
    big_shared.data()[more - 1] = 1;
    CHECK(free_hugepage_bytes() == free0 - 12 * kMiB);  // the fallbacks hold none
  }
  CHECK(free_hugepage_bytes() == free0);  // all given back
}
