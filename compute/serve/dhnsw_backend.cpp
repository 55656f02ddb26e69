// d-HNSW behind the service: requests from many gRPC threads are gathered into batches (paper
// section 4.3: a batch fetches each sub-HNSW it needs once), closed at --batch queries or
// --max-wait-us after the first query arrived, and run through the engine's pipeline by one
// batcher thread. Requests with another efSearch wait for the next batch. Inserts go through one
// Inserter (paper section 4.2, in place; into the insert buffer while a rebuild runs), one
// request at a time, beside the searches.
#include <spdlog/spdlog.h>

#include <chrono>
#include <limits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/control.hpp"
#include "compute/dhnsw/insert.hpp"
#include "compute/serve/backend.hpp"

namespace dmhnsw::serve {
namespace {

using Clock = std::chrono::steady_clock;

struct Request {
  const float* q;
  size_t n;
  uint32_t k, ef;
  int64_t* ids;
  float* dist;
  std::promise<void> done;
  Clock::time_point arrived;
};

class DhnswBackend final : public Backend {
 public:
  DhnswBackend(const compute::RunContext& rc, const dhnsw::EngineOptions& eo, BackendMetrics& m)
      : rc_(rc), m_(m), control_(rc.cluster->make_endpoint(16u << 20)),
        index_(dhnsw::load_index(*rc.cluster, *control_)), info_index_(dhnsw::load_index(*rc.cluster, *control_)),
        eo_(eo) {
    eo_.ack_slot = rc.cn_id;
    engine_ = std::make_unique<dhnsw::Engine>(*rc.cluster, index_, eo_);
    spdlog::info("serve: d-HNSW index of {} sub-HNSWs, {} vectors, dim {}; batches of up to {} queries, {} us wait, "
                 "probe {}", index_.header.num_subs, index_.header.num_vectors, index_.header.dim, eo_.batch,
                 eo_.max_wait_us, eo_.probe);
    batcher_ = std::thread([this] { run(); });
  }
  ~DhnswBackend() override {
    {
      std::lock_guard g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    batcher_.join();
    inserter_.reset();
    insert_ep_.reset();
    std::lock_guard g(control_mu_);
    try {
      dhnsw::leave_epochs(*control_, rc_.cn_id);  // a rebuild need not wait for this computenode
    } catch (const std::exception& e) {
      spdlog::warn("serve: leaving the epochs: {}", e.what());
    }
  }

  /// The live index: its epoch from the control block, its vectors from the live descriptors
  /// (in-place inserts change those, not the metadata block).
  IndexInfo info() override {
    std::lock_guard g(control_mu_);
    const dhnsw::Control ctl = dhnsw::read_control(*control_);
    if (ctl.epoch != info_index_.header.epoch) info_index_ = dhnsw::load_index(*rc_.cluster, *control_);
    const dhnsw::Index& ix = info_index_;
    IndexInfo i;
    i.mode = "dhnsw";
    i.metric = ix.inner_product() ? "ip" : "l2";
    i.provider = rc_.provider;
    i.dim = ix.header.dim;
    i.memnodes = static_cast<uint32_t>(rc_.cluster->memnodes().size());
    i.computenode = rc_.cn_id;
    i.epoch = ctl.epoch;
    i.partitions = ix.header.num_subs;
    i.ids = ix.header.id_buckets > 0;
    i.codes = ix.codes ? ix.codes->spec().to_string() : "none";
    i.rerank = eo_.rerank;
    for (uint32_t s = 0; s < ix.header.num_subs; ++s) {
      dhnsw::SubDesc d;
      control_->read(RemotePtr(ix.subs[s].memnode, dhnsw::live_desc_offset(ix.header, s)), &d, sizeof d);
      i.count += d.count - std::min(d.count, d.deleted);  // live vectors
      i.deleted += d.deleted;
    }
    m_.epoch.set(static_cast<double>(i.epoch));
    m_.vectors.set(static_cast<double>(i.count));
    return i;
  }

  void remove(const int64_t* ids, size_t n, uint8_t* found) override {
    std::lock_guard g(insert_mu_);
    std::vector<int64_t> missing;
    with_inserter([&](dhnsw::Inserter& ins) { missing = ins.remove(ids, n); });
    const std::unordered_set<int64_t> gone(missing.begin(), missing.end());
    for (size_t i = 0; i < n; ++i) found[i] = gone.count(ids[i]) ? 0 : 1;
  }

  uint64_t insert(const float* x, const int64_t* ids, size_t n, bool upsert) override {
    std::lock_guard g(insert_mu_);
    const uint64_t before = inserter_ ? inserter_->stats().replaced : 0;
    with_inserter([&](dhnsw::Inserter& ins) { ins.insert(x, ids, n, upsert); });
    return inserter_->stats().replaced - before;
  }

  /// Runs `f` on the one inserter (made on first use), its refusals as BadRequest, and counts
  /// what it did into the metrics.
  template <class F>
  void with_inserter(F f) {
    if (!inserter_) {
      insert_ep_ = rc_.cluster->make_endpoint(64u << 20);
      inserter_ = std::make_unique<dhnsw::Inserter>(*rc_.cluster, *insert_ep_, rc_.cn_id);
    }
    const dhnsw::InsertStats before = inserter_->stats();
    try {
      f(*inserter_);
    } catch (const std::invalid_argument& e) {
      throw BadRequest(std::string("ids: ") + e.what());
    } catch (const fabric::FabricError&) {
      inserter_.reset();  // its endpoint may be broken: the next request starts over
      insert_ep_.reset();
      throw;
    }
    count(before);
  }

  /// What the inserter did since `before`, into the metrics.
  void count(const dhnsw::InsertStats& before) {
    const dhnsw::InsertStats& a = inserter_->stats();
    m_.inserted.add(a.inserted - before.inserted);
    m_.deleted.add(a.deleted - before.deleted);
    m_.replaced.add(a.replaced - before.replaced);
    m_.writes.add(a.writes - before.writes);
    m_.doorbells.add(a.doorbells - before.doorbells);
    m_.bytes.add(a.bytes_written - before.bytes_written + a.bytes_fetched - before.bytes_fetched);
  }

  void search(const float* queries, size_t n, uint32_t k, uint32_t ef, uint32_t probe, uint32_t rerank, int64_t* ids,
              float* distances) override {
    // A request's rerank, in this one place: the engine searches a batch of requests with one
    // --rerank, so a request may only ask for that (as with probe); searches over codes per
    // request are not served for dhnsw yet.
    if (rerank != 0 && rerank != eo_.rerank)
      throw BadRequest("rerank: " + std::to_string(rerank) + ": " +
                       (eo_.rerank == 0 ? std::string("this dhnsw server searches full vectors (--rerank 0)")
                                        : "this dhnsw server re-ranks every search's best " +
                                              std::to_string(eo_.rerank) + " (--rerank)") +
                       "; a dhnsw request takes no rerank of its own (0: the server's)");
    if (k > eo_.k) throw BadRequest("k " + std::to_string(k) + ": this server answers at most --k " + std::to_string(eo_.k));
    if (probe != 0 && probe != eo_.probe)
      throw BadRequest("probe " + std::to_string(probe) + ": this server searches --probe " + std::to_string(eo_.probe) +
                       " partitions per query (0: that)");
    Request r{queries, n, k, ef == 0 ? eo_.ef_search : ef, ids, distances, {}, Clock::now()};
    auto f = r.done.get_future();
    {
      std::lock_guard g(mu_);
      queue_.push_back(&r);
    }
    cv_.notify_all();
    f.get();
  }

 private:
  void run() {
    for (;;) {
      std::vector<Request*> batch;
      {
        std::unique_lock g(mu_);
        cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        // Close the batch at eo_.batch queries or max_wait_us after its first query arrived.
        const auto close_at = queue_.front()->arrived + std::chrono::microseconds(eo_.max_wait_us);
        cv_.wait_until(g, close_at, [&] { return stop_ || queued(queue_.front()->ef) >= eo_.batch; });
        const uint32_t ef = queue_.front()->ef;
        size_t total = 0;
        for (auto it = queue_.begin(); it != queue_.end();) {
          if ((*it)->ef == ef && (batch.empty() || total + (*it)->n <= eo_.batch)) {
            total += (*it)->n;
            batch.push_back(*it);
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
      }
      answer(batch);
    }
  }

  void count(const dhnsw::RunStats& rs) {
    for (const dhnsw::BatchStats& b : rs.batches) {
      m_.queries.add(b.queries);
      m_.batch_queries.observe(b.queries);
      m_.reads.add(b.reads + b.version_reads);
      m_.doorbells.add(b.doorbells + b.version_doorbells);
      m_.bytes.add(b.bytes);
      m_.cache_lookups.add(b.needed);
      m_.cache_hits.add(b.cache_hits);
      m_.epoch.set(static_cast<double>(b.epoch));
    }
  }

  size_t queued(uint32_t ef) const {
    size_t n = 0;
    for (const Request* r : queue_)
      if (r->ef == ef) n += r->n;
    return n;
  }

  void answer(std::vector<Request*>& batch) {
    size_t total = 0;
    for (const Request* r : batch) total += r->n;
    const uint32_t dim = index_.header.dim;
    std::vector<float> x(total * dim);
    size_t at = 0;
    for (const Request* r : batch) {
      std::memcpy(x.data() + at * dim, r->q, r->n * dim * sizeof(float));
      at += r->n;
    }
    try {
      engine_->set_ef_search(batch.front()->ef);
      std::vector<dhnsw::Answer> answers;
      const dhnsw::RunStats rs = engine_->run(x.data(), total, answers);
      count(rs);
      at = 0;
      for (Request* r : batch) {
        for (size_t i = 0; i < r->n; ++i, ++at) {
          const dhnsw::Answer& a = answers[at];
          for (uint32_t j = 0; j < r->k; ++j) {
            r->ids[i * r->k + j] = j < a.size() ? a[j].second : -1;
            r->dist[i * r->k + j] = j < a.size() ? a[j].first : std::numeric_limits<float>::infinity();
          }
        }
        r->done.set_value();
      }
    } catch (...) {
      for (Request* r : batch) r->done.set_exception(std::current_exception());
    }
  }

  compute::RunContext rc_;
  BackendMetrics& m_;
  std::mutex control_mu_;
  std::unique_ptr<fabric::Endpoint> control_;
  const dhnsw::Index index_;  // the engine's (it follows new epochs itself)
  dhnsw::Index info_index_;   // info()'s, reloaded on a new epoch
  std::mutex insert_mu_;
  std::unique_ptr<fabric::Endpoint> insert_ep_;
  std::unique_ptr<dhnsw::Inserter> inserter_;
  dhnsw::EngineOptions eo_;
  std::unique_ptr<dhnsw::Engine> engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request*> queue_;
  bool stop_ = false;
  std::thread batcher_;
};

}  // namespace

std::unique_ptr<Backend> make_dhnsw_backend(const compute::RunContext& rc, const dhnsw::EngineOptions& engine,
                                            BackendMetrics& m) {
  return std::make_unique<DhnswBackend>(rc, engine, m);
}

}  // namespace dmhnsw::serve
