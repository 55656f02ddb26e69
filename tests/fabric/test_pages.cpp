// Buffer pools' pages: hugepages where the host has them reserved, normal pages otherwise.
#include <catch2/catch.hpp>

#include <cstring>

#include "common/fabric/pages.hpp"
#include "common/fabric/transport.hpp"

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
