#include "compute/dhnsw/insert_buffer.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "common/distance.hpp"

namespace dmhnsw::dhnsw {

namespace {

/// Entries of the insert buffer are buffer_entry_bytes(dim) long (make_control); entry_bytes
/// comes from memnode 0, and readers size their reads by it.
void check_entry_bytes(const Control& c, uint32_t dim) {
  if (c.entry_bytes != buffer_entry_bytes(dim))
    throw std::runtime_error(
        "memnode 0: d-HNSW control block at offset " + std::to_string(control_field(offsetof(Control, entry_bytes))) +
        ": insert buffer entries of " + std::to_string(c.entry_bytes) + " bytes, but those of vectors of dimension " +
        std::to_string(dim) + " are " + std::to_string(buffer_entry_bytes(dim)));
}

}  // namespace

AppendResult buffer_append(fabric::Endpoint& ep, const Control& c, const float* x, uint32_t dim, int64_t id) {
  if (c.buffer_bytes == 0 || c.buckets == 0) return AppendResult::Full;
  check_entry_bytes(c, dim);
  const uint32_t b = lsh_bucket(x, dim, c.lsh_bits, c.lsh_seed) % c.buckets;
  const uint64_t old = ep.fetch_add(bucket_ptr(b), 1);
  if (bucket_state(old) != kBucketActive) return AppendResult::NotActive;
  const uint64_t i = bucket_count(old);
  if (i >= c.bucket_capacity) return AppendResult::Full;
  fabric::Buffer e = ep.alloc(c.entry_bytes);
  std::memset(e.data(), 0, c.entry_bytes);
  BufferEntryHeader h{0, id};
  std::memcpy(e.data(), &h, sizeof h);
  std::memcpy(e.data() + sizeof h, x, sizeof(float) * dim);
  const uint64_t at = buffer_entry_offset(c, b, i);
  ep.write(RemotePtr(0, at), e.data(), c.entry_bytes);
  write_control_word(ep, RemotePtr(0, at), c.generation);  // the commit word: the insert is acknowledged after it
  return AppendResult::Ok;
}

std::vector<BufferedVector> buffer_read(fabric::Endpoint& ep, const Control& c, uint32_t dim,
                                        const std::vector<uint32_t>& buckets) {
  std::vector<BufferedVector> out;
  if (c.buffer_bytes == 0) return out;
  check_entry_bytes(c, dim);
  std::vector<uint32_t> bs = buckets;
  if (bs.empty())
    for (uint32_t b = 0; b < c.buckets; ++b) bs.push_back(b);
  // Entries are read kReadChunk bytes at a time at most: their count comes from memnode 0.
  constexpr uint64_t kReadChunk = 4u << 20;
  const uint64_t per_read = std::max<uint64_t>(1, kReadChunk / c.entry_bytes);
  std::vector<char> buf;
  for (uint32_t b : bs) {
    const uint64_t w = c.bucket_words[b];
    if (bucket_state(w) == kBucketIdle) continue;
    const uint64_t n = std::min<uint64_t>(bucket_count(w), c.bucket_capacity);
    for (uint64_t first = 0; first < n; first += per_read) {
      const uint64_t m = std::min(per_read, n - first);
      buf.resize(m * c.entry_bytes);
      ep.read(RemotePtr(0, buffer_entry_offset(c, b, first)), buf.data(), buf.size());
      for (uint64_t i = 0; i < m; ++i) {
        BufferEntryHeader h;
        std::memcpy(&h, buf.data() + i * c.entry_bytes, sizeof h);
        if (h.commit != c.generation) continue;  // being written, or left by an inserter that died
        BufferedVector v;
        v.id = h.id;
        v.v.resize(dim);
        std::memcpy(v.v.data(), buf.data() + i * c.entry_bytes + sizeof h, sizeof(float) * dim);
        out.push_back(std::move(v));
      }
    }
  }
  return out;
}

uint64_t buffer_search(fabric::Endpoint& ep, const Control& ctl, uint32_t dim, bool ip, uint32_t k, const float* queries,
                       size_t n, Answer* answers) {
  bool any = false;
  for (uint32_t b = 0; b < ctl.buckets; ++b)
    any = any || (bucket_state(ctl.bucket_words[b]) != kBucketIdle && bucket_count(ctl.bucket_words[b]) > 0);
  if (!any) return 0;
  std::vector<std::vector<uint32_t>> probes(n);
  std::vector<char> want(ctl.buckets, 0);
  for (size_t q = 0; q < n; ++q) {
    probes[q] = probe_buckets(ctl, queries + q * dim, dim);
    for (uint32_t b : probes[q]) want[b] = 1;
  }
  std::map<uint32_t, std::vector<BufferedVector>> by_bucket;
  for (uint32_t b = 0; b < ctl.buckets; ++b)
    if (want[b]) by_bucket[b] = buffer_read(ep, ctl, dim, {b});
  const DistanceComputer dist(ip ? Metric::IP : Metric::L2, dim);
  auto better = [ip](const std::pair<float, int64_t>& u, const std::pair<float, int64_t>& v) {
    if (u.first != v.first) return ip ? u.first > v.first : u.first < v.first;
    return u.second < v.second;
  };
  uint64_t scanned = 0;
  for (size_t q = 0; q < n; ++q) {
    const float* x = queries + q * dim;
    Answer& a = answers[q];
    for (uint32_t b : probes[q])
      for (const auto& e : by_bucket[b]) {
        // Faiss's scale: squared L2, or the inner product itself (larger is better).
        a.emplace_back(ip ? 1.0f - dist(x, e.v.data()) : dist(x, e.v.data()), e.id);
        ++scanned;
      }
    std::sort(a.begin(), a.end(), better);
    if (a.size() > k) a.resize(k);
  }
  return scanned;
}

std::vector<uint32_t> probe_buckets(const Control& c, const float* q, uint32_t dim) {
  const uint32_t b = lsh_bucket(q, dim, c.lsh_bits, c.lsh_seed) % std::max<uint32_t>(1, c.buckets);
  std::vector<uint32_t> out{b};
  for (uint32_t i = 0; i < c.lsh_bits; ++i)
    if ((b ^ (1u << i)) < c.buckets) out.push_back(b ^ (1u << i));
  return out;
}

}  // namespace dmhnsw::dhnsw
