// shine's deletes and record reuse: tombstones, the reuse log, and a deleted record's reuse
// for a new vector (its in-edges repaired first: Worker::detach). Consolidation of whole lists
// after many deletes is in consolidate.cpp.
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

}  // namespace dmhnsw::shine
