#include "compute/shine/engine.hpp"
#include "compute/write_gate.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "common/dataset.hpp"
#include "common/progress.hpp"
#include "common/workload.hpp"
#include "compute/shine/options.hpp"
#include "compute/board.hpp"
#include "compute/shine/run_util.hpp"

namespace dmhnsw::shine {

using nlohmann::json;

// ================================================================== build
namespace {

// Nobody of this build inserts before its first barrier, so nodes found now come from an
// earlier build; building again would insert its rows a second time under the same labels.
void check_no_index_yet(fabric::Cluster& c, fabric::Endpoint& control) {
  uint64_t nodes = 0, entry = 0;
  control.read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &nodes, 8);
  control.read(RemotePtr(0, mode_word_offset(shine_word::kEntryPoint)), &entry, 8);
  if (nodes > 0 || entry != 0)
    throw std::invalid_argument("build: the memnodes already hold a shine index of " + std::to_string(nodes) +
                                " nodes (memnode 0 at " + c.memnodes()[0].address +
                                "): add vectors with `insert --data FILE --begin ROW`, store it with `snapshot --dir DIR`, or "
                                "start the memnodes afresh (without --load) for a new index");
}

/// What inserting this computenode's share did.
struct ShareStats {
  IoStats io;
  SearchStats ss;
  std::vector<uint64_t> per_memnode;  // nodes allocated on each memnode
  fabric::Counters counters;
  double seconds = 0;
  uint64_t replaced = 0;  // upserts whose id the index held
};

/// Inserts rows `mine` of `data` with T threads x C coroutines. A watcher stops the share at
/// once when a peer of the run left (the build cannot complete without it; its last barrier
/// would only fail later).
ShareStats insert_share(const RunContext& rc, const BuildOptions& o, Graph& g, const GraphParams& p,
                        compute::Board& board, const FloatMatrix& data, const std::vector<uint32_t>& mine,
                        VectorCache* vcache, compute::WriteGate& gate) {
  fabric::Cluster& c = *rc.cluster;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  ShareStats st;
  std::atomic<uint64_t> replaced{0};
  st.per_memnode.assign(c.memnodes().size(), 0);
  auto t0 = Clock::now();
  ProgressOptions po;
  po.enabled = o.progress;
  std::string what = o.format ? "shine build" : o.upsert ? "shine upsert" : "shine insert";
  if (rc.num_cns > 1) what += " (computenode " + std::to_string(rc.cn_id) + ")";
  Progress inserted(what, mine.size(), "vectors", po);  // counts this computenode's inserts
  std::thread watcher;
  std::atomic<bool> finished{false};
  std::string peer_gone;  // set by the watcher before it sets stop
  if (rc.num_cns > 1) watcher = std::thread([&, watch = c.make_endpoint(1u << 20)] {
    while (!finished.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (stop.load()) continue;
      try {
        if (auto gone = board.left_peer(*watch)) {
          peer_gone = board.gone_message(*gone);
          stop.store(true);
        }
      } catch (const std::exception&) {
        // memnode 0 unreachable: the workers' own operations fail and say so
      }
    }
  });
  try {
    parallel(c, o.threads, stop, [&](uint32_t t, fabric::Endpoint& ep) {
      compute::Scheduler s(ep);
      Worker w(g, s, p.seed * 1000003 + rc.cn_id * 1009 + t, vcache);
      std::vector<OpContext> ctxs(o.coroutines);
      const bool in_place = o.in_place && maps_regions(ep);
      for (auto& x : ctxs) {
        x.mode = o.mode;
        x.in_place = in_place;
      }
      auto loop = [&](OpContext& ctx) -> compute::Task<void> {
        for (;;) {
          if (stop.load() || gate.closing()) co_return;  // a snapshot: finish, release the pass
          size_t i = next.fetch_add(1);
          if (i >= mine.size()) co_return;
          uint32_t row = mine[i];
          const bool was = co_await w.insert(data.row(row), o.ids.empty() ? row : o.ids[row], ctx, o.upsert);
          if (was) replaced.fetch_add(1);
          inserted.add();
        }
      };
      // The thread's inserts under one pass of the write gate, given up while a snapshot runs.
      while (!stop.load() && next.load() < mine.size()) {
        compute::WriteGate::Pass pass(gate);
        for (auto& ctx : ctxs) s.spawn(loop(ctx));
        s.run();
      }
      std::lock_guard gd(mu);
      for (auto& x : ctxs) {
        for (size_t i = 0; i < x.allocated.size() && i < st.per_memnode.size(); ++i) st.per_memnode[i] += x.allocated[i];
        st.io += x.io;
        st.ss.visited += x.search.visited;
        st.ss.hops += x.search.hops;
        st.ss.skipped += x.search.skipped;
        st.ss.reused += x.search.reused;
      }
      st.counters += ep.counters();
    });
  } catch (...) {
    finished.store(true);
    if (watcher.joinable()) watcher.join();
    throw;
  }
  finished.store(true);
  if (watcher.joinable()) watcher.join();
  if (peer_gone.empty()) inserted.finish();  // else the error below says how far it got
  if (!peer_gone.empty())
    throw fabric::FabricError(std::string(o.format ? "build" : "insert") + ": " + peer_gone + "; stopped after " +
                              std::to_string(inserted.done()) + " of this computenode's " + std::to_string(mine.size()) +
                              " rows");
  st.seconds = seconds_since(t0);
  st.replaced = replaced.load();
  return st;
}

/// Computenode 0: every computenode's share merged, and what each memnode holds now.
void merge_build(fabric::Cluster& c, fabric::Endpoint& control, const std::vector<std::string>& texts, json& report) {
  json per_cn = json::array();
  double max_secs = 0;
  uint64_t bytes_written = 0, ops = 0, doorbells = 0, inserted_all = 0, replaced_all = 0, reused_all = 0;
  std::vector<uint64_t> nodes_on(c.memnodes().size(), 0);
  for (auto& text : texts) {
    json j = json::parse(text);
    auto per = j["nodes_per_memnode"].get<std::vector<uint64_t>>();
    for (size_t i = 0; i < per.size() && i < nodes_on.size(); ++i) nodes_on[i] += per[i];
    max_secs = std::max(max_secs, j["seconds"].get<double>());
    bytes_written += j["io"]["bytes"].get<uint64_t>();
    ops += j["ops"].get<uint64_t>();
    doorbells += j["doorbells"].get<uint64_t>();
    inserted_all += j["inserted"].get<uint64_t>();
    replaced_all += j.value("replaced", uint64_t{0});
    reused_all += j.value("records_reused", uint64_t{0});
    per_cn.push_back(j);
  }
  // Nodes per memnode: the bump pointers tell the bytes used; node count from memnode 0.
  json mems = json::array();
  for (const auto& mn : c.memnodes()) {
    RegionHeader h;
    control.read(RemotePtr(mn.id, 0), &h, sizeof h);
    mems.push_back({{"id", mn.id}, {"address", mn.address}, {"nodes_inserted_here", nodes_on[mn.id]},
                    {"bytes_used", h.mode_words[shine_word::kBump] - h.data_offset},
                    {"region_bytes", h.region_size}});
  }
  uint64_t nodes = 0;
  control.read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &nodes, 8);
  report["seconds"] = max_secs;
  report["inserted"] = inserted_all;
  report["replaced"] = replaced_all;
  report["records_reused"] = reused_all;
  report["inserts_per_s"] = static_cast<double>(inserted_all) / std::max(max_secs, 1e-9);
  report["remote_bytes"] = bytes_written;
  report["ops"] = ops;
  report["doorbells"] = doorbells;
  report["index_nodes"] = nodes;
  report["memnode_usage"] = mems;
  report["per_cn"] = per_cn;
}

}  // namespace

