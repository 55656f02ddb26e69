#pragma once
// SHINE: one global HNSW graph in the memory nodes' regions, built and searched by
// computenodes with one-sided operations only (paper sections 2-3, Algorithm 1).
// This file is the datapath: insert and search as coroutines over a Scheduler. The Worker's
// search path is in graph.cpp, its insert path in graph_insert.cpp, deletes and record reuse in
// graph_reuse.cpp.
#include <cstdint>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

#include "common/distance.hpp"
#include "common/fabric/transport.hpp"
#include "common/region.hpp"
#include "cache/node_cache.hpp"
#include "cache/trace.hpp"
#include "compute/shine/layout.hpp"
#include "compute/codes.hpp"
#include "compute/coro.hpp"
#include "compute/shine/free_list.hpp"
#include "compute/id_index.hpp"
#include "compute/shine/vector_cache.hpp"

namespace dmhnsw::shine {

using compute::IoStats;
using compute::Scheduler;
using compute::Task;

/// Index parameters, stored in memnode 0's region header when the index is formatted.
struct GraphParams {
  uint32_t dim = 0;
  uint32_t m = 16;
  uint32_t ef_construction = 200;
  Metric metric = Metric::L2;
  uint64_t seed = 100;
  /// Formatting: ids the id index is sized for (0: no id index).
  uint64_t id_capacity = 0;
  /// The stored index's id table (buckets 0: none).
  IdTable ids;
  /// Its stacks of deleted records (capacity 0: none; they come with an id index).
  FreeTable free;
  ReuseLog reuse_log;
  /// Compressed vectors. Formatting: the trained quantizer (null: none) and the codes log's
  /// entries per memnode (0: twice the build's rows over the memnodes, at least 1024). A stored
  /// index: its quantizer as loaded from the codes block (null: none) and the block's place.
  std::shared_ptr<const compute::Quantizer> codes;
  uint64_t codes_capacity = 0;
  uint64_t codes_block = 0, codes_block_bytes = 0;
  CodesLog codes_log;
  /// Where node records start on every memnode (after the id index, free stacks, reuse log and
  /// codes); 0: at each memnode's data area, rounded up to 64.
  uint64_t records = 0;
};

/// Where a formatted index's areas lie on every memnode, from `first` (the largest data-area
/// start, rounded to 64): the id index, the free stacks, then node records (the bump word).
struct IndexAreas {
  IdTable ids;
  FreeTable free;
  ReuseLog reuse_log;
  uint64_t codes_block = 0, codes_block_bytes = 0;  // with codes: the block, then the log
  CodesLog codes_log;
  uint64_t records = 0;
};
/// `codes_block_bytes` 0: no codes (`codes_log` ignored).
IndexAreas plan_areas(uint64_t id_capacity, uint16_t memnodes, uint64_t first, uint64_t codes_block_bytes = 0,
                      CodesLog codes_log = {});

/// How a candidate's neighbours' vectors are read: one READ per neighbour (the paper), or
/// all of them as one doorbell batch.
enum class ReadMode { PerRead, Batch };

/// What a memnode's region looks like to the graph (from its header at connect time).
struct RegionBounds {
  uint64_t data_offset = 0;
  uint64_t size = 0;
};

/// One search result: distance, node, label; `deleted`: a tombstone (guides, is never returned).
struct Neighbor {
  float dist;
  RemotePtr node;
  uint64_t label;
  bool deleted = false;
  bool cached = false;      // from a node cache: deleted may be out of date, the record reused since
  uint32_t generation = 0;  // of the record when its vector was read
};

struct SearchStats {
  uint64_t visited = 0;   // distinct nodes whose vector was read (or whose code was compared)
  uint64_t coded = 0;     // of them, compared by their code (no READ)
  uint64_t reranked = 0;  // vectors read to re-rank the best candidates found by codes
  uint64_t hops = 0;      // candidates expanded (neighbour lists read or found in the list cache)
  uint64_t cached_lists = 0;  // of them, lists the node cache held (no READ)
  uint64_t list_bytes = 0;    // bytes of the lists read
  uint64_t skipped = 0;   // invalid pointers or headers met (concurrent writers)
  uint64_t stale = 0;     // results a cache held that the index had deleted meanwhile (dropped)
  uint64_t reused = 0;    // inserts into a deleted node's record
};

/// Formats the memnodes for a shine index (the first computenode to arrive does it), or
/// attaches to an existing one. Returns the stored parameters; throws when `wanted` (if
/// given) disagrees with a stored index, naming the parameter. `self`: this computenode's id,
/// written while it formats so that others waiting fail at once if it leaves (-1: not said).
GraphParams format_or_attach(fabric::Cluster& c, fabric::Endpoint& ep, const GraphParams* wanted, int64_t self = -1);

/// Expected bytes of `nodes` node records of dimension `dim` and HNSW M `m`.
uint64_t estimate_record_bytes(uint32_t dim, uint32_t m, uint64_t nodes);
/// Before a build formats empty memnodes: throws std::invalid_argument naming the memnode, the
/// bytes the index of `rows` vectors with `p` (its id index, codes and node records) needs on
/// each, and the --region to use, when a region cannot hold its share or memnode 0's scratch
/// area cannot hold the coordination board. Does nothing when the memnodes hold an index.
void check_room_for_build(fabric::Cluster& c, const GraphParams& p, uint64_t rows);

/// Raises memnode 0's id ceiling (shine_word::kIdCeiling) to at least `ceiling`.
void raise_id_ceiling(fabric::Endpoint& ep, uint64_t ceiling);
/// Claims labels [lo, hi) for new vectors: raises the ceiling to hi when it is at most lo and
/// returns true; returns false (claiming nothing) when the ceiling is above lo, setting `ceiling`
/// to it. Two claims of overlapping ranges never both succeed.
bool claim_ids(fabric::Endpoint& ep, uint64_t lo, uint64_t hi, uint64_t& ceiling);

/// The nodes an id index names (each live node once), read bucket by bucket from every memnode.
std::vector<RemotePtr> live_nodes(fabric::Endpoint& ep, const IdTable& t);
/// The records on the free stacks now, each with its header as read.
std::vector<std::pair<RemotePtr, uint64_t>> kept_records(fabric::Endpoint& ep, const FreeTable& t);

/// The process-wide view of the graph: layout, bounds, distance kernel. Read-only, shared
/// by all worker threads.
class Graph {
 public:
  Graph(fabric::Cluster& c, const GraphParams& p);
  const NodeLayout& layout() const { return layout_; }
  const GraphParams& params() const { return params_; }
  const DistanceComputer& distance() const { return dist_; }
  uint16_t num_memnodes() const { return static_cast<uint16_t>(bounds_.size()); }
  /// A pointer is followed only if it lands in some memnode's data area, 8-byte aligned.
  bool plausible(RemotePtr p) const {
    return plausible(p, bounds_.data(), bounds_.size(), layout_.vector_part_bytes());
  }
  /// The same over bounds the caller holds (a hop keeps them in registers).
  static bool plausible(RemotePtr p, const RegionBounds* bounds, size_t n, uint64_t vector_part) {
    if (p.is_null() || p.node() >= n || p.offset() % 8 != 0) return false;
    const RegionBounds& b = bounds[p.node()];
    return p.offset() >= b.data_offset && p.offset() + vector_part <= b.size;
  }
  const RegionBounds& bounds(uint16_t node) const { return bounds_[node]; }
  const std::vector<RegionBounds>& all_bounds() const { return bounds_; }
  fabric::Cluster& cluster() const { return cluster_; }

