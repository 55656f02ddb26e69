#include "compute/shine/graph.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <queue>
#include <thread>

#include "compute/shine/codes_log.hpp"
#include "compute/shine/graph_detail.hpp"

namespace dmhnsw::shine {

using fabric::Buffer;
using fabric::Completion;
using fabric::FabricError;
using fabric::Op;
using fabric::Status;
using namespace graph_detail;

namespace {

// One node-cache access, to the trace file and/or the in-memory list (shine-route-sim).
void note_access(OpContext& ctx, RemotePtr p, unsigned level, bool hit) {
  if (ctx.trace != nullptr) ctx.trace->record(p, level, hit, ctx.measured);
  if (ctx.accesses != nullptr) ctx.accesses->push_back(cache::make_record(p, level, hit, ctx.measured));
}
}  // namespace

// ------------------------------------------------------------------ graph
Graph::Graph(fabric::Cluster& c, const GraphParams& p)
    : cluster_(c), params_(p), layout_(p.dim, p.m), dist_(p.metric, p.dim) {
  for (const auto& mn : c.memnodes()) {
    RegionHeader h = header_from_blob(mn.header, "memnode " + std::to_string(mn.id));
    bounds_.push_back({h.data_offset, h.region_size});
  }
}

// ------------------------------------------------------------------ visited set
void VisitedSet::use_areas(const std::vector<RegionBounds>& areas, unsigned shift) {
  areas_.clear();
  shift_ = shift;
  uint64_t bits = 0;
  for (const RegionBounds& b : areas) {
    const uint64_t span = b.size - std::min(b.size, b.data_offset);
    areas_.push_back({b.data_offset, span, bits});
    bits += (span >> shift) + 1;
  }
  bits_.assign((bits + 63) / 64, 0);
  n_touched_ = 0;
  n_areas_ = static_cast<uint32_t>(areas_.size());
}

void VisitedSet::clear() {
  for (size_t i = 0; i < n_touched_; ++i) bits_[touched_[i]] = 0;
  n_touched_ = 0;
  hashed_ = 0;
  if (++cur_ == 0) {
    for (Slot& s : slots_) s.gen = 0;
    cur_ = 1;
  }
}

size_t VisitedSet::size() const {
  size_t n = hashed_;
  for (size_t i = 0; i < n_touched_; ++i) n += static_cast<size_t>(std::popcount(bits_[touched_[i]]));
  return n;
}

void VisitedSet::grow() {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(std::max<size_t>(1024, old.size() * 2), Slot{});
  hashed_ = 0;
  for (const Slot& s : old)
    if (s.gen == cur_) insert_hashed(RemotePtr::from_raw(s.key));
}

bool VisitedSet::insert_hashed(RemotePtr p) {
  if ((hashed_ + 1) * 2 > slots_.size()) grow();
  const size_t mask = slots_.size() - 1;
  const uint64_t k = p.raw();
  size_t i = static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  while (slots_[i].gen == cur_) {
    if (slots_[i].key == k) return false;
    i = (i + 1) & mask;
  }
  slots_[i] = {k, cur_};
  ++hashed_;
  return true;
}

uint32_t cache_entry_floats(const NodeLayout& L, bool lists) {
  return lists ? static_cast<uint32_t>((L.list_bytes(0) + 3) / 4) : L.dim();
}

void set_search_reads(OpContext& ctx, cache::NodeCache* cache, bool lists, bool in_place) {
  ctx.node_cache = lists ? nullptr : cache;
  ctx.list_cache = lists && !in_place ? cache : nullptr;
  ctx.in_place = in_place;
}

// ------------------------------------------------------------------ worker
namespace {
/// The first cache lines of a vector (the hardware prefetcher follows the rest).
inline void prefetch_vector(const float* v, uint32_t dim) {
  const char* p = reinterpret_cast<const char*>(v);
  const size_t lines = std::min<size_t>(4, (dim * sizeof(float) + 63) / 64);
  for (size_t i = 0; i < lines; ++i) __builtin_prefetch(p + 64 * i);
}
}  // namespace

Worker::Worker(const Graph& g, Scheduler& s, uint64_t seed, VectorCache* shared)
    : g_(g), s_(s), rng_(seed), level_mult_(1.0 / std::log(static_cast<double>(g.params().m))), shared_(shared) {
  if (g.params().ids.buckets > 0) ids_.emplace(g.params().ids, offsetof(NodeFront, label), s, seed ^ 0x1d1d);
  if (g.params().free.capacity > 0) free_.emplace(g.params().free, s, seed ^ 0xf7ee);
}

void Worker::fail(const Completion& c) const {
  if (c.status != Status::Ok) throw FabricError(s_.endpoint().describe(c));
}

Task<uint64_t> Worker::atomic(Op op, OpContext& ctx) {
  Buffer b = s_.endpoint().alloc(8);
  op.local = b.data();
  fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
  co_return *b.as<uint64_t>();
}

Task<void> Worker::write(RemotePtr dst, const void* src, size_t len, OpContext& ctx) {
  Buffer b = s_.endpoint().alloc(len);
  std::memcpy(b.data(), src, len);
  Op op = Op::write(dst, b.data(), len);
  fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
}

Task<Worker::Entry> Worker::read_entry(OpContext& ctx) {
  // The entry point, its level, the node count, the deletes, the reuses and the list changes in
  // one READ (words 1 .. 23).
  static_assert(shine_word::kMaxLevel == shine_word::kEntryPoint + 1 && shine_word::kNodeCount > shine_word::kMaxLevel &&
                shine_word::kDeleted > shine_word::kNodeCount && shine_word::kReused > shine_word::kDeleted &&
                shine_word::kListChanges > shine_word::kReused);
  constexpr size_t kWords = shine_word::kListChanges - shine_word::kEntryPoint + 1;
  uint64_t w[kWords];
  // Read per query, not kept per worker: the words say whether caches must drop what they hold
  // (deletes, reuses, list changes). In place they cost what a copy kept per worker would.
  const char* mapped = nullptr;
  if (ctx.in_place) mapped = s_.endpoint().mapped(word_ptr(shine_word::kEntryPoint), sizeof w);
  if (mapped != nullptr) {
    std::memcpy(w, mapped, sizeof w);
    ++ctx.io.reads;  // a load from far memory, counted as the READ it replaces
    ctx.io.bytes += sizeof w;
  } else {
    Buffer b = s_.endpoint().alloc(sizeof w);
    Op op = Op::read(word_ptr(shine_word::kEntryPoint), b.data(), sizeof w);
    fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
    std::memcpy(w, b.data(), sizeof w);
  }
  const RemotePtr ep = RemotePtr::from_raw(w[0]);
  // Searches start there and inserts link into it: it must be a node's place in a data area
  // (as every neighbour pointer followed), its level one a node can have.
  if (!ep.is_null() && (!g_.plausible(ep) || w[1] > kMaxLevel))
    throw FabricError("memnode 0: the shine entry point word at region offset " +
                      std::to_string(mode_word_offset(shine_word::kEntryPoint)) + " names memnode " +
                      std::to_string(ep.node()) + " offset " + std::to_string(ep.offset()) + " level " +
                      std::to_string(w[1]) + ": not a node of this index (a corrupted region header?)");
  co_return Entry{ep, static_cast<unsigned>(w[1]), w[shine_word::kDeleted - shine_word::kEntryPoint],
                  w[shine_word::kReused - shine_word::kEntryPoint],
                  w[shine_word::kNodeCount - shine_word::kEntryPoint] + w[shine_word::kListChanges - shine_word::kEntryPoint]};
}

Task<std::vector<Neighbor>> Worker::read_vectors(const std::vector<RemotePtr>& all, const float* q,
                                                 OpContext& ctx, VecCache* cache) {
  std::vector<Neighbor> out;
  if (all.empty()) co_return out;
  const auto& L = g_.layout();
  out.reserve(all.size());
  // With codes, a node whose code this computenode holds costs no READ; its deleted bit and
  // generation are not known (cached = true: the results are checked against the index).
  // Per thread, not per hop: filled and last used before this coroutine's first suspension.
  thread_local std::vector<RemotePtr> uncoded;
  if (ctx.code_dist != nullptr) {
    uncoded.clear();
    // Every code is looked up and requested before the first distance, so that their cache
    // misses overlap (as hnswlib prefetches the next vectors).
    struct Coded {
      const uint8_t* code;
      RemotePtr p;
      uint64_t label;
    };
    thread_local std::vector<Coded> coded;
    coded.clear();
    const size_t cs = ctx.codes->code_size();
    for (RemotePtr p : all) ctx.codes->prefetch(p);  // every table slot first, then the records
    for (RemotePtr p : all) {
      uint64_t label = 0;
      if (const uint8_t* code = ctx.codes->find(p, &label)) {
        for (size_t off = 0; off < cs + 8; off += 64) __builtin_prefetch(code - 8 + off);  // label, code
        coded.push_back({code, p, label});
      } else {
        uncoded.push_back(p);
      }
    }
    for (const Coded& c : coded) out.push_back({(*ctx.code_dist)(c.code), c.p, c.label, false, true});
    ctx.search.visited += coded.size();
    ctx.search.coded += coded.size();
  }
  const std::vector<RemotePtr>& nodes = ctx.code_dist != nullptr ? uncoded : all;
  if (nodes.empty()) co_return out;
  // Vectors this insert already knows are not read again (they never change).
  std::vector<RemotePtr>& remote = ctx.remote_scratch;  // per context: kept across the READs' suspension
  remote.clear();
  if (cache != nullptr) {
    // As hnswlib does, memory latency is overlapped: all table cells are requested before
    // the lookups, and all vectors before the distances.
    if (cache->shared != nullptr)
      for (RemotePtr p : nodes) cache->shared->prefetch(p);
    thread_local std::vector<std::pair<VecEntry, RemotePtr>> known;
    known.clear();
    for (RemotePtr p : nodes) {
      if (auto e = cache->find(p)) {
        known.push_back({*e, p});
        prefetch_vector(e->v, L.dim());
      } else {
        remote.push_back(p);
      }
    }
    for (size_t i = 0; i < known.size(); ++i) {
      ++ctx.search.visited;
      // From the cache: whether it was deleted since is not known (cached = true).
      out.push_back({g_.distance()(q, known[i].first.v), known[i].second, known[i].first.label, false, true});
    }
  } else if (ctx.node_cache != nullptr) {
    // Queries: the node cache of vectors.
    thread_local std::vector<float> tmp;
    tmp.resize(L.dim());
    for (RemotePtr p : nodes) {
      uint64_t label = 0;
      unsigned level = 0;
      uint32_t generation = 0;
      if (ctx.node_cache->lookup(p, tmp.data(), &label, &level, &generation)) {
        ++ctx.search.visited;
        out.push_back({g_.distance()(q, tmp.data()), p, label, false, true, generation});
        note_access(ctx, p, level, true);
      } else {
        remote.push_back(p);
      }
    }
  } else {
    remote = nodes;
  }
  if (remote.empty()) co_return out;
  // One node's front and vector as read (copied, or where it lies).
  auto take = [&](RemotePtr at, const char* p) {
    NodeFront f;
    std::memcpy(&f, p, sizeof f);
    if (!NodeHeader::valid(f.header)) {  // not (yet) a node: a pointer we must not follow
      ++ctx.search.skipped;
      return;
    }
    const float* v = reinterpret_cast<const float*>(p + NodeLayout::vector_offset());
    ++ctx.search.visited;
    out.push_back({g_.distance()(q, v), at, f.label, NodeHeader::deleted(f.header), false,
                   NodeHeader::generation(f.header)});
    if (cache != nullptr) cache->add(at, v, L.dim(), NodeHeader::level(f.header), f.label);
    if (ctx.node_cache != nullptr) {
      unsigned level = NodeHeader::level(f.header);
      ctx.node_cache->admit(at, level, v, f.label, NodeHeader::generation(f.header));
      note_access(ctx, at, level, false);
    }
  };
  if (ctx.in_place) {
    // Every record where it lies, each requested before the first distance (as hnswlib
    // prefetches the next vectors); any not mapped here: all of them by READs below.
    thread_local std::vector<const char*> where;
    where.clear();
    for (RemotePtr p : remote) {
      const char* m = s_.endpoint().mapped(p, L.vector_read_bytes());
      if (m == nullptr) break;
      where.push_back(m);
      for (size_t off = 0; off < std::min<size_t>(256, L.vector_read_bytes()); off += 64) __builtin_prefetch(m + off);
    }
    if (where.size() == remote.size()) {
      for (size_t i = 0; i < remote.size(); ++i) take(remote[i], where[i]);
      ctx.io.reads += remote.size();  // loads from far memory, counted as the READs they replace
      ctx.io.bytes += remote.size() * L.vector_read_bytes();
      co_return out;
    }
  }
  const size_t stride = L.vector_part_bytes();
  Buffer b = s_.endpoint().alloc(stride * remote.size());
  std::vector<Op> ops;
  ops.reserve(remote.size());
  for (size_t i = 0; i < remote.size(); ++i) ops.push_back(Op::read(remote[i], b.data() + i * stride, L.vector_read_bytes()));
  fail(co_await s_.io(ops, ctx.mode == ReadMode::Batch, &ctx.io));
  for (size_t i = 0; i < remote.size(); ++i) take(remote[i], b.data() + i * stride);
  co_return out;
}

Task<std::vector<RemotePtr>> Worker::read_list(RemotePtr node, unsigned level, OpContext& ctx) {
  const auto& L = g_.layout();
  const RemotePtr at = node + L.list_offset(level);  // the list's own address: one key per node and level
  ++ctx.search.hops;
  // A cached list is used only at the version it was read at (lists_version: a later insert or
  // consolidation may have changed it).
  thread_local std::vector<float> held;
  const char* bytes = nullptr;
  Buffer b;
  if (ctx.list_cache != nullptr) {
    held.resize(ctx.list_cache->dim());
    if (ctx.list_cache->lookup_at(at, held.data(), ctx.lists_version)) {
      bytes = reinterpret_cast<const char*>(held.data());
      ++ctx.search.cached_lists;
    }
  }
  if (bytes == nullptr && ctx.in_place) {
    if ((bytes = s_.endpoint().mapped(at, L.list_bytes(level))) != nullptr) {
      ++ctx.io.reads;  // a load from far memory, counted as the READ it replaces (no doorbell)
      ctx.io.bytes += L.list_bytes(level);
      ctx.search.list_bytes += L.list_bytes(level);
    }
  }
  if (bytes == nullptr) {
    b = s_.endpoint().alloc(L.list_bytes(0));
    Op op = Op::read(at, b.data(), L.list_bytes(level));
    fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
    ctx.search.list_bytes += L.list_bytes(level);
    bytes = b.data();
    if (ctx.list_cache != nullptr) ctx.list_cache->admit(at, level, reinterpret_cast<const float*>(b.data()), 0, ctx.lists_version);
  }
  ListFront f;
  std::memcpy(&f, bytes, sizeof f);
  uint32_t count = std::min(f.count, L.capacity(level));  // a torn read never overruns the list
  std::vector<RemotePtr> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t raw;
    std::memcpy(&raw, bytes + sizeof f + 8 * i, 8);
    RemotePtr p = RemotePtr::from_raw(raw);
    if (g_.plausible(p))
      out.push_back(p);
    else if (!p.is_null())
      ++ctx.search.skipped;
  }
  co_return out;
}

