#include "compute/shine/graph.hpp"


#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <queue>
#include <thread>

namespace dmhnsw::shine {

using fabric::Buffer;
using fabric::Completion;
using fabric::FabricError;
using fabric::Op;
using fabric::Status;

namespace {

// One node-cache access, to the trace file and/or the in-memory list (shine-route-sim).
void note_access(OpContext& ctx, RemotePtr p, unsigned level, bool hit) {
  if (ctx.trace != nullptr) ctx.trace->record(p, level, hit, ctx.measured);
  if (ctx.accesses != nullptr) ctx.accesses->push_back(cache::make_record(p, level, hit, ctx.measured));
}
RemotePtr word_ptr(size_t w) { return RemotePtr(0, mode_word_offset(w)); }
struct ByDistLess {
  bool operator()(const Neighbor& a, const Neighbor& b) const { return a.dist < b.dist; }
};
struct ByDistGreater {
  bool operator()(const Neighbor& a, const Neighbor& b) const { return a.dist > b.dist; }
};
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
void VisitedSet::clear() {
  size_ = 0;
  if (++cur_ == 0) {
    std::fill(gen_.begin(), gen_.end(), 0);
    cur_ = 1;
  }
}

void VisitedSet::grow() {
  std::vector<uint64_t> old_keys;
  std::vector<uint32_t> old_gen;
  old_keys.swap(keys_);
  old_gen.swap(gen_);
  size_t cap = std::max<size_t>(1024, old_keys.size() * 2);
  keys_.assign(cap, 0);
  gen_.assign(cap, 0);
  size_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i)
    if (old_gen[i] == cur_) insert(RemotePtr::from_raw(old_keys[i]));
}

bool VisitedSet::insert(RemotePtr p) {
  if ((size_ + 1) * 2 > keys_.size()) grow();
  size_t mask = keys_.size() - 1;
  uint64_t k = p.raw();
  size_t i = static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  while (gen_[i] == cur_) {
    if (keys_[i] == k) return false;
    i = (i + 1) & mask;
  }
  gen_[i] = cur_;
  keys_[i] = k;
  ++size_;
  return true;
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
  // The entry point, its level, the deletes and the reuses in one READ (words 1 .. 15).
  static_assert(shine_word::kMaxLevel == shine_word::kEntryPoint + 1 && shine_word::kDeleted > shine_word::kMaxLevel &&
                shine_word::kReused > shine_word::kDeleted);
  constexpr size_t kWords = shine_word::kReused - shine_word::kEntryPoint + 1;
  Buffer b = s_.endpoint().alloc(8 * kWords);
  Op op = Op::read(word_ptr(shine_word::kEntryPoint), b.data(), 8 * kWords);
  fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
  uint64_t w[kWords];
  std::memcpy(w, b.data(), sizeof w);
  const RemotePtr ep = RemotePtr::from_raw(w[0]);
  // Searches start there and inserts link into it: it must be a node's place in a data area
  // (as every neighbour pointer followed), its level one a node can have.
  if (!ep.is_null() && (!g_.plausible(ep) || w[1] > kMaxLevel))
    throw FabricError("memnode 0: the shine entry point word at region offset " +
                      std::to_string(mode_word_offset(shine_word::kEntryPoint)) + " names memnode " +
                      std::to_string(ep.node()) + " offset " + std::to_string(ep.offset()) + " level " +
                      std::to_string(w[1]) + ": not a node of this index (a corrupted region header?)");
  co_return Entry{ep, static_cast<unsigned>(w[1]), w[shine_word::kDeleted - shine_word::kEntryPoint],
                  w[shine_word::kReused - shine_word::kEntryPoint]};
}

Task<std::vector<Neighbor>> Worker::read_vectors(const std::vector<RemotePtr>& nodes, const float* q,
                                                 OpContext& ctx, VecCache* cache) {
  std::vector<Neighbor> out;
  if (nodes.empty()) co_return out;
  const auto& L = g_.layout();
  out.reserve(nodes.size());
  // Vectors this insert already knows are not read again (they never change).
  std::vector<RemotePtr> remote;
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
    // Queries: the node cache (vectors only; lists are always read).
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
  const size_t stride = L.vector_part_bytes();
  Buffer b = s_.endpoint().alloc(stride * remote.size());
  std::vector<Op> ops;
  ops.reserve(remote.size());
  for (size_t i = 0; i < remote.size(); ++i) ops.push_back(Op::read(remote[i], b.data() + i * stride, L.vector_read_bytes()));
  fail(co_await s_.io(ops, ctx.mode == ReadMode::Batch, &ctx.io));
  for (size_t i = 0; i < remote.size(); ++i) {
    const char* p = b.data() + i * stride;
    NodeFront f;
    std::memcpy(&f, p, sizeof f);
    if (!NodeHeader::valid(f.header)) {  // not (yet) a node: a pointer we must not follow
      ++ctx.search.skipped;
      continue;
    }
    const float* v = reinterpret_cast<const float*>(p + NodeLayout::vector_offset());
    ++ctx.search.visited;
    out.push_back({g_.distance()(q, v), remote[i], f.label, NodeHeader::deleted(f.header), false,
                   NodeHeader::generation(f.header)});
    if (cache != nullptr) cache->add(remote[i], v, L.dim(), NodeHeader::level(f.header), f.label);
    if (ctx.node_cache != nullptr) {
      unsigned level = NodeHeader::level(f.header);
      ctx.node_cache->admit(remote[i], level, v, f.label, NodeHeader::generation(f.header));
      note_access(ctx, remote[i], level, false);
    }
  }
  co_return out;
}

Task<std::vector<RemotePtr>> Worker::read_list(RemotePtr node, unsigned level, OpContext& ctx) {
  const auto& L = g_.layout();
  Buffer b = s_.endpoint().alloc(L.list_bytes(level));
  Op op = Op::read(node + L.list_offset(level), b.data(), L.list_bytes(level));
  fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
  ++ctx.search.hops;
  ListFront f;
  std::memcpy(&f, b.data(), sizeof f);
  uint32_t count = std::min(f.count, L.capacity(level));  // a torn read never overruns the list
  std::vector<RemotePtr> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t raw;
    std::memcpy(&raw, b.data() + sizeof f + 8 * i, 8);
    RemotePtr p = RemotePtr::from_raw(raw);
    if (g_.plausible(p))
      out.push_back(p);
    else if (!p.is_null())
      ++ctx.search.skipped;
  }
  co_return out;
}

