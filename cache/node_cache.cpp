// SHINE node cache: lock-free lookups over tagged chain links, per-bucket locks for admission
// and eviction, replacement through a cooling table of small FIFOs (paper section 5).
//
// Memory layout (all zero-initialised anonymous mappings, so untouched pages cost nothing and
// all-zero bytes are a valid empty state):
//   headers_[i]  {meta, key, next, label}   32 bytes per entry
//   vectors_     dim floats per entry, stored as 8-byte words (last word padded)
//   buckets_[b]  {head link, spinlock}       16 bytes, power-of-two count >= capacity
//   fifos_[f]    {spinlock, count, idx[8]}   the cooling table
//
// meta = tag << 32 | state. A link = tag << 32 | (index + 1); 0 ends a chain. The tag of an
// entry changes only when it is unlinked (eviction), so a link whose tag differs from the
// entry's tag is stale, and a reader whose entry's tag changed while it copied the vector
// restarts (seqlock). Every shared word is accessed through std::atomic_ref: an entry's
// fields are written with release stores and read with acquire loads (plain moves on x86), so
// a reader that saw any value written after a tag bump sees the bump when it re-reads the
// tag. No standalone fences (ThreadSanitizer does not model them) and no data race.
//
// Cooling invariants (all transitions out of / into "cooling" happen under the lock of the
// FIFO the entry's key hashes to): state == cooling  <=>  the entry's index is in that FIFO.
// A key falling off a FIFO turns "evicting" (no reader can re-warm it any more) and is then
// unlinked under its bucket lock; the freed entry goes straight to the admitting thread.
#include "cache/node_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dmhnsw::cache {
namespace {

constexpr uint32_t kFree = 0, kHot = 1, kCooling = 2, kEvicting = 3;
constexpr uint32_t kNone = ~uint32_t{0};
constexpr uint32_t kFifoSlots = 8;
constexpr unsigned kStripes = 64;
constexpr unsigned kMaxRestarts = 256;   // lookup gives up (reports a miss) after this many
constexpr unsigned kVictimTries = 32;    // random probes for a hot entry per cooling step
constexpr uint64_t kMaxEntries = 0xFFFFFFFEull;

template <typename T>
using aref = std::atomic_ref<T>;

constexpr uint64_t make_meta(uint32_t tag, uint32_t state) { return (uint64_t{tag} << 32) | state; }
constexpr uint32_t meta_tag(uint64_t m) { return static_cast<uint32_t>(m >> 32); }
constexpr uint32_t meta_state(uint64_t m) { return static_cast<uint32_t>(m); }
constexpr uint64_t make_link(uint32_t idx, uint32_t tag) { return (uint64_t{tag} << 32) | (uint64_t{idx} + 1); }
constexpr uint32_t link_pos(uint64_t l) { return static_cast<uint32_t>(l); }  // index + 1, 0 = end
constexpr uint32_t link_tag(uint64_t l) { return static_cast<uint32_t>(l >> 32); }

inline uint64_t mix64(uint64_t x) {  // murmur3 finaliser
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

inline uint64_t splitmix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t bounded(uint64_t r, uint64_t n) {  // r uniform in [0, 2^64) -> [0, n)
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Test-and-test-and-set lock on a 32-bit word; yields after a short spin (few cores).
inline void spin_lock(uint32_t& word) {
  aref<uint32_t> w(word);
  for (unsigned spins = 0;; ++spins) {
    if (w.load(std::memory_order_relaxed) == 0 && w.exchange(1, std::memory_order_acquire) == 0) return;
    if (spins < 64) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}
inline void spin_unlock(uint32_t& word) { aref<uint32_t>(word).store(0, std::memory_order_release); }

struct SpinGuard {
  explicit SpinGuard(uint32_t& w) : w_(w) { spin_lock(w_); }
  ~SpinGuard() { spin_unlock(w_); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;
  uint32_t& w_;
};

// Zero-filled anonymous mapping; pages are materialised on first touch.
class Mapping {
 public:
  Mapping() = default;
  explicit Mapping(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("NodeCache: cannot map " + std::to_string(bytes_) + " bytes: " + std::strerror(errno));
    p_ = p;
#ifdef MADV_HUGEPAGE
    // Large caches are read at random: huge pages spare a TLB miss (page walk) per hit.
    if (bytes_ >= (std::size_t{4} << 20)) ::madvise(p_, bytes_, MADV_HUGEPAGE);
#endif
  }
  ~Mapping() {
    if (p_ != nullptr) ::munmap(p_, bytes_);
  }
  Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

struct EntryHeader {  // 40 bytes
  uint64_t meta;
  uint64_t key;
  uint64_t next;  // tagged link to the next entry of the chain
  uint64_t label;
  uint32_t level;       // the node's level (the replay's admission needs it for hits too)
  uint32_t generation;  // of the record when it was read (a reused record has another)
};
static_assert(sizeof(EntryHeader) == 40);

struct Bucket {  // 16 bytes
  uint64_t head;
  uint32_t lock;
  uint32_t unused;
};
static_assert(sizeof(Bucket) == 16);

struct CoolingFifo {  // front = idx[0], back = idx[count - 1]
  uint32_t lock;
  uint32_t count;
  uint32_t idx[kFifoSlots];
};

struct alignas(64) Stripe {
  std::atomic<uint64_t> hits{0}, misses{0}, cooling_hits{0}, admissions{0}, rejections{0}, evictions{0};
  std::atomic<uint64_t> rng{0};

  uint64_t next_random() {  // splitmix64; a lost update between two threads of one stripe is harmless
    const uint64_t x = rng.load(std::memory_order_relaxed) + 0x9E3779B97F4A7C15ull;
    rng.store(x, std::memory_order_relaxed);
    return splitmix(x);
  }
};

inline void bump(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

std::atomic<uint64_t> g_next_cache_uid{1};

// The stripe of the calling thread in the cache it used last (one-entry memo per thread).
struct ThreadStripe {
  uint64_t cache_uid = 0;
  unsigned slot = 0;
};
thread_local ThreadStripe t_stripe;

uint64_t vector_bytes(uint32_t dim) { return (uint64_t{dim} * 4 + 7) / 8 * 8; }

}  // namespace

struct NodeCache::Impl {
  NodeCacheConfig cfg;
  uint64_t cap = 0;
  uint32_t dim = 0;
  uint64_t vec_stride = 0;  // bytes per vector slot (multiple of 8)
  uint64_t vec_words = 0;   // vec_stride / 8
  uint64_t last_word_bytes = 8;

  Mapping headers_map, vectors_map, buckets_map, fifos_map;
  EntryHeader* headers = nullptr;
  unsigned char* vectors = nullptr;
  Bucket* buckets = nullptr;
  uint64_t bucket_mask = 0;
  CoolingFifo* fifos = nullptr;
  uint32_t nfifos = 0;
  uint32_t fifo_len = 0;

  std::atomic<uint64_t> next_unused{0};  // entries [next_unused, cap) were never used
  std::mutex free_mu;
  std::vector<uint32_t> free_list;  // released without being linked (lost admission races)
  std::atomic<uint32_t> free_count{0};
  std::atomic<uint64_t> log_applied{0};  // NodeCache::applied()

  // Per-thread counters and RNGs. Threads get stripes in the order they first use this cache
  // (the first one stripe 0, RNG seeded with cfg.seed + 0), so a single-threaded user such as
  // the replay is deterministic whichever thread it runs on.
  std::unique_ptr<Stripe[]> stripes;
  const uint64_t uid = g_next_cache_uid.fetch_add(1, std::memory_order_relaxed);
  std::atomic<unsigned> next_slot{0};

  explicit Impl(const NodeCacheConfig& c) : cfg(c) {
    if (!(cfg.admit_probability >= 0.0)) cfg.admit_probability = 0.0;  // also NaN
    if (cfg.admit_probability > 1.0) cfg.admit_probability = 1.0;
    if (!(cfg.cooling_share > 0.0)) cfg.cooling_share = 0.0;
    if (cfg.cooling_share > 1.0) cfg.cooling_share = 1.0;
    dim = cfg.dim;
    cap = std::min<uint64_t>(cfg.capacity_bytes / NodeCache::entry_bytes(dim), kMaxEntries);
    vec_stride = vector_bytes(dim);
    vec_words = vec_stride / 8;
    last_word_bytes = (uint64_t{dim} * 4) % 8 == 0 ? 8 : 4;

    stripes = std::make_unique<Stripe[]>(kStripes);
    for (unsigned s = 0; s < kStripes; ++s) stripes[s].rng.store(cfg.seed + s, std::memory_order_relaxed);
    if (cap == 0) return;

    headers_map = Mapping(cap * sizeof(EntryHeader));
    headers = headers_map.as<EntryHeader>();
    vectors_map = Mapping(cap * vec_stride);
    vectors = vectors_map.as<unsigned char>();

    uint64_t nb = 1;
    while (nb < cap) nb <<= 1;
    buckets_map = Mapping(nb * sizeof(Bucket));
    buckets = buckets_map.as<Bucket>();
    bucket_mask = nb - 1;

    // Cooling table: ~cooling_share of the entries, FIFOs of 8 keys (shorter for tiny caches).
    const uint64_t target = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(static_cast<double>(cap) * cfg.cooling_share)));
    fifo_len = static_cast<uint32_t>(std::min<uint64_t>(kFifoSlots, target));
    nfifos = static_cast<uint32_t>(std::max<uint64_t>(1, target / fifo_len));
    fifos_map = Mapping(uint64_t{nfifos} * sizeof(CoolingFifo));
    fifos = fifos_map.as<CoolingFifo>();
  }

  Stripe& stripe() {
    ThreadStripe& t = t_stripe;
    if (t.cache_uid != uid) {  // first use of this cache by this thread (or switched caches)
      t.cache_uid = uid;
      t.slot = next_slot.fetch_add(1, std::memory_order_relaxed) % kStripes;
    }
    return stripes[t.slot];
  }
  Bucket& bucket_of(uint64_t h) { return buckets[h & bucket_mask]; }
  CoolingFifo& fifo_of(uint64_t h) { return fifos[bounded(h, nfifos)]; }  // high bits; buckets use the low ones
  uint64_t* vec_of(uint32_t idx) { return reinterpret_cast<uint64_t*>(vectors + uint64_t{idx} * vec_stride); }

  // Prefetches the first lines of an entry's vector (the copy loop streams the rest).
  void prefetch_vector(uint32_t idx) {
    const char* p = reinterpret_cast<const char*>(vec_of(idx));
    const uint64_t lines = std::min<uint64_t>((vec_stride + 63) / 64, 8);
    for (uint64_t i = 0; i < lines; ++i) __builtin_prefetch(p + 64 * i, 0, 3);
  }

  void copy_out(uint32_t idx, float* dst) {
    uint64_t* src = vec_of(idx);
    auto* out = reinterpret_cast<unsigned char*>(dst);
    const uint64_t full = vec_words - (last_word_bytes == 8 ? 0 : 1);
    for (uint64_t w = 0; w < full; ++w) {
      const uint64_t v = aref<uint64_t>(src[w]).load(std::memory_order_acquire);
      std::memcpy(out + w * 8, &v, 8);
    }
    if (full != vec_words) {
      const uint64_t v = aref<uint64_t>(src[full]).load(std::memory_order_acquire);
      std::memcpy(out + full * 8, &v, 4);
    }
  }

  void copy_in(uint32_t idx, const float* srcf) {
    uint64_t* dst = vec_of(idx);
    const auto* in = reinterpret_cast<const unsigned char*>(srcf);
    const uint64_t full = vec_words - (last_word_bytes == 8 ? 0 : 1);
    for (uint64_t w = 0; w < full; ++w) {
      uint64_t v;
      std::memcpy(&v, in + w * 8, 8);
      aref<uint64_t>(dst[w]).store(v, std::memory_order_release);
    }
    if (full != vec_words) {
      uint64_t v = 0;
      std::memcpy(&v, in + full * 8, 4);
      aref<uint64_t>(dst[full]).store(v, std::memory_order_release);
    }
  }

  // Lock-free search. Returns the entry index (and its validated meta) or kNone.
  template <bool kCopy>
  uint32_t find(uint64_t key, uint64_t h, float* vec, uint64_t* label, uint64_t* meta_out, unsigned* level = nullptr,
                uint32_t* generation = nullptr) {
    Bucket& b = bucket_of(h);
    for (unsigned attempt = 0; attempt < kMaxRestarts; ++attempt) {
      uint64_t link = aref<uint64_t>(b.head).load(std::memory_order_acquire);
      bool restart = false;
      for (uint64_t hops = 0; link_pos(link) != 0; ++hops) {
        if (hops > cap) {  // cannot happen in a consistent chain; be safe against livelock
          restart = true;
          break;
        }
        const uint32_t idx = link_pos(link) - 1;
        EntryHeader& e = headers[idx];
        if constexpr (kCopy) prefetch_vector(idx);  // overlaps with the header's miss
        const uint64_t m1 = aref<uint64_t>(e.meta).load(std::memory_order_acquire);
        if (meta_tag(m1) != link_tag(link)) {
          restart = true;
          break;
        }
        const uint64_t k = aref<uint64_t>(e.key).load(std::memory_order_acquire);
        if (k == key) {
          uint64_t lab = 0;
          uint32_t lev = 0, gen = 0;
          if constexpr (kCopy) {
            copy_out(idx, vec);
            lab = aref<uint64_t>(e.label).load(std::memory_order_acquire);
            lev = aref<uint32_t>(e.level).load(std::memory_order_acquire);
            gen = aref<uint32_t>(e.generation).load(std::memory_order_acquire);
          }
          const uint64_t m2 = aref<uint64_t>(e.meta).load(std::memory_order_relaxed);
          if (meta_tag(m2) != meta_tag(m1)) {
            restart = true;
            break;
          }
          if constexpr (kCopy) {
            if (label != nullptr) *label = lab;
            if (level != nullptr) *level = lev;
            if (generation != nullptr) *generation = gen;
          }
          if (meta_out != nullptr) *meta_out = m2;
          return idx;
        }
        const uint64_t next = aref<uint64_t>(e.next).load(std::memory_order_acquire);
        if (meta_tag(aref<uint64_t>(e.meta).load(std::memory_order_relaxed)) != meta_tag(m1)) {
          restart = true;
          break;
        }
        link = next;
      }
      if (!restart) return kNone;
      cpu_relax();
    }
    return kNone;
  }

  // A hit on a cooling entry: take its key out of the FIFO, make it hot again.
  bool rewarm(uint32_t idx, uint64_t h, uint32_t tag) {
    CoolingFifo& f = fifo_of(h);
    SpinGuard g(f.lock);
    uint64_t expected = make_meta(tag, kCooling);
    if (!aref<uint64_t>(headers[idx].meta)
             .compare_exchange_strong(expected, make_meta(tag, kHot), std::memory_order_acq_rel,
                                      std::memory_order_relaxed))
      return false;
    for (uint32_t i = 0; i < f.count; ++i) {
      if (f.idx[i] == idx) {
        for (uint32_t j = i + 1; j < f.count; ++j) f.idx[j - 1] = f.idx[j];
        --f.count;
        return true;
      }
    }
    assert(false && "cooling entry missing from its FIFO");
    return true;
  }

  // Under the FIFO's lock: drop its back entry (cooling -> evicting). Returns its index.
  uint32_t drop_back_locked(CoolingFifo& f) {
    const uint32_t v = f.idx[--f.count];
    aref<uint64_t> vm(headers[v].meta);
    const uint64_t m = vm.load(std::memory_order_relaxed);
    assert(meta_state(m) == kCooling);
    vm.store(make_meta(meta_tag(m), kEvicting), std::memory_order_release);
    return v;
  }

  // Puts a random hot entry into the cooling table. Returns {found a victim, dropped entry}.
  std::pair<bool, uint32_t> cool_one(Stripe& s) {
    for (unsigned t = 0; t < kVictimTries; ++t) {
      const uint32_t idx = static_cast<uint32_t>(bounded(s.next_random(), cap));
      aref<uint64_t> am(headers[idx].meta);
      uint64_t m = am.load(std::memory_order_acquire);
      if (meta_state(m) != kHot) continue;
      const uint64_t key = aref<uint64_t>(headers[idx].key).load(std::memory_order_relaxed);
      CoolingFifo& f = fifo_of(mix64(key));
      SpinGuard g(f.lock);
      // The tag pins the key: if the entry was recycled since, the CAS fails.
      if (!am.compare_exchange_strong(m, make_meta(meta_tag(m), kCooling), std::memory_order_acq_rel,
                                      std::memory_order_relaxed))
        continue;
      uint32_t dropped = kNone;
      if (f.count == fifo_len) dropped = drop_back_locked(f);
      for (uint32_t j = f.count; j > 0; --j) f.idx[j] = f.idx[j - 1];
      f.idx[0] = idx;
      ++f.count;
      return {true, dropped};
    }
    return {false, kNone};
  }

  // Fallback when no hot entry is found (tiny caches, most entries cooling): drop the oldest
  // key of some non-empty FIFO.
  uint32_t force_drop(Stripe& s) {
    const uint32_t start = static_cast<uint32_t>(bounded(s.next_random(), nfifos));
    const uint32_t scan = std::min<uint32_t>(nfifos, 256);
    for (uint32_t i = 0; i < scan; ++i) {
      CoolingFifo& f = fifos[(start + i) % nfifos];
      SpinGuard g(f.lock);
      if (f.count > 0) return drop_back_locked(f);
    }
    return kNone;
  }

  // Unlinks an evicting entry under its bucket lock and bumps its tag; the caller owns it.
  void evict(uint32_t idx, Stripe& s) {
    EntryHeader& e = headers[idx];
    const uint64_t key = aref<uint64_t>(e.key).load(std::memory_order_relaxed);
    Bucket& b = bucket_of(mix64(key));
    {
      SpinGuard g(b.lock);
      uint64_t* pos = &b.head;
      uint64_t link = aref<uint64_t>(*pos).load(std::memory_order_relaxed);
      while (link_pos(link) != 0 && link_pos(link) != idx + 1) {
        pos = &headers[link_pos(link) - 1].next;
        link = aref<uint64_t>(*pos).load(std::memory_order_relaxed);
      }
      assert(link_pos(link) == idx + 1 && "evicted entry not in its chain");
      if (link_pos(link) != 0)
        aref<uint64_t>(*pos).store(aref<uint64_t>(e.next).load(std::memory_order_relaxed), std::memory_order_release);
      aref<uint64_t> am(e.meta);
      const uint64_t m = am.load(std::memory_order_relaxed);
      am.store(make_meta(meta_tag(m) + 1, kFree), std::memory_order_release);
    }
    bump(s.evictions);
  }

  uint32_t acquire_entry(Stripe& s) {
    if (free_count.load(std::memory_order_relaxed) != 0) {
      std::lock_guard<std::mutex> g(free_mu);
      if (!free_list.empty()) {
        const uint32_t idx = free_list.back();
        free_list.pop_back();
        free_count.store(static_cast<uint32_t>(free_list.size()), std::memory_order_relaxed);
        return idx;
      }
    }
    uint64_t u = next_unused.load(std::memory_order_relaxed);
    while (u < cap) {
      if (next_unused.compare_exchange_weak(u, u + 1, std::memory_order_relaxed)) return static_cast<uint32_t>(u);
    }
    // Full: cool random entries until a key falls off a FIFO. Every successful step without a
    // drop adds one cooling entry, so this ends within the size of the cooling table (plus
    // the re-warms other threads do meanwhile; the bound only guards against livelock).
    const uint64_t max_steps = 4 * uint64_t{nfifos} * fifo_len + 1024;
    for (uint64_t step = 0; step < max_steps; ++step) {
      auto [found, dropped] = cool_one(s);
      if (dropped == kNone && !found) dropped = force_drop(s);
      if (dropped != kNone) {
        evict(dropped, s);
        return dropped;
      }
    }
    const uint32_t dropped = force_drop(s);
    if (dropped != kNone) {
      evict(dropped, s);
      return dropped;
    }
    return kNone;
  }

  // Takes `key`'s entry out (a record reused since it was read). False when it is not cached or
  // another thread is evicting it.
  bool erase_key(uint64_t key, uint64_t h, Stripe& s) {
    for (unsigned attempt = 0; attempt < kMaxRestarts; ++attempt) {
      uint64_t m = 0;
      const uint32_t idx = find<false>(key, h, nullptr, nullptr, &m);
      if (idx == kNone) return false;
      aref<uint64_t> am(headers[idx].meta);
      if (meta_state(m) == kHot) {
        if (!am.compare_exchange_strong(m, make_meta(meta_tag(m), kEvicting), std::memory_order_acq_rel,
                                        std::memory_order_relaxed))
          continue;
      } else if (meta_state(m) == kCooling) {
        CoolingFifo& f = fifo_of(h);
        SpinGuard g(f.lock);
        if (!am.compare_exchange_strong(m, make_meta(meta_tag(m), kEvicting), std::memory_order_acq_rel,
                                        std::memory_order_relaxed))
          continue;
        for (uint32_t i = 0; i < f.count; ++i)
          if (f.idx[i] == idx) {
            for (uint32_t j = i + 1; j < f.count; ++j) f.idx[j - 1] = f.idx[j];
            --f.count;
            break;
          }
      } else {
        return false;
      }
      evict(idx, s);
      release_entry(idx);
      return true;
    }
    return false;
  }

  void release_entry(uint32_t idx) {
    std::lock_guard<std::mutex> g(free_mu);
    free_list.push_back(idx);
    free_count.store(static_cast<uint32_t>(free_list.size()), std::memory_order_relaxed);
  }
};

uint64_t NodeCache::entry_bytes(uint32_t dim) {
  // header (meta/tag, key, link, label) + vector + one bucket + the cooling table's share.
  return sizeof(EntryHeader) + vector_bytes(dim) + sizeof(Bucket) + 8;
}

NodeCache::NodeCache(const NodeCacheConfig& cfg) : impl_(std::make_unique<Impl>(cfg)) {}
NodeCache::~NodeCache() = default;

uint64_t NodeCache::capacity_entries() const { return impl_->cap; }
uint32_t NodeCache::dim() const { return impl_->dim; }

bool NodeCache::lookup(RemotePtr key, float* vec, uint64_t* label, unsigned* level, uint32_t* generation) {
  Impl& im = *impl_;
  Stripe& s = im.stripe();
  if (im.cap == 0) {
    bump(s.misses);
    return false;
  }
  const uint64_t h = mix64(key.raw());
  uint64_t m = 0;
  const uint32_t idx = im.find<true>(key.raw(), h, vec, label, &m, level, generation);
  if (idx == kNone) {
    bump(s.misses);
    return false;
  }
  bump(s.hits);
  if (meta_state(m) == kCooling && im.rewarm(idx, h, meta_tag(m))) bump(s.cooling_hits);
  return true;
}

bool NodeCache::lookup_at(RemotePtr key, float* vec, uint32_t generation) {
  Impl& im = *impl_;
  Stripe& s = im.stripe();
  uint64_t label = 0, m = 0;
  uint32_t gen = 0;
  const uint64_t h = mix64(key.raw());
  const uint32_t idx = im.cap == 0 ? kNone : im.find<true>(key.raw(), h, vec, &label, &m, nullptr, &gen);
  if (idx == kNone || gen != generation) {
    bump(s.misses);
    return false;
  }
  bump(s.hits);
  if (meta_state(m) == kCooling && im.rewarm(idx, h, meta_tag(m))) bump(s.cooling_hits);
  return true;
}

bool NodeCache::admit(RemotePtr key, unsigned level, const float* vec, uint64_t label, uint32_t generation) {
  Impl& im = *impl_;
  if (im.cap == 0) return false;
  Stripe& s = im.stripe();
  const uint64_t k = key.raw();
  const uint64_t h = mix64(k);
  if (const uint32_t have = im.find<false>(k, h, nullptr, nullptr, nullptr); have != kNone) {
    if (aref<uint32_t>(im.headers[have].generation).load(std::memory_order_acquire) == generation) return true;
    im.erase_key(k, h, s);  // the record was reused: its old vector goes
  }
  if (level == 0 && im.cfg.admit_probability < 1.0) {
    const double u = static_cast<double>(s.next_random() >> 11) * 0x1.0p-53;
    if (!(u < im.cfg.admit_probability)) {
      bump(s.rejections);
      return false;
    }
  }
  const uint32_t idx = im.acquire_entry(s);
  if (idx == kNone) return false;

  // The entry is private now (free, unlinked). Its tag was bumped when it was unlinked; the
  // release stores publish that bump to any reader (still holding an old link) whose acquire
  // load sees one of the new values, so its tag re-check fails.
  EntryHeader& e = im.headers[idx];
  aref<uint64_t>(e.key).store(k, std::memory_order_release);
  if (im.dim != 0) im.copy_in(idx, vec);
  aref<uint64_t>(e.label).store(label, std::memory_order_release);
  aref<uint32_t>(e.level).store(level, std::memory_order_release);
  aref<uint32_t>(e.generation).store(generation, std::memory_order_release);

  Bucket& b = im.bucket_of(h);
  bool duplicate = false;
  {
    SpinGuard g(b.lock);
    const uint64_t head = aref<uint64_t>(b.head).load(std::memory_order_relaxed);
    for (uint64_t l = head; link_pos(l) != 0;) {
      EntryHeader& o = im.headers[link_pos(l) - 1];
      if (aref<uint64_t>(o.key).load(std::memory_order_relaxed) == k) {
        duplicate = true;  // another thread admitted it meanwhile
        break;
      }
      l = aref<uint64_t>(o.next).load(std::memory_order_relaxed);
    }
    if (!duplicate) {
      aref<uint64_t>(e.next).store(head, std::memory_order_release);
      const uint32_t tag = meta_tag(aref<uint64_t>(e.meta).load(std::memory_order_relaxed));
      aref<uint64_t>(e.meta).store(make_meta(tag, kHot), std::memory_order_release);
      aref<uint64_t>(b.head).store(make_link(idx, tag), std::memory_order_release);
    }
  }
  if (duplicate) {
    im.release_entry(idx);
    return true;
  }
  bump(s.admissions);
  return true;
}

void NodeCache::clear() {
  Impl& im = *impl_;
  const uint64_t used = std::min<uint64_t>(im.cap, im.next_unused.load(std::memory_order_acquire));
  for (uint64_t i = 0; i < used; ++i) {
    const uint64_t m = aref<uint64_t>(im.headers[i].meta).load(std::memory_order_acquire);
    if (meta_state(m) != kHot && meta_state(m) != kCooling) continue;
    const uint64_t k = aref<uint64_t>(im.headers[i].key).load(std::memory_order_acquire);
    im.erase_key(k, mix64(k), im.stripe());
  }
}

bool NodeCache::erase(RemotePtr key) {
  Impl& im = *impl_;
  if (im.cap == 0) return false;
  return im.erase_key(key.raw(), mix64(key.raw()), im.stripe());
}

uint64_t NodeCache::applied() const { return impl_->log_applied.load(std::memory_order_acquire); }

void NodeCache::set_applied(uint64_t position) {
  uint64_t cur = impl_->log_applied.load(std::memory_order_relaxed);
  while (cur < position && !impl_->log_applied.compare_exchange_weak(cur, position, std::memory_order_acq_rel)) {
  }
}

NodeCacheStats NodeCache::stats() const {
  NodeCacheStats st;
  uint64_t misses = 0;
  for (unsigned i = 0; i < kStripes; ++i) {
    const Stripe& s = impl_->stripes[i];
    st.hits += s.hits.load(std::memory_order_relaxed);
    misses += s.misses.load(std::memory_order_relaxed);
    st.cooling_hits += s.cooling_hits.load(std::memory_order_relaxed);
    st.admissions += s.admissions.load(std::memory_order_relaxed);
    st.rejections += s.rejections.load(std::memory_order_relaxed);
    st.evictions += s.evictions.load(std::memory_order_relaxed);
  }
  st.lookups = st.hits + misses;
  st.entries = st.admissions >= st.evictions ? st.admissions - st.evictions : 0;
  return st;
}

}  // namespace dmhnsw::cache
