#pragma once
// Internal to common/fabric: what every provider's compute-side cluster shares. It connects to
// each memnode's control port (token check, region descriptor), orders the memnodes by id,
// and watches them with heartbeats: a closed or silent control connection marks the memnode
// dead, which fails its pending and later operations. Providers add their endpoints.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fabric/bootstrap.hpp"
#include "common/fabric/cluster.hpp"

namespace dmhnsw::fabric {

/// One memnode as the bootstrap described it.
struct PeerState {
  MemnodeInfo info;
  std::string host;  // the host part of info.address: where its fabric listens too (verbs)
  std::vector<char> fabric_addr;
  std::vector<std::vector<char>> rma_lanes;  // empty: one-sided operations go to fabric_addr
  uint64_t base = 0, key = 0;
  std::atomic<bool> dead{false};
  std::string why;  // guarded by ControlledCluster::mu_
  /// +1 each time a new memnode took this place (a copy of a replica set replaced with
  /// memnode --rejoin): endpoints set up for the old one refresh what they keep of it.
  std::atomic<uint64_t> generation{0};
};

class ControlledCluster : public Cluster {
 public:
  explicit ControlledCluster(const ClusterOptions& o) : opts_(o) {}
  ~ControlledCluster() override { stop_monitor(); }

  Provider provider() const override { return opts_.provider; }
  const std::vector<MemnodeInfo>& memnodes() const override { return infos_; }
  bool alive(uint16_t node) const override { return node < peers_.size() && !peers_[node]->dead.load(); }
  std::string dead_reason(uint16_t node) const override;
  void declare_dead(uint16_t node, const std::string& why) override {
    if (node < peers_.size()) mark_dead(node, why);
  }

  uint64_t deaths() const { return deaths_.load(); }
  const PeerState& peer(uint16_t i) const { return *peers_[i]; }
  size_t num_peers() const { return peers_.size(); }
  uint32_t cn_id() const { return opts_.cn_id; }
  uint32_t num_cns() const { return opts_.num_cns; }
  uint64_t next_endpoint_ordinal() { return endpoints_made_.fetch_add(1); }
  std::chrono::milliseconds stall_timeout() const { return std::chrono::milliseconds(opts_.stall_timeout_ms); }
  /// An endpoint found the memnode's fabric stalled (see ClusterOptions::stall_timeout_ms).
  void declare_stalled(uint16_t node, const std::string& what);
  /// "memnode 1 (10.0.0.2:7000)", with the reason when it is dead.
  std::string node_name(uint16_t node) const;
  /// "memnode 1", or "memnode 1 copy 0" for a copy of a replica set.
  std::string label(uint16_t node) const;
  /// Tells every live memnode another fabric address of this computenode (an endpoint just
  /// made) over the control connection and waits until each confirms, so that the endpoint's
  /// first message is not taken for a stranger's. Throws naming a memnode that does not.
  void register_address(const std::vector<char>& fabric_addr);
  /// The endpoint of `fabric_addr` closed: the memnodes forget it (no answer awaited).
  void unregister_address(const std::vector<char>& fabric_addr);

 protected:
  /// Handshakes with every memnode in --memnodes order; `hello_addr` gives the fabric address
  /// the hello carries (called once per memnode, with its open control connection), then
  /// orders the memnodes by id (which must be 0..N-1) and starts the heartbeat monitor.
  template <class HelloAddr>
  void connect_all(HelloAddr&& hello_addr) {
    if (opts_.memnodes.empty()) throw FabricError("--memnodes: no memory node given");
    std::vector<std::unique_ptr<PeerState>> peers;
    std::vector<std::pair<std::string, std::string>> unreachable;  // address, why
    for (const auto& hp : opts_.memnodes) {
      // A memnode that does not answer (no control port, or silent) may be a dead copy of a
      // replica set: order_peers decides; without replica sets its error is thrown.
      try {
        auto cc = std::make_unique<ControlClient>(hp, opts_.control_version);
        Hello h = hello();
        h.fabric_addr = hello_addr(*cc);
        peers.push_back(make_peer(hp, cc->handshake(h)));
        controls_.push_back(std::move(cc));
      } catch (const FabricError& e) {
        unreachable.emplace_back(hp, e.what());
      }
    }
    order_peers(std::move(peers), unreachable);
    hello_addr_ = [h = std::forward<HelloAddr>(hello_addr)](ControlClient& cc) { return h(cc); };
    monitor_ = std::thread([this] { monitor(); });
    const bool replicated = !peers_.empty() && peers_.front()->info.copies > 1;
    if (replicated && opts_.provider != Provider::Verbs) reviver_ = std::thread([this] { revive_loop(); });
  }
  /// A new memnode took dead peer `i`'s place (its fields are set): the provider sets up what
  /// it keeps per memnode (cxl maps the region). Called on the monitor thread; may throw.
  virtual void on_revived(uint16_t i) { (void)i; }
  void stop_monitor();
  void mark_dead(size_t i, const std::string& why);
  const ClusterOptions& options() const { return opts_; }

 private:
  /// Whether some copy of logical memnode `id` is still alive.
  bool any_copy_alive(uint16_t id) const;
  /// ClusterOptions::fatal_exit_ms: the process ends that long after `who` died, once per process.
  void arm_fatal_exit(const std::string& who);
  /// This computenode's hello, but its fabric address.
  Hello hello() const {
    Hello h;
    h.mode = opts_.mode;
    h.provider = opts_.provider;
    h.cn_id = opts_.cn_id;
    h.token = opts_.token;
    return h;
  }
  static std::unique_ptr<PeerState> make_peer(const std::string& host_port, const Welcome& w);
  /// Orders the peers by (id, copy). A listed memnode that could not be reached takes the place
  /// of a missing copy of a replica set, dead from the start; otherwise its error is thrown.
  void order_peers(std::vector<std::unique_ptr<PeerState>> peers,
                   const std::vector<std::pair<std::string, std::string>>& unreachable);
  void monitor();
  /// Replica sets: a dead copy's address is tried every 500 ms; a memnode there that says it is
  /// that copy, joining (memnode --rejoin), is handed to the monitor thread to take its place.
  void revive_loop();
  std::vector<uint16_t> install_revived();  // the peers revived

  ClusterOptions opts_;
  std::function<std::vector<char>(ControlClient&)> hello_addr_;
  std::vector<std::vector<char>> registered_;  // endpoint addresses told to the memnodes (register_mu_)
  std::mutex pending_mu_;
  struct Revived {
    uint16_t peer;
    std::unique_ptr<ControlClient> control;
    Welcome welcome;
  };
  std::vector<Revived> pending_;  // found by revive_loop, installed by the monitor thread
  std::thread reviver_;
  std::vector<std::unique_ptr<ControlClient>> controls_;
  std::vector<std::unique_ptr<PeerState>> peers_;
  std::vector<MemnodeInfo> infos_;
  mutable std::mutex mu_;
  std::mutex register_mu_;  // one registration at a time: each waits for its own answers
  std::atomic<uint64_t> deaths_{0};
  std::atomic<uint64_t> endpoints_made_{0};
  std::atomic<bool> stop_{false};
  std::thread monitor_;
};

}  // namespace dmhnsw::fabric
