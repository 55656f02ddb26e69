// `computenode serve`'s flags, next to the code they configure.
#include <CLI/CLI.hpp>

#include "compute/serve/serve.hpp"

namespace dmhnsw::serve {

CLI::App* add_serve_subcommand(CLI::App& app, ServeOptions& o) {
  auto* s = app.add_subcommand("serve", "answer applications' searches over gRPC (proto/dmhnsw.proto; the Python "
                                        "client in python/) until SIGTERM");
  s->add_option("--listen", o.listen, "HOST:PORT of the gRPC service (port 0: any free port, printed); a "
                                      "non-loopback host needs the cluster token")
      ->capture_default_str();
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
  s->add_option("--threads", o.shine.threads, "shine: worker threads")->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--coroutines", o.shine.coroutines, "shine: queries in flight per worker thread")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--cache", o.shine.cache_bytes,
                "shine: bytes of the node cache (cooling table) searches go through, e.g. 64MiB (0: none; it "
                "holds vectors, which never change, and reads neighbour lists afresh)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  s->add_option("--admit-probability", o.shine.admit_probability, "shine: node cache admission of level-0 nodes")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  s->add_option("--routing", o.shine.route.policy,
                "shine: none | best-fit | balanced | adaptive: each query of a search goes to the serving "
                "computenode (--cn-id of --num-cns, all serving) whose cache fits it, through the relay")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "best-fit", "balanced", "adaptive"}));
  s->add_option("--route-batch", o.shine.route.batch, "shine routing: b, queries per routing batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--route-threshold", o.shine.route.threshold, "shine adaptive routing: t, queue length that is not backlog")
      ->capture_default_str();
  s->add_option("--kmeans-seed", o.shine.route.kmeans_seed, "shine routing: seed of the partitioning (the same on every "
                                                            "serving computenode)")
      ->capture_default_str();
  s->add_option("--adaptive-quota", o.shine.route.quota,
                "shine adaptive routing: demand (quotas follow each computenode's first-choice demand, scaled by "
                "the queues' backlog above --route-threshold) or even (equal shares scaled by the queues)")
      ->capture_default_str()
      ->check(CLI::IsMember({"demand", "even"}));
  s->add_option("--route-wait-us", o.shine.route.wait_us,
                "shine routing: queries of concurrent requests are gathered this long into one routing choice")
      ->capture_default_str();
  s->add_option("--route-timeout-ms", o.shine.route.timeout_ms,
                "shine routing: a routed query not answered this long is answered here")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--batch", o.dhnsw.batch, "dhnsw: most queries per batch")->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--max-wait-us", o.dhnsw.max_wait_us, "dhnsw: a batch closes this long after its first query arrived")
      ->capture_default_str();
  s->add_option("--probe", o.dhnsw.probe, "dhnsw: partitions searched per query")->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--cache-subs", o.dhnsw.cache_subs, "dhnsw: deserialized sub-HNSWs kept across batches (-1: 10 % of them)")
      ->capture_default_str();
  return s;
}

}  // namespace dmhnsw::serve
