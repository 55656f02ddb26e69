#include "common/fabric/bootstrap.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace dmhnsw::fabric {

namespace {

enum FrameType : uint16_t { kHello = 1, kWelcome = 2, kRefuse = 3, kPing = 4, kPong = 5, kChallenge = 6 };
constexpr size_t kNonceBytes = 32;  // the memnode's challenge, fresh for every connection
constexpr uint32_t kMaxPayload = 64 * 1024;
constexpr int kIoTimeoutMs = 3000;

std::string errno_str() { return std::strerror(errno); }

/// What a hello proves the token with, in place of the token: HMAC-SHA256 keyed by the token
/// over the memnode's nonce, the computenode id and its fabric address. A captured hello is
/// good for that connection only, and says nothing about the token.
std::vector<char> hello_proof(const std::string& token, const std::vector<char>& nonce, uint32_t cn_id,
                              const std::vector<char>& fabric_addr) {
  static constexpr char kLabel[] = "dmhnsw control hello v3";
  std::vector<unsigned char> msg(kLabel, kLabel + sizeof kLabel);
  msg.insert(msg.end(), nonce.begin(), nonce.end());
  for (int i = 0; i < 4; ++i) msg.push_back(static_cast<unsigned char>(cn_id >> (8 * i)));
  msg.insert(msg.end(), fabric_addr.begin(), fabric_addr.end());
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  static const char kEmpty = 0;
  if (HMAC(EVP_sha256(), token.empty() ? &kEmpty : token.data(), static_cast<int>(token.size()), msg.data(),
           msg.size(), out, &len) == nullptr)
    throw FabricError("HMAC-SHA256 of the hello failed");
  return std::vector<char>(out, out + len);
}

// ---- byte (de)serialization with bounds checks
struct Writer {
  std::vector<char> b;
  template <class T>
  void put(const T& v) {
    auto p = reinterpret_cast<const char*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void bytes(const void* p, size_t n) {
    put(static_cast<uint32_t>(n));
    b.insert(b.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  }
};
struct Reader {
  const std::vector<char>& b;
  size_t at = 0;
  std::string what;
  void need(size_t n) {
    if (n > b.size() - at)
      throw FabricError(what + ": truncated control message (need " + std::to_string(n) + " bytes at offset " +
                        std::to_string(at) + ", have " + std::to_string(b.size() - at) + ")");
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::vector<char> bytes() {
    auto n = get<uint32_t>();
    need(n);
    std::vector<char> v(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + n));
    at += n;
    return v;
  }
  std::string str() {
    auto v = bytes();
    return std::string(v.begin(), v.end());
  }
};

bool wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int rc;
  do rc = ::poll(&p, 1, timeout_ms);
  while (rc < 0 && errno == EINTR);
  return rc > 0;
}

void write_all(int fd, const void* data, size_t n, const std::string& peer) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, kIoTimeoutMs)) throw FabricError(peer + ": control connection: send timed out");
      continue;
    }
    if (w <= 0) throw FabricError(peer + ": control connection: send failed: " + errno_str());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, void* data, size_t n, const std::string& peer) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, kIoTimeoutMs))
      throw FabricError(peer + ": control connection: no answer within " + std::to_string(kIoTimeoutMs) + " ms");
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r == 0) throw FabricError(peer + ": control connection closed by the peer");
    if (r < 0) throw FabricError(peer + ": control connection: receive failed: " + errno_str());
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void send_frame(int fd, uint16_t version, uint16_t type, const std::vector<char>& payload, const std::string& peer) {
  ControlFrame f{kControlMagic, version, type, static_cast<uint32_t>(payload.size()), 0};
  std::vector<char> out(reinterpret_cast<const char*>(&f), reinterpret_cast<const char*>(&f) + sizeof f);
  out.insert(out.end(), payload.begin(), payload.end());
  write_all(fd, out.data(), out.size(), peer);
}

ControlFrame recv_frame(int fd, std::vector<char>& payload, const std::string& peer) {
  ControlFrame f;
  read_all(fd, &f, sizeof f, peer);
  if (f.magic != kControlMagic)
    throw FabricError(peer + ": not a dmhnsw control peer (bad magic 0x" + [&] {
      char b[16];
      std::snprintf(b, sizeof b, "%08x", f.magic);
      return std::string(b);
    }() + ")");
  if (f.length > kMaxPayload)
    throw FabricError(peer + ": control message of " + std::to_string(f.length) + " bytes exceeds the limit");
  payload.resize(f.length);
  if (f.length > 0) read_all(fd, payload.data(), f.length, peer);
  return f;
}