Task<Neighbor> Worker::greedy(const float* q, Neighbor cur, unsigned level, OpContext& ctx, VecCache* cache) {
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

Task<std::vector<Neighbor>> Worker::search_layer(const float* q, std::vector<Neighbor> eps, uint32_t ef,
                                                 unsigned level, OpContext& ctx, VecCache* cache, InEdges* in) {
  ctx.visited.clear();
  std::priority_queue<Neighbor, std::vector<Neighbor>, ByDistGreater> cand;  // nearest first
  std::priority_queue<Neighbor, std::vector<Neighbor>, ByDistLess> top;      // farthest first
  // Deleted nodes are expanded like the others (they keep the graph connected, as in hnswlib)
  // but never enter the results.
  for (const auto& e : eps) {
    if (!ctx.visited.insert(e.node)) continue;
    cand.push(e);
    if (e.deleted) continue;
    top.push(e);
    if (top.size() > ef) top.pop();
  }
  float bound = top.empty() ? std::numeric_limits<float>::max() : top.top().dist;
  while (!cand.empty()) {
    Neighbor c = cand.top();
    if (c.dist > bound && top.size() >= ef) break;
    cand.pop();
    std::vector<RemotePtr> nbrs = co_await read_list(c.node, level, ctx);
    if (in != nullptr && c.node != in->target && std::find(nbrs.begin(), nbrs.end(), in->target) != nbrs.end())
      in->found.push_back(c.node);
    if (cache != nullptr && cache->shared != nullptr)  // the lookups in read_vectors overlap the visited checks
      for (RemotePtr p : nbrs) cache->shared->prefetch(p);
    std::vector<RemotePtr> fresh;
    for (RemotePtr p : nbrs)
      if (ctx.visited.insert(p)) fresh.push_back(p);
    std::vector<Neighbor> got = co_await read_vectors(fresh, q, ctx, cache);
    for (const auto& n : got) {
      if (top.size() < ef || n.dist < bound) {
        cand.push(n);
        if (n.deleted) continue;
        top.push(n);
        if (top.size() > ef) top.pop();
        bound = top.top().dist;
      }
    }
  }
  std::vector<Neighbor> out;
  out.reserve(top.size());
  while (!top.empty()) {
    out.push_back(top.top());
    top.pop();
  }
  std::reverse(out.begin(), out.end());  // nearest first
  co_return out;
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
      const auto si = cache.find(s.node);
      if (f * g_.distance()(ci->v, si->v) < c.dist) {
        good = false;
        break;
      }
    }
    if (good) kept.push_back(c);
  }
  return kept;
}

namespace {
// A lock is held for a few round trips. One still taken after this long belongs to a
// computenode that died or stopped holding it: the waiter fails with an error instead of
// spinning for ever (the lock word does not say who holds it, so nobody can take it over).
constexpr auto kLockWaitLimit = std::chrono::seconds(10);
}  // namespace

