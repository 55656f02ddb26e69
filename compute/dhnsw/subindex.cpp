#include "compute/dhnsw/subindex.hpp"

#include <faiss/IndexFlat.h>
#include <faiss/IndexFlatCodes.h>
#include <faiss/impl/DistanceComputer.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "common/distance.hpp"

namespace dmhnsw::dhnsw {

namespace {

std::string num(uint64_t v) { return std::to_string(v); }

/// Flat storage of a deserialized sub-HNSW whose distances come from the SIMD kernel chosen
/// once at start-up (hnswlib's spaces, common/distance.hpp): Debian's Faiss is a generic
/// build, and the sub-HNSW search spends most of its time here. Inner product keeps Faiss's
/// convention (the similarity; hnswlib's kernel gives 1 - <q, x>).
struct SimdFlat final : faiss::IndexFlat {
  dmhnsw::DistanceComputer kernel;
  SimdFlat(int dim, faiss::MetricType m)
      : faiss::IndexFlat(dim, m), kernel(m == faiss::METRIC_INNER_PRODUCT ? Metric::IP : Metric::L2, dim) {}

  struct Dis final : faiss::FlatCodesDistanceComputer {
    const SimdFlat& s;
    const float* q = nullptr;
    const bool ip;
    explicit Dis(const SimdFlat& st)
        : faiss::FlatCodesDistanceComputer(st.codes.data(), st.code_size), s(st), ip(st.metric_type != faiss::METRIC_L2) {}
    float dist(const float* a, const float* b) const { return ip ? 1.0f - s.kernel(a, b) : s.kernel(a, b); }
    const float* vec(idx_t i) const { return reinterpret_cast<const float*>(codes + i * code_size); }
    void set_query(const float* x) override { q = x; }
    float distance_to_code(const uint8_t* code) override { return dist(q, reinterpret_cast<const float*>(code)); }
    float symmetric_dis(idx_t i, idx_t j) override { return dist(vec(i), vec(j)); }
  };
  faiss::FlatCodesDistanceComputer* get_FlatCodesDistanceComputer() const override { return new Dis(*this); }
};

/// Storage of a sub-HNSW read for a search over codes: Faiss's HNSW compares the query with
/// codes through the index's quantizer (compute/codes.hpp). Inner product keeps Faiss's
/// convention (the similarity). Never added to: inserts read the vectors.
struct CodedFlat final : faiss::IndexFlatCodes {
  std::shared_ptr<const compute::Quantizer> q;
  CodedFlat(int dim, faiss::MetricType m, std::shared_ptr<const compute::Quantizer> qz)
      : faiss::IndexFlatCodes(qz->code_size(), dim, m), q(std::move(qz)) {}
  void search(idx_t, const float*, idx_t, float*, idx_t*, const faiss::SearchParameters*) const override {
    throw std::logic_error("a coded sub-HNSW's storage is searched through its HNSW");
  }
  struct Dis final : faiss::FlatCodesDistanceComputer {
    const CodedFlat& s;
    std::unique_ptr<compute::CodeDistance> cd;
    const bool ip;
    explicit Dis(const CodedFlat& st)
        : faiss::FlatCodesDistanceComputer(st.codes.data(), st.code_size), s(st), ip(st.metric_type != faiss::METRIC_L2) {}
    void set_query(const float* x) override { cd = s.q->distance_to(x); }
    float distance_to_code(const uint8_t* code) override {
      const float d = (*cd)(code);
      return ip ? 1.0f - d : d;
    }
    float symmetric_dis(idx_t i, idx_t j) override {
      std::vector<float> a(static_cast<size_t>(s.d)), b(static_cast<size_t>(s.d));
      s.q->decode(codes + i * code_size, 1, a.data());
      s.q->decode(codes + j * code_size, 1, b.data());
      auto c = s.q->distance_to(a.data());
      const float d = (*c)(codes + j * code_size);
      return ip ? 1.0f - d : d;
    }
  };
  faiss::FlatCodesDistanceComputer* get_FlatCodesDistanceComputer() const override { return new Dis(*this); }
};

const faiss::IndexFlatCodes& flat_storage(const faiss::IndexHNSWFlat& idx) {
  auto* s = dynamic_cast<const faiss::IndexFlatCodes*>(idx.storage);
  if (s == nullptr) throw std::invalid_argument("sub-HNSW: the storage of the IndexHNSWFlat is not an IndexFlatCodes");
  if (s->code_size != sizeof(float) * static_cast<size_t>(idx.d))
    throw std::invalid_argument("sub-HNSW: storage code size " + num(s->code_size) + " is not 4 * dim " +
                                num(static_cast<uint64_t>(idx.d)));
  return *s;
}

/// Appends `bytes` bytes at `p` to `v` (one memcpy; typed range insert when aligned).
template <typename T>
void append_bytes(std::vector<T>& v, const char* p, uint64_t bytes) {
  const size_t n = static_cast<size_t>(bytes / sizeof(T));
  if (n == 0) return;
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) == 0) {
    const T* t = reinterpret_cast<const T*>(p);
    v.insert(v.end(), t, t + n);
  } else {
    const size_t old = v.size();
    v.resize(old + n);
    std::memcpy(v.data() + old, p, n * sizeof(T));
  }
}

