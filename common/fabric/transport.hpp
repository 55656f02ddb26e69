#pragma once
// The transport API: one-sided READ/WRITE/FETCH_ADD/COMPARE_SWAP on RemotePtrs,
// small SEND/RECV messages, doorbell batches, registered buffers and counters.
// Implementations, one folder each (providers.hpp): libfabric (shm, tcp;ofi_rxm), rdma-core
// (verbs: RC queue pairs), cxl (mapped shared memory) and LocalFabric (in-process, fault
// injection, for unit tests). No libfabric or verbs type appears here.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/fabric/providers.hpp"
#include "common/fabric/remote_ptr.hpp"

namespace dmhnsw::fabric {

/// Raised on set-up errors and by the synchronous helpers when an operation fails.
class FabricError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class OpKind : uint8_t { Read = 0, Write = 1, FetchAdd = 2, CompareSwap = 3 };
const char* op_name(OpKind k);

/// One remote operation. `local` must point into a buffer from Endpoint::alloc (registered
/// memory). For atomics, `local` receives the 8-byte old value and `len` is ignored (8).
struct Op {
  OpKind kind = OpKind::Read;
  RemotePtr remote;
  void* local = nullptr;
  size_t len = 0;
  uint64_t operand = 0;  // fetch_add: addend; compare_swap: desired value
  uint64_t compare = 0;  // compare_swap: expected value
  uint64_t tag = 0;      // returned in the completion (a coroutine or request id)

  static Op read(RemotePtr src, void* dst, size_t len, uint64_t tag = 0) { return {OpKind::Read, src, dst, len, 0, 0, tag}; }
  static Op write(RemotePtr dst, const void* src, size_t len, uint64_t tag = 0) {
    return {OpKind::Write, dst, const_cast<void*>(src), len, 0, 0, tag};
  }
  static Op fetch_add(RemotePtr dst, uint64_t add, uint64_t* old, uint64_t tag = 0) {
    return {OpKind::FetchAdd, dst, old, 8, add, 0, tag};
  }
  static Op compare_swap(RemotePtr dst, uint64_t expected, uint64_t desired, uint64_t* old, uint64_t tag = 0) {
    return {OpKind::CompareSwap, dst, old, 8, desired, expected, tag};
  }
};

enum class Status : uint8_t {
  Ok = 0,
  PeerDead,         // the memory node is gone (control connection lost or fabric error)
  OutOfBounds,      // the remote range is outside the node's region
  BadLocalBuffer,   // `local` is not inside a registered buffer of this endpoint
  UnknownNode,      // no memory node with that id
  RemoteError,      // the provider reported an error completion
  Misaligned,       // an atomic on a remote address that is not 8-byte aligned
};
const char* status_name(Status s);

struct Completion {
  uint64_t tag = 0;
  Status status = Status::Ok;
  OpKind kind = OpKind::Read;
  uint16_t node = 0;
};

/// Per-endpoint counters (one endpoint per thread, so plain integers).
struct Counters {
  uint64_t ops[4] = {0, 0, 0, 0};  // by OpKind
  uint64_t doorbells = 0;          // post() calls that reached the provider
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t msgs_sent = 0;
  uint64_t msgs_received = 0;
  uint64_t eagain_retries = 0;
  Counters& operator+=(const Counters& o);
  uint64_t total_ops() const { return ops[0] + ops[1] + ops[2] + ops[3]; }
};

/// A registered local buffer handed out by an endpoint's pool (RAII: returns on destruction).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  void reset();

  char* data() const { return data_; }
  size_t size() const { return size_; }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(data_); }

 private:
  friend class BufferPool;
  class BufferPool* pool_ = nullptr;
  char* data_ = nullptr;
  size_t size_ = 0;
  unsigned cls_ = 0;
};

/// Size-class allocator over one contiguous arena (registered once by the endpoint).
class BufferPool {
 public:
  explicit BufferPool(size_t arena_bytes);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  Buffer alloc(size_t bytes);  // throws FabricError when the arena is exhausted
  bool contains(const void* p, size_t len) const {
    auto c = static_cast<const char*>(p);
    return c >= arena_ && len <= arena_bytes_ && c - arena_ <= static_cast<ptrdiff_t>(arena_bytes_ - len);
  }
  char* arena() const { return arena_; }
  size_t arena_bytes() const { return arena_bytes_; }
  /// On reserved 2 MiB hugepages (common/fabric/pages.hpp).
  bool on_hugepages() const { return huge_; }

 private:
  friend class Buffer;
  void release(char* p, unsigned cls);
  char* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  size_t mapped_bytes_ = 0;
  bool huge_ = false;
  size_t bump_ = 0;
  std::vector<std::vector<char*>> free_;  // by size class (64 B << cls)
};

/// A small message (SEND/RECV). Carried payload is at most kMaxMessage bytes.
inline constexpr size_t kMaxMessage = 4096 - 16 - 128;
struct Message {
  uint16_t from_node = 0;   // sender: memnode id, or 0xffff for a computenode
  uint32_t from_cn = 0;     // sender computenode id (when from a computenode)
  uint64_t sender = 0;      // memory side: handle of the sending endpoint, for RegionServer::send_to
  std::vector<char> payload;
};

class WireEndpoint;  // common/fabric/wire.cpp: a decorator that hands out its inner endpoint's pool
class ReplicatedEndpoint;  // common/fabric/replicas.cpp: likewise

/// One endpoint with its completion queue and registered buffer pool. Not thread-safe:
/// one per worker thread.
class Endpoint {
  friend class WireEndpoint;
  friend class ReplicatedEndpoint;

