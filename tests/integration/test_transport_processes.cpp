// The transport across real processes on real libfabric providers (shm, tcp): selftest,
// concurrent atomics with exact sums, refusals, a killed memnode, network namespaces, verbs.
#include <catch2/catch.hpp>

#include "../skip.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "common/fabric/cluster.hpp"
#include "common/region.hpp"
#include "compute/selftest.hpp"
#include "proc.hpp"
#include "../reserved_hugepages.hpp"

using namespace dmhnsw;
using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

std::vector<std::string> computenode(const std::string& provider, const std::string& memnodes,
                                     std::vector<std::string> rest) {
  std::vector<std::string> a{bin("computenode"), "--provider", provider, "--memnodes", memnodes};
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

uint64_t read_word(const std::string& provider, const std::string& address, uint64_t scratch_word) {
  fabric::ClusterOptions o;
  o.provider = fabric::parse_provider(provider);
  o.memnodes = {address};
  o.cn_id = 99;
  auto c = fabric::connect_cluster(o);
  RegionHeader h = header_from_blob(c->memnodes()[0].header, address);
  uint64_t v = 0;
  c->make_endpoint(1 << 20)->read(RemotePtr(0, h.scratch_offset + scratch_word), &v, 8);
  return v;
}

}  // namespace

TEST_CASE("selftest passes against real memnodes on shm tcp and cxl", "[integration]") {
  for (std::string provider : {"shm", "tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      auto r = run(computenode(provider, m1.address + "," + m0.address, {"selftest", "--atomics", "500"}), dir, "cn");
      INFO(r.output);
      CHECK(r.code == 0);
      CHECK_THAT(r.output, Contains("memnode 0 (") && Contains("memnode 1 (") && Contains("0 failed"));
      CHECK_THAT(r.output, Contains("all checks passed"));
    }
  }
}

TEST_CASE("two computenode processes x 5000 fetch_adds and CAS increments give exact sums", "[integration]") {
  // With RMA lanes the two computenodes reach the same words through different endpoints of
  // the memnode (computenode c takes lanes c, c + K, ...): the sums show the atomics stay atomic.
  const std::vector<std::pair<std::string, std::string>> configs{
      {"shm", ""}, {"shm", "0"}, {"shm", "3"}, {"tcp", ""}, {"tcp", "2"}, {"cxl", ""}};
  for (const auto& [provider, lanes] : configs) {
    DYNAMIC_SECTION(provider << " --rma-lanes " << (lanes.empty() ? "default" : lanes)) {
      TempDir dir;
      Memnode m(dir, 0, provider, "127.0.0.1:0",
                lanes.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--rma-lanes", lanes});
      Proc a(computenode(provider, m.address, {"--cn-id", "0", "--num-cns", "2", "selftest", "--atomics", "5000"}),
             dir.file("a.log"));
      Proc b(computenode(provider, m.address, {"--cn-id", "1", "--num-cns", "2", "selftest", "--atomics", "5000"}),
             dir.file("b.log"));
      int ca = a.wait(seconds(120)), cb = b.wait(seconds(120));
      INFO(a.output() << b.output());
      REQUIRE(ca == 0);
      REQUIRE(cb == 0);
      CHECK(read_word(provider, m.address, compute::ScratchLayout::kFetchAddWord) == 10000);
      CHECK(read_word(provider, m.address, compute::ScratchLayout::kCasWord) == 10000);
      // The memnode reports what each lane served when it stops: on shm (which counts
      // served operations) the two computenodes really went through different lanes.
      m.proc->signal(SIGTERM);
      REQUIRE(m.proc->wait(seconds(20)) == 0);
      const std::string out = m.proc->output();
      const auto at = out.find("per RMA lane [");
      REQUIRE(at != std::string::npos);
      std::istringstream lane_list(out.substr(at + 14, out.find(']', at) - at - 14));
      std::vector<uint64_t> served;
      for (std::string n; std::getline(lane_list, n, ',');) served.push_back(std::stoull(n));
      INFO(out);
      if (lanes == "0") CHECK(served.empty());
      if (provider == "shm" && lanes != "0")
        CHECK(std::count_if(served.begin(), served.end(), [](uint64_t n) { return n > 0; }) >= 2);
    }
  }
}

TEST_CASE("a wrong token is refused on both sides", "[integration]") {
  TempDir dir;
  std::ofstream(dir.file("token")) << "right-token\n";
  std::ofstream(dir.file("wrong")) << "wrong-token\n";
  Memnode m(dir, 0, "shm", "127.0.0.1:0", {"--token-file", dir.file("token")});
  auto r = run(computenode("shm", m.address, {"--token-file", dir.file("wrong"), "selftest"}), dir, "cn");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Contains("memnode " + m.address) && Contains("wrong cluster token"));
  CHECK_THAT(m.proc->output(), Contains("refused computenode 0") && Contains("wrong cluster token"));
  // The token from the environment works.
  auto ok = run(computenode("shm", m.address, {"selftest", "--atomics", "10"}), dir, "cn2", seconds(60),
                {"DMHNSW_TOKEN=right-token"});
  INFO(ok.output);
  CHECK(ok.code == 0);
}