void Worker::use_record_bits(VisitedSet& v) const {
  if (v.has_areas()) return;
  // Every record is at least a level-0 node long: one bit per largest power of two not above that.
  v.use_areas(g_.all_bounds(), static_cast<unsigned>(std::bit_width(g_.layout().node_bytes(0)) - 1));
}

bool Worker::look_up_regions() {
  const auto& bounds = g_.all_bounds();
  regions_.assign(bounds.size(), nullptr);
  areas_.resize(bounds.size());
  bool any = false;
  // plausible() keeps every record read through these within [0, bounds.size).
  const uint64_t vector_part = g_.layout().vector_part_bytes();
  for (uint16_t n = 0; n < bounds.size(); ++n) {
    any |= (regions_[n] = s_.endpoint().mapped(RemotePtr(n, 0), bounds[n].size)) != nullptr;
    const RegionBounds& b = bounds[n];
    // No offset is plausible in an area too small for one record (and null never is: the data
    // area begins past the region's header).
    const bool room = b.data_offset > 0 && b.data_offset + vector_part <= b.size;
    areas_[n] = {regions_[n], room ? b.data_offset : ~uint64_t{0}, room ? b.size - vector_part - b.data_offset : 0};
  }
  where_.resize(g_.layout().capacity(0));
  return any;
}

