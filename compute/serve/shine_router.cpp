#include "compute/serve/shine_router.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "compute/shine/sample.hpp"
#include "memory/relay_protocol.hpp"

namespace dmhnsw::serve {
namespace {

// Relay bodies between serving computenodes (memory/relay_protocol.hpp carries them; kinds
// distinct from `query`'s, so a stray message of a run is never taken for a request).
enum : uint32_t { kServeQuery = 0x5356'0001u, kServeAnswer = 0x5356'0002u, kServeLoad = 0x5356'0003u };
struct ServeQueryMsg {  // followed by dim floats
  uint32_t kind, dim;
  uint64_t req;  // the origin's request number
  uint32_t k, ef;
  uint32_t rerank, reserved;  // the request's rerank as the origin resolved it (0: full vectors)
};
static_assert(sizeof(ServeQueryMsg) == 32);
struct ServeAnswerMsg {  // followed by k int64 ids, then k float distances
  uint32_t kind, status;  // status 0: answered; else the target failed (the origin runs it itself)
  uint64_t req;
  uint32_t k, reserved;
};
static_assert(sizeof(ServeAnswerMsg) == 24);
struct ServeLoadMsg {
  uint32_t kind, reserved;
  uint64_t queue_len;  // the sender's working queue (adaptive routing's P_i)
};
static_assert(sizeof(ServeLoadMsg) == 16);

constexpr uint32_t kMaxRoutedK = 256;  // an answer of k ids and distances fits one relay message
constexpr uint64_t kGoneLoad = uint64_t{1} << 40;
constexpr size_t answer_bytes(uint32_t k) { return sizeof(ServeAnswerMsg) + 12ull * k; }

}  // namespace

LiveRouter::LiveRouter(const compute::RunContext& rc, const shine::Graph& g, fabric::Endpoint& control,
                       const shine::RoutingOptions& o, const LiveRouteOptions& live, Hooks h, Registry& m)
    : rc_(rc), dim_(g.params().dim), o_(o), live_(live), h_(std::move(h)), loads_(rc.num_cns, 0), gone_(rc.num_cns, 0),
      to_self_(m.counter("dmhnsw_routed_total", "queries routed, by where they ran", {{"to", "self"}})),
      to_peer_(m.counter("dmhnsw_routed_total", "queries routed, by where they ran", {{"to", "peer"}})),
      routed_in_(m.counter("dmhnsw_routed_in_total", "queries other serving computenodes routed here")),
      bounced_(m.counter("dmhnsw_route_fallbacks_total", "routed queries run here after all, by why",
                         {{"why", "bounce"}})),
      timed_out_(m.counter("dmhnsw_route_fallbacks_total", "routed queries run here after all, by why",
                           {{"why", "timeout"}})),
      failed_(m.counter("dmhnsw_route_fallbacks_total", "routed queries run here after all, by why",
                        {{"why", "failed"}})),
      peer_gone_(m.counter("dmhnsw_route_fallbacks_total", "routed queries run here after all, by why",
                           {{"why", "gone"}})) {
  const auto policy = router::parse_policy(o_.policy);
  const uint32_t K = rc.num_cns;
  const auto t0 = std::chrono::steady_clock::now();
  shine::LevelSample smp = shine::sample_level(g, control, 1000, 100000, o_.kmeans_seed);
  router::BalancedKMeansOptions ko;
  ko.seed = o_.kmeans_seed;
  ko.balance_oracle = o_.oracle == "balanced";
  const size_t n = smp.size(dim_);
  router::Clustering cl = router::balanced_kmeans(smp.vectors.data(), n, dim_, K, g.params().metric, ko);
  oracle_ = router::Oracle(cl.centroids, K, dim_, g.params().metric, cl.offsets);
  policy_ = std::make_unique<router::RoutingPolicy>(policy, K, rc.cn_id, o_.batch,
                                                    router::parse_quota_base(o_.quota), o_.threshold);
  spdlog::info("serve: routing {} over {} serving computenodes: level {} ({} sampled), partitions of sizes [{}]; "
               "{:.2f} s",
               o_.policy, K, smp.level, n, fmt::join(cl.sizes, ", "),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  compute::RelayClient::Callbacks cb;
  cb.deliver = [this](uint32_t from, const char* body, size_t len) { deliver(from, body, len); };
  cb.bounce = [this](uint32_t to, const char* body, size_t len) { bounce(to, body, len); };
  cb.gone = [this](uint32_t cn, const std::string&) { gone(cn); };
  relay_ = std::make_unique<compute::RelayClient>(*rc.cluster, rc.cn_id, K, cb);
  watcher_ = std::thread([this] { watch(); });
  router_ = std::thread([this] { router_loop(); });
}

LiveRouter::~LiveRouter() {
  {
    std::lock_guard g(rq_mu_);
    stop_router_ = true;
  }
  rq_cv_.notify_all();
  router_.join();  // routes what was queued
  {
    std::lock_guard g(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  watcher_.join();
  relay_.reset();  // leaves the relays: the others route around this computenode from now on
  // Queries still out: nobody will answer them now.
  std::map<uint64_t, Pending> left;
  {
    std::lock_guard g(pending_mu_);
    left.swap(pending_);
  }
  for (auto& [req, p] : left)
    p.q.done(std::make_exception_ptr(std::runtime_error("serve: shutting down before computenode " +
                                                        std::to_string(p.target) + " answered")));
}

void LiveRouter::route(std::vector<LiveQuery>& qs) {
  {
    std::lock_guard g(rq_mu_);
    if (rq_.empty()) first_at_ = std::chrono::steady_clock::now();
    for (LiveQuery& q : qs) rq_.push_back(std::move(q));
  }
  rq_cv_.notify_one();
}

void LiveRouter::router_loop() {
  std::vector<LiveQuery> batch;
  for (;;) {
    {
      std::unique_lock g(rq_mu_);
      rq_cv_.wait(g, [&] { return stop_router_ || !rq_.empty(); });
      if (rq_.empty()) return;  // stopping, nothing left
      uint32_t room;
      {
        std::lock_guard p(policy_mu_);
        room = o_.batch - in_batch_;
      }
      rq_cv_.wait_until(g, first_at_ + std::chrono::microseconds(live_.wait_us),
                        [&] { return stop_router_ || rq_.size() >= room; });
      const size_t n = std::min<size_t>(rq_.size(), room);
      batch.assign(std::make_move_iterator(rq_.begin()), std::make_move_iterator(rq_.begin() + static_cast<std::ptrdiff_t>(n)));
      rq_.erase(rq_.begin(), rq_.begin() + static_cast<std::ptrdiff_t>(n));
      if (!rq_.empty()) first_at_ = std::chrono::steady_clock::now();
    }
    dispatch(batch);
  }
}

void LiveRouter::dispatch(std::vector<LiveQuery>& qs) {
  const uint32_t K = rc_.num_cns, self = rc_.cn_id;
  std::vector<uint32_t> targets(qs.size(), self);
  {
    std::lock_guard g(policy_mu_);
    std::vector<uint32_t> ranks;
    std::vector<float> scores(K), regret;
    std::vector<const uint32_t*> ranked;
    for (size_t at = 0; at < qs.size();) {
      // A chunk never crosses a routing batch: the limits hold per batch of b queries.
      const size_t chunk = std::min<size_t>(qs.size() - at, o_.batch - in_batch_);
      ranks.resize(chunk * K);
      ranked.clear();
      regret.clear();
      for (size_t x = 0; x < chunk; ++x) {
        uint32_t* r = ranks.data() + x * K;
        oracle_.rank(qs[at + x].q, r, scores.data());
        std::stable_partition(r, r + K, [&](uint32_t cn) { return !gone_[cn]; });  // gone: last resort
        ranked.push_back(r);
        regret.push_back(scores[r[1]] - scores[r[0]]);
      }
      const std::vector<uint32_t> t = policy_->choose_batch(ranked, regret);
      std::copy(t.begin(), t.end(), targets.begin() + static_cast<std::ptrdiff_t>(at));
      at += chunk;
      in_batch_ += static_cast<uint32_t>(chunk);
      if (in_batch_ >= o_.batch) {
        std::vector<uint64_t> loads = loads_;
        loads[self] = h_.queue_len();
        for (uint32_t cn = 0; cn < K; ++cn)
          if (gone_[cn]) loads[cn] = kGoneLoad;  // a gone computenode gets no quota
        policy_->end_batch(loads);
        in_batch_ = 0;
      }
    }
    for (uint32_t& t : targets)
      if (t >= K || gone_[t]) t = self;
  }
  std::vector<char> msg;
  for (size_t x = 0; x < qs.size(); ++x) {
    LiveQuery& q = qs[x];
    const size_t bytes = sizeof(ServeQueryMsg) + 4ull * dim_;
    if (targets[x] == self || q.k > kMaxRoutedK || bytes > relay::kMaxBody ||
        answer_bytes(q.k) > relay::kMaxBody) {
      to_self_.add();
      h_.run_here(std::move(q));
      continue;
    }
    uint64_t req;
    {
      std::lock_guard g(pending_mu_);
      req = next_req_++;
      pending_.emplace(req, Pending{q, targets[x], std::chrono::steady_clock::now()});
    }
    msg.resize(bytes);
    const ServeQueryMsg m{kServeQuery, dim_, req, q.k, q.ef, q.rerank, 0};
    std::memcpy(msg.data(), &m, sizeof m);
    std::memcpy(msg.data() + sizeof m, q.q, 4ull * dim_);
    to_peer_.add();
    try {
      relay_->forward(targets[x], msg.data(), msg.size());
    } catch (const std::exception& e) {
      spdlog::warn("serve: routing a query to computenode {}: {}; answering it here", targets[x], e.what());
      take_back(req, "failed");
    }
  }
}

void LiveRouter::deliver(uint32_t from, const char* body, size_t len) {
  uint32_t kind = 0;
  if (len >= 4) std::memcpy(&kind, body, 4);
  if (kind == kServeQuery && len >= sizeof(ServeQueryMsg)) {
    ServeQueryMsg m;
    std::memcpy(&m, body, sizeof m);
    if (m.dim != dim_ || len != sizeof m + 4ull * dim_ || m.k == 0 || m.k > kMaxRoutedK || m.ef == 0) {
      spdlog::warn("serve: a malformed routed query from computenode {} ({} bytes) dropped", from, len);
      return;
    }
    // The query, its answer's buffers and the way back live until the answer is sent.
    struct Remote {
      std::vector<float> q;
      std::vector<int64_t> ids;
      std::vector<float> dist;
    };
    auto r = std::make_shared<Remote>();
    r->q.assign(reinterpret_cast<const float*>(body + sizeof m), reinterpret_cast<const float*>(body + len));
    r->ids.assign(m.k, -1);
    r->dist.assign(m.k, std::numeric_limits<float>::infinity());
    LiveQuery q{r->q.data(), m.k, m.ef, r->ids.data(), r->dist.data(), {}, m.rerank};
    q.done = [this, r, from, req = m.req, k = m.k](std::exception_ptr err) {
      std::vector<char> out(answer_bytes(k));
      const ServeAnswerMsg a{kServeAnswer, err ? 1u : 0u, req, k, 0};
      std::memcpy(out.data(), &a, sizeof a);
      std::memcpy(out.data() + sizeof a, r->ids.data(), 8ull * k);
      std::memcpy(out.data() + sizeof a + 8ull * k, r->dist.data(), 4ull * k);
      try {
        relay_->forward(from, out.data(), out.size());
      } catch (const std::exception& e) {
        spdlog::warn("serve: answering computenode {}'s routed query: {}", from, e.what());
      }
    };
    routed_in_.add();
    h_.run_here(std::move(q));
  } else if (kind == kServeAnswer && len >= sizeof(ServeAnswerMsg)) {
    ServeAnswerMsg a;
    std::memcpy(&a, body, sizeof a);
    if (len != answer_bytes(a.k)) return;
    Pending p;
    {
      std::lock_guard g(pending_mu_);
      auto it = pending_.find(a.req);
      if (it == pending_.end()) return;  // timed out and answered here already
      if (it->second.q.k != a.k || it->second.target != from) return;
      if (a.status != 0) {
        p = std::move(it->second);
        pending_.erase(it);
        failed_.add();
        h_.run_here(std::move(p.q));
        return;
      }
      p = std::move(it->second);
      pending_.erase(it);
    }
    std::memcpy(p.q.ids, body + sizeof a, 8ull * a.k);
    std::memcpy(p.q.dist, body + sizeof a + 8ull * a.k, 4ull * a.k);
    p.q.done(nullptr);
  } else if (kind == kServeLoad && len == sizeof(ServeLoadMsg) && from < rc_.num_cns) {
    ServeLoadMsg l;
    std::memcpy(&l, body, sizeof l);
    std::lock_guard g(policy_mu_);
    loads_[from] = l.queue_len;
  }
}

void LiveRouter::bounce(uint32_t, const char* body, size_t len) {
  ServeQueryMsg m;
  if (len < sizeof m) return;
  std::memcpy(&m, body, sizeof m);
  if (m.kind == kServeQuery) take_back(m.req, "bounce");  // answers and loads that bounce are dropped
}

void LiveRouter::gone(uint32_t cn) {
  if (cn >= rc_.num_cns) return;
  {
    std::lock_guard g(policy_mu_);
    gone_[cn] = 1;
  }
  std::vector<uint64_t> back;
  {
    std::lock_guard g(pending_mu_);
    for (const auto& [req, p] : pending_)
      if (p.target == cn) back.push_back(req);
  }
  spdlog::info("serve: computenode {} is gone: routing around it ({} of its queries answered here)", cn, back.size());
  for (uint64_t req : back) take_back(req, "gone");
}

void LiveRouter::take_back(uint64_t req, const char* why) {
  Pending p;
  {
    std::lock_guard g(pending_mu_);
    auto it = pending_.find(req);
    if (it == pending_.end()) return;
    p = std::move(it->second);
    pending_.erase(it);
  }
  const std::string w = why;
  (w == "bounce" ? bounced_ : w == "timeout" ? timed_out_ : w == "gone" ? peer_gone_ : failed_).add();
  h_.run_here(std::move(p.q));
}

void LiveRouter::watch() {
  uint64_t last_load = ~uint64_t{0};
  auto last_sent = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::unique_lock g(stop_mu_);
      if (stop_cv_.wait_for(g, std::chrono::milliseconds(5), [&] { return stop_; })) return;
    }
    const auto now = std::chrono::steady_clock::now();
    std::vector<uint64_t> late;
    {
      std::lock_guard g(pending_mu_);
      for (const auto& [req, p] : pending_)
        if (now - p.sent > std::chrono::milliseconds(live_.timeout_ms)) late.push_back(req);
    }
    for (uint64_t req : late) {
      spdlog::warn("serve: a query routed to a computenode got no answer in {} ms: answering it here",
                   live_.timeout_ms);
      take_back(req, "timeout");
    }
    // Adaptive routing weighs the others' queues: tell them ours when it changed (and now and
    // then anyway, so a lost message is made good).
    const uint64_t load = h_.queue_len();
    if (load != last_load || now - last_sent > std::chrono::milliseconds(200)) {
      const ServeLoadMsg l{kServeLoad, 0, load};
      try {
        relay_->broadcast(&l, sizeof l);
        last_load = load;
        last_sent = now;
      } catch (const std::exception& e) {
        spdlog::debug("serve: broadcasting the queue length: {}", e.what());
      }
    }
  }
}

}  // namespace dmhnsw::serve
