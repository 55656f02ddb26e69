#include "compute/dhnsw/boundary.hpp"

#include <faiss/IndexFlat.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dmhnsw::dhnsw {

CopyPlacement::CopyPlacement(const float* centroids, uint32_t P, uint32_t dim, const BoundaryRule& rule)
    : flat_(std::make_unique<faiss::IndexFlatL2>(static_cast<faiss::Index::idx_t>(dim))), P_(P), dim_(dim), rule_(rule) {
  flat_->add(static_cast<faiss::Index::idx_t>(P), centroids);
}

CopyPlacement::~CopyPlacement() = default;
CopyPlacement::CopyPlacement(CopyPlacement&&) noexcept = default;
CopyPlacement& CopyPlacement::operator=(CopyPlacement&&) noexcept = default;

std::vector<std::vector<uint32_t>> CopyPlacement::place(const float* x, size_t n, const uint32_t* primary) const {
  const uint32_t P = P_, dim = dim_;
  const BoundaryRule& rule = rule_;
  std::vector<std::vector<uint32_t>> out(n);
  const uint32_t K = std::min(rule.partitions(), P);
  // The nearest K + 1 centroids: the primary need not be among the nearest K (a balanced
  // partitioning moves vectors out of full partitions).
  const uint32_t k = std::min(K + 1, P);
  const double r2 = rule.ratio * rule.ratio;
  constexpr size_t kChunk = 16384;  // rows per search: distances of a chunk x P stay small
  std::vector<float> D(kChunk * k);
  std::vector<faiss::Index::idx_t> I(kChunk * k);
  for (size_t first = 0; first < n; first += kChunk) {
    const size_t m = std::min(kChunk, n - first);
    flat_->search(static_cast<faiss::Index::idx_t>(m), x + first * dim, k, D.data(), I.data());
    for (size_t i = 0; i < m; ++i) {
      const float* d = D.data() + i * k;
      const faiss::Index::idx_t* id = I.data() + i * k;
      if (id[0] < 0 || id[0] >= static_cast<faiss::Index::idx_t>(P))
        throw std::runtime_error("boundary copies: no nearest centroid for row " + std::to_string(first + i));
      std::vector<uint32_t>& to = out[first + i];
      to.push_back(primary != nullptr ? primary[first + i] : static_cast<uint32_t>(id[0]));
      for (uint32_t j = 0; j < k && to.size() < K; ++j) {
        if (id[j] < 0 || static_cast<uint32_t>(id[j]) == to.front()) continue;
        if (static_cast<double>(d[j]) > r2 * static_cast<double>(d[0])) break;
        to.push_back(static_cast<uint32_t>(id[j]));
      }
    }
  }
  return out;
}

void add_boundary_flags(CLI::App& cmd, BoundaryRule& r, const std::string& prefix) {
  cmd.add_option("--boundary-ratio", r.ratio,
                 prefix + "boundary copies: a vector is also put in every partition whose centroid is within this "
                          "ratio of its nearest centroid's distance (1..100; 0: none); rebuilds and inserts keep them")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  cmd.add_option("--max-copies", r.max_copies,
                 prefix + "boundary copies: partitions a vector is in at most, its own included (1.." +
                     std::to_string(kMaxCopies) + ")")
      ->capture_default_str()
      ->check(CLI::Range(1u, kMaxCopies));
}

}  // namespace dmhnsw::dhnsw
