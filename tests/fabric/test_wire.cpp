// The wire model (common/fabric/wire.hpp) around LocalFabric: parsing, the latency floor, the
// bandwidth a computenode's endpoints share per memnode, no delay when off, and the data moved
// exactly as without it. Only lower bounds of time are checked (what the model promises).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>

#include "common/fabric/local/local_fabric.hpp"
#include "common/fabric/wire.hpp"

using namespace dmhnsw;
using namespace dmhnsw::fabric;
using Clock = std::chrono::steady_clock;

namespace {
double since_us(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }
}  // namespace

TEST_CASE("wire: presets and LAT_US,GBPS parse, and bad text names --wire", "[fabric][wire]") {
  CHECK_FALSE(parse_wire("none").enabled());
  const WireModel r = parse_wire("rdma-100g");
  CHECK(r.latency_us == 2.0);
  CHECK(r.gbytes_per_s == 12.5);
  CHECK(parse_wire("cxl").latency_us < 1.0);
  const WireModel c = parse_wire("5,1.5");
  CHECK(c.latency_us == 5.0);
  CHECK(c.gbytes_per_s == 1.5);
  CHECK(c.transfer(3000) == std::chrono::nanoseconds(2000));
  CHECK_THAT(describe(r), Catch::Contains("rdma-100g") && Catch::Contains("12.5 GB/s"));
  for (const char* bad : {"rdma", "5", "5,", ",5", "x,1", "-1,5", "1,2,3"})
    CHECK_THROWS_WITH(parse_wire(bad), Catch::Contains("--wire"));
}

TEST_CASE("wire: off adds nothing, and on, the data is the same and no completion comes before its latency",
          "[fabric][wire]") {
  auto local = LocalCluster::create(1, 1 << 20);
  for (size_t i = 0; i < 4096; ++i) local->region(0)[i] = static_cast<char>(i * 7);
  CHECK(with_wire(local, parse_wire("none")).get() == local.get());

  auto c = with_wire(local, parse_wire("2000,0"));  // 2 ms per operation, unlimited bandwidth
  auto ep = c->make_endpoint(1 << 20);
  Buffer b = ep->alloc(4096);
  const auto t0 = Clock::now();
  ep->read(RemotePtr(0, 0), b.data(), 4096);
  CHECK(since_us(t0) >= 2000);
  CHECK(std::memcmp(b.data(), local->region(0), 4096) == 0);
  // Four operations in one doorbell overlap on the wire: about one latency, not four.
  std::vector<Op> ops;
  for (int i = 0; i < 4; ++i) ops.push_back(Op::read(RemotePtr(0, 1024 * i), b.data() + 1024 * i, 1024, i));
  const auto t1 = Clock::now();
  REQUIRE(ep->post(ops) == Status::Ok);
  ep->wait_all(4);
  CHECK(since_us(t1) >= 2000);
  CHECK(ep->counters().ops[0] == 5);  // the provider's counters show through
  CHECK(ep->fetch_add(RemotePtr(0, 8192), 5) == 0);
  CHECK(ep->fetch_add(RemotePtr(0, 8192), 1) == 5);
}

TEST_CASE("wire: endpoints of one computenode share a memnode's bandwidth", "[fabric][wire]") {
  auto local = LocalCluster::create(2, 1 << 20);
  auto c = with_wire(local, parse_wire("0,0.1"));  // 100 MB/s: 100 KB take 1 ms on the wire
  auto a = c->make_endpoint(1 << 20), b = c->make_endpoint(1 << 20);
  Buffer ba = a->alloc(100000), bb = b->alloc(100000);
  const auto t0 = Clock::now();
  REQUIRE(a->post(Op::read(RemotePtr(0, 0), ba.data(), 100000, 1)) == Status::Ok);
  REQUIRE(b->post(Op::read(RemotePtr(0, 0), bb.data(), 100000, 2)) == Status::Ok);
  a->wait_all(1);
  b->wait_all(1);
  CHECK(since_us(t0) >= 2000);  // one link: the second READ waits for the first
  // Another memnode is another link.
  const auto t1 = Clock::now();
  REQUIRE(a->post(Op::read(RemotePtr(0, 0), ba.data(), 100000, 3)) == Status::Ok);
  REQUIRE(b->post(Op::read(RemotePtr(1, 0), bb.data(), 100000, 4)) == Status::Ok);
  a->wait_all(1);
  b->wait_all(1);
  CHECK(since_us(t1) >= 1000);
}
