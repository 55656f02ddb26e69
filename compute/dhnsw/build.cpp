#include "compute/dhnsw/build.hpp"

#include <faiss/IndexFlatCodes.h>
#include <faiss/IndexHNSW.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "common/progress.hpp"
#include "common/region.hpp"
#include "common/timing.hpp"
#include "compute/dhnsw/subindex.hpp"
#include "router/balanced_partition.hpp"

namespace dmhnsw::dhnsw {

namespace {


void need(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

/// Runs task(i) for i in [0, tasks) on `threads` std::threads, each with OpenMP limited to one
/// thread (Faiss's add() stays single-threaded: deterministic, no oversubscription). The first
/// exception is rethrown after all workers stop.
template <typename F>
void run_pool(size_t tasks, uint32_t threads, F&& task) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto worker = [&] {
    omp_set_num_threads(1);
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= tasks || failed.load()) return;
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t nt = std::max<size_t>(1, std::min<size_t>(threads, tasks));
  pool.reserve(nt);
  for (size_t t = 0; t < nt; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

uint32_t resolve_partitions(uint32_t partitions, size_t n) {
  if (partitions != 0) return partitions;
  const double r = std::round(std::sqrt(static_cast<double>(n)));
  return static_cast<uint32_t>(std::clamp<double>(r, 1.0, std::min<double>(static_cast<double>(n), 1 << 20)));
}

std::vector<uint64_t> estimate_region_bytes(size_t n, uint32_t dim, const BuildOptions& opts) {
  const uint32_t P = resolve_partitions(opts.partitions, n);
  uint32_t code_size = 0;
  uint64_t codes_block = 0;
  if (opts.codes.kind == compute::CodeKind::Sq8) code_size = dim, codes_block = 64 + 8ull * dim;
  if (opts.codes.kind == compute::CodeKind::Pq) code_size = opts.codes.pq_m, codes_block = 64 + 1024ull * dim;
  // A vector of Faiss's HNSW is above level 0 with probability 1/M: 2M + M / (M - 1) links.
  auto links = [](uint64_t count, uint32_t m) {
    return static_cast<uint64_t>(std::ceil(static_cast<double>(count) * (2.0 * m + m / (m - 1.0))));
  };
  std::vector<SubShape> shapes(P);
  for (uint32_t p = 0; p < P; ++p) {
    shapes[p].count = n / P + (p < n % P ? 1 : 0);  // balanced: at most ceil(n / P)
    shapes[p].neighbor_entries = links(shapes[p].count, opts.m);
    shapes[p].dim = dim;
    shapes[p].code_size = code_size;
  }
  const uint64_t meta = 256 + uint64_t{P} * (4ull * dim + 16) + 4 * links(P, opts.meta_m);
  const uint64_t id_capacity = opts.id_index ? 2 * n + 1024 : 0;
  RegionPlan plan = plan_region(shapes, std::max<uint32_t>(opts.memnodes, 1), meta, opts.layout, opts.base_offset,
                                id_capacity, codes_block);
  plan.region_bytes[0] += align_up(opts.insert_buffer_bytes, 4096);
  return plan.region_bytes;
}

namespace {

void check_options(size_t n, uint32_t dim, const BuildOptions& opts) {
  need(n >= 1, "build: no vectors");
  need(dim >= 1 && dim <= 65536, "build: dimension " + std::to_string(dim) + " outside [1, 65536]");
  need(opts.m >= 2 && opts.m <= 4096, "--m: " + std::to_string(opts.m) + " outside [2, 4096]");
  need(opts.meta_m >= 2 && opts.meta_m <= 4096, "--meta-m: " + std::to_string(opts.meta_m) + " outside [2, 4096]");
  need(opts.ef_construction >= 1, "--ef-construction: must be >= 1");
  need(opts.memnodes >= 1 && opts.memnodes <= 0xFFFF,
       "--memnodes: " + std::to_string(opts.memnodes) + " outside [1, 65535]");
  need(std::isfinite(opts.layout.internal_gap) && opts.layout.internal_gap >= 0 && opts.layout.internal_gap <= 1000,
       "--internal-gap: " + std::to_string(opts.layout.internal_gap) + " outside [0, 1000]");
  need(std::isfinite(opts.layout.overflow_gap) && opts.layout.overflow_gap >= 0 && opts.layout.overflow_gap <= 1000,
       "--overflow-gap: " + std::to_string(opts.layout.overflow_gap) + " outside [0, 1000]");
  const BoundaryRule& b = opts.boundary;
  need(std::isfinite(b.ratio) && (b.ratio == 0 || (b.ratio >= 1 && b.ratio <= 100)),
       "--boundary-ratio: " + std::to_string(b.ratio) + " is neither 0 (no copies) nor in [1, 100]");
  need(b.max_copies >= 1 && b.max_copies <= kMaxCopies,
       "--max-copies: " + std::to_string(b.max_copies) + " outside [1, " + std::to_string(kMaxCopies) + "]");
  need(!b.enabled() || opts.partition_metric == Metric::L2,
       "--boundary-ratio: boundary copies need --partition-metric l2 (a ratio of distances)");
  need(!b.enabled() || opts.id_index, "--boundary-ratio: boundary copies need the id index (deletes find copies there)");
}

/// The rows of each partition, in increasing row (the sub's local ids follow it), and which copy
/// of its row each is (0: the primary; k >= 1: boundary copy k, mapped under copy_key(id, k)).
struct Members {
  std::vector<std::vector<int64_t>> rows;
  std::vector<std::vector<uint8_t>> copy;
};

/// Step 1: balanced partitions, then the boundary copies. Fills the partition fields of `out`.
Members partition(const float* data, size_t n, uint32_t dim, uint32_t P, const BuildOptions& opts,
                  router::Partitioning& part, BuiltIndex& out) {
  router::CapacityKMeansOptions ko;
  ko.iterations = opts.kmeans_iterations;
  ko.seed = opts.seed;
  ko.max_train = opts.kmeans_max_train;
  const Metric pm = opts.partition_metric;
  part = opts.plain_kmeans ? router::plain_kmeans(data, n, dim, P, pm, ko) : router::capacity_kmeans(data, n, dim, P, pm, ko);
  if (part.k != P || part.assignment.size() != n || part.centroids.size() != size_t{P} * dim)
    throw std::runtime_error("build: the partitioning returned an inconsistent result");
  out.partition_max_over_mean = part.max_over_mean();
  out.partition_inertia = part.inertia;
  for (size_t i = 0; i < n; ++i)
    if (part.assignment[i] >= P)
      throw std::runtime_error("build: vector " + std::to_string(i) + " assigned to partition " +
                               std::to_string(part.assignment[i]) + " of " + std::to_string(P));
  auto t0 = Clock::now();
  std::vector<std::vector<uint32_t>> to;
  if (opts.boundary.enabled())
    to = CopyPlacement(part.centroids.data(), P, dim, opts.boundary).place(data, n, part.assignment.data());
  out.seconds_copies = seconds_since(t0);
  Members members;
  members.rows.resize(P);
  members.copy.resize(P);
  for (uint32_t p = 0; p < P; ++p) members.rows[p].reserve(part.sizes[p]);
  for (size_t i = 0; i < n; ++i) {
    if (to.empty()) {
      members.rows[part.assignment[i]].push_back(static_cast<int64_t>(i));
      members.copy[part.assignment[i]].push_back(0);
      continue;
    }
    for (size_t k = 0; k < to[i].size(); ++k) {
      members.rows[to[i][k]].push_back(static_cast<int64_t>(i));
      members.copy[to[i][k]].push_back(static_cast<uint8_t>(k));
    }
    out.copies += to[i].size() - 1;
  }
  out.partition_sizes.resize(P);
  for (uint32_t p = 0; p < P; ++p) {
    out.partition_sizes[p] = members.rows[p].size();
    if (members.rows[p].size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      throw std::invalid_argument("--partitions: partition " + std::to_string(p) +
                                  " holds more than 2^31-1 vectors (Faiss ids); use more partitions");
  }
  return members;
}

/// Step 2: a sub-HNSW per partition (tasks 0..P-1) and the meta-HNSW over the centroids
/// (task P), in parallel.
std::unique_ptr<faiss::IndexHNSWFlat> build_hnsws(const float* data, uint32_t dim, Metric metric,
                                                  const BuildOptions& opts, uint32_t threads,
                                                  const router::Partitioning& part,
                                                  const std::vector<std::vector<int64_t>>& members,
                                                  std::vector<std::unique_ptr<faiss::IndexHNSWFlat>>& subs) {
  size_t placed = 0;
  for (const auto& m : members) placed += m.size();
  const uint32_t P = static_cast<uint32_t>(members.size());
  const faiss::MetricType fmetric = metric == Metric::IP ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2;
  subs.resize(P);
  std::unique_ptr<faiss::IndexHNSWFlat> meta;
  ProgressOptions po;
  po.enabled = opts.progress;
  // Counted a sub-HNSW at a time (one Faiss add each): P is about sqrt(n), often enough.
  Progress progress("dhnsw build (sub-HNSWs)", placed, "vectors", po);
  run_pool(size_t{P} + 1, threads, [&](size_t t) {
    if (t == P) {
      meta = std::make_unique<faiss::IndexHNSWFlat>(
          static_cast<int>(dim), static_cast<int>(opts.meta_m),
          opts.partition_metric == Metric::IP ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2);
      meta->hnsw.efConstruction = static_cast<int>(opts.ef_construction);
      meta->add(static_cast<faiss::Index::idx_t>(P), part.centroids.data());
      return;
    }
    const std::vector<int64_t>& ids = members[t];
    std::vector<float> vecs(ids.size() * dim);
    for (size_t j = 0; j < ids.size(); ++j)
      std::memcpy(vecs.data() + j * dim, data + static_cast<size_t>(ids[j]) * dim, sizeof(float) * dim);
    auto idx = std::make_unique<faiss::IndexHNSWFlat>(static_cast<int>(dim), static_cast<int>(opts.m), fmetric);
    idx->hnsw.efConstruction = static_cast<int>(opts.ef_construction);
    idx->add(static_cast<faiss::Index::idx_t>(ids.size()), vecs.data());
    subs[t] = std::move(idx);
    progress.add(ids.size());
  });
  progress.finish();
  return meta;
}

MetaHeader meta_header(uint32_t P, size_t n, uint32_t dim, Metric metric, const BuildOptions& opts,
                       const RegionPlan& plan) {
  MetaHeader h{};
  h.num_subs = P;
  h.dim = dim;
  h.metric = static_cast<uint8_t>(metric == Metric::IP ? MetricCode::IP : MetricCode::L2);
  h.num_memnodes = opts.memnodes;
  h.m = opts.m;
  h.ef_construction = opts.ef_construction;
  h.meta_m = opts.meta_m;
  h.num_vectors = n;
  h.epoch = opts.epoch;
  h.metadata_offset = plan.metadata_offset;
  h.id_buckets = plan.id_buckets;
  h.internal_gap_ppm = static_cast<uint64_t>(std::llround(opts.layout.internal_gap * 1e6));
  h.overflow_gap_ppm = static_cast<uint64_t>(std::llround(opts.layout.overflow_gap * 1e6));
  if (opts.boundary.enabled()) {
    h.max_copies = opts.boundary.max_copies;
    h.boundary_ratio_ppm = static_cast<uint32_t>(std::llround(opts.boundary.ratio * 1e6));
  }
  return h;
}

/// Memnode m's region header for a whole image: mode Dhnsw, the metadata and data end.
RegionHeader dhnsw_region_header(uint32_t m, const MetaHeader& h, uint32_t dim, const RegionPlan& plan,
                                 size_t metadata_bytes, uint16_t memnodes) {
  RegionHeader rh = make_region_header(static_cast<uint16_t>(m), plan.region_bytes[m]);
  rh.mode = static_cast<uint8_t>(fabric::Mode::Dhnsw);
  rh.metric = h.metric;
  rh.elem_type = static_cast<uint8_t>(ElemType::F32);
  rh.dim = dim;
  rh.memnode_count = memnodes;
  rh.epoch = h.epoch;
  rh.scratch_offset = plan.data_end[m];
  rh.scratch_size = kScratchBytes;
  rh.data_offset = kMetadataOffset;
  rh.mode_words[dhnsw_word::kMetadataOffset] = kMetadataOffset;
  rh.mode_words[dhnsw_word::kMetadataSize] = metadata_bytes;
  rh.mode_words[dhnsw_word::kDataEnd] = plan.data_end[m];
  validate_region_header(rh, "build: memnode " + std::to_string(m) + " region header");
  return rh;
}

/// Step 3: the layout, the metadata block, each memnode's region bytes with every sub-HNSW
/// serialized into its block; checked by decoding the metadata back.
void lay_out(uint32_t dim, Metric metric, const BuildOptions& opts, uint32_t threads, const int64_t* labels,
             std::unique_ptr<faiss::IndexHNSWFlat> meta, std::vector<std::unique_ptr<faiss::IndexHNSWFlat>>& subs,
             const Members& part_members, BuiltIndex& out) {
  const std::vector<std::vector<int64_t>>& members = part_members.rows;
  const uint32_t P = static_cast<uint32_t>(subs.size());
  const std::vector<char> meta_bytes = serialize_meta(*meta);
  meta.reset();
  const uint32_t code_size = out.quantizer ? static_cast<uint32_t>(out.quantizer->code_size()) : 0;
  const std::vector<char> codes_block = out.quantizer ? out.quantizer->serialize() : std::vector<char>{};
  // A copy's record in a sub-HNSW: its vector, code, label and level-0 list (2M entries).
  out.copy_bytes = out.copies * (4ull * dim + code_size + 8 + 8ull * opts.m);
  std::vector<SubShape> shapes(P);
  for (uint32_t p = 0; p < P; ++p) shapes[p] = shape_of(*subs[p], code_size);
  // The id index: room for twice the vectors (in-place inserts until the next rebuild, which
  // sizes it again).
  const uint64_t id_capacity = opts.id_index ? 2 * (out.num_vectors + out.copies) + 1024 : 0;
  RegionPlan plan = plan_region(shapes, opts.memnodes, meta_bytes.size(), opts.layout, opts.base_offset, id_capacity,
                                codes_block.size());
  for (uint32_t p = 0; p < P; ++p) {
    plan.subs[p].entry_point = subs[p]->hnsw.entry_point;
    plan.subs[p].max_level = subs[p]->hnsw.max_level;
  }
  MetaHeader h = meta_header(P, out.num_vectors, dim, metric, opts, plan);
  h.code_size = code_size;
  const std::vector<char> block = encode_metadata(h, plan.subs, meta_bytes.data(), meta_bytes.size(), codes_block);
  if (block.size() != plan.metadata_bytes) throw std::runtime_error("build: metadata block size mismatch");
  std::memcpy(&out.header, block.data(), sizeof out.header);
  out.subs = plan.subs;

  out.regions.resize(opts.memnodes);
  const bool whole = opts.image;  // else a rebuild: [base, data end) only
  Control control{};
  if (whole) {  // the insert buffer after memnode 0's groups, before its scratch area
    uint64_t area_end = 0;
    for (uint64_t e : plan.data_end) area_end = std::max(area_end, e);
    const uint64_t buf_off = plan.data_end[0];
    const uint64_t buf_bytes = align_up(opts.insert_buffer_bytes, 4096);
    control = make_control(opts.epoch, plan.metadata_offset, area_end, buf_bytes > 0 ? buf_off : 0, buf_bytes, dim);
    plan.data_end[0] += buf_bytes;
    plan.region_bytes[0] += buf_bytes;
  }
  out.region_base = whole ? 0 : opts.base_offset;
  const uint64_t rb = out.region_base;
  for (uint32_t m = 0; m < opts.memnodes; ++m) {
    std::vector<char>& r = out.regions[m];
    r.assign(plan.data_end[m] - rb, 0);
    if (!whole) {
      std::memcpy(r.data() + (plan.metadata_offset - rb), block.data(), block.size());
      continue;
    }
    RegionHeader rh = dhnsw_region_header(m, h, dim, plan, block.size(), static_cast<uint16_t>(opts.memnodes));
    std::memcpy(r.data(), &rh, sizeof rh);
    if (m == 0) std::memcpy(r.data() + kControlOffset, &control, sizeof control);
    std::memcpy(r.data() + kMetadataOffset, block.data(), block.size());
  }
  run_pool(P, threads, [&](size_t p) {
    const SubDesc& d = plan.subs[p];
    std::vector<int64_t> lab(members[p]);
    if (labels != nullptr)
      for (auto& x : lab) x = labels[x];
    std::vector<uint8_t> codes;
    if (out.quantizer) {
      auto* st = dynamic_cast<const faiss::IndexFlatCodes*>(subs[p]->storage);
      codes.resize(static_cast<size_t>(subs[p]->ntotal) * code_size);
      out.quantizer->encode(reinterpret_cast<const float*>(st->codes.data()), static_cast<size_t>(subs[p]->ntotal),
                            codes.data());
    }
    serialize_sub(*subs[p], lab.data(), codes.data(), code_size, d, out.regions[d.memnode].data() + (d.block_offset - rb));
    subs[p].reset();
  });
  if (plan.id_buckets > 0) {  // each id -> its label entry in its sub's labels array
    const IdTable t = id_table(out.header);
    std::vector<std::pair<IdKey, RemotePtr>> entries;
    entries.reserve(out.num_vectors + out.copies);
    for (uint32_t p = 0; p < P; ++p) {
      const SubDesc& d = plan.subs[p];
      const uint64_t at = d.block_offset + d.arrays[kLabels].offset;
      for (size_t i = 0; i < members[p].size(); ++i) {
        const int64_t id = labels != nullptr ? labels[members[p][i]] : members[p][i];
        entries.emplace_back(IdKey::copy_of(static_cast<uint64_t>(id), part_members.copy[p][i]),
                             RemotePtr(d.memnode, at + 8 * i));
      }
    }
    const auto words = fill_id_table(t, entries, "build");
    for (uint32_t m = 0; m < opts.memnodes; ++m)
      std::memcpy(out.regions[m].data() + (t.offset - rb), words[m].data(), 8 * words[m].size());
  }
  out.region_bytes = plan.region_bytes;
  for (uint32_t m = 0; m < opts.memnodes; ++m) {
    const std::vector<char>& r = out.regions[m];
    decode_metadata(r.data() + (plan.metadata_offset - rb), r.size() - (plan.metadata_offset - rb), out.region_bytes[m], m,
                    "build: memnode " + std::to_string(m) + " region");
  }
}

}  // namespace

BuiltIndex build_index(const float* data, size_t n, uint32_t dim, Metric metric, const BuildOptions& opts,
                       const int64_t* labels) {
  need(data != nullptr, "build: no vectors");
  check_options(n, dim, opts);
  const uint32_t P = resolve_partitions(opts.partitions, n);
  need(P <= n, "--partitions: " + std::to_string(P) + " partitions for " + std::to_string(n) + " vectors");
  if (labels != nullptr)
    for (size_t i = 0; i < n; ++i)
      need(labels[i] >= 0, "build: id " + std::to_string(labels[i]) + " of row " + std::to_string(i) +
                               " is negative (ids are 0 .. 2^63 - 1)");

  BuiltIndex out;
  out.options = opts;
  out.options.partitions = P;
  out.metric = metric;
  out.num_vectors = n;
  out.dim = dim;
  const uint32_t threads = opts.threads != 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency());

  auto t0 = Clock::now();
  router::Partitioning part;
  const Members members = partition(data, n, dim, P, opts, part, out);
  out.seconds_partition = seconds_since(t0) - out.seconds_copies;

  t0 = Clock::now();
  out.quantizer = opts.quantizer;
  if (!out.quantizer && opts.codes.enabled()) {  // trained on rows spread over the data
    out.quantizer = compute::Quantizer::train_spread(opts.codes, n, dim, metric,
                                                     [&](size_t i) { return data + i * dim; });
  }
  if (out.quantizer && (out.quantizer->dim() != dim || out.quantizer->metric() != metric))
    throw std::invalid_argument("build: the quantizer is for dimension " + std::to_string(out.quantizer->dim()) +
                                ", the data has " + std::to_string(dim));
  out.seconds_codes = seconds_since(t0);

  t0 = Clock::now();
  std::vector<std::unique_ptr<faiss::IndexHNSWFlat>> subs;
  std::unique_ptr<faiss::IndexHNSWFlat> meta = build_hnsws(data, dim, metric, opts, threads, part, members.rows, subs);
  out.seconds_build_subs = seconds_since(t0);

  t0 = Clock::now();
  lay_out(dim, metric, opts, threads, labels, std::move(meta), subs, members, out);
  out.seconds_layout = seconds_since(t0);
  return out;
}

nlohmann::json BuiltIndex::report() const {
  nlohmann::json j;
  uint64_t mn = 0, mx = 0, sum = 0;
  if (!partition_sizes.empty()) {
    mn = *std::min_element(partition_sizes.begin(), partition_sizes.end());
    mx = *std::max_element(partition_sizes.begin(), partition_sizes.end());
    for (uint64_t s : partition_sizes) sum += s;
  }
  const double mean = partition_sizes.empty() ? 0.0 : static_cast<double>(sum) / partition_sizes.size();
  j["tool"] = "dhnsw-build";
  j["vectors"] = num_vectors;
  j["dim"] = dim;
  j["metric"] = std::string(to_string(metric));
  j["partition_metric"] = std::string(to_string(options.partition_metric));
  j["options"] = {{"partitions", options.partitions},
                  {"m", options.m},
                  {"ef_construction", options.ef_construction},
                  {"meta_m", options.meta_m},
                  {"memnodes", options.memnodes},
                  {"internal_gap", options.layout.internal_gap},
                  {"overflow_gap", options.layout.overflow_gap},
                  {"seed", options.seed},
                  {"plain_kmeans", options.plain_kmeans},
                  {"kmeans_iterations", options.kmeans_iterations},
                  {"kmeans_max_train", options.kmeans_max_train},
                  {"threads", options.threads}};
  j["partitions"] = {{"count", partition_sizes.size()},
                     {"sizes", partition_sizes},
                     {"min", mn},
                     {"mean", mean},
                     {"max", mx},
                     {"max_over_mean", partition_max_over_mean},
                     {"inertia", partition_inertia}};
  j["seconds"] = {{"partition", seconds_partition},
                  {"codes", seconds_codes},
                  {"build_subs", seconds_build_subs},
                  {"layout", seconds_layout},
                  {"copies", seconds_copies},
                  {"total", seconds_partition + seconds_copies + seconds_codes + seconds_build_subs + seconds_layout}};
  j["boundary"] = {{"ratio", options.boundary.enabled() ? options.boundary.ratio : 0.0},
                   {"max_copies", options.boundary.enabled() ? options.boundary.max_copies : 1},
                   {"copies", copies},
                   {"partitions_per_vector", num_vectors > 0 ? 1.0 + static_cast<double>(copies) / num_vectors : 0.0},
                   {"copy_bytes", copy_bytes}};
  j["codes"] = quantizer ? nlohmann::json{{"kind", quantizer->spec().to_string()},
                                          {"code_size", quantizer->code_size()},
                                          {"bytes", (num_vectors + copies) * quantizer->code_size()}}
                         : nlohmann::json(nullptr);
  uint64_t blocks = 0, gaps = 0;
  for (const SubDesc& d : subs) {
    blocks += d.block_bytes;
    if (d.slot == 0) gaps += d.overflow_bytes;
  }
  std::vector<uint64_t> data_end;
  for (const auto& r : regions) data_end.push_back(r.size() + region_base);
  j["layout"] = {{"metadata_offset", header.metadata_offset},
                 {"data_end", data_end},
                 {"scratch_bytes", kScratchBytes},
                 {"metadata_bytes", header.block_bytes},
                 {"meta_index_bytes", header.meta_index_bytes},
                 {"sub_block_bytes", blocks},
                 {"overflow_gap_bytes", gaps},
                 {"region_bytes", region_bytes},
                 {"epoch", header.epoch},
                 {"checksum", header.checksum}};
  return j;
}

std::string image_path(const std::string& out, uint32_t id, uint32_t memnodes) {
  return memnodes == 1 ? out : out + "." + std::to_string(id);
}

std::vector<memory::ImageInfo> write_images(const BuiltIndex& built, const std::string& out) {
  std::vector<memory::ImageInfo> infos;
  const uint32_t n = static_cast<uint32_t>(built.regions.size());
  for (uint32_t m = 0; m < n; ++m) {
    const std::vector<char>& r = built.regions[m];
    infos.push_back(memory::write_image(image_path(out, m, n), r.data(), built.region_bytes.at(m), r.size(),
                                        static_cast<uint16_t>(m)));
  }
  return infos;
}

void relocate(BuiltIndex& b, uint64_t base) {
  const uint64_t from = b.header.metadata_offset;
  if (base == from) return;
  const int64_t delta = static_cast<int64_t>(base) - static_cast<int64_t>(from);
  for (SubDesc& d : b.subs) {
    d.block_offset += delta;
    d.group_offset += delta;
    d.overflow_offset += delta;
  }
  // The id index's entries name label entries by region offset: they move too (the table keeps
  // its place relative to the metadata block, as both bases are 4096-aligned).
  const IdTable t = id_table(b.header);
  for (auto& r : b.regions) {
    if (t.buckets == 0) break;
    for (uint64_t at = t.offset - b.region_base; at < t.offset - b.region_base + t.bytes_per_memnode(); at += 8) {
      uint64_t w;
      std::memcpy(&w, r.data() + at, 8);
      if (w == 0 || at % IdSlot::kBucketBytes == 0) continue;  // free, or a bucket's lock word
      const RemotePtr p = IdSlot::node(w);
      w = IdSlot::make(IdSlot::fingerprint(w), RemotePtr(p.node(), static_cast<uint64_t>(p.offset() + delta)));
      std::memcpy(r.data() + at, &w, 8);
    }
  }
  MetaHeader h = b.header;
  h.metadata_offset = base;
  const std::vector<char>& r0 = b.regions[0];
  const std::vector<char> meta(r0.begin() + static_cast<std::ptrdiff_t>(h.meta_index_offset),
                               r0.begin() + static_cast<std::ptrdiff_t>(h.meta_index_offset + h.meta_index_bytes));
  const std::vector<char> codes(r0.begin() + static_cast<std::ptrdiff_t>(h.codes_offset),
                                r0.begin() + static_cast<std::ptrdiff_t>(h.codes_offset + h.codes_bytes));
  const std::vector<char> block = encode_metadata(h, b.subs, meta.data(), meta.size(), codes);
  std::memcpy(&b.header, block.data(), sizeof b.header);
  for (auto& r : b.regions) std::memcpy(r.data(), block.data(), block.size());
  b.region_base = base;
}

}  // namespace dmhnsw::dhnsw
