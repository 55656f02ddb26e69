#pragma once
// The flags of d-HNSW's query engine (EngineOptions, compute/dhnsw/pipeline.hpp): one
// definition for every command that searches, `query` and `serve` alike.
#include <CLI/CLI.hpp>

#include "compute/dhnsw/pipeline.hpp"

namespace dmhnsw::dhnsw {

/// Registers --batch, --max-wait-us, --probe, --meta-ef-search, --cache-subs, --doorbell-subs,
/// --queue-depth and --search-threads on `cmd`, bound to `o`; a --cache-ratio already on `cmd`
/// (shine's, registered first) sets `o.cache_ratio` too when given, a --rerank `o.rerank`.
void add_engine_flags(CLI::App& cmd, EngineOptions& o);

}  // namespace dmhnsw::dhnsw
