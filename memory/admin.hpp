#pragma once
// Admin messages between computenodes and memnodes, carried by the fabric's two-sided
// messages (Endpoint::send / RegionServer handler). Header-only: the compute side includes it
// without linking memnode code. Every payload begins with a u32 type; a payload whose type is
// not an admin type (or whose size does not match) is not an admin message, and the memnode
// keeps its default behaviour for it (echo). Type values have non-ASCII high bytes so a text
// message is never taken for one; a changed struct gets a new type value.
//
//   StoreRequest  computenode -> memnode   write the region to DIR/memnode-<id>.img
//   StoreReply    memnode -> computenode   ok flag, bytes written, checksum, path or error
//   StatsRequest  computenode -> memnode   how much CPU has the memnode process used?
//   StatsReply    memnode -> computenode   its process CPU time (user, system) and messages served
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::admin {

enum class MsgType : uint32_t {
  StoreRequest = 0xD4A5'0001u,
  StoreReply = 0xD4A5'0002u,
  StatsRequest = 0xD4A5'0003u,
  StatsReply = 0xD4A5'0004u,
};

inline constexpr size_t kDirBytes = 2048;      // directory path, NUL-terminated
inline constexpr size_t kMessageBytes = 3072;  // reply text, NUL-terminated

struct StoreRequest {
  uint32_t type;        // MsgType::StoreRequest
  uint32_t dir_len;     // bytes of `dir` before the terminating NUL
  uint64_t request_id;  // echoed in the reply
  char dir[kDirBytes];  // directory to write into (created if missing); relative paths are
                        // resolved against the memnode's working directory
};
static_assert(std::is_trivially_copyable_v<StoreRequest> && std::is_standard_layout_v<StoreRequest>);
static_assert(sizeof(StoreRequest) == 16 + kDirBytes);
static_assert(offsetof(StoreRequest, dir_len) == 4 && offsetof(StoreRequest, request_id) == 8 &&
              offsetof(StoreRequest, dir) == 16);
static_assert(sizeof(StoreRequest) <= fabric::kMaxMessage);

struct StoreReply {
  uint32_t type;         // MsgType::StoreReply
  uint32_t ok;           // 1: the image was written; 0: `message` says why not
  uint16_t memnode_id;
  uint16_t reserved0;
  uint32_t message_len;  // bytes of `message` before the terminating NUL
  uint64_t request_id;   // of the request answered
  uint64_t file_bytes;   // bytes written (image header + body)
  uint64_t used_bytes;   // region bytes in the image
  uint64_t checksum;     // body checksum stored in the image
  char message[kMessageBytes];  // ok: the absolute path of the image; else the error
};
static_assert(std::is_trivially_copyable_v<StoreReply> && std::is_standard_layout_v<StoreReply>);
static_assert(sizeof(StoreReply) == 48 + kMessageBytes);
static_assert(offsetof(StoreReply, ok) == 4 && offsetof(StoreReply, memnode_id) == 8 &&
              offsetof(StoreReply, message_len) == 12 && offsetof(StoreReply, request_id) == 16 &&
              offsetof(StoreReply, file_bytes) == 24 && offsetof(StoreReply, used_bytes) == 32 &&
              offsetof(StoreReply, checksum) == 40 && offsetof(StoreReply, message) == 48);
static_assert(sizeof(StoreReply) <= fabric::kMaxMessage);

struct StatsRequest {
  uint32_t type;  // MsgType::StatsRequest
  uint32_t reserved;
  uint64_t request_id;
};
static_assert(std::is_trivially_copyable_v<StatsRequest> && sizeof(StatsRequest) == 16 &&
              offsetof(StatsRequest, request_id) == 8);

// The memnode process's CPU time since it started (getrusage RUSAGE_SELF): with verbs the NIC
// serves one-sided operations, so a run of READs and atomics should leave it where it was.
struct StatsReply {
  uint32_t type;  // MsgType::StatsReply
  uint16_t memnode_id;
  uint16_t reserved;
  uint64_t request_id;
  uint64_t cpu_user_us;
  uint64_t cpu_system_us;
  uint64_t messages;  // messages served by the progress thread so far
};
static_assert(std::is_trivially_copyable_v<StatsReply> && sizeof(StatsReply) == 40 &&
              offsetof(StatsReply, request_id) == 8 && offsetof(StatsReply, cpu_user_us) == 16 &&
              offsetof(StatsReply, messages) == 32);

/// The type of an admin payload, or nullopt when the payload is not an admin message.
inline std::optional<MsgType> message_type(const void* data, size_t len) {
  if (len < sizeof(uint32_t)) return std::nullopt;
  uint32_t t;
  std::memcpy(&t, data, sizeof t);
  if (t >= static_cast<uint32_t>(MsgType::StoreRequest) && t <= static_cast<uint32_t>(MsgType::StatsReply))
    return static_cast<MsgType>(t);
  return std::nullopt;
}

/// Copies the payload into `out` when it is exactly a T of the right type.
template <class T>
bool decode(const std::vector<char>& payload, MsgType type, T& out) {
  if (payload.size() != sizeof(T) || message_type(payload.data(), payload.size()) != type) return false;
  std::memcpy(&out, payload.data(), sizeof(T));
  return true;
}

/// Copies `s` into a fixed NUL-terminated field (truncating) and returns the length kept.
inline uint32_t put_text(char* field, size_t cap, const std::string& s) {
  size_t n = std::min(s.size(), cap - 1);
  std::memcpy(field, s.data(), n);
  std::memset(field + n, 0, cap - n);
  return static_cast<uint32_t>(n);
}
/// Reads a fixed text field, bounded by its capacity whatever `len` says.
inline std::string get_text(const char* field, size_t cap, uint32_t len) {
  return std::string(field, std::min<size_t>(len, cap - 1));
}

inline StoreRequest make_store_request(const std::string& dir, uint64_t request_id) {
  if (dir.empty()) throw std::invalid_argument("store: empty directory");
  if (dir.size() >= kDirBytes)
    throw std::invalid_argument("store: directory path of " + std::to_string(dir.size()) +
                                " bytes is too long (at most " + std::to_string(kDirBytes - 1) + ")");
  StoreRequest r{};
  r.type = static_cast<uint32_t>(MsgType::StoreRequest);
  r.request_id = request_id;
  r.dir_len = put_text(r.dir, sizeof r.dir, dir);
  return r;
}

/// Asks memnode `node` for its CPU time over `ep` and waits for the answer (other messages that
/// arrive meanwhile are dropped). Throws fabric::FabricError when it does not answer in time.
inline StatsReply query_stats(fabric::Endpoint& ep, uint16_t node, int timeout_ms = 5000) {
  static std::atomic<uint64_t> next_id{1};  // endpoints of several threads may ask at once
  StatsRequest req{static_cast<uint32_t>(MsgType::StatsRequest), 0, next_id.fetch_add(1)};
  if (ep.send(node, &req, sizeof req) != fabric::Status::Ok)
    throw fabric::FabricError("stats: sending the request to memnode " + std::to_string(node) + " failed");
  for (;;) {
    fabric::Message m = ep.recv(timeout_ms);
    StatsReply rep;
    if (m.from_node == node && decode(m.payload, MsgType::StatsReply, rep) && rep.request_id == req.request_id)
      return rep;
  }
}

/// CPU seconds (user + system) of a stats reply.
inline double cpu_seconds(const StatsReply& r) { return static_cast<double>(r.cpu_user_us + r.cpu_system_us) / 1e6; }

}  // namespace dmhnsw::admin