json run_build(const RunContext& rc, const BuildOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  LoadOptions lo;
  lo.max_rows = o.max_elements == 0 ? LoadOptions{}.max_rows : o.max_elements;
  FloatMatrix data = load_vectors_as_float(o.data, lo);
  GraphParams want = o.params;
  want.dim = static_cast<uint32_t>(data.d());
  if (o.format && o.codes.enabled()) {  // rows evenly spread over the data
    want.codes = compute::Quantizer::train_spread(o.codes, data.n(), want.dim, want.metric,
                                                  [&](size_t i) { return data.row(i); });
  }
  if (o.format) check_room_for_build(c, want, data.n());
  auto control = c.make_endpoint(16u << 20);
  GraphParams p = format_or_attach(c, *control, o.format ? &want : nullptr, rc.cn_id);
  if (!o.format && p.dim != data.d())
    throw fabric::FabricError("--data " + o.data + " has dimension " + std::to_string(data.d()) + ", the index " +
                              std::to_string(p.dim));
  if (o.format) check_no_index_yet(c, *control);
  Graph g(c, p);

  size_t end = o.end == 0 ? data.n() : std::min(o.end, data.n());
  if (o.begin >= end) throw std::invalid_argument("--begin " + std::to_string(o.begin) + " is past the data's " +
                                                  std::to_string(end) + " rows");
  // My share: rows begin + j*K + cn_id.
  std::vector<uint32_t> mine;
  for (size_t i = o.begin + rc.cn_id; i < end; i += rc.num_cns) mine.push_back(static_cast<uint32_t>(i));

  if ((!o.ids.empty() || o.upsert) && p.ids.buckets == 0)
    throw std::invalid_argument(std::string(o.upsert ? "upsert" : "--ids") +
                                ": this shine index has no id index (build it with --id-capacity N)");
  if (!o.ids.empty() && o.ids.size() < end)
    throw std::invalid_argument("--ids has " + std::to_string(o.ids.size()) + " ids; rows [" + std::to_string(o.begin) +
                                ", " + std::to_string(end) + ") of --data " + o.data + " need " + std::to_string(end));
  compute::Board board(c, *control, rc.cn_id, rc.num_cns, o.format ? "build" : o.upsert ? "upsert" : "insert",
                       rc.departed_at_connect);
  if (o.format) board.barrier();  // everyone formatted/attached before anyone inserts
  if (!mine.empty() && o.ids.empty()) raise_id_ceiling(*control, uint64_t{mine.back()} + 1);  // labels are row ids

  // A vector read once never changes unless its record is reused after a delete: the inserts
  // forget those from the reuse log (from where it stands now: this cache is empty).
  VectorCache vcache(o.cache_bytes, p.dim);
  uint64_t reused = 0;
  control->read(RemotePtr(0, mode_word_offset(shine_word::kReused)), &reused, 8);
  vcache.set_applied(reused);
  compute::WriteGate gate(c);
  const ShareStats st = insert_share(rc, o, g, p, board, data, mine, &vcache, gate);
  json mine_j = {{"cn_id", rc.cn_id}, {"inserted", mine.size()}, {"replaced", st.replaced}, {"seconds", st.seconds},
                 {"inserts_per_s", static_cast<double>(mine.size()) / st.seconds}, {"io", io_json(st.io)},
                 {"doorbells", st.counters.doorbells}, {"ops", st.counters.total_ops()},
                 {"nodes_visited", st.ss.visited}, {"lists_read", st.ss.hops}, {"nodes_per_memnode", st.per_memnode},
                 {"records_reused", st.ss.reused},
                 {"vector_cache", {{"entries", vcache.entries()}, {"bytes", vcache.bytes()}}}};
  uint64_t gen = board.barrier();
  board.publish(gen, mine_j.dump());
  json report = {{"mode", "shine"}, {"kind", o.format ? "build" : o.upsert ? "upsert" : "insert"},
                 {"provider", rc.provider}, {"data", o.data},
                 {"n", end - o.begin}, {"dim", p.dim}, {"m", p.m}, {"ef_construction", p.ef_construction},
                 {"metric", std::string(to_string(p.metric))}, {"num_cns", rc.num_cns}, {"threads", o.threads},
                 {"coroutines", o.coroutines}, {"memnodes", c.memnodes().size()},
                 {"in_place", o.in_place && maps_regions(*control)}};
  if (p.codes)
    report["codes"] = {{"kind", p.codes->spec().to_string()}, {"code_size", p.codes->code_size()},
                       {"log_capacity", p.codes_log.capacity}, {"block_bytes", p.codes_block_bytes}};
  if (rc.cn_id != 0) {
    report["cn"] = mine_j;
    return report;
  }
  merge_build(c, *control, board.gather(gen), report);
  return report;
}

