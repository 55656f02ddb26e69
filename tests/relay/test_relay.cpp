// The memnode's query relay (memory/relay.hpp): joins, forwarding, bounces, the barrier and
// liveness, driven with a recording Send callback and explicit time points (no clock, no
// threads, no sleeps).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "memory/relay.hpp"

using dmhnsw::memory::Relay;
using dmhnsw::relay::Header;
using dmhnsw::relay::kAll;
using dmhnsw::relay::ReleaseBody;
using dmhnsw::relay::Type;
namespace relay = dmhnsw::relay;
using namespace std::chrono_literals;

namespace {

constexpr uint16_t kMemnode = 7;

/// One message the relay sent.
struct Out {
  uint64_t to = 0;
  Header h{};
  std::string body;
  Type type() const { return static_cast<Type>(h.type); }
};

/// The endpoint handle of computenode `cn` in its `life`-th process (a re-started computenode
/// has a new endpoint).
uint64_t ep(uint32_t cn, uint32_t life = 0) { return 1000u * (life + 1) + cn; }

struct Rig {
  std::vector<Out> sent;
  Relay r;
  const Relay::Clock::time_point t0 = Relay::Clock::time_point{} + 1h;

  explicit Rig(std::chrono::milliseconds timeout = 1000ms)
      : r(kMemnode, 0,
          [this](uint64_t to, const std::vector<char>& bytes) {
            auto h = relay::decode(bytes);
            REQUIRE(h);  // the relay sends only well-formed relay messages
            sent.push_back({to, *h, std::string(relay::body_of(bytes), h->body_len)});
          },
          timeout) {}

  Relay::Clock::time_point at(std::chrono::milliseconds ms) const { return t0 + ms; }

  bool msg(uint64_t from_ep, Type t, uint32_t from_cn, uint32_t to_cn, uint32_t k, uint64_t seq,
           const std::string& body = {}, std::chrono::milliseconds when = 0ms) {
    return r.on_message(relay::encode(t, from_cn, to_cn, k, seq, body.data(), body.size()), from_ep, at(when));
  }
  /// Joins computenode `cn` of a run of `k` from `endpoint`; the ack is checked and consumed.
  void join(uint32_t cn, uint32_t k, uint64_t endpoint, std::chrono::milliseconds when = 0ms) {
    REQUIRE(msg(endpoint, Type::Join, cn, cn, k, 0, {}, when));
    auto out = take();
    REQUIRE(out.size() == 1);
    CHECK(out[0].to == endpoint);
    CHECK(out[0].type() == Type::JoinAck);
    CHECK(out[0].h.from_cn == cn);
    REQUIRE(r.alive(cn));
  }
  void join(uint32_t cn, uint32_t k) { join(cn, k, ep(cn)); }
  void barrier(uint32_t cn, uint32_t k, uint64_t seq, uint64_t endpoint, std::chrono::milliseconds when = 0ms) {
    REQUIRE(msg(endpoint, Type::Barrier, cn, 0, k, seq, {}, when));
  }
  void barrier(uint32_t cn, uint32_t k, uint64_t seq, std::chrono::milliseconds when = 0ms) {
    barrier(cn, k, seq, ep(cn), when);
  }
  void heartbeat(uint32_t cn, uint32_t k, std::chrono::milliseconds when, uint64_t endpoint) {
    REQUIRE(msg(endpoint, Type::Heartbeat, cn, 0, k, 0, {}, when));
  }
  void heartbeat(uint32_t cn, uint32_t k, std::chrono::milliseconds when) { heartbeat(cn, k, when, ep(cn)); }