/// Appends what `fd` has now (never waits). False on EOF, error, or more than one frame's
/// worth of bytes that are not a frame yet.
bool read_available(int fd, std::vector<char>& in) {
  char b[4096];
  for (;;) {
    ssize_t r = ::recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r > 0) {
      in.insert(in.end(), b, b + r);
      if (in.size() > 2 * (sizeof(ControlFrame) + kMaxPayload)) return false;
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

/// The first complete frame of `in` (removed from it), or false when it is not all there yet.
/// Throws naming `peer` on a bad magic or an oversized length.
bool take_frame(std::vector<char>& in, ControlFrame& f, std::vector<char>& payload, const std::string& peer) {
  if (in.size() < sizeof f) return false;
  std::memcpy(&f, in.data(), sizeof f);
  if (f.magic != kControlMagic) throw FabricError(peer + ": not a dmhnsw control peer (bad magic)");
  if (f.length > kMaxPayload)
    throw FabricError(peer + ": control message of " + std::to_string(f.length) + " bytes exceeds the limit");
  if (in.size() < sizeof f + f.length) return false;
  payload.assign(in.begin() + sizeof f, in.begin() + static_cast<ptrdiff_t>(sizeof f + f.length));
  in.erase(in.begin(), in.begin() + static_cast<ptrdiff_t>(sizeof f + f.length));
  return true;
}

/// Sends a whole frame at once or not at all: false when the socket would block (a peer that
/// does not read what it is sent is dropped rather than waited for).
bool send_frame_now(int fd, uint16_t version, uint16_t type, const std::vector<char>& payload) {
  ControlFrame f{kControlMagic, version, type, static_cast<uint32_t>(payload.size()), 0};
  std::vector<char> out(reinterpret_cast<const char*>(&f), reinterpret_cast<const char*>(&f) + sizeof f);
  out.insert(out.end(), payload.begin(), payload.end());
  ssize_t w;
  do w = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  return w == static_cast<ssize_t>(out.size());
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string sockaddr_str(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

sockaddr_in resolve(const std::string& host, uint16_t port, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) throw FabricError(what + ": cannot resolve host '" + host + "': " + gai_strerror(rc));
  sockaddr_in a;
  std::memcpy(&a, res->ai_addr, sizeof a);
  ::freeaddrinfo(res);
  a.sin_port = htons(port);
  return a;
}

}  // namespace

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::None: return "none";
    case Mode::Shine: return "shine";
    case Mode::Dhnsw: return "dhnsw";
  }
  return "?";
}

Mode parse_mode(const std::string& s) {
  if (s == "shine") return Mode::Shine;
  if (s == "dhnsw") return Mode::Dhnsw;
  if (s == "none") return Mode::None;
  throw FabricError("--mode: unknown mode '" + s + "' (expected shine or dhnsw)");
}

std::pair<std::string, uint16_t> parse_host_port(const std::string& s, const std::string& flag) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    throw FabricError(flag + ": expected HOST:PORT, got '" + s + "'");
  std::string host = s.substr(0, colon);
  char* end = nullptr;
  long port = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535) throw FabricError(flag + ": bad port in '" + s + "'");
  return {host, static_cast<uint16_t>(port)};
}

std::string load_token(const std::string& token_file) {
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) throw FabricError("--token-file: cannot read '" + token_file + "': " + errno_str());
    std::string t;
    std::getline(in, t);
    while (!t.empty() && (t.back() == '\r' || t.back() == ' ' || t.back() == '\t')) t.pop_back();
    if (t.empty()) throw FabricError("--token-file: '" + token_file + "' holds an empty token");
    return t;
  }
  const char* env = std::getenv("DMHNSW_TOKEN");
  return env != nullptr ? std::string(env) : std::string();
}

