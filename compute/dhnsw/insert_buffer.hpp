#pragma once
// d-HNSW's shared insert buffer (paper section 4.5): while a rebuild runs, inserts are appended
// here (memnode 0, laid out by the control block: compute/dhnsw/control.hpp) and every query
// also searches the buckets its vector hashes near. The rebuild master (compute/dhnsw/epoch.hpp)
// opens, freezes, merges and empties it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/index.hpp"

namespace dmhnsw::dhnsw {

/// One buffered insert as read back.
struct BufferedVector {
  int64_t id = 0;
  std::vector<float> v;
};

enum class AppendResult { Ok, NotActive, Full };
/// Appends one vector to its bucket of the insert buffer (FETCH_ADD a slot, WRITE the entry,
/// WRITE its commit word). NotActive: the bucket was not taking inserts (the caller inserts in
/// place instead); Full: its bucket has no free slot.
AppendResult buffer_append(fabric::Endpoint& ep, const Control& c, const float* x, uint32_t dim, int64_t id);

/// The committed entries of the given buckets (all when `buckets` is empty), per the control
/// block `c` (its bucket words and generation).
std::vector<BufferedVector> buffer_read(fabric::Endpoint& ep, const Control& c, uint32_t dim,
                                        const std::vector<uint32_t>& buckets = {});

/// The buckets a query probes: its own and those one hyperplane away.
std::vector<uint32_t> probe_buckets(const Control& c, const float* q, uint32_t dim);

/// While a rebuild runs the buffer holds acknowledged inserts: each of the n queries (n x dim)
/// is compared with the entries of the buckets it probes, and answers[q] starts with the best k
/// of them (distances on Faiss's scale). Returns the entries compared.
uint64_t buffer_search(fabric::Endpoint& ep, const Control& ctl, uint32_t dim, bool ip, uint32_t k, const float* queries,
                       size_t n, Answer* answers);

}  // namespace dmhnsw::dhnsw