  std::vector<Out> take() {
    std::vector<Out> out;
    out.swap(sent);
    return out;
  }
};

std::set<uint64_t> recipients(const std::vector<Out>& out) {
  std::set<uint64_t> s;
  for (const auto& o : out) s.insert(o.to);
  return s;
}

ReleaseBody release_of(const Out& o) {
  REQUIRE(o.type() == Type::Release);
  REQUIRE(o.body.size() == sizeof(ReleaseBody));
  ReleaseBody b;
  std::memcpy(&b, o.body.data(), sizeof b);
  return b;
}

std::vector<uint32_t> gone_of(const ReleaseBody& b) {
  REQUIRE(b.gone_count <= relay::kMaxCns);
  std::vector<uint32_t> g(b.gone, b.gone + b.gone_count);
  std::sort(g.begin(), g.end());
  return g;
}

/// Checks that `out` is exactly one Release of barrier `seq` per endpoint in `to`, all with
/// the same generation and gone list; returns the generation.
uint64_t check_release(const std::vector<Out>& out, const std::set<uint64_t>& to, uint64_t seq,
                       const std::vector<uint32_t>& gone = {}) {
  REQUIRE(out.size() == to.size());
  CHECK(recipients(out) == to);
  const uint64_t gen = release_of(out.front()).generation;
  for (const auto& o : out) {
    CHECK(o.type() == Type::Release);
    CHECK(o.h.seq == seq);
    CHECK(o.h.memnode == kMemnode);
    ReleaseBody b = release_of(o);
    CHECK(b.generation == gen);
    CHECK(gone_of(b) == gone);
  }
  return gen;
}

}  // namespace

TEST_CASE("relay: a join is acked to the joining endpoint", "[relay]") {
  Rig g;
  REQUIRE_FALSE(g.r.alive(1));
  REQUIRE(g.msg(ep(1), Type::Join, 1, 1, 3, 0));
  auto out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == ep(1));
  CHECK(out[0].type() == Type::JoinAck);
  CHECK(out[0].h.from_cn == 1);
  CHECK(out[0].h.to_cn == 1);
  CHECK(out[0].h.num_cns == 3);
  CHECK(out[0].h.memnode == kMemnode);
  CHECK(out[0].body.empty());
  CHECK(g.r.alive(1));
  CHECK_FALSE(g.r.alive(0));

  SECTION("malformed joins are not acked") {
    CHECK(g.msg(ep(3), Type::Join, 3, 3, 3, 0));      // id not below num_cns
    CHECK(g.msg(ep(4), Type::Join, 0, 0, 0, 0));      // no computenodes
    CHECK(g.msg(ep(5), Type::Join, 2, 2, 65, 0));     // more than kMaxCns
    CHECK(g.msg(ep(6), Type::Join, 70, 70, 80, 0));   // id beyond kMaxCns
    CHECK(g.take().empty());
    CHECK_FALSE(g.r.alive(3));
    CHECK_FALSE(g.r.alive(2));
    CHECK_FALSE(g.r.alive(70));
  }
  SECTION("a payload that is not a relay message is not the relay's") {
    std::vector<char> hello{'h', 'e', 'l', 'l', 'o'};
    CHECK_FALSE(g.r.on_message(hello, ep(1), g.t0));
    auto bad_len = relay::encode(Type::Forward, 1, 0, 3, 0, "abc", 3);
    bad_len.pop_back();  // body_len no longer matches
    CHECK_FALSE(g.r.on_message(bad_len, ep(1), g.t0));
    CHECK(g.take().empty());
  }
}

TEST_CASE("relay: a forward to a member is delivered as Deliver with from_cn kept", "[relay]") {
  Rig g;
  for (uint32_t cn = 0; cn < 3; ++cn) g.join(cn, 3);
  const std::string body = std::string("query\0bytes", 11) + std::string(300, 'x');
  REQUIRE(g.msg(ep(0), Type::Forward, 0, 2, 3, 0, body));
  auto out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == ep(2));
  CHECK(out[0].type() == Type::Deliver);
  CHECK(out[0].h.from_cn == 0);
  CHECK(out[0].h.to_cn == 2);
  CHECK(out[0].h.num_cns == 3);
  CHECK(out[0].h.memnode == kMemnode);
  CHECK(out[0].body == body);

  REQUIRE(g.msg(ep(2), Type::Forward, 2, 0, 3, 0, "back"));
  out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == ep(0));
  CHECK(out[0].type() == Type::Deliver);
  CHECK(out[0].h.from_cn == 2);
  CHECK(out[0].body == "back");
  CHECK(g.r.stats().forwarded == 2);
  CHECK(g.r.stats().bounced == 0);
}