// ================================================================== delete
json run_delete(const RunContext& rc, const DeleteOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  auto control = c.make_endpoint(16u << 20);
  const GraphParams p = format_or_attach(c, *control, nullptr, rc.cn_id);
  if (p.ids.buckets == 0)
    throw std::invalid_argument("delete: this shine index has no id index (build it with --id-capacity N)");
  // The whole run under one pass of the write gate: a snapshot waits until it is done.
  compute::WriteGate gate(c);
  compute::WriteGate::Pass pass(gate);
  Graph g(c, p);
  std::vector<uint64_t> mine;
  for (size_t i = rc.cn_id; i < o.ids.size(); i += rc.num_cns) mine.push_back(o.ids[i]);
  compute::Board board(c, *control, rc.cn_id, rc.num_cns, "delete", rc.departed_at_connect);
  std::atomic<bool> stop{false};
  std::vector<char> removed(mine.size(), 0);
  IoStats io;
  ProgressOptions po;
  po.enabled = o.progress;
  Progress done("shine delete", mine.size(), "ids", po);
  const auto t0 = Clock::now();
  for (const OpContext& x : each_item<Worker, OpContext>(c, g, o.threads, o.coroutines, p.seed * 7919 + rc.cn_id * 1009,
                                                         mine.size(), stop,
                                                         [&](Worker& w, size_t i, OpContext& ctx) -> compute::Task<void> {
                                                           removed[i] = co_await w.remove(mine[i], ctx);
                                                           done.add();
                                                         }))
    io += x.io;
  std::vector<uint64_t> absent;
  for (size_t i = 0; i < mine.size(); ++i)
    if (!removed[i]) absent.push_back(mine[i]);
  done.finish();
  const double secs = seconds_since(t0);
  std::sort(absent.begin(), absent.end());
  constexpr size_t kListed = 1000;  // the report lists this many absent ids (the count is exact)
  json mine_j = {{"cn_id", rc.cn_id}, {"requested", mine.size()}, {"deleted", mine.size() - absent.size()},
                 {"not_found", absent.size()},
                 {"not_found_ids", std::vector<uint64_t>(absent.begin(), absent.begin() + std::min(absent.size(), kListed))},
                 {"seconds", secs}, {"deletes_per_s", static_cast<double>(mine.size()) / std::max(secs, 1e-9)},
                 {"io", io_json(io)}};
  const uint64_t gen = board.barrier();
  board.publish(gen, mine_j.dump());
  json report = {{"mode", "shine"}, {"kind", "delete"}, {"provider", rc.provider}, {"num_cns", rc.num_cns},
                 {"threads", o.threads}, {"coroutines", o.coroutines}};
  if (rc.cn_id != 0) {
    report["cn"] = mine_j;
    return report;
  }
  uint64_t requested = 0, deleted = 0, not_found = 0;
  double max_secs = 0;
  json listed = json::array(), per_cn = json::array();
  for (const auto& text : board.gather(gen)) {
    json j = json::parse(text);
    requested += j["requested"].get<uint64_t>();
    deleted += j["deleted"].get<uint64_t>();
    not_found += j["not_found"].get<uint64_t>();
    max_secs = std::max(max_secs, j["seconds"].get<double>());
    for (auto& id : j["not_found_ids"])
      if (listed.size() < kListed) listed.push_back(id);
    per_cn.push_back(j);
  }
  uint64_t tombstones = 0, reused = 0, nodes = 0;
  control->read(RemotePtr(0, mode_word_offset(shine_word::kDeleted)), &tombstones, 8);
  control->read(RemotePtr(0, mode_word_offset(shine_word::kReused)), &reused, 8);
  tombstones -= std::min(tombstones, reused);
  control->read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &nodes, 8);
  report.update({{"requested", requested}, {"deleted", deleted}, {"not_found", not_found}, {"not_found_ids", listed},
                 {"seconds", max_secs}, {"deletes_per_s", static_cast<double>(requested) / std::max(max_secs, 1e-9)},
                 {"index_nodes", nodes}, {"index_deleted", tombstones}, {"per_cn", per_cn}});
  return report;
}