TEST_CASE("a wrong protocol version is refused on both sides", "[integration]") {
  TempDir dir;
  Memnode m(dir, 0, "tcp");
  fabric::ClusterOptions o;
  o.provider = fabric::Provider::Tcp;
  o.memnodes = {m.address};
  o.control_version = fabric::kControlVersion + 1;
  CHECK_THROWS_WITH(fabric::connect_cluster(o), Contains(m.address) && Contains("version mismatch"));
  // The memnode logs the refusal; give its log a moment to be written.
  auto end = std::chrono::steady_clock::now() + seconds(5);
  while (m.proc->output().find("version mismatch") == std::string::npos && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(milliseconds(10));
  CHECK_THAT(m.proc->output(), Contains("refused") && Contains("version mismatch"));
}

TEST_CASE("a provider mismatch is refused naming both providers", "[integration]") {
  TempDir dir;
  Memnode m(dir, 0, "tcp");
  auto r = run(computenode("shm", m.address, {"selftest"}), dir, "cn");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Contains("provider mismatch") && Contains("--provider tcp") && Contains("--provider shm"));
}

TEST_CASE("lock hand-over by COMPARE_SWAP is exclusive and loses no release over every provider", "[integration]") {
  for (std::string provider : {"shm", "tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m(dir, 0, provider);
      auto r = run(computenode(provider, m.address,
                               {"selftest", "--atomics", "10", "--lock-hammer", "1", "--lock-words", "2",
                                "--lock-threads", "2", "--lock-coroutines", "4"}),
                   dir, "cn", seconds(60));
      INFO(r.output);
      CHECK(r.code == 0);
      CHECK_THAT(r.output, Contains("release by cas") && Contains("every lock exclusive, every release seen"));
      unsigned long long acq = 0, fails = 0, grew = 0;
      const auto at = r.output.find("release by cas: ");
      REQUIRE(at != std::string::npos);
      std::sscanf(r.output.c_str() + at, "release by cas: %llu acquisitions, %llu failed COMPARE_SWAPs, counters grew by %llu",
                  &acq, &fails, &grew);
      CHECK(acq > 100);
      CHECK(grew == acq);
      CHECK(fails > 0);  // the words were contended
    }
  }
}

