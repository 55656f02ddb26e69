#pragma once
// Persistence from the compute side: asks every memnode to write its region to a file
// (memory/admin.hpp StoreRequest); `memnode --load FILE` serves such a file again.
#include <cstdint>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::compute {

/// What one memnode wrote.
struct StoreResult {
  uint16_t memnode_id = 0;
  std::string path;         // absolute path of the image on the memnode's host
  uint64_t file_bytes = 0;  // image header + body
  uint64_t used_bytes = 0;  // region bytes in the image
  uint64_t checksum = 0;    // body checksum stored in the image
};

/// Sends a StoreRequest for `dir` to every memnode (each writes DIR/memnode-<id>.img, creating
/// DIR on its own host; a relative DIR is resolved against the memnode's working directory),
/// then waits for every reply: at most `timeout_ms`, and within about the liveness timeout
/// (~3 s) when a memnode dies. Prints one line per memnode (path, bytes, checksum) on stdout.
/// Throws fabric::FabricError naming the memnode when one fails, dies or does not answer.
/// Store an index while it is quiescent (no inserts in flight): each memnode's image is
/// copied while its progress thread serves nothing else, but memnodes are not synchronised
/// with each other. Messages on `ep` other than the replies are discarded meanwhile.
std::vector<StoreResult> store_index(fabric::Cluster& cluster, fabric::Endpoint& ep, const std::string& dir,
                                     int timeout_ms = 120000);

}  // namespace dmhnsw::compute
