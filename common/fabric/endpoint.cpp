// Provider-independent parts of the transport: buffer pool, counters, synchronous helpers.
#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <bit>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "common/fabric/pages.hpp"
#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::Read: return "READ";
    case OpKind::Write: return "WRITE";
    case OpKind::FetchAdd: return "FETCH_ADD";
    case OpKind::CompareSwap: return "COMPARE_SWAP";
  }
  return "?";
}

const char* status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::PeerDead: return "memory node unreachable";
    case Status::OutOfBounds: return "remote range outside the region";
    case Status::BadLocalBuffer: return "local buffer not registered with this endpoint";
    case Status::UnknownNode: return "unknown memory node";
    case Status::RemoteError: return "error completion";
    case Status::Misaligned: return "atomic on a remote address not 8-byte aligned";
  }
  return "?";
}

Counters& Counters::operator+=(const Counters& o) {
  for (int i = 0; i < 4; ++i) ops[i] += o.ops[i];
  doorbells += o.doorbells;
  bytes_read += o.bytes_read;
  bytes_written += o.bytes_written;
  msgs_sent += o.msgs_sent;
  msgs_received += o.msgs_received;
  eagain_retries += o.eagain_retries;
  return *this;
}

// ---------------------------------------------------------------- buffers
namespace {
constexpr size_t kMinClassBytes = 64;
unsigned size_class(size_t bytes) {
  size_t b = std::max(bytes, kMinClassBytes);
  return static_cast<unsigned>(std::bit_width(std::bit_ceil(b)) - std::bit_width(kMinClassBytes));
}
}  // namespace

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = std::exchange(o.pool_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    cls_ = o.cls_;
  }
  return *this;
}

