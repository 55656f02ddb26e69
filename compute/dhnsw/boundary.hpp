#pragma once
// d-HNSW's boundary copies: a vector near the border of its partition is also placed in the
// partitions whose centroids are nearly as close (SPANN's closure assignment: within a ratio of
// the distance to its nearest centroid), so a query probing few partitions still meets it. The
// build places them (compute/dhnsw/build.cpp), inserts place them likewise
// (compute/dhnsw/insert.cpp), and the id index maps copy k >= 1 under copy_key(id, k)
// (common/id_table.hpp) so that deletes and upserts reach every one.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "compute/dhnsw/layout.hpp"

namespace faiss {
struct IndexFlatL2;
}

namespace dmhnsw::dhnsw {

struct BoundaryRule {
  /// A partition whose centroid is within `ratio` times the distance to the nearest centroid
  /// (L2, not squared) takes a copy; below 1: none.
  double ratio = 0;
  uint32_t max_copies = kMaxCopies;  // partitions a vector is in at most, the primary included
  bool enabled() const { return max_copies > 1 && ratio >= 1.0; }
  /// Partitions a vector may be in: max_copies with copies, else 1 (the id index keys 0 .. this - 1).
  unsigned partitions() const { return enabled() ? max_copies : 1; }
  static BoundaryRule of(const MetaHeader& h) {
    BoundaryRule r;
    if (h.max_copies > 1) {
      r.max_copies = h.max_copies;
      r.ratio = static_cast<double>(h.boundary_ratio_ppm) / 1e6;
    }
    return r;
  }
};

/// Where vectors go under a rule, over the P centroids (P x dim, copied once into a flat index).
class CopyPlacement {
 public:
  CopyPlacement(const float* centroids, uint32_t P, uint32_t dim, const BoundaryRule& rule);
  ~CopyPlacement();
  CopyPlacement(CopyPlacement&&) noexcept;
  CopyPlacement& operator=(CopyPlacement&&) noexcept;
  /// For each of n vectors (n x dim), the partitions it goes to: its primary first (primary[i], or
  /// its nearest centroid when `primary` is null), then the other partitions within the rule,
  /// nearest first, at most rule.max_copies in all. Distances are exact L2 to the centroids.
  std::vector<std::vector<uint32_t>> place(const float* x, size_t n, const uint32_t* primary) const;

 private:
  std::unique_ptr<faiss::IndexFlatL2> flat_;
  uint32_t P_, dim_;
  BoundaryRule rule_;
};

/// Registers --boundary-ratio and --max-copies on a build command; `prefix` starts their help
/// ("dhnsw: " where the command builds both modes).
void add_boundary_flags(CLI::App& cmd, BoundaryRule& r, const std::string& prefix = "");

}  // namespace dmhnsw::dhnsw
