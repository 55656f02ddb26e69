// The stages of the d-HNSW engine (pipeline_stages.hpp): planning a batch, fetching its
// sub-HNSWs with the seqlock check, deserializing and searching them.
#include "compute/dhnsw/pipeline_stages.hpp"

#include <malloc.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <mutex>
#include <span>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "common/distance.hpp"
#include "compute/dhnsw/insert_buffer.hpp"
#include "compute/dhnsw/sub_search.hpp"

namespace dmhnsw::dhnsw {

Engine::Impl::Impl(fabric::Cluster& cl, const Index& ix, const EngineOptions& opts, size_t cap)
    : c(cl), o(opts), epochs(cl, std::shared_ptr<const Index>(std::shared_ptr<const Index>{}, &ix), opts.ack_slot),
      cache(cap) {
  const int cores = std::max(1, omp_get_num_procs());
  // Every core, also when pipelined: the fetch stage naps while its READs are in flight and
  // the deserialize stage is short, so leaving them a core of their own measured slower.
  omp_threads = o.search_threads > 0 ? static_cast<int>(o.search_threads) : cores;
  // Deserialized sub-HNSWs come and go every batch: keep freed memory in the heap instead
  // of unmapping it, so the next one does not page-fault its arrays in again.
  static std::once_flag heap_once;
  std::call_once(heap_once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
  size_buffers(ix);
}

void Engine::Impl::size_buffers(const Index& index) {
  // A sub grows into its share of the shared gap: at most block + the whole gap.
  for (const auto& s : index.subs) max_fetch = std::max(max_fetch, s.block_bytes + s.overflow_bytes);
  buf_bytes = std::bit_ceil(std::max<uint64_t>(max_fetch, 4096));
}

bool Engine::Impl::take_in_place(Item& it, const Index& index, fabric::Endpoint& ep) const {
  const SubDesc& d = it.desc;
  if (!o.in_place || coded() || d.group_bytes == 0) return false;
  const char* group = ep.mapped(RemotePtr(d.memnode, d.group_offset), d.group_bytes);
  const char* live = ep.mapped(RemotePtr(d.memnode, live_desc_offset(index.header, d.id)), sizeof(SubDesc));
  if (group == nullptr || live == nullptr || reinterpret_cast<uintptr_t>(live) % alignof(SubDesc) != 0) return false;
  it.group = group;
  it.live = reinterpret_cast<const SubDesc*>(live);
  return true;
}

std::string Engine::Impl::sub_name(const Index& index, uint32_t id) {
  const SubDesc& d = index.subs.at(id);
  return "sub-HNSW " + std::to_string(id) + " (partition " + std::to_string(id) + ", memnode " +
         std::to_string(d.memnode) + " offset " + std::to_string(fetch_range(d).first) + ")";
}

std::vector<SubDesc> Engine::Impl::read_live(const Index& index, const std::vector<uint32_t>& subs, fabric::Endpoint& ep,
                               BatchStats& st) {
  std::vector<SubDesc> out(subs.size());
  if (subs.empty()) return out;
  fabric::Buffer b = ep.alloc(subs.size() * sizeof(SubDesc));
  std::vector<fabric::Op> ops;
  for (size_t i = 0; i < subs.size(); ++i)
    ops.push_back(fabric::Op::read(RemotePtr(index.subs.at(subs[i]).memnode, live_desc_offset(index.header, subs[i])),
                                   b.data() + i * sizeof(SubDesc), sizeof(SubDesc), i));
  if (fabric::Status s = ep.post(ops); s != fabric::Status::Ok) {  // nothing posted: name a sub on a dead memnode
    size_t bad = 0;
    while (bad + 1 < subs.size() && c.alive(ops[bad].remote.node())) ++bad;
    fabric::Completion cpl;
    cpl.tag = bad;
    cpl.status = s;
    cpl.node = ops[bad].remote.node();
    throw fabric::FabricError("reading the live descriptor of " + sub_name(index, subs[bad]) + " failed: " + ep.describe(cpl));
  }
  fabric::Completion cs[16];
  for (size_t left = ops.size(); left > 0;) {
    const size_t got = ep.poll(cs);
    for (size_t j = 0; j < got; ++j)
      if (cs[j].status != fabric::Status::Ok)
        throw fabric::FabricError("reading the live descriptor of " + sub_name(index, subs.at(cs[j].tag)) +
                                  " failed: " + ep.describe(cs[j]));
    left -= got;
    if (got == 0) std::this_thread::yield();
  }
  st.version_reads += ops.size();
  ++st.version_doorbells;
  for (size_t i = 0; i < subs.size(); ++i) {
    std::memcpy(&out[i], b.data() + i * sizeof(SubDesc), sizeof(SubDesc));
    const SubDesc& st0 = index.subs.at(subs[i]);
    if (out[i].id != subs[i] || out[i].block_offset != st0.block_offset || out[i].overflow_used > st0.overflow_bytes)
      throw std::runtime_error("the live descriptor of " + sub_name(index, subs[i]) +
                               " does not match the metadata block (was the index rebuilt?)");
  }
  return out;
}

std::shared_ptr<Engine::Impl::Job> Engine::Impl::open_batch(const float* queries, size_t first, uint32_t n,
                                                            fabric::Endpoint& ep, std::vector<Answer>& answers) {
  auto job = std::make_shared<Job>();
  const uint64_t was = epochs.current()->header.epoch;
  // A new epoch is acknowledged by the runner once the batches before this one are searched:
  // in place they still read the old area, which the ack lets the rebuild master free.
  const EpochWatcher::Seen seen = epochs.poll(ep, false);
  const Control& ctl = seen.control;
  if (seen.moved) {  // the cache goes with the old epoch
    spdlog::info("dhnsw: epoch {} -> {}: metadata refreshed, {} cached sub-HNSW(s) dropped", was,
                 epochs.current()->header.epoch, cache.size());
    cache.clear();
    size_buffers(*epochs.current());
  }
  job->index = epochs.current();
  job->epoch_moved = seen.moved;
  const Index& index = *job->index;
  job->st.epoch = index.header.epoch;
  if (ctl.phase != kIdle)
    job->st.buffered_scanned += buffer_search(ep, ctl, index.header.dim, index.inner_product(), o.k,
                                              queries + first * index.header.dim, n, answers.data() + first);
  job->first = first;
  job->n = n;
  if (coded()) job->cands.resize(n);
  job->closed = Clock::now();
  job->st.queries = n;
  const uint32_t P = index.header.num_subs, b = std::min(o.probe, P);
  std::vector<std::vector<uint32_t>> probes(n);
  {
    std::vector<float> D(size_t{n} * b);
    std::vector<faiss::Index::idx_t> I(size_t{n} * b);
    // The meta-HNSW searched as a sub-HNSW is (sub_search.hpp): its vector i is partition i.
    const SubView mv = view_of(*index.meta, nullptr);
    if (mv.count != static_cast<uint64_t>(index.meta->ntotal) || index.meta->d != static_cast<int>(index.header.dim))
      throw std::runtime_error("the meta-HNSW is not a flat-storage index of " + std::to_string(index.header.dim) +
                               "-dimensional centroids");
    const bool ip = index.meta->metric_type == faiss::METRIC_INNER_PRODUCT;
    const DistanceComputer dc(ip ? Metric::IP : Metric::L2, index.header.dim);
    const uint32_t ef = std::max(o.meta_ef_search, b);
    const int threads = n >= kParallelQueries ? omp_threads : 1;
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads)
    for (uint32_t q = 0; q < n; ++q) {
      thread_local SubSearcher searcher;
      thread_local std::vector<std::pair<float, int64_t>> got;
      got.resize(b);
      const size_t f = searcher.search(mv, dc, ip, queries + (first + q) * index.header.dim, b, ef, got.data());
      for (uint32_t j = 0; j < b; ++j) {
        D[size_t{q} * b + j] = j < f ? got[j].first : 0.0f;
        I[size_t{q} * b + j] = j < f ? got[j].second : -1;
      }
    }
    // The meta-HNSW's distances are squared L2 (partition metric l2); with ip no pruning.
    const bool prune = o.probe_ratio >= 1.0 && index.meta->metric_type == faiss::METRIC_L2;
    const double r2 = o.probe_ratio * o.probe_ratio;
    for (uint32_t q = 0; q < n; ++q) {
      const float* d = D.data() + size_t{q} * b;
      for (uint32_t j = 0; j < b; ++j) {
        faiss::Index::idx_t p = I[size_t{q} * b + j];
        if (prune && j > 0 && static_cast<double>(d[j]) > r2 * static_cast<double>(d[0])) break;
        if (p >= 0 && p < static_cast<faiss::Index::idx_t>(P)) probes[q].push_back(static_cast<uint32_t>(p));
      }
      job->st.probed += probes[q].size();
    }
  }
  {  // the live descriptors: a cached copy is good while its version is the live one
    std::vector<uint32_t> subs;
    for (const auto& q : probes) subs.insert(subs.end(), q.begin(), q.end());
    std::sort(subs.begin(), subs.end());
    subs.erase(std::unique(subs.begin(), subs.end()), subs.end());
    const std::vector<SubDesc> live = read_live(index, subs, ep, job->st);
    for (size_t i = 0; i < subs.size(); ++i) job->live[subs[i]] = live[i];
  }
  job->plan = plan_batch(probes, o.regroup, [&](uint32_t s) {
    if (!o.regroup) return false;
    auto hit = cache.get(s);
    if (!hit) return false;
    const SubDesc& d = job->live.at(s);
    if ((d.version & 1) != 0 || hit->version != d.version || hit->epoch != index.header.epoch) return false;
    job->hits[s] = std::move(hit);
    return true;
  });
  job->remaining = job->plan.entries.size();
  job->st.needed = job->plan.needed;
  job->st.cache_hits = job->plan.cache_hits;
  job->st.fetched = job->plan.fetches();
  job->st.meta_s = seconds_since(job->closed);
  return job;
}

std::vector<Engine::Impl::Item> Engine::Impl::fetch_group(const std::shared_ptr<Job>& job,
                                                          const std::vector<uint32_t>& entries, fabric::Endpoint& ep) {
  const Index& index = *job->index;
  auto t0 = Clock::now();
  std::vector<Item> items(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    items[i].job = job;
    items[i].entry = entries[i];
    items[i].desc = job->live.at(job->plan.entries[entries[i]].sub);
    if (!take_in_place(items[i], index, ep)) items[i].buf = ep.alloc(buf_bytes);
  }
  auto fail = [&](const fabric::Completion& cpl) {
    uint32_t sub = job->plan.entries[entries.at(cpl.tag)].sub;
    throw fabric::FabricError("fetching " + sub_name(index, sub) + " failed: " + ep.describe(cpl));
  };
  // A sub-HNSW READ takes hundreds of microseconds or more: after a short spin the fetch
  // stage naps between polls, leaving the core to the search and deserialize stages (and,
  // on shm and tcp, to the memnode's progress thread that serves the READ).
  auto wait = [&](size_t n) {
    fabric::Completion cs[16];
    unsigned idle = 0;
    while (n > 0) {
      size_t got = ep.poll(cs);
      for (size_t j = 0; j < got; ++j)
        if (cs[j].status != fabric::Status::Ok) fail(cs[j]);
      n -= got;
      if (got > 0)
        idle = 0;
      else if (++idle < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  };
  auto post = [&](std::span<const fabric::Op> span) {
    fabric::Status s = ep.post(span);
    if (s != fabric::Status::Ok) {  // nothing was posted: name an op toward a dead memnode if any
      const fabric::Op* bad = &span.front();
      for (const auto& op : span)
        if (!c.alive(op.remote.node())) {
          bad = &op;
          break;
        }
      fabric::Completion cpl;
      cpl.tag = bad->tag;
      cpl.status = s;
      cpl.node = bad->remote.node();
      fail(cpl);
    }
    ++job->st.doorbells;
  };
  // Seqlock: fetch with the live descriptor, READ it again; an item whose version moved (or
  // was odd: a commit in flight) is fetched again. After kAttempts it is taken as it is,
  // sanitized and not cached (a writer died inside a commit and no inserter repaired it yet).
  constexpr int kAttempts = 200;
  std::vector<size_t> pending;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].group == nullptr) pending.push_back(i);
  for (int attempt = 1; !pending.empty(); ++attempt) {
    std::vector<fabric::Op> ops;
    for (size_t i : pending) {
      auto [off, len] = fetch_range(items[i].desc);
      if (len > buf_bytes)
        throw std::runtime_error(sub_name(index, items[i].desc.id) + ": live fetch range of " + std::to_string(len) +
                                 " bytes is beyond its block and gap");
      items[i].len = len;
      // Over codes, the vectors' internal part stays in the region (the layout puts it last).
      const std::vector<std::pair<uint64_t, uint64_t>> parts =
          coded() ? coded_fetch_parts(items[i].desc) : std::vector<std::pair<uint64_t, uint64_t>>{{0, len}};
      for (const auto& [from, plen] : parts) {
        for (uint64_t at = from; at < from + plen; at += o.max_read_bytes) {
          uint64_t n = std::min<uint64_t>(o.max_read_bytes, from + plen - at);
          ops.push_back(fabric::Op::read(RemotePtr(items[i].desc.memnode, off + at), items[i].buf.data() + at, n, i));
        }
        job->st.bytes += plen;
      }
    }
    if (o.doorbell) {
      post(ops);
      wait(ops.size());
    } else {
      for (const auto& op : ops) {
        post(std::span<const fabric::Op>(&op, 1));
        wait(1);
      }
    }
    job->st.reads += ops.size();
    std::vector<uint32_t> subs;
    for (size_t i : pending) subs.push_back(items[i].desc.id);
    const std::vector<SubDesc> again = read_live(index, subs, ep, job->st);
    std::vector<size_t> next;
    bool odd = false;
    for (size_t j = 0; j < pending.size(); ++j) {
      Item& it = items[pending[j]];
      const bool stable = again[j].version == it.desc.version && (it.desc.version & 1) == 0;
      if (stable) continue;
      if (attempt >= kAttempts) {
        it.torn = true;
        continue;
      }
      odd = odd || (again[j].version & 1) != 0;
      it.desc = again[j];
      ++job->st.refetches;
      next.push_back(pending[j]);
    }
    pending.swap(next);
    if (odd) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  job->st.fetch_s += seconds_since(t0);
  return items;
}

void Engine::Impl::deserialize(Item& it) {
  if (it.group != nullptr) return;  // searched where it lies
  auto t0 = Clock::now();
  const uint32_t sub = it.job->plan.entries[it.entry].sub;
  const Index& index = *it.job->index;
  auto s = std::make_shared<SubIndex>(deserialize_sub(it.buf.data(), it.len, it.desc, index.header, sub_name(index, sub),
                                                      it.torn, coded() ? index.codes : nullptr));
  if (it.torn)
    spdlog::warn("{}: no consistent copy after repeated fetches (a commit left in flight, version {}); searched "
                 "a sanitized copy ({} neighbour entries dropped)", sub_name(index, sub), it.desc.version, s->sanitized);
  it.sub = std::move(s);
  if (o.regroup && !it.torn) cache.put(sub, it.sub);
  it.job->st.deserialize_s += seconds_since(t0);
}

pipeline_detail::Hits Engine::Impl::search_view(const SubView& v, const Job& job, const PlanEntry& e,
                                                const float* queries) const {
  const Index& index = *job.index;
  const uint32_t dim = index.header.dim, nq = static_cast<uint32_t>(e.queries.size());
  const bool ip = index.inner_product();
  const DistanceComputer dc(ip ? Metric::IP : Metric::L2, dim);
  pipeline_detail::Hits h;
  h.k = o.k;
  h.r.resize(size_t{nq} * h.k);
  h.found.resize(nq);
  const uint32_t ef = std::max(o.ef_search, h.k);
  // For a handful of queries one thread does better than waking the others (on a busy host
  // that costs milliseconds).
  const int threads = nq >= kParallelQueries ? omp_threads : 1;
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
  for (uint32_t i = 0; i < nq; ++i) {
    thread_local SubSearcher searcher;
    h.found[i] = static_cast<uint32_t>(searcher.search(v, dc, ip, queries + (job.first + e.queries[i]) * dim, h.k, ef,
                                                       h.r.data() + size_t{i} * h.k));
  }
  return h;
}

void Engine::Impl::merge(const Job& job, const PlanEntry& e, const pipeline_detail::Hits& h,
                         std::vector<Answer>& answers) const {
  const bool ip = job.index->inner_product();
  auto better = [ip](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    if (a.first != b.first) return ip ? a.first > b.first : a.first < b.first;
    return a.second < b.second;
  };
  for (size_t i = 0; i < e.queries.size(); ++i) {
    Answer& a = answers[job.first + e.queries[i]];
    a.insert(a.end(), h.r.begin() + i * h.k, h.r.begin() + i * h.k + h.found[i]);
    std::sort(a.begin(), a.end(), better);
    // One answer per id: a vector's boundary copies (compute/dhnsw/boundary.hpp) found in two
    // partitions have equal distances, so they are adjacent once sorted.
    a.erase(std::unique(a.begin(), a.end(), [](const auto& x, const auto& y) { return x.second == y.second; }),
            a.end());
    if (a.size() > h.k) a.resize(h.k);
  }
}

void Engine::Impl::search_in_place(Item& it, const float* queries, std::vector<Answer>& answers) {
  Job& job = *it.job;
  const Index& index = *job.index;
  const PlanEntry& e = job.plan.entries[it.entry];
  const uint32_t sub = e.sub;
  const SubDesc& st0 = index.subs.at(sub);
  const SubDesc& g = it.desc;  // the group's place does not move within an epoch
  auto alive = [&] {
    if (!c.alive(g.memnode))
      throw fabric::FabricError("searching " + sub_name(index, sub) + " in place failed: memnode " +
                                std::to_string(g.memnode) + " is gone");
  };
  // Seqlock over the mapped live descriptor, as fetch_group's over READs.
  constexpr int kAttempts = 200;
  for (int attempt = 1;; ++attempt) {
    const bool last = attempt >= kAttempts;
    const uint64_t v0 = __atomic_load_n(&it.live->version, __ATOMIC_ACQUIRE);
    SubDesc d;
    std::memcpy(&d, it.live, sizeof d);
    d.version = v0;
    if (d.id != sub || d.block_offset != st0.block_offset || d.overflow_used > st0.overflow_bytes)
      throw std::runtime_error("the live descriptor of " + sub_name(index, sub) +
                               " does not match the metadata block (was the index rebuilt?)");
    if ((v0 & 1) != 0 && !last) {  // a commit in flight
      ++job.st.in_place_retries;
      if (attempt > 8) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    const auto [off, len] = fetch_range(d);
    if (off < g.group_offset || len > g.group_bytes || off - g.group_offset > g.group_bytes - len)
      throw std::runtime_error(sub_name(index, sub) + ": live fetch range of " + std::to_string(len) +
                               " bytes is beyond its group");
    auto stable = [&] {
      std::atomic_thread_fence(std::memory_order_acquire);
      return __atomic_load_n(&it.live->version, __ATOMIC_RELAXED) == v0 && (v0 & 1) == 0;
    };
    if (auto v = mapped_view(it.group + (d.block_offset - g.group_offset), d, index.header, index.list_ranges)) {
      pipeline_detail::Hits h = search_view(*v, job, e, queries);
      if (stable()) {
        alive();
        merge(job, e, h, answers);
        ++job.st.in_place;
        job.st.in_place_bytes += len;  // loads from far memory, counted as the fetch they replace (shine's rule)
        return;
      }
      if (!last) {
        ++job.st.in_place_retries;
        continue;
      }
    }
    // Overflow records (or no stable version within the budget): a copy out of the mapping,
    // deserialized (sanitized when torn).
    std::vector<char> bytes(it.group + (off - g.group_offset), it.group + (off - g.group_offset) + len);
    const bool torn = !stable();
    if (torn && !last) {
      ++job.st.in_place_retries;
      continue;
    }
    const SubIndex s = deserialize_sub(bytes.data(), len, d, index.header, sub_name(index, sub), torn);
    alive();
    merge(job, e, search_view(view_of(s), job, e, queries), answers);
    ++job.st.in_place_copies;
    job.st.in_place_bytes += len;
    return;
  }
}

bool Engine::Impl::search(Item& it, const float* queries, std::vector<Answer>& answers) {
  auto t0 = Clock::now();
  Job& job = *it.job;
  const Index& index = *job.index;
  const PlanEntry& e = job.plan.entries[it.entry];
  const uint32_t dim = index.header.dim, nq = static_cast<uint32_t>(e.queries.size());
  // Over codes, a sub gives each query its best `rerank` candidates (approximate distances).
  const uint32_t k = coded() ? std::max(o.k, o.rerank) : o.k;
  if (it.group != nullptr) {
    search_in_place(it, queries, answers);
    job.st.search_s += seconds_since(t0);
    return --job.remaining == 0;
  }
  const SubIndex& s = *it.sub;
  if (s.index && s.index->ntotal > 0 && !s.coded) {
    merge(job, e, search_view(view_of(s), job, e, queries), answers);
  } else if (s.index && s.index->ntotal > 0) {  // over codes: Faiss's HNSW compares them through the quantizer
    std::vector<float> X(size_t{nq} * dim), D(size_t{nq} * k);
    std::vector<faiss::Index::idx_t> I(size_t{nq} * k);
    for (uint32_t i = 0; i < nq; ++i)
      std::memcpy(X.data() + size_t{i} * dim, queries + (job.first + e.queries[i]) * dim, sizeof(float) * dim);
    s.index->hnsw.efSearch = static_cast<int>(std::max(o.ef_search, k));
    omp_set_num_threads(nq >= kParallelQueries ? omp_threads : 1);
    if (s.live) {  // deleted vectors guide the search but are never returned
      faiss::SearchParametersHNSW sp;
      sp.efSearch = s.index->hnsw.efSearch;
      sp.sel = s.live.get();
      s.index->search(nq, X.data(), k, D.data(), I.data(), &sp);
    } else {
      s.index->search(nq, X.data(), k, D.data(), I.data());
    }
    const bool ip = index.inner_product();
    auto better = [ip](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
      if (a.first != b.first) return ip ? a.first > b.first : a.first < b.first;
      return a.second < b.second;
    };
    if (coded()) {
      for (uint32_t i = 0; i < nq; ++i) {
        std::vector<pipeline_detail::Candidate>& cs = job.cands[e.queries[i]];
        for (uint32_t j = 0; j < k; ++j) {
          faiss::Index::idx_t l = I[size_t{i} * k + j];
          if (l < 0 || static_cast<size_t>(l) >= s.labels.size() || label_deleted(s.labels[static_cast<size_t>(l)]))
            continue;
          pipeline_detail::Candidate c;
          c.dist = D[size_t{i} * k + j];
          c.id = s.labels[static_cast<size_t>(l)];
          const uint64_t local = static_cast<uint64_t>(l);
          if (local < s.vectors_internal) {
            c.memnode = s.memnode;
            c.offset = s.vectors_offset + local * dim * sizeof(float);
          } else {
            const float* v = s.overflow_vectors.data() + (local - s.vectors_internal) * dim;
            c.local.assign(v, v + dim);
          }
          cs.push_back(std::move(c));
        }
        std::sort(cs.begin(), cs.end(), [&](const auto& x, const auto& y) {
          return better({x.dist, x.id}, {y.dist, y.id});
        });
        // A vector's boundary copies in two searched partitions: equal codes, equal distances,
        // so adjacent once sorted; each is read and re-ranked once.
        cs.erase(std::unique(cs.begin(), cs.end(), [](const auto& x, const auto& y) { return x.id == y.id; }), cs.end());
        if (cs.size() > k) cs.resize(k);
      }
      job.st.search_s += seconds_since(t0);
      return --job.remaining == 0;
    }
  }
  job.st.search_s += seconds_since(t0);
  return --job.remaining == 0;
}

namespace {
constexpr size_t kRerankOpsPerDoorbell = kMaxRerank;  // under any send queue's depth (verbs: 1024)
}  // namespace

void Engine::Impl::rerank(Job& job, const float* queries, std::vector<Answer>& answers, fabric::Endpoint& ep) {
  auto t0 = Clock::now();
  const Index& index = *job.index;
  const uint32_t dim = index.header.dim;
  const bool ip = index.inner_product();
  const dmhnsw::DistanceComputer exact(ip ? Metric::IP : Metric::L2, dim);
  const uint64_t vb = uint64_t{4} * dim;
  // READs of up to a buffer's worth per doorbell (at least one query's candidates).
  const uint64_t per_query = vb * std::max(o.k, o.rerank);
  const uint64_t cap = std::max<uint64_t>(per_query, 8ull << 20);
  fabric::Buffer buf = ep.alloc(cap);
  auto better = [ip](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    if (a.first != b.first) return ip ? a.first > b.first : a.first < b.first;
    return a.second < b.second;
  };
  for (uint32_t q0 = 0; q0 < job.n;) {
    std::vector<fabric::Op> ops;
    // A vector several queries of the batch re-rank is read once.
    std::unordered_map<uint64_t, uint64_t> slot;  // RemotePtr raw -> its op
    uint64_t used = 0;
    uint32_t q1 = q0;
    for (; q1 < job.n; ++q1) {
      uint64_t need = 0;
      for (const auto& c : job.cands[q1]) need += c.local.empty() ? vb : 0;
      // A doorbell stays within a buffer and within a send queue (verbs: at most its depth).
      if (q1 > q0 && (used + need > cap || ops.size() + need / vb > kRerankOpsPerDoorbell)) break;
      for (auto& c : job.cands[q1]) {
        if (!c.local.empty()) continue;
        const RemotePtr at(c.memnode, c.offset);
        const auto [it, fresh] = slot.emplace(at.raw(), ops.size());
        c.op = it->second;
        if (!fresh) continue;
        ops.push_back(fabric::Op::read(at, buf.data() + used, vb, ops.size()));
        used += vb;
      }
    }
    if (!ops.empty()) {
      try {
        if (fabric::Status st = ep.post(ops); st != fabric::Status::Ok)
          throw fabric::FabricError(std::string("posting ") + std::to_string(ops.size()) + " READs failed: " +
                                    fabric::status_name(st));
        ep.wait_all(ops.size());
      } catch (const fabric::FabricError& e) {
        throw fabric::FabricError(std::string("re-ranking: reading the candidates' vectors: ") + e.what());
      }
      ++job.st.rerank_doorbells;
      job.st.rerank_reads += ops.size();
      job.st.rerank_bytes += used;
    }
    for (uint32_t q = q0; q < q1; ++q) {
      const float* x = queries + (job.first + q) * dim;
      Answer& a = answers[job.first + q];  // the insert buffer's matches, if any, are exact already
      for (const auto& c : job.cands[q]) {
        const float* v = c.local.empty() ? reinterpret_cast<const float*>(buf.data() + vb * c.op) : c.local.data();
        const float d = exact(x, v);
        a.emplace_back(ip ? 1.0f - d : d, c.id);
      }
      job.st.reranked += job.cands[q].size();
      std::sort(a.begin(), a.end(), better);
      a.erase(std::unique(a.begin(), a.end(), [](const auto& x, const auto& y) { return x.second == y.second; }),
              a.end());
      if (a.size() > o.k) a.resize(o.k);
      job.cands[q].clear();
    }
    q0 = q1;
  }
  job.st.rerank_s += seconds_since(t0);
}


}  // namespace dmhnsw::dhnsw
