// The compute side of `--provider cxl` (common/fabric/cxl/cxl.hpp): each memnode's region mapped
// from the fd it hands over; READ and WRITE are memory copies, FETCH_ADD and COMPARE_SWAP
// atomic instructions on the mapping; completions keep the semantics of the other providers.
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>

#include "common/fabric/control_cluster.hpp"
#include "common/fabric/cxl/cxl.hpp"

namespace dmhnsw::fabric {

namespace {

class CxlCluster;

class CxlEndpoint final : public Endpoint {
 public:
  CxlEndpoint(std::shared_ptr<CxlCluster> c, size_t pool_bytes);
  ~CxlEndpoint() override {
    for (int fd : socks_)
      if (fd >= 0) ::close(fd);
  }
  Status post(std::span<const Op> ops) override;
  const char* mapped(RemotePtr at, size_t len) const override;
  Status send(uint16_t node, const void* data, size_t len) override;
  bool try_recv(Message& out) override;

 protected:
  BufferPool& pool() override { return pool_; }
  size_t poll_impl(std::span<Completion> out) override {
    size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return n;
  }
  size_t in_flight_impl() const override { return done_.size(); }
  std::string node_name(uint16_t node) const override;

 private:
  int sock(uint16_t node);
  std::shared_ptr<CxlCluster> c_;
  BufferPool pool_;
  std::deque<Completion> done_;
  std::vector<int> socks_;
  std::vector<std::vector<char>> inbufs_;
  std::vector<uint64_t> gens_;  // PeerState::generation the sockets are of
};

class CxlCluster final : public ControlledCluster, public std::enable_shared_from_this<CxlCluster> {
 public:
  explicit CxlCluster(const ClusterOptions& o) : ControlledCluster(o) {
    std::random_device rd;
    for (auto& b : nonce_) b = static_cast<uint8_t>(rd());
  }
  ~CxlCluster() override {
    stop_monitor();
    for (auto& m : maps_)
      if (m.base != nullptr) ::munmap(m.base, m.size);
  }

  void connect() {
    connect_all([&](ControlClient&) { return std::vector<char>(nonce_, nonce_ + cxl::kNonceBytes); });
    maps_.resize(num_peers());
    for (uint16_t i = 0; i < num_peers(); ++i) {
      if (!alive(i)) continue;  // a copy of a replica set dead when we joined: never mapped
      int fd = open_socket(i, true, &maps_[i].size);
      int region_fd = fd_;
      fd_ = -1;
      ::close(fd);
      void* p = ::mmap(nullptr, maps_[i].size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, region_fd, 0);
      ::close(region_fd);
      if (p == MAP_FAILED)
        throw FabricError("cxl: cannot map the region of " + node_name(i) + ": " + std::strerror(errno));
      maps_[i].base = static_cast<char*>(p);
    }
  }

  /// A socket to memnode i that passed its hello; with want_fd, the region's fd lands in fd_.
  int open_socket(uint16_t i, bool want_fd, uint64_t* size_out) {
    const std::string name(peer(i).fabric_addr.begin(), peer(i).fabric_addr.end());
    const int s = cxl::connect_abstract(name);
    if (s < 0)
      throw FabricError("cxl: cannot reach the shared memory of " + node_name(i) + " (" + std::strerror(errno) +
                        "): --provider cxl needs the computenode on the memnode's host, sharing its memory "
                        "device; across hosts use --provider tcp or verbs");
    cxl::Hello h{cxl::kHelloMagic, cn_id(), {}, static_cast<uint8_t>(want_fd ? 1 : 0), {}};
    std::memcpy(h.nonce, nonce_, sizeof nonce_);
    cxl::Accept a{};
    int fd = -1;
    const bool ok = cxl::write_all(s, &h, sizeof h) &&
                    (want_fd ? cxl::recv_with_fd(s, &a, sizeof a, &fd, 5000) : cxl::read_all(s, &a, sizeof a, 5000));
    if (!ok || a.magic != cxl::kHelloMagic || a.ok != 1 || (want_fd && fd < 0)) {
      ::close(s);
      if (fd >= 0) ::close(fd);
      throw FabricError("cxl: " + node_name(i) + " refused or did not answer the shared memory handshake");
    }
    if (want_fd) fd_ = fd;
    if (size_out) *size_out = a.region_size;
    return s;
  }

  std::unique_ptr<Endpoint> make_endpoint(size_t pool_bytes) override {
    return std::make_unique<CxlEndpoint>(shared_from_this(), pool_bytes);
  }

  /// A new memnode took a dead copy's place: map its region. The old mapping stays (an
  /// endpoint may still be inside a copy that began before the death); one per replacement.
  void on_revived(uint16_t i) override {
    uint64_t size = 0;
    ::close(open_socket(i, true, &size));
    const int region_fd = fd_;
    fd_ = -1;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, region_fd, 0);
    ::close(region_fd);
    if (p == MAP_FAILED) throw FabricError("cxl: cannot map the region of " + node_name(i) + ": " + std::strerror(errno));
    maps_[i].size = size;
    maps_[i].base = static_cast<char*>(p);
  }

  struct Map {
    char* base = nullptr;
    uint64_t size = 0;
  };
  std::vector<Map> maps_;

