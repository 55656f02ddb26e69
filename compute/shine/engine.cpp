#include "compute/shine/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "common/dataset.hpp"
#include "common/workload.hpp"
#include "compute/board.hpp"

namespace dmhnsw::shine {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Runs `body(thread_index, endpoint)` on T threads; the first exception stops the others
/// (through `stop`) and is rethrown.
template <class F>
void parallel(fabric::Cluster& c, uint32_t threads, std::atomic<bool>& stop, F body) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      try {
        auto ep = c.make_endpoint(64u << 20);
        body(t, *ep);
      } catch (...) {
        std::lock_guard g(mu);
        if (!first) first = std::current_exception();
        stop.store(true);
      }
    });
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

json io_json(const IoStats& s) {
  return {{"reads", s.reads}, {"writes", s.writes}, {"atomics", s.atomics}, {"bytes", s.bytes}, {"doorbells", s.doorbells}};
}

double percentile(std::vector<float>& v, double p) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(i), v.end());
  return v[i];
}

const char* mode_name(ReadMode m) { return m == ReadMode::Batch ? "batch" : "per-read"; }

}  // namespace

// ================================================================== build
json run_build(const RunContext& rc, const BuildOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  LoadOptions lo;
  lo.max_rows = o.max_elements == 0 ? LoadOptions{}.max_rows : o.max_elements;
  FloatMatrix data = load_vectors_as_float(o.data, lo);
  GraphParams want = o.params;
  want.dim = static_cast<uint32_t>(data.d());
  auto control = c.make_endpoint(16u << 20);
  GraphParams p = format_or_attach(c, *control, o.format ? &want : nullptr);
  if (!o.format && p.dim != data.d())
    throw fabric::FabricError("--data " + o.data + " has dimension " + std::to_string(data.d()) + ", the index " +
                              std::to_string(p.dim));
  Graph g(c, p);

  size_t end = o.end == 0 ? data.n() : std::min(o.end, data.n());
  if (o.begin >= end) throw std::invalid_argument("--begin " + std::to_string(o.begin) + " is past the data's " +
                                                  std::to_string(end) + " rows");
  // My share: rows begin + j*K + cn_id.
  std::vector<uint32_t> mine;
  for (size_t i = o.begin + rc.cn_id; i < end; i += rc.num_cns) mine.push_back(static_cast<uint32_t>(i));

  compute::Board board(c, *control, rc.cn_id, rc.num_cns, o.format ? "build" : "insert");
  if (o.format) board.barrier();  // everyone formatted/attached before anyone inserts

  std::atomic<size_t> next{0}, done{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  VectorCache vcache(o.cache_bytes);
  IoStats io;
  SearchStats ss;
  std::vector<uint64_t> per_memnode(c.memnodes().size(), 0);
  fabric::Counters counters;
  auto t0 = Clock::now();
  std::thread progress;
  std::atomic<bool> finished{false};
  if (o.progress)
    progress = std::thread([&] {
      auto last = Clock::now();
      while (!finished.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (Clock::now() - last < std::chrono::seconds(2)) continue;
        last = Clock::now();
        size_t d = done.load();
        spdlog::info("build: {} / {} inserted ({:.0f} inserts/s)", d, mine.size(), static_cast<double>(d) / secs_since(t0));
      }
    });
  try {
    parallel(c, o.threads, stop, [&](uint32_t t, fabric::Endpoint& ep) {
      compute::Scheduler s(ep);
      Worker w(g, s, p.seed * 1000003 + rc.cn_id * 1009 + t, &vcache);
      std::vector<OpContext> ctxs(o.coroutines);
      for (auto& x : ctxs) x.mode = o.mode;
      auto loop = [&](OpContext& ctx) -> compute::Task<void> {
        for (;;) {
          if (stop.load()) co_return;
          size_t i = next.fetch_add(1);
          if (i >= mine.size()) co_return;
          uint32_t row = mine[i];
          co_await w.insert(data.row(row), row, ctx);
          done.fetch_add(1);
        }
      };
      for (auto& ctx : ctxs) s.spawn(loop(ctx));
      s.run();
      std::lock_guard gd(mu);
      for (auto& x : ctxs) {
        for (size_t i = 0; i < x.allocated.size() && i < per_memnode.size(); ++i) per_memnode[i] += x.allocated[i];
        io += x.io;
        ss.visited += x.search.visited;
        ss.hops += x.search.hops;
        ss.skipped += x.search.skipped;
      }
      counters += ep.counters();
    });
  } catch (...) {
    finished.store(true);
    if (progress.joinable()) progress.join();
    throw;
  }
  finished.store(true);
  if (progress.joinable()) progress.join();
  double secs = secs_since(t0);

  json mine_j = {{"cn_id", rc.cn_id}, {"inserted", mine.size()}, {"seconds", secs},
                 {"inserts_per_s", static_cast<double>(mine.size()) / secs}, {"io", io_json(io)},
                 {"doorbells", counters.doorbells}, {"ops", counters.total_ops()},
                 {"nodes_visited", ss.visited}, {"lists_read", ss.hops}, {"nodes_per_memnode", per_memnode},
                 {"vector_cache", {{"entries", vcache.entries()}, {"bytes", vcache.bytes()}}}};
  uint64_t gen = board.barrier();
  board.publish(gen, mine_j.dump());
  json report = {{"mode", "shine"}, {"kind", "build"}, {"provider", rc.provider}, {"data", o.data},
                 {"n", end - o.begin}, {"dim", p.dim}, {"m", p.m}, {"ef_construction", p.ef_construction},
                 {"metric", std::string(to_string(p.metric))}, {"num_cns", rc.num_cns}, {"threads", o.threads},
                 {"coroutines", o.coroutines}, {"memnodes", c.memnodes().size()}};
  if (rc.cn_id != 0) {
    report["cn"] = mine_j;
    return report;
  }
  json per_cn = json::array();
  double max_secs = 0;
  uint64_t bytes_written = 0, ops = 0, doorbells = 0, inserted = 0;
  std::vector<uint64_t> nodes_on(c.memnodes().size(), 0);
  for (auto& text : board.gather(gen)) {
    json j = json::parse(text);
    auto per = j["nodes_per_memnode"].get<std::vector<uint64_t>>();
    for (size_t i = 0; i < per.size() && i < nodes_on.size(); ++i) nodes_on[i] += per[i];
    max_secs = std::max(max_secs, j["seconds"].get<double>());
    bytes_written += j["io"]["bytes"].get<uint64_t>();
    ops += j["ops"].get<uint64_t>();
    doorbells += j["doorbells"].get<uint64_t>();
    inserted += j["inserted"].get<uint64_t>();
    per_cn.push_back(j);
  }
  // Nodes per memnode: the bump pointers tell the bytes used; node count from memnode 0.
  json mems = json::array();
  for (const auto& mn : c.memnodes()) {
    RegionHeader h;
    control->read(RemotePtr(mn.id, 0), &h, sizeof h);
    mems.push_back({{"id", mn.id}, {"address", mn.address}, {"nodes_inserted_here", nodes_on[mn.id]},
                    {"bytes_used", h.mode_words[shine_word::kBump] - h.data_offset},
                    {"region_bytes", h.region_size}});
  }
  uint64_t nodes = 0;
  control->read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &nodes, 8);
  report["seconds"] = max_secs;
  report["inserted"] = inserted;
  report["inserts_per_s"] = static_cast<double>(inserted) / std::max(max_secs, 1e-9);
  report["remote_bytes"] = bytes_written;
  report["ops"] = ops;
  report["doorbells"] = doorbells;
  report["index_nodes"] = nodes;
  report["memnode_usage"] = mems;
  report["per_cn"] = per_cn;
  return report;
}

