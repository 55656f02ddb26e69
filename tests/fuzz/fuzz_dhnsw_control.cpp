// The d-HNSW epoch control block and insert buffer in memnode 0's header page
// (compute/dhnsw/epoch.hpp: read_control with check_control, probe_buckets, buffer_read,
// buffer_search, buffer_append), as computenodes use them while a rebuild runs. The bytes are
// what a computenode READs: the harness puts them into a LocalFabric memnode 0 of 256 KiB at
// kControlOffset (the control block, then whatever follows, where a buffer may lie) and runs
// the real calls over an endpoint. Input: [dim byte][metric byte][query seed byte][bytes...].
// Entries read back must have the dimension asked for; answers at most k.
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "compute/dhnsw/control.hpp"
#include "common/fabric/local/local_fabric.hpp"
#include "compute/dhnsw/epoch.hpp"
#include "compute/dhnsw/insert_buffer.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr uint64_t kRegion = 256u << 10;
  static auto cluster = fabric::LocalCluster::create(1, kRegion);
  static auto ep = cluster->make_endpoint(8u << 20);
  fuzz::Input in(data, size);
  const uint32_t dim = 1 + in.byte() % 32;
  const bool ip = in.flag();
  const uint8_t seed = in.byte();
  const std::vector<char> bytes = in.bytes(kRegion - kControlOffset);
  char* region = cluster->region(0);
  std::memset(region, 0, kRegion);
  if (!bytes.empty()) std::memcpy(region + kControlOffset, bytes.data(), bytes.size());
  std::vector<float> queries(3 * dim);
  for (size_t i = 0; i < queries.size(); ++i) queries[i] = static_cast<float>((seed * 7919u + i * 104729u) % 201) - 100.0f;
  try {
    const Control c = read_control(*ep);
    DMHNSW_FUZZ_CHECK(c.buckets <= kMaxBuckets);
    for (size_t q = 0; q < 3; ++q)
      for (uint32_t b : probe_buckets(c, queries.data() + q * dim, dim)) DMHNSW_FUZZ_CHECK(c.buckets == 0 || b < c.buckets);
    for (const BufferedVector& e : buffer_read(*ep, c, dim)) DMHNSW_FUZZ_CHECK(e.v.size() == dim);
    std::vector<Answer> answers(3);
    (void)buffer_search(*ep, c, dim, ip, 5, queries.data(), 3, answers.data());
    for (const Answer& a : answers) DMHNSW_FUZZ_CHECK(a.size() <= 5);
    (void)buffer_append(*ep, c, queries.data(), dim, 42);
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
