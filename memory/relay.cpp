#include "memory/relay.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

namespace dmhnsw::memory {

using relay::Header;
using relay::Type;

Relay::Relay(uint16_t memnode_id, uint16_t copy, Send send, std::chrono::milliseconds timeout)
    : id_(memnode_id), copy_(copy), send_(std::move(send)), timeout_(timeout) {}

bool Relay::alive(uint32_t cn) const {
  auto it = members_.find(cn);
  return it != members_.end() && it->second.alive;
}

void Relay::send(uint32_t to_cn, const std::vector<char>& bytes) {
  auto it = members_.find(to_cn);
  if (it != members_.end()) send_(it->second.handle, bytes);
}

void Relay::gone(uint32_t cn, const std::string& why) {
  auto it = members_.find(cn);
  if (it == members_.end() || !it->second.alive) return;
  it->second.alive = false;
  ++stats_.gone;
  if (!it->second.left) spdlog::warn("relay: computenode {} is gone: {}", cn, why);
  // Only members that were there while it was: a record that times out after its computenode's
  // run ended (its Leave lost) is not news to the computenodes of the next run, which joined
  // after it last spoke (they would stop waiting for the new computenode of that id).
  auto note = relay::encode(Type::Gone, cn, relay::kAll, it->second.num_cns, 0, why.data(), why.size(), id_, copy_);
  for (auto& [other, m] : members_)
    if (other != cn && m.alive && other < it->second.num_cns && m.joined <= it->second.last_seen)
      send_(m.handle, note);
  try_release();
}

void Relay::try_release() {
  for (auto it = arrived_.begin(); it != arrived_.end();) {
    const uint64_t seq = it->first;
    const uint32_t k = barrier_cns_[seq];
    bool complete = true;
    relay::ReleaseBody body{};
    for (uint32_t cn = 0; cn < k; ++cn) {
      if (it->second.count(cn)) continue;
      // A computenode gone during the run does not hold the others back; at a run's first
      // barrier everyone must arrive (a dead member there may be a stale one of an earlier
      // run whose successor has not joined yet).
      auto m = members_.find(cn);
      if (seq > 0 && m != members_.end() && !m->second.alive) {
        if (body.gone_count < relay::kMaxCns) body.gone[body.gone_count++] = cn;
        continue;
      }
      complete = false;  // not arrived and not known gone: wait
      break;
    }
    if (!complete) {
      ++it;
      continue;
    }
    body.generation = ++generation_;
    ++stats_.barriers;
    auto msg = relay::encode(Type::Release, relay::kAll, relay::kAll, k, seq, &body, sizeof body, id_, copy_);
    for (uint32_t cn : it->second) send(cn, msg);
    barrier_cns_.erase(seq);
    it = arrived_.erase(it);
  }
}

bool Relay::on_message(const std::vector<char>& payload, uint64_t sender, Clock::time_point now) {
  auto hdr = relay::decode(payload);
  if (!hdr) return false;
  const Header h = *hdr;
  if (h.from_cn >= relay::kMaxCns) return true;  // malformed: ignore
  auto it = members_.find(h.from_cn);
  const bool known = it != members_.end() && it->second.handle == sender;
  if (known) {
    it->second.last_seen = now;
    if (!it->second.alive && !it->second.left && h.type != static_cast<uint32_t>(Type::Leave) &&
        h.type != static_cast<uint32_t>(Type::Join)) {
      // Declared gone but still talking (a stalled host, not a dead process): alive again.
      // It missed the notices sent while it was out: tell it who is gone now. A Join is not
      // that: it is a new computenode (of a next run, on an endpoint handle the provider
      // reused), and the members gone now are of the old run; their successors join anew.
      it->second.alive = true;
      spdlog::warn("relay: computenode {} is back (it was silent for longer than the timeout)", h.from_cn);
      for (auto& [cn, m] : members_) {
        if (cn == h.from_cn || m.alive || cn >= it->second.num_cns) continue;
        const std::string why = m.left ? "left" : "silent";
        auto note = relay::encode(Type::Gone, cn, h.from_cn, m.num_cns, 0, why.data(), why.size(), id_, copy_);
        send_(sender, note);
      }
    }
  }
  switch (static_cast<Type>(h.type)) {
    case Type::Join: {
      if (h.num_cns == 0 || h.num_cns > relay::kMaxCns || h.from_cn >= h.num_cns) return true;
      Member& m = members_[h.from_cn];
      m = Member{sender, h.num_cns, now, true, false, now};
      // A join may start a new run: earlier arrivals of this id, and those of members that are
      // not alive (left or silent: computenodes of an earlier run), do not count (a stale
      // arrival at barrier 0 would release the new run before all its computenodes joined).
      for (auto a = arrived_.begin(); a != arrived_.end();) {
        std::erase_if(a->second, [&](uint32_t cn) { return cn == h.from_cn || !alive(cn); });
        if (!a->second.empty()) {
          ++a;
          continue;
        }
        barrier_cns_.erase(a->first);
        a = arrived_.erase(a);
      }
      auto ack = relay::encode(Type::JoinAck, h.from_cn, h.from_cn, h.num_cns, h.seq, nullptr, 0, id_, copy_);
      send_(sender, ack);
      spdlog::debug("relay: computenode {} of {} joined", h.from_cn, h.num_cns);
      return true;
    }
    case Type::Heartbeat:
      return true;
    case Type::Leave:
      if (known) {
        it->second.left = true;
        gone(h.from_cn, "left");
      }
      return true;
    case Type::Forward: {
      if (!known) return true;  // not a member (or a stale endpoint): drop
      std::vector<char> out = payload;
      Header d = h;
      d.memnode = id_;
      d.copy = copy_;
      d.type = static_cast<uint32_t>(Type::Deliver);
      std::memcpy(out.data(), &d, sizeof d);
      if (h.to_cn == relay::kAll) {
        for (auto& [cn, m] : members_)
          if (cn != h.from_cn && m.alive && cn < it->second.num_cns) {
            send_(m.handle, out);
            ++stats_.forwarded;
          }
        return true;
      }
      auto t = members_.find(h.to_cn);
      if (t != members_.end() && t->second.alive) {
        send_(t->second.handle, out);
        ++stats_.forwarded;
      } else {
        d.type = static_cast<uint32_t>(Type::Bounce);
        std::memcpy(out.data(), &d, sizeof d);
        send_(sender, out);
        ++stats_.bounced;
      }
      return true;
    }
    case Type::Barrier: {
      if (!known) return true;
      arrived_[h.seq].insert(h.from_cn);
      barrier_cns_[h.seq] = h.num_cns;
      try_release();
      return true;
    }
    default:
      return true;  // memnode-to-computenode types are not for us
  }
}

void Relay::tick(Clock::time_point now) {
  // The progress thread was not scheduled (or the host stalled) for a while: that time is
  // nobody's silence (a tick right after it must not find every member gone).
  const auto normal = timeout_ / 4;
  if (last_tick_ != Clock::time_point{} && now - last_tick_ > normal) {
    const auto stalled = now - last_tick_ - normal;
    for (auto& [cn, m] : members_) m.last_seen = std::min(now, m.last_seen + stalled);
  }
  if (now > last_tick_) last_tick_ = now;
  std::vector<uint32_t> silent;
  for (auto& [cn, m] : members_)
    if (m.alive && now - m.last_seen > timeout_) silent.push_back(cn);
  for (uint32_t cn : silent)
    gone(cn, "no heartbeat for " + std::to_string(timeout_.count()) + " ms");
}

}  // namespace dmhnsw::memory
