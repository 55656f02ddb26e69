// The verbs provider on soft-RoCE: each case boots a QEMU guest with rdma_rxe (tools/rxe-vm.sh),
// runs real memnode and computenode processes there over --provider verbs (tests/rxe/guest.sh)
// and checks what they print and report. Data and reference runs (shm) are made on the host.
// Skipped, with the reason, only where QEMU cannot run at all.
#include <catch2/catch.hpp>

#include "../skip.hpp"

#include <nlohmann/json.hpp>

#include <optional>

#include "../integration/proc.hpp"

using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::seconds;

namespace {

const std::string kSource = DMHNSW_SOURCE_DIR;

// Why no guest can run here (qemu or a kernel with rdma_rxe missing), or nullopt.
std::optional<std::string> cannot_boot() {
  TempDir dir;
  auto r = run({kSource + "/tools/rxe-vm.sh", "--check"}, dir, "check", seconds(60));
  if (r.code == 0) return std::nullopt;
  return r.output;
}

#define REQUIRE_GUEST()                        \
  if (auto why = cannot_boot()) {              \
    DMHNSW_SKIP("no QEMU guest: " << *why);    \
  }

// Runs `guest.sh CASE BIN DIR ARGS...` in one guest, DIR shared read-write.
RunResult in_guest(const TempDir& dir, const std::string& name, std::vector<std::string> args, int timeout_s = 300) {
  std::vector<std::string> argv{kSource + "/tools/rxe-vm.sh", "--share", dir.path.string(), "--timeout",
                                std::to_string(timeout_s), "--", "bash", kSource + "/tests/rxe/guest.sh", name,
                                std::string(DMHNSW_BIN_DIR), dir.path.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, dir, "guest-" + name, seconds(timeout_s + 60));
}

double recall_of(const std::string& report) { return load_json(report)["runs"][0]["recall"].get<double>(); }

}  // namespace

// One guest for both (a boot is ~6 s of a ctest run that must stay short).
TEST_CASE("verbs on soft-RoCE: selftest, one doorbell per batch, the memnode's CPU idle, perftest beside it and a "
          "memnode killed under a computenode's reads named within seconds",
          "[rxe]") {
  REQUIRE_GUEST();
  TempDir dir;
  auto r = in_guest(dir, "selftest-bench", {});
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("all checks passed") && Contains("selftest: 8 checks, 0 failed"));
  // rdma_cm admits queue pairs only for computenodes that joined through the control port.
  CHECK_THAT(r.output, Contains("refused a queue pair"));
  CHECK_THAT(r.output, !Contains("outsider rping exit 0"));
  auto fb = load_json(dir.file("fabric-bench.json"));
  CHECK(fb["provider"] == "verbs");
  // Every doorbell batch of B reads went out as one ibv_post_send.
  for (const auto& t : fb["read_throughput"]) {
    const uint64_t ops = t["ops"], bells = t["doorbells"], batch = t["batch"];
    CHECK(ops == bells * batch);
  }
  // The NIC serves READs and atomics: the memnode process sleeps through the whole run
  // (on shm or tcp its progress thread takes a core).
  const double cpu = fb["memnode_cpu_s"], wall = fb["wall_s"];
  INFO("memnode CPU " << cpu << " s in " << wall << " s");
  CHECK(cpu < 0.05 * wall);
  // Enough operations that an idle memnode means something (a TCG guest on a loaded host ran
  // 9,494 in the bench's fixed time, an idle one tens of thousands).
  CHECK(fb["ops"].get<uint64_t>() > 2000);
  CHECK_THAT(r.output, Contains("ib_read_lat: ") && Contains("ib_atomic_lat: "));
  // The kill: the computenode fails naming the memnode, within seconds.
  CHECK_THAT(r.output, Contains("memnode 0") && Contains("unreachable"));
  const auto at = r.output.find("computenode exit ");
  REQUIRE(at != std::string::npos);
  int code = -1;
  double secs = 1e9;
  std::sscanf(r.output.c_str() + at, "computenode exit %d after %lf s", &code, &secs);
  CHECK(code != 0);
  CHECK(secs < 10.0);  // the guest runs ~10x slower than the host; the host-side deadline is 5 s
  WARN("fabric-bench 512 B READ p50 " << fb["read_latency"][2]["p50_us"] << " us, FETCH_ADD p50 "
                                      << fb["fetch_add_latency"]["p50_us"] << " us; memnode CPU " << cpu << " s in "
                                      << wall << " s; perftest:\n"
                                      << r.output.substr(r.output.find("ib_read_lat: ")));
}