Task<uint64_t> Worker::lock_node(RemotePtr n, unsigned level, OpContext& ctx) {
  // The usual header first (live, first generation); a failed COMPARE_SWAP returns the header
  // there is, which the next attempt expects when it is unlocked.
  uint64_t expect = NodeHeader::make(level);
  const auto deadline = std::chrono::steady_clock::now() + kLockWaitLimit;
  for (;;) {
    uint64_t old = co_await atomic(Op::compare_swap(n, expect, expect | NodeHeader::kLockBit, nullptr), ctx);
    if (old == expect) co_return expect | NodeHeader::kLockBit;
    if (!NodeHeader::locked(old)) expect = old;
    if (!NodeHeader::valid(old) || NodeHeader::level(old) != level)
      throw FabricError("node at memnode " + std::to_string(n.node()) + " offset " + std::to_string(n.offset()) +
                        " has a corrupt header while locking it");
    if (std::chrono::steady_clock::now() > deadline)
      throw FabricError("the lock of the node at memnode " + std::to_string(n.node()) + " offset " +
                        std::to_string(n.offset()) + " is still held after " +
                        std::to_string(kLockWaitLimit.count()) +
                        " s: a computenode died or stopped holding it; the build cannot go on");
  }
}

Task<void> Worker::lock_entry(OpContext& ctx) {
  const auto deadline = std::chrono::steady_clock::now() + kLockWaitLimit;
  for (;;) {
    uint64_t old = co_await atomic(Op::compare_swap(word_ptr(shine_word::kEntryLock), 0, 1, nullptr), ctx);
    if (old == 0) co_return;
    if (std::chrono::steady_clock::now() > deadline)
      throw FabricError("the entry-point lock (memnode 0 header) is still held after " +
                        std::to_string(kLockWaitLimit.count()) +
                        " s: a computenode died or stopped holding it; the build cannot go on");
  }
}

Task<void> Worker::unlock_node(RemotePtr n, uint64_t locked, uint64_t unlocked, OpContext& ctx) {
  const uint64_t old = co_await atomic(Op::compare_swap(n, locked, unlocked, nullptr), ctx);
  if (old != locked)
    throw FabricError("the node at memnode " + std::to_string(n.node()) + " offset " + std::to_string(n.offset()) +
                      " was not locked when its holder released it (header word " + std::to_string(old) + ")");
}

Task<void> Worker::unlock_entry(OpContext& ctx) {
  const uint64_t old = co_await atomic(Op::compare_swap(word_ptr(shine_word::kEntryLock), 1, 0, nullptr), ctx);
  if (old != 1)
    throw FabricError("the entry-point lock (memnode 0 header) was not held when its holder released it (word " +
                      std::to_string(old) + ")");
}

Task<void> Worker::write_list(RemotePtr n, unsigned level, const std::vector<RemotePtr>& list, OpContext& ctx) {
  const auto& L = g_.layout();
  std::vector<char> buf(L.list_bytes(level), 0);
  ListFront f{static_cast<uint32_t>(list.size()), 0};
  std::memcpy(buf.data(), &f, sizeof f);
  for (size_t i = 0; i < list.size(); ++i) {
    uint64_t raw = list[i].raw();
    std::memcpy(buf.data() + sizeof f + 8 * i, &raw, 8);
  }
  co_await write(n + L.list_offset(level), buf.data(), buf.size(), ctx);
}

// Adds `me` to n's list at `level` under n's lock; a full list is pruned with the heuristic.
Task<void> Worker::link(RemotePtr n, RemotePtr me, float d_me, unsigned level, OpContext& ctx, VecCache& cache) {
  const auto& L = g_.layout();
  const std::optional<VecEntry> self = cache.find(n);
  if (!self) co_return;  // only nodes whose vector we read get linked
  const unsigned n_level = self->level;
  const uint64_t held = co_await lock_node(n, n_level, ctx);
  std::vector<RemotePtr> list = co_await read_list(n, level, ctx);
  const uint32_t cap = L.capacity(level);
  std::vector<RemotePtr> next;
  if (std::find(list.begin(), list.end(), me) != list.end()) {
    next = list;
  } else if (list.size() < cap) {
    next = list;
    next.push_back(me);
  } else {
    // Distances from n to its current neighbours and to me; read missing vectors first.
    std::vector<RemotePtr> missing;
    for (RemotePtr p : list)
      if (!cache.find(p)) missing.push_back(p);
    const float* nv = self->v;
    co_await read_vectors(missing, nv, ctx, &cache);
    std::vector<Neighbor> cands{{d_me, me, 0}};
    for (RemotePtr p : list) {
      if (auto e = cache.find(p)) cands.push_back({g_.distance()(nv, e->v), p, e->label});
    }
    std::sort(cands.begin(), cands.end(), ByDistLess{});
    for (const auto& c : select_heuristic(cands, cap, cache)) next.push_back(c.node);
  }
  co_await write_list(n, level, next, ctx);
  co_await unlock_node(n, held, NodeHeader::unlocked(held), ctx);
}