void Worker::prefetch_list(RemotePtr node, unsigned level) const {
  const auto& L = g_.layout();
  // `node` came out of a hop through regions_: its memnode's region is mapped.
  const char* list = regions_[node.node()] + node.offset() + L.list_offset(level);
  for (size_t off = 0; off < std::min<size_t>(256, L.list_bytes(level)); off += 64) __builtin_prefetch(list + off);
}

template <class Take>
bool Worker::hop_mapped(RemotePtr node, unsigned level, bool visit, const float* q, OpContext& ctx, Take&& take) {
  const auto& L = g_.layout();
  const size_t list_bytes = L.list_bytes(level), vec_bytes = L.vector_read_bytes();
  const char* list = s_.endpoint().mapped(node + L.list_offset(level), list_bytes);
  if (list == nullptr) return false;
  ListFront f;
  std::memcpy(&f, list, sizeof f);
  const uint32_t count = std::min(f.count, L.capacity(level));  // a torn read never overruns the list
  // No suspension from here to the end: the worker's scratch is this hop's alone.
  std::pair<RemotePtr, const char*>* const where = where_.data();  // room for count (<= capacity(0))
  size_t n_where = 0;
  uint64_t skipped = 0;
  // What every neighbour is checked against, in locals (registers) for the whole list.
  const MappedArea* const areas = areas_.data();
  const uint32_t n_areas = static_cast<uint32_t>(areas_.size());
  {
    VisitedSet::Hop seen = ctx.visited.hop(visit ? count : 0);  // written back at the end of this block
    for (uint32_t i = 0; i < count; ++i) {
      uint64_t raw;
      std::memcpy(&raw, list + sizeof f + 8 * i, 8);
      const RemotePtr p = RemotePtr::from_raw(raw);
      // Graph::plausible: on some memnode, aligned, a whole record within its data area.
      const uint32_t node = p.node();
      if (node >= n_areas) [[unlikely]] {
        skipped += raw != 0;
        continue;
      }
      const MappedArea& a = areas[node];
      const uint64_t rel = p.offset() - a.begin;
      if (rel > a.last || (raw & 7) != 0) [[unlikely]] {
        skipped += raw != 0;
        continue;
      }
      if (a.base == nullptr) return false;
      const char* const m = a.base + p.offset();
      // Kept only when not met before, without a branch on it (see note_in_area); a record met
      // before is in the caches already, so its prefetch costs next to nothing.
      const uint32_t fresh = visit ? seen.note_in_area(node, rel) : 1;
      __builtin_prefetch(m);  // the header and the vector's start: one line each, all asked at once
      where[n_where] = {p, m};
      n_where += fresh;
    }
  }
  ++ctx.search.hops;
  ++ctx.io.reads;  // loads from far memory, counted as the READs they replace
  ctx.io.bytes += list_bytes;
  ctx.search.list_bytes += list_bytes;
  ctx.search.skipped += skipped;
  ctx.io.reads += n_where;
  ctx.io.bytes += n_where * vec_bytes;
  // The rest of the next record is asked for while this one's distance is computed (as
  // hnswlib does): asking for every line of every record up front stalls on the miss buffers.
  const size_t lines = std::min<size_t>(8, (vec_bytes + 63) / 64);
  for (size_t i = 0; i < n_where; ++i) {
    if (i + 1 < n_where)
      for (size_t l = 1; l < lines; ++l) __builtin_prefetch(where[i + 1].second + 64 * l);
    const auto& [p, m] = where[i];
    NodeFront nf;
    std::memcpy(&nf, m, sizeof nf);
    if (!NodeHeader::valid(nf.header)) {  // not (yet) a node: a pointer we must not follow
      ++ctx.search.skipped;
      continue;
    }
    ++ctx.search.visited;
    take(g_.distance()(q, reinterpret_cast<const float*>(m + NodeLayout::vector_offset())), p, nf);
  }
  return true;
}