// ================================================================== printing
void print_delete(const json& r) {
  if (!r.contains("deleted")) return;
  std::printf("shine delete: %llu of %llu ids deleted, %llu not in the index, %.2f s (%.0f deletes/s); the index has "
              "%llu nodes, %llu of them deleted\n",
              static_cast<unsigned long long>(r["deleted"].get<uint64_t>()),
              static_cast<unsigned long long>(r["requested"].get<uint64_t>()),
              static_cast<unsigned long long>(r["not_found"].get<uint64_t>()), r["seconds"].get<double>(),
              r["deletes_per_s"].get<double>(), static_cast<unsigned long long>(r["index_nodes"].get<uint64_t>()),
              static_cast<unsigned long long>(r["index_deleted"].get<uint64_t>()));
  if (r["not_found"].get<uint64_t>() > 0) {
    std::printf("  not in the index:");
    size_t shown = 0;  // the report lists up to 1,000
    for (auto& id : r["not_found_ids"])
      if (shown++ < 20) std::printf(" %llu", static_cast<unsigned long long>(id.get<uint64_t>()));
    if (r["not_found"].get<uint64_t>() > 20) std::printf(" ... (%llu in all)", static_cast<unsigned long long>(r["not_found"].get<uint64_t>()));
    std::printf("\n");
  }
}

