// Delete consolidation (FreshDiskANN, Singh et al. 2021, section 4): after deletes, every live
// node's edges to deleted nodes are replaced by those nodes' live neighbours, chosen with the
// heuristic around the live neighbours it keeps. A reuse of a deleted record then finds no live
// list pointing at it: without this, the lists that a reuse's in-edge search does not reach keep
// an edge that, once the record holds another vector, leads somewhere unrelated (what costs
// recall under churn at scale).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "common/progress.hpp"
#include "compute/write_gate.hpp"
#include "compute/board.hpp"
#include "compute/shine/engine.hpp"
#include "compute/shine/graph.hpp"
#include "compute/shine/run_util.hpp"

namespace dmhnsw::shine {

using nlohmann::json;

Task<void> Worker::read_flags(const std::vector<RemotePtr>& nodes, const float* q,
                              std::unordered_map<uint64_t, bool>& deleted, OpContext& ctx, VecCache& cache) {
  std::vector<RemotePtr> fresh;
  for (RemotePtr n : nodes)
    if (!deleted.contains(n.raw()) && std::find(fresh.begin(), fresh.end(), n) == fresh.end()) fresh.push_back(n);
  const std::vector<Neighbor> got = co_await read_vectors(fresh, q, ctx, &cache);
  for (const Neighbor& n : got) deleted[n.node.raw()] = n.deleted;
}

Task<unsigned> Worker::consolidate(RemotePtr p, OpContext& ctx, float alpha) {
  const auto& L = g_.layout();
  VecCache cache;  // this node's candidates: read here, so their deleted flags are current
  std::unordered_map<uint64_t, bool> deleted;  // node -> deleted, as read
  const std::vector<float> zero(L.dim(), 0.f);
  {
    std::vector<RemotePtr> me(1, p);
    co_await read_flags(me, zero.data(), deleted, ctx, cache);
  }
  const auto self = cache.find(p);
  if (!self) co_return 0;  // not a node (an entry reused or moved meanwhile)
  const unsigned level = self->level;
  unsigned rewritten = 0;
  for (unsigned l = 0; l <= level; ++l) {
    {  // Without the lock first: most lists of a node far from the deletes need nothing.
      const std::vector<RemotePtr> list = co_await read_list(p, l, ctx);
      co_await read_flags(list, self->v, deleted, ctx, cache);
      if (std::none_of(list.begin(), list.end(), [&](RemotePtr n) { return deleted[n.raw()]; })) continue;
    }
    const uint64_t held = co_await lock_node(p, level, ctx);
    const std::vector<RemotePtr> list = co_await read_list(p, l, ctx);
    co_await read_flags(list, self->v, deleted, ctx, cache);
    std::vector<RemotePtr> cand, via;
    for (RemotePtr n : list) (deleted[n.raw()] ? via : cand).push_back(n);
    std::vector<RemotePtr> more;
    for (RemotePtr d : via) {
      const std::vector<RemotePtr> dl = co_await read_list(d, l, ctx);
      for (RemotePtr n : dl)
        if (n != p && std::find(cand.begin(), cand.end(), n) == cand.end()) more.push_back(n);
    }
    co_await read_flags(more, self->v, deleted, ctx, cache);
    const size_t still = cand.size();  // the list's live nodes: kept, the others added around them
    for (RemotePtr n : more)
      if (!deleted[n.raw()] && std::find(cand.begin(), cand.end(), n) == cand.end()) cand.push_back(n);
    // A list whose nodes and their neighbours were all deleted is written empty: an edge to a
    // record the pass empties would be a dead end, and once reused an edge to an unrelated vector.
    if (!via.empty()) {
      std::vector<Neighbor> keep, nb;
      for (size_t i = 0; i < cand.size(); ++i)
        if (const auto e = cache.find(cand[i]); e && e->level >= l)
          (i < still ? keep : nb).push_back({g_.distance()(self->v, e->v), cand[i], e->label});
      // Candidates nearest first; the kept need no order.
      std::sort(nb.begin(), nb.end(), [](const Neighbor& a, const Neighbor& b) { return a.dist < b.dist; });
      std::vector<RemotePtr> next;
      for (const auto& x : select_heuristic(nb, L.capacity(l), cache, alpha, keep)) next.push_back(x.node);
      co_await write_list(p, l, next, ctx);
      ++rewritten;
    }
    co_await unlock_node(p, held, NodeHeader::unlocked(held), ctx);
  }
  co_return rewritten;
}

Task<bool> Worker::orphan(RemotePtr n, uint64_t seen, OpContext& ctx) {
  if (!g_.plausible(n) || !NodeHeader::valid(seen) || !NodeHeader::deleted(seen)) co_return false;
  const unsigned level = NodeHeader::level(seen);
  const uint64_t held = co_await lock_node(n, level, ctx);
  // Reused since (a later generation), it may be linked again: left alone.
  const bool same = NodeHeader::deleted(held) && NodeHeader::generation(held) == NodeHeader::generation(seen);
  const std::vector<RemotePtr> none;
  if (same)
    for (unsigned l = 0; l <= level; ++l) co_await write_list(n, l, none, ctx);
  co_await unlock_node(n, held, NodeHeader::unlocked(held), ctx);
  co_return same;
}

Task<bool> Worker::retire_entry(RemotePtr old, uint64_t seen, const std::vector<RemotePtr>& live, OpContext& ctx) {
  if (!NodeHeader::valid(seen) || !NodeHeader::deleted(seen)) co_return false;
  // Elsewhere: a delete handed it over (and kept it for reuse) or an insert rose above it.
  const EntryMove moved = co_await set_entry_from(old, live, ctx);
  if (moved != EntryMove::Moved) co_return false;
  const bool emptied = co_await orphan(old, seen, ctx);
  if (emptied) co_await keep_for_reuse(old, ctx);
  co_return true;
}

std::vector<std::pair<RemotePtr, uint64_t>> kept_records(fabric::Endpoint& ep, const FreeTable& t) {
  std::vector<std::pair<RemotePtr, uint64_t>> out;
  constexpr size_t kBatch = 256;
  for (uint16_t m = 0; m < t.memnodes && t.capacity > 0; ++m) {
    uint64_t w = 0;
    ep.read(t.state(m), &w, 8);
    const uint64_t count = std::min(FreeState::count(w), t.capacity);
    std::vector<uint64_t> slots(count);
    constexpr uint64_t kChunk = 512 * 1024;  // slots per READ (4 MiB)
    for (uint64_t i = 0; i < count; i += kChunk)
      ep.read(t.slot(m, i), slots.data() + i, 8 * std::min(kChunk, count - i));
    fabric::Buffer b = ep.alloc(8 * kBatch);
    for (size_t at = 0; at < slots.size(); at += kBatch) {
      std::vector<fabric::Op> ops;
      for (size_t i = at; i < std::min(slots.size(), at + kBatch); ++i)
        ops.push_back(fabric::Op::read(RemotePtr::from_raw(slots[i]), b.data() + 8 * (i - at), 8, ops.size()));
      if (ep.post(ops) != fabric::Status::Ok)
        throw fabric::FabricError("consolidate: reading deleted records' headers on memnode " + std::to_string(m) + " failed");
      ep.wait_all(ops.size());
      for (size_t i = 0; i < ops.size(); ++i) {
        uint64_t h;
        std::memcpy(&h, b.data() + 8 * i, 8);
        out.emplace_back(RemotePtr::from_raw(slots[at + i]), h);
      }
    }
  }
  return out;
}

std::vector<RemotePtr> live_nodes(fabric::Endpoint& ep, const IdTable& t) {
  std::vector<RemotePtr> out;
  constexpr uint64_t kChunk = 4u << 20;
  const uint64_t bytes = t.bytes_per_memnode();
  std::vector<char> buf;
  for (uint16_t m = 0; m < t.memnodes; ++m)
    for (uint64_t at = 0; at < bytes; at += kChunk) {
      const uint64_t n = std::min(kChunk, bytes - at);
      buf.resize(n);
      ep.read(RemotePtr(m, t.offset + at), buf.data(), n);
      for (uint64_t o = 0; o < n; o += 8) {
        if ((at + o) % IdSlot::kBucketBytes == 0) continue;  // a bucket's lock word
        uint64_t w;
        std::memcpy(&w, buf.data() + o, 8);
        if (w != 0) out.push_back(IdSlot::node(w));
      }
    }
  return out;
}

json run_consolidate(const RunContext& rc, const ConsolidateOptions& o) {
  fabric::Cluster& c = *rc.cluster;
  auto control = c.make_endpoint(16u << 20);
  const GraphParams p = format_or_attach(c, *control, nullptr, rc.cn_id);
  if (p.ids.buckets == 0)
    throw std::invalid_argument("consolidate: this shine index has no id index (it has no deletes either)");
  // The whole run under one pass of the write gate: a snapshot waits until it is done.
  compute::WriteGate gate(c);
  compute::WriteGate::Pass pass(gate);
  Graph g(c, p);
  const auto t0 = Clock::now();
  std::vector<RemotePtr> all = live_nodes(*control, p.ids);
  uint64_t entry = 0;  // the entry point stays even when deleted: it guides every search
  control->read(RemotePtr(0, mode_word_offset(shine_word::kEntryPoint)), &entry, 8);
  if (entry != 0 && std::find(all.begin(), all.end(), RemotePtr::from_raw(entry)) == all.end())
    all.push_back(RemotePtr::from_raw(entry));
  std::vector<RemotePtr> mine;
  for (size_t i = rc.cn_id; i < all.size(); i += rc.num_cns) mine.push_back(all[i]);
  compute::Board board(c, *control, rc.cn_id, rc.num_cns, "consolidate", rc.departed_at_connect);
  // The records deleted before any computenode begins: no live list names them after the pass.
  // So with the entry point when it is one (deletes keep it off the free stacks).
  std::vector<std::pair<RemotePtr, uint64_t>> before;
  std::pair<RemotePtr, uint64_t> old_entry{RemotePtr::from_raw(entry), 0};
  if (rc.cn_id == 0) {
    before = kept_records(*control, p.free);
    if (entry != 0) control->read(old_entry.first, &old_entry.second, 8);
  }
  board.barrier();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lists{0}, nodes_changed{0}, orphaned{0};
  IoStats io;
  SearchStats ss;
  ProgressOptions po;
  po.enabled = o.progress;
  Progress done("shine consolidate", mine.size(), "nodes", po);
  const uint64_t seed = p.seed * 7919 + rc.cn_id * 1009;
  for (const OpContext& x : each_item<Worker, OpContext>(
           c, g, o.threads, o.coroutines, seed, mine.size(), stop,
           [&](Worker& w, size_t i, OpContext& ctx) -> compute::Task<void> {
             const unsigned r = co_await w.consolidate(mine[i], ctx, o.alpha);
             lists += r;
             nodes_changed += r > 0;
             done.add();
           })) {
    io += x.io;
    ss.hops += x.search.hops;
    ss.visited += x.search.visited;
  }
  done.finish();
  // This computenode's lists are rewritten: a list cache drops what it read before.
  const RemotePtr list_changes(0, mode_word_offset(shine_word::kListChanges));
  control->fetch_add(list_changes, 1);
  const uint64_t gen = board.barrier();
  // Every computenode is done: computenode 0 empties the lists of the records deleted before.
  if (!before.empty())
    for (const OpContext& x : each_item<Worker, OpContext>(
             c, g, o.threads, o.coroutines, seed + 77, before.size(), stop,
             [&](Worker& w, size_t i, OpContext& ctx) -> compute::Task<void> {
               if (co_await w.orphan(before[i].first, before[i].second, ctx)) ++orphaned;
             }))
      io += x.io;
  if (!before.empty()) control->fetch_add(list_changes, 1);
  bool entry_moved = false;
  if (rc.cn_id == 0 && NodeHeader::valid(old_entry.second) && NodeHeader::deleted(old_entry.second)) {
    compute::Scheduler s(*control);
    Worker w(g, s, seed + 99);
    OpContext ctx;
    entry_moved = compute::run_sync(s, w.retire_entry(old_entry.first, old_entry.second, all, ctx));
    io += ctx.io;
  }
  const double secs = seconds_since(t0);
  json mine_j = {{"cn_id", rc.cn_id},           {"nodes", mine.size()},       {"nodes_changed", nodes_changed.load()},
                 {"lists_rewritten", lists.load()}, {"lists_read", ss.hops},   {"vectors_read", ss.visited},
                 {"records_emptied", orphaned.load()}, {"entry_moved", entry_moved}, {"seconds", secs},       {"io", io_json(io)}};
  board.publish(gen, mine_j.dump());
  json report = {{"mode", "shine"}, {"kind", "consolidate"}, {"provider", rc.provider}, {"num_cns", rc.num_cns},
                 {"threads", o.threads}, {"coroutines", o.coroutines}, {"alpha", o.alpha}};
  if (rc.cn_id != 0) {
    report["cn"] = mine_j;
    return report;
  }
  uint64_t nodes = 0, changed = 0, rewritten = 0, emptied = 0;
  bool moved = false;
  double max_secs = 0;
  json per_cn = json::array();
  for (const auto& text : board.gather(gen)) {
    json j = json::parse(text);
    nodes += j["nodes"].get<uint64_t>();
    changed += j["nodes_changed"].get<uint64_t>();
    rewritten += j["lists_rewritten"].get<uint64_t>();
    emptied += j["records_emptied"].get<uint64_t>();
    moved = moved || j["entry_moved"].get<bool>();
    max_secs = std::max(max_secs, j["seconds"].get<double>());
    per_cn.push_back(j);
  }
  report.update({{"nodes", nodes}, {"nodes_changed", changed}, {"lists_rewritten", rewritten},
                 {"records_emptied", emptied}, {"entry_moved", moved}, {"seconds", max_secs},
                 {"nodes_per_s", static_cast<double>(nodes) / std::max(max_secs, 1e-9)}, {"per_cn", per_cn}});
  return report;
}

void print_consolidate(const json& r) {
  if (!r.contains("nodes")) return;
  std::printf("shine consolidate: %llu nodes checked, %llu of them linked to deleted nodes (%llu lists rewritten), "
              "%llu deleted records emptied for reuse%s, %.2f s (%.0f nodes/s)\n",
              static_cast<unsigned long long>(r["nodes"].get<uint64_t>()),
              static_cast<unsigned long long>(r["nodes_changed"].get<uint64_t>()),
              static_cast<unsigned long long>(r["lists_rewritten"].get<uint64_t>()),
              static_cast<unsigned long long>(r["records_emptied"].get<uint64_t>()),
              r["entry_moved"].get<bool>() ? " (the deleted entry point among them: a live node is the entry now)" : "",
              r["seconds"].get<double>(),
              r["nodes_per_s"].get<double>());
}

}  // namespace dmhnsw::shine