// ================================================================= client
ControlClient::ControlClient(const std::string& host_port, uint16_t version) : peer_(host_port), version_(version) {
  auto [host, port] = parse_host_port(host_port, "--memnodes");
  sockaddr_in a = resolve(host, port, "memnode " + host_port);
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw FabricError("socket: " + errno_str());
  set_nonblocking(fd_);
  set_nodelay(fd_);
  int rc = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  if (rc < 0 && errno != EINPROGRESS) {
    std::string e = errno_str();
    ::close(fd_);
    fd_ = -1;
    throw FabricError("memnode " + host_port + ": cannot connect to its control port: " + e);
  }
  if (rc < 0) {
    if (!wait_fd(fd_, POLLOUT, kIoTimeoutMs)) {
      ::close(fd_);
      fd_ = -1;
      throw FabricError("memnode " + host_port + ": connect timed out after " + std::to_string(kIoTimeoutMs) + " ms");
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      ::close(fd_);
      fd_ = -1;
      throw FabricError("memnode " + host_port + ": cannot connect to its control port: " + std::strerror(err));
    }
  }
}

ControlClient::~ControlClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string ControlClient::local_ip() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return ip;
}

Welcome ControlClient::handshake(const Hello& h) {
  std::string who = "memnode " + peer_;
  std::vector<char> payload;
  // The memnode speaks first: a nonce the hello's proof is bound to.
  ControlFrame f = recv_frame(fd_, payload, who);
  std::vector<char> nonce;
  if (f.type == kChallenge) {
    nonce = payload;
  } else if (f.type == kRefuse) {
    Reader r{payload, 0, who};
    throw FabricError(who + " refused this computenode: " + r.str());
  } else {
    throw FabricError(who + ": control protocol version mismatch or not a memnode (first message type " +
                      std::to_string(f.type) + ", v" + std::to_string(f.version) + "; this computenode speaks v" +
                      std::to_string(version_) + ")");
  }
  Writer w;
  w.put(static_cast<uint8_t>(h.mode));
  w.put(static_cast<uint8_t>(h.provider));
  w.put(h.cn_id);
  w.put(static_cast<uint8_t>(h.token.empty() ? 0 : 1));
  const std::vector<char> proof = hello_proof(h.token, nonce, h.cn_id, h.fabric_addr);
  w.bytes(proof.data(), proof.size());
  w.bytes(h.fabric_addr.data(), h.fabric_addr.size());
  send_frame(fd_, version_, kHello, w.b, who);
  f = recv_frame(fd_, payload, who);
  Reader r{payload, 0, who};
  if (f.type == kRefuse) {
    std::string msg = r.str();
    throw FabricError(who + " refused this computenode: " + msg);
  }
  if (f.version != version_)
    throw FabricError(who + ": control protocol version mismatch: memnode speaks v" + std::to_string(f.version) +
                      ", this computenode v" + std::to_string(version_));
  if (f.type != kWelcome) throw FabricError(who + ": unexpected control message type " + std::to_string(f.type));
  Welcome wl;
  wl.memnode_id = r.get<uint16_t>();
  wl.mode = static_cast<Mode>(r.get<uint8_t>());
  wl.region_base = r.get<uint64_t>();
  wl.region_size = r.get<uint64_t>();
  wl.region_key = r.get<uint64_t>();
  wl.fabric_addr = r.bytes();
  const auto lanes = r.get<uint16_t>();
  if (lanes > kMaxRmaLanes)
    throw FabricError(who + ": welcome lists " + std::to_string(lanes) + " RMA lanes (at most " +
                      std::to_string(kMaxRmaLanes) + ")");
  for (uint16_t i = 0; i < lanes; ++i) wl.rma_lanes.push_back(r.bytes());
  r.need(kHeaderBlobBytes);
  std::memcpy(wl.header.data(), payload.data() + r.at, kHeaderBlobBytes);
  return wl;
}

bool ControlClient::send_ping() {
  ControlFrame f{kControlMagic, version_, kPing, 0, 0};
  ssize_t w = ::send(fd_, &f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
  return w == static_cast<ssize_t>(sizeof f) || (w < 0 && (errno == EAGAIN || errno == EINTR));
}

bool ControlClient::drain(std::string& why) {
  char buf[512];
  for (;;) {
    ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) continue;  // pongs: their arrival is what matters
    if (r == 0) {
      why = "control connection closed (memnode process gone)";
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno == EINTR) continue;
    why = "control connection failed: " + errno_str();
    return false;
  }
}

// ================================================================= server
std::string listen_host_for(const std::string& host, const std::string& token) {
  return token.empty() && !is_loopback(host) ? "127.0.0.1" : host;
}

