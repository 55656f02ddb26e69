// DistanceComputer: picks one of the kernel tables (distance_kernels.hpp) by what the CPU and
// the OS support, once at start-up. Compiled for the baseline: it runs on every CPU.
#include "common/distance.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "common/distance_kernels.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

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

std::string_view to_string(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::Scalar: return "scalar";
    case SimdIsa::SSE: return "sse";
    case SimdIsa::AVX2: return "avx2";
    case SimdIsa::AVX512: return "avx512";
  }
  return "?";
}

namespace {

using namespace distance_detail;

#if defined(__x86_64__)
struct CpuSimd {
  bool avx2 = false;    // AVX2 and FMA, and the OS saves the ymm state
  bool avx512 = false;  // and AVX-512F, and the OS saves the opmask and zmm state
};

CpuSimd detect_cpu() {
  CpuSimd s;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return s;
  const bool fma = (c & bit_FMA) != 0;
  // xgetbv faults unless the OS enabled XSAVE (OSXSAVE); a CPU may have AVX that the OS does
  // not save across context switches (XCR0), e.g. in some virtual machines.
  if ((c & bit_OSXSAVE) == 0 || (c & bit_AVX) == 0) return s;
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6) != 0x6) return s;  // SSE and AVX state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return s;
  s.avx2 = fma && (b & bit_AVX2) != 0;
  s.avx512 = s.avx2 && (b & bit_AVX512F) != 0 && (xcr0_lo & 0xe6) == 0xe6;  // + opmask, zmm
  return s;
}
#endif

std::vector<SimdIsa> detect_usable() {
  std::vector<SimdIsa> usable{baseline_isa()};
#if defined(__x86_64__)
  const CpuSimd cpu = detect_cpu();
  if (cpu.avx2) usable.push_back(SimdIsa::AVX2);
  if (cpu.avx512) usable.push_back(SimdIsa::AVX512);
#endif
  return usable;
}

bool is_usable(SimdIsa isa) {
  const auto& u = usable_simd_isas();
  return std::find(u.begin(), u.end(), isa) != u.end();
}

SimdIsa choose_isa() {
  const auto& usable = usable_simd_isas();
  const char* env = std::getenv("DMHNSW_SIMD");
  if (env == nullptr || *env == '\0') return usable.back();
  SimdIsa wanted = SimdIsa::Scalar;
  const std::string_view text(env);
  if (text == "sse") wanted = SimdIsa::SSE;
  else if (text == "avx2") wanted = SimdIsa::AVX2;
  else if (text == "avx512") wanted = SimdIsa::AVX512;
  else
    throw std::invalid_argument("DMHNSW_SIMD='" + std::string(text) +
                                "': expected sse, avx2 or avx512 (or unset: the best usable)");
  SimdIsa chosen = usable.front();  // the baseline, if even that is above the cap
  for (SimdIsa isa : usable)
    if (isa <= wanted) chosen = isa;
  if (chosen != wanted)
    spdlog::warn("DMHNSW_SIMD={}: not usable on this CPU or build, distance kernels use {}", text,
                 to_string(chosen));
  return chosen;
}

const KernelTable& table_of(SimdIsa isa) {
#if defined(__x86_64__)
  if (isa == SimdIsa::AVX2) return avx2_kernels();
  if (isa == SimdIsa::AVX512) return avx512_kernels();
#endif
  (void)isa;
  return baseline_kernels();
}

KernelClass classify(std::size_t dim) {
  if (dim % 16 == 0) return kX16;
  if (dim % 4 == 0) return kX4;
  if (dim > 16) return kX16Residual;
  if (dim > 4) return kX4Residual;
  return kScalar;
}

std::string describe(Metric metric, KernelClass c, SimdIsa isa) {
  std::string name(to_string(metric));
  if (isa == SimdIsa::Scalar || c == kScalar) return name + "/scalar";
  name += "/";
  name += to_string(isa);
  switch (c) {
    case kX16: return name + "/x16";
    case kX16Residual: return name + "/x16+tail";
    case kX4: return name + "/x4";
    case kX4Residual: return name + "/x4+tail";
    default: return name;
  }
}

}  // namespace

const std::vector<SimdIsa>& usable_simd_isas() {
  static const std::vector<SimdIsa> usable = detect_usable();
  return usable;
}

SimdIsa simd_isa() {
  static const SimdIsa isa = choose_isa();
  return isa;
}

DistanceComputer::DistanceComputer(Metric metric, std::size_t dim)
    : DistanceComputer(metric, dim, simd_isa()) {}

DistanceComputer::DistanceComputer(Metric metric, std::size_t dim, SimdIsa isa)
    : kernel_(nullptr), dim_(dim), metric_(metric), isa_(isa) {
  if (dim == 0) throw std::invalid_argument("DistanceComputer: dimension must be >= 1");
  if (!is_usable(isa))
    throw std::invalid_argument("DistanceComputer: no " + std::string(to_string(isa)) +
                                " kernels on this CPU or in this build");
  const KernelTable& t = table_of(isa);
  const KernelClass c = classify(dim);
  kernel_ = metric == Metric::L2 ? t.l2[c] : t.ip[c];
  name_ = describe(metric, c, isa);
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
