#pragma once
// What `computenode serve` answers with: one backend per mode, behind the gRPC glue
// (service.cpp). A backend takes already-validated batches (dimension, k, finite values) and
// may be called from many gRPC threads at once.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "compute/dhnsw/pipeline.hpp"
#include "compute/run_context.hpp"
#include "compute/serve/metrics.hpp"
#include "compute/serve/shine_router.hpp"

namespace dmhnsw::serve {

struct IndexInfo {
  std::string mode, metric, provider;
  uint32_t dim = 0, memnodes = 0, computenode = 0;
  uint64_t count = 0, epoch = 0;
  uint64_t deleted = 0;     // tombstones (not in count): in the shine graph, in the d-HNSW sub-HNSWs until a rebuild
  bool ids = false;         // the index has an id index (deletes, upserts, any ids)
  uint32_t partitions = 0;  // dhnsw: sub-HNSWs (the largest probe); shine: 0
  std::string codes = "none";  // the index's compressed vectors (compute::CodesSpec::to_string)
  uint32_t rerank = 0;         // the server's --rerank: a search's when its request gives 0
};

/// A request field the backend refuses (the service answers INVALID_ARGUMENT with it).
struct BadRequest : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual IndexInfo info() = 0;
  /// n queries of info().dim floats; writes n x k ids (-1 where fewer were found) and distances.
  /// `rerank` (0: the server's): traverse on the index's codes and re-read the best that many;
  /// throws BadRequest naming the field when the index has no codes.
  virtual void search(const float* queries, size_t n, uint32_t k, uint32_t ef, uint32_t probe, uint32_t rerank,
                      int64_t* ids, float* distances) = 0;
  /// Inserts n vectors under `ids` (checked by the service: >= 0, distinct within the request);
  /// every one is in the index when this returns. Throws BadRequest for an id the mode cannot
  /// take or the index holds (naming it), before any is inserted. With `upsert`, an id the index
  /// holds gets the new vector instead; returns how many did.
  virtual uint64_t insert(const float* x, const int64_t* ids, size_t n, bool upsert) = 0;
  /// Deletes the vectors of `ids` (checked: >= 0, distinct); found[i] = 1 when ids[i] was in the
  /// index and is deleted now. Throws BadRequest when the index cannot delete.
  virtual void remove(const int64_t* ids, size_t n, uint8_t* found) = 0;
};

/// What every backend counts into the registry (the remote operations of its queries and
/// inserts, the caches, the index), created once so the hot path does not look them up.
struct BackendMetrics {
  explicit BackendMetrics(Registry& r, const std::string& mode);
  Counter &reads, &writes, &atomics, &doorbells, &bytes;
  Counter &queries, &inserted, &deleted, &replaced;
  Counter &cache_lookups, &cache_hits;  // shine: the node cache; dhnsw: the sub-HNSW cache
  Counter &coded, &reranked;            // shine with codes: nodes compared by their code, vectors re-read
  Histogram& batch_queries;             // dhnsw: queries per pipeline batch
  Gauge &epoch, &vectors;
  Gauge &codes_nodes, &codes_bytes;     // shine with codes: what this computenode holds of them
};

struct ShineServeOptions {
  shine::SearchOptions search;  // threads, coroutines, the node cache, routing: as `query` has them
  uint32_t ef_search = 64;      // when a request gives none
  LiveRouteOptions live;        // how live requests are gathered for routing, and a routed query's timeout
};
std::unique_ptr<Backend> make_shine_backend(const compute::RunContext& rc, const ShineServeOptions& o,
                                            BackendMetrics& m, Registry& r);

/// dhnsw: concurrent requests are gathered into batches of up to engine.batch queries, closed
/// engine.max_wait_us after the first one arrived, and go through the pipeline together.
std::unique_ptr<Backend> make_dhnsw_backend(const compute::RunContext& rc, const dhnsw::EngineOptions& engine,
                                            BackendMetrics& m);

}  // namespace dmhnsw::serve
