// shine-import: serves an existing hnswlib index disaggregated. Reads the file written by
// hnswlib's HierarchicalNSW::saveIndex (0.6.2), checks it field by field, and writes its graph
// into empty memnodes as a shine index (compute/shine/import.hpp): afterwards
// `computenode --mode shine query` answers as hnswlib did, and `computenode --mode shine
// insert` adds to it. Connects to the memnodes as a computenode does (same flags).
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "common/version.hpp"
#include "common/dataset.hpp"
#include "common/fabric/cluster.hpp"
#include "common/json_file.hpp"
#include "common/units.hpp"
#include "compute/memnode_cpu.hpp"
#include "compute/shine/import.hpp"

using namespace dmhnsw;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void write_report(const std::string& path, const nlohmann::json& r) {
  write_json_file(path, r, "--report");
  std::printf("report: %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"shine-import: write an hnswlib index file (HierarchicalNSW::saveIndex, hnswlib 0.6) into empty "
               "memnodes as a shine index, queryable by `computenode --mode shine query` with hnswlib's recall"};
  app.set_version_flag("--version", dmhnsw::version_line("shine-import"));
  app.set_config("--config", "", "read these options from a TOML/INI file (same names as the flags)");
  std::string file, data, metric = "l2", memnodes, provider = "shm", token_file, report, log_level = "info";
  uint32_t cn_id = 0;
  shine::ImportOptions io;
  std::string chunk = "4MiB", codes = "none";
  app.add_option("--hnswlib", file, "the hnswlib index file")->required()->check(CLI::ExistingFile);
  app.add_option("--metric", metric, "the index's space, which hnswlib's file does not record: l2 or ip")
      ->capture_default_str()
      ->check(CLI::IsMember({"l2", "ip"}));
  app.add_option("--data", data, "optional: the base vectors the index was built from; their dimension must match");
  app.add_option("--seed", io.seed, "seed stored with the index for later `computenode insert` runs")->capture_default_str();
  app.add_option("--memnodes", memnodes, "control addresses of every memnode, HOST:PORT[,HOST:PORT...]")->required();
  app.add_option("--provider", provider, "fabric (as the computenode's --provider): " + fabric::provider_help())
      ->capture_default_str()
      ->check(CLI::IsMember(fabric::provider_names()));
  app.add_option("--token-file", token_file, "file holding the cluster token (else the DMHNSW_TOKEN variable)");
  app.add_option("--cn-id", cn_id, "computenode id to connect as (no other computenode with this id may be connected)")
      ->capture_default_str();
  app.add_option("--id-capacity", io.id_capacity,
                 "an id index for this many ids in the memnodes' regions, so that the index takes any ids, deletes "
                 "and upserts (-1: twice the elements; 0: none, new ids must then lie above every label)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
  app.add_option("--codes", codes,
                 "compressed vectors stored with the index, as `computenode --mode shine build --codes`: none, sq8 "
                 "(8 bits per dimension, Faiss's ScalarQuantizer) or pq:M (M bytes, Faiss's ProductQuantizer; M divides "
                 "the dimension), trained on up to 65,536 of the file's vectors spread over all of them; every node's "
                 "code goes to its memnode's codes log (`query --rerank R` then traverses on them)")
      ->capture_default_str();
  app.add_option("--codes-capacity", io.codes_capacity,
                 "codes log entries per memnode (0: twice the elements over the memnodes, at least 1024)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  app.add_option("--chunk", chunk, "bytes of node records per WRITE")->capture_default_str();
  app.add_option("--writes-per-doorbell", io.writes_per_doorbell, "WRITEs posted with one doorbell")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  app.add_option("--report", report, "write the import report (JSON) here");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_pattern("[%H:%M:%S.%e] [shine-import] [%l] %v");
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    const auto t0 = std::chrono::steady_clock::now();
    io.metric = parse_metric(metric);
    io.chunk_bytes = parse_bytes(chunk, "--chunk");
    io.codes = compute::parse_codes(codes);
    uint32_t data_dim = 0;
    if (!data.empty()) data_dim = static_cast<uint32_t>(probe(data).d);
    const shine::HnswlibFile f(file, data_dim);
    const double parse_secs = seconds_since(t0);
    spdlog::info("{}: {} elements of dimension {}, M {}, efConstruction {}, top level {} ({:.2f} s to check)", file,
                 f.count(), f.dim(), f.m(), f.ef_construction(), f.max_level(), parse_secs);

    fabric::ClusterOptions co;
    co.provider = fabric::parse_provider(provider);
    co.memnodes = split_commas(memnodes);
    co.token = fabric::load_token(token_file);
    co.mode = fabric::Mode::Shine;
    co.cn_id = cn_id;
    co.num_cns = 1;
    auto cluster = fabric::connect_cluster(co);
    spdlog::info("connected to {} memnode(s) over {}", cluster->memnodes().size(), provider);

    compute::MemnodeCpuMeter cpu(*cluster);
    nlohmann::json r = shine::import_hnswlib(*cluster, f, io);
    const double secs = seconds_since(t0);
    // The fields every computenode report carries (the import writes without a wire model).
    r["memnode_cpu"] = cpu.since_start();
    r["process_memory"] = compute::process_memory();
    r["wire"] = {{"model", "none"}, {"latency_us", 0.0}, {"gbytes_per_s", 0.0}};
    r["parse_seconds"] = parse_secs;
    r["seconds"] = secs;
    std::printf("shine-import: %llu nodes (dim %u, M %u, efC %u, %s) from %s into %zu memnode(s) over %s\n",
                static_cast<unsigned long long>(f.count()), f.dim(), f.m(), f.ef_construction(), metric.c_str(),
                file.c_str(), cluster->memnodes().size(), provider.c_str());
    std::printf("  %.1f MiB of nodes in %llu WRITEs, %llu doorbells (%llu doorbells in all, with the header "
                "reads and the format); %.2f s (check %.2f s, write %.2f s, %.0f MiB/s)\n",
                static_cast<double>(r["record_bytes"].get<uint64_t>()) / (1 << 20),
                static_cast<unsigned long long>(r["record_writes"].get<uint64_t>()),
                static_cast<unsigned long long>(r["record_doorbells"].get<uint64_t>()),
                static_cast<unsigned long long>(r["doorbells"].get<uint64_t>()), secs, parse_secs,
                r["write_seconds"].get<double>(),
                static_cast<double>(r["record_bytes"].get<uint64_t>()) / (1 << 20) /
                    std::max(r["write_seconds"].get<double>(), 1e-9));
    if (r.contains("codes")) {
      const auto& k = r["codes"];
      std::printf("  codes %s: %llu bytes per vector (Faiss, trained on %llu vectors in %.2f s), %llu entries in logs "
                  "of %llu per memnode%s\n",
                  k["kind"].get<std::string>().c_str(), static_cast<unsigned long long>(k["code_size"].get<uint64_t>()),
                  static_cast<unsigned long long>(k["train_rows"].get<uint64_t>()), k["train_seconds"].get<double>(),
                  static_cast<unsigned long long>(k["entries"].get<uint64_t>()),
                  static_cast<unsigned long long>(k["log_capacity"].get<uint64_t>()),
                  k["dropped"].get<uint64_t>() > 0 ? " (some nodes did not fit: their vectors are read)" : "");
      if (k["dropped"].get<uint64_t>() > 0)
        spdlog::warn("{} nodes' codes did not fit the codes logs of {} entries per memnode: searches read their vectors "
                     "(import with a larger --codes-capacity)",
                     k["dropped"].get<uint64_t>(), k["log_capacity"].get<uint64_t>());
    }
    for (auto& m : r["memnode_usage"])
      std::printf("  memnode %u (%s): %llu nodes, %.1f MiB of %.0f MiB\n", m["id"].get<unsigned>(),
                  m["address"].get<std::string>().c_str(), static_cast<unsigned long long>(m["nodes"].get<uint64_t>()),
                  static_cast<double>(m["bytes_used"].get<uint64_t>()) / (1 << 20),
                  static_cast<double>(m["region_bytes"].get<uint64_t>()) / (1 << 20));
    if (!report.empty()) write_report(report, r);
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
