// Transport semantics on LocalFabric: the same API the libfabric providers implement.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <cstring>
#include <thread>

#include "common/fabric/local/local_fabric.hpp"

using namespace dmhnsw;
using namespace dmhnsw::fabric;

namespace {
std::vector<Completion> wait_n(Endpoint& ep, size_t n) {
  std::vector<Completion> all;
  std::array<Completion, 16> buf;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (all.size() < n) {
    size_t k = ep.poll(buf);
    all.insert(all.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(k));
    REQUIRE(std::chrono::steady_clock::now() < deadline);
  }
  return all;
}
}  // namespace

TEST_CASE("RemotePtr packs node and offset into one word", "[fabric]") {
  RemotePtr p(7, 123456789);
  CHECK(p.node() == 7);
  CHECK(p.offset() == 123456789);
  CHECK(RemotePtr::from_raw(p.raw()) == p);
  CHECK(RemotePtr().is_null());
  CHECK((p + 10).offset() == 123456799);
  CHECK(RemotePtr(1, 0) < RemotePtr(1, 1));
}

TEST_CASE("LocalFabric read after write, any size", "[fabric][local]") {
  auto c = LocalCluster::create(2, 1 << 20);
  auto ep = c->make_endpoint(4 << 20);
  for (size_t len : {1u, 7u, 64u, 4096u, 100000u}) {
    std::vector<char> src(len), dst(len);
    for (size_t i = 0; i < len; ++i) src[i] = static_cast<char>(i * 31 + len);
    ep->write(RemotePtr(1, 4096), src.data(), len);
    ep->read(RemotePtr(1, 4096), dst.data(), len);
    CHECK(src == dst);
  }
  // Node 0 untouched.
  char z[64];
  ep->read(RemotePtr(0, 4096), z, sizeof z);
  CHECK(std::all_of(z, z + 64, [](char x) { return x == 0; }));
}

TEST_CASE("LocalFabric batch of 32 reads is one doorbell and completes every tag", "[fabric][local]") {
  auto c = LocalCluster::create(1, 1 << 20);
  auto ep = c->make_endpoint();
  std::vector<uint32_t> pattern(32 * 128);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint32_t>(i * 2654435761u);
  ep->write(RemotePtr(0, 8192), pattern.data(), pattern.size() * 4);
  Buffer b = ep->alloc(32 * 512);
  std::vector<Op> ops;
  for (int i = 0; i < 32; ++i) ops.push_back(Op::read(RemotePtr(0, 8192 + (31 - i) * 512), b.data() + i * 512, 512, 100 + i));
  ep->reset_counters();
  REQUIRE(ep->post(ops) == Status::Ok);
  CHECK(ep->counters().doorbells == 1);
  CHECK(ep->counters().ops[0] == 32);
  CHECK(ep->in_flight() == 32);
  auto done = wait_n(*ep, 32);
  std::set<uint64_t> tags;
  for (auto& d : done) {
    CHECK(d.status == Status::Ok);
    tags.insert(d.tag);
  }
  CHECK(tags.size() == 32);
  for (int i = 0; i < 32; ++i) CHECK(std::memcmp(b.data() + i * 512, pattern.data() + (31 - i) * 128, 512) == 0);
}

TEST_CASE("LocalFabric fetch_add from 2 threads x 10000 gives the exact sum", "[fabric][local]") {
  auto c = LocalCluster::create(1, 1 << 20);
  std::atomic<int> not_increasing{0};  // Catch2's assertions are not thread-safe: checked after join
  auto worker = [&] {
    auto ep = c->make_endpoint(1 << 20);
    uint64_t prev = 0;
    for (int i = 0; i < 10000; ++i) {
      uint64_t old = ep->fetch_add(RemotePtr(0, 4096), 1);
      if (i > 0 && old <= prev) not_increasing.fetch_add(1);
      prev = old;
    }
  };
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  CHECK(not_increasing.load() == 0);
  uint64_t v = 0;
  c->make_endpoint(1 << 20)->read(RemotePtr(0, 4096), &v, 8);
  CHECK(v == 20000);
}

TEST_CASE("LocalFabric compare_swap under contention loses no increment", "[fabric][local]") {
  auto c = LocalCluster::create(1, 1 << 20);
  std::atomic<uint64_t> retries{0};
  auto worker = [&] {
    auto ep = c->make_endpoint(1 << 20);
    uint64_t cur = 0;
    for (int i = 0; i < 5000; ++i) {
      for (;;) {
        uint64_t old = ep->compare_swap(RemotePtr(0, 8), cur, cur + 1);
        if (old == cur) {
          ++cur;
          break;
        }
        cur = old;
        ++retries;
      }
    }
  };
  std::thread a(worker), b(worker), d(worker);
  a.join();
  b.join();
  d.join();
  uint64_t v = 0;
  auto ep = c->make_endpoint(1 << 20);
  ep->read(RemotePtr(0, 8), &v, 8);
  CHECK(v == 15000);
  // A CAS with a wrong expected value returns the current value and changes nothing.
  CHECK(ep->compare_swap(RemotePtr(0, 8), 3, 99) == 15000);
  ep->read(RemotePtr(0, 8), &v, 8);
  CHECK(v == 15000);
}