/// One overflow record found in a fetched buffer.
struct Record {
  uint32_t array;
  uint64_t payload;  // offset of the payload in the fetched buffer
  uint64_t bytes;
};

/// Checks of an assembled Faiss HNSW graph of `count` nodes; `where(a, byte)` names the place
/// of byte `byte` of array `a` for the message. Everything Faiss's search would index.
void check_graph(const faiss::HNSW& g, uint64_t count, int32_t entry_point, int32_t max_level,
                 const std::function<std::string(uint32_t, uint64_t)>& where) {
  const uint64_t max_levels = g.cum_nneighbor_per_level.size() - 1;  // levels Faiss's tables cover
  if (int64_t{max_level} + 1 > static_cast<int64_t>(max_levels))  // max_level comes from remote memory
    throw std::runtime_error(where(kLevels, 0) + ": max level " + std::to_string(max_level) +
                             " is beyond the " + num(max_levels) + " levels of an HNSW with this M");
  for (uint64_t i = 0; i < count; ++i) {
    const int l = g.levels[i];
    if (l < 1 || l > max_level + 1)
      throw std::runtime_error(where(kLevels, i * 4) + ": node " + num(i) + " has " + std::to_string(l) +
                               " levels, outside 1..max_level + 1 = " + std::to_string(max_level + 1));
  }
  if (g.offsets[0] != 0)
    throw std::runtime_error(where(kOffsets, 0) + ": offsets[0] is " + num(g.offsets[0]) + ", not 0");
  for (uint64_t i = 0; i < count; ++i) {
    const size_t want = static_cast<size_t>(g.cum_nneighbor_per_level[static_cast<size_t>(g.levels[i])]);
    if (g.offsets[i + 1] < g.offsets[i] || g.offsets[i + 1] - g.offsets[i] != want)
      throw std::runtime_error(where(kOffsets, (i + 1) * 8) + ": offsets[" + num(i + 1) + "] = " +
                               num(g.offsets[i + 1]) + " after offsets[" + num(i) + "] = " + num(g.offsets[i]) +
                               ": node " + num(i) + " of " + std::to_string(g.levels[i]) + " levels needs " +
                               num(want) + " neighbour entries");
  }
  if (g.offsets[count] != g.neighbors.size())
    throw std::runtime_error(where(kOffsets, count * 8) + ": offsets[count] = " + num(g.offsets[count]) +
                             ", but the neighbors array holds " + num(g.neighbors.size()) + " entries");
  const int64_t n = static_cast<int64_t>(count);
  for (size_t j = 0; j < g.neighbors.size(); ++j) {
    const int32_t v = g.neighbors[j];
    if (v < -1 || v >= n)
      throw std::runtime_error(where(kNeighbors, j * 4) + ": neighbour id " + std::to_string(v) +
                               " outside -1.." + std::to_string(n - 1));
  }
  // A search that moves to a neighbour at level l reads that neighbour's level-l list: it must
  // have one (else Faiss reads the next node's lists, or past the end of the array).
  for (uint64_t i = 0; i < count; ++i)
    for (int l = 0; l < g.levels[i]; ++l)
      for (size_t j = g.offsets[i] + static_cast<size_t>(g.cum_nneighbor_per_level[static_cast<size_t>(l)]);
           j < g.offsets[i] + static_cast<size_t>(g.cum_nneighbor_per_level[static_cast<size_t>(l) + 1]); ++j) {
        const int32_t v = g.neighbors[j];
        if (v >= 0 && g.levels[static_cast<size_t>(v)] <= l)
          throw std::runtime_error(where(kNeighbors, j * 4) + ": node " + num(i) + "'s level-" + std::to_string(l) +
                                   " neighbour " + std::to_string(v) + " has only " +
                                   std::to_string(g.levels[static_cast<size_t>(v)]) + " levels");
      }
  const bool ok = count == 0 ? (entry_point == -1 && max_level == -1)
                             : (entry_point >= 0 && entry_point < n && g.levels[static_cast<size_t>(entry_point)] ==
                                                                            max_level + 1);
  if (!ok)
    throw std::runtime_error(where(kLevels, 0) + ": entry point " + std::to_string(entry_point) + " with max level " +
                             std::to_string(max_level) + " is not a top-level node of " + num(count) + " nodes");
}