 private:
  fabric::Cluster& cluster_;
  GraphParams params_;
  NodeLayout layout_;
  DistanceComputer dist_;
  std::vector<RegionBounds> bounds_;
};

/// The node records a search has met. Over the data areas of a graph (use_areas): one bit per
/// 2^shift bytes of them, as hnswlib's visited array has one tag per element, which a record at
/// least 2^shift bytes long owns alone; clear() zeroes the words it set. Else, and for a key
/// outside the areas, an open-addressing table cleared in O(1).
class VisitedSet {
  struct Area {
    uint64_t begin = 0, span = 0;  // region offsets [begin, begin + span)
    uint64_t first_bit = 0;
  };

 public:
  void use_areas(const std::vector<RegionBounds>& areas, unsigned shift);
  bool has_areas() const { return !areas_.empty(); }
  void clear();
  /// True when newly inserted (a Hop of one).
  bool insert(RemotePtr p) { return hop(1).insert(p); }
  /// Keys inserted since clear() (counted, not kept: for tests).
  size_t size() const;

  /// insert for the neighbours of one hop, at most `max` of them, inlined into the layer search
  /// (it runs for every neighbour, as hnswlib's tag check): the bit path's state is in locals,
  /// which the stores into the bits cannot alias, so they stay in registers from one neighbour
  /// to the next. A word's first bit notes the word without a branch (that one went either
  /// way). What it noted is written back when it goes.
  class Hop {
   public:
    Hop(const Hop&) = delete;
    Hop& operator=(const Hop&) = delete;
    ~Hop() { set_.n_touched_ = n_touched_; }
    [[gnu::always_inline]] bool insert(RemotePtr p) {
      const uint64_t off = p.offset();
      if (p.node() < n_areas_) [[likely]] {
        const Area& a = areas_[p.node()];
        if (off - a.begin < a.span) [[likely]] return insert_in_area(p.node(), off - a.begin);
      }
      return set_.insert_hashed(p);
    }
    /// insert of a record in area `node` (areas as use_areas was given them) at `rel` bytes
    /// past its start, which the caller checked lies within it (a plausible pointer).
    [[gnu::always_inline]] bool insert_in_area(uint32_t node, uint64_t rel) { return note_in_area(node, rel) != 0; }
    /// insert_in_area as a number, without a branch on the bit: 1 when newly inserted, else 0.
    /// Whether a neighbour was met before goes either way, and a mispredicted branch per
    /// neighbour costs more than the few instructions the caller then does for nothing.
    [[gnu::always_inline]] uint32_t note_in_area(uint32_t node, uint64_t rel) {
      const uint64_t bit = areas_[node].first_bit + (rel >> shift_);
      uint64_t& w = bits_[bit >> 6];
      const uint64_t old = w;
      const uint64_t m = uint64_t{1} << (bit & 63);
      touched_[n_touched_] = static_cast<uint32_t>(bit >> 6);  // room made by hop()
      n_touched_ += old == 0;
      w = old | m;
      return static_cast<uint32_t>(((old & m) >> (bit & 63)) ^ 1);
    }