std::optional<Neighbor> Worker::greedy_mapped(const float* q, Neighbor cur, unsigned level, OpContext& ctx) {
  if (!look_up_regions()) return std::nullopt;
  const IoStats io = ctx.io;
  const SearchStats st = ctx.search;
  for (bool changed = true; changed;) {
    changed = false;
    Neighbor best = cur;
    if (!hop_mapped(cur.node, level, false, q, ctx, [&](float d, RemotePtr p, const NodeFront& nf) {
          if (d < best.dist) {
            best = mapped_neighbor(d, p, nf);
            changed = true;
          }
        })) {
      ctx.io = io;  // searched again by READs, counted there
      ctx.search = st;
      return std::nullopt;
    }
    cur = best;
  }
  return cur;
}

Task<Neighbor> Worker::greedy(const float* q, Neighbor cur, unsigned level, OpContext& ctx, VecCache* cache) {
  if (all_in_place(ctx, cache))
    if (const auto r = greedy_mapped(q, cur, level, ctx)) co_return *r;
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<RemotePtr> nbrs = co_await read_list(cur.node, level, ctx);
    std::vector<Neighbor> got = co_await read_vectors(nbrs, q, ctx, cache);
    for (const auto& n : got)
      if (n.dist < cur.dist) {
        cur = n;
        changed = true;
      }
  }
  co_return cur;
}