/// Faiss 1.7.3's file of an IndexHNSWFlat over IndexFlatL2 or IndexFlatIP storage, as
/// serialize_meta writes it (faiss/impl/index_write.cpp), walked before faiss::read_index sees
/// it: Faiss sizes each vector by the length its bytes announce (up to 2^40 entries) before it
/// reads the entries, leaks what it built so far when a later check throws, and does not check
/// the HNSW tables against each other. Throws naming `what` and the byte offset.
void check_meta_bytes(const char* data, size_t len, const std::string& what) {
  size_t at = 0;
  auto bad = [&](size_t off, const std::string& why) {
    return std::runtime_error(what + ": meta-HNSW (" + num(len) + " bytes): byte " + num(off) + ": " + why);
  };
  auto get = [&](auto& v, const char* field) {
    if (len - at < sizeof v) throw bad(at, std::string("truncated inside ") + field);
    std::memcpy(&v, data + at, sizeof v);
    at += sizeof v;
  };
  // A Faiss vector: a 64-bit entry count, then the entries (of `elem` bytes), which must be there.
  auto vec = [&](size_t elem, const char* field) {
    const size_t off = at;
    uint64_t n = 0;
    get(n, field);
    if (n > (len - at) / elem)
      throw bad(off, std::string(field) + ": " + num(n) + " entries of " + num(elem) + " bytes, " + num(len - at) +
                         " bytes follow");
    at += n * elem;
    return n;
  };
  auto fourcc = [](const char* c) {
    return uint32_t{uint8_t(c[0])} | uint32_t{uint8_t(c[1])} << 8 | uint32_t{uint8_t(c[2])} << 16 |
           uint32_t{uint8_t(c[3])} << 24;
  };
  struct Header {
    int32_t d = 0;
    int64_t ntotal = 0;
    int32_t metric = 0;
  };
  auto header = [&](const char* who) {  // write_index_header
    Header h;
    int64_t dummy = 0;
    uint8_t trained = 0;
    size_t off = at;
    get(h.d, "d");
    if (h.d < 1 || h.d > 65536) throw bad(off, std::string(who) + " dimension " + std::to_string(h.d));
    off = at;
    get(h.ntotal, "ntotal");
    if (h.ntotal < 0 || h.ntotal > std::numeric_limits<int32_t>::max())
      throw bad(off, std::string(who) + " ntotal " + std::to_string(h.ntotal));
    get(dummy, "header");
    get(dummy, "header");
    get(trained, "is_trained");
    off = at;
    get(h.metric, "metric_type");
    if (h.metric != faiss::METRIC_L2 && h.metric != faiss::METRIC_INNER_PRODUCT)
      throw bad(off, std::string(who) + " metric " + std::to_string(h.metric) + " (L2 or inner product)");
    return h;
  };

  uint32_t tag = 0;
  get(tag, "fourcc");
  if (tag != fourcc("IHNf")) throw bad(0, "not a Faiss IndexHNSWFlat");
  const Header ih = header("index");
  const uint64_t probas = vec(sizeof(double), "assign_probas");
  const size_t cum_at = at + 8;
  const uint64_t levels = vec(sizeof(int32_t), "cum_nneighbor_per_level");
  if (levels < 2 || levels != probas + 1)
    throw bad(cum_at - 8, "cum_nneighbor_per_level of " + num(levels) + " entries with " + num(probas) +
                              " level probabilities");
  for (uint64_t l = 0; l < levels; ++l) {
    int32_t c = 0, prev = 0;
    std::memcpy(&c, data + cum_at + 4 * l, 4);
    if (l > 0) std::memcpy(&prev, data + cum_at + 4 * (l - 1), 4);
    if (l == 0 ? c != 0 : c < prev)
      throw bad(cum_at + 4 * l, "cum_nneighbor_per_level[" + num(l) + "] = " + std::to_string(c) +
                                    " (0 first, never decreasing)");
  }
  const uint64_t n = static_cast<uint64_t>(ih.ntotal);
  size_t off = at;
  if (vec(sizeof(int32_t), "levels") != n) throw bad(off, "levels: not one per vector (" + num(n) + ")");
  off = at;
  if (vec(sizeof(uint64_t), "offsets") != n + 1) throw bad(off, "offsets: not one per vector and one more");
  vec(sizeof(int32_t), "neighbors");
  int32_t word = 0;
  for (const char* field : {"entry_point", "max_level", "efConstruction", "efSearch"}) get(word, field);
  off = at;
  get(word, "upper_beam");
  if (word != 1) throw bad(off, "upper_beam " + std::to_string(word) + " (Faiss's search allocates that many; 1 is written)");
  off = at;
  get(tag, "storage fourcc");
  if (tag != fourcc(ih.metric == faiss::METRIC_L2 ? "IxF2" : "IxFI"))
    throw bad(off, "the storage is not an IndexFlat of the index's metric");
  const Header sh = header("storage");
  if (sh.d != ih.d || sh.ntotal != ih.ntotal || sh.metric != ih.metric)
    throw bad(off, "the storage's dimension, size or metric differs from the index's");
  off = at;
  if (vec(sizeof(float), "codes") != n * static_cast<uint64_t>(ih.d))
    throw bad(off, "codes: not dimension x ntotal floats");
  if (at != len) throw bad(at, num(len - at) + " unexpected bytes after the index");
}

}  // namespace

