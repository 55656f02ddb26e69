// `computenode serve`'s requests as the service reads them from a caller: the protobuf bytes of a
// Search or an Insert (gRPC hands the service whatever a client serialized, up to
// --max-message-bytes), parsed and then checked (compute/serve/requests.hpp) against the limits
// of a small index. Input: [selector byte][message bytes...]: bit 0 Search or Insert, bit 1 a
// shine or a dhnsw index. What is accepted must be what the backends assume: whole rows of
// finite floats of the index's dimension, k and probe in range, distinct ids >= 0.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "compute/serve/requests.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;
using namespace dmhnsw::serve;

namespace {

void check_rows(const std::string& bytes, uint32_t dim, size_t n, const RequestLimits& l) {
  DMHNSW_FUZZ_CHECK(dim == l.dim && n >= 1 && n <= l.max_batch && bytes.size() == 4ull * dim * n);
  for (size_t i = 0; i < n * dim; ++i) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    DMHNSW_FUZZ_CHECK(std::isfinite(v));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t sel = in.byte();
  const std::vector<char> msg = in.rest();
  RequestLimits l;
  l.dim = 4;
  l.max_k = 50;
  l.max_batch = 64;
  l.shine = (sel & 2) == 0;
  l.partitions = l.shine ? 0 : 8;
  size_t n = 0;
  if ((sel & 1) == 0) {
    v1::SearchRequest r;
    if (!r.ParseFromArray(msg.data(), static_cast<int>(msg.size()))) return 0;
    if (check_search(r, l, n)) return 0;
    check_rows(r.vectors(), r.dim(), n, l);
    DMHNSW_FUZZ_CHECK(r.k() >= 1 && r.k() <= l.max_k && r.ef_search() <= kMaxEfSearch);
    DMHNSW_FUZZ_CHECK(l.shine ? r.probe() == 0 : r.probe() <= l.partitions);
  } else {
    v1::InsertRequest r;
    if (!r.ParseFromArray(msg.data(), static_cast<int>(msg.size()))) return 0;
    if (check_insert(r, l, n)) return 0;
    check_rows(r.vectors(), r.dim(), n, l);
    DMHNSW_FUZZ_CHECK(static_cast<size_t>(r.ids_size()) == n);
    std::unordered_set<int64_t> ids(r.ids().begin(), r.ids().end());
    DMHNSW_FUZZ_CHECK(ids.size() == n);
    for (int64_t id : ids) DMHNSW_FUZZ_CHECK(id >= 0);
  }
  return 0;
}