Task<Neighbor> Worker::descend(const float* q, RemotePtr ep, unsigned from, unsigned to, OpContext& ctx,
                               VecCache* cache) {
  std::vector<RemotePtr> start{ep};
  std::vector<Neighbor> first = co_await read_vectors(start, q, ctx, cache);
  if (first.empty()) throw FabricError("the entry point of the index is not a valid node");
  Neighbor cur = first.front();
  for (unsigned l = from; l > to; --l) cur = co_await greedy(q, cur, l, ctx, cache);
  co_return cur;
}

namespace {

/// hnswlib's two queues of a layer search, shared by search_layer and search_layer_mapped so
/// that both expand the same candidates in the same order. Deleted nodes are expanded like the
/// others (they keep the graph connected, as in hnswlib) but never enter the results. The heaps
/// hold a distance and an index into `seen` (8 bytes, as hnswlib's pairs), not whole Neighbors:
/// a heap moves its entries log(ef) times per push and pop. Ties go as they would with Neighbors
/// (the heaps compare distances only).
struct LayerQueues {
  struct Entry {
    float dist;
    uint32_t i;  // seen[i]
  };
  struct Nearer {
    bool operator()(const Entry& a, const Entry& b) const { return a.dist > b.dist; }
  };
  struct Farther {
    bool operator()(const Entry& a, const Entry& b) const { return a.dist < b.dist; }
  };
  uint32_t ef;
  std::vector<Neighbor> seen;  // every node that entered cand
  std::priority_queue<Entry, std::vector<Entry>, Nearer> cand;  // nearest first
  std::priority_queue<Entry, std::vector<Entry>, Farther> top;  // farthest first
  float bound = std::numeric_limits<float>::max();