faiss::MetricType faiss_metric(uint8_t metric_code) {
  switch (metric_code) {
    case 0: return faiss::METRIC_L2;
    case 1: return faiss::METRIC_INNER_PRODUCT;
    default: throw std::runtime_error("unknown metric code " + num(metric_code));
  }
}

SubShape shape_of(const faiss::IndexHNSWFlat& idx) { return shape_of(idx, 0); }

SubShape shape_of(const faiss::IndexHNSWFlat& idx, uint32_t code_size) {
  SubShape s;
  s.count = static_cast<uint64_t>(idx.ntotal);
  s.neighbor_entries = idx.hnsw.offsets.empty() ? 0 : idx.hnsw.offsets.back();
  s.dim = static_cast<uint32_t>(idx.d);
  s.code_size = code_size;
  return s;
}

void serialize_sub(const faiss::IndexHNSWFlat& idx, const int64_t* labels, const uint8_t* codes, uint32_t code_size,
                   const SubDesc& d, char* block) {
  const faiss::IndexFlatCodes& storage = flat_storage(idx);
  const SubShape s = shape_of(idx, code_size);
  const faiss::HNSW& g = idx.hnsw;
  if (g.levels.size() != s.count || g.offsets.size() != s.count + 1 || g.neighbors.size() < s.neighbor_entries ||
      storage.codes.size() < s.count * storage.code_size || static_cast<uint64_t>(storage.ntotal) != s.count)
    throw std::invalid_argument("serialize_sub: sub " + num(d.id) + ": the Faiss index is inconsistent");
  if (s.count > 0 && labels == nullptr) throw std::invalid_argument("serialize_sub: no labels");
  if (s.count > 0 && code_size > 0 && codes == nullptr) throw std::invalid_argument("serialize_sub: no codes");
  uint64_t used[kNumArrays];
  array_bytes(s, used);
  for (uint32_t a = 0; a < kNumArrays; ++a) {
    const ArraySlot& slot = d.arrays[a];
    if (slot.used != used[a] || slot.capacity < slot.used || slot.offset + slot.capacity > d.block_bytes)
      throw std::invalid_argument("serialize_sub: sub " + num(d.id) + ": " + array_name(a) + " slot [" +
                                  num(slot.offset) + ", used " + num(slot.used) + ", capacity " +
                                  num(slot.capacity) + "] does not fit the index (" + num(used[a]) +
                                  " bytes) or the block (" + num(d.block_bytes) + " bytes)");
  }
  const void* src[kNumArrays] = {};
  src[kLevels] = g.levels.data();
  src[kOffsets] = g.offsets.data();
  src[kNeighbors] = g.neighbors.data();
  src[kLabels] = labels;
  src[kCodes] = codes;
  src[kVectors] = storage.codes.data();
  // Arrays in address order, zeroing every byte between them and after the last.
  uint32_t order[kNumArrays] = {0, 1, 2, 3, 4, 5};
  std::sort(order, order + kNumArrays, [&](uint32_t x, uint32_t y) { return d.arrays[x].offset < d.arrays[y].offset; });
  uint64_t cursor = 0;
  for (uint32_t a : order) {
    const ArraySlot& slot = d.arrays[a];
    if (slot.offset < cursor)
      throw std::invalid_argument("serialize_sub: sub " + num(d.id) + ": " + array_name(a) +
                                  " overlaps the previous array");
    std::memset(block + cursor, 0, slot.offset - cursor);
    if (slot.used > 0) std::memcpy(block + slot.offset, src[a], slot.used);
    cursor = slot.offset + slot.used;
  }
  std::memset(block + cursor, 0, d.block_bytes - cursor);
}

