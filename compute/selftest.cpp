#include "compute/selftest.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "common/region.hpp"
#include "memory/admin.hpp"

namespace dmhnsw::compute {

using fabric::Buffer;
using fabric::Completion;
using fabric::Op;
using fabric::Status;

namespace {

struct Checker {
  SelftestResult& r;
  uint16_t node;
  void operator()(bool ok, const std::string& what) {
    ++r.checks;
    if (!ok) {
      ++r.failures;
      if (r.first_failure.empty()) r.first_failure = "memnode " + std::to_string(node) + ": " + what;
      spdlog::error("selftest: memnode {}: FAILED: {}", node, what);
    }
  }
};

// 2-4: read after write, a batch of 32 reads with one doorbell, a batch of 16 writes.
void check_reads_and_writes(fabric::Endpoint& ep, RemotePtr base, std::mt19937_64& rng, Checker& check) {
  // 2. Read after write, 64 KiB of random bytes.
  Buffer wbuf = ep.alloc(64 << 10), rbuf = ep.alloc(64 << 10);
  for (size_t i = 0; i < wbuf.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(wbuf.data() + i, &v, 8);
  }
  ep.write(base, wbuf.data(), wbuf.size());
  ep.read(base, rbuf.data(), rbuf.size());
  check(std::memcmp(wbuf.data(), rbuf.data(), wbuf.size()) == 0, "64 KiB read-after-write mismatch");

  // 3. A batch of 32 reads of 512 B at scattered offsets, one doorbell.
  std::vector<Op> ops;
  Buffer batch = ep.alloc(32 * 512);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 32; ++i) {
    uint64_t off = (rng() % ((64 << 10) / 512)) * 512;
    offs.push_back(off);
    ops.push_back(Op::read(base + off, batch.data() + i * 512, 512, 1000 + i));
  }
  uint64_t doorbells = ep.counters().doorbells;
  if (ep.post(ops) != Status::Ok) throw fabric::FabricError("posting a batch of 32 reads failed");
  check(ep.counters().doorbells == doorbells + 1, "a batch of 32 reads took more than one doorbell");
  ep.wait_all(ops.size());
  bool same = true;
  for (int i = 0; i < 32; ++i) same &= std::memcmp(batch.data() + i * 512, wbuf.data() + offs[i], 512) == 0;
  check(same, "batched 32 x 512 B reads returned wrong bytes");

  // 4. Batched writes then one read: a batch of 16 writes of 4 KiB.
  ops.clear();
  for (int i = 0; i < 16; ++i) ops.push_back(Op::write(base + i * 4096, rbuf.data() + (15 - i) * 4096, 4096, 2000 + i));
  if (ep.post(ops) != Status::Ok) throw fabric::FabricError("posting a batch of 16 writes failed");
  ep.wait_all(ops.size());
  Buffer back = ep.alloc(64 << 10);
  ep.read(base, back.data(), back.size());
  same = true;
  for (int i = 0; i < 16; ++i) same &= std::memcmp(back.data() + i * 4096, wbuf.data() + (15 - i) * 4096, 4096) == 0;
  check(same, "batched 16 x 4 KiB writes did not land");
}

// 5-6: fetch_add and compare_swap on the memnode's shared words; returns the CAS retries.
uint64_t check_atomics(fabric::Endpoint& ep, uint16_t node, const RegionHeader& h, uint64_t atomics, Checker& check) {
  // 5. fetch_add: each returned old value is fresh and increasing for this client.
  RemotePtr fa(node, h.scratch_offset + ScratchLayout::kFetchAddWord);
  uint64_t prev = 0;
  bool mono = true;
  for (uint64_t i = 0; i < atomics; ++i) {
    uint64_t old = ep.fetch_add(fa, 1);
    if (i > 0 && old <= prev) mono = false;
    prev = old;
  }
  check(mono, "fetch_add returned a non-increasing old value");

  // 6. compare_swap increments (retry on contention); a failed CAS returns the current value.
  RemotePtr cas(node, h.scratch_offset + ScratchLayout::kCasWord);
  uint64_t cur = 0, retries = 0;
  ep.read(cas, &cur, 8);
  for (uint64_t i = 0; i < atomics; ++i) {
    for (;;) {
      uint64_t old = ep.compare_swap(cas, cur, cur + 1);
      if (old == cur) {
        cur = cur + 1;
        break;
      }
      ++retries;
      cur = old;
    }
  }
  uint64_t probe = ep.compare_swap(cas, ~uint64_t{0}, 0);  // must fail and change nothing
  uint64_t after = 0;
  ep.read(cas, &after, 8);
  // (Other computenodes may increment meanwhile: the word only ever grows.)
  check(probe != ~uint64_t{0} && probe != 0 && after >= probe,
        "a compare_swap with a wrong expected value changed the word");
  return retries;
}

// Keeps reading (liveness tests kill a memnode meanwhile): any failure throws.
void keep_reading(fabric::Cluster& cluster, fabric::Endpoint& ep, const SelftestOptions& o) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.loop_seconds);
  Buffer b = ep.alloc(4096);
  uint64_t n = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (const auto& mn : cluster.memnodes()) {
      RegionHeader h = header_from_blob(mn.header, mn.address);
      ep.read(RemotePtr(mn.id, h.scratch_offset), b.data(), 4096);
      ++n;
    }
  }
  if (o.verbose) std::printf("loop: %llu reads\n", static_cast<unsigned long long>(n));
}

}  // namespace

