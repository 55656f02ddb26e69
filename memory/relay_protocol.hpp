#pragma once
// Messages of the SHINE query relay (paper section 7.1, two-sided routing): computenodes never
// talk to each other; a computenode SENDs to a random memnode, whose progress thread forwards
// the message to the target computenode. Header-only: the compute side includes it.
//
//   Join       cn -> memnode      register this endpoint as computenode `from_cn` of a run of
//                                 `num_cns`; answered by JoinAck
//   Heartbeat  cn -> memnode      "still here" (every 100 ms); silence for the relay's timeout
//                                 makes the computenode gone
//   Leave      cn -> memnode      clean exit: gone at once, not reported as a failure
//   Forward    cn -> memnode      body for computenode `to_cn` (kAll: every other member of the
//                                 sender's run); delivered as Deliver, or returned as Bounce
//   Barrier    cn -> memnode 0    arrival `seq` (the sender's count of barriers in this run)
//   Release    memnode -> cn      everyone of barrier `seq` arrived or is gone; the body is a
//                                 ReleaseBody (a generation unique over the memnode's life and
//                                 the computenodes found gone)
//   Gone       memnode -> cn      computenode `from_cn` is gone (silent or left); body: reason
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::relay {

enum class Type : uint32_t {
  Join = 0xD4A6'0001u,
  JoinAck = 0xD4A6'0002u,
  Heartbeat = 0xD4A6'0003u,
  Leave = 0xD4A6'0004u,
  Forward = 0xD4A6'0005u,
  Deliver = 0xD4A6'0006u,
  Bounce = 0xD4A6'0007u,
  Barrier = 0xD4A6'0008u,
  Release = 0xD4A6'0009u,
  Gone = 0xD4A6'000Au,
};

inline constexpr uint32_t kAll = 0xffff'ffffu;
inline constexpr uint32_t kMaxCns = 64;

struct Header {
  uint32_t type;
  uint32_t from_cn;
  uint32_t to_cn;
  uint32_t num_cns;
  uint64_t seq;
  uint32_t body_len;
  uint16_t memnode;  // the relaying memnode (set by the memnode on what it sends)
  uint16_t copy;     // and its copy in its replica set (0 without replicas)
};
static_assert(sizeof(Header) == 32);
static_assert(offsetof(Header, seq) == 16 && offsetof(Header, body_len) == 24 && offsetof(Header, memnode) == 28 &&
              offsetof(Header, copy) == 30);
static_assert(std::is_trivially_copyable_v<Header> && std::is_standard_layout_v<Header>);
inline constexpr size_t kMaxBody = fabric::kMaxMessage - sizeof(Header);

struct ReleaseBody {
  uint64_t generation;
  uint32_t gone_count;
  uint32_t reserved;
  uint32_t gone[kMaxCns];
};
static_assert(sizeof(ReleaseBody) == 16 + 4 * kMaxCns);
static_assert(std::is_trivially_copyable_v<ReleaseBody>);

inline bool is_relay_type(uint32_t t) { return t >= 0xD4A6'0001u && t <= 0xD4A6'000Au; }

/// A relay message: header + body bytes (`memnode`, `copy`: the sending memnode, on what memnodes send).
inline std::vector<char> encode(Type type, uint32_t from_cn, uint32_t to_cn, uint32_t num_cns, uint64_t seq,
                                const void* body = nullptr, size_t body_len = 0, uint16_t memnode = 0,
                                uint16_t copy = 0) {
  if (body_len > kMaxBody) throw std::invalid_argument("relay message body of " + std::to_string(body_len) + " bytes");
  Header h{static_cast<uint32_t>(type), from_cn, to_cn, num_cns, seq, static_cast<uint32_t>(body_len), memnode, copy};
  std::vector<char> out(sizeof h + body_len);
  std::memcpy(out.data(), &h, sizeof h);
  if (body_len > 0) std::memcpy(out.data() + sizeof h, body, body_len);
  return out;
}

/// The header of a relay message, or nullopt when the payload is not one (wrong type or size).
inline std::optional<Header> decode(const std::vector<char>& payload) {
  if (payload.size() < sizeof(Header)) return std::nullopt;
  Header h;
  std::memcpy(&h, payload.data(), sizeof h);
  if (!is_relay_type(h.type) || h.body_len != payload.size() - sizeof h) return std::nullopt;
  return h;
}

inline const char* body_of(const std::vector<char>& payload) { return payload.data() + sizeof(Header); }

}  // namespace dmhnsw::relay
