// Workload files (common/workload.hpp read_workload, and Distribution::parse of the header's
// distribution text). Input: [view byte][file bytes...]. A workload that loads is read in full
// (pool indices, query vectors, ground truth), summarized as `tools/workload --stats` does,
// and its distribution text parsed, printed and parsed again (the same distribution).
#include <cmath>
#include <cstdint>
#include <exception>

#include "common/workload.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile file(".workload");
  fuzz::Input in(data, size);
  const bool allow_view = in.flag();
  const std::string& path = file.write(in.rest());
  try {
    const Workload w = read_workload(path, allow_view);
    DMHNSW_FUZZ_CHECK(w.pool_index.size() == w.total() && w.queries.n() == w.total() &&
                      w.groundtruth.n() == w.total());
    for (uint64_t i = 0; i < w.total(); ++i) {
      DMHNSW_FUZZ_CHECK(w.pool_index[i] < w.pool_size);
      for (float v : w.queries[i]) DMHNSW_FUZZ_CHECK(std::isfinite(v));
      for (int32_t id : w.groundtruth[i]) DMHNSW_FUZZ_CHECK(id >= 0);
    }
    const WorkloadStats st = summarize(w);
    DMHNSW_FUZZ_CHECK(st.queries == w.total() && st.distinct <= st.queries);
    const Distribution d = Distribution::parse(w.distribution);
    const Distribution again = Distribution::parse(d.to_string());
    DMHNSW_FUZZ_CHECK(again.kind == d.kind && again.s == d.s);
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