  LayerQueues(const std::vector<Neighbor>& eps, uint32_t ef_, VisitedSet& visited) : ef(ef_) {
    seen.reserve(4 * size_t{ef} + eps.size());
    for (const auto& e : eps) {
      if (!visited.insert(e.node)) continue;
      const Entry x = keep(e);
      cand.push(x);
      if (e.deleted) continue;
      top.push(x);
      if (top.size() > ef) top.pop();
    }
    if (!top.empty()) bound = top.top().dist;
  }
  Entry keep(const Neighbor& n) {
    seen.push_back(n);
    return Entry{n.dist, static_cast<uint32_t>(seen.size() - 1)};
  }
  /// The next candidate to expand; false once none is nearer than the ef-th result.
  bool next(Neighbor& c) {
    if (cand.empty()) return false;
    const Entry x = cand.top();
    if (x.dist > bound && top.size() >= ef) return false;
    cand.pop();
    c = seen[x.i];
    return true;
  }
  /// Whether a node at distance d would enter: hnswlib's test (a NaN distance never enters).
  /// The hops ask it before they make a Neighbor; offer asks it again.
  [[gnu::always_inline]] bool wanted(float d) const { return top.size() < ef || d < bound; }
  /// True when n became the next candidate to expand.
  bool offer(const Neighbor& n) {
    if (!wanted(n.dist)) return false;
    const Entry x = keep(n);
    cand.push(x);
    const bool first = cand.top().i == x.i;
    if (n.deleted) return first;
    top.push(x);
    if (top.size() > ef) top.pop();
    bound = top.top().dist;
    return first;
  }
  std::vector<Neighbor> results() {
    std::vector<Neighbor> out(top.size());
    for (size_t i = out.size(); i-- > 0; top.pop()) out[i] = seen[top.top().i];  // nearest first
    return out;
  }
};

}  // namespace

std::optional<std::vector<Neighbor>> Worker::search_layer_mapped(const float* q, const std::vector<Neighbor>& eps,
                                                                 uint32_t ef, unsigned level, OpContext& ctx) {
  if (!look_up_regions()) return std::nullopt;
  const IoStats io = ctx.io;
  const SearchStats st = ctx.search;
  use_record_bits(ctx.visited);
  ctx.visited.clear();
  LayerQueues qs(eps, ef, ctx.visited);
  for (Neighbor c{}; qs.next(c);) {
    if (!hop_mapped(c.node, level, true, q, ctx, [&](float d, RemotePtr p, const NodeFront& nf) {
          // Most neighbours are farther than the ef-th result: they are turned away before a
          // Neighbor is made of them.
          if (qs.wanted(d) && qs.offer(mapped_neighbor(d, p, nf))) prefetch_list(p, level);
        })) {
      ctx.io = io;
      ctx.search = st;
      return std::nullopt;
    }
  }
  return qs.results();
}

