// hnswlib's kernels compiled with -mavx512f -mfma: its USE_AVX512 paths (16-wide kernels on
// zmm registers; the 4-wide ones stay 128/256-bit). Only for CPUs with AVX-512F whose OS saves
// the zmm state.
#include "common/distance_hnswlib.inc"

#if !defined(USE_AVX512)
#error "distance_avx512.cpp must be compiled with -mavx512f (common/CMakeLists.txt)"
#endif

namespace dmhnsw::distance_detail {

const KernelTable& avx512_kernels() {
  static const KernelTable table = make_kernel_table();
  return table;
}

}  // namespace dmhnsw::distance_detail