void Buffer::reset() {
  if (pool_ != nullptr) pool_->release(data_, cls_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

BufferPool::BufferPool(size_t arena_bytes) : arena_bytes_(arena_bytes), mapped_bytes_(arena_bytes) {
  constexpr size_t kHuge = 2u << 20;
  const PoolPages pages = pool_pages();
  void* p = MAP_FAILED;
  const size_t huge_bytes = (arena_bytes + kHuge - 1) / kHuge * kHuge;
  // Reserved hugepages are taken only when enough are free: a memnode on this host sized its
  // reservation for its region, and an endpoint's pool is not worth a failed mapping there.
  if (pages == PoolPages::Huge || (pages == PoolPages::Auto && free_hugepage_bytes() >= huge_bytes)) {
    p = ::mmap(nullptr, huge_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
      mapped_bytes_ = huge_bytes;
      huge_ = true;
    } else if (static std::atomic<bool> warned{false}; pages == PoolPages::Huge && !warned.exchange(true)) {
      spdlog::warn("--hugepages: cannot map a {}-byte buffer pool on 2 MiB hugepages ({}); normal pages instead "
                   "(reserve some with: echo N > /proc/sys/vm/nr_hugepages)",
                   huge_bytes, std::strerror(errno));
    }
  }
  if (p == MAP_FAILED) {
    p = ::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw FabricError("buffer pool: cannot map " + std::to_string(arena_bytes) + " bytes");
    if (pages != PoolPages::Normal) ::madvise(p, arena_bytes, MADV_HUGEPAGE);  // transparent hugepages, best effort
  }
  arena_ = static_cast<char*>(p);
  count_pool(huge_);
  free_.resize(48);
}

BufferPool::~BufferPool() { ::munmap(arena_, mapped_bytes_); }

Buffer BufferPool::alloc(size_t bytes) {
  unsigned cls = size_class(bytes);
  size_t cls_bytes = kMinClassBytes << cls;
  Buffer b;
  if (!free_[cls].empty()) {
    b.data_ = free_[cls].back();
    free_[cls].pop_back();
  } else {
    // Align every block to min(class size, 4 KiB) so large buffers are page aligned.
    size_t align = std::min<size_t>(cls_bytes, 4096);
    size_t start = (bump_ + align - 1) / align * align;
    if (start + cls_bytes > arena_bytes_)
      throw FabricError("registered buffer pool exhausted: asked for " + std::to_string(bytes) + " bytes, pool has " +
                        std::to_string(arena_bytes_ - std::min(start, arena_bytes_)) + " of " +
                        std::to_string(arena_bytes_) + " left (raise the endpoint pool size)");
    b.data_ = arena_ + start;
    bump_ = start + cls_bytes;
  }
  b.pool_ = this;
  b.size_ = bytes;
  b.cls_ = cls;
  return b;
}

void BufferPool::release(char* p, unsigned cls) { free_[cls].push_back(p); }

// ---------------------------------------------------------------- endpoint helpers
std::string Endpoint::node_name(uint16_t node) const { return "memnode " + std::to_string(node); }

std::string Endpoint::describe(const Completion& c) const {
  return std::string(op_name(c.kind)) + " on " + node_name(c.node) + " failed: " + status_name(c.status);
}

void Endpoint::fail_on(const Completion& c) const {
  if (c.status != Status::Ok) throw FabricError(describe(c));
}

size_t Endpoint::poll(std::span<Completion> out) {
  size_t n = 0;
  if (!stash_.empty()) {
    n = std::min(out.size(), stash_.size());
    std::copy_n(stash_.begin(), n, out.begin());
    stash_.erase(stash_.begin(), stash_.begin() + static_cast<ptrdiff_t>(n));
  }
  return n + poll_impl(out.subspan(n));
}

Completion Endpoint::wait_tag(uint64_t tag) {
  for (auto it = stash_.begin(); it != stash_.end(); ++it) {
    if (it->tag == tag) {
      Completion c = *it;
      stash_.erase(it);
      return c;
    }
  }
  std::array<Completion, 16> buf;
  for (;;) {
    size_t n = poll_impl(buf);
    std::optional<Completion> found;
    for (size_t i = 0; i < n; ++i) {
      if (!found && buf[i].tag == tag)
        found = buf[i];
      else
        stash_.push_back(buf[i]);
    }
    if (found) return *found;
  }
}

void Endpoint::wait_all(size_t n) {
  std::array<Completion, 64> out;
  for (size_t got = 0; got < n;) {
    size_t k = poll(std::span<Completion>(out.data(), std::min(out.size(), n - got)));
    for (size_t i = 0; i < k; ++i) fail_on(out[i]);
    got += k;
  }
}

void Endpoint::read(RemotePtr src, void* dst, size_t len) {
  uint64_t tag = next_sync_tag_++;
  if (pool().contains(dst, len)) {
    Status s = post(Op::read(src, dst, len, tag));
    if (s != Status::Ok) fail_on({tag, s, OpKind::Read, src.node()});
    fail_on(wait_tag(tag));
    return;
  }
  Buffer b = alloc(len);
  Status s = post(Op::read(src, b.data(), len, tag));
  if (s != Status::Ok) fail_on({tag, s, OpKind::Read, src.node()});
  fail_on(wait_tag(tag));
  std::memcpy(dst, b.data(), len);
}

void Endpoint::write(RemotePtr dst, const void* src, size_t len) {
  uint64_t tag = next_sync_tag_++;
  Buffer b;
  const void* from = src;
  if (!pool().contains(src, len)) {
    b = alloc(len);
    std::memcpy(b.data(), src, len);
    from = b.data();
  }
  Status s = post(Op::write(dst, from, len, tag));
  if (s != Status::Ok) fail_on({tag, s, OpKind::Write, dst.node()});
  fail_on(wait_tag(tag));
}

uint64_t Endpoint::fetch_add(RemotePtr dst, uint64_t add) {
  uint64_t tag = next_sync_tag_++;
  Buffer b = alloc(8);
  Status s = post(Op::fetch_add(dst, add, b.as<uint64_t>(), tag));
  if (s != Status::Ok) fail_on({tag, s, OpKind::FetchAdd, dst.node()});
  fail_on(wait_tag(tag));
  return *b.as<uint64_t>();
}

uint64_t Endpoint::compare_swap(RemotePtr dst, uint64_t expected, uint64_t desired) {
  uint64_t tag = next_sync_tag_++;
  Buffer b = alloc(8);
  Status s = post(Op::compare_swap(dst, expected, desired, b.as<uint64_t>(), tag));
  if (s != Status::Ok) fail_on({tag, s, OpKind::CompareSwap, dst.node()});
  fail_on(wait_tag(tag));
  return *b.as<uint64_t>();
}

uint64_t Endpoint::atomic_store(RemotePtr dst, uint64_t value, uint64_t guess) {
  for (;;) {
    const uint64_t seen = compare_swap(dst, guess, value);
    if (seen == guess) return seen;
    guess = seen;
  }
}

Message Endpoint::recv(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  Message m;
  std::array<Completion, 16> buf;
  while (!try_recv(m)) {
    size_t n = poll_impl(buf);  // drive progress; keep op completions for later
    stash_.insert(stash_.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
    if (std::chrono::steady_clock::now() > deadline)
      throw FabricError("no message arrived within " + std::to_string(timeout_ms) + " ms");
  }
  return m;
}

}  // namespace dmhnsw::fabric