TEST_CASE("relay: a forward to kAll reaches every other live member of the sender's run only", "[relay]") {
  Rig g;
  for (uint32_t cn = 0; cn < 4; ++cn) g.join(cn, 4);
  g.join(5, 6);  // a member of another run (ids beyond this run's num_cns)
  REQUIRE(g.msg(ep(3), Type::Leave, 3, kAll, 4, 0));  // gone
  g.take();     // the Gone notes
  REQUIRE(g.msg(ep(1), Type::Forward, 1, kAll, 4, 0, "progress"));
  auto out = g.take();
  CHECK(recipients(out) == std::set<uint64_t>{ep(0), ep(2)});  // not itself, not gone, not another run
  REQUIRE(out.size() == 2);
  for (const auto& o : out) {
    CHECK(o.type() == Type::Deliver);
    CHECK(o.h.from_cn == 1);
    CHECK(o.h.to_cn == kAll);
    CHECK(o.body == "progress");
  }
  CHECK(g.r.stats().forwarded == 2);
  CHECK(g.r.stats().bounced == 0);
}

TEST_CASE("relay: a forward to an unknown or gone computenode bounces to the sender with the original body",
          "[relay]") {
  Rig g;
  g.join(0, 3);
  g.join(1, 3);
  const std::string body = std::string(1, '\0') + "routed query" + std::string(64, '\x7f');
  uint32_t target = 0;
  SECTION("never joined") { target = 2; }
  SECTION("beyond kMaxCns") { target = 1000; }
  SECTION("silent for longer than the timeout") {
    target = 1;
    g.heartbeat(0, 3, 900ms);
    g.r.tick(g.at(1200ms));
    REQUIRE_FALSE(g.r.alive(1));
    REQUIRE(g.r.alive(0));
  }
  SECTION("left") {
    target = 1;
    REQUIRE(g.msg(ep(1), Type::Leave, 1, kAll, 3, 0));
    REQUIRE_FALSE(g.r.alive(1));
  }
  g.take();
  REQUIRE(g.msg(ep(0), Type::Forward, 0, target, 3, 0, body, 1300ms));
  auto out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == ep(0));
  CHECK(out[0].type() == Type::Bounce);
  CHECK(out[0].h.from_cn == 0);
  CHECK(out[0].h.to_cn == target);
  CHECK(out[0].body == body);
  CHECK(g.r.stats().bounced == 1);
  CHECK(g.r.stats().forwarded == 0);
}

TEST_CASE("relay: messages from an endpoint that is not the member's are dropped", "[relay]") {
  Rig g;
  g.join(0, 2);
  g.join(1, 2);
  const uint64_t stranger = 99999;
  // Forward, barrier and leave claiming to be computenode 0 or 1: no effect.
  REQUIRE(g.msg(stranger, Type::Forward, 0, 1, 2, 0, "spoof"));
  REQUIRE(g.msg(stranger, Type::Forward, 0, kAll, 2, 0, "spoof"));
  REQUIRE(g.msg(stranger, Type::Forward, 0, 7, 2, 0, "spoof"));  // would bounce if it were a member
  REQUIRE(g.msg(ep(4), Type::Forward, 4, 0, 5, 0, "never joined"));
  CHECK(g.take().empty());
  CHECK(g.r.stats().forwarded == 0);
  CHECK(g.r.stats().bounced == 0);

  g.barrier(0, 2, 0, stranger);
  g.barrier(1, 2, 0);
  CHECK(g.take().empty());  // the stranger's arrival did not count
  REQUIRE(g.msg(stranger, Type::Leave, 1, kAll, 2, 0));
  CHECK(g.r.alive(1));
  CHECK(g.take().empty());

  // Heartbeats from a stale endpoint do not keep computenode 0 alive; 1's own do.
  g.heartbeat(0, 2, 900ms, stranger);
  g.heartbeat(1, 2, 900ms);
  g.r.tick(g.at(1100ms));
  CHECK_FALSE(g.r.alive(0));
  CHECK(g.r.alive(1));
  auto out = g.take();
  REQUIRE(out.size() == 1);  // 1 hears that 0 is gone
  CHECK(out[0].to == ep(1));
  CHECK(out[0].type() == Type::Gone);
  CHECK(out[0].h.from_cn == 0);
}

