// hnswlib's kernels for the build's baseline instruction set: SSE2 on every x86-64 CPU (and
// whatever the flags allow with DMHNSW_NATIVE=ON, cut at SSE by -mno-avx so that this table
// stays the one a CPU without AVX runs), hnswlib's scalar loops where there is no SSE.
#include "common/distance_hnswlib.inc"

namespace dmhnsw::distance_detail {

const KernelTable& baseline_kernels() {
  static const KernelTable table = make_kernel_table();
  return table;
}

SimdIsa baseline_isa() {
#if defined(USE_SSE)
  return SimdIsa::SSE;
#else
  return SimdIsa::Scalar;
#endif
}

}  // namespace dmhnsw::distance_detail