   private:
    friend class VisitedSet;
    explicit Hop(VisitedSet& s)
        : set_(s), areas_(s.areas_.data()), n_areas_(s.n_areas_), shift_(s.shift_), bits_(s.bits_.data()),
          touched_(s.touched_.data()), n_touched_(s.n_touched_) {}
    VisitedSet& set_;
    const Area* areas_;
    uint32_t n_areas_;
    unsigned shift_;
    uint64_t* bits_;
    uint32_t* touched_;
    size_t n_touched_;
  };
  Hop hop(size_t max) {
    if (touched_.size() < n_touched_ + max + 1) touched_.resize(std::max(2 * touched_.size(), n_touched_ + max + 1));
    return Hop(*this);
  }

 private:
  [[gnu::noinline]] bool insert_hashed(RemotePtr p);
  void grow();
  std::vector<Area> areas_;
  uint32_t n_areas_ = 0;  // areas_.size(), which insert would divide out of the vector's bounds
  unsigned shift_ = 0;
  std::vector<uint64_t> bits_;
  std::vector<uint32_t> touched_ = std::vector<uint32_t>(64);  // [0, n_touched_): words of bits_ set since clear()
  size_t n_touched_ = 0;
  size_t hashed_ = 0;              // keys in the table
  // A key and the clear() generation it was inserted in, side by side: one cache line per probe.
  struct Slot {
    uint64_t key = 0;
    uint64_t gen = 0;
  };
  std::vector<Slot> slots_;
  uint32_t cur_ = 1;
};

/// Per-coroutine state of one insert or query.
class LocalCodes;

struct OpContext {
  ReadMode mode = ReadMode::Batch;
  /// Queries over an index with codes: each node this computenode holds a code of is compared
  /// by its code (no READ); the best `rerank` candidates are then read and compared exactly.
  const LocalCodes* codes = nullptr;
  uint32_t rerank = 0;
  const compute::CodeDistance* code_dist = nullptr;  // set by Worker::search for one query
  cache::NodeCache* node_cache = nullptr;  // queries: the computenode's node cache of vectors (optional)
  // Queries: the node cache holding neighbour lists instead (--cache-holds), each entry the list
  // as read at the index's lists version (Worker::Entry::lists, low 32 bits), its key the list's
  // address. Never both caches.
  cache::NodeCache* list_cache = nullptr;
  uint32_t lists_version = 0;  // set by Worker::search for one query
  // Queries: lists and vectors read where the endpoint maps them (Endpoint::mapped: cxl), with
  // no copy and no suspension; else, and for whatever is not mapped, READs.
  bool in_place = false;
  // Scratch lists reused hop after hop instead of allocated per hop: search_layer's unvisited
  // neighbours, read_vectors' nodes to read (neither calls itself or the other's user).
  std::vector<RemotePtr> fresh_scratch, remote_scratch;
  cache::TraceWriter* trace = nullptr;     // queries: records every node-cache access (optional)
  std::vector<cache::TraceRecord>* accesses = nullptr;  // queries: the same records kept in memory (optional)
  bool measured = true;                    // trace flag: outside the warm-up
  std::vector<uint64_t> allocated;  // nodes this context allocated, by memnode id
  IoStats io;
  SearchStats search;
  VisitedSet visited;
};

/// Floats per node-cache entry: a vector, or the largest neighbour list (level 0's) as read.
uint32_t cache_entry_floats(const NodeLayout& L, bool lists);
/// A search context's reads: `cache` holds vectors or (`lists`) neighbour lists; in place, a
/// list costs no READ, so a cache of lists is not used.
void set_search_reads(OpContext& ctx, cache::NodeCache* cache, bool lists, bool in_place);

/// A worker: one thread's scheduler over its endpoint, running insert/search coroutines.
class Worker {
 public:
  /// `shared` (optional) is the process-wide vector cache used by inserts.
  Worker(const Graph& g, Scheduler& s, uint64_t seed, VectorCache* shared = nullptr);

