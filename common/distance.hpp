// Distance kernels: hnswlib's SIMD spaces behind a small value type chosen once at start-up.
//
//   L2: squared Euclidean distance.
//   IP: 1 - <a, b>  (hnswlib's InnerProductSpace convention: smaller is closer).
//
// This header does not include hnswlib: hnswlib 0.6.2's headers define non-inline globals and
// may be included by only one translation unit per binary. distance.cpp includes them inside
// an anonymous namespace, so other code of the project may still include <hnswlib/hnswlib.h>
// in (exactly) one of its own translation units.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dmhnsw {

enum class Metric { L2, IP };

/// "l2" or "ip" (case-insensitive); throws std::invalid_argument naming the value otherwise.
Metric parse_metric(std::string_view text);
std::string_view to_string(Metric metric);  // "l2", "ip"

class DistanceComputer {
 public:
  /// hnswlib's kernel signature: (a, b, pointer to size_t dim).
  using Kernel = float (*)(const void*, const void*, const void*);

  /// Picks the SIMD kernel for (metric, dim) once; dim must be >= 1 (std::invalid_argument).
  DistanceComputer(Metric metric, std::size_t dim);

  float operator()(const float* a, const float* b) const { return kernel_(a, b, &dim_); }

  Metric metric() const noexcept { return metric_; }
  std::size_t dim() const noexcept { return dim_; }
  /// Human-readable kernel choice for logs and reports, e.g. "l2/avx512/x16".
  const std::string& kernel_name() const noexcept { return name_; }

 private:
  Kernel kernel_;
  std::size_t dim_;
  Metric metric_;
  std::string name_;
};

/// Scalar reference (double accumulation) with the same conventions as DistanceComputer.
float reference_distance(Metric metric, const float* a, const float* b, std::size_t dim);

}  // namespace dmhnsw
