#pragma once
// d-HNSW index build (paper sections 4.1-4.2): balanced partitioning of the data set
// (router/balanced_partition.hpp), one Faiss sub-HNSW per partition, the meta-HNSW over the
// partition centroids, the region layout (compute/dhnsw/layout.hpp) and the region images that
// memnodes serve (`memnode --load`).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/codes.hpp"
#include "compute/dhnsw/boundary.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/layout.hpp"
#include "common/distance.hpp"
#include "memory/image.hpp"

namespace dmhnsw::dhnsw {

struct BuildOptions {
  /// Partitions (sub-HNSWs) P. 0: round(sqrt(n)), at least 1 and at most n (sub-HNSWs of about
  /// sqrt(n) vectors: 100 of 100 for 10k vectors, 1000 of 1000 for 1M).
  uint32_t partitions = 0;
  uint32_t m = 32;                 // HNSW M of the sub-HNSWs (>= 2)
  uint32_t ef_construction = 100;  // of the sub-HNSWs and the meta-HNSW (>= 1)
  uint32_t meta_m = 16;            // HNSW M of the meta-HNSW (>= 2)
  uint32_t memnodes = 1;           // regions: group g on memnode g % memnodes
  LayoutParams layout;             // internal and shared overflow gap shares
  uint64_t seed = 1;               // partitioning seed
  bool plain_kmeans = false;       // plain Lloyd k-means instead of the capacity-constrained one
  /// Metric of the partitioning and of the meta-HNSW that routes queries to partitions (the
  /// sub-HNSWs use the data's metric). L2 by default, also for inner-product data: k-means
  /// centroids are means, and ranking unnormalised means by inner product favours the tight
  /// clusters (on wordnet, unit vectors, recall@10 at 4 of 16 partitions: 0.80 by inner
  /// product, 0.91 by L2).
  Metric partition_metric = Metric::L2;
  uint32_t kmeans_iterations = 10;
  size_t kmeans_max_train = 0;     // > 0: train the centroids on a sample of this many vectors
  /// Worker threads building sub-HNSWs, each sub-HNSW single-threaded (so the build is
  /// deterministic: the same data and options give the same regions). 0: hardware threads.
  uint32_t threads = 0;
  /// Region offset of the metadata block: kMetadataOffset for a first build; an online rebuild
  /// lays the next epoch out higher (or lower) in the regions.
  uint64_t base_offset = kMetadataOffset;
  /// true: region images (header page, control block, insert buffer, [0, data end)); false:
  /// only [base_offset, data end) of each region, what a rebuild writes.
  bool image = true;
  uint64_t epoch = 1;              // MetaHeader::epoch and the region headers' epoch
  /// The shared insert buffer used while a rebuild runs (compute/dhnsw/control.hpp), on memnode
  /// 0 after its groups; a first build only.
  uint64_t insert_buffer_bytes = 16ull << 20;
  /// An id index in the regions (common/id_table.hpp), for deletes, upserts and duplicate
  /// checks by id; sized for twice the vectors.
  bool id_index = true;
  /// Codes of the vectors (compute/codes.hpp) beside them in each sub-HNSW, for searches over
  /// codes (`--rerank`): the quantizer is trained on up to compute::kCodesTrainRows rows spread over the
  /// data, or `quantizer` is used as it is (a rebuild keeps the live epoch's).
  compute::CodesSpec codes;
  std::shared_ptr<const compute::Quantizer> quantizer;
  /// Boundary copies (compute/dhnsw/boundary.hpp): off by default. Needs the L2 partition metric.
  BoundaryRule boundary;
  /// A progress display (common/progress.hpp) of the vectors put into sub-HNSWs; off for the
  /// rebuilds a serving computenode runs in the background.
  bool progress = false;
};

/// The partitions resolved from BuildOptions::partitions for n vectors.
uint32_t resolve_partitions(uint32_t partitions, size_t n);

struct BuiltIndex {
  MetaHeader header{};          // as written in every region (checksum included)
  std::vector<SubDesc> subs;    // as written in the metadata block
  /// One region image body per memnode: regions[m] is memnode m's region bytes [0, data end)
  /// (RegionPlan::data_end): RegionHeader (mode Dhnsw, dim, metric, elem F32, memnode id and
  /// count, epoch, region_size = region_bytes[m], data_offset = kMetadataOffset, scratch of
  /// kScratchBytes at data end, mode words dhnsw_word::kMetadataOffset, kMetadataSize,
  /// kDataEnd), the metadata block, the groups. The scratch area after it is not held (zero).
  /// With BuildOptions::base_offset above kMetadataOffset, regions[m] holds bytes
  /// [region_base, data end) only (no header page): what a rebuild WRITEs.
  std::vector<std::vector<char>> regions;
  uint64_t region_base = 0;
  std::vector<uint64_t> region_bytes;  // per memnode: the whole region (data end + scratch)
  std::vector<uint64_t> partition_sizes;  // vectors in each sub-HNSW, boundary copies included
  uint64_t copies = 0;                    // boundary copies in all (beyond each vector's primary)
  uint64_t copy_bytes = 0;                // what they take in the sub-HNSWs' blocks (vectors, codes, labels, lists)
  double partition_max_over_mean = 0;
  double partition_inertia = 0;
  double seconds_partition = 0, seconds_build_subs = 0, seconds_layout = 0, seconds_codes = 0, seconds_copies = 0;
  std::shared_ptr<const compute::Quantizer> quantizer;  // of the codes (null: none)
  BuildOptions options;
  Metric metric = Metric::L2;
  uint64_t num_vectors = 0;
  uint32_t dim = 0;
  /// Options, partition sizes (min/mean/max, max/mean), times, region and metadata sizes.
  nlohmann::json report() const;
};

/// Builds the whole index over `n` vectors of `dim` floats (row-major; global id = row, or
/// labels[row] when `labels` is given).
/// Throws std::invalid_argument on bad options (naming the option) and std::runtime_error if
/// the result does not validate.
BuiltIndex build_index(const float* data, size_t n, uint32_t dim, Metric metric, const BuildOptions& opts,
                       const int64_t* labels = nullptr);

/// Before building: each memnode's region bytes for an index of `n` vectors of `dim` with
/// `opts`, estimated from the layout of balanced partitions (Faiss's expected links per vector)
/// with one copy per vector, so at most what the build will need (boundary copies add more).
/// The scratch area and, on memnode 0, the insert buffer are included.
std::vector<uint64_t> estimate_region_bytes(size_t n, uint32_t dim, const BuildOptions& opts);

/// Moves a built index (laid out at its metadata_offset) to region offset `base`: every offset in
/// its metadata and its id index (a rebuild writes the next epoch beside the live one).
void relocate(BuiltIndex& b, uint64_t base);

/// Image file of memnode `id` of `memnodes`: `out` when memnodes == 1, else `out` + "." + id.
std::string image_path(const std::string& out, uint32_t id, uint32_t memnodes);
/// Writes one region image per memnode (memory::write_image at image_path(): body = regions[m],
/// region size = region_bytes[m]).
std::vector<memory::ImageInfo> write_images(const BuiltIndex& built, const std::string& out);

}  // namespace dmhnsw::dhnsw
