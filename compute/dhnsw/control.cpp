#include "compute/dhnsw/control.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dmhnsw::dhnsw {

namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string num(uint64_t v) { return std::to_string(v); }

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

Control read_control(fabric::Endpoint& ep) {
  Control c;
  ep.read(RemotePtr(0, kControlOffset), &c, sizeof c);
  check_control(c);
  return c;
}

void check_control(const Control& c) {
  const std::string where = "memnode 0: d-HNSW control block at offset " + num(kControlOffset) + ": ";
  // lsh_bucket and probe_buckets shift by every bit: more than the buckets need is corruption.
  if (c.lsh_bits > kMaxLshBits)
    throw std::runtime_error(where + "lsh_bits " + num(c.lsh_bits) + " at offset " +
                             num(control_field(offsetof(Control, lsh_bits))) + " (at most " + num(kMaxLshBits) + ")");
  // The buffer: buckets x bucket_capacity entries of entry_bytes, inside [buffer_offset, +buffer_bytes),
  // every offset addressable by a RemotePtr. (Checked without overflow: each factor is 32-bit.)
  const uint64_t bucket_bytes = uint64_t{c.bucket_capacity} * c.entry_bytes;
  const bool bad_buffer =
      c.buffer_bytes > 0 &&
      (c.buckets == 0 || c.entry_bytes < sizeof(BufferEntryHeader) || c.bucket_capacity == 0 ||
       bucket_bytes > c.buffer_bytes / c.buckets || c.buffer_offset > RemotePtr::kOffsetMask ||
       c.buffer_bytes > RemotePtr::kOffsetMask + 1 - c.buffer_offset);
  if (c.buckets > kMaxBuckets || bad_buffer)
    throw std::runtime_error(where + num(c.buckets) + " buckets of " + num(c.bucket_capacity) + " entries of " +
                             num(c.entry_bytes) + " bytes at offset " + num(c.buffer_offset) + " (" +
                             num(c.buffer_bytes) + " bytes) is not a valid insert buffer");
}

void write_control_word(fabric::Endpoint& ep, RemotePtr p, uint64_t v) {
  fabric::Buffer b = ep.alloc(8);
  std::memcpy(b.data(), &v, 8);
  ep.write(p, b.data(), 8);
}

void leave_epochs(fabric::Endpoint& ep, uint32_t cn_id) {
  try {
    write_control_word(ep, ack_ptr(cn_id), 0);
  } catch (const std::exception& e) {
    spdlog::warn("dhnsw: clearing this computenode's epoch acknowledgement: {}", e.what());
  }
}

}  // namespace dmhnsw::dhnsw
