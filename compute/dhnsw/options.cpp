#include "compute/dhnsw/options.hpp"

namespace dmhnsw::dhnsw {

void add_engine_flags(CLI::App& cmd, EngineOptions& o) {
  cmd.add_option("--batch", o.batch, "dhnsw: B, most queries per batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--max-wait-us", o.max_wait_us, "dhnsw: a batch closes this long after its first query arrived")
      ->capture_default_str();
  cmd.add_option("--probe", o.probe, "dhnsw: b, partitions (sub-HNSWs) searched per query")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--probe-ratio", o.probe_ratio,
                 "dhnsw: >= 1: of its top --probe partitions a query searches those whose centroid is within this "
                 "ratio of the nearest one's distance (partition metric l2); 0: all of them")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            double r = -1;
            if (!CLI::detail::lexical_cast(v, r)) return "not a number: " + v;
            return r == 0 || (r >= 1 && r <= 100) ? std::string() : "neither 0 (off) nor in [1, 100]: " + v;
          },
          "0 or [1, 100]"));
  cmd.add_option("--meta-ef-search", o.meta_ef_search, "dhnsw: efSearch in the meta-HNSW")->capture_default_str();
  cmd.add_option("--cache-subs", o.cache_subs,
                 "dhnsw: c, deserialized sub-HNSWs kept across batches (-1: --cache-ratio of them, 10 % by default; "
                 "with --rerank, of the index's memory, a sub-HNSW counted without its vectors)")
      ->capture_default_str();
  cmd.add_option("--doorbell-subs", o.doorbell_subs, "dhnsw: sub-HNSW fetches posted with one doorbell")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--queue-depth", o.queue_depth, "dhnsw: items between two pipeline stages")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--search-threads", o.search_threads, "dhnsw: threads of one sub-HNSW search (0: every core)")
      ->capture_default_str();
  // --cache-ratio is registered once for both modes (shine::SearchOptions); given, it is also the
  // share of sub-HNSWs kept here (else EngineOptions' 10 %).
  if (CLI::Option* ratio = cmd.get_option_no_throw("--cache-ratio"))
    ratio->each([&o](const std::string& v) { o.cache_ratio = std::stod(v); });
  // Likewise --rerank (the search over codes, both modes).
  if (CLI::Option* rerank = cmd.get_option_no_throw("--rerank"))
    rerank->each([&o](const std::string& v) { o.rerank = static_cast<uint32_t>(std::stoul(v)); });
}

}  // namespace dmhnsw::dhnsw