Task<bool> Worker::insert(const float* v, uint64_t label, OpContext& ctx, bool upsert) {
  if (upsert && !ids_)
    throw std::invalid_argument("upsert: this shine index has no id index (build it with --id-capacity N)");
  const auto& L = g_.layout();
  // 1. Level and memnode; a deleted record kept for reuse (preferably there, with its own
  //    level), else a new one by FETCH_ADD on that memnode's bump pointer.
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  unsigned level = std::min<unsigned>(kMaxLevel, static_cast<unsigned>(-std::log(std::max(u, 1e-300)) * level_mult_));
  uint16_t node_id = static_cast<uint16_t>(rng_() % g_.num_memnodes());
  RemotePtr me, replaced;  // replaced (upsert): the node that held the id, deleted once me is linked
  if (free_) me = co_await free_->pop(node_id, &ctx.io);
  const bool reused = !me.is_null();
  if (reused) {
    level = co_await reuse(me, v, label, upsert, replaced, ctx);
  } else {
    const uint64_t bytes = (L.node_bytes(level) + 63) / 64 * 64;
    const uint64_t at =
        co_await atomic(Op::fetch_add(RemotePtr(node_id, mode_word_offset(shine_word::kBump)), bytes, nullptr), ctx);
    const auto& b = g_.bounds(node_id);
    if (at + bytes > b.size)
      throw FabricError("memnode " + std::to_string(node_id) + " (" + g_.cluster().memnodes()[node_id].address +
                        ") is out of region space: a level-" + std::to_string(level) + " node needs " +
                        std::to_string(bytes) + " bytes at offset " + std::to_string(at) + ", the region has " +
                        std::to_string(b.size) + " (start it with a larger --region or add memnodes)");
    me = RemotePtr(node_id, at);
    if (ctx.allocated.size() <= node_id) ctx.allocated.resize(node_id + 1u, 0);
    ++ctx.allocated[node_id];
    // 2. The whole record, lists empty, written before anyone can reach it.
    const std::vector<char> rec = record(level, label, v);
    co_await write(me, rec.data(), rec.size(), ctx);
    // The id first: a node is linked only under an id that is its own. A refused record stays
    // unlinked (its bytes are not reused).
    if (ids_) co_await map_id(label, me, upsert, replaced, ctx);
  }
  co_await link_new(me, v, level, label, ctx);
  bool was_replaced = false;
  if (!replaced.is_null()) {
    was_replaced = co_await tombstone(replaced, ctx);
    if (was_replaced) co_await keep_for_reuse(replaced, ctx);
  }
  if (!reused) co_await atomic(Op::fetch_add(word_ptr(shine_word::kNodeCount), 1, nullptr), ctx);
  co_return was_replaced;
}

Task<void> Worker::map_id(uint64_t label, RemotePtr me, bool upsert, RemotePtr& replaced, OpContext& ctx) {
  auto r = co_await ids_->insert(label, me, upsert, &ctx.io);
  if (r.what == IdIndex::Put::Present) {
    // A delete that stopped between marking the node and removing its id leaves an entry that
    // holds no live node: it is taken over.
    uint64_t h = 0;
    co_await read_words(r.old, &h, 1, ctx);
    if (!NodeHeader::deleted(h))
      throw std::invalid_argument("id " + std::to_string(label) + " is already in the index (the node at memnode " +
                                  std::to_string(r.old.node()) + " offset " + std::to_string(r.old.offset()) + ")");
    r = co_await ids_->insert(label, me, true, &ctx.io);
  }
  if (r.what == IdIndex::Put::Replaced) replaced = r.old;
}

std::vector<char> Worker::record(unsigned level, uint64_t label, const float* v) const {
  const auto& L = g_.layout();
  std::vector<char> rec(L.node_bytes(level), 0);
  const NodeFront front{NodeHeader::make(level), label};
  std::memcpy(rec.data(), &front, sizeof front);
  std::memcpy(rec.data() + NodeLayout::vector_offset(), v, 4ull * L.dim());
  return rec;
}

