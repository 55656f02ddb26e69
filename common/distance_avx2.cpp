// hnswlib's kernels compiled with -mavx2 -mfma (-mno-avx512f keeps them AVX2 when
// DMHNSW_NATIVE=ON): its USE_AVX paths. Only for CPUs with AVX2, FMA and OS-enabled AVX state.
#include "common/distance_hnswlib.inc"

#if !defined(USE_AVX) || defined(USE_AVX512)
#error "distance_avx2.cpp must be compiled for AVX2 without AVX-512 (common/CMakeLists.txt)"
#endif

namespace dmhnsw::distance_detail {

const KernelTable& avx2_kernels() {
  static const KernelTable table = make_kernel_table();
  return table;
}

}  // namespace dmhnsw::distance_detail