  /// Inserts one vector under id `label`. With an id index, an id already in it is refused
  /// (std::invalid_argument naming it) before the node is linked, unless `upsert`: then the new
  /// node takes the id over once it is linked and the old one is deleted; returns true when an
  /// old node was replaced.
  Task<bool> insert(const float* v, uint64_t label, OpContext& ctx, bool upsert = false);
  /// Deletes the node holding `id` (the id index's): it is marked deleted (keeps guiding
  /// searches, is never returned) and its id removed. Returns false when the id is not in the
  /// index. Throws std::invalid_argument when the index has no id index.
  Task<bool> remove(uint64_t id, OpContext& ctx);
  /// k nearest neighbours with efSearch `ef` (Algorithm 1), the levels above 0 searched with
  /// `upper_ef` (1: greedy, as HNSW does; more: level 0 starts from that many nodes).
  Task<std::vector<Neighbor>> search(const float* q, uint32_t k, uint32_t ef, OpContext& ctx, uint32_t upper_ef = 1);
  /// The best `r` of `w` (found by their codes) read and compared exactly, nearest first;
  /// deleted ones and pointers that are not nodes dropped.
  Task<std::vector<Neighbor>> rerank(const float* q, std::vector<Neighbor> w, uint32_t r, OpContext& ctx);
  /// FreshDiskANN's delete consolidation for node `p` (compute/shine/consolidate.cpp): each of
  /// its lists that names deleted nodes gets, under p's lock, those nodes' live neighbours in
  /// their place, pruned with the heuristic (DiskANN's RobustPrune with `alpha`; 1: hnswlib's).
  /// Returns the lists rewritten.
  Task<unsigned> consolidate(RemotePtr p, OpContext& ctx, float alpha = 1.0f);
  /// After a consolidation pass: deleted record `n`, whose header read `seen` before the pass
  /// began, has its lists emptied under its lock if it is still that deleted record (same
  /// generation). No live list names it any more, so a reuse of it skips the in-edge search
  /// (Worker::detach). Returns whether it did.
  Task<bool> orphan(RemotePtr n, uint64_t seen, OpContext& ctx);
  /// After a consolidation pass: the entry point `old`, deleted before the pass began (header
  /// `seen`), is replaced by the live node of `live` with the highest level (under the entry
  /// lock, if still the entry point), then emptied and kept for reuse like the other deleted
  /// records. A deleted entry point kept with its lists would lead every descent into records
  /// the pass emptied (dead ends: a search from one finds nothing). Returns whether it moved.
  Task<bool> retire_entry(RemotePtr old, uint64_t seen, const std::vector<RemotePtr>& live, OpContext& ctx);

