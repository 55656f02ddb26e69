// Persistence across real processes (shm, tcp): store_index makes every memnode write its region
// image, `memnode --load` serves it again byte for byte; a bad image stops the memnode with a
// message naming the file; a memnode that stops answering fails the store within seconds.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "../integration/proc.hpp"
#include "common/fabric/cluster.hpp"
#include "common/region.hpp"
#include "compute/store.hpp"
#include "memory/image.hpp"

using namespace dmhnsw;
using namespace dmhnsw::testing;
using Catch::Contains;
using std::chrono::seconds;

namespace {

constexpr uint64_t kRegion = 8u << 20;
constexpr uint64_t kPattern = (1u << 20) + 13;  // bytes written into the data area

/// A memnode with explicit arguments (the shared helper fixes --region), ready when it serves.
struct Node {
  std::unique_ptr<Proc> proc;
  std::string address;
  Node(const TempDir& dir, int id, const std::string& name, std::vector<std::string> extra,
       const std::string& provider = "shm") {
    std::string ready = dir.file(name + ".ready");
    std::vector<std::string> argv{bin("memnode"), "--listen",     "127.0.0.1:0", "--id",   std::to_string(id),
                                  "--provider",   provider,          "--ready-file", ready,
                                  "--store-dir",  dir.file("")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc = std::make_unique<Proc>(argv, dir.file(name + ".log"));
    auto end = std::chrono::steady_clock::now() + seconds(20);
    while (!std::filesystem::exists(ready)) {
      if (!proc->running()) throw std::runtime_error(name + " exited at start: " + proc->output());
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error(name + " not ready in 20 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a child, not a peer
    }
    std::ifstream(ready) >> address;
  }
  /// SIGTERM, then a clean exit within 10 s (signal several nodes first, then wait).
  void signal_stop() { proc->signal(SIGTERM); }
  void wait_stopped() { REQUIRE(proc->wait(seconds(10)) == 0); }
};

std::shared_ptr<fabric::Cluster> connect(const std::vector<std::string>& addresses,
                                         const std::string& provider = "shm") {
  fabric::ClusterOptions o;
  o.provider = fabric::parse_provider(provider);
  o.memnodes = addresses;
  o.cn_id = 5;
  return fabric::connect_cluster(o);
}

/// Index of the first byte where a and b differ (or of the end of the shorter), -1 when
/// equal: a failure report of two multi-MiB vectors would print them whole.
int64_t first_difference(const std::vector<char>& a, const std::vector<char>& b) {
  size_t n = std::min(a.size(), b.size());
  auto m = std::mismatch(a.begin(), a.begin() + static_cast<ptrdiff_t>(n), b.begin());
  if (m.first != a.begin() + static_cast<ptrdiff_t>(n)) return m.first - a.begin();
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

/// Region bytes [0, len) of memnode `node`, read over the fabric.
std::vector<char> read_region(fabric::Endpoint& ep, uint16_t node, uint64_t len) {
  std::vector<char> out(len);
  fabric::Buffer b = ep.alloc(1u << 20);
  for (uint64_t off = 0; off < len; off += b.size()) {
    uint64_t n = std::min<uint64_t>(b.size(), len - off);
    ep.read(RemotePtr(node, off), b.data(), n);
    std::memcpy(out.data() + off, b.data(), n);
  }
  return out;
}

}  // namespace

TEST_CASE("stored images are served again byte for byte by memnode --load", "[integration][persistence]") {
  std::string provider = GENERATE(as<std::string>(), "shm", "tcp");
  INFO("provider " << provider);
  TempDir dir;
  const std::string images = dir.file("images");
  std::map<uint16_t, std::vector<char>> before;  // region bytes [0, used) per memnode
  uint64_t first_checksum[2] = {0, 0};
  {
    Node m0(dir, 0, "m0", {"--region", "8MiB"}, provider), m1(dir, 1, "m1", {"--region", "8MiB"}, provider);
    {
      auto c = connect({m0.address, m1.address}, provider);
      auto ep = c->make_endpoint(16u << 20);
      for (const auto& mn : c->memnodes()) {
        RegionHeader h = header_from_blob(mn.header, mn.address);
        fabric::Buffer b = ep->alloc(kPattern);
        for (uint64_t i = 0; i < kPattern; ++i) b.data()[i] = static_cast<char>((i * 2654435761u + mn.id * 77) >> 7);
        ep->write(RemotePtr(mn.id, h.data_offset), b.data(), kPattern);
        uint64_t bump = h.data_offset + kPattern, count = 1000 + mn.id;
        ep->write(RemotePtr(mn.id, mode_word_offset(shine_word::kBump)), &bump, 8);
        ep->write(RemotePtr(mn.id, mode_word_offset(shine_word::kNodeCount)), &count, 8);
        before[mn.id] = read_region(*ep, mn.id, bump);
      }
      auto results = compute::store_index(*c, *ep, images);
      REQUIRE(results.size() == 2);
      for (const auto& r : results) {
        INFO("memnode " << r.memnode_id);
        CHECK(r.path == images + "/memnode-" + std::to_string(r.memnode_id) + ".img");
        CHECK(r.used_bytes == before[r.memnode_id].size());
        CHECK(r.file_bytes == sizeof(memory::ImageHeader) + r.used_bytes);
        CHECK(std::filesystem::file_size(r.path) == r.file_bytes);
        CHECK_FALSE(std::filesystem::exists(r.path + ".tmp"));
        first_checksum[r.memnode_id] = r.checksum;
      }
    }
    m0.signal_stop();
    m1.signal_stop();
    m0.wait_stopped();
    m1.wait_stopped();
  }

  // New memnodes from the images, without --region: the image's region size is used.
  Node l0(dir, 0, "l0", {"--load", images + "/memnode-0.img"}, provider);
  Node l1(dir, 1, "l1", {"--load", images + "/memnode-1.img"}, provider);
  CHECK_THAT(l1.proc->output(), Contains("loaded " + images + "/memnode-1.img") && Contains("mode none") &&
                                    Contains(std::to_string(before[1].size()) + " used bytes") &&
                                    Contains("node count word 1001"));
  {
    auto c = connect({l0.address, l1.address}, provider);
    auto ep = c->make_endpoint(16u << 20);
    for (const auto& mn : c->memnodes()) {
      INFO("memnode " << mn.id);
      CHECK(mn.region_size == kRegion);
      const auto& want = before[mn.id];
      auto got = read_region(*ep, mn.id, want.size());
      CHECK(first_difference(got, want) == -1);
      auto tail = read_region(*ep, mn.id, want.size() + 65536);  // beyond `used`: zero, as before
      CHECK(std::all_of(tail.begin() + static_cast<ptrdiff_t>(want.size()), tail.end(), [](char x) { return x == 0; }));
    }
    // Storing the loaded regions again gives the same bytes (same checksums).
    auto again = compute::store_index(*c, *ep, dir.file("again"));
    REQUIRE(again.size() == 2);
    for (const auto& r : again) CHECK(r.checksum == first_checksum[r.memnode_id]);
  }

  // A larger --region than the image's: served with the extra room free (once is enough).
  if (provider != "shm") return;
  Node big(dir, 0, "big", {"--load", images + "/memnode-0.img", "--region", "16MiB"}, provider);
  {
    auto c = connect({big.address}, provider);
    auto ep = c->make_endpoint(16u << 20);
    CHECK(c->memnodes()[0].region_size == 2 * kRegion);
    RegionHeader h = header_from_blob(c->memnodes()[0].header, big.address);
    CHECK(h.region_size == 2 * kRegion);
    auto got = read_region(*ep, 0, before[0].size());
    CHECK(std::memcmp(got.data() + sizeof(RegionHeader), before[0].data() + sizeof(RegionHeader),
                      got.size() - sizeof(RegionHeader)) == 0);
  }
}

TEST_CASE("memnode --load refuses a corrupted, truncated, foreign or too large image, naming the file",
          "[integration][persistence]") {
  TempDir dir;
  // An image made in-process (the store path is covered above).
  std::vector<char> region(kRegion, 0);
  RegionHeader h = make_region_header(0, kRegion);
  h.mode_words[shine_word::kBump] = h.data_offset + 4096;
  std::memcpy(region.data(), &h, sizeof h);
  for (uint64_t i = 0; i < 4096; ++i) region[h.data_offset + i] = static_cast<char>(i);
  const std::string good = dir.file("memnode-0.img");
  memory::write_image(good, region.data(), region.size(), memory::region_used_bytes(h), 0);
  std::vector<char> bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto save = [&](const std::string& name, const std::vector<char>& b) {
    std::ofstream(dir.file(name), std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return dir.file(name);
  };
  auto memnode_fails = [&](const std::string& name, std::vector<std::string> args) {
    std::vector<std::string> argv{bin("memnode"), "--listen", "127.0.0.1:0", "--provider", "shm"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv, dir, name, seconds(20));
    INFO(r.output);
    CHECK(r.code != 0);
    CHECK(r.code != -1);  // exited by itself, was not killed at the deadline
    return r.output;
  };

  auto corrupted = bytes;
  corrupted[sizeof(memory::ImageHeader) + h.data_offset + 100] ^= 0x20;
  std::string path = save("corrupted.img", corrupted);
  CHECK_THAT(memnode_fails("corrupted", {"--id", "0", "--load", path}),
             Contains(path) && Contains("checksum mismatch"));

  path = save("truncated.img", std::vector<char>(bytes.begin(), bytes.end() - 1000));
  CHECK_THAT(memnode_fails("truncated", {"--id", "0", "--load", path}),
             Contains(path) && Contains("truncated") && Contains("byte " + std::to_string(bytes.size() - 1000)));

  CHECK_THAT(memnode_fails("foreign", {"--id", "1", "--load", good}),
             Contains(good) && Contains("memnode 0") && Contains("--id 1"));

  CHECK_THAT(memnode_fails("small", {"--id", "0", "--region", "4MiB", "--load", good}),
             Contains(good) && Contains("8 MiB") && Contains("4 MiB") && Contains("--region"));

  CHECK_THAT(memnode_fails("missing", {"--id", "0", "--load", dir.file("none.img")}),
             Contains(dir.file("none.img")) && Contains("cannot open"));
}

TEST_CASE("store_index fails within seconds naming a memnode that stopped answering", "[integration][persistence]") {
  TempDir dir;
  Node m0(dir, 0, "m0", {"--region", "8MiB"}), m1(dir, 1, "m1", {"--region", "8MiB"});
  auto c = connect({m0.address, m1.address});
  auto ep = c->make_endpoint(16u << 20);
  m1.proc->signal(SIGSTOP);  // hung: no replies, no heartbeats
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(compute::store_index(*c, *ep, dir.file("images")), Contains("memnode 1 (" + m1.address + ")"));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 8.0);
  m1.proc->signal(SIGKILL);
}