Task<std::vector<Neighbor>> Worker::search_layer(const float* q, std::vector<Neighbor> eps, uint32_t ef,
                                                 unsigned level, OpContext& ctx, VecCache* cache, InEdges* in) {
  if (in == nullptr && all_in_place(ctx, cache))
    if (auto r = search_layer_mapped(q, eps, ef, level, ctx)) co_return std::move(*r);
  use_record_bits(ctx.visited);
  ctx.visited.clear();
  LayerQueues qs(eps, ef, ctx.visited);
  Neighbor c{};
  while (qs.next(c)) {
    std::vector<RemotePtr> nbrs = co_await read_list(c.node, level, ctx);
    if (in != nullptr && c.node != in->target && std::find(nbrs.begin(), nbrs.end(), in->target) != nbrs.end())
      in->found.push_back(c.node);
    if (cache != nullptr && cache->shared != nullptr)  // the lookups in read_vectors overlap the visited checks
      for (RemotePtr p : nbrs) cache->shared->prefetch(p);
    std::vector<RemotePtr>& fresh = ctx.fresh_scratch;  // per context, reused hop after hop
    fresh.clear();
    for (RemotePtr p : nbrs)
      if (ctx.visited.insert(p)) fresh.push_back(p);
    std::vector<Neighbor> got = co_await read_vectors(fresh, q, ctx, cache);
    for (const auto& n : got) qs.offer(n);
  }
  co_return qs.results();
}

// hnswlib's neighbour-selection heuristic: keep a candidate only if it is closer to the base
// than to every candidate already kept. `cands` sorted nearest first.
std::vector<Neighbor> Worker::select_heuristic(std::vector<Neighbor> cands, uint32_t m, const VecCache& cache,
                                               float alpha, std::vector<Neighbor> kept) const {
  if (cands.size() + kept.size() <= m) {
    kept.insert(kept.end(), cands.begin(), cands.end());
    return kept;
  }
  // Distances are squared for L2: the factor applies squared.
  const float f = g_.params().metric == Metric::L2 ? alpha * alpha : alpha;
  for (const auto& c : cands) {
    if (kept.size() >= m) break;
    const auto ci = cache.find(c.node);
    if (!ci) continue;
    bool good = true;
    for (const auto& s : kept) {
      // In place a record found before may have stopped being a node since (its header is read
      // again): it no longer rules a candidate out.
      const auto si = cache.find(s.node);
      if (si && f * g_.distance()(ci->v, si->v) < c.dist) {
        good = false;
        break;
      }
    }
    if (good) kept.push_back(c);
  }
  return kept;
}
Task<std::vector<uint64_t>> Worker::read_headers(const std::vector<RemotePtr>& nodes, OpContext& ctx) {
  std::vector<uint64_t> out(nodes.size());
  constexpr size_t kBatch = 256;  // 8 bytes each, one doorbell per batch
  Buffer b = s_.endpoint().alloc(8 * kBatch);
  for (size_t at = 0; at < nodes.size(); at += kBatch) {
    std::vector<Op> ops;
    for (size_t i = at; i < std::min(nodes.size(), at + kBatch); ++i)
      ops.push_back(Op::read(nodes[i], b.data() + 8 * (i - at), 8));
    fail(co_await s_.io(ops, true, &ctx.io));
    std::memcpy(out.data() + at, b.data(), 8 * ops.size());
  }
  co_return out;
}

Task<void> Worker::read_words(RemotePtr at, uint64_t* out, size_t n, OpContext& ctx) {
  Buffer b = s_.endpoint().alloc(8 * n);
  Op op = Op::read(at, b.data(), 8 * n);
  fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
  std::memcpy(out, b.data(), 8 * n);
}

Task<std::vector<NodeFront>> Worker::read_fronts(const std::vector<Neighbor>& w, const std::vector<size_t>& idx,
                                                  OpContext& ctx) {
  std::vector<NodeFront> out(idx.size());
  if (idx.empty()) co_return out;
  Buffer b = s_.endpoint().alloc(sizeof(NodeFront) * idx.size());
  std::vector<Op> ops;
  ops.reserve(idx.size());
  for (size_t j = 0; j < idx.size(); ++j)
    ops.push_back(Op::read(w[idx[j]].node, b.data() + j * sizeof(NodeFront), sizeof(NodeFront)));
  fail(co_await s_.io(ops, true, &ctx.io));
  std::memcpy(out.data(), b.data(), sizeof(NodeFront) * idx.size());
  co_return out;
}

Task<void> Worker::drop_deleted(std::vector<Neighbor>& w, OpContext& ctx) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i].cached) idx.push_back(i);
  if (idx.empty()) co_return;
  const std::vector<NodeFront> f = co_await read_fronts(w, idx, ctx);
  for (size_t j = 0; j < idx.size(); ++j) {
    w[idx[j]].cached = false;
    w[idx[j]].deleted = !NodeHeader::valid(f[j].header) || NodeHeader::deleted(f[j].header);
  }
  w.erase(std::remove_if(w.begin(), w.end(), [](const Neighbor& n) { return n.deleted; }), w.end());
}