// One guest for both (a boot is seconds of a ctest run that must stay short).
TEST_CASE("verbs on soft-RoCE: a shine build and query and a d-HNSW query answer as over shm, lock hand-over by "
          "COMPARE_SWAP holds, the plain-WRITE release is lost",
          "[rxe]") {
  REQUIRE_GUEST();
  SmallData d(200, 600);  // the guest builds under TCG, ~10x slower than the host
  SmallData dd(200);      // d-HNSW: images of all 3,000 rows built here
  TempDir dir;
  // The references: the same build and queries over shm on the host.
  {
    Memnode m0(dir, 0, "shm"), m1(dir, 1, "shm");
    auto cn = [&](std::vector<std::string> rest) {
      return computenode_args("shine", "shm", m0.address + "," + m1.address, 0, 1, rest);
    };
    auto b = run(cn({"build", "--data", d.base, "--m", "12", "--ef-construction", "80", "--threads", "1"}), dir, "b");
    REQUIRE(b.code == 0);
    auto q = run(cn({"query", "--workload", d.wl, "--k", "10", "--ef-search", "32", "--threads", "1", "--coroutines",
                     "2", "--report", dir.file("shm.json")}),
                 dir, "q");
    REQUIRE(q.code == 0);
  }
  const std::string img = dir.file("idx.img");
  auto db = run({bin("dhnsw-build"), "--data", dd.base, "--partitions", "8", "--m", "16", "--ef-construction", "80",
                 "--memnodes", "2", "--out", img},
                dir, "dhnsw-build", seconds(300));
  REQUIRE(db.code == 0);
  {
    Memnode m0(dir, 0, "shm", "127.0.0.1:0", {"--load", img + ".0"}), m1(dir, 1, "shm", "127.0.0.1:0", {"--load", img + ".1"});
    auto q = run(computenode_args("dhnsw", "shm", m0.address + "," + m1.address, 0, 1,
                                  {"query", "--workload", dd.wl, "--k", "10", "--ef-search", "32", "--threads", "1",
                                   "--report", dir.file("dhnsw-shm.json")}),
                 dir, "dq");
    REQUIRE(q.code == 0);
  }
  auto r = in_guest(dir, "shine-dhnsw", {d.base, d.wl, img, dd.wl, "3", "60"}, 480);
  INFO(r.output);
  REQUIRE(r.code == 0);
  auto br = load_json(dir.file("build.json"));
  CHECK(br["inserted"] == 600);
  // The build's READs, WRITEs, FETCH_ADDs (allocation) and CASes (locks) cost the memnodes no CPU.
  const double wall = br["memnode_cpu"]["wall_s"];
  for (const auto& s : br["memnode_cpu"]["seconds"]) {
    INFO("a memnode's CPU during the build: " << s << " s in " << wall << " s");
    CHECK(s.get<double>() < 0.05 * wall);
  }
  WARN("shine build over verbs: memnode CPU " << br["memnode_cpu"].dump() << ", " << br["doorbells"] << " doorbells");
  const double shm = recall_of(dir.file("shm.json")), verbs = recall_of(dir.file("query.json"));
  INFO("shine recall@10: shm " << shm << ", verbs " << verbs);
  CHECK(verbs >= 0.9);
  CHECK(verbs == Approx(shm).margin(0.01));  // one builder, one thread: the same graph up to level draws
  CHECK(load_json(dir.file("query.json"))["provider"] == "verbs");
  const double dshm = recall_of(dir.file("dhnsw-shm.json")), dverbs = recall_of(dir.file("dhnsw-query.json"));
  INFO("d-HNSW recall@10: shm " << dshm << ", verbs " << dverbs);
  CHECK(dverbs >= 0.9);
  CHECK(dverbs == Approx(dshm).margin(1e-9));  // the same image, the same searches
  // Lock hand-over: 2 threads x 4 coroutines on 2 words, released by COMPARE_SWAP: exclusive,
  // nothing lost; with a plain WRITE, a waiter's failed COMPARE_SWAP writes the held value back.
  CHECK_THAT(r.output, Contains("release by cas") && Contains("every lock exclusive, every release seen") &&
                           Contains("hammer cas exit 0"));
  CHECK_THAT(r.output, Contains("release by write") && Contains("its release was lost") &&
                           Contains("hammer write exit 1"));
  for (const char* line : {"release by cas: ", "release by write: "})
    if (const auto at = r.output.find(line); at != std::string::npos)
      WARN(r.output.substr(at, r.output.find('\n', at) - at));
}

