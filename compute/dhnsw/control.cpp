#include "compute/dhnsw/control.hpp"

#include <algorithm>

namespace dmhnsw::dhnsw {

namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint32_t lsh_bucket(const float* x, uint32_t dim, uint32_t bits, uint64_t seed) {
  uint32_t b = 0;
  uint64_t s = seed;
  for (uint32_t i = 0; i < bits; ++i) {
    double dot = 0;
    // Coefficients uniform in [-1, 1): deterministic on every machine (no <random> distribution).
    for (uint32_t j = 0; j < dim; ++j)
      dot += (static_cast<double>(splitmix(s) >> 11) * 0x1.0p-52 - 1.0) * static_cast<double>(x[j]);
    if (dot > 0) b |= 1u << i;
  }
  return b;
}

Control make_control(uint64_t epoch, uint64_t area_base, uint64_t area_end, uint64_t buffer_offset,
                     uint64_t buffer_bytes, uint32_t dim) {
  Control c{};
  c.phase = kIdle;
  c.epoch = epoch;
  c.buffer_offset = buffer_offset;
  c.buffer_bytes = buffer_bytes;
  c.lsh_bits = 4;
  c.buckets = 1u << c.lsh_bits;
  c.entry_bytes = buffer_entry_bytes(dim);
  c.bucket_capacity = static_cast<uint32_t>(
      std::min<uint64_t>(buffer_bytes / c.buckets / c.entry_bytes, (uint64_t{1} << 31)));
  c.lsh_seed = 0x5EED0D15ull;
  c.cur_base = area_base;
  c.cur_end = area_end;
  return c;
}

}  // namespace dmhnsw::dhnsw