TEST_CASE("LocalFabric rejects bad operations synchronously", "[fabric][local]") {
  auto c = LocalCluster::create(2, 1 << 20);
  auto ep = c->make_endpoint(1 << 20);
  Buffer b = ep->alloc(64);
  char outside[64];
  CHECK(ep->post(Op::read(RemotePtr(5, 0), b.data(), 8)) == Status::UnknownNode);
  CHECK(ep->post(Op::read(RemotePtr(0, (1 << 20) - 4), b.data(), 8)) == Status::OutOfBounds);
  CHECK(ep->post(Op::read(RemotePtr(0, 0), outside, 8)) == Status::BadLocalBuffer);
  CHECK(ep->post(Op::fetch_add(RemotePtr(0, 12), 1, b.as<uint64_t>())) == Status::Misaligned);
  // A batch with one bad op posts nothing.
  std::vector<Op> ops{Op::read(RemotePtr(0, 0), b.data(), 8), Op::read(RemotePtr(0, 1 << 20), b.data(), 8)};
  CHECK(ep->post(ops) == Status::OutOfBounds);
  CHECK(ep->in_flight() == 0);
  CHECK_THROWS_WITH(ep->fetch_add(RemotePtr(0, 3), 1), Catch::Contains("memnode 0") && Catch::Contains("aligned"));
}

TEST_CASE("LocalFabric injected delay holds completions back", "[fabric][local]") {
  auto c = LocalCluster::create(1, 1 << 20);
  auto ep = c->make_endpoint(1 << 20);
  c->set_delay(std::chrono::milliseconds(20));
  Buffer b = ep->alloc(64);
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(ep->post(Op::read(RemotePtr(0, 0), b.data(), 64, 7)) == Status::Ok);
  std::array<Completion, 4> out;
  CHECK(ep->poll(out) == 0);  // not yet
  auto done = wait_n(*ep, 1);
  CHECK(done[0].tag == 7);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(20));
}

TEST_CASE("LocalFabric injected failures surface as failed completions", "[fabric][local]") {
  auto c = LocalCluster::create(1, 1 << 20);
  auto ep = c->make_endpoint(1 << 20);
  c->fail_next(2);
  Buffer b = ep->alloc(64);
  std::vector<Op> ops;
  for (int i = 0; i < 5; ++i) ops.push_back(Op::read(RemotePtr(0, 0), b.data(), 8, i));
  REQUIRE(ep->post(ops) == Status::Ok);
  auto done = wait_n(*ep, 5);
  int failed = 0;
  for (auto& d : done) failed += d.status == Status::RemoteError;
  CHECK(failed == 2);
  c->fail_next(1);
  CHECK_THROWS_AS(ep->fetch_add(RemotePtr(0, 8), 1), FabricError);

  c->set_failure_rate(0.5, 42);
  ops.clear();
  for (int i = 0; i < 1000; ++i) ops.push_back(Op::read(RemotePtr(0, 0), b.data(), 8, i));
  REQUIRE(ep->post(ops) == Status::Ok);
  done = wait_n(*ep, 1000);
  failed = 0;
  for (auto& d : done) failed += d.status == Status::RemoteError;
  CHECK(failed > 400);
  CHECK(failed < 600);
}

TEST_CASE("LocalFabric disconnect fails in-flight and later operations naming the node", "[fabric][local]") {
  auto c = LocalCluster::create(2, 1 << 20);
  auto ep = c->make_endpoint(1 << 20);
  c->set_delay(std::chrono::seconds(30));
  Buffer b = ep->alloc(64);
  REQUIRE(ep->post(Op::read(RemotePtr(1, 0), b.data(), 8, 1)) == Status::Ok);
  c->disconnect(1, "killed by the test");
  auto done = wait_n(*ep, 1);  // returns at once, not after 30 s
  CHECK(done[0].status == Status::PeerDead);
  CHECK_THAT(ep->describe(done[0]), Catch::Contains("memnode 1") && Catch::Contains("killed by the test"));
  CHECK(ep->post(Op::read(RemotePtr(1, 0), b.data(), 8)) == Status::PeerDead);
  CHECK_FALSE(c->alive(1));
  CHECK(c->alive(0));
  c->set_delay(std::chrono::microseconds(0));
  uint64_t v = 1;
  ep->read(RemotePtr(0, 0), &v, 8);  // the other node still answers
  CHECK(v == 0);
}

TEST_CASE("LocalFabric messages reach the memnode handler and come back", "[fabric][local]") {
  auto c = LocalCluster::create(2, 1 << 20);
  auto ep = c->make_endpoint(1 << 20);
  std::string hello = "hello";
  REQUIRE(ep->send(1, hello.data(), hello.size()) == Status::Ok);
  Message m = ep->recv(1000);
  CHECK(m.from_node == 1);
  CHECK(std::string(m.payload.begin(), m.payload.end()) == hello);
  c->set_message_handler([](uint16_t node, const Message& in, std::function<void(Message)> reply) {
    Message r;
    std::string s = "node " + std::to_string(node) + " got " + std::to_string(in.payload.size());
    r.payload.assign(s.begin(), s.end());
    reply(r);
  });
  REQUIRE(ep->send(0, hello.data(), hello.size()) == Status::Ok);
  m = ep->recv(1000);
  CHECK(std::string(m.payload.begin(), m.payload.end()) == "node 0 got 5");
  std::vector<char> big(kMaxMessage + 1);
  CHECK(ep->send(0, big.data(), big.size()) == Status::OutOfBounds);
}

TEST_CASE("Buffer pool reuses freed blocks and reports exhaustion", "[fabric]") {
  BufferPool pool(1 << 16);
  char* first;
  {
    Buffer a = pool.alloc(1000);
    first = a.data();
    CHECK(pool.contains(a.data(), 1000));
    CHECK(reinterpret_cast<uintptr_t>(a.data()) % 1024 == 0);
  }
  Buffer b = pool.alloc(900);  // same size class: the freed block comes back
  CHECK(b.data() == first);
  CHECK_THROWS_WITH(pool.alloc(1 << 17), Catch::Contains("exhausted"));
  CHECK_FALSE(pool.contains(b.data() + (1 << 16), 1));
}
