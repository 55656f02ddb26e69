// One phase of a shine query run (query_session.hpp): with routing between computenodes, this
// computenode's share of the stream goes through the router thread, which keeps some queries
// and sends others to the computenode whose cache fits them; the workers answer whatever lands
// in the working queue until every peer's routed queries arrived. Without, the workers draw
// the share themselves.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/fabric/replicas.hpp"
#include "compute/shine/query_session.hpp"

namespace dmhnsw::shine::query_detail {

namespace {
/// Adaptive routing: a router waiting for its own queue to drain re-broadcasts its length this often.
constexpr std::chrono::milliseconds kProgressEvery{2};
constexpr std::chrono::seconds kNoteEvery{10};  // a progress line while a phase runs
// After a replica copy died, an idle computenode asks its peers for what it still lacks this often;
// a peer that answers none of it for kOwedLostAfter is an error.
constexpr std::chrono::milliseconds kSyncEvery{300};
constexpr std::chrono::seconds kOwedLostAfter{30};
}  // namespace

PhaseResult QuerySession::run_phase(uint32_t phase, const std::vector<uint32_t>& items, uint32_t ef,
                                    double min_seconds, bool is_measured, std::vector<PerQuery>& out) {
  PhaseRun run;
  run.phase = phase;
  run.items = &items;
  run.ef = ef;
  run.min_seconds = min_seconds;
  run.is_measured = is_measured;
  run.need_done = policy_ != router::Policy::None && K_ > 1;
  run.result.routed_to.assign(K_, 0);
  run.t0 = Clock::now();
  run.failovers_at_start = fabric::replica_failovers(c_);
  run.deadline = run.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(min_seconds));
  run.next_note.store((run.t0 + kNoteEvery).time_since_epoch().count());
  // A router thread only when there is something to route: else the workers draw the share
  // themselves (draw), with no working queue between them: a lone computenode's router took
  // two locks per query and woke a third thread on two cores (futex wakes: ~1,700 per 10,000
  // queries on bigann10k).
  std::thread router_thread;
  if (run.need_done)
    router_thread = std::thread([&] {
      try {
        route(run);
      } catch (...) {
        run.router_error = std::current_exception();
        run.stop.store(true);
      }
      run.router_done.store(true);
    });
  else
    run.router_done.store(true);
  try {
    answer(run, out);
  } catch (...) {
    run.stop.store(true);
    if (router_thread.joinable()) router_thread.join();
    throw;
  }
  if (router_thread.joinable()) router_thread.join();
  if (run.router_error) std::rethrow_exception(run.router_error);
  if (!run.need_done) run.result.input = run.input.load();
  PhaseResult pr = std::move(run.result);
  pr.seconds = seconds_since(run.t0);
  pr.received = ex_.received(phase);
  pr.bounced = ex_.bounced(phase);
  pr.syncs = run.syncs.load();
  return pr;
}