 public:
  virtual ~Endpoint() = default;

  Buffer alloc(size_t bytes) { return pool().alloc(bytes); }

  /// Posts the operations with one doorbell (FI_MORE on all but the last). Returns Ok, or
  /// the first synchronous error (nothing of the batch is posted then). Completions arrive
  /// through poll(), one per op.
  virtual Status post(std::span<const Op> ops) = 0;
  Status post(const Op& op) { return post(std::span<const Op>(&op, 1)); }

  /// Drives progress and returns up to out.size() completions without blocking.
  size_t poll(std::span<Completion> out);

  /// Number of posted operations whose completion was not yet returned by poll().
  size_t in_flight() const { return in_flight_impl() + stash_.size(); }

  /// Human-readable cause of a failed completion (names the memory node).
  virtual std::string describe(const Completion& c) const;

  /// Where the provider maps the memnodes' regions into this process (cxl; LocalFabric without
  /// injected delays or failures): the `len` bytes at `at` as they lie, to be read in place
  /// instead of copied by a READ; null where they are not mapped here, out of bounds, or the
  /// memnode is dead (a READ then reports it). Decorators that model or replicate remote access
  /// (the wire model, replica sets) keep the default. Writers change these bytes at any time,
  /// as under a READ: whoever reads them checks what it reads.
  virtual const char* mapped(RemotePtr at, size_t len) const {
    (void)at;
    (void)len;
    return nullptr;
  }

  // --- messages to/from memory nodes ---
  virtual Status send(uint16_t node, const void* data, size_t len) = 0;
  virtual bool try_recv(Message& out) = 0;

  const Counters& counters() const { return counters_; }
  void reset_counters() { counters_ = Counters{}; }

  // --- synchronous helpers: post, wait, throw FabricError naming the node on failure ---
  /// Reads into any memory (bounce buffer when `dst` is not registered).
  void read(RemotePtr src, void* dst, size_t len);
  void write(RemotePtr dst, const void* src, size_t len);
  uint64_t fetch_add(RemotePtr dst, uint64_t add);
  uint64_t compare_swap(RemotePtr dst, uint64_t expected, uint64_t desired);
  /// Sets a word that atomics also touch to `value` by COMPARE_SWAPs from `guess` (its
  /// expected value) and returns the value it replaced. Never a WRITE: RDMA does not make a
  /// WRITE atomic against another queue pair's atomics (soft-RoCE writes back the old value of
  /// a failed COMPARE_SWAP, undoing a WRITE that landed meanwhile).
  uint64_t atomic_store(RemotePtr dst, uint64_t value, uint64_t guess = 0);
  /// Waits for every completion of `ops` (already posted with unique tags) and throws on
  /// the first failure; completions of other tags are kept for later poll() calls.
  Completion wait_tag(uint64_t tag);
  /// Polls until `n` completions arrived; throws FabricError on the first failed one.
  void wait_all(size_t n);
  /// Blocks until a message arrives or `timeout_ms` passes (throws on timeout).
  Message recv(int timeout_ms);

 protected:
  virtual BufferPool& pool() = 0;
  virtual size_t poll_impl(std::span<Completion> out) = 0;
  virtual size_t in_flight_impl() const = 0;
  /// Node name for error messages, e.g. "memnode 1 (10.0.0.2:7000)".
  virtual std::string node_name(uint16_t node) const;
  void fail_on(const Completion& c) const;
  Counters counters_;
  std::vector<Completion> stash_;  // completions seen by wait_tag() for other tags
  uint64_t next_sync_tag_ = uint64_t{1} << 63;
};

inline constexpr size_t kMaxRmaLanes = 64;  // memnode --rma-lanes; checked in the welcome
inline constexpr size_t kHeaderBlobBytes = 512;  // common/region.hpp pins RegionHeader to this
inline constexpr unsigned kMaxCopies = 8;          // memnode --replicas

/// What a compute node knows of one memory node.
struct MemnodeInfo {
  uint16_t id = 0;
  std::string address;  // "host:port" of its control port, for messages
  uint64_t region_size = 0;
  std::array<char, kHeaderBlobBytes> header{};  // region header as served at connect time
  uint8_t copy = 0, copies = 1;                  // its place in its replica set (docs/replication.md)
  bool joining = false;                          // a new copy not filled yet (memnode --rejoin)
};

/// The compute-side view of the cluster: every memory node, liveness, endpoint factory.
class Cluster {
 public:
  virtual ~Cluster() = default;
  virtual Provider provider() const = 0;
  virtual const std::vector<MemnodeInfo>& memnodes() const = 0;
  /// A new endpoint for the calling thread, with a registered pool of `pool_bytes`.
  virtual std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes = 64u << 20) = 0;
  /// False once the memory node is known to be gone; dead_reason() says why.
  virtual bool alive(uint16_t node) const = 0;
  virtual std::string dead_reason(uint16_t node) const = 0;
  /// From now on the memory node is dead to this computenode: its operations fail with
  /// PeerDead (a replica set fences a copy that failed an operation). Default: nothing.
  virtual void declare_dead(uint16_t node, const std::string& why) {
    (void)node;
    (void)why;
  }
  /// The NUMA node of the NIC this computenode reaches the memnodes through (worker threads
  /// are pinned near it first); -1 when unknown or there is none (shm, tcp, cxl).
  virtual int nic_numa_node() const { return -1; }
};

}  // namespace dmhnsw::fabric
