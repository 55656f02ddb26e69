// The d-HNSW query engine (paper section 4.4): a run closes batches as queries arrive and
// takes each through the stages of pipeline_stages.hpp, in sequence or as a three-thread
// pipeline (fetch, deserialize, search) so that READs overlap deserializing and searching.
#include "compute/dhnsw/pipeline_stages.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "compute/dhnsw/channel.hpp"

namespace dmhnsw::dhnsw {

Engine::Engine(fabric::Cluster& c, const Index& index, EngineOptions o) : o_(o) {
  if (o_.batch == 0) throw std::invalid_argument("--batch must be at least 1");
  if (o_.probe == 0) throw std::invalid_argument("--probe must be at least 1");
  if (o_.k == 0) throw std::invalid_argument("--k must be at least 1");
  if (o_.max_read_bytes < 4096) o_.max_read_bytes = 4096;
  if (o_.doorbell_subs == 0) o_.doorbell_subs = 1;
  if (!index.meta) throw std::invalid_argument("dhnsw engine: the index has no meta-HNSW");
  if (o_.rerank > 0 && !index.codes)
    throw std::invalid_argument("--rerank " + std::to_string(o_.rerank) +
                                ": the index has no codes (build it with --codes sq8 or pq:M)");
  if (o_.rerank > kMaxRerank)
    throw std::invalid_argument("--rerank " + std::to_string(o_.rerank) + " is above " + std::to_string(kMaxRerank));
  const uint32_t P = index.header.num_subs;
  // --cache-ratio is a share of the index's memory: over codes a sub-HNSW is held without its
  // vectors, so the same memory keeps more of them.
  double per_sub = 1.0;
  if (o_.rerank > 0) {
    double whole = 0, coded = 0;
    for (const SubDesc& d : index.subs) {
      whole += static_cast<double>(d.block_bytes);
      coded += static_cast<double>(d.block_bytes - d.arrays[kVectors].capacity);
    }
    if (coded > 0) per_sub = whole / coded;
  }
  size_t cap = o_.cache_subs >= 0
                   ? static_cast<size_t>(o_.cache_subs)
                   : std::min<size_t>(P, static_cast<size_t>(std::llround(o_.cache_ratio * per_sub * static_cast<double>(P))));
  if (!o_.regroup) cap = 0;
  impl_ = std::make_unique<Impl>(c, index, o_, cap);
}

Engine::~Engine() = default;

uint64_t Engine::cache_capacity() const { return impl_->cache.capacity(); }

void Engine::set_ef_search(uint32_t ef) {
  o_.ef_search = ef;
  impl_->o.ef_search = ef;
}

/// The batches of one run: when each closes, and what the caller gets back.
struct Engine::Impl::Run {
  const float* queries;
  size_t n;
  std::vector<Answer>& answers;
  Impl& im;
  uint32_t G;  // sub-HNSW fetches per doorbell
  std::unique_ptr<fabric::Endpoint> ep;
  std::unique_ptr<fabric::Endpoint> rerank_ep;  // the search stage's, over codes only
  Clock::time_point t_start;
  RunStats rs;
  std::atomic<uint64_t> finished{0};  // batches finished (search stage)

  /// Batches close when B queries arrived or max_wait_us after their first one did.
  Clock::time_point arrival(size_t i) const {
    return im.o.arrival_qps > 0
               ? t_start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(static_cast<double>(i) / im.o.arrival_qps))
               : t_start;
  }
  uint32_t next_batch(size_t first) const {
    size_t last = std::min(n, first + im.o.batch);
    if (im.o.arrival_qps > 0) {
      auto deadline = arrival(first) + std::chrono::microseconds(im.o.max_wait_us);
      auto full = arrival(last - 1);
      auto close_at = std::min(deadline, full);
      std::this_thread::sleep_until(close_at);
      while (last > first + 1 && arrival(last - 1) > close_at) --last;
    }
    return static_cast<uint32_t>(last - first);
  }
  void finish(Job& job) {
    if (im.coded()) im.rerank(job, queries, answers, *rerank_ep);
    // Loads go most-demanded first, so plain LRU order would keep a batch's least-demanded
    // sub-HNSWs: touch them least-demanded first, leaving the most-demanded most recent.
    if (im.o.regroup)
      for (auto e = job.plan.entries.rbegin(); e != job.plan.entries.rend(); ++e) im.cache.get(e->sub);
    BatchStats st = job.st;
    st.bytes += st.in_place_bytes;
    st.seconds = seconds_since(job.closed);
    rs.batches.push_back(st);
    rs.meta_s += st.meta_s;
    rs.fetch_s += st.fetch_s;
    rs.deserialize_s += st.deserialize_s;
    rs.search_s += st.search_s;
    rs.rerank_s += st.rerank_s;
    finished.fetch_add(1, std::memory_order_release);  // its reads of the regions are over
  }
  /// The batch's entries to fetch, G per doorbell.
  std::vector<std::vector<uint32_t>> uncached_groups(const Job& job) const {
    std::vector<std::vector<uint32_t>> groups;
    for (uint32_t e = 0; e < job.plan.entries.size(); ++e) {
      if (job.plan.entries[e].cached) continue;
      if (groups.empty() || groups.back().size() >= G) groups.emplace_back();
      groups.back().push_back(e);
    }
    return groups;
  }
};

