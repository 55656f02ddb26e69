// A shine index as computenodes find it in a memnode's region (compute/shine/graph.hpp): the
// region header's shine words as format_or_attach decodes them (mode, format state, M,
// efConstruction, metric, memnode count), the graph's bounds from the header blob, then a
// search (Worker::search: the entry word, node headers, labels, vectors, neighbour lists at
// every level) over whatever the region holds, as a region image loaded with `memnode --load`
// would hold it. The bytes go into a LocalFabric memnode of 1 MiB: the header page at offset 0,
// the rest from offset 4096 (where the seeds' data area starts). Input: [k byte][ef byte]
// [query byte][region header, 512 B][bytes from offset 4096...].
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "common/fabric/local/local_fabric.hpp"
#include "common/region.hpp"
#include "compute/coro.hpp"
#include "compute/shine/graph.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr uint64_t kRegion = kMinRegionBytes;
  static auto cluster = fabric::LocalCluster::create(1, kRegion);
  static auto ep = cluster->make_endpoint(8u << 20);
  fuzz::Input in(data, size);
  const uint32_t k = 1 + in.byte() % 16;
  const uint32_t ef = 1 + in.byte() % 64;
  const uint8_t qb = in.byte();
  const std::vector<char> header = in.bytes(fabric::kHeaderBlobBytes);
  const std::vector<char> rest = in.bytes(kRegion - kHeaderPageBytes);
  char* region = cluster->region(0);
  std::memset(region, 0, kRegion);
  if (!header.empty()) std::memcpy(region, header.data(), header.size());
  if (!rest.empty()) std::memcpy(region + kHeaderPageBytes, rest.data(), rest.size());
  cluster->refresh_headers();
  RegionHeader h;
  std::memcpy(&h, region, sizeof h);
  // A region some computenode is still formatting is waited for (up to 30 s): not fuzzed.
  if (shine_word::is_formatting(h.mode_words[shine_word::kFormat])) return 0;
  try {
    const shine::GraphParams p = shine::format_or_attach(*cluster, *ep, nullptr);
    const shine::Graph g(*cluster, p);
    compute::Scheduler s(*ep);
    shine::Worker w(g, s, 1);
    shine::OpContext ctx;
    std::vector<float> q(p.dim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((qb + 31 * i) % 17) - 8.0f;
    const std::vector<shine::Neighbor> res = compute::run_sync(s, w.search(q.data(), k, ef, ctx));
    DMHNSW_FUZZ_CHECK(res.size() <= k);
    for (const shine::Neighbor& n : res) DMHNSW_FUZZ_CHECK(g.plausible(n.node));
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