Task<unsigned> Worker::reuse(RemotePtr n, const float* v, uint64_t label, bool upsert, RemotePtr& replaced,
                             OpContext& ctx) {
  uint64_t front[2];
  co_await read_words(n, front, 2, ctx);
  if (!g_.plausible(n) || !NodeHeader::valid(front[0]) || !NodeHeader::deleted(front[0]))
    throw FabricError("the free stack of memnode " + std::to_string(n.node()) + " names offset " +
                      std::to_string(n.offset()) + ", which holds no deleted node (header word " +
                      std::to_string(front[0]) + "; a corrupt free stack?)");
  const unsigned level = NodeHeader::level(front[0]);
  co_await detach(n, level, v, ctx);
  // The record, still deleted (searches may pass through it), rewritten under its lock: all but
  // the header word, which atomics touch.
  const uint64_t held = co_await lock_node(n, level, ctx);
  const std::vector<char> rec = record(level, label, v);
  static_assert(offsetof(NodeFront, label) == sizeof(uint64_t));
  co_await write(n + offsetof(NodeFront, label), rec.data() + offsetof(NodeFront, label),
                 rec.size() - offsetof(NodeFront, label), ctx);
  const uint32_t generation = NodeHeader::generation(held) + 1;
  std::exception_ptr duplicate;
  try {
    co_await map_id(label, n, upsert, replaced, ctx);
  } catch (const std::invalid_argument&) {
    duplicate = std::current_exception();
  }
  if (duplicate) {  // the record stays deleted, with its new generation, and goes back
    co_await unlock_node(n, held, NodeHeader::make(level, false, true, generation), ctx);
    co_await keep_for_reuse(n, ctx);
    std::rethrow_exception(duplicate);
  }
  co_await unlock_node(n, held, NodeHeader::make(level, false, false, generation), ctx);
  // Node caches learn of it from the reuse log before this insert returns.
  const uint64_t number = co_await atomic(Op::fetch_add(word_ptr(shine_word::kReused), 1, nullptr), ctx);
  const ReuseLog& log = g_.params().reuse_log;
  const uint64_t entry[2] = {number + 1, n.raw()};
  co_await write(log.entry(number), entry, sizeof entry, ctx);
  ++ctx.search.reused;
  co_return level;
}

Task<std::vector<std::vector<RemotePtr>>> Worker::find_in_edges(RemotePtr s, const float* v, unsigned level,
                                                                 const Entry& entry, OpContext& ctx, VecCache& cache) {
  std::vector<std::vector<RemotePtr>> in(level + 1u);
  if (entry.node.is_null()) co_return in;
  const Neighbor top = co_await descend(v, entry.node, entry.level, level, ctx, &cache);
  std::vector<Neighbor> eps{top};
  for (int l = static_cast<int>(std::min(level, entry.level)); l >= 0; --l) {
    InEdges probe{s, {}};
    std::vector<Neighbor> w =
        co_await search_layer(v, eps, g_.params().ef_construction, static_cast<unsigned>(l), ctx, &cache, &probe);
    in[static_cast<size_t>(l)] = std::move(probe.found);
    if (!w.empty()) eps = std::move(w);
  }
  co_return in;
}