 private:
  /// The vectors one insert knows: the shared cache first, then its own overflow; or, where
  /// the regions are mapped here (`regions`), every record's vector where it lies, nothing copied.
  struct VecCache {
    struct Local {
      std::vector<float> v;
      unsigned level;
      uint64_t label;
    };
    VectorCache* shared = nullptr;
    std::unordered_map<uint64_t, Local> local;  // what the shared cache had no room for
    /// In place: each memnode's mapped region (null: not mapped). Pointers looked up are
    /// plausible (in bounds), as every pointer a search follows.
    std::vector<const char*> regions;
    bool mapped() const { return !regions.empty(); }
    std::optional<VecEntry> find(RemotePtr p) const {
      if (mapped()) {
        const char* b = p.node() < regions.size() ? regions[p.node()] : nullptr;
        if (b == nullptr) return std::nullopt;
        NodeFront f;
        std::memcpy(&f, b + p.offset(), sizeof f);
        if (!NodeHeader::valid(f.header)) return std::nullopt;  // not (yet) a node
        return VecEntry{reinterpret_cast<const float*>(b + p.offset() + NodeLayout::vector_offset()),
                        NodeHeader::level(f.header), f.label};
      }
      if (shared != nullptr)
        if (auto e = shared->find(p)) return e;
      if (local.empty()) return std::nullopt;
      auto it = local.find(p.raw());
      if (it == local.end()) return std::nullopt;
      return VecEntry{it->second.v.data(), it->second.level, it->second.label};
    }
    VecEntry add(RemotePtr p, const float* v, size_t dim, unsigned level, uint64_t label) {
      if (mapped()) return find(p).value_or(VecEntry{v, level, label});  // `v` may be a READ's buffer: not kept
      if (shared != nullptr)
        if (auto e = shared->insert(p, v, level, label)) return *e;
      const Local& l = local.emplace(p.raw(), Local{std::vector<float>(v, v + dim), level, label}).first->second;
      return VecEntry{l.v.data(), l.level, l.label};
    }
  };

