// shine's insert path (paper Algorithm 1): node and entry-point locks, a new node's record and
// its links at each level, and the back-links with pruning. The search path is in graph.cpp.
#include "compute/shine/graph.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "compute/shine/graph_detail.hpp"

namespace dmhnsw::shine {

using fabric::Buffer;
using fabric::FabricError;
using fabric::Op;
using namespace graph_detail;

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
  if (g_.params().codes) co_await append_code(me, label, v, ctx);
  co_await link_new(me, v, level, label, ctx);
  bool was_replaced = false;
  if (!replaced.is_null()) {
    was_replaced = co_await tombstone(replaced, ctx);
    if (was_replaced) co_await keep_for_reuse(replaced, ctx);
  }
  // Last, after every list write: list caches (search's version) see the change only now.
  co_await atomic(Op::fetch_add(word_ptr(reused ? shine_word::kListChanges : shine_word::kNodeCount), 1, nullptr), ctx);
  co_return was_replaced;
}

Task<void> Worker::append_code(RemotePtr me, uint64_t label, const float* v, OpContext& ctx) {
  const GraphParams& p = g_.params();
  const uint64_t slot =
      co_await atomic(Op::fetch_add(RemotePtr(me.node(), mode_word_offset(shine_word::kCodesLogCount)), 1, nullptr), ctx);
  if (slot >= p.codes_log.capacity) co_return;
  std::vector<char> e(p.codes_log.entry_bytes(), 0);
  const uint64_t raw = me.raw();
  std::memcpy(e.data(), &raw, 8);
  std::memcpy(e.data() + 8, &label, 8);
  p.codes->encode(v, 1, reinterpret_cast<uint8_t*>(e.data() + 16));
  co_await write(RemotePtr(me.node(), p.codes_log.entry_offset(slot)), e.data(), e.size(), ctx);
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

Task<void> Worker::link_new(RemotePtr me, const float* v, unsigned level, uint64_t label, OpContext& ctx) {
  const auto& L = g_.layout();
  const auto& P = g_.params();

  const Entry entry = co_await read_entry(ctx);
  VecCache cache;
  // In place, the searches, the pruning and the links compute on the records where they lie
  // (a vector found there is always the record's current one); else vectors read are kept.
  if (ctx.in_place && look_up_regions()) {
    cache.regions = regions_;
  } else {
    if (shared_ != nullptr && entry.reused > shared_->applied()) co_await apply_reuse_log_to_vectors(entry.reused, ctx);
    cache.shared = shared_;
  }
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

}  // namespace dmhnsw::shine