TEST_CASE("verbs on soft-RoCE: replica sets answer every query through a copy's SIGKILL and after it", "[rxe]") {
  REQUIRE_GUEST();
  SmallData d(100, 300);  // the guest builds under TCG
  TempDir dir;
  auto r = in_guest(dir, "replicas", {d.base, d.wl}, 480);  // a build, two query runs under TCG
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("query exit 0") && Contains("memnode 1 copy 0"));
  CHECK(load_json(dir.file("build.json"))["inserted"] == 300);
  CHECK(recall_of(dir.file("query.json")) >= 0.9);
  // A computenode that joins after the kill: the dead copy gets no queue pair, the device is
  // found through a live memnode, and its set answers from the other copy.
  CHECK_THAT(r.output, Contains("query2 exit 0") && Contains("unreachable when this computenode joined"));
  CHECK(recall_of(dir.file("query2.json")) >= 0.9);
}

TEST_CASE("verbs on soft-RoCE: the README's RDMA commands run as written", "[rxe]") {
  REQUIRE_GUEST();
  TempDir dir;
  // The README's rdma blocks as one script, with the guest's netdev and address (tools/rxe-vm.sh).
  const std::string script = dir.file("readme-rdma.sh");
  auto x = run({"python3", kSource + "/tests/docs/readme_blocks.py", "--extract", "rdma", "--bin",
                std::string(DMHNSW_BIN_DIR), "--set", "NETDEV=dmy0", "--set", "MY_IP=10.77.0.1", "--out", script},
               dir, "extract", seconds(60));
  INFO(x.output);
  REQUIRE(x.code == 0);
  auto r = in_guest(dir, "readme", {script});
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("every block of tag rdma ran") && Contains("README rdma blocks exit 0"));
  CHECK_THAT(r.output, Contains("all checks passed") && Contains("selftest: 8 checks, 0 failed"));
  CHECK_THAT(r.output, Contains("provider verbs"));  // the shine query's header line
}

TEST_CASE("verbs on soft-RoCE: a memnode in one guest, a computenode in another", "[rxe]") {
  REQUIRE_GUEST();
  TempDir dir;
  const std::string guest = kSource + "/tests/rxe/guest.sh", b = DMHNSW_BIN_DIR, w = dir.path.string();
  auto r = run({kSource + "/tools/rxe-vm.sh", "--pair", "--share", w, "--env", "DMHNSW_TOKEN=rxe-pair-token",
                "--timeout", "300", "--", "bash " + guest + " pair-memnode " + b + " " + w,
                "bash " + guest + " pair-computenode " + b + " " + w},
               dir, "pair", seconds(360));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("B| ") && Contains("all checks passed") && Contains("selftest: 8 checks, 0 failed"));
}