TEST_CASE("relay: a barrier releases once every computenode arrived, one generation for all, increasing",
          "[relay]") {
  Rig g;
  for (uint32_t cn = 0; cn < 3; ++cn) g.join(cn, 3);
  const std::set<uint64_t> all{ep(0), ep(1), ep(2)};
  g.barrier(2, 3, 0);
  g.barrier(0, 3, 0);
  CHECK(g.take().empty());
  g.barrier(1, 3, 0);
  auto out = g.take();
  for (const auto& o : out) CHECK(o.h.num_cns == 3);
  const uint64_t gen0 = check_release(out, all, 0);
  CHECK(gen0 > 0);
  CHECK(g.r.stats().barriers == 1);

  // The next barrier: a repeated arrival does not count twice.
  g.barrier(0, 3, 1);
  g.barrier(0, 3, 1);
  g.barrier(1, 3, 1);
  CHECK(g.take().empty());
  g.barrier(2, 3, 1);
  const uint64_t gen1 = check_release(g.take(), all, 1);
  CHECK(gen1 > gen0);

  // Arrivals at the next-but-one barrier wait for their own.
  g.barrier(0, 3, 2);
  g.barrier(1, 3, 2);
  g.barrier(2, 3, 3);  // a fast one (it cannot be, but the relay must not mix seqs)
  CHECK(g.take().empty());
  g.barrier(2, 3, 2);
  const uint64_t gen2 = check_release(g.take(), all, 2);
  CHECK(gen2 > gen1);
  g.barrier(0, 3, 3);
  g.barrier(1, 3, 3);
  const uint64_t gen3 = check_release(g.take(), all, 3);
  CHECK(gen3 > gen2);
  CHECK(g.r.stats().barriers == 4);
  CHECK(g.r.stats().gone == 0);
}

TEST_CASE("relay: at seq >= 1 a member silent for longer than the timeout is gone and does not hold the barrier",
          "[relay]") {
  Rig g(1000ms);
  for (uint32_t cn = 0; cn < 3; ++cn) g.join(cn, 3);
  for (uint32_t cn = 0; cn < 3; ++cn) g.barrier(cn, 3, 0);
  check_release(g.take(), {ep(0), ep(1), ep(2)}, 0);

  // 0 and 1 keep sending heartbeats; 2 went silent at t0.
  g.heartbeat(0, 3, 500ms);
  g.heartbeat(1, 3, 500ms);
  g.heartbeat(0, 3, 1000ms);
  g.heartbeat(1, 3, 1000ms);
  g.r.tick(g.at(1000ms));  // exactly the timeout: not yet
  CHECK(g.r.alive(2));
  CHECK(g.take().empty());

  SECTION("gone before the others arrive") {
    g.r.tick(g.at(1001ms));
    CHECK_FALSE(g.r.alive(2));
    auto out = g.take();
    CHECK(recipients(out) == std::set<uint64_t>{ep(0), ep(1)});
    REQUIRE(out.size() == 2);
    for (const auto& o : out) {
      CHECK(o.type() == Type::Gone);
      CHECK(o.h.from_cn == 2);
      CHECK(o.h.memnode == kMemnode);
      CHECK_THAT(o.body, Catch::Contains("no heartbeat"));
    }
    CHECK(g.r.stats().gone == 1);
    g.r.tick(g.at(1500ms));  // reported once
    CHECK(g.take().empty());

    g.barrier(0, 3, 1, 1500ms);
    CHECK(g.take().empty());  // 1 is alive and has not arrived
    g.barrier(1, 3, 1, 1500ms);
    check_release(g.take(), {ep(0), ep(1)}, 1, {2});
  }
  SECTION("gone while the others wait: the tick releases them") {
    g.barrier(0, 3, 1, 1000ms);
    g.barrier(1, 3, 1, 1000ms);
    CHECK(g.take().empty());
    g.r.tick(g.at(1001ms));
    auto out = g.take();
    std::vector<Out> gone, rel;
    for (auto& o : out) (o.type() == Type::Gone ? gone : rel).push_back(o);
    CHECK(recipients(gone) == std::set<uint64_t>{ep(0), ep(1)});
    check_release(rel, {ep(0), ep(1)}, 1, {2});
  }
  SECTION("heartbeats keep a member alive indefinitely") {
    g.heartbeat(2, 3, 1000ms);
    for (int ms = 1500; ms <= 10000; ms += 500) {
      for (uint32_t cn = 0; cn < 3; ++cn) g.heartbeat(cn, 3, std::chrono::milliseconds(ms));
      g.r.tick(g.at(std::chrono::milliseconds(ms + 400)));
    }
    CHECK(g.r.alive(2));
    CHECK(g.take().empty());
    CHECK(g.r.stats().gone == 0);
  }
}