Task<void> Worker::drop_stale(std::vector<Neighbor>& w, uint32_t k, OpContext& ctx) {
  for (;;) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < w.size() && i < k; ++i)
      if (w[i].cached) idx.push_back(i);
    if (idx.empty()) co_return;
    const std::vector<NodeFront> fronts = co_await read_fronts(w, idx, ctx);
    size_t dropped = 0;
    for (size_t j = 0; j < idx.size(); ++j) {
      const NodeFront& f = fronts[j];
      Neighbor& n = w[idx[j]];
      n.cached = false;
      const bool reused = !NodeHeader::valid(f.header) || f.label != n.label ||
                          NodeHeader::generation(f.header) != n.generation;
      if (reused && ctx.node_cache != nullptr) ctx.node_cache->erase(n.node);  // its vector is another's now
      if (reused || NodeHeader::deleted(f.header)) {
        n.deleted = true;
        ++dropped;
      }
    }
    if (dropped == 0) co_return;
    ctx.search.stale += dropped;
    w.erase(std::remove_if(w.begin(), w.end(), [](const Neighbor& n) { return n.deleted; }), w.end());
  }
}

Task<std::vector<Neighbor>> Worker::rerank(const float* q, std::vector<Neighbor> w, uint32_t r, OpContext& ctx) {
  std::vector<RemotePtr> best;
  for (size_t i = 0; i < w.size() && best.size() < r; ++i) best.push_back(w[i].node);
  const compute::CodeDistance* saved = ctx.code_dist;
  ctx.code_dist = nullptr;  // the exact vectors, with their headers as they are now
  std::vector<Neighbor> exact = co_await read_vectors(best, q, ctx, nullptr);
  ctx.code_dist = saved;
  ctx.search.reranked += best.size();
  exact.erase(std::remove_if(exact.begin(), exact.end(), [](const Neighbor& n) { return n.deleted; }), exact.end());
  std::sort(exact.begin(), exact.end(), ByDistLess{});
  co_return exact;
}

Task<std::vector<Neighbor>> Worker::search(const float* q, uint32_t k, uint32_t ef, OpContext& ctx,
                                           uint32_t upper_ef) {
  // With codes: this query's distances to them, for this search only.
  std::unique_ptr<compute::CodeDistance> code_dist;
  if (ctx.codes != nullptr && g_.params().codes) code_dist = g_.params().codes->distance_to(q);
  ctx.code_dist = code_dist.get();
  struct Clear {
    OpContext& c;
    ~Clear() { c.code_dist = nullptr; }
  } clear{ctx};
  const Entry entry = co_await read_entry(ctx);
  RemotePtr ep = entry.node;
  unsigned max_level = entry.level;
  if (ep.is_null()) co_return std::vector<Neighbor>{};
  if (ctx.node_cache != nullptr && entry.reused > ctx.node_cache->applied())
    co_await apply_reuse_log(entry.reused, ctx);
  if (ctx.list_cache != nullptr) {
    ctx.lists_version = static_cast<uint32_t>(entry.lists);
    if (entry.lists > ctx.list_cache->applied()) {  // every list it holds is of an older version
      ctx.list_cache->set_applied(entry.lists);
      ctx.list_cache->clear();
    }
  }
  std::vector<Neighbor> eps;
  if (upper_ef <= 1) {
    eps.push_back(co_await descend(q, ep, max_level, 0, ctx, nullptr));
  } else {
    std::vector<RemotePtr> start{ep};
    eps = co_await read_vectors(start, q, ctx, nullptr);
    if (eps.empty()) throw FabricError("the entry point of the index is not a valid node");
    for (unsigned l = max_level; l > 0; --l) {
      std::vector<Neighbor> next = co_await search_layer(q, eps, upper_ef, l, ctx, nullptr);
      if (!next.empty()) eps = std::move(next);  // only deleted nodes found: they still guide
    }
  }
  std::vector<Neighbor> w = co_await search_layer(q, std::move(eps), std::max(ef, k), 0, ctx, nullptr);
  if (ctx.code_dist != nullptr) w = co_await rerank(q, std::move(w), std::max(ctx.rerank, k), ctx);
  // A node cache's entries do not see deletes: while the index has any, the results it gave
  // are checked against the index.
  if (entry.deleted > 0) co_await drop_stale(w, k, ctx);
  if (w.size() > k) w.resize(k);
  co_return w;
}

}  // namespace dmhnsw::shine
