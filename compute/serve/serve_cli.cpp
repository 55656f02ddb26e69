// `computenode serve`'s flags, next to the code they configure.
#include <CLI/CLI.hpp>

#include "compute/dhnsw/options.hpp"
#include "compute/serve/serve.hpp"

namespace dmhnsw::serve {

CLI::App* add_serve_subcommand(CLI::App& app, ServeOptions& o) {
  auto* s = app.add_subcommand("serve", "answer applications' searches over gRPC (proto/dmhnsw.proto; the Python "
                                        "client in python/) until SIGTERM");
  s->add_option("--listen", o.listen, "HOST:PORT of the gRPC service (port 0: any free port, printed; a port in "
                                      "use is refused); a non-loopback host needs the cluster token")
      ->capture_default_str();
  s->add_option("--ready-file", o.ready_file,
                "once serving, write the bound HOST:PORT to this file (written whole: scripts wait for it)");
  s->add_option("--metrics-listen", o.metrics_listen,
                "HOST:PORT of the Prometheus metrics (GET /metrics; port 0: any free port, printed); with a "
                "cluster token a scrape must send Authorization: Bearer TOKEN");
  s->add_option("--max-k", o.max_k, "largest k a request may ask for (dhnsw: the k its engine searches with)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--max-batch", o.max_batch, "most query vectors per request")->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--max-message-bytes", o.max_message_bytes, "largest request or answer")->capture_default_str();
  s->add_option("--grace-seconds", o.grace_s, "on SIGTERM, in-flight calls get this long")->capture_default_str();
  s->add_option("--ef-search", o.shine.ef_search, "efSearch when a request gives none")->capture_default_str();
  // Each mode's search flags, as `query` has them (compute/shine/options.hpp, compute/dhnsw/options.hpp).
  o.shine.search.add_flags(*s, "; dhnsw: deserialized sub-HNSWs kept across batches as a share of the partitions "
                                 "(default 0.10)");
  s->add_option("--route-wait-us", o.shine.live.wait_us,
                "shine routing: queries of concurrent requests are gathered this long into one routing choice")
      ->capture_default_str();
  s->add_option("--route-timeout-ms", o.shine.live.timeout_ms,
                "shine routing: a routed query not answered this long is answered here")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  dhnsw::add_engine_flags(*s, o.dhnsw);
  return s;
}

}  // namespace dmhnsw::serve
