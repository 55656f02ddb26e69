// Compute side, every provider: bootstrap over the control ports and liveness by heartbeats.
#include "common/fabric/control_cluster.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

namespace dmhnsw::fabric {

using Clock = std::chrono::steady_clock;

std::string ControlledCluster::dead_reason(uint16_t node) const {
  std::lock_guard g(mu_);
  return node < peers_.size() ? peers_[node]->why : "unknown memnode";
}

void ControlledCluster::declare_stalled(uint16_t node, const std::string& what) {
  std::string why = what + " got no progress from its fabric endpoint for " + std::to_string(opts_.stall_timeout_ms) +
                    " ms while its control connection lives (the memnode's endpoint is stuck";
  if (opts_.provider == Provider::Shm)
    why += "; with the shm provider a computenode killed inside libfabric can leave it so: restart that memnode, or "
           "use --provider tcp";
  mark_dead(node, why + ")");
}

std::string ControlledCluster::label(uint16_t node) const {
  const MemnodeInfo& i = peers_[node]->info;  // a copy of a replica set is named by its id and copy
  if (i.copies <= 1) return "memnode " + std::to_string(node);
  return "memnode " + std::to_string(i.id) + " copy " + std::to_string(i.copy);
}

std::string ControlledCluster::node_name(uint16_t node) const {
  if (node >= peers_.size()) return "memnode " + std::to_string(node) + " (unknown)";
  std::string n = label(node) + " (" + peers_[node]->info.address + ")";
  if (!alive(node)) n += " [" + dead_reason(node) + "]";
  return n;
}

std::unique_ptr<PeerState> ControlledCluster::make_peer(const std::string& host_port, const Welcome& w) {
  auto p = std::make_unique<PeerState>();
  p->info.id = w.memnode_id;
  p->info.address = host_port;
  p->info.region_size = w.region_size;
  p->info.header = w.header;
  p->info.copy = w.copy;
  p->info.copies = w.copies;
  p->info.joining = w.joining != 0;
  p->host = parse_host_port(host_port, "--memnodes").first;
  p->fabric_addr = w.fabric_addr;
  p->rma_lanes = w.rma_lanes;
  p->base = w.region_base;
  p->key = w.region_key;
  return p;
}

void ControlledCluster::order_peers(std::vector<std::unique_ptr<PeerState>> peers,
                                    const std::vector<std::pair<std::string, std::string>>& unreachable) {
  if (!unreachable.empty()) {
    const unsigned r = peers.empty() ? 1u : peers.front()->info.copies;
    if (r <= 1) throw FabricError(unreachable.front().second);
    // Each missing (id, copy) of the sets the reachable copies name is one unreachable memnode.
    uint16_t max_id = 0;
    for (auto& p : peers) max_id = std::max(max_id, p->info.id);
    std::vector<std::pair<uint16_t, uint8_t>> missing;
    for (uint16_t id = 0; id <= max_id; ++id)
      for (uint8_t c = 0; c < r; ++c)
        if (std::none_of(peers.begin(), peers.end(), [&](auto& p) { return p->info.id == id && p->info.copy == c; }))
          missing.emplace_back(id, c);
    if (missing.size() != unreachable.size()) throw FabricError(unreachable.front().second);
    for (size_t k = 0; k < missing.size(); ++k) {
      const auto [id, c] = missing[k];
      auto sibling = std::find_if(peers.begin(), peers.end(), [&](auto& p) { return p->info.id == id; });
      if (sibling == peers.end())
        throw FabricError("memnode " + std::to_string(id) + ": no copy of it can be reached (" + unreachable[k].second + ")");
      auto p = std::make_unique<PeerState>();
      p->info = (*sibling)->info;
      p->info.copy = c;
      p->info.address = unreachable[k].first;
      p->host = parse_host_port(p->info.address, "--memnodes").first;
      p->why = "unreachable when this computenode joined: " + unreachable[k].second;
      p->dead.store(true);
      spdlog::warn("memnode {} copy {} ({}): {}; its set goes on without it", id, c, p->info.address, p->why);
      peers.push_back(std::move(p));
      controls_.push_back(nullptr);
    }
  }
  // Memnode ids must be exactly 0..N-1, each served by R copies 0..R-1 (R = 1 without replica
  // sets); order peers by (id, copy): peer id * R + copy.
  std::vector<size_t> order(peers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](size_t i) { return std::pair{peers[i]->info.id, peers[i]->info.copy}; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  const unsigned r = peers.empty() ? 1u : peers[order[0]]->info.copies;
  const size_t n = peers.empty() ? 0 : size_t{peers[order.back()]->info.id} + 1;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& info = peers[order[i]]->info;
    if (peers.size() % r != 0 || info.copies != r || info.id != i / r || info.copy != i % r) {
      std::string ids;
      for (auto& q : peers)
        ids += (ids.empty() ? "" : ", ") + std::to_string(q->info.id) +
               (q->info.copies > 1 ? " copy " + std::to_string(q->info.copy) + "/" + std::to_string(q->info.copies) : "");
      if (r == 1)
        throw FabricError("--memnodes: memnode ids must be 0.." + std::to_string(peers.size() - 1) +
                          " (each once); these memnodes have ids " + ids);
      throw FabricError("--memnodes: with --replicas " + std::to_string(r) + ", each memnode id 0.." +
                        std::to_string(n == 0 ? 0 : n - 1) + " must be listed once per copy 0.." +
                        std::to_string(r - 1) + " (every memnode started with the same --replicas); these are " + ids);
    }
  }
  std::vector<std::unique_ptr<ControlClient>> ordered_controls;
  for (size_t i : order) {
    peers_.push_back(std::move(peers[i]));
    ordered_controls.push_back(std::move(controls_[i]));
    infos_.push_back(peers_.back()->info);
  }
  controls_ = std::move(ordered_controls);
}

void ControlledCluster::stop_monitor() {
  stop_.store(true);
  if (monitor_.joinable()) monitor_.join();
  if (reviver_.joinable()) reviver_.join();
}

void ControlledCluster::revive_loop() {
  std::vector<std::string> refused(peers_.size());  // the last refusal logged per peer
  while (!stop_.load()) {
    for (size_t i = 0; i < peers_.size() && !stop_.load(); ++i) {
      if (!peers_[i]->dead.load()) continue;
      {
        std::lock_guard g(pending_mu_);
        if (std::any_of(pending_.begin(), pending_.end(), [&](const Revived& r) { return r.peer == i; })) continue;
      }
      const MemnodeInfo& info = peers_[i]->info;
      std::unique_ptr<ControlClient> cc;
      try {
        cc = std::make_unique<ControlClient>(info.address, opts_.control_version);
      } catch (const FabricError&) {
        continue;  // nobody there yet
      }
      std::string why;
      try {
        Hello h = hello();
        h.fabric_addr = hello_addr_(*cc);
        Welcome w = cc->handshake(h);
        if (w.memnode_id != info.id || w.copy != info.copy || w.copies != info.copies)
          why = "it is memnode " + std::to_string(w.memnode_id) + " copy " + std::to_string(w.copy) + " of " +
                std::to_string(w.copies);
        else if (!w.joining)
          why = "it was not started with --rejoin (a new copy must be filled before it is read)";
        else if (w.region_size != info.region_size)
          why = "its region has " + std::to_string(w.region_size) + " bytes, its set's " +
                std::to_string(info.region_size);
        if (why.empty()) {
          std::lock_guard g(pending_mu_);
          pending_.push_back({static_cast<uint16_t>(i), std::move(cc), std::move(w)});
          continue;
        }
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (refused[i] != why)
        spdlog::warn("{} ({}): a memnode answers there but cannot take its place: {}", label(static_cast<uint16_t>(i)),
                     info.address, why);
      refused[i] = why;
    }
    for (int k = 0; k < 10 && !stop_.load(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// On the monitor thread (the only user of controls_ besides register_address, whose lock is
// held): the new memnode takes the dead peer's place.
std::vector<uint16_t> ControlledCluster::install_revived() {
  std::vector<uint16_t> done;
  std::vector<Revived> ready;
  {
    std::lock_guard g(pending_mu_);
    ready.swap(pending_);
  }
  if (ready.empty()) return done;
  // register_address waits, holding this lock, for answers this thread reads: wait for it to
  // finish without blocking (the monitor goes on draining), then install.
  std::unique_lock rg(register_mu_, std::defer_lock);
  while (!rg.try_lock()) {
    for (size_t i = 0; i < controls_.size(); ++i) {
      std::string why;
      if (controls_[i] && !peers_[i]->dead.load() && !controls_[i]->drain(why)) mark_dead(i, why);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (Revived& r : ready) {
    const uint16_t i = r.peer;
    PeerState& p = *peers_[i];
    const Welcome& w = r.welcome;
    p.fabric_addr = w.fabric_addr;
    p.rma_lanes = w.rma_lanes;
    p.base = w.region_base;
    p.key = w.region_key;
    try {
      on_revived(i);
      for (const auto& a : registered_) r.control->send_register(a);
    } catch (const std::exception& e) {
      spdlog::warn("{} ({}): could not take the new memnode there: {}", label(i), p.info.address, e.what());
      continue;
    }
    controls_[i] = std::move(r.control);
    p.generation.fetch_add(1);
    {
      std::lock_guard g(mu_);
      p.why.clear();
      p.dead.store(false);
    }
    spdlog::info("{} ({}): a new memnode took its place, joining its set", label(i), p.info.address);
    done.push_back(i);
  }
  return done;
}

void ControlledCluster::mark_dead(size_t i, const std::string& why) {
  {
    std::lock_guard g(mu_);
    if (peers_[i]->dead.load()) return;
    peers_[i]->why = why;
    peers_[i]->dead.store(true);
  }
  deaths_.fetch_add(1);
  spdlog::error("{} ({}) is unreachable: {}", label(static_cast<uint16_t>(i)), peers_[i]->info.address, why);
  if (opts_.fatal_exit_ms > 0 && !any_copy_alive(peers_[i]->info.id)) arm_fatal_exit(label(static_cast<uint16_t>(i)));
}

bool ControlledCluster::any_copy_alive(uint16_t id) const {
  for (const auto& p : peers_)
    if (p->info.id == id && !p->dead.load()) return true;
  return false;
}

void ControlledCluster::arm_fatal_exit(const std::string& who) {
  static std::atomic<bool> armed{false};
  if (armed.exchange(true)) return;
  const int ms = opts_.fatal_exit_ms;
  // Detached: it must outlive whatever is stuck, and it ends the process itself.
  std::thread([who, ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    spdlog::error("{} died {} ms ago and this computenode has not finished failing (a call into the provider "
                  "did not return): exiting",
                  who, ms);
    spdlog::shutdown();
    std::fflush(nullptr);
    std::_Exit(1);
  }).detach();
}

void ControlledCluster::unregister_address(const std::vector<char>& fabric_addr) {
  std::lock_guard g(register_mu_);
  if (auto it = std::find(registered_.begin(), registered_.end(), fabric_addr); it != registered_.end())
    registered_.erase(it);
  for (size_t i = 0; i < controls_.size(); ++i) {
    if (peers_[i]->dead.load()) continue;
    try {
      controls_[i]->send_unregister(fabric_addr);
    } catch (const FabricError& e) {
      mark_dead(i, e.what());
    }
  }
}

void ControlledCluster::register_address(const std::vector<char>& fabric_addr) {
  std::lock_guard g(register_mu_);
  registered_.push_back(fabric_addr);  // a memnode that takes a dead copy's place is told too
  std::vector<uint64_t> want(controls_.size(), 0);
  for (size_t i = 0; i < controls_.size(); ++i) {
    if (peers_[i]->dead.load()) continue;
    want[i] = controls_[i]->registered() + 1;
    try {
      controls_[i]->send_register(fabric_addr);
    } catch (const FabricError& e) {
      mark_dead(i, e.what());
    }
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.heartbeat_timeout_ms);
  for (size_t i = 0; i < controls_.size(); ++i)
    while (!peers_[i]->dead.load() && controls_[i]->registered() < want[i]) {
      if (std::chrono::steady_clock::now() > end) {
        const std::string why = "did not confirm a new endpoint's address within " +
                                std::to_string(opts_.heartbeat_timeout_ms) + " ms";
        // A copy of a replica set that went silent leaves its set; a lone memnode fails the run.
        if (peers_[i]->info.copies > 1) {
          mark_dead(i, why);
          break;
        }
        throw FabricError(node_name(static_cast<uint16_t>(i)) + ": " + why);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // the monitor thread reads the answer
    }
}

// Heartbeats over the control connections; a closed connection or a silent memnode marks it
// dead, which fails its pending and later operations.
void ControlledCluster::monitor() {
  // A memnode is silent when a ping we sent has had no answer for the timeout; counting from
  // the ping (not from the last answer) keeps a starved monitor thread from blaming it.
  std::vector<std::optional<Clock::time_point>> unanswered(peers_.size());
  auto next_ping = Clock::now();
  while (!stop_.load()) {
    for (uint16_t i : install_revived()) unanswered[i].reset();
    auto now = Clock::now();
    if (now >= next_ping) {
      for (size_t i = 0; i < controls_.size(); ++i) {
        if (peers_[i]->dead.load()) continue;
        if (!controls_[i]->send_ping()) mark_dead(i, "control connection failed");
        if (!unanswered[i]) unanswered[i] = now;
      }
      next_ping = now + std::chrono::milliseconds(500);
    }
    std::vector<pollfd> fds;
    // Not the connections of dead peers (closed: poll would return at once, for ever), nor the
    // missing ones of copies dead at connect.
    for (size_t i = 0; i < controls_.size(); ++i)
      fds.push_back({controls_[i] && !peers_[i]->dead.load() ? controls_[i]->fd() : -1, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    now = Clock::now();
    for (size_t i = 0; i < controls_.size(); ++i) {
      if (peers_[i]->dead.load()) continue;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        std::string why;
        if (!controls_[i]->drain(why))
          mark_dead(i, why);
        else
          unanswered[i].reset();
      } else if (unanswered[i] && now - *unanswered[i] > std::chrono::milliseconds(opts_.heartbeat_timeout_ms)) {
        mark_dead(i, "no heartbeat answer for " + std::to_string(opts_.heartbeat_timeout_ms) + " ms");
      }
    }
  }
}

}  // namespace dmhnsw::fabric
