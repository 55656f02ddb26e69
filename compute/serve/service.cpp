// The gRPC side of `computenode serve`: checks every request (answering INVALID_ARGUMENT
// naming the field), the cluster token, hands the batch to the mode's backend, and counts
// every call into the metrics (compute/serve/metrics.hpp).
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>

#include "common/fabric/transport.hpp"
#include "common/json_file.hpp"
#include "compute/serve/metrics.hpp"
#include "compute/store.hpp"
#include "compute/write_gate.hpp"
#include "compute/serve/requests.hpp"
#include "compute/serve/serve.hpp"
#include "dmhnsw.grpc.pb.h"

namespace dmhnsw::serve {
namespace {

namespace pb = ::dmhnsw::v1;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

std::atomic<int> g_signal{0};
extern "C" void on_signal(int s) { g_signal.store(s); }

Status bad(const std::string& why) { return Status(StatusCode::INVALID_ARGUMENT, why); }

const char* code_name(StatusCode c) {
  switch (c) {
    case StatusCode::OK: return "OK";
    case StatusCode::CANCELLED: return "CANCELLED";
    case StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case StatusCode::INTERNAL: return "INTERNAL";
    default: return "OTHER";
  }
}

/// Per-method call counters and latency, looked up once.
struct MethodMetrics {
  MethodMetrics(Registry& r, const std::string& method)
      : registry(r), name(method),
        calls(r.counter("dmhnsw_requests_total", "gRPC calls answered, by method", {{"method", method}})),
        latency(r.histogram("dmhnsw_request_duration_seconds", "time from a call's arrival to its answer, by method",
                            latency_buckets(), {{"method", method}})) {}
  Registry& registry;
  std::string name;
  Counter& calls;
  Histogram& latency;
};

/// Runs a backend call: a refused field is INVALID_ARGUMENT, a memnode that failed UNAVAILABLE,
/// anything else INTERNAL, each with the backend's message.
template <class F>
Status answered(F&& f) {
  try {
    f();
  } catch (const BadRequest& e) {
    return bad(e.what());
  } catch (const fabric::FabricError& e) {
    return Status(StatusCode::UNAVAILABLE, e.what());
  } catch (const std::exception& e) {
    return Status(StatusCode::INTERNAL, e.what());
  }
  return Status::OK;
}

class Service final : public pb::Search::Service {
 public:
  Service(Backend& b, const ServeOptions& o, Registry& r, fabric::Cluster& c, compute::WriteGate& gate)
      : b_(b), o_(o), info_(b.info()), r_(r), c_(c), gate_(gate), search_m_(r, "Search"), insert_m_(r, "Insert"),
        delete_m_(r, "Delete"), info_m_(r, "Info"), snapshot_m_(r, "Snapshot"),
        inflight_(r.gauge("dmhnsw_requests_in_flight", "gRPC calls being answered")) {}

  Status Search(ServerContext* ctx, const pb::SearchRequest* req, pb::SearchResponse* resp) override {
    return counted(search_m_, [&] { return search(ctx, req, resp); });
  }
  Status Insert(ServerContext* ctx, const pb::InsertRequest* req, pb::InsertResponse* resp) override {
    return counted(insert_m_, [&] { return insert(ctx, req, resp); });
  }
  Status Delete(ServerContext* ctx, const pb::DeleteRequest* req, pb::DeleteResponse* resp) override {
    return counted(delete_m_, [&] { return remove(ctx, req, resp); });
  }
  Status Info(ServerContext* ctx, const pb::InfoRequest* req, pb::InfoResponse* resp) override {
    return counted(info_m_, [&] { return info(ctx, req, resp); });
  }
  Status Snapshot(ServerContext* ctx, const pb::SnapshotRequest* req, pb::SnapshotResponse* resp) override {
    return counted(snapshot_m_, [&] { return snapshot(ctx, req, resp); });
  }

 private:
  template <class F>
  Status counted(MethodMetrics& m, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    inflight_.add(1);
    Status s = f();
    inflight_.add(-1);
    m.calls.add();
    m.latency.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!s.ok())
      r_.counter("dmhnsw_request_errors_total", "gRPC calls refused or failed, by method and status code",
                 {{"method", m.name}, {"code", code_name(s.error_code())}})
          .add();
    return s;
  }

