// Replica sets (common/fabric/replicas.hpp) over LocalFabric: writes reach every copy, reads
// spread over the copies and move to another when one fails, atomics are ordered by the
// primary and mirrored, a dead copy is fenced and its set goes on, a set without copies fails
// naming them. Real processes and providers: tests/integration/test_replicas.cpp.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "common/fabric/local/local_fabric.hpp"
#include "common/fabric/rejoin_layout.hpp"
#include "common/fabric/replicas.hpp"
#include "common/fabric/wire.hpp"

using namespace dmhnsw;
using namespace dmhnsw::fabric;

namespace {
uint64_t word_at(LocalCluster& l, uint16_t node, uint64_t off) {
  uint64_t v = 0;
  std::memcpy(&v, l.region(node) + off, 8);
  return v;
}
}  // namespace

TEST_CASE("replicas: R = 1 is the cluster itself, and sets of R copies are the logical memnodes", "[fabric][replicas]") {
  auto local = LocalCluster::create(4, 1 << 20);
  CHECK(with_replicas(local, 1).get() == local.get());
  auto c = with_replicas(local, 2);
  REQUIRE(c->memnodes().size() == 2);
  CHECK(c->memnodes()[1].id == 1);
  CHECK(c->memnodes()[1].copies == 2);
  unsigned copies = 0;
  CHECK(replicas_physical(*c, &copies).get() == local.get());
  CHECK(copies == 2);
  CHECK_THROWS_WITH(with_replicas(LocalCluster::create(3, 1 << 20), 2), Catch::Contains("sets of 2"));
  // The wire model goes under the sets: each copy has a link of its own.
  auto w = with_wire(c, parse_wire("1,0"));
  CHECK(replicas_physical(*w) != nullptr);
  CHECK(replicas_physical(*w).get() != local.get());
}

TEST_CASE("replicas: a WRITE reaches every copy, and READs spread over the copies by page", "[fabric][replicas]") {
  auto local = LocalCluster::create(4, 1 << 20);
  auto c = with_replicas(local, 2);
  auto ep = c->make_endpoint(1 << 20);
  const char text[] = "written once, held twice";
  ep->write(RemotePtr(1, 4096), text, sizeof text);
  CHECK(std::memcmp(local->region(2) + 4096, text, sizeof text) == 0);  // set 1 copy 0
  CHECK(std::memcmp(local->region(3) + 4096, text, sizeof text) == 0);  // set 1 copy 1
  CHECK(std::memcmp(local->region(0) + 4096, text, sizeof text) != 0);
  // Make the copies differ behind the decorator's back: one page is always read from the same
  // copy (a cache in front of the memory holds it once), and the pages spread over both copies.
  int from[2] = {0, 0};
  for (uint64_t page = 0; page < 64; ++page) {
    const uint64_t off = 65536 + page * 4096 + 100;
    local->region(2)[off] = 'a';
    local->region(3)[off] = 'b';
    char x = 0, y = 0;
    ep->read(RemotePtr(1, off), &x, 1);
    ep->read(RemotePtr(1, off), &y, 1);
    CHECK(x == y);
    ++from[x == 'b'];
  }
  CHECK(from[0] >= 16);
  CHECK(from[1] >= 16);
}

TEST_CASE("replicas: atomics are ordered by the primary and every copy ends equal", "[fabric][replicas]") {
  auto local = LocalCluster::create(2, 1 << 20);
  local->set_delay(std::chrono::microseconds(20));  // completions out of step with posts
  auto c = with_replicas(local, 2);
  const RemotePtr counter(0, 4096), lock(0, 4104), guarded(0, 4112);
  constexpr int kThreads = 4, kRounds = 300;
  std::vector<std::thread> ts;
  std::vector<std::vector<uint64_t>> got(kThreads);
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      auto ep = c->make_endpoint(1 << 20);
      const uint64_t mine = static_cast<uint64_t>(t) + 1;
      for (int i = 0; i < kRounds; ++i) {
        got[t].push_back(ep->fetch_add(counter, 1));
        while (ep->compare_swap(lock, 0, mine) != 0) {
        }
        uint64_t v = 0;
        ep->read(guarded, &v, 8);
        ++v;
        ep->write(guarded, &v, 8);
        REQUIRE(ep->compare_swap(lock, mine, 0) == mine);
      }
    });
  for (auto& t : ts) t.join();
  // Every FETCH_ADD result handed out once; both copies hold the same words.
  std::vector<uint64_t> all;
  for (auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  for (uint16_t copy : {0, 1}) {
    CHECK(word_at(*local, copy, 4096) == uint64_t{kThreads * kRounds});
    CHECK(word_at(*local, copy, 4104) == 0);
    CHECK(word_at(*local, copy, 4112) == uint64_t{kThreads * kRounds});
  }
}

