#pragma once
// Import of an hnswlib index file (HierarchicalNSW::saveIndex, hnswlib 0.6.2) into the
// memnodes as a shine graph: the same node records, allocation, header words and entry point
// a `computenode --mode shine build` leaves, so the unchanged query and insert paths serve it.
//
// The file is parsed here, not with hnswlib's loadIndex (which trusts its input and crashes
// or allocates wildly on a bad file). hnswlib writes no magic and no version: every header
// field is checked against the others and against the file's length instead, every link
// count against its capacity and every neighbour id against the element count. Errors name
// the file and the byte offset of the offending field.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dataset.hpp"
#include "common/distance.hpp"
#include "common/fabric/transport.hpp"
#include "compute/codes.hpp"

namespace dmhnsw::shine {

/// An hnswlib index file, mapped and validated. Element i is hnswlib's internal id i.
class HnswlibFile {
 public:
  /// Bytes of saveIndex's header: 6 size_t, int maxlevel_, u32 enterpoint_node_, 3 size_t,
  /// double mult_, size_t ef_construction_ (x86-64 / aarch64 LP64 sizes, no padding).
  static constexpr uint64_t kHeaderBytes = 96;

  /// Maps and checks `path`. `expect_dim` (0: any) is a dimension the caller knows (--data).
  explicit HnswlibFile(const std::string& path, uint32_t expect_dim = 0);

  const std::string& path() const { return file_->path(); }
  uint64_t file_bytes() const { return file_->size(); }
  uint64_t count() const { return count_; }
  uint64_t max_elements() const { return max_elements_; }
  uint32_t dim() const { return dim_; }
  uint32_t m() const { return m_; }
  uint32_t ef_construction() const { return ef_construction_; }
  /// Top level of the graph and its entry element (count() == 0: -1 and none).
  int max_level() const { return max_level_; }
  uint32_t entry() const { return entry_; }

  unsigned level(uint64_t i) const { return levels_[i]; }
  uint64_t label(uint64_t i) const;
  /// hnswlib marked the element deleted (markDelete): imported as a deleted node.
  bool deleted(uint64_t i) const { return deleted_[i] != 0; }
  uint64_t deleted_count() const { return deleted_count_; }
  /// The element's vector: dim() floats, 4-byte aligned inside the mapping.
  const float* vector(uint64_t i) const;
  /// Neighbour count and ids (unaligned u32s, read with neighbour()) of i's list at `level`.
  uint32_t list_count(uint64_t i, unsigned level) const;
  uint32_t neighbour(uint64_t i, unsigned level, uint32_t j) const;

 private:
  [[noreturn]] void fail(uint64_t offset, const std::string& what) const;
  uint64_t u64_at(uint64_t off) const;
  uint32_t u32_at(uint64_t off) const;
  uint64_t element_offset(uint64_t i) const { return kHeaderBytes + i * per_element_; }
  uint64_t list_offset(uint64_t i, unsigned level) const;
  void check_lists(uint64_t i);

  std::unique_ptr<MappedFile> file_;
  uint64_t count_ = 0, max_elements_ = 0, per_element_ = 0, label_offset_ = 0, data_offset_ = 0;
  uint64_t upper_bytes_per_level_ = 0;  // 4 + maxM_ * 4: one upper-level list
  uint32_t dim_ = 0, m_ = 0, ef_construction_ = 0, entry_ = 0;
  int max_level_ = -1;
  std::vector<uint8_t> levels_, deleted_;
  uint64_t deleted_count_ = 0;
  std::vector<uint64_t> upper_;  // file offset of element i's first upper-level list
};

struct ImportOptions {
  Metric metric = Metric::L2;  // hnswlib's file does not record its space
  uint64_t seed = 100;         // stored for later `computenode insert` runs (their level draws)
  /// An id index for this many ids (labels), so that the index takes any ids, deletes and
  /// upserts; -1: twice the elements (at least 1,024); 0: none.
  int64_t id_capacity = -1;
  /// Compressed vectors stored with the index, as `computenode build --codes` stores them:
  /// the quantizer is trained on up to compute::kCodesTrainRows of the file's vectors (spread over all
  /// of them), and every element's code (deleted ones too: they guide searches, as a build's
  /// deleted nodes keep the code their insert appended) goes to the codes log of the memnode
  /// that holds its record.
  compute::CodesSpec codes;
  /// Codes log entries per memnode (0: twice the elements over the memnodes, at least 1,024).
  uint64_t codes_capacity = 0;
  uint64_t chunk_bytes = 4u << 20;  // one WRITE: consecutive node records of one memnode
  uint32_t writes_per_doorbell = 8;
  bool progress = true;
};

/// Formats the (empty) memnodes of `c` for a shine index with the file's parameters and
/// writes every element as a node; the entry point is written last. Refuses memnodes that
/// already hold an index or are too small, naming the memnode. Returns a report (JSON).
nlohmann::json import_hnswlib(fabric::Cluster& c, const HnswlibFile& f, const ImportOptions& o);

}  // namespace dmhnsw::shine
