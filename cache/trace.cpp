// Cache access traces (writer, validated reader) and the shared-cache replay behind the
// cache segmentation penalty.
//
// t_us is 32 bits (about 71.6 minutes); the writer stores the elapsed microseconds modulo
// 2^32 and the replay unwraps them per file (records of one file are in time order), so runs
// longer than that replay correctly as long as each thread records at least every ~35 min.
#include "cache/trace.hpp"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cache/node_cache.hpp"
#include "common/dataset.hpp"

namespace dmhnsw::cache {
namespace {

constexpr std::size_t kBufferRecords = 4096;

int64_t realtime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string errno_text() { return std::strerror(errno); }

constexpr uint64_t kMetaOffset = offsetof(TraceFileHeader, meta);

}  // namespace

// ---------------------------------------------------------------- writer

TraceRecord make_record(RemotePtr key, unsigned level, bool hit, bool measured, uint32_t t_us) {
  TraceRecord r;
  r.key = key.raw();
  r.t_us = t_us;
  r.level = static_cast<uint8_t>(std::min(level, 255u));
  r.flags = static_cast<uint8_t>((hit ? TraceRecord::kHit : 0) | (measured ? TraceRecord::kMeasured : 0));
  r.reserved = 0;
  return r;
}

TraceWriter::TraceWriter(const std::string& path, const TraceMeta& meta) : path_(path), tmp_(path + ".tmp") {
  TraceMeta m = meta;
  if (m.start_unix_ns == 0) m.start_unix_ns = realtime_ns();  // no common start given: now
  start_ns_ = m.start_unix_ns;
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (f_ == nullptr) throw std::runtime_error(tmp_ + ": cannot create trace file: " + errno_text());
  TraceFileHeader h{};  // no padding anywhere: every byte is zero or set below
  std::memcpy(h.magic, kTraceMagic, sizeof h.magic);
  h.version = kTraceVersion;
  h.record_bytes = sizeof(TraceRecord);
  h.meta = m;
  if (std::fwrite(&h, sizeof h, 1, f_) != 1) {
    const std::string err = errno_text();
    std::fclose(f_);
    f_ = nullptr;
    std::remove(tmp_.c_str());
    throw std::runtime_error(path + ": cannot write trace header: " + err);
  }
  buf_.reserve(kBufferRecords);
}

// Not closed: the run that wrote it failed, and its trace is not a whole run's.
TraceWriter::~TraceWriter() {
  if (f_ == nullptr) return;
  std::fclose(f_);
  std::remove(tmp_.c_str());
}

void TraceWriter::close() {
  if (f_ == nullptr) return;
  std::string err;
  try {
    flush();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (std::fclose(f_) != 0 && err.empty()) err = path_ + ": write error: " + errno_text();
  f_ = nullptr;
  if (err.empty() && std::rename(tmp_.c_str(), path_.c_str()) != 0)
    err = path_ + ": cannot rename " + tmp_ + " to it: " + errno_text();
  if (!err.empty()) {
    std::remove(tmp_.c_str());
    throw std::runtime_error(err);
  }
}

void TraceWriter::record(RemotePtr key, unsigned level, bool hit, bool measured) {
  int64_t rel = realtime_ns() - start_ns_;
  if (rel < 0) rel = 0;
  buf_.push_back(make_record(key, level, hit, measured,
                             static_cast<uint32_t>(static_cast<uint64_t>(rel / 1000))));  // modulo 2^32, see top
  ++records_;
  if (buf_.size() >= kBufferRecords) flush();
}

void TraceWriter::flush() {
  if (f_ == nullptr) return;
  if (!buf_.empty()) {
    const std::size_t n = std::fwrite(buf_.data(), sizeof(TraceRecord), buf_.size(), f_);
    if (n != buf_.size()) {
      const std::string err = errno_text();
      buf_.clear();
      throw std::runtime_error(path_ + ": write error after " + std::to_string(records_) + " records: " + err);
    }
    buf_.clear();
  }
  if (std::fflush(f_) != 0) throw std::runtime_error(path_ + ": write error: " + errno_text());
}

// ---------------------------------------------------------------- reader

TraceFile read_trace(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw FormatError(path, "cannot open trace file: " + errno_text());
  std::vector<unsigned char> bytes;
  {
    unsigned char chunk[1 << 16];
    std::size_t n;
    while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) bytes.insert(bytes.end(), chunk, chunk + n);
    const bool err = std::ferror(f) != 0;
    std::fclose(f);
    if (err) throw FormatError(path, bytes.size(), "read error");
  }
  const uint64_t size = bytes.size();
  TraceFileHeader h{};
  // An empty file has bytes.data() == nullptr, which memcpy must not get even for 0 bytes.
  if (size > 0) std::memcpy(static_cast<void*>(&h), bytes.data(), std::min<uint64_t>(size, sizeof h));

  auto truncated_header = [&] {
    return FormatError(path, size,
                       "truncated trace header: the file has " + std::to_string(size) + " bytes, the header needs " +
                           std::to_string(sizeof(TraceFileHeader)));
  };
  if (size < sizeof h.magic) throw truncated_header();
  if (std::memcmp(h.magic, kTraceMagic, sizeof h.magic) != 0)
    throw FormatError(path, 0, "bad magic: not a dmhnsw trace file (expected \"DMHTRACE\")");
  if (size < offsetof(TraceFileHeader, record_bytes)) throw truncated_header();
  if (h.version != kTraceVersion)
    throw FormatError(path, offsetof(TraceFileHeader, version),
                      "unsupported trace version " + std::to_string(h.version) + " (this build reads version " +
                          std::to_string(kTraceVersion) + ")");
  if (size < kMetaOffset) throw truncated_header();
  if (h.record_bytes != sizeof(TraceRecord))
    throw FormatError(path, offsetof(TraceFileHeader, record_bytes),
                      "record size " + std::to_string(h.record_bytes) + ", expected " +
                          std::to_string(sizeof(TraceRecord)));
  if (size < sizeof h) throw truncated_header();

  const TraceMeta& m = h.meta;
  if (m.num_cns == 0) throw FormatError(path, kMetaOffset + offsetof(TraceMeta, num_cns), "num_cns is 0");
  if (m.cn_id >= m.num_cns)
    throw FormatError(path, kMetaOffset + offsetof(TraceMeta, cn_id),
                      "cn_id " + std::to_string(m.cn_id) + " >= num_cns " + std::to_string(m.num_cns));
  if (m.dim > kMaxDim)
    throw FormatError(path, kMetaOffset + offsetof(TraceMeta, dim),
                      "dimension " + std::to_string(m.dim) + " > " + std::to_string(kMaxDim));
  if (!(m.admit_probability >= 0.0 && m.admit_probability <= 1.0))
    throw FormatError(path, kMetaOffset + offsetof(TraceMeta, admit_probability),
                      "admit_probability " + std::to_string(m.admit_probability) + " outside [0, 1]");
  if (!(m.cooling_share >= 0.0 && m.cooling_share <= 1.0))
    throw FormatError(path, kMetaOffset + offsetof(TraceMeta, cooling_share),
                      "cooling_share " + std::to_string(m.cooling_share) + " outside [0, 1]");

  const uint64_t body = size - sizeof h;
  const uint64_t n = body / sizeof(TraceRecord);
  if (body % sizeof(TraceRecord) != 0)
    throw FormatError(path, sizeof h + n * sizeof(TraceRecord),
                      "truncated record: " + std::to_string(body % sizeof(TraceRecord)) + " bytes of a " +
                          std::to_string(sizeof(TraceRecord)) + "-byte record at the end of the file");

  TraceFile tf;
  tf.path = path;
  tf.meta = m;
  tf.records.resize(n);
  if (n != 0) std::memcpy(tf.records.data(), bytes.data() + sizeof h, n * sizeof(TraceRecord));
  constexpr uint8_t kKnownFlags = TraceRecord::kHit | TraceRecord::kMeasured;
  for (uint64_t i = 0; i < n; ++i) {
    if ((tf.records[i].flags & ~kKnownFlags) != 0)
      throw FormatError(path, sizeof h + i * sizeof(TraceRecord) + offsetof(TraceRecord, flags),
                        "record " + std::to_string(i) + ": unknown flags 0x" +
                            [&] {
                              char b[8];
                              std::snprintf(b, sizeof b, "%02x", tf.records[i].flags);
                              return std::string(b);
                            }());
  }
  return tf;
}

// ---------------------------------------------------------------- replay

CspResult replay(const std::vector<TraceFile>& files) {
  CspResult r;
  if (files.empty()) return r;

  const TraceFile& first = files.front();
  const TraceMeta& m0 = first.meta;
  auto mismatch = [&](const TraceFile& f, const char* what, const std::string& a, const std::string& b) {
    return std::invalid_argument("replay: " + f.path + ": " + what + " " + a + " differs from " + b + " in " +
                                 first.path + " (all files of one run need the same cache policy)");
  };
  std::map<uint32_t, CspResult::PerCn> per_cn;
  std::map<uint32_t, const TraceFile*> cn_first_file;
  for (const TraceFile& f : files) {
    const TraceMeta& m = f.meta;
    if (m.dim != m0.dim) throw mismatch(f, "dim", std::to_string(m.dim), std::to_string(m0.dim));
    if (m.num_cns != m0.num_cns) throw mismatch(f, "num_cns", std::to_string(m.num_cns), std::to_string(m0.num_cns));
    if (m.admit_probability != m0.admit_probability)
      throw mismatch(f, "admit_probability", std::to_string(m.admit_probability), std::to_string(m0.admit_probability));
    if (m.cooling_share != m0.cooling_share)
      throw mismatch(f, "cooling_share", std::to_string(m.cooling_share), std::to_string(m0.cooling_share));
    if (m.seed != m0.seed) throw mismatch(f, "seed", std::to_string(m.seed), std::to_string(m0.seed));
    auto [it, inserted] = cn_first_file.emplace(m.cn_id, &f);
    if (inserted) {
      CspResult::PerCn& pc = per_cn[m.cn_id];
      pc.cn_id = m.cn_id;
      pc.capacity_bytes = m.capacity_bytes;
      r.shared_capacity_bytes += m.capacity_bytes;  // each computenode once
    } else if (it->second->meta.capacity_bytes != m.capacity_bytes) {
      throw std::invalid_argument("replay: " + f.path + ": capacity_bytes " + std::to_string(m.capacity_bytes) +
                                  " differs from " + std::to_string(it->second->meta.capacity_bytes) + " in " +
                                  it->second->path + " (same computenode " + std::to_string(m.cn_id) + ")");
    }
  }
  r.num_cns = m0.num_cns;

  NodeCacheConfig cfg;
  cfg.capacity_bytes = r.shared_capacity_bytes;
  cfg.dim = m0.dim;
  cfg.admit_probability = m0.admit_probability;
  cfg.cooling_share = m0.cooling_share;
  cfg.seed = m0.seed;
  NodeCache cache(cfg);
  const std::vector<float> dummy(m0.dim, 0.0f);
  std::vector<float> out(std::max<uint32_t>(m0.dim, 1));

  // k-way merge by absolute time; ties by file order; each file's records stay in order.
  struct Cursor {
    std::size_t next = 0;
    uint64_t wraps = 0;
    uint32_t prev_t = 0;
  };
  std::vector<Cursor> cur(files.size());
  auto abs_time = [&](std::size_t fi) {
    Cursor& c = cur[fi];
    const uint32_t t = files[fi].records[c.next].t_us;
    uint64_t wraps = c.wraps;
    if (c.next > 0 && t < c.prev_t && c.prev_t - t > (uint32_t{1} << 31)) ++wraps;  // t_us wrapped
    const uint64_t us = (wraps << 32) + t;
    // The start time and the records come from the files: a time past int64 saturates (the
    // record sorts last) instead of overflowing.
    int64_t ns = 0, at = 0;
    if (__builtin_mul_overflow(us, int64_t{1000}, &ns) ||
        __builtin_add_overflow(files[fi].meta.start_unix_ns, ns, &at))
      at = std::numeric_limits<int64_t>::max();
    return std::make_pair(at, wraps);
  };
  using Item = std::tuple<int64_t, std::size_t, uint64_t>;  // time, file, wraps
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (std::size_t fi = 0; fi < files.size(); ++fi) {
    if (files[fi].records.empty()) continue;
    auto [t, w] = abs_time(fi);
    heap.emplace(t, fi, w);
  }
  while (!heap.empty()) {
    auto [t, fi, wraps] = heap.top();
    heap.pop();
    (void)t;
    Cursor& c = cur[fi];
    const TraceRecord& rec = files[fi].records[c.next];
    c.wraps = wraps;
    c.prev_t = rec.t_us;
    ++c.next;

    const RemotePtr key = RemotePtr::from_raw(rec.key);
    uint64_t label = 0;
    const bool hit = cache.lookup(key, out.data(), &label);
    if (!hit) cache.admit(key, rec.level, dummy.data(), 0);
    if ((rec.flags & TraceRecord::kMeasured) != 0) {
      CspResult::PerCn& pc = per_cn[files[fi].meta.cn_id];
      ++pc.accesses;
      ++r.accesses;
      if ((rec.flags & TraceRecord::kHit) != 0) {
        ++pc.hits;
        ++r.hits;
      }
      ++r.shared_accesses;
      if (hit) ++r.shared_hits;
    }
    if (c.next < files[fi].records.size()) {
      auto [nt, nw] = abs_time(fi);
      heap.emplace(nt, fi, nw);
    }
  }
  for (auto& [id, pc] : per_cn) r.per_cn.push_back(pc);
  return r;
}

}  // namespace dmhnsw::cache
