// hnswlib index files (compute/shine/import.hpp: HnswlibFile, the parser behind
// `shine-import` and `computenode --mode shine import`). Input: [dim byte][file bytes...]; a
// dim byte of 0 accepts any dimension, else it is the dimension the caller expects (--data).
// A file that parses is read through every accessor (labels, vectors, each level's list and
// its neighbour ids, which must name elements of the file) and then imported as a shine index
// into an empty LocalFabric memnode of 4 MiB, as `shine-import` writes it into memnodes.
#include <cstdint>
#include <cstring>
#include <exception>

#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "compute/shine/layout.hpp"
#include "compute/shine/import.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

volatile double g_sink;  // where the values read go, so that the reads stay

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr uint64_t kRegion = 4u << 20;
  static fuzz::TempFile file(".hnsw");
  static auto cluster = fabric::LocalCluster::create(1, kRegion);
  fuzz::Input in(data, size);
  const uint32_t dim = in.byte();
  const std::vector<char> bytes = in.rest();
  try {
    const shine::HnswlibFile f(file.write(bytes), dim);
    DMHNSW_FUZZ_CHECK(dim == 0 || f.dim() == dim);
    DMHNSW_FUZZ_CHECK(f.count() <= f.max_elements() && f.file_bytes() == bytes.size());
    double sum = 0;  // every value is read: the mapping must hold them
    for (uint64_t i = 0; i < f.count(); ++i) {
      DMHNSW_FUZZ_CHECK(f.level(i) <= static_cast<unsigned>(f.max_level()));
      sum += f.label(i);
      for (uint32_t j = 0; j < f.dim(); ++j) sum += f.vector(i)[j];
      for (unsigned l = 0; l <= f.level(i); ++l) {
        const uint32_t n = f.list_count(i, l);
        DMHNSW_FUZZ_CHECK(n <= (l == 0 ? 2 * f.m() : f.m()));
        for (uint32_t j = 0; j < n; ++j) {
          const uint32_t id = f.neighbour(i, l, j);
          DMHNSW_FUZZ_CHECK(id < f.count() && f.level(id) >= l);
        }
      }
    }
    g_sink = sum;
    if (f.count() > 0) DMHNSW_FUZZ_CHECK(f.entry() < f.count() && f.level(f.entry()) == static_cast<unsigned>(f.max_level()));
    // The import, into a fresh (empty) region each time.
    std::memset(cluster->region(0), 0, kRegion);
    const RegionHeader h = make_region_header(0, kRegion);
    std::memcpy(cluster->region(0), &h, sizeof h);
    cluster->refresh_headers();
    shine::ImportOptions o;
    o.progress = false;
    (void)shine::import_hnswlib(*cluster, f, o);
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
