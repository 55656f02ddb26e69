#pragma once
// Persistence from the compute side: asks every memnode to write its region to a file
// (memory/admin.hpp StoreRequest); `memnode --load FILE` serves such a file again.
#include <cstdint>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/write_gate.hpp"

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
/// Alone, it does not pause writers: each memnode's image is copied while its progress thread
/// serves nothing else, but memnodes are not synchronised with each other (snapshot_index
/// pauses the writers around it). Messages on `ep` other than the replies are discarded meanwhile.
std::vector<StoreResult> store_index(fabric::Cluster& cluster, fabric::Endpoint& ep, const std::string& dir,
                                     int timeout_ms = 120000);

/// What a snapshot of a live index stored, and how long the writers were paused.
struct SnapshotResult {
  std::vector<StoreResult> images;
  PauseStats pause;
  double store_seconds = 0;  // writing the images, the writers paused throughout
};

/// A snapshot of a live index: the write gate closed (compute/write_gate.hpp: every process
/// that writes finishes the writes it started and starts no new one; searches go on), every
/// memnode's region stored as store_index does, the gate opened again. The images hold every
/// write acknowledged before this call and no half-done one; `memnode --load` serves them.
/// Waits up to `wait_ms` for the writers to pause; throws FabricError naming what failed.
SnapshotResult snapshot_index(fabric::Cluster& cluster, const std::string& dir, int wait_ms = 60000);

}  // namespace dmhnsw::compute