SelftestResult run_selftest(fabric::Cluster& cluster, const SelftestOptions& o) {
  SelftestResult res;
  auto ep = cluster.make_endpoint(16u << 20);
  std::mt19937_64 rng(0x5e1f7e57 + o.cn_id);
  for (const auto& mn : cluster.memnodes()) {
    Checker check{res, mn.id};
    RegionHeader h = header_from_blob(mn.header, "memnode " + std::to_string(mn.id) + " (" + mn.address + ")");
    uint64_t area = h.scratch_offset + ScratchLayout::kPerCnBase + uint64_t{o.cn_id} * ScratchLayout::kPerCnBytes;
    if (area + ScratchLayout::kPerCnBytes > h.scratch_offset + h.scratch_size)
      throw fabric::FabricError("memnode " + std::to_string(mn.id) + ": scratch area too small for computenode " +
                                std::to_string(o.cn_id) + " (start the memnode with a larger --region)");
    RemotePtr base(mn.id, area);
    // The memnode's CPU time around the one-sided checks (2-6): with an RDMA NIC it serves them
    // without its CPU; libfabric's shm and tcp need its progress thread.
    const admin::StatsReply cpu0 = admin::query_stats(*ep, mn.id);
    auto t0 = std::chrono::steady_clock::now();

    // 1. The header READ back equals what the bootstrap delivered (magic, id, size).
    RegionHeader remote_h;
    ep->read(RemotePtr(mn.id, 0), &remote_h, sizeof remote_h);
    check(remote_h.magic == kRegionMagic && remote_h.memnode_id == mn.id && remote_h.region_size == mn.region_size,
          "region header read over the fabric differs from the bootstrap copy");

    check_reads_and_writes(*ep, base, rng, check);

    const uint64_t retries = check_atomics(*ep, mn.id, h, o.atomics, check);

    const admin::StatsReply cpu1 = admin::query_stats(*ep, mn.id);
    const double one_sided_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double memnode_cpu_s = admin::cpu_seconds(cpu1) - admin::cpu_seconds(cpu0);
    res.memnode_cpu_s += memnode_cpu_s;
    if (o.verbose)
      std::printf("memnode %u: process CPU %.3f s during %.3f s of one-sided checks (%llu ops)\n", mn.id,
                  memnode_cpu_s, one_sided_s, static_cast<unsigned long long>(ep->counters().total_ops()));

    // 7. A message to the memnode comes back (echo).
    std::string ping = "ping from computenode " + std::to_string(o.cn_id);
    if (ep->send(mn.id, ping.data(), ping.size()) != Status::Ok)
      throw fabric::FabricError("sending a message to memnode " + std::to_string(mn.id) + " failed");
    fabric::Message m = ep->recv(5000);
    check(m.from_node == mn.id && std::string(m.payload.begin(), m.payload.end()) == ping, "message echo mismatch");

    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (o.verbose)
      std::printf("memnode %u (%s): %s in %.1f ms (%llu fetch_adds, %llu CAS increments, %llu CAS retries)\n", mn.id,
                  mn.address.c_str(), res.failures == 0 ? "all checks passed" : "CHECKS FAILED", ms,
                  static_cast<unsigned long long>(o.atomics), static_cast<unsigned long long>(o.atomics),
                  static_cast<unsigned long long>(retries));
  }

  if (o.loop_seconds > 0) keep_reading(cluster, *ep, o);
  return res;
}

}  // namespace dmhnsw::compute