RunStats Engine::Impl::run(const float* queries, size_t n, std::vector<Answer>& answers) {
  answers.assign(n, {});
  const uint32_t G = o.doorbell ? o.doorbell_subs : 1;
  // One endpoint, used by the fetch stage only; every buffer goes back to it before it dies.
  // Twice what the buffers need now: a rebuild may make sub-HNSWs larger during the run.
  Run r{queries, n, answers, *this, G,
        c.make_endpoint(std::max<size_t>(2 * buf_bytes * (G + o.queue_depth + 3), 16u << 20)), nullptr, Clock::now(), {}};
  if (coded()) r.rerank_ep = c.make_endpoint(32u << 20);
  r.rs.cache_capacity = cache.capacity();
  const uint64_t evictions0 = cache.evictions();
  if (o.pipeline)
    run_pipelined(r);
  else
    run_in_sequence(r);
  r.rs.seconds = seconds_since(r.t_start);
  r.rs.cache_evictions = cache.evictions() - evictions0;
  return std::move(r.rs);
}

void Engine::Impl::run_in_sequence(Run& r) {
  for (size_t first = 0; first < r.n;) {
    uint32_t bn = r.next_batch(first);
    auto job = open_batch(r.queries, first, bn, *r.ep, r.answers);
    if (job->epoch_moved) epochs.ack(*r.ep);  // every batch before it is done
    for (uint32_t e = 0; e < job->plan.entries.size(); ++e)
      if (job->plan.entries[e].cached) {
        Item it{job, e, {}, 0, job->hits.at(job->plan.entries[e].sub)};
        if (search(it, r.queries, r.answers)) r.finish(*job);
      }
    for (auto& g : r.uncached_groups(*job)) {
      std::vector<Item> got = fetch_group(job, g, *r.ep);
      for (auto& it : got) {
        deserialize(it);
        it.buf.reset();
      }
      for (auto& it : got)
        if (search(it, r.queries, r.answers)) r.finish(*job);
    }
    if (job->plan.entries.empty()) r.finish(*job);
    first += bn;
  }
}

void Engine::Impl::run_pipelined(Run& r) {
  Channel<Item> to_deser(o.queue_depth), to_search(o.queue_depth);
  std::mutex ret_mu;
  std::vector<fabric::Buffer> returned;  // buffers done with, freed by the fetch stage
  std::mutex err_mu;
  std::exception_ptr error;
  std::atomic<bool> abort{false};
  auto fail = [&](std::exception_ptr e) {
    {
      std::lock_guard g(err_mu);
      if (!error) error = e;
    }
    abort.store(true);
    to_deser.close();  // wakes every stage; queued items are dropped after the joins
    to_search.close();
  };
  std::thread fetcher([&] {
    try {
      uint64_t opened = 0;
      for (size_t first = 0; first < r.n && !abort.load();) {
        uint32_t bn = r.next_batch(first);
        auto job = open_batch(r.queries, first, bn, *r.ep, r.answers);
        if (job->epoch_moved) {  // acknowledged once the batches before it no longer read the old area
          while (r.finished.load(std::memory_order_acquire) < opened && !abort.load())
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          epochs.ack(*r.ep);
        }
        ++opened;
        if (job->plan.entries.empty()) {  // nothing to search: done at once
          Item it{job, 0, {}, 0, nullptr};
          job->remaining = 1;
          to_search.push(std::move(it));
        }
        for (uint32_t e = 0; e < job->plan.entries.size(); ++e)
          if (job->plan.entries[e].cached)
            if (!to_search.push(Item{job, e, {}, 0, job->hits.at(job->plan.entries[e].sub)})) return;
        for (auto& g : r.uncached_groups(*job)) {
          {
            std::vector<fabric::Buffer> drop;
            std::lock_guard l(ret_mu);
            drop.swap(returned);
          }
          bool ok = true;
          for (Item& it : fetch_group(job, g, *r.ep)) ok = ok && to_deser.push(std::move(it));
          if (!ok || abort.load()) return;
        }
        first += bn;
      }
      to_deser.close();
    } catch (...) {
      fail(std::current_exception());
    }
  });
  std::thread deser([&] {
    while (auto it = to_deser.pop()) {
      std::exception_ptr err;
      if (!abort.load()) {
        try {
          deserialize(*it);
        } catch (...) {
          err = std::current_exception();
        }
      }
      {
        std::lock_guard l(ret_mu);  // the buffer always goes back to the fetch stage's pool
        returned.push_back(std::move(it->buf));
      }
      if (err) fail(err);
      if (abort.load() || !to_search.push(std::move(*it))) break;
    }
    to_search.close();
  });
  try {
    while (auto it = to_search.pop()) {
      if (abort.load()) break;
      if (!it->sub && it->group == nullptr) {  // an empty batch
        if (--it->job->remaining == 0) r.finish(*it->job);
        continue;
      }
      if (search(*it, r.queries, r.answers)) r.finish(*it->job);
    }
  } catch (...) {
    fail(std::current_exception());
  }
  fetcher.join();
  deser.join();
  to_deser.clear();
  to_search.clear();
  returned.clear();
  if (error) std::rethrow_exception(error);
}

RunStats Engine::run(const float* queries, size_t n, std::vector<Answer>& answers) {
  return impl_->run(queries, n, answers);
}

}  // namespace dmhnsw::dhnsw