Task<void> Worker::detach(RemotePtr s, unsigned level, const float* any, OpContext& ctx) {
  const auto& L = g_.layout();
  std::vector<RemotePtr> out0 = co_await read_list(s, 0, ctx);
  if (out0.empty()) co_return;  // emptied after a consolidation: nothing links to it, nothing to repair
  const Entry entry = co_await read_entry(ctx);
  // No vector of a record reused since is taken from the shared cache (which the log may also
  // turn off: then this reuse keeps what it reads itself).
  if (shared_ != nullptr && entry.reused > shared_->applied()) co_await apply_reuse_log_to_vectors(entry.reused, ctx);
  VecCache cache;  // the vectors this reuse reads (compared and searched)
  cache.shared = shared_;
  // Its old vector, still in the record: the nodes near it that link to it are found by a search.
  std::vector<RemotePtr> me(1, s);
  co_await read_vectors(me, any, ctx, &cache);
  std::vector<std::vector<RemotePtr>> in(level + 1u);
  if (const auto old = cache.find(s)) {
    const std::vector<float> v(old->v, old->v + L.dim());
    in = co_await find_in_edges(s, v.data(), level, entry, ctx, cache);
  }
  for (unsigned l = 0; l <= level; ++l) {
    std::vector<RemotePtr> out;
    if (l == 0)
      out = std::move(out0);
    else
      out = co_await read_list(s, l, ctx);
    std::vector<RemotePtr> linking = out;  // those that may link back, then those found linking
    for (RemotePtr n : in[l])
      if (std::find(linking.begin(), linking.end(), n) == linking.end()) linking.push_back(n);
    for (RemotePtr n : linking) {
      if (n == s) continue;
      if (!cache.find(n)) {
        std::vector<RemotePtr> one(1, n);  // (a braced list in a co_await trips GCC 12)
        co_await read_vectors(one, any, ctx, &cache);
      }
      const std::optional<VecEntry> self = cache.find(n);
      if (!self || self->level < l) continue;
      const uint64_t held = co_await lock_node(n, self->level, ctx);
      const std::vector<RemotePtr> list = co_await read_list(n, l, ctx);
      if (std::find(list.begin(), list.end(), s) != list.end()) {
        // FreshDiskANN's repair: s's neighbours take the place of the edge to s. The list's
        // other nodes all stay; s's neighbours are chosen around them with the heuristic (as
        // consolidate does: pruning the whole list afresh drops the build's back-links).
        std::vector<RemotePtr> cand, kept;
        for (RemotePtr p : list)
          if (p != s) kept.push_back(p);
        for (RemotePtr p : out)
          if (p != s && p != n && std::find(kept.begin(), kept.end(), p) == kept.end()) cand.push_back(p);
        const uint32_t cap = L.capacity(l);
        std::vector<RemotePtr> next;
        if (kept.size() + cand.size() <= cap) {
          next = kept;
          next.insert(next.end(), cand.begin(), cand.end());
        } else {
          std::vector<RemotePtr> missing;
          for (RemotePtr p : kept)
            if (!cache.find(p)) missing.push_back(p);
          for (RemotePtr p : cand)
            if (!cache.find(p)) missing.push_back(p);
          const std::vector<Neighbor> got = co_await read_vectors(missing, self->v, ctx, &cache);
          auto deleted = [&](RemotePtr p) {
            const auto it = std::find_if(got.begin(), got.end(), [&](const Neighbor& x) { return x.node == p; });
            return it != got.end() && it->deleted;  // deleted: no place in a repaired list
          };
          std::vector<Neighbor> keep, nb;
          for (RemotePtr p : kept)
            if (auto e = cache.find(p); e && !deleted(p)) keep.push_back({g_.distance()(self->v, e->v), p, e->label});
          for (RemotePtr p : cand)
            if (auto e = cache.find(p); e && !deleted(p)) nb.push_back({g_.distance()(self->v, e->v), p, e->label});
          std::sort(nb.begin(), nb.end(), ByDistLess{});
          for (const auto& c : select_heuristic(nb, cap, cache, 1.0f, keep)) next.push_back(c.node);
        }
        co_await write_list(n, l, next, ctx);
      }
      co_await unlock_node(n, held, NodeHeader::unlocked(held), ctx);
    }
  }
}

