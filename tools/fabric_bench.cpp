// fabric-bench: one-sided operation latency and throughput against a live memnode, in the
// spirit of perftest's ib_read_lat / ib_read_bw. Prints a table and writes a JSON file.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "common/version.hpp"
#include "common/fabric/cluster.hpp"
#include "common/fabric/wire.hpp"
#include "common/json_file.hpp"
#include "common/region.hpp"
#include "common/units.hpp"
#include "memory/admin.hpp"

using namespace dmhnsw;
using fabric::Completion;
using fabric::Op;
using fabric::Status;
using Clock = std::chrono::steady_clock;

namespace {

struct Bench {
  fabric::Endpoint& ep;
  RemotePtr base;      // start of the scratch area
  uint64_t span;       // scratch bytes usable
  double seconds;      // time budget per measurement

  static double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

  void drain(size_t n) { ep.wait_all(n); }

  // Serial operations, one at a time: latency percentiles.
  nlohmann::json latency(fabric::OpKind kind, size_t size, size_t max_iters) {
    fabric::Buffer buf = ep.alloc(std::max<size_t>(size, 8));
    std::vector<double> lat;
    auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    for (size_t i = 0; i < max_iters + 10 && Clock::now() < end; ++i) {
      Op op;
      switch (kind) {
        case fabric::OpKind::Read: op = Op::read(base, buf.data(), size, i); break;
        case fabric::OpKind::Write: op = Op::write(base, buf.data(), size, i); break;
        case fabric::OpKind::FetchAdd: op = Op::fetch_add(base, 1, buf.as<uint64_t>(), i); break;
        case fabric::OpKind::CompareSwap: op = Op::compare_swap(base, i, i + 1, buf.as<uint64_t>(), i); break;
      }
      auto t0 = Clock::now();
      if (ep.post(op) != Status::Ok) throw fabric::FabricError("post failed");
      drain(1);
      if (i >= 10) lat.push_back(us(Clock::now() - t0));  // first 10 are warm-up
    }
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double p) { return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, size_t(p * lat.size()))]; };
    return {{"op", fabric::op_name(kind)}, {"bytes", size}, {"iters", lat.size()},
            {"p50_us", pct(0.50)}, {"p99_us", pct(0.99)}, {"min_us", lat.empty() ? 0.0 : lat.front()}};
  }

  // `depth` reads of `size` kept in flight (or posted as doorbell batches of `batch`).
  nlohmann::json throughput(size_t size, size_t depth, size_t batch) {
    std::vector<fabric::Buffer> bufs;
    for (size_t i = 0; i < depth; ++i) bufs.push_back(ep.alloc(size));
    uint64_t slots = std::max<uint64_t>(1, span / size);
    uint64_t done = 0, posted = 0;
    auto t0 = Clock::now();
    auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    std::array<Completion, 64> out;
    std::vector<size_t> free_slots;
    for (size_t i = 0; i < depth; ++i) free_slots.push_back(i);
    std::vector<Op> ops;
    uint64_t doorbells0 = ep.counters().doorbells;
    while (Clock::now() < end) {
      // Post whenever a whole batch of buffers is free.
      while (free_slots.size() >= batch) {
        ops.clear();
        for (size_t j = 0; j < batch; ++j) {
          size_t b = free_slots.back();
          free_slots.pop_back();
          ops.push_back(Op::read(base + (posted % slots) * size, bufs[b].data(), size, b));
          ++posted;
        }
        if (ep.post(ops) != Status::Ok) throw fabric::FabricError("post failed");
      }
      size_t k = ep.poll(out);
      for (size_t i = 0; i < k; ++i) {
        if (out[i].status != Status::Ok) throw fabric::FabricError(ep.describe(out[i]));
        free_slots.push_back(out[i].tag);
      }
      done += k;
    }
    drain(posted - done);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    double ops_s = static_cast<double>(posted) / secs;
    return {{"bytes", size}, {"in_flight", depth}, {"batch", batch}, {"ops", posted},
            {"doorbells", ep.counters().doorbells - doorbells0}, {"mops", ops_s / 1e6},
            {"gbytes_per_s", ops_s * static_cast<double>(size) / 1e9}};
  }
};


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fabric-bench: READ latency (64 B .. 4 MiB), 512 B WRITE, FETCH_ADD and COMPARE_SWAP latency, READ "
               "throughput with 1, 8 and 32 in flight and with doorbell batches, and the memnode's process CPU over "
               "the run, against the scratch area of a live memnode"};
  app.set_version_flag("--version", dmhnsw::version_line("fabric-bench"));
  std::string memnodes, provider = "shm", token_file, json_out, max_size = "4MiB";
  double seconds = 0.5;
  size_t iters = 20000;
  uint32_t cn_id = 0;
  app.add_option("--memnodes", memnodes, "HOST:PORT of the memnode(s); the first one is measured")->required();
  app.add_option("--provider", provider, "fabric: " + fabric::provider_help())
      ->capture_default_str()
      ->check(CLI::IsMember(fabric::provider_names()));
  app.add_option("--token-file", token_file, "file holding the cluster token (else DMHNSW_TOKEN)");
  app.add_option("--json", json_out, "write the results to this JSON file");
  app.add_option("--seconds", seconds, "time budget of each measurement")->capture_default_str();
  app.add_option("--iters", iters, "max serial operations per latency point")->capture_default_str();
  app.add_option("--max-size", max_size, "largest READ size of the latency sweep")->capture_default_str();
  app.add_option("--cn-id", cn_id, "computenode id used to connect")->capture_default_str();
  std::string wire = "none";
  app.add_option("--wire", wire,
                 "wire model: none, cxl, rdma-56g, rdma-100g or LAT_US,GBPS: operations complete no sooner than "
                 "latency + bytes / bandwidth after their post (docs/wire-model.md)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_pattern("[%H:%M:%S.%e] [fabric-bench] [%l] %v");
  try {
    fabric::ClusterOptions co;
    co.provider = fabric::parse_provider(provider);
    co.memnodes = split_commas(memnodes);
    co.token = fabric::load_token(token_file);
    co.cn_id = cn_id;
    const fabric::WireModel wm = fabric::parse_wire(wire);
    auto cluster = fabric::with_wire(fabric::connect_cluster(co), wm);
    const auto& mn = cluster->memnodes().front();
    RegionHeader h = header_from_blob(mn.header, "memnode " + mn.address);
    uint64_t top = std::min<uint64_t>(parse_bytes(max_size, "--max-size"), h.scratch_size);
    auto ep = cluster->make_endpoint(std::max<uint64_t>(64u << 20, 40 * std::min<uint64_t>(top, 4u << 20)));
    Bench b{*ep, RemotePtr(mn.id, h.scratch_offset), h.scratch_size, seconds};

    // The memnode's process CPU over the whole run: with verbs the NIC serves every operation.
    const admin::StatsReply cpu0 = admin::query_stats(*ep, mn.id);
    const auto run0 = Clock::now();
    nlohmann::json report;
    report["provider"] = provider;
    report["wire"] = {{"model", fabric::describe(wm)}, {"latency_us", wm.latency_us}, {"gbytes_per_s", wm.gbytes_per_s}};
    report["memnode"] = mn.address;
    std::printf("fabric-bench: provider %s, wire %s, memnode %u (%s), scratch %s\n\n", provider.c_str(),
                fabric::describe(wm).c_str(), mn.id, mn.address.c_str(), format_bytes(h.scratch_size).c_str());

    std::printf("%-12s %10s %10s %10s %8s %12s\n", "READ size", "p50 us", "p99 us", "min us", "iters", "GB/s at p50");
    for (uint64_t s = 64; s <= top; s *= 2) {
      if (s != 512 && (std::bit_width(s) - std::bit_width(64u)) % 2 != 0) continue;  // 64,256,512,1K,4K,...
      auto r = b.latency(fabric::OpKind::Read, s, s >= (1u << 20) ? iters / 20 : iters);
      r["gbytes_per_s_p50"] = static_cast<double>(s) / (r["p50_us"].get<double>() * 1e3);
      std::printf("%-12s %10.2f %10.2f %10.2f %8zu %12.2f\n", format_bytes(s).c_str(), r["p50_us"].get<double>(),
                  r["p99_us"].get<double>(), r["min_us"].get<double>(), r["iters"].get<size_t>(),
                  r["gbytes_per_s_p50"].get<double>());
      report["read_latency"].push_back(r);
    }
    for (auto [kind, size, key] : {std::tuple{fabric::OpKind::Write, size_t{512}, "write_512_latency"},
                                   std::tuple{fabric::OpKind::FetchAdd, size_t{8}, "fetch_add_latency"},
                                   std::tuple{fabric::OpKind::CompareSwap, size_t{8}, "compare_swap_latency"}}) {
      auto r = b.latency(kind, size, iters);
      const std::string label = kind == fabric::OpKind::Write ? "WRITE 512 B" : fabric::op_name(kind);
      std::printf("%-12s %10.2f %10.2f %10.2f %8zu\n", label.c_str(), r["p50_us"].get<double>(),
                  r["p99_us"].get<double>(), r["min_us"].get<double>(), r["iters"].get<size_t>());
      report[key] = r;
    }
    std::printf("\n");

    std::printf("READs spread over the whole scratch area (%s), as an index is read:\n",
                format_bytes(h.scratch_size).c_str());
    std::printf("%-12s %9s %6s %10s %10s %10s %9s\n", "READ size", "in flight", "batch", "Mops/s", "GB/s", "doorbells",
                "ops/bell");
    for (uint64_t s : {uint64_t{512}, uint64_t{4096}, uint64_t{64} << 10, uint64_t{1} << 20}) {
      if (s > top) continue;
      for (auto [depth, batch] : {std::pair<size_t, size_t>{1, 1}, {8, 1}, {32, 1}, {8, 8}, {32, 32}}) {
        auto r = b.throughput(s, depth, batch);
        const auto bells = r["doorbells"].get<uint64_t>();
        std::printf("%-12s %9zu %6zu %10.3f %10.3f %10llu %9.1f\n", format_bytes(s).c_str(), depth, batch,
                    r["mops"].get<double>(), r["gbytes_per_s"].get<double>(), static_cast<unsigned long long>(bells),
                    bells == 0 ? 0.0 : static_cast<double>(r["ops"].get<uint64_t>()) / static_cast<double>(bells));
        report["read_throughput"].push_back(r);
      }
    }
    const admin::StatsReply cpu1 = admin::query_stats(*ep, mn.id);
    const double wall = std::chrono::duration<double>(Clock::now() - run0).count();
    const double cpu = admin::cpu_seconds(cpu1) - admin::cpu_seconds(cpu0);
    report["memnode_cpu_s"] = cpu;
    report["wall_s"] = wall;
    report["ops"] = ep->counters().total_ops();
    report["doorbells"] = ep->counters().doorbells;
    std::printf("\nmemnode process CPU: %.3f s during %.2f s of measurements (%.1f%% of one core), %llu operations\n",
                cpu, wall, 100.0 * cpu / wall, static_cast<unsigned long long>(ep->counters().total_ops()));
    if (!json_out.empty()) {
      write_json_file(json_out, report, "--json");
      std::printf("\nwrote %s\n", json_out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
