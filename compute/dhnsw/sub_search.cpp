#include "compute/dhnsw/sub_search.hpp"

#include <faiss/IndexFlatCodes.h>
#include <faiss/impl/HNSW.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace dmhnsw::dhnsw {

SubView view_of(const faiss::IndexHNSWFlat& idx, const int64_t* labels) {
  SubView v;
  const faiss::HNSW& g = idx.hnsw;
  const auto* storage = dynamic_cast<const faiss::IndexFlatCodes*>(idx.storage);
  if (storage == nullptr || storage->code_size != sizeof(float) * static_cast<size_t>(idx.d)) return v;
  v.count = static_cast<uint64_t>(idx.ntotal);
  v.entry_point = g.entry_point;
  v.max_level = g.max_level;
  static_assert(sizeof(g.offsets[0]) == sizeof(uint64_t) && sizeof(g.neighbors[0]) == sizeof(int32_t));
  v.offsets = reinterpret_cast<const uint64_t*>(g.offsets.data());
  v.neighbors = g.neighbors.data();
  v.neighbor_entries = g.neighbors.size();
  v.labels = labels;
  v.vectors = reinterpret_cast<const float*>(storage->codes.data());
  v.cum = std::span<const int>(g.cum_nneighbor_per_level);
  return v;
}

SubView view_of(const SubIndex& s) {
  if (!s.index || s.coded) return SubView{};
  return view_of(*s.index, s.labels.data());
}

std::vector<int> neighbors_per_level(uint32_t m) {
  const faiss::HNSW g(static_cast<int>(m));
  return g.cum_nneighbor_per_level;
}

std::optional<SubView> mapped_view(const char* block, const SubDesc& d, const MetaHeader& h, std::span<const int> cum) {
  if (block == nullptr || d.overflow_used != 0 || d.count == 0 ||
      d.count > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) || h.dim == 0 || h.dim > 65536)
    return std::nullopt;
  const uint64_t n = d.count;
  const uint64_t want[kNumArrays] = {n * 4, (n + 1) * 8, d.arrays[kNeighbors].used, n * 8, d.arrays[kCodes].used,
                                     n * h.dim * uint64_t{4}};
  for (uint32_t a = 0; a < kNumArrays; ++a) {
    const ArraySlot& s = d.arrays[a];
    if (s.used != want[a] || s.used > s.capacity || s.offset > d.block_bytes || s.used > d.block_bytes - s.offset ||
        s.offset % kAlign != 0)
      return std::nullopt;
  }
  if (d.entry_point < 0 || static_cast<uint64_t>(d.entry_point) >= n || d.max_level < 0 ||
      static_cast<size_t>(d.max_level) + 1 >= cum.size())
    return std::nullopt;
  SubView v;
  v.count = n;
  v.entry_point = d.entry_point;
  v.max_level = d.max_level;
  v.offsets = reinterpret_cast<const uint64_t*>(block + d.arrays[kOffsets].offset);
  v.neighbors = reinterpret_cast<const int32_t*>(block + d.arrays[kNeighbors].offset);
  v.neighbor_entries = d.arrays[kNeighbors].used / 4;
  v.labels = reinterpret_cast<const int64_t*>(block + d.arrays[kLabels].offset);
  v.vectors = reinterpret_cast<const float*>(block + d.arrays[kVectors].offset);
  v.cum = cum;
  return v;
}

void SubSearcher::new_query(uint64_t count) {
  if (tags_.size() < count) tags_.resize(count, 0);
  if (++tag_ == 0) {  // the tags wrapped: none may look visited
    std::fill(tags_.begin(), tags_.end(), 0);
    tag_ = 1;
  }
  top_.clear();
  cand_.clear();
}

namespace {

/// [begin, end) of node `c`'s list at `level`, if it lies inside the neighbours array.
inline bool list_range(const SubView& v, uint32_t c, int level, uint64_t& begin, uint64_t& end) {
  if (static_cast<size_t>(level) + 1 >= v.cum.size()) return false;
  // One load: an in-place insert may write the offsets while they are read.
  const uint64_t at = __atomic_load_n(v.offsets + c, __ATOMIC_RELAXED);
  const int l0 = v.cum[level], l1 = v.cum[level + 1];
  if (l0 < 0 || l1 < l0) return false;
  const uint64_t lo = static_cast<uint64_t>(l0), hi = static_cast<uint64_t>(l1);
  if (at > v.neighbor_entries || hi > v.neighbor_entries - at) return false;
  begin = at + lo;
  end = at + hi;
  return true;
}

inline void prefetch_lines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

}  // namespace

