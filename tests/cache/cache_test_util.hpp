// Helpers of the cache tests: key-derived vectors and hand-made trace files.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache/node_cache.hpp"
#include "cache/trace.hpp"

namespace dmhnsw::cache::test {

/// The vector stored for `key` in the tests: vec[i] = key * 31 + i (exact in float for small keys).
inline std::vector<float> key_vector(uint64_t key, uint32_t dim) {
  std::vector<float> v(dim);
  for (uint32_t i = 0; i < dim; ++i) v[i] = static_cast<float>(key * 31 + i);
  return v;
}

inline RemotePtr key_ptr(uint64_t k) { return RemotePtr(static_cast<uint16_t>(k % 3), 4096 * (k + 1)); }

/// Config with room for exactly `entries` entries.
inline NodeCacheConfig config_for(uint64_t entries, uint32_t dim, double p = 1.0, uint64_t seed = 1) {
  NodeCacheConfig c;
  c.capacity_bytes = entries * NodeCache::entry_bytes(dim);
  c.dim = dim;
  c.admit_probability = p;
  c.seed = seed;
  return c;
}

inline TraceRecord rec(uint64_t key, uint32_t t_us, bool measured, bool hit = false, uint8_t level = 0) {
  TraceRecord r{};
  r.key = key;
  r.t_us = t_us;
  r.level = level;
  r.flags = static_cast<uint8_t>((hit ? TraceRecord::kHit : 0) | (measured ? TraceRecord::kMeasured : 0));
  return r;
}

inline TraceMeta meta(uint32_t cn, uint32_t num_cns, uint32_t thread, uint32_t dim, uint64_t capacity_bytes,
                      int64_t start_ns, const char* label = "test", double p = 1.0) {
  TraceMeta m;
  m.cn_id = cn;
  m.num_cns = num_cns;
  m.thread = thread;
  m.dim = dim;
  m.capacity_bytes = capacity_bytes;
  m.admit_probability = p;
  m.start_unix_ns = start_ns;
  std::strncpy(m.label, label, sizeof m.label - 1);
  return m;
}

/// Writes a trace file byte by byte (header + records), as TraceWriter would with these times.
inline void write_trace_file(const std::string& path, const TraceMeta& m, const std::vector<TraceRecord>& records) {
  TraceFileHeader h{};
  std::memcpy(h.magic, kTraceMagic, sizeof h.magic);
  h.version = kTraceVersion;
  h.record_bytes = sizeof(TraceRecord);
  h.meta = m;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&h), sizeof h);
  out.write(reinterpret_cast<const char*>(records.data()),
            static_cast<std::streamsize>(records.size() * sizeof(TraceRecord)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// The hand-computed run of the replay tests: 2 computenodes (cn0 with two thread files),
/// room for 4 entries each, admit_probability 1, 6 distinct keys (no eviction in the shared
/// cache of 8 entries). cn1 starts 5 us after cn0; at t = 25 us cn0-t0 (a warm-up access of
/// key 3) and cn1 (a measured access of key 3) tie and file order decides.
///   shared timeline (us): 0 k1 W miss | 5 k1 M hit | 10 k2 M miss | 15 k2 M hit | 20 k1 M hit |
///   25 k3 W miss | 25 k3 M hit | 30 k4 M miss | 35 k5 M miss | 40 k4 M hit | 45 k3 M hit | 50 k2 M hit
///   -> shared 7 / 10 = 0.7; own flags: cn0 3 / 5, cn1 1 / 5 -> CHR 0.4; CSP = 1 - 0.4 / 0.7 = 3/7.
constexpr uint32_t kRunDim = 4;
constexpr int64_t kRunStart = 1'700'000'000'000'000'000;
inline uint64_t run_key(uint64_t k) { return RemotePtr(1, 64 * k).raw(); }
inline uint64_t run_capacity() { return 4 * NodeCache::entry_bytes(kRunDim); }

inline std::vector<std::string> write_known_run(const std::string& dir, const char* label = "none") {
  const uint64_t cap = run_capacity();
  const std::string f0 = dir + "/cn0-t0.trace", f1 = dir + "/cn0-t1.trace", f2 = dir + "/cn1-t0.trace";
  write_trace_file(f0, meta(0, 2, 0, kRunDim, cap, kRunStart, label),
                   {rec(run_key(1), 0, false), rec(run_key(2), 10, true), rec(run_key(1), 20, true, true),
                    rec(run_key(3), 25, false)});
  write_trace_file(f1, meta(0, 2, 1, kRunDim, cap, kRunStart, label),
                   {rec(run_key(2), 15, true, true), rec(run_key(4), 30, true), rec(run_key(4), 40, true, true)});
  write_trace_file(f2, meta(1, 2, 0, kRunDim, cap, kRunStart + 5000, label),
                   {rec(run_key(1), 0, true), rec(run_key(3), 20, true), rec(run_key(5), 30, true),
                    rec(run_key(3), 40, true, true), rec(run_key(2), 45, true)});
  return {f0, f1, f2};
}

}  // namespace dmhnsw::cache::test