void SubIndex::index_deleted() {
  deleted = 0;
  for (int64_t l : labels) deleted += label_deleted(l);
  live.reset();
  live_bits.clear();
  if (deleted == 0) return;
  live_bits.assign((labels.size() + 7) / 8, 0);
  for (size_t i = 0; i < labels.size(); ++i)
    if (!label_deleted(labels[i])) live_bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  live = std::make_unique<faiss::IDSelectorBitmap>(labels.size(), live_bits.data());
}

size_t SubIndex::memory_bytes() const {
  size_t b = sizeof(SubIndex) + labels.capacity() * sizeof(int64_t) + live_bits.capacity();
  if (index) {
    const faiss::HNSW& g = index->hnsw;
    b += sizeof(faiss::IndexHNSWFlat) + g.levels.capacity() * sizeof(int) + g.offsets.capacity() * sizeof(size_t) +
         g.neighbors.capacity() * sizeof(faiss::HNSW::storage_idx_t) +
         g.assign_probas.capacity() * sizeof(double) + g.cum_nneighbor_per_level.capacity() * sizeof(int);
    if (auto* s = dynamic_cast<const faiss::IndexFlatCodes*>(index->storage))
      b += sizeof(faiss::IndexFlatCodes) + s->codes.capacity();
  }
  return b + codes.capacity() + overflow_vectors.capacity() * sizeof(float);
}

