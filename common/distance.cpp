#include "common/distance.hpp"

// Every system header hnswlib includes, included first at global scope so that their include
// guards keep them out of the anonymous namespace below.
#include <algorithm>
#include <assert.h>
#include <atomic>
#include <cassert>
#include <cctype>
#include <cstdint>
#include <deque>
#include <fstream>
#include <iostream>
#include <list>
#include <mutex>
#include <queue>
#include <random>
#include <stdexcept>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#include <x86intrin.h>
#endif

// hnswlib 0.6.2 defines non-inline functions (cpuid, AVXCapable, ...) and mutable global kernel
// pointers in its headers. Wrapping it in an anonymous namespace gives all of them internal
// linkage: this file neither clashes with another translation unit that includes hnswlib nor
// shares hnswlib's mutable globals with it.
namespace dmhnsw {
namespace {
#include <hnswlib/hnswlib.h>
}  // namespace
}  // namespace dmhnsw

namespace dmhnsw {

Metric parse_metric(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "l2") return Metric::L2;
  if (t == "ip") return Metric::IP;
  throw std::invalid_argument("unknown metric '" + std::string(text) + "' (expected l2 or ip)");
}

std::string_view to_string(Metric metric) {
  switch (metric) {
    case Metric::L2: return "l2";
    case Metric::IP: return "ip";
  }
  return "?";
}

namespace {

// hnswlib's spaces pick their kernel by these dimension classes (space_l2.h / space_ip.h).
enum KernelClass { kX16 = 0, kX4, kX16Residual, kX4Residual, kScalar, kNumClasses };

KernelClass classify(std::size_t dim) {
  if (dim % 16 == 0) return kX16;
  if (dim % 4 == 0) return kX4;
  if (dim > 16) return kX16Residual;
  if (dim > 4) return kX4Residual;
  return kScalar;
}

// A dimension of each class; the kernels read the real dimension at call time.
constexpr std::size_t kRepresentative[kNumClasses] = {16, 4, 17, 5, 1};

struct KernelTable {
  DistanceComputer::Kernel l2[kNumClasses];
  DistanceComputer::Kernel ip[kNumClasses];
  const char* isa16;     // instruction set of the 16-wide kernels
  const char* l2_isa4;   // L2's 4-wide kernels
  const char* ip_isa4;   // IP's 4-wide kernels
};

// Built once (thread-safe static initialisation): the only place hnswlib's space constructors
// run, so hnswlib's global kernel pointers are written exactly once, before any use.
const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t{};
    for (int c = 0; c < kNumClasses; ++c) {
      hnswlib::L2Space l2(kRepresentative[c]);
      hnswlib::InnerProductSpace ip(kRepresentative[c]);
      t.l2[c] = l2.get_dist_func();
      t.ip[c] = ip.get_dist_func();
    }
    t.isa16 = t.l2_isa4 = t.ip_isa4 = "scalar";
#if defined(USE_SSE)
    t.isa16 = t.l2_isa4 = t.ip_isa4 = "sse";
#endif
#if defined(USE_AVX)
    if (AVXCapable()) t.isa16 = t.ip_isa4 = "avx";
#endif
#if defined(USE_AVX512)
    if (AVX512Capable()) t.isa16 = "avx512";
#endif
    return t;
  }();
  return table;
}

std::string describe(Metric metric, KernelClass c, const KernelTable& t) {
  std::string name(to_string(metric));
#if defined(USE_SSE)
  const bool simd = true;
#else
  const bool simd = false;
#endif
  if (!simd || c == kScalar) return name + "/scalar";
  switch (c) {
    case kX16: return name + "/" + t.isa16 + "/x16";
    case kX16Residual: return name + "/" + t.isa16 + "/x16+tail";
    case kX4: return name + "/" + (metric == Metric::L2 ? t.l2_isa4 : t.ip_isa4) + "/x4";
    case kX4Residual: return name + "/" + (metric == Metric::L2 ? t.l2_isa4 : t.ip_isa4) + "/x4+tail";
    default: return name + "/scalar";
  }
}

}  // namespace

DistanceComputer::DistanceComputer(Metric metric, std::size_t dim)
    : kernel_(nullptr), dim_(dim), metric_(metric) {
  if (dim == 0) throw std::invalid_argument("DistanceComputer: dimension must be >= 1");
  const KernelTable& t = kernel_table();
  const KernelClass c = classify(dim);
  kernel_ = metric == Metric::L2 ? t.l2[c] : t.ip[c];
  name_ = describe(metric, c, t);
}

float reference_distance(Metric metric, const float* a, const float* b, std::size_t dim) {
  double acc = 0.0;
  if (metric == Metric::L2) {
    for (std::size_t i = 0; i < dim; ++i) {
      const double diff = static_cast<double>(a[i]) - static_cast<double>(b[i]);
      acc += diff * diff;
    }
    return static_cast<float>(acc);
  }
  for (std::size_t i = 0; i < dim; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return static_cast<float>(1.0 - acc);
}

}  // namespace dmhnsw
