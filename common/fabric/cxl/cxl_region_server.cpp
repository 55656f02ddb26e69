// The memory side of `--provider cxl` (common/fabric/cxl/cxl.hpp): a Unix socket that hands the
// region's fd to joined computenodes and carries their messages. One-sided operations never
// reach this process.
#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "common/fabric/cxl/cxl.hpp"
#include "common/fabric/region_backend.hpp"

namespace dmhnsw::fabric {

namespace cxl {

bool write_all(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      if (::poll(&pf, 1, 2000) <= 0) return false;  // a client that reads nothing delays nobody for long
      continue;
    }
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t len, int timeout_ms) {
  char* p = static_cast<char*>(data);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (len > 0) {
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count());
    if (left <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, left) <= 0) return false;
    const ssize_t n = ::recv(fd, p, len, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool send_with_fd(int sock, const void* data, size_t len, int pass_fd) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  return ::sendmsg(sock, &m, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

bool recv_with_fd(int sock, void* data, size_t len, int* fd_out, int timeout_ms) {
  *fd_out = -1;
  pollfd pf{sock, POLLIN, 0};
  if (::poll(&pf, 1, timeout_ms) <= 0) return false;
  iovec iov{data, len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  const ssize_t n = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  if (n <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(fd_out, CMSG_DATA(c), sizeof(int));
  if (static_cast<size_t>(n) < len)
    return read_all(sock, static_cast<char*>(data) + n, len - static_cast<size_t>(n), timeout_ms);
  return true;
}

int connect_abstract(const std::string& name) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof a.sun_path) {
    ::close(s);
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(s, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    const int e = errno;
    ::close(s);
    errno = e;
    return -1;
  }
  return s;
}

}  // namespace cxl

namespace {

class CxlRegionServer final : public RegionBackend {
 public:
  CxlRegionServer(uint64_t size, uint16_t id, int region_fd) : size_(size), id_(id), region_fd_(region_fd) {
    if (region_fd < 0)
      throw FabricError("--provider cxl: the region is not a shared memory object (internal: no fd)");
    std::random_device rd;
    char name[64];
    std::snprintf(name, sizeof name, "dmhnsw-cxl-%d-%u-%08x%08x", static_cast<int>(::getpid()), unsigned{id}, rd(), rd());
    name_ = name;
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name_.data(), name_.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name_.size());
    if (listen_ < 0 || ::bind(listen_, reinterpret_cast<const sockaddr*>(&a), len) != 0 || ::listen(listen_, 128) != 0)
      throw FabricError(std::string("--provider cxl: cannot listen on a Unix socket: ") + std::strerror(errno));
  }
  ~CxlRegionServer() override {
    for (auto& [id, c] : conns_) ::close(c.fd);
    if (listen_ >= 0) ::close(listen_);
  }

  std::vector<char> fabric_address() const override { return std::vector<char>(name_.begin(), name_.end()); }
  std::vector<std::vector<char>> rma_lane_addresses() const override { return {}; }
  uint64_t remote_base() const override { return 0; }
  uint64_t key() const override { return 0; }
  std::string describe() const override { return "cxl (shared memory object, socket @" + name_ + ")"; }
  void add_client(uint32_t cn, const std::vector<char>& addr) override {
    std::lock_guard g(mu_);
    admitted_.insert({cn, std::string(addr.begin(), addr.end())});
  }
  void remove_client(uint32_t cn) override {
    std::lock_guard g(mu_);
    for (auto it = admitted_.begin(); it != admitted_.end();) it = it->first == cn ? admitted_.erase(it) : std::next(it);
  }
  void set_handler(RegionServer::Handler h) override {
    std::lock_guard g(mu_);
    handler_ = std::move(h);
  }
  void send_to(uint64_t sender, const void* data, size_t len) override {
    std::lock_guard g(mu_);
    auto it = conns_.find(sender);
    if (it == conns_.end()) return;
    if (it->second.out.size() + len > kMaxQueued) {
      spdlog::warn("cxl: computenode {} reads none of its messages ({} bytes queued); closing its socket",
                   it->second.cn, it->second.out.size());
      ::close(it->second.fd);
      conns_.erase(it);
      return;
    }
    frame(it->second, data, len);
  }
  void set_tick(std::function<void()> tick, int period_ms) override {
    tick_ = std::move(tick);
    tick_ms_ = period_ms;
  }
  RegionServer::Stats stats() const override {
    RegionServer::Stats s;
    s.messages = messages_.load();
    return s;
  }
  double progress_stalled_seconds() const override { return 0; }

  void run(const std::atomic<bool>& stop) override {
    auto last_tick = std::chrono::steady_clock::now();
    while (!stop.load()) {
      std::vector<pollfd> pfs{{listen_, POLLIN, 0}};
      std::vector<uint64_t> ids;
      {
        std::lock_guard g(mu_);
        for (auto& [id, c] : conns_) {
          pfs.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
          ids.push_back(id);
        }
      }
      ::poll(pfs.data(), pfs.size(), std::max(10, tick_ms_));
      for (size_t i = 1; i < pfs.size(); ++i) {
        if (pfs[i].revents & POLLOUT) {
          std::lock_guard g(mu_);
          auto it = conns_.find(ids[i - 1]);
          if (it != conns_.end() && !flush(it->second)) {
            ::close(it->second.fd);
            conns_.erase(it);
          }
        }
        if (pfs[i].revents & (POLLIN | POLLHUP | POLLERR)) on_readable(ids[i - 1]);
      }
      // After the readable ones: a hello already in a socket's buffer is read before that
      // connection could be taken for silent or the oldest waiting one.
      if (pfs[0].revents & POLLIN) accept_new();
      drop_silent();
      if (tick_ && std::chrono::steady_clock::now() - last_tick >= std::chrono::milliseconds(tick_ms_)) {
        last_tick = std::chrono::steady_clock::now();
        tick_();
      }
    }
  }

 private:
  struct Conn {
    int fd = -1;
    bool hello_done = false;
    uint32_t cn = 0;
    std::vector<char> in;
    std::vector<char> out;  // frames not written yet: the loop writes them when the socket takes them
    std::chrono::steady_clock::time_point accepted{};
  };
  static constexpr size_t kMaxQueued = 256u << 20;  // a client that reads nothing is dropped past this
  // Anyone on the host can find the abstract name (/proc/net/unix) and connect: as on the
  // control port, a hello must come within kHelloWithin, and at most kMaxPending connections
  // wait for theirs (a new one past that closes the oldest), so silent connections hold no
  // file descriptors for long.
  static constexpr auto kHelloWithin = std::chrono::seconds(3);
  static constexpr size_t kMaxPending = 32;

  /// Queues a frame and writes what the socket takes now (never blocks: a slow or silent
  /// computenode delays nobody). Caller holds mu_.
  void frame(Conn& c, const void* data, size_t len) {
    const uint32_t n = static_cast<uint32_t>(len);
    c.out.insert(c.out.end(), reinterpret_cast<const char*>(&n), reinterpret_cast<const char*>(&n) + 4);
    c.out.insert(c.out.end(), static_cast<const char*>(data), static_cast<const char*>(data) + len);
    flush(c);
  }
  static bool flush(Conn& c) {
    size_t at = 0;
    while (at < c.out.size()) {
      const ssize_t w = ::send(c.fd, c.out.data() + at, c.out.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (w <= 0) return false;
      at += static_cast<size_t>(w);
    }
    c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(at));
    return true;
  }

  void accept_new() {
    for (;;) {
      const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      std::lock_guard g(mu_);
      size_t pending = 0;
      auto oldest = conns_.end();
      for (auto it = conns_.begin(); it != conns_.end(); ++it)
        if (!it->second.hello_done) {
          ++pending;
          if (oldest == conns_.end()) oldest = it;  // ids grow: the first is the oldest
        }
      if (pending >= kMaxPending) {
        spdlog::warn("cxl: {} socket connections wait for a hello; closing the oldest", pending);
        ::close(oldest->second.fd);
        conns_.erase(oldest);
      }
      Conn c;
      c.fd = fd;
      c.accepted = std::chrono::steady_clock::now();
      conns_[next_id_++] = std::move(c);
    }
  }

  /// Closes the connections that sent no hello within kHelloWithin.
  void drop_silent() {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard g(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->second.hello_done && now - it->second.accepted > kHelloWithin) {
        spdlog::warn("cxl: closed a socket connection that sent no hello within {} s",
                     std::chrono::duration_cast<std::chrono::seconds>(kHelloWithin).count());
        ::close(it->second.fd);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void drop(uint64_t id) {
    std::lock_guard g(mu_);
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    ::close(it->second.fd);
    conns_.erase(it);
  }

  void on_readable(uint64_t id) {
    char buf[65536];
    int fd;
    {
      std::lock_guard g(mu_);
      auto it = conns_.find(id);
      if (it == conns_.end()) return;
      fd = it->second.fd;
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return drop(id);
    if (n < 0) return;
    std::vector<std::pair<std::vector<char>, uint32_t>> msgs;
    {
      std::lock_guard g(mu_);
      Conn& c = conns_.at(id);
      c.in.insert(c.in.end(), buf, buf + n);
      if (!c.hello_done) {
        if (c.in.size() < sizeof(cxl::Hello)) return;
        cxl::Hello h;
        std::memcpy(&h, c.in.data(), sizeof h);
        c.in.erase(c.in.begin(), c.in.begin() + sizeof h);
        const std::string nonce(reinterpret_cast<const char*>(h.nonce), cxl::kNonceBytes);
        cxl::Accept a{cxl::kHelloMagic, 0, size_};
        if (h.magic != cxl::kHelloMagic || admitted_.count({h.cn_id, nonce}) == 0) {
          spdlog::warn("cxl: refused a socket connection that did not join with the cluster token");
          cxl::write_all(c.fd, &a, sizeof a);
          ::close(c.fd);
          conns_.erase(id);
          return;
        }
        a.ok = 1;
        const bool sent = h.want_fd ? cxl::send_with_fd(c.fd, &a, sizeof a, region_fd_) : cxl::write_all(c.fd, &a, sizeof a);
        if (!sent) {
          ::close(c.fd);
          conns_.erase(id);
          return;
        }
        c.hello_done = true;
        c.cn = h.cn_id;
      }
      // Message frames: [u32 length][payload].
      size_t at = 0;
      while (c.in.size() - at >= 4) {
        uint32_t len;
        std::memcpy(&len, c.in.data() + at, 4);
        if (len > cxl::kMaxFrame) {
          spdlog::warn("cxl: computenode {} sent a frame of {} bytes; closing its socket", c.cn, len);
          ::close(c.fd);
          conns_.erase(id);
          return;
        }
        if (c.in.size() - at - 4 < len) break;
        msgs.emplace_back(std::vector<char>(c.in.begin() + static_cast<std::ptrdiff_t>(at + 4),
                                            c.in.begin() + static_cast<std::ptrdiff_t>(at + 4 + len)),
                          c.cn);
        at += 4 + len;
      }
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(at));
    }
    for (auto& [payload, cn] : msgs) {
      Message m;
      m.from_node = 0xffff;
      m.from_cn = cn;
      m.sender = id;
      m.payload = std::move(payload);
      ++messages_;
      RegionServer::Handler h;
      {
        std::lock_guard g(mu_);
        h = handler_;
      }
      if (h) h(m, [this, id](const void* d, size_t l) { send_to(id, d, l); });
    }
  }

  uint64_t size_;
  uint16_t id_;
  int region_fd_;
  std::string name_;
  int listen_ = -1;
  std::mutex mu_;
  std::map<uint64_t, Conn> conns_;
  uint64_t next_id_ = 1;
  std::set<std::pair<uint32_t, std::string>> admitted_;
  RegionServer::Handler handler_;
  std::function<void()> tick_;
  int tick_ms_ = 50;
  std::atomic<uint64_t> messages_{0};
};

}  // namespace

std::unique_ptr<RegionBackend> make_cxl_region_server(uint64_t size, uint16_t memnode_id, int region_fd) {
  return std::make_unique<CxlRegionServer>(size, memnode_id, region_fd);
}

}  // namespace dmhnsw::fabric