Task<void> Worker::keep_for_reuse(RemotePtr n, OpContext& ctx) {
  if (!free_) co_return;
  const Entry e = co_await read_entry(ctx);
  // A deleted entry point hands over to a live neighbour first: no search should start at a
  // record that will hold another vector. With no live neighbour it stays, deleted and guiding,
  // until a consolidation retires it (Worker::retire_entry).
  if (e.node == n) {
    const bool handed = co_await hand_over_entry(n, e.level, ctx);
    if (!handed) co_return;
  }
  co_await free_->push(n, &ctx.io);
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

Task<Worker::EntryMove> Worker::set_entry_from(RemotePtr old, const std::vector<RemotePtr>& cands, OpContext& ctx) {
  const std::vector<uint64_t> hs = co_await read_headers(cands, ctx);
  RemotePtr best;
  unsigned best_level = 0;
  for (size_t i = 0; i < cands.size(); ++i)
    if (NodeHeader::valid(hs[i]) && !NodeHeader::deleted(hs[i]) && (best.is_null() || NodeHeader::level(hs[i]) > best_level)) {
      best = cands[i];
      best_level = NodeHeader::level(hs[i]);
    }
  if (best.is_null()) co_return EntryMove::NoneLive;
  co_await lock_entry(ctx);
  const Entry e = co_await read_entry(ctx);
  if (e.node == old) {
    const std::array<uint64_t, 2> w{best.raw(), best_level};
    co_await write(word_ptr(shine_word::kEntryPoint), w.data(), 16, ctx);
  }
  co_await unlock_entry(ctx);
  co_return e.node == old ? EntryMove::Moved : EntryMove::Elsewhere;
}

Task<bool> Worker::hand_over_entry(RemotePtr n, unsigned level, OpContext& ctx) {
  for (int l = static_cast<int>(level); l >= 0; --l) {
    const std::vector<RemotePtr> list = co_await read_list(n, static_cast<unsigned>(l), ctx);
    if (list.empty()) continue;
    const EntryMove moved = co_await set_entry_from(n, list, ctx);
    if (moved != EntryMove::NoneLive) co_return true;
  }
  co_return false;
}

Task<void> Worker::link_new(RemotePtr me, const float* v, unsigned level, uint64_t label, OpContext& ctx) {
  const auto& L = g_.layout();
  const auto& P = g_.params();

  const Entry entry = co_await read_entry(ctx);
  if (shared_ != nullptr && entry.reused > shared_->applied()) co_await apply_reuse_log_to_vectors(entry.reused, ctx);
  VecCache cache;
  cache.shared = shared_;
  cache.add(me, v, L.dim(), level, label);
  RemotePtr ep = entry.node;
  unsigned max_level = entry.level;
  // As in hnswlib, a node that raises the top level is inserted under the entry-point lock,
  // so the upper levels grow one node at a time and stay connected.
  bool hold_entry = false;
  if (ep.is_null() || level > max_level) {
    co_await lock_entry(ctx);
    const Entry again = co_await read_entry(ctx);
    if (again.node.is_null()) {
      std::array<uint64_t, 2> w{me.raw(), level};
      co_await write(word_ptr(shine_word::kEntryPoint), w.data(), 16, ctx);
      co_await unlock_entry(ctx);
      co_return;
    }
    ep = again.node;
    max_level = again.level;
    hold_entry = level > max_level;
    if (!hold_entry) co_await unlock_entry(ctx);
  }

  // 3. Greedy descent above the new node's level, then efConstruction search and linking.
  const Neighbor top = co_await descend(v, ep, max_level, level, ctx, &cache);
  std::vector<Neighbor> eps{top};
  bool retried = false;
  for (int l = static_cast<int>(std::min(level, max_level)); l >= 0; --l) {
    std::vector<Neighbor> w;
    for (;;) {
      w = co_await search_layer(v, eps, P.ef_construction, static_cast<unsigned>(l), ctx, &cache);
      // With deletes in the index, candidates the cache gave are checked: no new edge to a deleted node.
      if (entry.deleted > 0) co_await drop_deleted(w, ctx);
      // A concurrent inserter may already have made me reachable: never pick myself.
      w.erase(std::remove_if(w.begin(), w.end(), [&](const Neighbor& n) { return n.node == me; }), w.end());
      if (!w.empty() || retried || entry.deleted == 0) break;
      // Nothing live found: the descent ended in a deleted record a consolidation emptied (an
      // entry point it moved meanwhile). Once, from the entry point as it is now.
      retried = true;
      const Entry now = co_await read_entry(ctx);
      if (now.node.is_null() || now.node == me || now.level < static_cast<unsigned>(l)) break;
      eps.assign(1, co_await descend(v, now.node, now.level, static_cast<unsigned>(l), ctx, &cache));
    }
    std::vector<Neighbor> sel = select_heuristic(w, P.m, cache);
    // My own list, under my lock: a concurrent inserter that reached me through an upper
    // level may already have linked itself here; its link is kept (pruned if over capacity).
    const uint64_t held = co_await lock_node(me, level, ctx);
    std::vector<RemotePtr> mine = co_await read_list(me, static_cast<unsigned>(l), ctx);
    std::vector<RemotePtr> next;
    for (const auto& n : sel) next.push_back(n.node);
    for (RemotePtr p : mine)
      if (std::find(next.begin(), next.end(), p) == next.end() && next.size() < L.capacity(static_cast<unsigned>(l)))
        next.push_back(p);
    co_await write_list(me, static_cast<unsigned>(l), next, ctx);
    co_await unlock_node(me, held, NodeHeader::unlocked(held), ctx);
    for (const auto& n : sel) co_await link(n.node, me, n.dist, static_cast<unsigned>(l), ctx, cache);
    if (!w.empty()) eps = w;
  }

  // 4. A new top level moves the entry point; then the lock is released.
  if (hold_entry) {
    std::array<uint64_t, 2> w{me.raw(), level};
    co_await write(word_ptr(shine_word::kEntryPoint), w.data(), 16, ctx);
    co_await unlock_entry(ctx);
  }
}

Task<void> Worker::read_words(RemotePtr at, uint64_t* out, size_t n, OpContext& ctx) {
  Buffer b = s_.endpoint().alloc(8 * n);
  Op op = Op::read(at, b.data(), 8 * n);
  fail(co_await s_.io(std::span<Op>(&op, 1), true, &ctx.io));
  std::memcpy(out, b.data(), 8 * n);
}

Task<bool> Worker::tombstone(RemotePtr n, OpContext& ctx) {
  uint64_t h = 0;
  co_await read_words(n, &h, 1, ctx);
  if (!NodeHeader::valid(h))
    throw FabricError("the node at memnode " + std::to_string(n.node()) + " offset " + std::to_string(n.offset()) +
                      " has a corrupt header (word " + std::to_string(h) + ") while deleting it");
  if (NodeHeader::deleted(h)) co_return false;
  const uint64_t held = co_await lock_node(n, NodeHeader::level(h), ctx);
  const bool fresh = !NodeHeader::deleted(held);
  co_await unlock_node(n, held, NodeHeader::unlocked(held) | NodeHeader::kDeletedBit, ctx);
  if (fresh) co_await atomic(Op::fetch_add(word_ptr(shine_word::kDeleted), 1, nullptr), ctx);
  co_return fresh;
}

Task<bool> Worker::remove(uint64_t id, OpContext& ctx) {
  if (!ids_) throw std::invalid_argument("delete: this shine index has no id index (build it with --id-capacity N)");
  const RemotePtr n = co_await ids_->find(id, &ctx.io);
  if (n.is_null()) co_return false;
  if (!g_.plausible(n))
    throw FabricError("the id index maps id " + std::to_string(id) + " to memnode " + std::to_string(n.node()) +
                      " offset " + std::to_string(n.offset()) + ", not a node of this index (a corrupted id index?)");
  // Marked first, then unmapped: a delete that stops in between leaves a deleted node under its
  // id, which inserts take over and deletes finish; never a live node that no id names.
  const bool marked = co_await tombstone(n, ctx);
  co_await ids_->erase(id, n, &ctx.io);
  if (marked) co_await keep_for_reuse(n, ctx);  // only once no id names it
  co_return marked;
}

Task<std::vector<RemotePtr>> Worker::read_reuse_log(uint64_t from, uint64_t upto, bool& lost, uint64_t& done,
                                                    OpContext& ctx) {
  const ReuseLog& log = g_.params().reuse_log;
  std::vector<RemotePtr> out;
  lost = upto - from > log.capacity;
  if (lost) from = upto - log.capacity;
  done = from;
  if (upto <= from || log.capacity == 0) co_return out;
  // Entries [from, upto): one READ, or two where the ring wraps, in one doorbell.
  const uint64_t n = upto - from, first = from % log.capacity;
  const uint64_t head = std::min(n, log.capacity - first);
  Buffer b = s_.endpoint().alloc(ReuseLog::kEntryBytes * n);
  std::vector<Op> ops{Op::read(log.entry(from), b.data(), ReuseLog::kEntryBytes * head)};
  if (head < n)
    ops.push_back(Op::read(log.entry(from + head), b.data() + ReuseLog::kEntryBytes * head,
                           ReuseLog::kEntryBytes * (n - head)));
  fail(co_await s_.io(ops, true, &ctx.io));
  for (uint64_t i = 0; i < n; ++i, ++done) {
    uint64_t e[2];
    std::memcpy(e, b.data() + ReuseLog::kEntryBytes * i, sizeof e);
    if (e[0] != from + i + 1) break;  // claimed, not written yet: its insert has not returned
    out.push_back(RemotePtr::from_raw(e[1]));
  }
  co_return out;
}

Task<void> Worker::apply_reuse_log(uint64_t upto, OpContext& ctx) {
  cache::NodeCache& nc = *ctx.node_cache;
  bool lost = false;
  uint64_t done = 0;
  const std::vector<RemotePtr> reused = co_await read_reuse_log(nc.applied(), upto, lost, done, ctx);
  if (lost) nc.clear();  // more reuses than the ring holds: which records is not known
  for (RemotePtr p : reused) nc.erase(p);
  nc.set_applied(done);
}

Task<void> Worker::apply_reuse_log_to_vectors(uint64_t upto, OpContext& ctx) {
  bool lost = false;
  uint64_t done = 0;
  const std::vector<RemotePtr> reused = co_await read_reuse_log(shared_->applied(), upto, lost, done, ctx);
  if (lost) {  // not known which: stop using the shared cache (each insert keeps what it reads)
    shared_ = nullptr;
    co_return;
  }
  for (RemotePtr p : reused) shared_->invalidate(p);
  shared_->set_applied(done);
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
      if (reused) ctx.node_cache->erase(n.node);  // its vector is another's now
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

Task<std::vector<Neighbor>> Worker::search(const float* q, uint32_t k, uint32_t ef, OpContext& ctx,
                                           uint32_t upper_ef) {
  const Entry entry = co_await read_entry(ctx);
  RemotePtr ep = entry.node;
  unsigned max_level = entry.level;
  if (ep.is_null()) co_return std::vector<Neighbor>{};
  if (ctx.node_cache != nullptr && entry.reused > ctx.node_cache->applied())
    co_await apply_reuse_log(entry.reused, ctx);
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
  // A node cache's entries do not see deletes: while the index has any, the results it gave
  // are checked against the index.
  if (entry.deleted > 0) co_await drop_stale(w, k, ctx);
  if (w.size() > k) w.resize(k);
  co_return w;
}

}  // namespace dmhnsw::shine