namespace {

/// An error in a fetched sub-HNSW, naming the sub, the place (array and byte) and the problem.
struct Bad {
  std::string who;
  std::runtime_error operator()(const std::string& place, const std::string& problem) const {
    return std::runtime_error(who + ": " + place + ": " + problem);
  }
};

/// The descriptor's array slots against its block (`base`: the block's start in the fetch).
void check_slots(const SubDesc& d, const MetaHeader& h, uint64_t base, const Bad& bad) {
  for (uint32_t a = 0; a < kNumArrays; ++a) {
    const ArraySlot& s = d.arrays[a];
    const std::string place = std::string(array_name(a)) + " array at byte " + num(base + s.offset);
    if (s.used > s.capacity) throw bad(place, "used " + num(s.used) + " bytes > capacity " + num(s.capacity));
    if (s.offset > d.block_bytes || s.capacity > d.block_bytes - s.offset)
      throw bad(place, "[" + num(s.offset) + ", +" + num(s.capacity) + ") outside the block of " +
                           num(d.block_bytes) + " bytes");
    if (s.used % element_bytes(a, h.dim, h.code_size) != 0)
      throw bad(place, "used " + num(s.used) + " bytes is not a multiple of the element size " +
                           num(element_bytes(a, h.dim, h.code_size)));
  }
}

/// Overflow records, parsed in increasing address order from the start of the used part;
/// returned in time order.
std::vector<Record> overflow_records(const char* fetched, const SubDesc& d, const MetaHeader& h, const Bad& bad) {
  std::vector<Record> records;
  const uint64_t start = d.slot == 0 ? d.block_bytes : 0, end = start + d.overflow_used;
  uint64_t p = start;
  while (p < end) {
    const std::string place = "overflow record at byte " + num(p);
    if (end - p < sizeof(OverflowRecord))
      throw bad(place, "truncated: " + num(end - p) + " bytes left of the overflow part, a record header is " +
                           num(sizeof(OverflowRecord)));
    OverflowRecord r;
    std::memcpy(&r, fetched + p, sizeof r);
    if (r.array >= kNumArrays) throw bad(place, "unknown array " + num(r.array));
    if (r.reserved != 0) throw bad(place, "reserved word " + num(r.reserved) + " is not 0");
    const uint64_t room = end - p - sizeof(OverflowRecord);
    if (r.bytes > room)
      throw bad(place, std::string(array_name(r.array)) + " payload of " + num(r.bytes) + " bytes, only " +
                           num(room) + " left in the overflow part");
    if (r.bytes % element_bytes(r.array, h.dim, h.code_size) != 0)
      throw bad(place, std::string(array_name(r.array)) + " payload of " + num(r.bytes) +
                           " bytes is not a multiple of the element size " +
                           num(element_bytes(r.array, h.dim, h.code_size)));
    const uint64_t rec = overflow_record_bytes(r.bytes);
    if (rec > end - p)
      throw bad(place, "the record's padding to " + num(rec) + " bytes runs past the end of the overflow part");
    records.push_back({r.array, p + sizeof(OverflowRecord), r.bytes});
    p += rec;
  }
  if (d.slot == 1) std::reverse(records.begin(), records.end());  // time order
  return records;
}

/// A torn copy's out-of-range links dropped; returns how many. Per level: Faiss stops a list
/// at its first -1, so the kept ids move up.
uint64_t sanitize_links(faiss::HNSW& g, uint64_t n) {
  uint64_t sanitized = 0;
  const int64_t cnt = static_cast<int64_t>(n);
  for (uint64_t i = 0; i < n; ++i) {
    const size_t b = g.offsets[i], e = std::min<size_t>(g.offsets[i + 1], g.neighbors.size());
    for (int l = 0; l < g.levels[i] && l + 1 < static_cast<int>(g.cum_nneighbor_per_level.size()); ++l) {
      const size_t lb = std::min(e, b + static_cast<size_t>(g.cum_nneighbor_per_level[l]));
      const size_t le = std::min(e, b + static_cast<size_t>(g.cum_nneighbor_per_level[l + 1]));
      size_t w = lb;
      for (size_t j = lb; j < le; ++j) {
        const int32_t v = g.neighbors[j];
        if (v >= 0 && v < cnt) g.neighbors[w++] = v;
        else if (v != -1) ++sanitized;
      }
      for (; w < le; ++w) g.neighbors[w] = -1;
    }
  }
  return sanitized;
}

}  // namespace