  Status search(ServerContext* ctx, const pb::SearchRequest* req, pb::SearchResponse* resp) {
    if (auto s = authorize(ctx); !s.ok()) return s;
    size_t n = 0;
    if (auto why = check_search(*req, limits(), n)) return bad(*why);
    const uint32_t k = req->k();
    // The request's bytes are not aligned for float: one copy.
    std::vector<float> q(n * info_.dim);
    std::memcpy(q.data(), req->vectors().data(), q.size() * sizeof(float));
    resp->mutable_ids()->Resize(static_cast<int>(n * k), -1);
    resp->mutable_distances()->Resize(static_cast<int>(n * k), 0.0f);
    if (Status s = answered([&] {
          b_.search(q.data(), n, k, req->ef_search(), req->probe(), req->rerank(), resp->mutable_ids()->mutable_data(),
                    resp->mutable_distances()->mutable_data());
        });
        !s.ok())
      return s;
    resp->set_n(static_cast<uint32_t>(n));
    resp->set_k(k);
    return Status::OK;
  }

  Status insert(ServerContext* ctx, const pb::InsertRequest* req, pb::InsertResponse* resp) {
    if (auto s = authorize(ctx); !s.ok()) return s;
    size_t n = 0;
    if (auto why = check_insert(*req, limits(), n)) return bad(*why);
    std::vector<float> x(n * info_.dim);
    std::memcpy(x.data(), req->vectors().data(), x.size() * sizeof(float));
    uint64_t replaced = 0;
    compute::WriteGate::Pass pass(gate_);  // a snapshot waits for this write, or it for the snapshot
    if (Status s = answered([&] { replaced = b_.insert(x.data(), req->ids().data(), n, req->upsert()); }); !s.ok())
      return s;
    resp->set_inserted(static_cast<uint32_t>(n));
    resp->set_replaced(static_cast<uint32_t>(replaced));
    return Status::OK;
  }

  Status remove(ServerContext* ctx, const pb::DeleteRequest* req, pb::DeleteResponse* resp) {
    if (auto s = authorize(ctx); !s.ok()) return s;
    if (auto why = check_delete(*req, limits())) return bad(*why);
    const size_t n = static_cast<size_t>(req->ids_size());
    std::vector<uint8_t> found(n, 0);
    compute::WriteGate::Pass pass(gate_);
    if (Status s = answered([&] { b_.remove(req->ids().data(), n, found.data()); }); !s.ok()) return s;
    uint32_t deleted = 0;
    for (size_t i = 0; i < n; ++i) {
      if (found[i] != 0)
        ++deleted;
      else
        resp->add_not_found(req->ids(static_cast<int>(i)));
    }
    resp->set_deleted(deleted);
    return Status::OK;
  }

  Status info(ServerContext* ctx, const pb::InfoRequest*, pb::InfoResponse* resp) {
    if (auto s = authorize(ctx); !s.ok()) return s;
    IndexInfo i;
    try {
      i = b_.info();
    } catch (const std::exception& e) {
      return Status(StatusCode::UNAVAILABLE, e.what());
    }
    resp->set_mode(i.mode);
    resp->set_dim(i.dim);
    resp->set_metric(i.metric);
    resp->set_count(i.count);
    resp->set_memnodes(i.memnodes);
    resp->set_epoch(i.epoch);
    resp->set_provider(i.provider);
    resp->set_max_k(o_.max_k);
    resp->set_max_batch(o_.max_batch);
    resp->set_computenode(i.computenode);
    resp->set_deleted(i.deleted);
    resp->set_ids(i.ids);
    resp->set_codes(i.codes);
    resp->set_rerank(i.rerank);
    return Status::OK;
  }

  Status snapshot(ServerContext* ctx, const pb::SnapshotRequest* req, pb::SnapshotResponse* resp) {
    if (auto s = authorize(ctx); !s.ok()) return s;
    if (req->dir().empty()) return bad("dir: empty; the memnodes' directory for the images (inside --store-dir)");
    if (req->wait_seconds() > 3600) return bad("wait_seconds: " + std::to_string(req->wait_seconds()) + ", at most 3600");
    const int wait_ms = 1000 * static_cast<int>(req->wait_seconds() == 0 ? 60 : req->wait_seconds());
    compute::SnapshotResult r;
    // One snapshot at a time from this service; others are refused by the freeze word.
    std::lock_guard g(snapshot_mu_);
    if (Status s = answered([&] { r = compute::snapshot_index(c_, req->dir(), wait_ms); }); !s.ok()) return s;
    for (const auto& i : r.images) {
      auto* out = resp->add_images();
      out->set_memnode(i.memnode_id);
      out->set_path(i.path);
      out->set_file_bytes(i.file_bytes);
      out->set_checksum(i.checksum);
    }
    resp->set_pause_seconds(r.pause.wait_s + r.store_seconds);
    resp->set_writers(r.pause.writers - r.pause.dead);
    return Status::OK;
  }