// ================================================================== query
json run_query(const RunContext& rc, const QueryOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  Workload wl = read_workload(o.workload);
  if (o.k > wl.k())
    throw std::invalid_argument("--k " + std::to_string(o.k) + ": the workload's ground truth has only " +
                                std::to_string(wl.k()) + " ids per query");
  auto control = c.make_endpoint(16u << 20);
  GraphParams p = format_or_attach(c, *control, nullptr);
  if (p.dim != wl.dim())
    throw std::invalid_argument("--workload " + o.workload + " has dimension " + std::to_string(wl.dim()) +
                                ", the index " + std::to_string(p.dim));
  Graph g(c, p);
  compute::Board board(c, *control, rc.cn_id, rc.num_cns, "query");

  std::vector<uint32_t> warm, measured;
  for (uint64_t i = rc.cn_id; i < wl.total(); i += rc.num_cns) (wl.is_warmup(i) ? warm : measured).push_back(static_cast<uint32_t>(i));

  struct PerQuery {
    float latency_us;
    float recall;
    IoStats io;
    SearchStats ss;
  };
  // Runs `items` (stream positions) with T threads x C coroutines; `out` gets one row each.
  auto run_items = [&](const std::vector<uint32_t>& items, uint32_t ef, double min_seconds,
                       std::vector<PerQuery>& out) -> double {
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex mu;
    auto t0 = Clock::now();
    auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(min_seconds));
    parallel(c, o.threads, stop, [&](uint32_t t, fabric::Endpoint& ep) {
      compute::Scheduler s(ep);
      Worker w(g, s, p.seed + t);
      std::vector<PerQuery> local;
      std::vector<OpContext> ctxs(o.coroutines);
      for (auto& x : ctxs) x.mode = o.mode;
      auto loop = [&](OpContext& ctx) -> compute::Task<void> {
        for (;;) {
          if (stop.load() || items.empty()) co_return;
          size_t i = next.fetch_add(1);
          if (i >= items.size() && (min_seconds <= 0 || Clock::now() >= deadline)) co_return;
          uint32_t pos = items[i % items.size()];
          ctx.io = IoStats{};
          ctx.search = SearchStats{};
          auto q0 = Clock::now();
          std::vector<Neighbor> res = co_await w.search(wl.queries.row(pos), o.k, ef, ctx);
          float lat = static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - q0).count());
          const int32_t* gt = wl.groundtruth.row(pos);
          uint32_t hits = 0;
          for (const auto& r : res)
            for (uint32_t j = 0; j < o.k; ++j)
              if (static_cast<uint32_t>(gt[j]) == r.label) {
                ++hits;
                break;
              }
          local.push_back({lat, static_cast<float>(hits) / static_cast<float>(o.k), ctx.io, ctx.search});
        }
      };
      for (auto& ctx : ctxs) s.spawn(loop(ctx));
      s.run();
      std::lock_guard gd(mu);
      out.insert(out.end(), local.begin(), local.end());
    });
    return secs_since(t0);
  };

  json report = {{"mode", "shine"}, {"kind", "query"}, {"provider", rc.provider}, {"workload", o.workload},
                 {"distribution", wl.distribution}, {"k", o.k}, {"num_cns", rc.num_cns}, {"threads", o.threads},
                 {"coroutines", o.coroutines}, {"read_mode", mode_name(o.mode)}, {"memnodes", c.memnodes().size()},
                 {"index", {{"dim", p.dim}, {"m", p.m}, {"ef_construction", p.ef_construction},
                            {"metric", std::string(to_string(p.metric))}}}};
  board.barrier();
  if (!warm.empty()) {
    std::vector<PerQuery> ignored;
    run_items(warm, o.ef_search.front(), 0, ignored);
  }
  for (uint32_t ef : o.ef_search) {
    board.barrier();  // the measured part starts together
    std::vector<PerQuery> rows;
    double secs = run_items(measured, ef, o.repeat_seconds, rows);
    std::vector<float> lat;
    double recall = 0;
    IoStats io;
    SearchStats ss;
    for (auto& r : rows) {
      lat.push_back(r.latency_us);
      recall += r.recall;
      io += r.io;
      ss.visited += r.ss.visited;
      ss.hops += r.ss.hops;
      ss.skipped += r.ss.skipped;
    }
    // At most 8192 latencies per computenode travel to computenode 0 (an even subsample).
    if (lat.size() > 8192) {
      std::vector<float> sub;
      for (size_t i = 0; i < 8192; ++i) sub.push_back(lat[i * lat.size() / 8192]);
      lat.swap(sub);
    }
    json mine = {{"cn_id", rc.cn_id}, {"queries", rows.size()}, {"seconds", secs}, {"recall_sum", recall},
                 {"io", io_json(io)}, {"visited", ss.visited}, {"hops", ss.hops}, {"skipped", ss.skipped},
                 {"latencies_us", lat}};
    uint64_t gen = board.barrier();
    board.publish(gen, mine.dump());
    if (rc.cn_id != 0) continue;
    // Computenode 0 merges everyone's numbers.
    std::vector<float> all_lat;
    double max_secs = 0, recall_sum = 0;
    uint64_t queries = 0, visited = 0, hops = 0, skipped = 0;
    IoStats all_io;
    json per_cn = json::array();
    for (auto& text : board.gather(gen)) {
      json j = json::parse(text);
      auto l = j["latencies_us"].get<std::vector<float>>();
      all_lat.insert(all_lat.end(), l.begin(), l.end());
      max_secs = std::max(max_secs, j["seconds"].get<double>());
      recall_sum += j["recall_sum"].get<double>();
      queries += j["queries"].get<uint64_t>();
      visited += j["visited"].get<uint64_t>();
      hops += j["hops"].get<uint64_t>();
      skipped += j["skipped"].get<uint64_t>();
      all_io.reads += j["io"]["reads"].get<uint64_t>();
      all_io.bytes += j["io"]["bytes"].get<uint64_t>();
      all_io.doorbells += j["io"]["doorbells"].get<uint64_t>();
      j.erase("latencies_us");
      j["qps"] = j["queries"].get<double>() / std::max(j["seconds"].get<double>(), 1e-9);
      per_cn.push_back(j);
    }
    double nq = static_cast<double>(std::max<uint64_t>(queries, 1));
    double bytes_per_q = static_cast<double>(all_io.bytes) / nq;
    double mean_lat = 0;
    for (float x : all_lat) mean_lat += x;
    mean_lat /= static_cast<double>(std::max<size_t>(all_lat.size(), 1));
    json run = {{"ef_search", ef},
                {"queries", queries},
                {"seconds", max_secs},
                {"qps", static_cast<double>(queries) / std::max(max_secs, 1e-9)},
                {"recall", recall_sum / nq},
                {"latency_us", {{"p50", percentile(all_lat, 0.5)}, {"p99", percentile(all_lat, 0.99)}, {"mean", mean_lat}}},
                {"per_query",
                 {{"visited", static_cast<double>(visited) / nq},
                  {"hops", static_cast<double>(hops) / nq},
                  {"reads", static_cast<double>(all_io.reads) / nq},
                  {"bytes", bytes_per_q},
                  {"doorbells", static_cast<double>(all_io.doorbells) / nq},
                  {"vector_bytes", static_cast<double>(visited) / nq * static_cast<double>(g.layout().vector_read_bytes())}}},
                {"network_bound_qps", {{"56Gbps", 56e9 / 8 / std::max(bytes_per_q, 1.0)}, {"100Gbps", 100e9 / 8 / std::max(bytes_per_q, 1.0)}}},
                {"invalid_pointers_skipped", skipped},
                {"per_cn", per_cn}};
    report["runs"].push_back(run);
  }
  return report;
}

