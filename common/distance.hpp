// Distance kernels: hnswlib's SIMD spaces behind a small value type chosen once at start-up.
//
//   L2: squared Euclidean distance.
//   IP: 1 - <a, b>  (hnswlib's InnerProductSpace convention: smaller is closer).
//
// The binaries are portable (no -march=native by default): on x86-64 they carry hnswlib's
// kernels compiled for SSE2, AVX2+FMA and AVX-512F, each in its own translation unit
// (distance_<isa>.cpp), and use the highest instruction set that the CPU and the OS support,
// decided once at start-up. DMHNSW_SIMD=sse|avx2|avx512 in the environment caps it (tests,
// comparisons). Without x86 there is one table, hnswlib's scalar loops.
//
// Instruction sets sum in different orders, so distances may differ in the last bits between
// hosts with different CPUs. Where computenodes must agree bit for bit (shine's k-means for
// routing runs on each; a mismatch only moves borderline queries), set DMHNSW_SIMD to the
// highest level every host has.
//
// This header does not include hnswlib: hnswlib 0.6.2's headers define non-inline globals and
// may be included by only one translation unit per binary. distance_hnswlib.inc includes them
// inside an anonymous namespace, so other code of the project may still include
// <hnswlib/hnswlib.h> in (exactly) one of its own translation units.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dmhnsw {

enum class Metric { L2, IP };

/// "l2" or "ip" (case-insensitive); throws std::invalid_argument naming the value otherwise.
Metric parse_metric(std::string_view text);
std::string_view to_string(Metric metric);  // "l2", "ip"

/// Instruction sets the kernels are compiled for, lowest first.
enum class SimdIsa { Scalar, SSE, AVX2, AVX512 };
std::string_view to_string(SimdIsa isa);  // "scalar", "sse", "avx2", "avx512"

/// The instruction sets this binary has kernels for and this CPU and OS run, lowest first.
const std::vector<SimdIsa>& usable_simd_isas();

/// The instruction set of every DistanceComputer built without one: the highest usable one,
/// not above DMHNSW_SIMD (sse, avx2 or avx512) if that is set. Decided at the first call;
/// an unknown DMHNSW_SIMD value throws std::invalid_argument (at every call).
SimdIsa simd_isa();

class DistanceComputer {
 public:
  /// hnswlib's kernel signature: (a, b, pointer to size_t dim).
  using Kernel = float (*)(const void*, const void*, const void*);

  /// Picks the kernel for (metric, dim) of simd_isa(); dim must be >= 1 (std::invalid_argument).
  DistanceComputer(Metric metric, std::size_t dim);
  /// The same with the kernels of `isa`, which must be usable (std::invalid_argument).
  DistanceComputer(Metric metric, std::size_t dim, SimdIsa isa);

  float operator()(const float* a, const float* b) const { return kernel_(a, b, &dim_); }

  Metric metric() const noexcept { return metric_; }
  std::size_t dim() const noexcept { return dim_; }
  SimdIsa isa() const noexcept { return isa_; }
  /// The raw kernel, for code that wants hnswlib's calling convention (an hnswlib space).
  Kernel kernel() const noexcept { return kernel_; }
  /// Kernel choice for logs and reports: metric / instruction set the kernel was compiled for /
  /// hnswlib's kernel shape (x16, x4: 16 or 4 floats per step, "+tail": scalar rest), e.g.
  /// "l2/avx512/x16"; "l2/scalar" for dims 1-3 and builds without SIMD.
  const std::string& kernel_name() const noexcept { return name_; }

 private:
  Kernel kernel_;
  std::size_t dim_;
  Metric metric_;
  SimdIsa isa_;
  std::string name_;
};

/// Scalar reference (double accumulation) with the same conventions as DistanceComputer.
float reference_distance(Metric metric, const float* a, const float* b, std::size_t dim);

}  // namespace dmhnsw
