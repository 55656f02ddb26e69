#include "compute/relay_client.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <algorithm>
#include <cstring>

#include "common/fabric/replicas.hpp"
#include "memory/relay_protocol.hpp"

namespace dmhnsw::compute {

using fabric::FabricError;
using fabric::Status;
using Clock = std::chrono::steady_clock;

RelayClient::RelayClient(fabric::Cluster& c, uint32_t cn_id, uint32_t num_cns, Callbacks cb, int join_timeout_s)
    : c_(c), phys_(fabric::replicas_physical(c)), net_(phys_ ? phys_.get() : &c), cn_(cn_id), k_(num_cns),
      cb_(std::move(cb)), rng_(0x5EED'0000u + cn_id) {
  if (phys_) fabric::replicas_physical(c, &copies_);
  if (num_cns > relay::kMaxCns)
    throw std::invalid_argument("--num-cns " + std::to_string(num_cns) + ": the relay serves at most " +
                                std::to_string(relay::kMaxCns) + " computenodes");
  ep_ = net_->make_endpoint(4u << 20);
  nodes_ = static_cast<uint16_t>(net_->memnodes().size());
  joined_.assign(nodes_, false);
  std::set<uint16_t> expected;  // every live memnode (copy) must answer the join
  for (uint16_t i = 0; i < nodes_; ++i)
    if (net_->alive(i)) {
      send_or_throw(i, relay::encode(relay::Type::Join, cn_, cn_, k_, 0));
      joined_[i] = true;
      expected.insert(i);
    }
  io_ = std::thread([this] { io_loop(); });
  std::unique_lock g(mu_);
  const auto answered = [&] {
    return std::all_of(expected.begin(), expected.end(), [&](uint16_t i) { return acks_.count(i) || !net_->alive(i); });
  };
  if (!cv_.wait_for(g, std::chrono::seconds(join_timeout_s), answered)) {
    std::string missing;
    for (uint16_t i : expected)
      if (!acks_.count(i)) missing += (missing.empty() ? "" : ", ") + name(i);
    g.unlock();
    stop_.store(true);
    io_.join();
    throw FabricError("query relay: no answer to join from " + missing + " within " + std::to_string(join_timeout_s) +
                      " s (a memnode of an older version?)");
  }
}

RelayClient::~RelayClient() {
  try {
    for (uint16_t i = 0; i < nodes_; ++i)
      if (net_->alive(i)) send_to_memnode(i, relay::encode(relay::Type::Leave, cn_, relay::kAll, k_, 0));
  } catch (const std::exception& e) {
    spdlog::debug("relay: leave failed: {}", e.what());
  }
  stop_.store(true);
  if (io_.joinable()) io_.join();
}

std::string RelayClient::name(uint16_t node) const {
  const std::string addr = " (" + net_->memnodes()[node].address + ")";
  if (copies_ <= 1) return "memnode " + std::to_string(node) + addr;
  return "memnode " + std::to_string(node / copies_) + " copy " + std::to_string(node % copies_) + addr;
}

bool RelayClient::memnode0_alive() const {
  for (uint16_t i = 0; i < copies_ && i < nodes_; ++i)
    if (net_->alive(i)) return true;
  return false;
}

Status RelayClient::send_to_memnode(uint16_t node, const std::vector<char>& bytes, bool kick) {
  Status st;
  {
    std::lock_guard g(ep_mu_);
    st = ep_->send(node, bytes.data(), bytes.size());
  }
  if (kick && !kicked_.exchange(true)) {
    std::lock_guard g(kick_mu_);
    kick_cv_.notify_one();
  }
  return st;
}

void RelayClient::send_or_throw(uint16_t node, const std::vector<char>& bytes) {
  const Status st = send_to_memnode(node, bytes);
  if (st != Status::Ok)
    throw FabricError("query relay: sending to " + name(node) + " failed: " + fabric::status_name(st) +
                      (net_->alive(node) ? std::string() : " (" + net_->dead_reason(node) + ")"));
}

void RelayClient::send_anywhere(const std::vector<char>& bytes) {
  uint16_t start;
  {
    std::lock_guard g(mu_);
    start = static_cast<uint16_t>(rng_() % nodes_);
  }
  std::string failed;
  for (uint16_t i = 0; i < nodes_; ++i) {
    const auto m = static_cast<uint16_t>((start + i) % nodes_);
    if (!net_->alive(m)) continue;
    {
      // A relay that has not acked our Join (a copy just revived) drops what we forward.
      std::lock_guard g(mu_);
      if (!acks_.count(m)) continue;
    }
    const Status st = send_to_memnode(m, bytes);
    if (st == Status::Ok) return;
    failed += (failed.empty() ? "" : "; ") + name(m) + ": " + fabric::status_name(st);
  }
  throw FabricError("query relay: no memnode took the message (" +
                    (failed.empty() ? "every memnode is gone: " + net_->dead_reason(start) : failed) + ")");
}

void RelayClient::forward(uint32_t to, const void* body, size_t len) {
  send_anywhere(relay::encode(relay::Type::Forward, cn_, to, k_, 0, body, len));
}

void RelayClient::broadcast(const void* body, size_t len) {
  if (k_ <= 1) return;
  send_anywhere(relay::encode(relay::Type::Forward, cn_, relay::kAll, k_, 0, body, len));
}

RelayClient::Release RelayClient::barrier(int timeout_s) {
  uint64_t seq = barrier_seq_++;
  // Every live copy of memnode 0 counts the arrival: whichever releases first ends the wait.
  const auto arrival = relay::encode(relay::Type::Barrier, cn_, 0, k_, seq);
  bool sent = false;
  for (uint16_t i = 0; i < copies_ && i < nodes_; ++i)
    if (net_->alive(i)) sent = send_to_memnode(i, arrival) == Status::Ok || sent;
  if (!sent)
    throw FabricError("barrier: memnode 0 (" + c_.memnodes()[0].address + ") is gone: " + c_.dead_reason(0));
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  std::unique_lock g(mu_);
  for (;;) {
    auto it = released_.find(seq);
    if (it != released_.end()) {
      Release r = it->second;
      released_.erase(it);
      returned_below_ = seq + 1;
      return r;
    }
    if (!memnode0_alive())
      throw FabricError("barrier: memnode 0 (" + c_.memnodes()[0].address + ") is gone: " + c_.dead_reason(0));
    if (Clock::now() > deadline)
      throw FabricError("barrier " + std::to_string(seq) + ": not every one of the " + std::to_string(k_) +
                        " computenodes arrived within " + std::to_string(timeout_s) + " s");
    cv_.wait_for(g, std::chrono::milliseconds(100));
  }
}

void RelayClient::handle(const fabric::Message& m) {
  auto h = relay::decode(m.payload);
  if (!h) {
    spdlog::debug("relay: ignored a message that is not a relay message ({} bytes)", m.payload.size());
    return;
  }
  const char* body = relay::body_of(m.payload);
  switch (static_cast<relay::Type>(h->type)) {
    case relay::Type::JoinAck: {
      std::lock_guard g(mu_);
      if (h->copy < copies_) acks_.insert(static_cast<uint16_t>(h->memnode * copies_ + h->copy));
      cv_.notify_all();
      return;
    }
    case relay::Type::Deliver:
      if (cb_.deliver) cb_.deliver(h->from_cn, body, h->body_len);
      return;
    case relay::Type::Bounce:
      if (cb_.bounce) cb_.bounce(h->to_cn, body, h->body_len);
      return;
    case relay::Type::Release: {
      relay::ReleaseBody rb{};
      std::memcpy(&rb, body, std::min<size_t>(sizeof rb, h->body_len));
      Release r;
      r.generation = rb.generation;
      for (uint32_t i = 0; i < std::min(rb.gone_count, relay::kMaxCns); ++i) r.gone.push_back(rb.gone[i]);
      std::vector<uint32_t> newly;
      {
        std::lock_guard g(mu_);
        if (h->seq < returned_below_ || released_.count(h->seq)) return;  // another copy released it first
        released_[h->seq] = r;
        for (uint32_t cn : r.gone)
          if (gone_.insert(cn).second) newly.push_back(cn);
        cv_.notify_all();
      }
      for (uint32_t cn : newly)
        if (cb_.gone) cb_.gone(cn, "did not arrive at a barrier");
      return;
    }
    case relay::Type::Gone: {
      bool fresh;
      {
        std::lock_guard g(mu_);
        fresh = gone_.insert(h->from_cn).second;
      }
      std::string why(body, h->body_len);
      if (fresh) {
        if (why != "left") spdlog::warn("computenode {} is gone ({} says: {})", h->from_cn,
                                        "memnode " + std::to_string(h->memnode), why);
        if (cb_.gone) cb_.gone(h->from_cn, why);
      }
      return;
    }
    default:
      return;
  }
}

void RelayClient::io_loop() {
  auto next_beat = Clock::now();
  while (!stop_.load()) {
    bool got = false;
    try {
      if (Clock::now() >= next_beat) {
        next_beat = Clock::now() + std::chrono::milliseconds(100);
        for (uint16_t i = 0; i < nodes_; ++i) {
          if (!net_->alive(i)) {
            if (joined_[i]) {
              std::lock_guard g(mu_);
              acks_.erase(i);  // a replacement must ack a new Join before it forwards for us
            }
            joined_[i] = false;
            continue;
          }
          if (!joined_[i]) {  // a copy that came back (a rejoined memnode): its relay has no members yet
            send_to_memnode(i, relay::encode(relay::Type::Join, cn_, cn_, k_, 0), false);
            joined_[i] = true;
          }
          send_to_memnode(i, relay::encode(relay::Type::Heartbeat, cn_, 0, k_, 0), false);
        }
      }
      for (;;) {
        fabric::Message m;
        bool have;
        {
          std::lock_guard g(ep_mu_);
          have = ep_->try_recv(m);
        }
        if (!have) break;
        got = true;
        handle(m);
      }
    } catch (const std::exception& e) {
      spdlog::debug("relay I/O: {}", e.what());  // a dead memnode: the callers' sends report it
    }
    const auto now = Clock::now();
    if (got || kicked_.exchange(false)) last_traffic_ = now;  // a send of ours: its answer follows
    if (got) continue;
    if (now - last_traffic_ < kBusyWindow) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      // Idle for a while: wait up to 1 ms, woken at once by a send of ours, so a computenode
      // that routes nothing costs ~1,000 wake-ups a second instead of 20,000.
      std::unique_lock g(kick_mu_);
      kick_cv_.wait_for(g, std::chrono::milliseconds(1), [&] { return kicked_.load() || stop_.load(); });
    }
  }
}

}  // namespace dmhnsw::compute