void print_build(const json& r) {
  if (!r.contains("inserted")) return;
  std::printf("shine %s: %llu vectors (dim %u, M %u, efC %u) by %u computenode(s) x %u threads x %u coroutines\n",
              r.value("kind", std::string("build")).c_str(), static_cast<unsigned long long>(r["inserted"].get<uint64_t>()), r["dim"].get<unsigned>(),
              r["m"].get<unsigned>(), r["ef_construction"].get<unsigned>(), r["num_cns"].get<unsigned>(),
              r["threads"].get<unsigned>(), r["coroutines"].get<unsigned>());
  if (r.value("replaced", uint64_t{0}) > 0)
    std::printf("  %llu of them replaced an id's vector (its old node is deleted)\n",
                static_cast<unsigned long long>(r["replaced"].get<uint64_t>()));
  std::printf("  %.2f s, %.0f inserts/s, %.1f MiB moved, %llu ops in %llu doorbells, %llu nodes in the index\n",
              r["seconds"].get<double>(), r["inserts_per_s"].get<double>(),
              static_cast<double>(r["remote_bytes"].get<uint64_t>()) / (1 << 20),
              static_cast<unsigned long long>(r["ops"].get<uint64_t>()),
              static_cast<unsigned long long>(r["doorbells"].get<uint64_t>()),
              static_cast<unsigned long long>(r["index_nodes"].get<uint64_t>()));
  for (auto& m : r["memnode_usage"])
    std::printf("  memnode %u (%s): %llu nodes from this build, %.1f MiB used of %.0f MiB\n", m["id"].get<unsigned>(),
                m["address"].get<std::string>().c_str(),
                static_cast<unsigned long long>(m["nodes_inserted_here"].get<uint64_t>()),
                static_cast<double>(m["bytes_used"].get<uint64_t>()) / (1 << 20),
                static_cast<double>(m["region_bytes"].get<uint64_t>()) / (1 << 20));
  if (r.contains("codes"))
    std::printf("  codes %s: %llu bytes per vector (Faiss), a log of %llu entries per memnode\n",
                r["codes"]["kind"].get<std::string>().c_str(),
                static_cast<unsigned long long>(r["codes"]["code_size"].get<uint64_t>()),
                static_cast<unsigned long long>(r["codes"]["log_capacity"].get<uint64_t>()));
}

