// Cache access traces (cache/trace.hpp: read_trace, then replay, as tools/csp-report runs them
// over the trace files of one run). Input: [u16 length of file 1][file 1][file 2...]; file 2
// is left out when empty. The CSP numbers of a replay must be rates in [0, 1].
#include <cstdint>
#include <exception>
#include <vector>

#include "cache/trace.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile file1(".trace"), file2(".trace");
  fuzz::Input in(data, size);
  const std::vector<char> a = in.chunk();
  const std::vector<char> b = in.rest();
  try {
    std::vector<cache::TraceFile> files;
    files.push_back(cache::read_trace(file1.write(a)));
    DMHNSW_FUZZ_CHECK(sizeof(cache::TraceFileHeader) + files[0].records.size() * sizeof(cache::TraceRecord) == a.size());
    if (!b.empty()) files.push_back(cache::read_trace(file2.write(b)));
    const cache::CspResult r = cache::replay(files);
    DMHNSW_FUZZ_CHECK(r.hits <= r.accesses && r.shared_hits <= r.shared_accesses);
    DMHNSW_FUZZ_CHECK(r.chr() >= 0 && r.chr() <= 1 && r.chr_max() >= 0 && r.chr_max() <= 1);
    (void)r.csp();
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