TEST_CASE("replicas: a dead copy is fenced, its set goes on, a set without copies fails naming them",
          "[fabric][replicas]") {
  auto local = LocalCluster::create(4, 1 << 20);
  auto c = with_replicas(local, 2);
  auto ep = c->make_endpoint(1 << 20);
  const uint64_t seven = 7;
  ep->write(RemotePtr(0, 4096), &seven, 8);
  local->disconnect(0, "killed by the test");  // set 0's primary
  CHECK(c->alive(0));
  uint64_t v = 0;
  for (int i = 0; i < 4; ++i) {  // every READ answers, from copy 1
    ep->read(RemotePtr(0, 4096), &v, 8);
    CHECK(v == 7);
  }
  CHECK(ep->fetch_add(RemotePtr(0, 4096), 1) == 7);  // copy 1 orders atomics now
  CHECK(word_at(*local, 1, 4096) == 8);
  const auto view = replica_view(*c);
  CHECK(view.live[0] == std::vector<bool>{false, true});
  CHECK(view.live[1] == std::vector<bool>{true, true});
  CHECK(view.failovers == 1);

  // A copy that fails an operation (not known dead before) is fenced; the operation succeeds.
  // Only a WRITE toward set 1's primary (physical 2): the watcher's polls READ the sets' words.
  local->fail_next(1, 2, static_cast<int>(OpKind::Write));
  ep->write(RemotePtr(1, 4096), &seven, 8);
  CHECK(replica_view(*c).live[1] == std::vector<bool>{false, true});
  CHECK(word_at(*local, 3, 4096) == 7);

  local->disconnect(1, "killed too");
  CHECK_FALSE(c->alive(0));
  CHECK_THROWS_WITH(ep->read(RemotePtr(0, 4096), &v, 8),
                    Catch::Contains("memnode 0") && Catch::Contains("every copy is gone") &&
                        Catch::Contains("killed by the test") && Catch::Contains("killed too"));
  ep->read(RemotePtr(1, 4096), &v, 8);  // the other set still answers
  CHECK(v == 7);
}

TEST_CASE("replicas: an in-flight READ on a copy that dies answers from another", "[fabric][replicas]") {
  auto local = LocalCluster::create(2, 1 << 20);
  local->set_delay(std::chrono::milliseconds(30));
  auto c = with_replicas(local, 2);
  auto ep = c->make_endpoint(1 << 20);
  local->region(0)[4096] = 'x';
  local->region(1)[4096] = 'y';
  char first = 0;  // the copy this page is read from
  ep->read(RemotePtr(0, 4096), &first, 1);
  const uint16_t home = first == 'x' ? 0 : 1;
  local->region(1)[4096] = 'x';
  Buffer b = ep->alloc(64);
  std::vector<Op> ops;
  for (uint64_t i = 0; i < 8; ++i) ops.push_back(Op::read(RemotePtr(0, 4096), b.data() + i, 1, i));
  REQUIRE(ep->post(ops) == Status::Ok);
  local->disconnect(home, "died with READs in flight");
  ep->wait_all(ops.size());
  for (int i = 0; i < 8; ++i) CHECK(b.data()[i] == 'x');
  CHECK(replica_view(*c).read_retries > 0);
}

TEST_CASE("replicas: a copy another computenode found dead is fenced here too, and one fenced here is published",
          "[fabric][replicas]") {
  auto local = LocalCluster::create(2, 1 << 20);
  auto c = with_replicas(local, 2);
  auto ep = c->make_endpoint(1 << 20);
  const uint64_t dead_word = kRejoinBlockOffset + offsetof(RejoinBlock, dead);
  // Another computenode's view says copy 0 is dead, though this one still reaches it.
  const uint64_t bit0 = 1;
  std::memcpy(local->region(0) + dead_word, &bit0, 8);
  std::memcpy(local->region(1) + dead_word, &bit0, 8);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (replica_view(*c).live[0][0] && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(replica_view(*c).live[0] == std::vector<bool>{false, true});
  local->region(0)[8192] = 'a';  // reads come from copy 1 only now
  local->region(1)[8192] = 'b';
  for (int i = 0; i < 4; ++i) {
    char x = 0;
    ep->read(RemotePtr(0, 8192), &x, 1);
    CHECK(x == 'b');
  }

  // This computenode fences copy 1 of a fresh set (a failed operation): the set's view says so.
  auto local2 = LocalCluster::create(2, 1 << 20);
  auto c2 = with_replicas(local2, 2);
  auto ep2 = c2->make_endpoint(1 << 20);
  local2->disconnect(1, "killed by the test");
  const uint64_t v = 5;
  ep2->write(RemotePtr(0, 4096), &v, 8);
  uint64_t published = 0;
  const auto until2 = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (published == 0 && std::chrono::steady_clock::now() < until2) {
    std::memcpy(&published, local2->region(0) + dead_word, 8);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(published == 2);
}
