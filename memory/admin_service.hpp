#pragma once
// The memnode side of the admin messages (memory/admin.hpp): runs in the memnode's progress
// thread through RegionServer's message handler.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dmhnsw::memory {

/// If `payload` is an admin request, performs it on the region and returns the reply payload;
/// nullopt when it is not an admin message (the caller keeps its default: echo).
/// StoreRequest: writes region bytes [0, region_used_bytes(header)) to DIR/memnode-<id>.img
/// (DIR created if missing) with write_image, only where the memnode's operator allowed:
/// DIR must lie inside `store_dir` (a relative DIR is taken from there); an empty `store_dir`
/// refuses every store. Failures are reported in the reply, not thrown.
/// StatsRequest: the process's CPU time and `messages_served`.
std::optional<std::vector<char>> handle_admin(const std::vector<char>& payload, const char* region,
                                              uint64_t region_size, uint16_t memnode_id,
                                              uint64_t messages_served = 0, const std::string& store_dir = "");

}  // namespace dmhnsw::memory
