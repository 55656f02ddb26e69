#pragma once
// Cache access traces and the shared-cache replay behind the cache segmentation penalty
// (SHINE paper, definition 6.1): CSP = 1 - CHR / CHR_max, where CHR_max is the hit rate of
// one cache of the summed capacity with the same policy, fed the same accesses in time order.
//
// File format (one file per computenode thread, e.g. DIR/cn0-t1.trace): a 128-byte
// TraceFileHeader (magic "DMHTRACE", version, bounds) then 16-byte TraceRecords in the
// order they happened on that thread.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "common/fabric/remote_ptr.hpp"

namespace dmhnsw::cache {

inline constexpr char kTraceMagic[8] = {'D', 'M', 'H', 'T', 'R', 'A', 'C', 'E'};
inline constexpr uint32_t kTraceVersion = 1;

/// What the replay needs to rebuild the same cache policy.
struct TraceMeta {
  uint32_t cn_id = 0;
  uint32_t num_cns = 1;
  uint32_t thread = 0;
  uint32_t dim = 0;
  uint64_t capacity_bytes = 0;      // this computenode's cache (NodeCacheConfig::capacity_bytes)
  double admit_probability = 0.01;
  double cooling_share = 0.10;
  uint64_t seed = 1;
  int64_t start_unix_ns = 0;        // CLOCK_REALTIME at the start of the run (records are relative)
  char label[32] = {};              // free text, e.g. the routing policy ("adaptive")
};

struct TraceFileHeader {
  char magic[8];
  uint32_t version;
  uint32_t record_bytes;  // sizeof(TraceRecord)
  TraceMeta meta;
  char reserved[128 - 16 - sizeof(TraceMeta)];
};
static_assert(sizeof(TraceMeta) == 88);
static_assert(sizeof(TraceFileHeader) == 128);
static_assert(std::is_trivially_copyable_v<TraceFileHeader> && std::is_standard_layout_v<TraceFileHeader>);

struct TraceRecord {
  uint64_t key;   // RemotePtr::raw() of the node
  uint32_t t_us;  // microseconds since meta.start_unix_ns
  uint8_t level;  // the node's level (admission: upper levels always)
  uint8_t flags;  // kHit | kMeasured
  uint16_t reserved;
  static constexpr uint8_t kHit = 1;       // the computenode's own cache hit
  static constexpr uint8_t kMeasured = 2;  // outside the warm-up (counted in hit rates)
};
static_assert(sizeof(TraceRecord) == 16);
static_assert(offsetof(TraceRecord, t_us) == 8 && offsetof(TraceRecord, level) == 12 && offsetof(TraceRecord, flags) == 13);
static_assert(std::is_trivially_copyable_v<TraceRecord> && std::is_standard_layout_v<TraceRecord>);

/// One record (level clamped to 255).
TraceRecord make_record(RemotePtr key, unsigned level, bool hit, bool measured, uint32_t t_us = 0);

/// Buffered writer of one thread's trace. Not thread-safe (one per thread).
class TraceWriter {
 public:
  /// Writes PATH.tmp; close() renames it to PATH once the run is complete. Destroyed without
  /// close() (the run failed), it removes PATH.tmp: a trace cut short is never read as whole.
  TraceWriter(const std::string& path, const TraceMeta& meta);  // throws naming the path
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  void record(RemotePtr key, unsigned level, bool hit, bool measured);
  void flush();  // throws naming the path on a write error
  void close();  // flushes and renames PATH.tmp to PATH; throws naming the path
  uint64_t records() const { return records_; }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  int64_t start_ns_ = 0;
  std::vector<TraceRecord> buf_;
  uint64_t records_ = 0;
};

/// One trace file read back (header validated: magic, version, record size, length).
struct TraceFile {
  std::string path;
  TraceMeta meta;
  std::vector<TraceRecord> records;
};
TraceFile read_trace(const std::string& path);  // throws naming the path and offset

/// CSP of one run: the trace files of all computenodes of that run.
struct CspResult {
  struct PerCn {
    uint32_t cn_id = 0;
    uint64_t accesses = 0, hits = 0;  // measured records
    uint64_t capacity_bytes = 0;
    double chr() const { return accesses ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0; }
  };
  std::vector<PerCn> per_cn;      // by cn id
  uint32_t num_cns = 0;
  uint64_t accesses = 0, hits = 0;  // measured, all computenodes
  uint64_t shared_capacity_bytes = 0;
  uint64_t shared_accesses = 0, shared_hits = 0;  // the replay (measured records)
  double chr() const { return accesses ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0; }
  double chr_max() const {
    return shared_accesses ? static_cast<double>(shared_hits) / static_cast<double>(shared_accesses) : 0.0;
  }
  double csp() const { return chr_max() > 0 ? 1.0 - chr() / chr_max() : 0.0; }
};

/// Replays every record of `files` (all computenodes of one run) in time order into one
/// NodeCache with the summed capacity and the same policy; hits counted on measured records.
CspResult replay(const std::vector<TraceFile>& files);

}  // namespace dmhnsw::cache
