#pragma once
// d-HNSW's epoch-based online rebuild (paper section 4.5, Figure 10): the rebuild master's
// steps. The protocol's other parts each have their unit in compute/dhnsw/:
//   control.hpp           the control block: layout, phases, its reads and writes;
//   mastership.hpp        the master word and its lease;
//   insert_buffer.hpp     the shared insert buffer (append, read, search);
//   rebuild_snapshot.hpp  what the master reads of the live epoch, and the deletes it carries;
//   epoch_watcher.hpp     a query engine's view of the epoch and its acknowledgements.
//
// The rebuild master (the inserter whose commit did not fit, or `computenode --mode dhnsw
// rebuild`):
//   1. takes the master word; sets the buffer's buckets active and the phase to kBuilding, so
//      that every insert from now on goes to the buffer (inserters read the phase under their
//      group lock, and the master reads each group under its lock: nothing is missed);
//   2. reads every sub-HNSW, re-partitions all vectors (balanced k-means) and builds the
//      sub-HNSWs and the meta-HNSW into a shadow area of the regions (a free range at the same
//      offset on every memnode: after the live epoch, or before it); deletes meanwhile mark the
//      live epoch in place and are acknowledged at once: the master closes deletes, reads each
//      group's labels again under its lock and deletes in the shadow what its snapshot missed;
//   3. publishes: the memnodes' region headers (memnode 0 last), then the control block's epoch
//      and phase kPublished;
//   4. freezes the buffer's buckets, merges their entries into the new epoch with in-place
//      inserts, empties the buffer (phase kIdle);
//   5. frees the old area once every live computenode acknowledged the new epoch (at once if
//      they did, else the next rebuild waits for it before it needs the room).
// A master killed before 3 leaves the old epoch serving and the buffer intact: the next master
// starts over. Killed after 3, the next master only merges (4) and frees (5).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fabric/transport.hpp"
#include "compute/dhnsw/control.hpp"

namespace dmhnsw::dhnsw {

struct RebuildOptions {
  uint32_t lease_ms = 5000;  // a master word unchanged this long is taken over
  uint32_t threads = 0;      // build threads (0: every core)
  uint32_t ack_timeout_ms = 10000;  // an ack slot unchanged this long is not waited for
  /// Another master's word: watch it (taking it over when it stays unchanged for a lease)
  /// instead of returning "skipped" at once.
  bool wait_for_master = true;
  /// For the tests: called once the shadow area is written, and once the deletes are carried
  /// into it (deletes closed) before it is published.
  std::function<void()> on_snapshot_written, on_deletes_closed;
};

/// Runs a rebuild as master (or finishes a published one). Returns its report, or a report with
/// "skipped" when another computenode is the master (the caller waits for the epoch to move).
nlohmann::json run_rebuild(fabric::Cluster& c, fabric::Endpoint& ep, uint32_t cn_id, const RebuildOptions& o);

}  // namespace dmhnsw::dhnsw