ControlServer::ControlServer(Config c) : c_(std::move(c)) {
  auto [host, port] = parse_host_port(c_.listen, "--listen");
  if (listen_host_for(host, c_.token) != host) {
    spdlog::warn("no cluster token (--token-file or DMHNSW_TOKEN): binding the control port to 127.0.0.1 only "
                 "instead of {}; computenodes on other hosts cannot connect",
                 host);
    host = listen_host_for(host, c_.token);
  } else if (c_.token.empty()) {
    spdlog::info("no cluster token (--token-file or DMHNSW_TOKEN): control port bound to loopback only");
  }
  sockaddr_in a = resolve(host, port, "--listen");
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw FabricError("socket: " + errno_str());
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    std::string e = errno_str();
    ::close(listen_fd_);
    throw FabricError("--listen " + c_.listen + ": cannot bind: " + e);
  }
  if (::listen(listen_fd_, 64) < 0) throw FabricError("--listen " + c_.listen + ": listen: " + errno_str());
  sockaddr_in b{};
  socklen_t len = sizeof b;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&b), &len);
  bound_ = sockaddr_str(b);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw FabricError("eventfd: " + errno_str());
}

ControlServer::~ControlServer() {
  for (auto& cl : clients_) ::close(cl.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ControlServer::stop() {
  stop_.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void ControlServer::run() {
  set_nonblocking(listen_fd_);
  while (!stop_.load()) {
    // Only connections, deadlines and stop() wake this thread: an idle memnode spends no CPU.
    auto now = Clock::now();
    int timeout = 5000;
    for (const auto& p : pending_)
      timeout = std::min<int>(timeout, static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - now).count() + 1)));
    std::vector<pollfd> fds;
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& cl : clients_) fds.push_back({cl.fd, POLLIN, 0});
    for (auto& p : pending_) fds.push_back({p.fd, POLLIN, 0});
    fds.push_back({wake_fd_, POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), timeout);
    if (rc < 0) continue;
    // Clients first, then connections waiting for their hello (indexes stay valid), then new ones.
    std::vector<Client> keep;
    for (size_t i = 0; i < clients_.size(); ++i) {
      auto& cl = clients_[i];
      if ((fds[1 + i].revents & (POLLIN | POLLHUP | POLLERR)) == 0 || serve(cl)) {
        keep.push_back(std::move(cl));
        continue;
      }
      spdlog::info("computenode {} ({}) disconnected", cl.cn_id, cl.from);
      if (c_.on_leave) c_.on_leave(cl.cn_id);
      ::close(cl.fd);
    }
    const size_t base = 1 + clients_.size();
    clients_ = std::move(keep);
    std::vector<Pending> waiting;
    now = Clock::now();
    for (size_t i = 0; i < pending_.size(); ++i) {
      auto& p = pending_[i];
      const std::string who = "computenode at " + p.from;
      try {
        if (fds[base + i].revents & (POLLIN | POLLHUP | POLLERR)) {
          if (!read_available(p.fd, p.in)) throw FabricError(who + ": closed before its hello");
          ControlFrame f{};
          std::vector<char> payload;
          if (take_frame(p.in, f, payload, who)) {
            handle_hello(p, f.version, f.type, payload);  // joins clients_ or is closed
            continue;
          }
        }
        if (now >= p.deadline)
          throw FabricError(who + ": no complete hello within " + std::to_string(kHelloMs) + " ms");
        waiting.push_back(std::move(p));
      } catch (const FabricError& e) {
        spdlog::warn("dropped {}", e.what());
        ::close(p.fd);
      }
    }
    pending_ = std::move(waiting);
    if (fds[0].revents & POLLIN) accept_all();
  }
}

bool ControlServer::serve(Client& cl) {
  const std::string who = "computenode " + std::to_string(cl.cn_id) + " at " + cl.from;
  if (!read_available(cl.fd, cl.in)) return false;
  try {
    ControlFrame f{};
    std::vector<char> payload;
    while (take_frame(cl.in, f, payload, who))
      if (f.type == kPing && !send_frame_now(cl.fd, f.version, kPong, {})) {
        spdlog::warn("dropped {}: it does not take its heartbeat answers", who);
        return false;
      }
  } catch (const FabricError& e) {
    spdlog::warn("dropped {}", e.what());
    return false;
  }
  return true;
}