size_t SubSearcher::search(const SubView& v, const DistanceComputer& dc, bool ip, const float* q, uint32_t k,
                           uint32_t ef_search, std::pair<float, int64_t>* out) {
  if (v.count == 0 || v.entry_point < 0 || static_cast<uint64_t>(v.entry_point) >= v.count || k == 0) return 0;
  const size_t dim = dc.dim(), vbytes = dim * sizeof(float);
  const size_t ahead = std::min<size_t>(vbytes, 256);  // lines asked for ahead of a distance
  const uint32_t n = static_cast<uint32_t>(v.count);
  auto vec = [&](uint32_t i) { return v.vectors + size_t{i} * dim; };
  auto dist = [&](uint32_t i) {
    ++distances_;
    return dc(q, vec(i));
  };

  // Upper levels: move to the nearest neighbour while one is nearer (Faiss's greedy_update_nearest).
  uint32_t nearest = static_cast<uint32_t>(v.entry_point);
  float d_nearest = dist(nearest);
  for (int level = v.max_level; level >= 1; --level) {
    for (bool moved = true; moved;) {
      moved = false;
      uint64_t b = 0, e = 0;
      if (!list_range(v, nearest, level, b, e)) break;
      for (uint64_t j = b; j < e; ++j) {
        const int32_t x = __atomic_load_n(v.neighbors + j, __ATOMIC_RELAXED);
        if (x < 0) break;
        if (static_cast<uint32_t>(x) >= n) continue;
        const float d = dist(static_cast<uint32_t>(x));
        if (d < d_nearest) {
          nearest = static_cast<uint32_t>(x);
          d_nearest = d;
          moved = true;
        }
      }
    }
  }

  // Level 0: hnswlib's searchBaseLayerST.
  const size_t ef = std::max<size_t>(ef_search, k);
  new_query(v.count);
  uint16_t* tags = tags_.data();
  const uint16_t tag = tag_;
  auto label = [&](uint32_t i) { return v.labels ? __atomic_load_n(v.labels + i, __ATOMIC_RELAXED) : int64_t{i}; };
  auto live = [&](uint32_t i) { return label(i) >= 0; };
  auto heap_less = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
    return a.first < b.first;
  };
  float bound = std::numeric_limits<float>::infinity();
  tags[nearest] = tag;
  cand_.emplace_back(-d_nearest, nearest);
  if (live(nearest)) {
    top_.emplace_back(d_nearest, nearest);
    bound = d_nearest;
  }
  while (!cand_.empty()) {
    const auto [neg, c] = cand_.front();
    // Without enough live results the search goes on past the bound (deleted nodes guide it).
    if (-neg > bound && top_.size() >= ef) break;
    std::pop_heap(cand_.begin(), cand_.end(), heap_less);
    cand_.pop_back();
    uint64_t b = 0, e = 0;
    if (!list_range(v, c, 0, b, e)) continue;
    // The list of the candidate likely expanded next (its offset was asked for when it came in),
    // loaded while this hop's distances run.
    if (!cand_.empty()) {
      uint64_t nb = 0, ne = 0;
      if (list_range(v, cand_.front().second, 0, nb, ne)) prefetch_lines(v.neighbors + nb, (ne - nb) * sizeof(int32_t));
    }
    if (fresh_.size() < e - b) fresh_.resize(e - b);
    uint32_t* const fresh = fresh_.data();
    size_t nf = 0;
    for (uint64_t j = b; j < e; ++j) {
      const int32_t x = __atomic_load_n(v.neighbors + j, __ATOMIC_RELAXED);
      if (x < 0) break;
      const uint32_t u = static_cast<uint32_t>(x);
      if (u >= n) continue;
      // Kept when not met before, without a branch on it: that test goes either way, and a
      // mispredicted branch per neighbour costs more than the store and prefetch done for nothing.
      const size_t is_new = tags[u] != tag;
      tags[u] = tag;
      fresh[nf] = u;
      nf += is_new;
      __builtin_prefetch(vec(u), 0, 3);
    }
    for (size_t i = 0; i < nf; ++i) {
      const uint32_t u = fresh[i];
      if (i + 1 < nf) prefetch_lines(vec(fresh[i + 1]), ahead);
      const float d = dist(u);
      if (top_.size() < ef || d < bound) {
        cand_.emplace_back(-d, u);
        std::push_heap(cand_.begin(), cand_.end(), heap_less);
        __builtin_prefetch(v.offsets + u, 0, 3);
        if (live(u)) {
          top_.emplace_back(d, u);
          std::push_heap(top_.begin(), top_.end(), heap_less);
          if (top_.size() > ef) {
            std::pop_heap(top_.begin(), top_.end(), heap_less);
            top_.pop_back();
          }
          bound = top_.front().first;
        }
      }
    }
  }
  std::sort_heap(top_.begin(), top_.end(), heap_less);
  size_t found = 0;
  for (const auto& [d, i] : top_) {
    if (found == k) break;
    const int64_t l = label(i);
    if (l < 0) continue;  // deleted since it was taken
    out[found++] = {ip ? 1.0f - d : d, l};
  }
  return found;
}

}  // namespace dmhnsw::dhnsw
