// d-HNSW sub-HNSWs and the meta-HNSW as a computenode rebuilds them from fetched bytes
// (compute/dhnsw/subindex.hpp: deserialize_sub with its overflow records, deserialize_meta
// over Faiss's index reader). Input: [mode byte] then
//   mode bit 0 clear (sub):  [MetaHeader, 128 B][SubDesc, 256 B][fetched bytes...]
//                            bit 1: sanitize (what a reader does after a dead writer)
//   mode bit 0 set (meta):   [meta-HNSW bytes...]
// An index that is accepted must be searchable: the harness searches it (k = 4) for a query of
// zeros and for its first vector, as the pipeline and the planner do, and every answer must be
// a node of the index (or -1).
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include <faiss/IndexHNSW.h>

#include "compute/dhnsw/layout.hpp"
#include "compute/dhnsw/subindex.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;

namespace {

void search_all(faiss::IndexHNSWFlat& idx) {
  if (idx.ntotal == 0) return;
  const size_t d = static_cast<size_t>(idx.d);
  std::vector<float> q(2 * d, 0.0f);
  const auto* flat = dynamic_cast<const faiss::IndexFlatCodes*>(idx.storage);
  DMHNSW_FUZZ_CHECK(flat != nullptr && flat->codes.size() >= d * sizeof(float));
  std::memcpy(q.data() + d, flat->codes.data(), d * sizeof(float));
  constexpr int k = 4;
  std::vector<float> D(2 * k);
  std::vector<faiss::Index::idx_t> I(2 * k);
  idx.hnsw.efSearch = 16;
  idx.search(2, q.data(), k, D.data(), I.data());
  for (auto id : I) DMHNSW_FUZZ_CHECK(id >= -1 && id < idx.ntotal);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  try {
    if (mode & 1) {
      const std::vector<char> bytes = in.rest();
      auto idx = deserialize_meta(bytes.data(), bytes.size(), "fuzz");
      search_all(*idx);
    } else {
      const MetaHeader h = in.take<MetaHeader>();
      const SubDesc d = in.take<SubDesc>();
      const std::vector<char> fetched = in.rest();
      SubIndex s = deserialize_sub(fetched.data(), fetched.size(), d, h, "fuzz", (mode & 2) != 0);
      DMHNSW_FUZZ_CHECK(s.index != nullptr && static_cast<uint64_t>(s.index->ntotal) == d.count);
      DMHNSW_FUZZ_CHECK(s.labels.size() == d.count);
      (void)s.memory_bytes();
      search_all(*s.index);
    }
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