  RequestLimits limits() const {
    return RequestLimits{info_.dim, o_.max_k, o_.max_batch, info_.partitions, info_.mode == "shine"};
  }

  Status authorize(ServerContext* ctx) const {
    if (o_.token.empty()) return Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("dmhnsw-token");
    if (it == md.end()) return Status(StatusCode::UNAUTHENTICATED, "no dmhnsw-token in the call's metadata");
    const auto& got = it->second;
    if (got.size() != o_.token.size() || CRYPTO_memcmp(got.data(), o_.token.data(), got.size()) != 0)
      return Status(StatusCode::UNAUTHENTICATED, "dmhnsw-token: not this cluster's token");
    return Status::OK;
  }

  Backend& b_;
  const ServeOptions& o_;
  IndexInfo info_;
  Registry& r_;
  fabric::Cluster& c_;
  compute::WriteGate& gate_;
  std::mutex snapshot_mu_;
  MethodMetrics search_m_, insert_m_, delete_m_, info_m_, snapshot_m_;
  Gauge& inflight_;
};

/// HOST and PORT of HOST:PORT (naming the flag when it is not that); the host may be [v6].
std::pair<std::string, int> split_listen(const std::string& flag, const std::string& v) {
  const auto colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) throw std::invalid_argument(flag + " " + v + ": want HOST:PORT");
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) throw std::invalid_argument(flag + " " + v + ": the port is not a number 0 .. 65535");
  return {v.substr(0, colon), port};
}

/// Whether something listens on HOST:PORT: a plain bind there fails with EADDRINUSE.
bool port_in_use(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo* res = nullptr;
  if (getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) return false;
  const int fd = socket(res->ai_family, SOCK_STREAM, 0);
  bool in_use = false;
  if (fd >= 0) {
    in_use = bind(fd, res->ai_addr, res->ai_addrlen) != 0 && errno == EADDRINUSE;
    close(fd);
  }
  freeaddrinfo(res);
  return in_use;
}

bool loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "[::1]" || host == "::1";
}

}  // namespace

BackendMetrics::BackendMetrics(Registry& r, const std::string& mode)
    : reads(r.counter("dmhnsw_remote_reads_total", "one-sided READs posted to the memnodes", {{"mode", mode}})),
      writes(r.counter("dmhnsw_remote_writes_total", "one-sided WRITEs posted to the memnodes", {{"mode", mode}})),
      atomics(r.counter("dmhnsw_remote_atomics_total", "FETCH_ADD and COMPARE_SWAP posted", {{"mode", mode}})),
      doorbells(r.counter("dmhnsw_doorbells_total", "posts of one or more remote operations", {{"mode", mode}})),
      bytes(r.counter("dmhnsw_remote_bytes_total",
                      "bytes read or written remotely (loads from a mapped region count as the READs they replace)",
                      {{"mode", mode}})),
      queries(r.counter("dmhnsw_queries_total", "query vectors answered", {{"mode", mode}})),
      inserted(r.counter("dmhnsw_inserted_vectors_total", "vectors inserted and acknowledged", {{"mode", mode}})),
      deleted(r.counter("dmhnsw_deleted_vectors_total", "vectors deleted and acknowledged", {{"mode", mode}})),
      replaced(r.counter("dmhnsw_replaced_vectors_total", "upserts that replaced an id's vector", {{"mode", mode}})),
      cache_lookups(r.counter("dmhnsw_cache_lookups_total",
                              "lookups in the node cache (shine) or the sub-HNSW cache (dhnsw)",
                              {{"cache", mode == "shine" ? "node" : "sub_hnsw"}})),
      cache_hits(r.counter("dmhnsw_cache_hits_total", "lookups that found their entry",
                           {{"cache", mode == "shine" ? "node" : "sub_hnsw"}})),
      coded(r.counter("dmhnsw_coded_nodes_total", "nodes a search compared by their code (no READ; rerank)",
                      {{"mode", mode}})),
      reranked(r.counter("dmhnsw_reranked_vectors_total", "vectors re-read to re-rank what codes found (rerank)",
                         {{"mode", mode}})),
      batch_queries(r.histogram("dmhnsw_batch_queries", "queries per d-HNSW pipeline batch", size_buckets(65536))),
      epoch(r.gauge("dmhnsw_epoch", "the index's epoch (d-HNSW rebuilds)")),
      vectors(r.gauge("dmhnsw_index_vectors", "vectors in the index when last asked (Info)")),
      codes_nodes(r.gauge("dmhnsw_codes_nodes", "nodes whose code this computenode holds (shine, an index with codes)")),
      codes_bytes(r.gauge("dmhnsw_codes_bytes", "memory of those codes and their table entries")) {}

