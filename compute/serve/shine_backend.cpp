// shine behind the service: worker threads, each with its own endpoint, scheduler and
// Worker, run up to `coroutines` searches or inserts at a time from one shared queue; searches
// go through the node cache (cooling table) when --cache gives it room. With --routing and
// several serving computenodes, a search's queries first go through the LiveRouter
// (shine_router.hpp) to the computenode whose cache fits each of them.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "cache/node_cache.hpp"
#include "common/timing.hpp"
#include "common/region.hpp"
#include "compute/coro.hpp"
#include "compute/pinning.hpp"
#include "compute/serve/backend.hpp"
#include "compute/shine/codes_log.hpp"
#include "compute/serve/shine_router.hpp"
#include "compute/shine/graph.hpp"
#include "compute/shine/sample.hpp"

namespace dmhnsw::serve {
namespace {

/// A search (a LiveQuery, from this computenode's callers or routed here), an insert, an
/// upsert or a delete.
struct Job {
  enum class Kind : uint8_t { Search, Insert, Upsert, Delete };
  LiveQuery op;
  Kind kind = Kind::Search;
  uint64_t label = 0;         // the id of an insert, upsert or delete
  uint8_t* outcome = nullptr;  // upsert: 1 when it replaced a vector; delete: 1 when the id was there
};

/// The jobs of one request: done() of each counts down; wait() rethrows the first failure.
class RequestLatch {
 public:
  explicit RequestLatch(size_t n) : left_(n) {}
  std::function<void(std::exception_ptr)> callback() {
    return [this](std::exception_ptr err) {
      std::lock_guard g(mu_);
      if (err && !error_) error_ = err;
      if (--left_ == 0) cv_.notify_all();
    };
  }
  void wait() {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return left_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t left_;
  std::exception_ptr error_;
};

class ShineBackend final : public Backend {
 public:
  ShineBackend(const compute::RunContext& rc, const ShineServeOptions& o, BackendMetrics& m, Registry& r)
      : rc_(rc), o_(o), m_(m), control_(rc.cluster->make_endpoint(8u << 20)),
        p_(shine::format_or_attach(*rc.cluster, *control_, nullptr)), g_(*rc.cluster, p_) {
    const shine::SearchOptions& so = o_.search;
    const uint64_t cache_bytes = so.cache_capacity(so.cache_ratio > 0 ? shine::index_bytes(g_, *control_) : 0);
    if (cache_bytes > 0) {
      cache::NodeCacheConfig cc;
      cache_lists_ = so.cache_lists();  // --cache-holds, by --rerank
      cc.dim = shine::cache_entry_floats(g_.layout(), cache_lists_);
      cc.capacity_bytes = cache_bytes;
      cc.admit_probability = so.admit_probability;
      cc.seed = p_.seed * 1000;
      ncache_ = std::make_unique<cache::NodeCache>(cc);
      spdlog::info("serve: node cache of {} {} ({} MiB), level-0 admission p={}", ncache_->capacity_entries(),
                   cache_lists_ ? "neighbour lists" : "vectors", cache_bytes >> 20, so.admit_probability);
    }
    in_place_ = so.reads_in_place(*control_);
    // The codes, loaded at start and refreshed between rounds (refresh_codes) whenever the index
    // has them, so that a request's rerank can use them; searches traverse on them only when the
    // request or --rerank asks (by default full vectors throughout, as `query` without --rerank).
    if (p_.codes || so.rerank > 0) {  // LocalCodes::load names --rerank when there are none
      codes_.emplace(shine::LocalCodes::load(*control_, p_));
      m_.codes_nodes.set(static_cast<double>(codes_->size()));
      m_.codes_bytes.set(static_cast<double>(codes_->bytes()));
      if (so.rerank > 0)
        spdlog::info("serve: codes {} of {} nodes ({} MiB); searches traverse on them and re-read the best {} (a "
                     "request's rerank overrides)",
                     p_.codes->spec().to_string(), codes_->size(), codes_->bytes() >> 20, so.rerank);
      else
        spdlog::info("serve: codes {} of {} nodes ({} MiB) loaded for requests that ask for a rerank; searches "
                     "without one read full vectors (--rerank sets a default)",
                     p_.codes->spec().to_string(), codes_->size(), codes_->bytes() >> 20);
    }
    // The router first: if it cannot start (a peer's partitioning refused, a dead memnode), the
    // constructor throws before any worker thread exists to be left joinable.
    if (so.routing.policy != "none" && rc.num_cns > 1) {
      LiveRouter::Hooks h;
      h.run_here = [this](LiveQuery q) { enqueue(Job{std::move(q)}); };
      h.queue_len = [this] {
        std::lock_guard g(mu_);
        return static_cast<uint64_t>(queue_.size());
      };
      std::lock_guard g(control_mu_);
      router_ = std::make_unique<LiveRouter>(rc, g_, *control_, so.routing, o_.live, std::move(h), r);
    }
    workers_ = so.threads;
    for (uint32_t t = 0; t < so.threads; ++t) threads_.emplace_back([this, t] { work(t); });
  }
  ~ShineBackend() override {
    router_.reset();  // first: answers routed here go out while the workers still run
    {
      std::lock_guard g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  IndexInfo info() override {
    IndexInfo i;
    i.mode = "shine";
    i.metric = std::string(to_string(p_.metric));
    i.provider = rc_.provider;
    i.dim = p_.dim;
    i.memnodes = static_cast<uint32_t>(rc_.cluster->memnodes().size());
    i.computenode = rc_.cn_id;
    std::lock_guard g(control_mu_);
    uint64_t nodes = 0;
    control_->read(RemotePtr(0, mode_word_offset(shine_word::kNodeCount)), &nodes, 8);
    uint64_t deleted = 0, reused = 0;  // deleted ever, and records of those reused
    control_->read(RemotePtr(0, mode_word_offset(shine_word::kDeleted)), &deleted, 8);
    control_->read(RemotePtr(0, mode_word_offset(shine_word::kReused)), &reused, 8);
    i.deleted = deleted - std::min(deleted, reused);
    i.count = nodes - std::min(nodes, i.deleted);
    i.ids = p_.ids.buckets > 0;
    i.codes = p_.codes ? p_.codes->spec().to_string() : "none";
    i.rerank = o_.search.rerank;
    m_.vectors.set(static_cast<double>(i.count));
    return i;
  }

  void search(const float* queries, size_t n, uint32_t k, uint32_t ef, uint32_t, uint32_t rerank, int64_t* ids,
              float* distances) override {
    if (rerank != 0 && !codes_)
      throw BadRequest("rerank: " + std::to_string(rerank) + ": this shine index has no codes to traverse on (build or "
                       "import it with --codes sq8 or pq:M); send 0");
    RequestLatch latch(n);
    std::vector<LiveQuery> qs(n);
    for (size_t i = 0; i < n; ++i)
      qs[i] = LiveQuery{queries + i * p_.dim, k, ef == 0 ? o_.ef_search : std::max(ef, k), ids + i * k,
                        distances + i * k, latch.callback(), rerank == 0 ? o_.search.rerank : rerank};
    if (router_) {
      router_->route(qs);
    } else {
      for (LiveQuery& q : qs) enqueue(Job{std::move(q)});
    }
    latch.wait();
  }

  uint64_t insert(const float* x, const int64_t* ids, size_t n, bool upsert) override {
    if (p_.ids.buckets == 0) {
      if (upsert) throw BadRequest("upsert: this shine index has no id index (build it with --id-capacity N or --ids FILE)");
      // No id index: new ids must lie above every id the index holds (the ceiling builds,
      // imports and earlier inserts raised); claiming the range is one COMPARE_SWAP.
      const auto [lo, hi] = std::minmax_element(ids, ids + n);
      uint64_t ceiling = 0;
      bool claimed;
      {
        std::lock_guard g(control_mu_);
        claimed = shine::claim_ids(*control_, static_cast<uint64_t>(*lo), static_cast<uint64_t>(*hi) + 1, ceiling);
      }
      if (!claimed)
        throw BadRequest("ids: id " + std::to_string(*lo) + " is below " + std::to_string(ceiling) +
                         ", one past the largest id this shine index may hold: it has no id index, so new ids must be "
                         "at least " + std::to_string(ceiling) + " (build it with --id-capacity N for any ids)");
    } else if (!upsert) {
      refuse_present(ids, n);
    }
    std::vector<uint8_t> replaced(n, 0);
    run_jobs(n, upsert ? Job::Kind::Upsert : Job::Kind::Insert, x, ids, replaced.data());
    return static_cast<uint64_t>(std::count(replaced.begin(), replaced.end(), uint8_t{1}));
  }

  void remove(const int64_t* ids, size_t n, uint8_t* found) override {
    if (p_.ids.buckets == 0)
      throw BadRequest("ids: this shine index has no id index to delete by (build it with --id-capacity N or --ids FILE)");
    run_jobs(n, Job::Kind::Delete, nullptr, ids, found);
  }

 private:
  /// One job per id; returns when every one is done (rethrows the first failure).
  void run_jobs(size_t n, Job::Kind kind, const float* x, const int64_t* ids, uint8_t* outcome) {
    RequestLatch latch(n);
    for (size_t i = 0; i < n; ++i)
      enqueue(Job{LiveQuery{x == nullptr ? nullptr : x + i * p_.dim, 0, 0, nullptr, nullptr, latch.callback()}, kind,
                  static_cast<uint64_t>(ids[i]), outcome + i});
    latch.wait();
  }

  /// Nothing half applied: an insert whose ids the index already holds is refused before any is
  /// inserted (lookups take no lock, so they overlap; an id inserted meanwhile by another caller
  /// is still refused by its own insert).
  void refuse_present(const int64_t* ids, size_t n) {
    std::vector<RemotePtr> at(n);
    {
      std::lock_guard g(control_mu_);
      compute::Scheduler s(*control_);
      IdIndex x(p_.ids, offsetof(shine::NodeFront, label), s, p_.seed);
      auto find = [&](size_t i) -> compute::Task<void> { at[i] = co_await x.find(static_cast<uint64_t>(ids[i])); };
      constexpr size_t kInFlight = 64;
      for (size_t i = 0; i < n; i += kInFlight) {
        for (size_t j = i; j < std::min(n, i + kInFlight); ++j) s.spawn(find(j));
        s.run();
      }
    }
    for (size_t i = 0; i < n; ++i)
      if (!at[i].is_null())
        throw BadRequest("ids: id " + std::to_string(ids[i]) + " (element " + std::to_string(i) +
                         ") is already in the index; insert with upsert to replace its vector");
  }

  /// Hands a job to the workers; after shutdown began it fails at once (nobody would run it).
  void enqueue(Job j) {
    {
      std::lock_guard g(mu_);
      if (!stop_) {
        queue_.push_back(std::move(j));
        cv_.notify_one();
        return;
      }
    }
    j.op.done(std::make_exception_ptr(std::runtime_error("serve: shutting down")));
  }

  void work(uint32_t t) {
    compute::pin_worker(t, workers_);
    while (!stopping()) {
      try {
        rounds(t);
      } catch (const std::exception& e) {
        spdlog::error("serve: worker {}: {}; starting over with a new endpoint", t, e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  }

  bool stopping() {
    std::lock_guard g(mu_);
    return stop_ && queue_.empty();
  }

  /// Takes up to `coroutines` queued queries at a time and answers them; returns when the
  /// backend stops, throws when this thread's endpoint failed (after failing its round).
  void rounds(uint32_t t) {
    auto ep = rc_.cluster->make_endpoint(32u << 20);
    compute::Scheduler s(*ep);
    shine::Worker w(g_, s, p_.seed * 1000003 + rc_.cn_id * 1009 + t);
    std::vector<shine::OpContext> ctxs(o_.search.coroutines);
    for (;;) {
      std::vector<Job> jobs;
      {
        std::unique_lock g(mu_);
        cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        while (!queue_.empty() && jobs.size() < o_.search.coroutines) {
          jobs.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      refresh_codes(*ep);
      std::shared_lock codes_held(codes_mu_);  // no refresh while this round reads the codes
      std::vector<char> finished(jobs.size(), 0);
      std::vector<compute::IoStats> before(jobs.size());
      std::vector<shine::SearchStats> searched(jobs.size());
      for (size_t j = 0; j < jobs.size(); ++j) {
        before[j] = ctxs[j].io;
        searched[j] = ctxs[j].search;
        // Inserts read through no node cache; they search and link in place where the regions are
        // mapped, as the build does.
        const bool search = jobs[j].kind == Job::Kind::Search;
        shine::set_search_reads(ctxs[j], search ? ncache_.get() : nullptr, cache_lists_, in_place_);
        ctxs[j].codes = jobs[j].kind == Job::Kind::Search && codes_ ? &*codes_ : nullptr;
        ctxs[j].rerank = jobs[j].op.rerank;
        if (ctxs[j].rerank == 0) ctxs[j].codes = nullptr;  // full vectors throughout
        s.spawn(one(w, jobs[j], ctxs[j], finished[j]));
      }
      try {
        s.run();
      } catch (...) {
        for (size_t j = 0; j < jobs.size(); ++j)
          if (!finished[j]) jobs[j].op.done(std::current_exception());
        throw;
      }
      count(ctxs, before, searched, jobs.size());
    }
  }

  /// The codes of nodes other computenodes inserted since the last refresh, at most every
  /// kCodesRefresh (one READ per memnode when nothing is new); a round that started before waits.
  void refresh_codes(fabric::Endpoint& ep) {
    if (!codes_) return;
    const int64_t now = Clock::now().time_since_epoch().count();
    if (now - codes_refreshed_.load() < std::chrono::duration_cast<Clock::duration>(kCodesRefresh).count()) return;
    std::unique_lock g(codes_mu_);
    if (now - codes_refreshed_.load() < std::chrono::duration_cast<Clock::duration>(kCodesRefresh).count()) return;
    codes_refreshed_.store(now);
    if (const uint64_t got = codes_->refresh(ep, p_); got > 0) spdlog::debug("serve: {} new codes read", got);
    m_.codes_nodes.set(static_cast<double>(codes_->size()));
    m_.codes_bytes.set(static_cast<double>(codes_->bytes()));
  }

  /// Adds the round's remote operations and node-cache counts to the metrics.
  void count(const std::vector<shine::OpContext>& ctxs, const std::vector<compute::IoStats>& before,
             const std::vector<shine::SearchStats>& searched, size_t n) {
    for (size_t j = 0; j < n; ++j) {
      m_.coded.add(ctxs[j].search.coded - searched[j].coded);
      m_.reranked.add(ctxs[j].search.reranked - searched[j].reranked);
      const compute::IoStats& a = ctxs[j].io;
      const compute::IoStats& b = before[j];
      m_.reads.add(a.reads - b.reads);
      m_.writes.add(a.writes - b.writes);
      m_.atomics.add(a.atomics - b.atomics);
      m_.doorbells.add(a.doorbells - b.doorbells);
      m_.bytes.add(a.bytes - b.bytes);
    }
    if (ncache_) {
      const cache::NodeCacheStats now = ncache_->stats();
      std::lock_guard g(cache_mu_);
      if (now.lookups > cache_seen_.lookups) m_.cache_lookups.add(now.lookups - cache_seen_.lookups);
      if (now.hits > cache_seen_.hits) m_.cache_hits.add(now.hits - cache_seen_.hits);
      cache_seen_.lookups = std::max(now.lookups, cache_seen_.lookups);
      cache_seen_.hits = std::max(now.hits, cache_seen_.hits);
    }
  }

  compute::Task<void> one(shine::Worker& w, const Job& j, shine::OpContext& ctx, char& finished) {
    std::exception_ptr err;
    const LiveQuery& q = j.op;
    try {
      if (j.kind == Job::Kind::Insert || j.kind == Job::Kind::Upsert) {
        const bool was = co_await w.insert(q.q, j.label, ctx, j.kind == Job::Kind::Upsert);
        *j.outcome = was ? 1 : 0;
        m_.inserted.add();
        if (was) m_.replaced.add();
      } else if (j.kind == Job::Kind::Delete) {
        const bool was = co_await w.remove(j.label, ctx);
        *j.outcome = was ? 1 : 0;
        if (was) m_.deleted.add();
      } else {
        std::vector<shine::Neighbor> res = co_await w.search(q.q, q.k, q.ef, ctx, o_.search.upper_ef);
        for (uint32_t i = 0; i < q.k; ++i) {
          q.ids[i] = i < res.size() ? static_cast<int64_t>(res[i].label) : -1;
          q.dist[i] = i < res.size() ? res[i].dist : std::numeric_limits<float>::infinity();
        }
        m_.queries.add();
      }
    } catch (const std::invalid_argument& e) {  // an id the index holds (inserted since the request's check)
      err = std::make_exception_ptr(BadRequest(std::string("ids: ") + e.what()));
    } catch (...) {
      err = std::current_exception();
    }
    finished = 1;
    q.done(err);
  }

  compute::RunContext rc_;
  ShineServeOptions o_;
  BackendMetrics& m_;
  std::unique_ptr<cache::NodeCache> ncache_;
  bool cache_lists_ = false;  // ncache_ holds neighbour lists, else vectors
  bool in_place_ = false;     // searches and inserts read lists and vectors where the endpoint maps them
  std::optional<shine::LocalCodes> codes_;
  static constexpr std::chrono::milliseconds kCodesRefresh{100};
  std::shared_mutex codes_mu_;             // rounds read the codes shared, a refresh writes them
  std::atomic<int64_t> codes_refreshed_{0};  // Clock ticks of the last refresh
  std::mutex cache_mu_;
  cache::NodeCacheStats cache_seen_;
  std::unique_ptr<fabric::Endpoint> control_;
  std::mutex control_mu_;
  shine::GraphParams p_;
  shine::Graph g_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  uint32_t workers_ = 0;
  std::unique_ptr<LiveRouter> router_;
};

}  // namespace

std::unique_ptr<Backend> make_shine_backend(const compute::RunContext& rc, const ShineServeOptions& o,
                                            BackendMetrics& m, Registry& r) {
  return std::make_unique<ShineBackend>(rc, o, m, r);
}

}  // namespace dmhnsw::serve