TEST_CASE("relay: a record of an earlier run that times out is not reported to the next run's computenodes",
          "[relay]") {
  Rig g(1000ms);
  g.join(0, 2, ep(0), 0ms);
  g.join(1, 2, ep(1), 0ms);
  g.heartbeat(0, 2, 500ms);
  REQUIRE(g.msg(ep(1), Type::Leave, 1, relay::kAll, 2, 0, {}, 500ms));  // computenode 1 left cleanly
  g.take();  // its Gone ("left") to computenode 0
  // Computenode 0's Leave never arrived. The next run's computenode 1 joins before the next
  // computenode 0 does; the old record of 0 then times out.
  g.join(1, 2, ep(1, 1), 1200ms);
  for (auto t : {1250ms, 1400ms, 1510ms}) g.r.tick(g.at(t));  // 0 silent since 500 ms
  CHECK_FALSE(g.r.alive(0));
  CHECK(g.take().empty());  // not news to the new computenode 1: it would stop waiting for the new 0
  g.join(0, 2, ep(0, 1), 1600ms);
  CHECK(g.r.alive(0));
  // A member of the same run (it joined before the silent one last spoke) is still told.
  g.heartbeat(1, 2, 1700ms, ep(1, 1));
  for (auto t : {1750ms, 2000ms, 2250ms, 2500ms}) {  // ticks close enough that no stall is assumed
    g.heartbeat(0, 2, t, ep(0, 1));
    g.r.tick(g.at(t));
  }
  CHECK(g.take().empty());
  g.r.tick(g.at(2701ms));  // 1 silent since 1700 ms
  auto out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == ep(0, 1));
  CHECK(out[0].type() == Type::Gone);
  CHECK(out[0].h.from_cn == 1);
}

TEST_CASE("relay: a next run's computenode on an old member's endpoint is not told the old run's members are gone",
          "[relay]") {
  // The soak's rounds 45 and 149: both Leaves of a run were lost, both records timed out; the
  // next run's computenode 1 joined from the endpoint handle the old one had (tcp reuses them),
  // was taken for the old one coming back and told "computenode 0 is gone", so it never sent
  // the next computenode 0, which joined 0.5 s later, its done count.
  Rig g(1000ms);
  g.join(0, 2, ep(0), 0ms);
  g.join(1, 2, ep(1), 0ms);
  g.heartbeat(0, 2, 100ms);
  g.heartbeat(1, 2, 100ms);
  for (int t = 200; t <= 1200; t += 200) g.r.tick(g.at(std::chrono::milliseconds(t)));  // ticks close enough: no stall
  CHECK_FALSE(g.r.alive(0));
  CHECK_FALSE(g.r.alive(1));
  g.take();
  g.join(1, 2, ep(1), 1300ms);  // only its JoinAck: no Gone of the old computenode 0
  g.r.tick(g.at(1400ms));
  g.join(0, 2, ep(0), 1500ms);
  REQUIRE(g.msg(ep(1), Type::Forward, 1, 0, 2, 7, "done", 1550ms));
  auto out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == ep(0));
  CHECK(out[0].type() == Type::Deliver);
  // A member that falls silent and then speaks again without joining (a stalled host) is
  // alive again, and told who is gone meanwhile.
  for (int t = 1600; t <= 2800; t += 200) {
    g.heartbeat(0, 2, std::chrono::milliseconds(t));
    g.r.tick(g.at(std::chrono::milliseconds(t)));
  }
  CHECK_FALSE(g.r.alive(1));
  g.take();
  g.heartbeat(1, 2, 2850ms);
  CHECK(g.r.alive(1));
}

