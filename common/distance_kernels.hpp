// Internal to common/distance*.cpp: hnswlib's kernels, one table per instruction set.
//
// Each table lives in its own translation unit compiled for its instruction set
// (common/CMakeLists.txt), so a portable binary carries AVX2 and AVX-512 code without
// -march=native. Calling avx2_kernels() or avx512_kernels() on a CPU without that instruction
// set dies with SIGILL: only distance.cpp calls them, after checking the CPU and the OS.
#pragma once

#include <cstddef>

#include "common/distance.hpp"

namespace dmhnsw::distance_detail {

// hnswlib's spaces pick their kernel by these dimension classes (space_l2.h / space_ip.h).
enum KernelClass { kX16 = 0, kX4, kX16Residual, kX4Residual, kScalar, kNumClasses };

struct KernelTable {
  DistanceComputer::Kernel l2[kNumClasses];
  DistanceComputer::Kernel ip[kNumClasses];
};

/// distance_baseline.cpp: the build's baseline (SSE2 on x86-64, scalar without SSE).
const KernelTable& baseline_kernels();
/// The instruction set baseline_kernels() was compiled for.
SimdIsa baseline_isa();

#if defined(__x86_64__)
const KernelTable& avx2_kernels();    // distance_avx2.cpp: -mavx2 -mfma
const KernelTable& avx512_kernels();  // distance_avx512.cpp: -mavx512f -mfma
#endif

}  // namespace dmhnsw::distance_detail