int run_serve(const compute::RunContext& rc, const ServeOptions& o) {
  const std::string host = split_listen("--listen", o.listen).first;
  if (o.token.empty() && !loopback(host))
    throw std::invalid_argument("--listen " + o.listen + ": a non-loopback address needs the cluster token "
                                "(--token-file or DMHNSW_TOKEN), which clients then send as metadata");
  std::optional<std::pair<std::string, int>> metrics_at;
  if (!o.metrics_listen.empty()) {
    metrics_at = split_listen("--metrics-listen", o.metrics_listen);
    if (o.token.empty() && !loopback(metrics_at->first))
      throw std::invalid_argument("--metrics-listen " + o.metrics_listen +
                                  ": a non-loopback address needs the cluster token, which scrapers then send as "
                                  "Authorization: Bearer TOKEN");
  }
  if (o.max_k == 0) throw std::invalid_argument("--max-k: at least 1");

  Registry registry;
  BackendMetrics bm(registry, o.mode);
  std::unique_ptr<Backend> backend;
  if (o.mode == "shine") {
    backend = make_shine_backend(rc, o.shine, bm, registry);
  } else if (o.mode == "dhnsw") {
    dhnsw::EngineOptions eo = o.dhnsw;
    eo.k = o.max_k;
    eo.ef_search = o.shine.ef_search;
    eo.in_place = o.shine.search.in_place;  // --in-place / --no-in-place, registered with shine's flags
    backend = make_dhnsw_backend(rc, eo, bm);
  } else {
    throw std::invalid_argument("--mode " + o.mode + ": serve needs shine or dhnsw");
  }
  compute::WriteGate gate(*rc.cluster);  // this process writes (Insert, Delete): a snapshot pauses it
  Service service(*backend, o, registry, *rc.cluster, gate);
  std::unique_ptr<MetricsServer> metrics;
  if (metrics_at) {
    metrics = std::make_unique<MetricsServer>(registry, metrics_at->first, metrics_at->second, o.token);
    std::printf("metrics on %s:%d\n", metrics_at->first.c_str(), metrics->port());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC binds with SO_REUSEPORT by default: a second serve on a used port would start and
  // share the clients with the first, whatever index each serves.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(o.listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    const int asked = split_listen("--listen", o.listen).second;
    if (asked != 0 && port_in_use(host, asked))
      throw std::runtime_error("--listen " + o.listen + ": port " + std::to_string(asked) +
                               " is in use (another serve, or another program, listens there); stop it or choose "
                               "another port (port 0 picks a free one)");
    throw std::runtime_error("--listen " + o.listen + ": could not listen there (is " + host +
                             " an address of this host?)");
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  std::printf("serving %s on %s:%d\n", o.mode.c_str(), host.c_str(), port);
  std::fflush(stdout);
  if (!o.ready_file.empty()) write_text_file(o.ready_file, host + ":" + std::to_string(port) + "\n", "--ready-file");
  spdlog::info("serving {} on {}:{}", o.mode, host, port);

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  // grpc.health.v1 says NOT_SERVING while a memnode id has no live copy left (its set is gone:
  // searches fail), SERVING again should it come back; load balancers and probes read it.
  bool serving = true;
  while (g_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string gone;
    for (const auto& mn : rc.cluster->memnodes())
      if (!rc.cluster->alive(mn.id)) gone = "memnode " + std::to_string(mn.id) + " (" + rc.cluster->dead_reason(mn.id) + ")";
    if (gone.empty() == serving) continue;
    serving = gone.empty();
    server->GetHealthCheckService()->SetServingStatus(serving);
    if (serving)
      spdlog::info("health: SERVING again: every memnode answers");
    else
      spdlog::warn("health: NOT_SERVING: {} has no live copy", gone);
  }
  spdlog::info("signal {}: no new calls; in-flight calls get {} s", g_signal.load(), o.grace_s);
  server->GetHealthCheckService()->SetServingStatus(false);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(o.grace_s));
  server->Wait();
  metrics.reset();
  backend.reset();
  spdlog::info("stopped");
  return 0;
}

}  // namespace dmhnsw::serve
