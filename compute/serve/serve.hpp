#pragma once
// `computenode serve`: the index as a gRPC service (proto/dmhnsw.proto) for applications.
#include <cstdint>
#include <string>

#include "compute/dhnsw/pipeline.hpp"
#include "compute/run_context.hpp"
#include "compute/serve/backend.hpp"

namespace CLI {
class App;
}

namespace dmhnsw::serve {

struct ServeOptions {
  std::string mode;                     // "shine" or "dhnsw"
  std::string listen = "127.0.0.1:7700";
  std::string ready_file;               // HOST:PORT written here (whole) once serving
  std::string metrics_listen;           // HOST:PORT of the Prometheus text exposition (GET /metrics); "": none
  std::string token;                    // the cluster token: every call must carry it (metadata dmhnsw-token)
  uint32_t max_k = 100;                 // dhnsw: also the k its engine searches with
  uint32_t max_batch = 10000;           // queries per request
  uint64_t max_message_bytes = 64u << 20;
  int grace_s = 10;                     // SIGTERM: in-flight calls get this long to finish
  ShineServeOptions shine;
  dhnsw::EngineOptions dhnsw;
};

/// Registers `serve` and its flags on the computenode's command line.
CLI::App* add_serve_subcommand(CLI::App& app, ServeOptions& o);

/// Serves until SIGTERM or SIGINT; returns the exit code.
int run_serve(const compute::RunContext& rc, const ServeOptions& o);

}  // namespace dmhnsw::serve