TEST_CASE("a memnode killed with SIGKILL fails the computenode within 5 s naming it", "[integration]") {
  for (std::string provider : {"shm", "tcp", "cxl"}) {
    DYNAMIC_SECTION(provider) {
      TempDir dir;
      Memnode m0(dir, 0, provider), m1(dir, 1, provider);
      Proc cn(computenode(provider, m0.address + "," + m1.address, {"selftest", "--atomics", "10", "--loop", "60"}),
              dir.file("cn.log"));
      // Wait until the computenode is in its read loop (it printed the selftest results).
      auto end = std::chrono::steady_clock::now() + seconds(30);
      while (cn.output().find("memnode 1 (") == std::string::npos && cn.running() &&
             std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(milliseconds(10));
      REQUIRE(cn.running());
      const auto [code, secs] = kill_then_wait(*m1.proc, cn, seconds(10));
      INFO(cn.output());
      CHECK(code > 0);  // exited by itself, non-zero
      CHECK(secs < 5.0);
      CHECK_THAT(cn.output(), Contains("memnode 1 (" + m1.address + ")"));
    }
  }
}

TEST_CASE("tcp between two network namespaces (and cxl refused across them)", "[integration][netns]") {
  if (::geteuid() != 0 || std::system("command -v ip >/dev/null 2>&1") != 0) {
    DMHNSW_SKIP("network namespaces need root and iproute2");
  }
  std::string id = std::to_string(::getpid() % 100000);
  std::string a = "dmhA" + id, b = "dmhB" + id, va = "vA" + id, vb = "vB" + id;
  auto sh = [](const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); };
  struct Cleanup {
    std::function<void()> f;
    ~Cleanup() { f(); }
  } cleanup{[&] {
    sh("ip netns del " + a);
    sh("ip netns del " + b);
  }};
  if (sh("ip netns add " + a) != 0 || sh("ip netns add " + b) != 0 ||
      sh("ip link add " + va + " type veth peer name " + vb) != 0) {
    DMHNSW_SKIP("cannot create network namespaces and veth pairs here (ip netns add / ip link add failed)");
  }
  REQUIRE(sh("ip link set " + va + " netns " + a) == 0);
  REQUIRE(sh("ip link set " + vb + " netns " + b) == 0);
  REQUIRE(sh("ip -n " + a + " addr add 10.77.0.1/24 dev " + va) == 0);
  REQUIRE(sh("ip -n " + b + " addr add 10.77.0.2/24 dev " + vb) == 0);
  for (auto& [ns, dev] : {std::pair{a, va}, std::pair{b, vb}}) {
    REQUIRE(sh("ip -n " + ns + " link set " + dev + " up") == 0);
    REQUIRE(sh("ip -n " + ns + " link set lo up") == 0);
  }
  TempDir dir;
  std::ofstream(dir.file("token")) << "netns-token\n";
  Memnode m(dir, 0, "tcp", "10.77.0.1:0", {"--token-file", dir.file("token")}, {"ip", "netns", "exec", a});
  CHECK(m.address.rfind("10.77.0.1:", 0) == 0);
  std::vector<std::string> argv{"ip", "netns", "exec", b};
  auto cn = computenode("tcp", m.address, {"--token-file", dir.file("token"), "selftest", "--atomics", "200"});
  argv.insert(argv.end(), cn.begin(), cn.end());
  auto r = run(argv, dir, "cn", seconds(60));
  INFO(r.output << m.proc->output());
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Contains("all checks passed"));
  CHECK_THAT(m.proc->output(), Contains("accepted computenode 0 at 10.77.0.2"));

  // cxl across "hosts": the control port answers, the memory cannot be shared; the error says so.
  TempDir dir2;
  Memnode mc(dir2, 0, "cxl", "10.77.0.1:0", {"--token-file", dir.file("token")}, {"ip", "netns", "exec", a});
  std::vector<std::string> argv2{"ip", "netns", "exec", b};
  auto cc = computenode("cxl", mc.address, {"--token-file", dir.file("token"), "selftest"});
  argv2.insert(argv2.end(), cc.begin(), cc.end());
  auto rc = run(argv2, dir, "cn-cxl", seconds(60));
  INFO(rc.output);
  CHECK(rc.code != 0);
  CHECK_THAT(rc.output, Contains("memnode 0") && Contains("needs the computenode on the memnode's host"));
}

