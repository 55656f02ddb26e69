#include "compute/shine/vector_cache.hpp"

#include <sys/mman.h>

#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace dmhnsw::shine {

namespace {
size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

VectorCache::VectorCache(uint64_t max_bytes, uint32_t dim) : dim_(dim), stride_(align_up(dim, 16)) {
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  // Per vector slot: the vector, its label and level, and two table cells (the table is at
  // most half full, so probes stay short).
  const uint64_t per_slot = stride_ * sizeof(float) + sizeof(uint32_t) + 1 + 2 * 2 * sizeof(uint64_t);
  capacity_ = dim == 0 ? 0 : max_bytes / per_slot;
  if (capacity_ == 0) return;
  size_t cells = 2;
  shift_ = 63;
  while (cells < 2 * capacity_) {
    cells *= 2;
    --shift_;
  }
  mask_ = cells - 1;
  const size_t vec_bytes = align_up(capacity_ * stride_ * sizeof(float), 4096);
  const size_t label_bytes = align_up(capacity_ * sizeof(uint64_t), 4096);
  const size_t level_bytes = align_up(capacity_, 4096);
  const size_t cell_bytes = align_up(cells * sizeof(uint64_t), 4096);
  map_bytes_ = vec_bytes + label_bytes + level_bytes + 2 * cell_bytes;
  // Reserved, not committed: pages are touched as entries arrive (zero pages are empty cells).
  map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw std::runtime_error("shine build: cannot reserve " + std::to_string(map_bytes_ >> 20) +
                             " MiB for the vector cache (lower --cache-bytes)");
  }
  char* p = static_cast<char*>(map_);
  vecs_ = reinterpret_cast<float*>(p);
  labels_ = reinterpret_cast<uint64_t*>(p + vec_bytes);
  levels_ = reinterpret_cast<uint8_t*>(p + vec_bytes + label_bytes);
  // Zero-filled memory is a valid array of empty atomics on every platform we build for.
  keys_ = reinterpret_cast<std::atomic<uint64_t>*>(p + vec_bytes + label_bytes + level_bytes);
  slots_ = reinterpret_cast<std::atomic<uint64_t>*>(p + vec_bytes + label_bytes + level_bytes + cell_bytes);
}

VectorCache::~VectorCache() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

uint64_t VectorCache::bytes() const {
  return entries() * (stride_ * sizeof(float) + sizeof(uint64_t) + 1);
}

std::optional<VecEntry> VectorCache::find(RemotePtr p) const {
  if (capacity_ == 0) return std::nullopt;
  const uint64_t key = p.raw();
  for (size_t i = home(key);; i = (i + 1) & mask_) {
    const uint64_t k = keys_[i].load(std::memory_order_acquire);
    if (k == 0) return std::nullopt;
    if (k == key) {
      const uint64_t s = slots_[i].load(std::memory_order_acquire);
      if (s == 0) return std::nullopt;  // still being written: read it remotely meanwhile
      return view(s - 1);
    }
  }
}

void VectorCache::invalidate(RemotePtr p) {
  if (capacity_ == 0) return;
  const uint64_t key = p.raw();
  for (size_t i = home(key);; i = (i + 1) & mask_) {
    uint64_t k = keys_[i].load(std::memory_order_acquire);
    if (k == 0) return;
    if (k == key) {  // one cell per key: insert only takes an empty cell for a key it did not find
      keys_[i].compare_exchange_strong(k, kDead, std::memory_order_acq_rel);
      return;
    }
  }
}

std::optional<VecEntry> VectorCache::insert(RemotePtr p, const float* v, unsigned level, uint64_t label) {
  if (auto e = find(p)) return e;
  const uint64_t key = p.raw();
  if (key == 0 || next_.load(std::memory_order_relaxed) >= capacity_) return std::nullopt;
  const uint64_t s = next_.fetch_add(1, std::memory_order_relaxed);
  if (s >= capacity_) return std::nullopt;
  std::memcpy(vecs_ + s * stride_, v, dim_ * sizeof(float));
  labels_[s] = label;
  levels_[s] = static_cast<uint8_t>(level);
  for (size_t i = home(key);; i = (i + 1) & mask_) {
    uint64_t k = keys_[i].load(std::memory_order_acquire);
    if (k == 0) {
      if (keys_[i].compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
        slots_[i].store(s + 1, std::memory_order_release);
        entries_.fetch_add(1, std::memory_order_relaxed);
        return view(s);
      }
      // Another key took the cell: k now holds it; look at it below.
    }
    // Another thread cached p first: this copy (slot s, now unused) is just as good.
    if (k == key) return view(s);
  }
}

}  // namespace dmhnsw::shine