void ControlServer::accept_all() {
  for (;;) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    set_nodelay(fd);
    const std::string from = sockaddr_str(a);
    if (pending_.size() >= kMaxPending) {
      // The oldest has had the most time: it goes, so that silent connections cannot keep a
      // computenode that says hello at once from joining.
      spdlog::warn("dropped the connection from {}: {} connections were waiting to say hello", pending_.front().from,
                   pending_.size());
      ::close(pending_.front().fd);
      pending_.erase(pending_.begin());
    }
    std::vector<char> nonce(kNonceBytes);
    if (::getrandom(nonce.data(), nonce.size(), 0) != static_cast<ssize_t>(nonce.size()) ||
        !send_frame_now(fd, kControlVersion, kChallenge, nonce)) {
      spdlog::warn("dropped the connection from {}: could not send it a challenge", from);
      ::close(fd);
      continue;
    }
    pending_.push_back({fd, from, {}, Clock::now() + std::chrono::milliseconds(kHelloMs), std::move(nonce)});
  }
}

void ControlServer::handle_hello(Pending& p, uint16_t version, uint16_t type, const std::vector<char>& payload) {
  const int fd = p.fd;
  const std::string from = p.from;
  std::string who = "computenode at " + from;
  auto refuse = [&](const std::string& msg) {
    spdlog::warn("refused {}: {}", who, msg);
    Writer w;
    w.bytes(msg.data(), msg.size());
    send_frame_now(fd, kControlVersion, kRefuse, w.b);
    ::close(fd);
  };
  try {
    if (version != kControlVersion)
      return refuse("control protocol version mismatch: memnode " + std::to_string(c_.memnode_id) + " speaks v" +
                    std::to_string(kControlVersion) + ", computenode sent v" + std::to_string(version));
    if (type != kHello) return refuse("expected a hello, got message type " + std::to_string(type));
    Reader r{payload, 0, who};
    Hello h;
    h.mode = static_cast<Mode>(r.get<uint8_t>());
    h.provider = static_cast<Provider>(r.get<uint8_t>());
    h.cn_id = r.get<uint32_t>();
    const bool has_token = r.get<uint8_t>() != 0;
    const std::vector<char> proof = r.bytes();
    h.fabric_addr = r.bytes();
    who = "computenode " + std::to_string(h.cn_id) + " at " + from;
    const std::vector<char> want = hello_proof(c_.token, p.nonce, h.cn_id, h.fabric_addr);
    if (proof.size() != want.size() || CRYPTO_memcmp(proof.data(), want.data(), want.size()) != 0)
      return refuse(c_.token.empty() && has_token
                        ? "wrong cluster token: this memnode runs without a token, the computenode sent one"
                        : "wrong cluster token (check --token-file / DMHNSW_TOKEN on both sides)");
    if (h.provider != c_.provider)
      return refuse(std::string("provider mismatch: memnode uses --provider ") + provider_name(c_.provider) +
                    ", computenode uses --provider " + provider_name(h.provider));
    Mode mine = c_.mode ? c_.mode() : Mode::None;
    if (mine != Mode::None && h.mode != Mode::None && mine != h.mode)
      return refuse(std::string("mode mismatch: memnode ") + std::to_string(c_.memnode_id) + " holds a " +
                    mode_name(mine) + " index, computenode asked for --mode " + mode_name(h.mode));
    Writer w;
    w.put(c_.memnode_id);
    w.put(static_cast<uint8_t>(mine));
    w.put(c_.region_base);
    w.put(c_.region_size);
    w.put(c_.region_key);
    w.bytes(c_.fabric_addr.data(), c_.fabric_addr.size());
    w.put(static_cast<uint16_t>(c_.rma_lanes.size()));
    for (const auto& l : c_.rma_lanes) w.bytes(l.data(), l.size());
    auto hdr = c_.header ? c_.header() : std::array<char, kHeaderBlobBytes>{};
    w.b.insert(w.b.end(), hdr.begin(), hdr.end());
    if (c_.on_join) c_.on_join(h.cn_id, h.fabric_addr);
    if (!send_frame_now(fd, kControlVersion, kWelcome, w.b)) {
      spdlog::warn("dropped {}: it does not take its welcome", who);
      if (c_.on_leave) c_.on_leave(h.cn_id);
      ::close(fd);
      return;
    }
    spdlog::info("accepted {} (mode {})", who, mode_name(h.mode));
    clients_.push_back({fd, h.cn_id, from, std::move(p.in)});
  } catch (const std::exception& e) {
    spdlog::warn("dropped {}: {}", who, e.what());
    ::close(fd);
  }
}

}  // namespace dmhnsw::fabric