void print_query(const json& r) {
  if (!r.contains("runs")) return;
  std::printf("shine query: %s, k=%u, %u computenode(s) x %u threads x %u coroutines, reads %s, provider %s\n",
              r["distribution"].get<std::string>().c_str(), r["k"].get<unsigned>(), r["num_cns"].get<unsigned>(),
              r["threads"].get<unsigned>(), r["coroutines"].get<unsigned>(), r["read_mode"].get<std::string>().c_str(),
              r["provider"].get<std::string>().c_str());
  const bool cached = r.contains("cache") && r["cache"]["enabled"].get<bool>();
  if (cached)
    std::printf("  node cache %.1f MiB per computenode (%llu %s), routing %s\n",
                static_cast<double>(r["cache"]["capacity_bytes"].get<uint64_t>()) / (1 << 20),
                static_cast<unsigned long long>(r["cache"]["capacity_entries"].get<uint64_t>()),
                r["cache"].value("holds", std::string("vectors")) == "lists" ? "neighbour lists" : "vectors",
                r.value("routing", std::string("none")).c_str());
  else
    std::printf("  no node cache, routing %s\n", r.value("routing", std::string("none")).c_str());
  std::printf("%8s %9s %9s %10s %10s %9s %8s %9s %10s %11s %12s %7s\n", "efSearch", "recall", "QPS", "p50 us", "p99 us",
              "visited", "READs", "doorbells", "KiB/query", "QPS@56Gb/s", "QPS@100Gb/s", "CHR");
  for (auto& run : r["runs"]) {
    auto& pq = run["per_query"];
    std::printf("%8u %9.4f %9.0f %10.1f %10.1f %9.1f %8.1f %9.1f %10.1f %11.0f %12.0f %7.3f\n",
                run["ef_search"].get<unsigned>(), run["recall"].get<double>(), run["qps"].get<double>(),
                run["latency_us"]["p50"].get<double>(), run["latency_us"]["p99"].get<double>(),
                pq["visited"].get<double>(), pq["reads"].get<double>(), pq["doorbells"].get<double>(),
                pq["bytes"].get<double>() / 1024, run["network_bound_qps"]["56Gbps"].get<double>(),
                run["network_bound_qps"]["100Gbps"].get<double>(), run.value("cache_hit_rate", 0.0));
    if (r["num_cns"].get<unsigned>() > 1) {
      for (auto& c : run["per_cn"])
        std::printf("    cn %u: %llu answered (%llu own input, %llu routed away, %llu received), CHR %.3f, %.0f QPS, "
                    "%.2f CPU s\n",
                    c["cn_id"].get<unsigned>(), static_cast<unsigned long long>(c["queries"].get<uint64_t>()),
                    static_cast<unsigned long long>(c.value("input", uint64_t{0})),
                    static_cast<unsigned long long>(c.value("routed_away", uint64_t{0})),
                    static_cast<unsigned long long>(c.value("received", uint64_t{0})),
                    c.contains("cache") ? c["cache"]["hit_rate"].get<double>() : 0.0, c["qps"].get<double>(),
                    c.value("cpu_seconds", 0.0));
    }
    for (auto& g : run.value("computenodes_gone", json::array()))
      std::printf("    computenode %u is gone: %s\n", g["cn_id"].get<unsigned>(), g["why"].get<std::string>().c_str());
  }
}

}  // namespace dmhnsw::shine