SubIndex deserialize_sub(const char* fetched, size_t len, const SubDesc& d, const MetaHeader& h,
                         const std::string& what, bool sanitize, std::shared_ptr<const compute::Quantizer> coded) {
  const std::string who = what + ": sub " + num(d.id);
  const Bad bad{who};
  // The descriptor's sizes come from remote memory: a sum that would wrap is more than any buffer.
  const uint64_t need = d.overflow_used > std::numeric_limits<uint64_t>::max() - d.block_bytes
                            ? std::numeric_limits<uint64_t>::max()
                            : fetch_range(d).second;
  if (len < need)
    throw bad("fetched buffer", "truncated: " + num(len) + " bytes, its fetch range (block " + num(d.block_bytes) +
                                    " + overflow " + num(d.overflow_used) + ") is " + num(need) + " bytes");
  if (h.dim == 0 || h.dim > 65536 || h.m < 2 || h.m > 4096)
    throw bad("metadata header", "dimension " + num(h.dim) + " or M " + num(h.m) + " out of range");
  if (d.count > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    throw bad("descriptor", "count " + num(d.count) + " does not fit Faiss int32 ids");
  const faiss::MetricType metric = faiss_metric(h.metric);
  const uint64_t base = block_offset_in_fetch(d);  // block start inside `fetched`

  check_slots(d, h, base, bad);

  const std::vector<Record> records = overflow_records(fetched, d, h, bad);

  uint64_t total[kNumArrays];
  for (uint32_t a = 0; a < kNumArrays; ++a) total[a] = d.arrays[a].used;
  for (const Record& r : records) total[r.array] += r.bytes;
  // Byte `byte` of array `a` as assembled: where it is in `fetched`.
  auto where = [&](uint32_t a, uint64_t byte) {
    std::string place = std::string(array_name(a)) + " array at byte ";
    if (byte < d.arrays[a].used) return place + num(base + d.arrays[a].offset + byte);
    byte -= d.arrays[a].used;
    for (const Record& r : records) {
      if (r.array != a) continue;
      if (byte < r.bytes) return place + num(r.payload + byte) + " (overflow)";
      byte -= r.bytes;
    }
    return place + num(base + d.arrays[a].offset + d.arrays[a].used);
  };
  const uint64_t n = d.count;
  if (coded && (h.code_size == 0 || coded->code_size() != h.code_size || coded->dim() != h.dim))
    throw bad("metadata header", "a search over codes of an index with code size " + num(h.code_size));
  uint64_t expect[kNumArrays];
  expect[kLevels] = n * 4;
  expect[kOffsets] = (n + 1) * 8;
  expect[kNeighbors] = total[kNeighbors];
  expect[kLabels] = n * 8;
  expect[kCodes] = n * h.code_size;
  expect[kVectors] = n * h.dim * 4;
  for (uint32_t a = 0; a < kNumArrays; ++a)
    if (total[a] != expect[a])
      throw bad(where(a, std::min(total[a], expect[a])),
                num(total[a]) + " bytes with overflow, expected " + num(expect[a]) + " for " + num(n) +
                    " vectors of dimension " + num(h.dim));

  SubIndex out;
  out.id = d.id;
  out.version = d.version;
  out.epoch = h.epoch;
  out.index = std::make_unique<faiss::IndexHNSWFlat>(static_cast<int>(h.dim), static_cast<int>(h.m), metric);
  faiss::IndexHNSWFlat& idx = *out.index;
  delete idx.storage;  // owned (own_fields): the same flat layout, with the SIMD distance kernel
  if (coded)
    idx.storage = new CodedFlat(static_cast<int>(h.dim), metric, coded);
  else
    idx.storage = new SimdFlat(static_cast<int>(h.dim), metric);
  auto* storage = dynamic_cast<faiss::IndexFlatCodes*>(idx.storage);
  if (storage == nullptr) throw bad("faiss", "IndexHNSWFlat without flat storage");
  faiss::HNSW& g = idx.hnsw;

  auto gather = [&](auto& vec, uint32_t a) {
    using T = typename std::remove_reference_t<decltype(vec)>::value_type;
    vec.clear();
    vec.reserve(static_cast<size_t>(total[a] / sizeof(T)));
    append_bytes(vec, fetched + base + d.arrays[a].offset, d.arrays[a].used);
    for (const Record& r : records)
      if (r.array == a) append_bytes(vec, fetched + r.payload, r.bytes);
  };
  gather(g.levels, kLevels);
  gather(g.offsets, kOffsets);
  gather(g.neighbors, kNeighbors);
  gather(out.labels, kLabels);
  if (coded) {  // the vectors' internal part was not fetched
    gather(storage->codes, kCodes);
    out.coded = true;
    out.memnode = d.memnode;
    out.vectors_offset = d.block_offset + d.arrays[kVectors].offset;
    out.vectors_internal = d.arrays[kVectors].used / (uint64_t{4} * h.dim);
    for (const Record& r : records)
      if (r.array == kVectors) append_bytes(out.overflow_vectors, fetched + r.payload, r.bytes);
  } else {
    gather(storage->codes, kVectors);
    if (h.code_size > 0) gather(out.codes, kCodes);
  }

  if (sanitize && g.offsets.size() == n + 1 && g.levels.size() == n) out.sanitized += sanitize_links(g, n);
  check_graph(g, n, d.entry_point, d.max_level, [&](uint32_t a, uint64_t byte) { return who + ": " + where(a, byte); });
  out.index_deleted();

  g.entry_point = d.entry_point;
  g.max_level = d.max_level;
  g.efConstruction = static_cast<int>(h.ef_construction);
  idx.ntotal = static_cast<faiss::Index::idx_t>(n);
  storage->ntotal = static_cast<faiss::Index::idx_t>(n);
  return out;
}

std::vector<char> serialize_meta(const faiss::IndexHNSWFlat& idx) {
  faiss::VectorIOWriter w;
  faiss::write_index(&idx, &w);
  return std::vector<char>(w.data.begin(), w.data.end());
}

std::unique_ptr<faiss::IndexHNSWFlat> deserialize_meta(const char* data, size_t len, const std::string& what) {
  check_meta_bytes(data, len, what);
  faiss::VectorIOReader r;
  r.data.assign(reinterpret_cast<const uint8_t*>(data), reinterpret_cast<const uint8_t*>(data) + len);
  std::unique_ptr<faiss::Index> any;
  try {
    any.reset(faiss::read_index(&r));
  } catch (const faiss::FaissException& e) {
    throw std::runtime_error(what + ": meta-HNSW (" + num(len) + " bytes): Faiss cannot read it: " + e.what());
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": meta-HNSW (" + num(len) + " bytes): cannot read it: " + e.what());
  }
  auto* hnsw = dynamic_cast<faiss::IndexHNSWFlat*>(any.get());
  if (hnsw == nullptr) throw std::runtime_error(what + ": meta-HNSW: the Faiss index is not an IndexHNSWFlat");
  if (r.rp != len)
    throw std::runtime_error(what + ": meta-HNSW: " + num(len - r.rp) + " unexpected bytes after the index at byte " +
                             num(r.rp));
  std::unique_ptr<faiss::IndexHNSWFlat> out(hnsw);
  any.release();
  // The graph must be searchable without reading out of bounds.
  const faiss::HNSW& g = out->hnsw;
  const uint64_t n = static_cast<uint64_t>(out->ntotal);
  if (g.levels.size() != n || g.offsets.size() != n + 1 || out->storage == nullptr || out->storage->ntotal != out->ntotal)
    throw std::runtime_error(what + ": meta-HNSW: " + num(n) + " vectors but inconsistent array sizes");
  check_graph(g, n, g.entry_point, g.max_level,
              [&](uint32_t a, uint64_t byte) { return what + ": meta-HNSW " + array_name(a) + " array at byte " + num(byte); });
  return out;
}

}  // namespace dmhnsw::dhnsw
