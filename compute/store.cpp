#include "compute/store.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

#include "memory/admin.hpp"

namespace dmhnsw::compute {

namespace {

std::string name_of(const fabric::MemnodeInfo& mn) {
  return "memnode " + std::to_string(mn.id) + " (" + mn.address + ")";
}

}  // namespace

std::vector<StoreResult> store_index(fabric::Cluster& cluster, fabric::Endpoint& ep, const std::string& dir,
                                     int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  const uint64_t request_id =
      std::random_device{}() ^ (static_cast<uint64_t>(Clock::now().time_since_epoch().count()) << 1);
  admin::StoreRequest req = admin::make_store_request(dir, request_id);  // throws on an empty or too long path

  std::map<uint16_t, const fabric::MemnodeInfo*> pending;
  for (const auto& mn : cluster.memnodes()) {
    fabric::Status s = ep.send(mn.id, &req, sizeof req);
    if (s != fabric::Status::Ok)
      throw fabric::FabricError("store: sending the store request to " + name_of(mn) + " failed: " +
                                fabric::status_name(s) +
                                (cluster.alive(mn.id) ? std::string() : " [" + cluster.dead_reason(mn.id) + "]"));
    pending[mn.id] = &mn;
  }

  std::vector<StoreResult> results;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto idle_since = Clock::now();
  while (!pending.empty()) {
    fabric::Message m;
    if (ep.try_recv(m)) {
      idle_since = Clock::now();
      admin::StoreReply rep;
      auto it = pending.find(m.from_node);
      if (!admin::decode(m.payload, admin::MsgType::StoreReply, rep) || rep.request_id != request_id ||
          it == pending.end()) {
        spdlog::debug("store: discarded a message of {} bytes from node {} while waiting for store replies",
                      m.payload.size(), m.from_node);
        continue;
      }
      std::string text = admin::get_text(rep.message, sizeof rep.message, rep.message_len);
      if (rep.ok != 1)
        throw fabric::FabricError("store: " + name_of(*it->second) + " could not write its image: " + text);
      StoreResult r{it->first, text, rep.file_bytes, rep.used_bytes, rep.checksum};
      std::printf("memnode %u: stored %s (%llu bytes, %llu region bytes, checksum 0x%016llx)\n", r.memnode_id,
                  r.path.c_str(), static_cast<unsigned long long>(r.file_bytes),
                  static_cast<unsigned long long>(r.used_bytes), static_cast<unsigned long long>(r.checksum));
      std::fflush(stdout);
      results.push_back(std::move(r));
      pending.erase(it);
      continue;
    }
    for (const auto& [id, mn] : pending)
      if (!cluster.alive(id))
        throw fabric::FabricError("store: " + name_of(*mn) + " died before replying to the store request [" +
                                  cluster.dead_reason(id) + "]");
    auto now = Clock::now();
    if (now > deadline)
      throw fabric::FabricError("store: no reply from " + name_of(*pending.begin()->second) + " within " +
                                std::to_string(timeout_ms) + " ms");
    // Writing an image takes a while: after a short spin, poll every millisecond rather than
    // take a core from the memnodes (these machines have 2).
    if (now - idle_since > std::chrono::milliseconds(2))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    else
      std::this_thread::yield();
  }
  return results;
}

SnapshotResult snapshot_index(fabric::Cluster& cluster, const std::string& dir, int wait_ms) {
  SnapshotResult r;
  r.pause = with_writes_paused(cluster, wait_ms, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto ep = cluster.make_endpoint(8u << 20);
    r.images = store_index(cluster, *ep, dir);
    r.store_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  return r;
}

}  // namespace dmhnsw::compute