// ================================================================== printing
void print_build(const json& r) {
  if (!r.contains("inserted")) return;
  std::printf("shine build: %llu vectors (dim %u, M %u, efC %u) by %u computenode(s) x %u threads x %u coroutines\n",
              static_cast<unsigned long long>(r["inserted"].get<uint64_t>()), r["dim"].get<unsigned>(),
              r["m"].get<unsigned>(), r["ef_construction"].get<unsigned>(), r["num_cns"].get<unsigned>(),
              r["threads"].get<unsigned>(), r["coroutines"].get<unsigned>());
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
}

void print_query(const json& r) {
  if (!r.contains("runs")) return;
  std::printf("shine query: %s, k=%u, %u computenode(s) x %u threads x %u coroutines, reads %s, provider %s\n",
              r["distribution"].get<std::string>().c_str(), r["k"].get<unsigned>(), r["num_cns"].get<unsigned>(),
              r["threads"].get<unsigned>(), r["coroutines"].get<unsigned>(), r["read_mode"].get<std::string>().c_str(),
              r["provider"].get<std::string>().c_str());
  std::printf("%8s %9s %9s %10s %10s %9s %8s %9s %10s %11s %12s\n", "efSearch", "recall", "QPS", "p50 us", "p99 us",
              "visited", "READs", "doorbells", "KiB/query", "QPS@56Gb/s", "QPS@100Gb/s");
  for (auto& run : r["runs"]) {
    auto& pq = run["per_query"];
    std::printf("%8u %9.4f %9.0f %10.1f %10.1f %9.1f %8.1f %9.1f %10.1f %11.0f %12.0f\n", run["ef_search"].get<unsigned>(),
                run["recall"].get<double>(), run["qps"].get<double>(), run["latency_us"]["p50"].get<double>(),
                run["latency_us"]["p99"].get<double>(), pq["visited"].get<double>(), pq["reads"].get<double>(),
                pq["doorbells"].get<double>(), pq["bytes"].get<double>() / 1024,
                run["network_bound_qps"]["56Gbps"].get<double>(), run["network_bound_qps"]["100Gbps"].get<double>());
  }
}

}  // namespace dmhnsw::shine