bool QuerySession::draw(PhaseRun& run, uint32_t& pos) {
  const std::vector<uint32_t>& items = *run.items;
  if (items.empty() || run.stop.load()) return false;
  const uint64_t i = run.drawn.fetch_add(1, std::memory_order_relaxed);
  if (i >= items.size() && (run.min_seconds <= 0 || Clock::now() >= run.deadline)) return false;
  pos = items[i % items.size()];
  run.input.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// A line every kNoteEvery while queries are answered: on a slow or lossy link a run that
// goes on is told from one that is stuck (which prints nothing).
void QuerySession::note_progress(PhaseRun& run) {
  if (int64_t due = run.next_note.load();
      Clock::now().time_since_epoch().count() >= due &&
      run.next_note.compare_exchange_strong(due, (Clock::now() + kNoteEvery).time_since_epoch().count())) {
    const double secs = seconds_since(run.t0);
    const uint64_t n = run.answered.load();
    spdlog::info("query phase {}: {} answered here in {:.0f} s ({:.1f} per s), {} queued", run.phase, n, secs,
                 static_cast<double>(n) / secs, ex_.queue_len(run.phase));
  }
}

void QuerySession::route(PhaseRun& run) {
  const std::vector<uint32_t>& items = *run.items;
  PhaseResult& pr = run.result;
  const RoutingOptions& ro = o_.search.routing;
  router::RoutingPolicy rp(policy_, K_, self_, ro.batch, router::parse_quota_base(ro.quota), ro.threshold);
  // Balanced/adaptive route a batch of b queries at once (RoutingPolicy::choose_batch: the
  // queries nearest a partition boundary are the ones moved when a computenode's limit is
  // reached); the others one query at a time.
  const size_t gather =
      run.need_done && (policy_ == router::Policy::Balanced || policy_ == router::Policy::Adaptive) ? ro.batch : 1;
  std::vector<uint32_t> batch_pos;
  RouteScratch scratch;
  scratch.ranks.resize(gather * K_);
  scratch.scores.resize(K_);
  std::vector<char> msg(sizeof(QueryMsg) + 4ull * p_.dim);
  uint64_t batch_no = 0;
  // Flow control: the router runs at most this far ahead of the workers. Routing needs a queue to
  // compare (the threshold t); a lone computenode only keeps its coroutines fed, so that a
  // --repeat-seconds window ends on time when queries are slow (a TCG guest answers ~50 per s).
  const uint64_t ahead =
      run.need_done ? 2ull * ro.threshold + 64 : 4ull * o_.search.threads * o_.search.coroutines + 16;
  for (size_t i = 0; !run.stop.load();) {
    batch_pos.clear();
    while (batch_pos.size() < gather && !run.stop.load()) {
      if (items.empty() || (i >= items.size() && (run.min_seconds <= 0 || Clock::now() >= run.deadline))) break;
      // Flow control: do not run far ahead of the workers; once ahead, wait until they took half.
      if (ex_.queue_len(run.phase) > ahead)
        while (!run.stop.load() && !ex_.wait_shorter(run.phase, ahead / 2, std::chrono::milliseconds(5))) {
        }
      batch_pos.push_back(items[i % items.size()]);
      ++i;
    }
    if (batch_pos.empty()) break;
    pr.input += batch_pos.size();
    std::vector<uint32_t> targets =
        run.need_done ? choose_targets(batch_pos, rp, scratch) : std::vector<uint32_t>(batch_pos.size(), self_);
    for (size_t x = 0; x < batch_pos.size(); ++x) {
      const uint32_t pos = batch_pos[x], target = targets[x];
      if (target == self_) {
        ex_.push(run.phase, Item{pos, false, {}});
      } else {
        send_query(target, run.phase, pos, ex_.log_sent(run.phase, target, pos), msg);
        ++pr.routed_away;
        ++pr.routed_to[target];
      }
    }
    if (run.need_done && rp.batch_full()) share_queue_length(run, rp, batch_no);
  }
  if (run.need_done)
    for (uint32_t cn = 0; cn < K_; ++cn) {
      if (cn == self_ || ex_.gone(cn)) continue;
      DoneMsg dm{kDoneMsg, run.phase, pr.routed_to[cn]};
      ex_.note_done_sent(run.phase, cn, dm.sent);
      relay_->forward(cn, &dm, sizeof dm);
    }
}

void QuerySession::send_query(uint32_t to, uint32_t phase, uint32_t pos, uint32_t seq, std::vector<char>& msg) {
  QueryMsg m{kQueryMsg, phase, pos, seq, self_, p_.dim};
  std::memcpy(msg.data(), &m, sizeof m);
  std::memcpy(msg.data() + sizeof m, wl_.queries.row(pos), 4ull * p_.dim);
  relay_->forward(to, msg.data(), msg.size());
}

void QuerySession::resend(uint32_t to, uint32_t phase, uint32_t next, const std::vector<uint32_t>& missing) {
  if (!relay_ptr_.load()) return;
  try {
    std::vector<char> msg(sizeof(QueryMsg) + 4ull * p_.dim);
    const auto again = ex_.to_resend(phase, to, next, missing);
    for (const auto& [seq, pos] : again) send_query(to, phase, pos, seq, msg);
    const auto done = ex_.done_sent(phase, to);
    if (done) {
      DoneMsg dm{kDoneMsg, phase, *done};
      relay_->forward(to, &dm, sizeof dm);
    }
    spdlog::info("computenode {} lacked routed queries of phase {}: sent {} again{}", to, phase, again.size(),
                 done ? " and the done count" : "");
  } catch (const std::exception& e) {
    spdlog::debug("answering computenode {}'s sync: {}", to, e.what());
  }
}

void QuerySession::ask_owed(PhaseRun& run) {
  const int64_t now = Clock::now().time_since_epoch().count();
  int64_t due = run.next_sync.load();
  if (now < due || !run.next_sync.compare_exchange_strong(
                       due, now + std::chrono::duration_cast<Clock::duration>(kSyncEvery).count()))
    return;
  if (due == 0) return;  // the first call only starts the clock: messages in flight get kSyncEvery to land
  for (const Exchange::Owed& o : ex_.owed(run.phase, self_)) {
    std::vector<char> msg(sizeof(SyncMsg) + 4ull * o.missing.size());
    SyncMsg m{kSyncMsg, run.phase, o.next, static_cast<uint32_t>(o.missing.size())};
    std::memcpy(msg.data(), &m, sizeof m);
    if (!o.missing.empty()) std::memcpy(msg.data() + sizeof m, o.missing.data(), 4ull * o.missing.size());
    relay_->forward(o.from, msg.data(), msg.size());
    run.syncs.fetch_add(1);
  }
}

// The oracle ranks the computenodes for each query (a gone one last); the policy picks.
std::vector<uint32_t> QuerySession::choose_targets(const std::vector<uint32_t>& batch, router::RoutingPolicy& rp,
                                                   RouteScratch& sc) {
  sc.ranked.clear();
  sc.regret.clear();
  for (size_t x = 0; x < batch.size(); ++x) {
    const float* q = wl_.queries.row(batch[x]);
    uint32_t* r = sc.ranks.data() + x * K_;
    oracle_.rank(q, r, sc.scores.data());
    std::stable_partition(r, r + K_, [&](uint32_t cn) { return !ex_.gone(cn); });  // gone: last resort
    sc.ranked.push_back(r);
    sc.regret.push_back(sc.scores[r[1]] - sc.scores[r[0]]);  // routing between computenodes: K >= 2
  }
  std::vector<uint32_t> targets = rp.choose_batch(sc.ranked, sc.regret);
  for (uint32_t& t : targets)
    if (ex_.gone(t)) t = self_;
  return targets;
}

// After each routing batch: tell the others this queue's length, and set the next limits
// from theirs.
void QuerySession::share_queue_length(PhaseRun& run, router::RoutingPolicy& rp, uint64_t& batch_no) {
  uint64_t mine = ex_.queue_len(run.phase);
  ProgressMsg pm{kProgressMsg, run.phase, batch_no++, mine};
  relay_->broadcast(&pm, sizeof pm);
  if (policy_ == router::Policy::Adaptive) {
    // The paper's computenodes broadcast their queue length periodically: while this router
    // waits for its queue to drain, the others keep sending to it, so they hear how long it
    // is every kProgressEvery instead of only after its next batch (a slow computenode would
    // otherwise look as short as it last was).
    auto next = Clock::now() + kProgressEvery;
    while (!run.stop.load() && !ex_.wait_shorter(run.phase, o_.search.routing.threshold, kProgressEvery)) {
      if (Clock::now() >= next) {
        pm.queue_len = ex_.queue_len(run.phase);
        relay_->broadcast(&pm, sizeof pm);
        next = Clock::now() + kProgressEvery;
      }
    }
  }
  std::vector<uint64_t> prog = ex_.progress();
  prog[self_] = mine;
  for (uint32_t cn = 0; cn < K_; ++cn)  // a gone computenode gets no quota
    if (ex_.gone(cn)) prog[cn] = uint64_t{1} << 40;
  rp.end_batch(prog);
  spdlog::debug("routing batch {}: queue lengths [{}], next limits [{}]", batch_no - 1, fmt::join(prog, ", "),
                fmt::join(rp.limits(), ", "));
}

// T threads x C coroutines answer the working queue; each query's recall against the
// workload's ground truth.
void QuerySession::answer(PhaseRun& run, std::vector<PerQuery>& out) {
  std::mutex mu;
  parallel(c_, o_.search.threads, run.stop, [&](uint32_t t, fabric::Endpoint& ep) {
    compute::Scheduler s(ep);
    Worker w(*g_, s, p_.seed + t);
    std::vector<PerQuery> local;
    local.reserve(run.items->size() / o_.search.threads + 1);
    std::vector<OpContext> ctxs(o_.search.coroutines);
    for (auto& x : ctxs) {
      x.mode = o_.mode;
      set_search_reads(x, ncache_.get(), cache_lists_, in_place_);
      x.codes = codes_ ? &*codes_ : nullptr;
      x.rerank = o_.search.rerank;
      x.trace = traces_[t].get();
      x.measured = run.is_measured;
    }
    auto next_debug = Clock::now() + std::chrono::seconds(2);
    auto idle_since = Clock::now();
    uint64_t idle_answered = 0;
    auto loop = [&](OpContext& ctx) -> compute::Task<void> {
      Item it;
      for (;;) {
        if (run.stop.load()) co_return;
        if (!run.need_done) {
          if (!draw(run, it.pos)) co_return;
        } else if (!ex_.pop(run.phase, it)) {
          if (ex_.finished(run.phase, self_, run.need_done, run.router_done.load())) co_return;
          // Waiting on peers' messages performs no remote operation, so nothing else here
          // would notice a memnode the heartbeat found dead (a partition): the graph spans
          // every memnode, so this run cannot go on without it.
          for (uint16_t m = 0; m < c_.memnodes().size(); ++m)
            if (!c_.alive(m))
              throw fabric::FabricError("memnode " + std::to_string(m) + " (" + c_.memnodes()[m].address +
                                        ") is gone while waiting for routed queries: " + c_.dead_reason(m));
          // A copy of a replica set died during the phase: the relay in that memnode process
          // may have held queries or done counts for us. Ask the peers for what is missing;
          // one that answers none of it for long is an error, not a wait for ever.
          if (const uint64_t f = fabric::replica_failovers(c_); f != run.failovers_at_start) {
            const uint64_t answered = run.answered.load();
            if (answered != idle_answered) idle_answered = answered, idle_since = Clock::now();
            ask_owed(run);
            if (Clock::now() - idle_since > kOwedLostAfter)
              throw fabric::FabricError(
                  "waiting for routed queries: a memnode copy died during the phase (" +
                  std::to_string(f - run.failovers_at_start) + " copy death(s)) and nothing arrived for " +
                  std::to_string(kOwedLostAfter.count()) + " s although " + std::to_string(run.syncs.load()) +
                  " syncs asked the peers for it: " + ex_.describe(run.phase));
          } else {
            idle_since = Clock::now();
          }
          note_progress(run);  // also while idle: waiting on a slow peer is not being stuck
          if (Clock::now() > next_debug) {
            spdlog::debug("waiting: router {}, {}", run.router_done.load() ? "done" : "busy", ex_.describe(run.phase));
            next_debug = Clock::now() + std::chrono::seconds(2);
          }
          co_await s.yield();
          continue;
        }
        const float* qv = it.vec.empty() ? wl_.queries.row(it.pos) : it.vec.data();
        ctx.io = compute::IoStats{};
        ctx.search = SearchStats{};
        auto q0 = Clock::now();
        std::vector<Neighbor> res = co_await w.search(qv, o_.k, run.ef, ctx, o_.search.upper_ef);
        float lat = static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - q0).count());
        if (run.need_done) ex_.served(run.phase);
        run.answered.fetch_add(1);
        note_progress(run);
        const int32_t* gt = wl_.groundtruth.row(it.pos);
        uint32_t hits = 0;
        for (const auto& r : res)
          for (uint32_t j = 0; j < o_.k; ++j)
            if (gt[j] >= 0 && static_cast<uint64_t>(gt[j]) == r.label) {
              ++hits;
              break;
            }
        local.push_back({lat, static_cast<float>(hits) / static_cast<float>(o_.k), ctx.io, ctx.search});
      }
    };
    for (auto& ctx : ctxs) s.spawn(loop(ctx));
    s.run();
    if (traces_[t]) traces_[t]->flush();
    std::lock_guard gd(mu);
    out.insert(out.end(), local.begin(), local.end());
  });
}

}  // namespace dmhnsw::shine::query_detail