TEST_CASE("relay: at seq 0 a dead member of an earlier run does not release the barrier early", "[relay]") {
  // The race: the computenodes of a new run start one by one; computenode 0 arrives at
  // barrier 0 before computenode 1's Join reaches the relay, while the relay still holds
  // computenode 1 of an earlier run, dead.
  Rig g(1000ms);
  g.join(0, 2);
  g.join(1, 2);
  SECTION("the dead member had passed its own barrier 0") {
    g.barrier(0, 2, 0);
    g.barrier(1, 2, 0);
    check_release(g.take(), {ep(0), ep(1)}, 0);
    g.barrier(0, 2, 1, 200ms);
    g.barrier(1, 2, 1, 200ms);
    check_release(g.take(), {ep(0), ep(1)}, 1);
  }
  SECTION("the dead member had arrived at a barrier 0 that never completed") {
    g.barrier(1, 2, 0);  // then both are killed before computenode 0 arrives
    CHECK(g.take().empty());
  }
  SECTION("the dead member never arrived") {}
  // The old run ends: computenode 0 leaves, computenode 1 dies silently.
  REQUIRE(g.msg(ep(0), Type::Leave, 0, kAll, 2, 0, {}, 300ms));
  g.r.tick(g.at(2000ms));
  REQUIRE_FALSE(g.r.alive(0));
  REQUIRE_FALSE(g.r.alive(1));
  g.take();

  // The new run: computenode 0 joins and arrives at barrier 0 at once.
  g.join(0, 2, ep(0, 1), 5000ms);
  g.barrier(0, 2, 0, ep(0, 1), 5000ms);
  CHECK(g.take().empty());
  g.heartbeat(0, 2, 5500ms, ep(0, 1));
  g.r.tick(g.at(5600ms));
  CHECK(g.take().empty());  // still waiting for computenode 1 of this run
  g.join(1, 2, ep(1, 1), 5700ms);
  CHECK(g.take().empty());
  g.barrier(1, 2, 0, ep(1, 1), 5800ms);
  check_release(g.take(), {ep(0, 1), ep(1, 1)}, 0);

  // The new run goes on normally.
  g.barrier(0, 2, 1, ep(0, 1), 5900ms);
  g.barrier(1, 2, 1, ep(1, 1), 5900ms);
  check_release(g.take(), {ep(0, 1), ep(1, 1)}, 1);
}

TEST_CASE("relay: Leave makes a member gone at once without holding barriers", "[relay]") {
  Rig g(1000ms);
  for (uint32_t cn = 0; cn < 3; ++cn) g.join(cn, 3);
  for (uint32_t cn = 0; cn < 3; ++cn) g.barrier(cn, 3, 0);
  const uint64_t gen0 = check_release(g.take(), {ep(0), ep(1), ep(2)}, 0);

  SECTION("left before the others arrive") {
    REQUIRE(g.msg(ep(2), Type::Leave, 2, kAll, 3, 0, {}, 100ms));
    CHECK_FALSE(g.r.alive(2));
    auto out = g.take();
    CHECK(recipients(out) == std::set<uint64_t>{ep(0), ep(1)});
    for (const auto& o : out) {
      CHECK(o.type() == Type::Gone);
      CHECK(o.h.from_cn == 2);
      CHECK(o.body == "left");
    }
    g.barrier(0, 3, 1, 200ms);
    g.barrier(1, 3, 1, 200ms);
    CHECK(check_release(g.take(), {ep(0), ep(1)}, 1, {2}) > gen0);
  }
  SECTION("left while the others wait: the leave releases them") {
    g.barrier(0, 3, 1, 100ms);
    g.barrier(1, 3, 1, 100ms);
    CHECK(g.take().empty());
    REQUIRE(g.msg(ep(2), Type::Leave, 2, kAll, 3, 0, {}, 200ms));
    std::vector<Out> gone, rel;
    for (auto& o : g.take()) (o.type() == Type::Gone ? gone : rel).push_back(o);
    CHECK(gone.size() == 2);
    CHECK(check_release(rel, {ep(0), ep(1)}, 1, {2}) > gen0);
  }
  // Gone once: the timeout does not report it again; forwards to it bounce.
  g.heartbeat(0, 3, 900ms);
  g.heartbeat(1, 3, 900ms);
  g.r.tick(g.at(1500ms));
  CHECK(g.take().empty());
  CHECK(g.r.stats().gone == 1);
  REQUIRE(g.msg(ep(0), Type::Forward, 0, 2, 3, 0, "q", 1500ms));
  auto out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].type() == Type::Bounce);
}

