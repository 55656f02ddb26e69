#pragma once
// Replica sets over any provider (docs/replication.md). The index's address space stays a set
// of logical memnodes: a RemotePtr names memnode L. Each is served by R physical memnodes with
// identical regions (memnode --replicas R --copy C), physical node L * R + C of the cluster
// underneath. The decorator turns each operation on L into operations on its live copies:
//
// - READ: one live copy, in turn (reads spread over the copies); a copy that fails it is
//   fenced and the READ goes to the next live copy at once, so the caller never sees it.
// - WRITE: every live copy, posted together (one doorbell); complete when all answered.
// - FETCH_ADD, COMPARE_SWAP: on the set's primary (its lowest live copy), which orders them;
//   then the primary's result is applied to the other copies (a FETCH_ADD of the same addend;
//   a successful COMPARE_SWAP as the same transition, retried until the copy holds its
//   expected value, so copies take transitions in the primary's order); complete when all did.
//
// A copy fails an operation or misses heartbeats: it is declared dead in the cluster
// underneath (fenced: never read or written again by this computenode) and its set goes on
// with the rest. A set with no live copy fails its operations with PeerDead naming every copy.
#include <memory>

#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric {

/// `physical` holds copies * N memnodes, copy c of memnode L at index L * copies + c; returns
/// the N logical memnodes over it (`physical` itself when copies == 1). Throws FabricError when
/// the copies of a set differ in region size.
/// `cn_id`: this computenode's id, under which it acknowledges the steps of a rejoin.
std::shared_ptr<Cluster> with_replicas(std::shared_ptr<Cluster> physical, unsigned copies, uint32_t cn_id = 0);
/// An endpoint whose operations a rejoin's freeze never holds (the rejoin protocol's own).
std::unique_ptr<Endpoint> make_control_endpoint(Cluster& c, size_t pool_bytes = 1u << 20);

/// The cluster under a with_replicas() one and its copies, for decorators that belong under it
/// (the wire model charges each copy's link); nullptr when `c` is not replicated.
std::shared_ptr<Cluster> replicas_physical(const Cluster& c, unsigned* copies = nullptr, uint32_t* cn_id = nullptr);

/// Per-set state for reports and tests: copies alive, primary, failovers seen.
struct ReplicaView {
  unsigned copies = 1;
  std::vector<std::vector<bool>> live;  // [set][copy]
  uint64_t failovers = 0;               // copies this computenode has seen die
  uint64_t read_retries = 0;            // READs that went to another copy after one failed
  uint64_t rejoins = 0;                 // copies that joined their set while this computenode ran
};
/// The view of a with_replicas() cluster (one set per memnode, all live, when not replicated).
ReplicaView replica_view(const Cluster& c);
/// ReplicaView::failovers alone (0 when not replicated), cheap enough for a wait loop.
uint64_t replica_failovers(const Cluster& c);

}  // namespace dmhnsw::fabric