TEST_CASE("verbs provider without an RDMA device: both binaries fail at start and name shm and tcp", "[integration]") {
  if (std::filesystem::exists("/sys/class/infiniband") && !std::filesystem::is_empty("/sys/class/infiniband")) {
    DMHNSW_SKIP("this machine has an RDMA device");
  }
  TempDir dir;
  auto m = run({bin("memnode"), "--provider", "verbs", "--listen", "127.0.0.1:0"}, dir, "mn", seconds(20));
  CHECK(m.code != 0);
  CHECK_THAT(m.output, Contains("no RDMA device") && Contains("--provider shm") && Contains("--provider tcp"));
  auto c = run({bin("computenode"), "--provider", "verbs", "--memnodes", "127.0.0.1:1", "selftest"}, dir, "cn",
               seconds(20));
  CHECK(c.code != 0);
  CHECK_THAT(c.output, Contains("no RDMA device") && Contains("--provider shm") && Contains("--provider tcp"));
}

TEST_CASE("memnode exits 0 on SIGTERM, hugepages fall back, computenode reads a config file", "[integration]") {
  TempDir dir;
  Memnode m(dir, 0, "shm", "127.0.0.1:0", {"--hugepages"});
  std::ofstream(dir.file("cn.ini")) << "memnodes=" << m.address << "\nprovider=shm\ncn-id=0\n";
  auto r = run({bin("computenode"), "--config", dir.file("cn.ini"), "selftest", "--atomics", "10"}, dir, "cn");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Contains("all checks passed"));
  m.proc->signal(SIGTERM);
  CHECK(m.proc->wait(seconds(10)) == 0);
  // Either the hugepages were there, or the memnode said it fell back.
  std::string out = m.proc->output();
  CHECK((out.find("on 2 MiB hugepages") != std::string::npos || out.find("falling back to normal pages") != std::string::npos));
  CHECK_THAT(out, Contains("stopping"));
}

TEST_CASE("cxl on hugepages the test reserves: a memnode takes them unasked and a computenode checks them",
          "[integration][pages]") {
  dmhnsw::test::ReservedHugepages reserved(70);  // 140 MiB: one 128 MiB region and its margin
  if (!reserved.ok()) {
    DMHNSW_SKIP("cannot reserve hugepages on this host (/proc/sys/vm/nr_hugepages, needs root)");
  }
  TempDir dir;
  Memnode m(dir, 0, "cxl");
  auto r = run(computenode("cxl", m.address, {"selftest", "--atomics", "200"}), dir, "cn");
  INFO(r.output << m.proc->output());
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Contains("all checks passed"));
  CHECK_THAT(m.proc->output(), Contains("the region uses them") && Contains("on 2 MiB hugepages"));
  // The hugepages left are too few for another: --hugepages falls back, saying so, and serves.
  TempDir dir1;  // a cluster of its own
  Memnode m1(dir1, 0, "cxl", "127.0.0.1:0", {"--hugepages"});
  auto r1 = run(computenode("cxl", m1.address, {"selftest", "--atomics", "200"}), dir1, "cn");
  INFO(r1.output << m1.proc->output());
  CHECK(r1.code == 0);
  CHECK_THAT(m1.proc->output(), Contains("falling back to normal pages") && Contains("on normal pages"));
}

TEST_CASE("cxl maps the region from a --dax file: selftest passes and the file holds the region", "[integration]") {
  TempDir dir;
  const std::string dax = dir.file("cxl-device");
  Memnode m(dir, 0, "cxl", "127.0.0.1:0", {"--dax", dax});
  auto r = run(computenode("cxl", m.address, {"selftest", "--atomics", "200"}), dir, "cn");
  INFO(r.output << m.proc->output());
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Contains("all checks passed") && Contains("process CPU 0.0"));
  std::ifstream f(dax, std::ios::binary);
  char magic[8] = {};
  f.read(magic, 8);
  CHECK(std::string(magic, 8) == "DMHNSWRG");
  // --dax is for cxl only.
  auto bad = run({bin("memnode"), "--provider", "shm", "--listen", "127.0.0.1:0", "--dax", dax}, dir, "bad", seconds(20));
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Contains("--dax") && Contains("--provider cxl"));
}