TEST_CASE("relay: a re-join of the same id makes it alive again and drops its stale arrivals", "[relay]") {
  Rig g(1000ms);
  g.join(0, 2);
  g.join(1, 2);
  SECTION("after it went silent") {
    g.heartbeat(0, 2, 1000ms);
    g.r.tick(g.at(1500ms));
    REQUIRE_FALSE(g.r.alive(1));
    g.take();
    g.join(1, 2, ep(1, 1), 1600ms);
    CHECK(g.r.alive(1));
    REQUIRE(g.msg(ep(0), Type::Forward, 0, 1, 2, 0, "to the new one", 1700ms));
    auto out = g.take();
    REQUIRE(out.size() == 1);
    CHECK(out[0].to == ep(1, 1));
    CHECK(out[0].type() == Type::Deliver);
    // The old endpoint is no longer computenode 1.
    REQUIRE(g.msg(ep(1), Type::Forward, 1, 0, 2, 0, "stale", 1700ms));
    CHECK(g.take().empty());
    // Alive again: it is reported gone again only after a new silence.
    g.heartbeat(0, 2, 2500ms);
    g.heartbeat(1, 2, 2500ms, ep(1, 1));
    g.r.tick(g.at(3000ms));
    CHECK(g.r.alive(1));
    CHECK(g.take().empty());
  }
  SECTION("its arrival of before the re-join does not count") {
    g.barrier(1, 2, 0);  // the old process arrived, then was restarted
    CHECK(g.take().empty());
    g.join(1, 2, ep(1, 1), 100ms);
    g.barrier(0, 2, 0, 200ms);
    CHECK(g.take().empty());  // the new computenode 1 has not arrived
    g.barrier(1, 2, 0, ep(1, 1), 300ms);
    check_release(g.take(), {ep(0), ep(1, 1)}, 0);
  }
}

TEST_CASE("relay: a stall of the relay itself is nobody's silence", "[relay]") {
  // The memnode's progress thread (which ticks every 50 ms) was not scheduled for 2.5 s: the
  // heartbeats of that time wait unread, the first tick after it must not find everyone gone.
  Rig g(1000ms);
  g.join(0, 2);
  g.join(1, 2);
  for (int ms = 50; ms <= 500; ms += 50) {
    if (ms % 100 == 0) {
      g.heartbeat(0, 2, std::chrono::milliseconds(ms));
      g.heartbeat(1, 2, std::chrono::milliseconds(ms));
    }
    g.r.tick(g.at(std::chrono::milliseconds(ms)));
  }
  g.r.tick(g.at(3000ms));  // the first tick after the stall
  CHECK(g.r.alive(0));
  CHECK(g.r.alive(1));
  CHECK(g.take().empty());
  // Computenode 1 really is dead (its last heartbeat was at 500 ms): of the stall only a
  // quarter of the timeout counts (250 ms), then the relay's running time from 3000 ms.
  for (int ms = 3050; ms <= 3750; ms += 50) {
    if (ms % 100 == 0) g.heartbeat(0, 2, std::chrono::milliseconds(ms));
    g.r.tick(g.at(std::chrono::milliseconds(ms)));
  }
  CHECK(g.r.alive(1));
  g.r.tick(g.at(3800ms));
  CHECK_FALSE(g.r.alive(1));
  CHECK(g.r.alive(0));
  auto out = g.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == ep(0));
  CHECK(out[0].type() == Type::Gone);
  CHECK(out[0].h.from_cn == 1);
}

TEST_CASE("relay: a member declared gone that talks again is alive again and is told who is gone", "[relay]") {
  // A stalled host, not a dead process: its heartbeats resume from the same endpoint.
  Rig g(1000ms);
  for (uint32_t cn = 0; cn < 3; ++cn) g.join(cn, 3);
  for (uint32_t cn = 0; cn < 3; ++cn) g.barrier(cn, 3, 0);
  check_release(g.take(), {ep(0), ep(1), ep(2)}, 0);
  REQUIRE(g.msg(ep(1), Type::Leave, 1, kAll, 3, 0, {}, 100ms));  // 1 leaves for good
  g.heartbeat(0, 3, 900ms);
  g.r.tick(g.at(1100ms));  // 2 was silent since 0 ms
  REQUIRE_FALSE(g.r.alive(2));
  g.take();

  g.heartbeat(2, 3, 1200ms);
  CHECK(g.r.alive(2));
  CHECK_FALSE(g.r.alive(1));  // a member that left does not come back this way
  auto out = g.take();
  REQUIRE(out.size() == 1);  // what it missed: 1 is gone (0 is alive)
  CHECK(out[0].to == ep(2));
  CHECK(out[0].type() == Type::Gone);
  CHECK(out[0].h.from_cn == 1);
  CHECK(out[0].body == "left");

  // It holds barriers again; the one that left does not.
  g.barrier(0, 3, 1, 1300ms);
  CHECK(g.take().empty());
  g.barrier(2, 3, 1, 1300ms);
  check_release(g.take(), {ep(0), ep(2)}, 1, {1});
  // A message from the endpoint of the member that left does not bring it back.
  REQUIRE(g.msg(ep(1), Type::Heartbeat, 1, 0, 3, 0, {}, 1400ms));
  CHECK_FALSE(g.r.alive(1));
}
