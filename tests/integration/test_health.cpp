// `memnode --health-listen`: probes without the cluster token see "starting" (503) until the
// region is registered and the control port serves, then "ready"; /live while progress runs.
#include <catch2/catch.hpp>
#include <httplib.h>

#include <regex>

#include "proc.hpp"

using namespace dmhnsw::testing;
using namespace std::chrono;

TEST_CASE("memnode health: /ready is 503 until the region serves and 200 after, /live 200, no token asked",
          "[integration][health]") {
  TempDir dir;
  const std::string ready = dir.file("m.addr");
  // A slow region allocation (a large region on a busy host), held by the test's hook.
  Proc mn({bin("memnode"), "--listen", "127.0.0.1:0", "--region", "128MiB", "--health-listen", "127.0.0.1:0",
           "--ready-file", ready},
          dir.file("m.log"), {"DMHNSW_TEST_DELAY_REGION_MS=2000", "DMHNSW_TOKEN=health-test-token"});
  REQUIRE(wait_for_output(mn, "health on 127.0.0.1:", seconds(20)));
  std::smatch m;
  const std::string out = mn.output();
  REQUIRE(std::regex_search(out, m, std::regex("health on 127\\.0\\.0\\.1:(\\d+)")));
  httplib::Client http("127.0.0.1", std::stoi(m[1]));
  http.set_connection_timeout(5);
  http.set_read_timeout(5);
  auto early = http.Get("/ready");
  REQUIRE(early);
  CHECK(early->status == 503);
  CHECK(!std::filesystem::exists(ready));
  const auto deadline = steady_clock::now() + seconds(20);
  while (!std::filesystem::exists(ready) && steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(20));
  REQUIRE(std::filesystem::exists(ready));
  auto later = http.Get("/ready");
  REQUIRE(later);
  CHECK(later->status == 200);
  CHECK(later->body == "ready\n");
  auto live = http.Get("/live");
  REQUIRE(live);
  CHECK(live->status == 200);
  auto other = http.Get("/metrics");  // nothing else is served
  REQUIRE(other);
  CHECK(other->status == 404);
  mn.signal(SIGTERM);
  CHECK(mn.wait(seconds(20)) == 0);
}