 private:
  uint8_t nonce_[cxl::kNonceBytes];
  int fd_ = -1;
};

CxlEndpoint::CxlEndpoint(std::shared_ptr<CxlCluster> c, size_t pool_bytes)
    : c_(std::move(c)), pool_(pool_bytes), socks_(c_->num_peers(), -1), inbufs_(c_->num_peers()),
      gens_(c_->num_peers(), 0) {}

std::string CxlEndpoint::node_name(uint16_t node) const { return c_->node_name(node); }

Status CxlEndpoint::post(std::span<const Op> ops) {
  for (const Op& op : ops) {  // all checks first: an error posts nothing
    const uint16_t node = op.remote.node();
    if (node >= c_->maps_.size()) return Status::UnknownNode;
    if (!c_->alive(node)) return Status::PeerDead;
    const size_t len = op.kind == OpKind::Read || op.kind == OpKind::Write ? op.len : 8;
    const uint64_t off = op.remote.offset(), size = c_->maps_[node].size;
    if (off > size || len > size - off) return Status::OutOfBounds;
    if ((op.kind == OpKind::FetchAdd || op.kind == OpKind::CompareSwap) && off % 8 != 0) return Status::Misaligned;
    if (!pool_.contains(op.local, len)) return Status::BadLocalBuffer;
  }
  ++counters_.doorbells;
  for (const Op& op : ops) {
    char* p = c_->maps_[op.remote.node()].base + op.remote.offset();
    switch (op.kind) {
      case OpKind::Read:
        std::memcpy(op.local, p, op.len);
        counters_.bytes_read += op.len;
        break;
      case OpKind::Write:
        std::memcpy(p, op.local, op.len);
        counters_.bytes_written += op.len;
        break;
      case OpKind::FetchAdd:
        *static_cast<uint64_t*>(op.local) =
            __atomic_fetch_add(reinterpret_cast<uint64_t*>(p), op.operand, __ATOMIC_SEQ_CST);
        break;
      case OpKind::CompareSwap: {
        uint64_t expected = op.compare;
        __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(p), &expected, op.operand, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
        *static_cast<uint64_t*>(op.local) = expected;  // the old value either way
        break;
      }
    }
    ++counters_.ops[static_cast<size_t>(op.kind)];
    done_.push_back({op.tag, Status::Ok, op.kind, op.remote.node()});
  }
  return Status::Ok;
}

const char* CxlEndpoint::mapped(RemotePtr at, size_t len) const {
  const uint16_t node = at.node();
  if (node >= c_->maps_.size() || !c_->alive(node)) return nullptr;
  const uint64_t off = at.offset(), size = c_->maps_[node].size;
  if (off > size || len > size - off) return nullptr;
  return c_->maps_[node].base + off;
}

int CxlEndpoint::sock(uint16_t node) {
  if (const uint64_t g = c_->peer(node).generation.load(); g != gens_.at(node)) {  // a new memnode there
    if (socks_[node] >= 0) ::close(socks_[node]);
    socks_[node] = -1;
    inbufs_[node].clear();
    gens_[node] = g;
  }
  if (socks_.at(node) < 0) socks_[node] = c_->open_socket(node, false, nullptr);
  return socks_[node];
}

Status CxlEndpoint::send(uint16_t node, const void* data, size_t len) {
  if (node >= socks_.size()) return Status::UnknownNode;
  if (!c_->alive(node)) return Status::PeerDead;
  if (len > cxl::kMaxFrame) return Status::OutOfBounds;
  const int s = sock(node);
  const uint32_t n = static_cast<uint32_t>(len);
  std::vector<char> f(reinterpret_cast<const char*>(&n), reinterpret_cast<const char*>(&n) + 4);
  f.insert(f.end(), static_cast<const char*>(data), static_cast<const char*>(data) + len);
  // While the memnode's socket is full, take in what it sends us (it may be writing to us in
  // turn), so neither side waits for the other.
  size_t at = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (at < f.size()) {
    const ssize_t w = ::send(s, f.data() + at, f.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      at += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Status::PeerDead;
    if (!c_->alive(node) || std::chrono::steady_clock::now() > give_up) return Status::PeerDead;
    char buf[65536];
    for (;;) {
      const ssize_t r = ::recv(s, buf, sizeof buf, MSG_DONTWAIT);
      if (r <= 0) break;
      inbufs_[node].insert(inbufs_[node].end(), buf, buf + r);
    }
    pollfd pf{s, static_cast<short>(POLLOUT | POLLIN), 0};
    ::poll(&pf, 1, 10);
  }
  ++counters_.msgs_sent;
  return Status::Ok;
}

bool CxlEndpoint::try_recv(Message& out) {
  for (uint16_t node = 0; node < socks_.size(); ++node) {
    if (socks_[node] < 0) continue;
    std::vector<char>& in = inbufs_[node];
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(socks_[node], buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      in.insert(in.end(), buf, buf + n);
    }
    if (in.size() < 4) continue;
    uint32_t len;
    std::memcpy(&len, in.data(), 4);
    if (in.size() - 4 < len) continue;
    out = Message{};
    out.from_node = node;
    out.payload.assign(in.begin() + 4, in.begin() + 4 + len);
    in.erase(in.begin(), in.begin() + 4 + len);
    ++counters_.msgs_received;
    return true;
  }
  return false;
}

}  // namespace

std::shared_ptr<Cluster> connect_cxl_cluster(const ClusterOptions& opts) {
  auto c = std::make_shared<CxlCluster>(opts);
  c->connect();
  return c;
}

}  // namespace dmhnsw::fabric