  /// Steps 2-4 of an insert: the new node `me` (written, not yet reachable) linked in.
  Task<void> link_new(RemotePtr me, const float* v, unsigned level, uint64_t label, OpContext& ctx);
  Task<void> read_words(RemotePtr at, uint64_t* out, size_t n, OpContext& ctx);
  struct Entry {
    RemotePtr node;
    unsigned level = 0;
    uint64_t deleted = 0;  // shine_word::kDeleted
    uint64_t reused = 0;   // shine_word::kReused
    uint64_t lists = 0;    // shine_word::kNodeCount + kListChanges: the version of every neighbour list
  };
  Task<Entry> read_entry(OpContext& ctx);
  /// The header words of `nodes`, 256 per doorbell.
  Task<std::vector<uint64_t>> read_headers(const std::vector<RemotePtr>& nodes, OpContext& ctx);
  /// Under the entry lock: if the entry point is still `old`, the live node of `cands` with the
  /// highest level takes its place (Moved); Elsewhere: it was not `old` any more; NoneLive: none
  /// of `cands` is live (nothing changed).
  enum class EntryMove { Moved, Elsewhere, NoneLive };
  Task<EntryMove> set_entry_from(RemotePtr old, const std::vector<RemotePtr>& cands, OpContext& ctx);
  /// A deleted entry point `n` of top level `level` hands over to a live neighbour, from its top
  /// level down. False when it has none (it stays the entry point).
  Task<bool> hand_over_entry(RemotePtr n, unsigned level, OpContext& ctx);
  /// Drops from `w` (nearest first) the results a cache held that are deleted now, reading the
  /// fronts of the first k in one doorbell (again for the next ones while some were dropped).
  Task<void> drop_stale(std::vector<Neighbor>& w, uint32_t k, OpContext& ctx);
  /// Inserts: drops from `w` the candidates a cache gave that are deleted now (one doorbell).
  Task<void> drop_deleted(std::vector<Neighbor>& w, OpContext& ctx);
  /// The fronts (header, label) of w[idx[j]], in one doorbell.
  Task<std::vector<NodeFront>> read_fronts(const std::vector<Neighbor>& w, const std::vector<size_t>& idx,
                                           OpContext& ctx);
  /// A node record with empty lists: header (live, unlocked), label, vector.
  std::vector<char> record(unsigned level, uint64_t label, const float* v) const;
  /// Marks `n` deleted under its lock; false when it already was.
  Task<bool> tombstone(RemotePtr n, OpContext& ctx);
  /// Keeps deleted `n` (whose id no longer names it) for reuse, unless it is the entry point.
  Task<void> keep_for_reuse(RemotePtr n, OpContext& ctx);
  /// Reuse of deleted record `n` (hnswlib's replace_deleted): the nodes that link to it (those in
  /// its lists and those a search for its old vector finds) get its neighbours instead (pruned
  /// with the heuristic), so no list keeps an edge chosen for the old vector; then `rec` (label,
  /// vector, empty lists) is written under its lock, the id mapped, and
  /// it comes back live with the next generation. Returns the level; throws for a duplicate id
  /// (the record then goes back to the stacks).
  Task<unsigned> reuse(RemotePtr n, const float* v, uint64_t label, bool upsert, RemotePtr& replaced, OpContext& ctx);
  Task<void> detach(RemotePtr n, unsigned level, const float* any, OpContext& ctx);
  /// Consolidation: reads the nodes of `nodes` not in `deleted` yet (their vectors into `cache`,
  /// distances to q) and notes whether each is deleted.
  Task<void> read_flags(const std::vector<RemotePtr>& nodes, const float* q, std::unordered_map<uint64_t, bool>& deleted,
                        OpContext& ctx, VecCache& cache);
  /// The node cache drops the records reused since it last looked, up to reuse `upto`.
  Task<void> apply_reuse_log(uint64_t upto, OpContext& ctx);
  /// The same for the shared vector cache of inserts.
  Task<void> apply_reuse_log_to_vectors(uint64_t upto, OpContext& ctx);
  /// Reads reuse log entries [from, upto) (the last `capacity` of them at most: `lost` says
  /// whether older ones were overwritten); returns the records of the entries written, in
  /// order, stopping at the first not written yet, and in `done` the position after them.
  Task<std::vector<RemotePtr>> read_reuse_log(uint64_t from, uint64_t upto, bool& lost, uint64_t& done, OpContext& ctx);
  /// Maps `label` to `me` in the id index; `replaced` gets the node it held (upsert).
  Task<void> map_id(uint64_t label, RemotePtr me, bool upsert, RemotePtr& replaced, OpContext& ctx);
  /// With codes: the node's code appended to its memnode's codes log (a full log is left alone:
  /// searches read that node's vector instead).
  Task<void> append_code(RemotePtr me, uint64_t label, const float* v, OpContext& ctx);
  /// Reads the vector parts of `nodes`; returns (node, distance to q, label) of the valid ones
  /// and, with a cache, keeps their vectors.
  Task<std::vector<Neighbor>> read_vectors(const std::vector<RemotePtr>& nodes, const float* q, OpContext& ctx,
                                           VecCache* cache);
  Task<std::vector<RemotePtr>> read_list(RemotePtr node, unsigned level, OpContext& ctx);
  Task<Neighbor> greedy(const float* q, Neighbor cur, unsigned level, OpContext& ctx, VecCache* cache);
  /// From entry point `ep` at level `from`, greedy steps down to level `to` + 1: the node nearest
  /// q found there (throws when `ep` holds no valid node).
  Task<Neighbor> descend(const float* q, RemotePtr ep, unsigned from, unsigned to, OpContext& ctx, VecCache* cache);
  /// The nodes a search expanded whose list links to `target` (a reuse's repair collects them).
  struct InEdges {
    RemotePtr target;
    std::vector<RemotePtr> found;
  };
  Task<std::vector<Neighbor>> search_layer(const float* q, std::vector<Neighbor> eps, uint32_t ef, unsigned level,
                                           OpContext& ctx, VecCache* cache, InEdges* in = nullptr);
  /// Whether a search with `cache` may take the in-place path below: records read where they
  /// lie and nothing else between (no codes, node cache, or vector cache that copies).
  bool all_in_place(const OpContext& ctx, const VecCache* cache) const {
    return ctx.in_place && (cache == nullptr || cache->mapped()) && ctx.code_dist == nullptr && ctx.node_cache == nullptr &&
           ctx.list_cache == nullptr;
  }
  /// search_layer and greedy without a suspension, a coroutine or a list per hop: each list and
  /// its neighbours' records read where the endpoint maps them. Same answers and counts as
  /// search_layer and greedy; nullopt (and the counts as before) when a record is not mapped
  /// here (a memnode found dead): the caller then searches by READs, which report it.
  std::optional<std::vector<Neighbor>> search_layer_mapped(const float* q, const std::vector<Neighbor>& eps,
                                                           uint32_t ef, unsigned level, OpContext& ctx);
  std::optional<Neighbor> greedy_mapped(const float* q, Neighbor cur, unsigned level, OpContext& ctx);
  /// ctx.visited keyed by bits over this graph's data areas (once per context).
  void use_record_bits(VisitedSet& v) const;
  /// Each memnode's region as the endpoint maps it (null: not mapped here), looked up once per
  /// layer search into regions_: a plausible record then lies at base + offset, with no virtual
  /// call per record. False when no region is mapped.
  bool look_up_regions();
  static Neighbor mapped_neighbor(float d, RemotePtr p, const NodeFront& f) {
    return Neighbor{d, p, f.label, NodeHeader::deleted(f.header), false, NodeHeader::generation(f.header)};
  }
  /// One hop in place: `node`'s list at `level` (mapped by the endpoint, which checks the
  /// memnode is alive), then the records of its neighbours (those new to ctx.visited when
  /// `visit`), each valid one handed to `take(distance, node, its front)` in list order. False,
  /// having handed none, when the list or a record is not mapped. Needs look_up_regions().
  template <class Take>
  bool hop_mapped(RemotePtr node, unsigned level, bool visit, const float* q, OpContext& ctx, Take&& take);
  /// Asks for the first lines of `node`'s list at `level` (hnswlib's prefetch of the candidate
  /// it will expand next, while the current hop's distances go on).
  void prefetch_list(RemotePtr node, unsigned level) const;
  /// For each level 0..level of deleted record `s` with vector `v`: the nodes near v that link
  /// to s, found by searching for v as an insert would (most of s's in-edges are one-way).
  Task<std::vector<std::vector<RemotePtr>>> find_in_edges(RemotePtr s, const float* v, unsigned level,
                                                          const Entry& entry, OpContext& ctx, VecCache& cache);
  /// hnswlib's neighbour heuristic over `cands` (nearest first): a candidate goes when a kept
  /// one is nearer to it than it is to the node; with `alpha` above 1, DiskANN's RobustPrune
  /// (nearer by that factor). `kept`: nodes kept whatever (they count toward `m`), which the
  /// candidates are then compared with.
  std::vector<Neighbor> select_heuristic(std::vector<Neighbor> cands, uint32_t m, const VecCache& cache,
                                         float alpha = 1.0f, std::vector<Neighbor> kept = {}) const;
  Task<void> link(RemotePtr n, RemotePtr me, float d_me, unsigned level, OpContext& ctx, VecCache& cache);
  Task<void> write_list(RemotePtr n, unsigned level, const std::vector<RemotePtr>& list, OpContext& ctx);
  Task<uint64_t> atomic(fabric::Op op, OpContext& ctx);
  Task<void> write(RemotePtr dst, const void* src, size_t len, OpContext& ctx);
  /// Takes n's lock (COMPARE_SWAP from whatever unlocked header it has); returns the header
  /// with the lock bit, which unlock_node gets back.
  Task<uint64_t> lock_node(RemotePtr n, unsigned level, OpContext& ctx);
  Task<void> lock_entry(OpContext& ctx);
  // Releases are COMPARE_SWAPs, never WRITEs: a WRITE is not atomic against another queue
  // pair's atomics (docs/architecture.md, "Words that atomics touch").
  /// Releases n's lock taken as `locked`, writing `unlocked` (the same header without the lock
  /// bit, or with changes such as the deleted bit).
  Task<void> unlock_node(RemotePtr n, uint64_t locked, uint64_t unlocked, OpContext& ctx);
  Task<void> unlock_entry(OpContext& ctx);
  void fail(const fabric::Completion& c) const;

  const Graph& g_;
  Scheduler& s_;
  std::mt19937_64 rng_;
  double level_mult_;
  VectorCache* shared_;
  std::optional<IdIndex> ids_;  // when the index has an id index
  std::optional<FreeLists> free_;  // when it keeps deleted records for reuse
  // look_up_regions(): per memnode, its region's mapping. The in-place layer searches use it
  // without a suspension and an insert copies it into its VecCache at once, so the coroutines of
  // this worker's thread cannot interleave on it.
  std::vector<const char*> regions_;
  // The same per memnode for a hop's checks: a pointer is plausible (Graph::plausible) when it is
  // 8-byte aligned and its offset's distance past `begin` is at most `last`, one unsigned
  // compare; `base` is regions_'s entry.
  struct MappedArea {
    const char* base;
    uint64_t begin, last;
  };
  std::vector<MappedArea> areas_;
  // A hop's new neighbours and where their records lie: room for a level-0 list, filled and
  // used between two suspensions (as regions_).
  std::vector<std::pair<RemotePtr, const char*>> where_;
};

}  // namespace dmhnsw::shine
