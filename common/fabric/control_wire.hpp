#pragma once
// The control protocol's wire: frame types, bounds-checked (de)serialization, blocking I/O for
// the computenode's side and never-waiting I/O for the memnode's, and the hello's proof. Shared
// by bootstrap.cpp (client) and bootstrap_server.cpp (server); nothing else includes it.
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

namespace dmhnsw::fabric::ctl {

// kRegister: another fabric address of the computenode (an endpoint it made), answered by
// kRegistered once the memnode takes messages from it. kUnregister (no answer): that endpoint
// is closed; the memnode forgets the address (a long-lived computenode makes endpoints as it
// goes, and each one kept cost the memnode an address-vector entry for good).
enum FrameType : uint16_t {
  kHello = 1, kWelcome = 2, kRefuse = 3, kPing = 4, kPong = 5, kChallenge = 6, kRegister = 7, kRegistered = 8,
  kUnregister = 9
};
constexpr size_t kNonceBytes = 32;  // the memnode's challenge, fresh for every connection
constexpr uint32_t kMaxPayload = 64 * 1024;
constexpr int kIoTimeoutMs = 3000;

inline std::string errno_str() { return std::strerror(errno); }

/// What a hello proves the token with, in place of the token: HMAC-SHA256 keyed by the token
/// over the memnode's nonce, the computenode id and its fabric address. A captured hello is
/// good for that connection only, and says nothing about the token.
inline std::vector<char> hello_proof(const std::string& token, const std::vector<char>& nonce, uint32_t cn_id,
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

// ---- the payloads that carry fields (pure: tests/fuzz/fuzz_control.cpp feeds them any bytes)

/// A hello as the memnode reads it: the proof stands where the computenode's token would.
struct HelloPayload {
  Hello hello;  // token left empty
  bool has_token = false;
  std::vector<char> proof;
};
/// Throws FabricError naming `who` when the payload is short.
inline HelloPayload decode_hello(const std::vector<char>& payload, const std::string& who) {
  Reader r{payload, 0, who};
  HelloPayload p;
  p.hello.mode = static_cast<Mode>(r.get<uint8_t>());
  p.hello.provider = static_cast<Provider>(r.get<uint8_t>());
  p.hello.cn_id = r.get<uint32_t>();
  p.has_token = r.get<uint8_t>() != 0;
  p.proof = r.bytes();
  p.hello.fabric_addr = r.bytes();
  return p;
}

/// The fabric address of a register frame: 1..256 bytes (FabricError naming `who` otherwise).
inline std::vector<char> decode_register(const std::vector<char>& payload, const std::string& who) {
  Reader r{payload, 0, who};
  std::vector<char> addr = r.bytes();
  if (addr.empty() || addr.size() > 256)
    throw FabricError(who + ": registers a fabric address of " + std::to_string(addr.size()) + " bytes");
  return addr;
}

/// A welcome as the computenode reads it. Throws FabricError naming `who` when the payload is
/// short or lists more than kMaxRmaLanes lanes.
inline Welcome decode_welcome(const std::vector<char>& payload, const std::string& who) {
  Reader r{payload, 0, who};
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
  r.at += kHeaderBlobBytes;
  wl.copy = r.get<uint8_t>();
  wl.copies = r.get<uint8_t>();
  wl.joining = r.get<uint8_t>();
  if (wl.copies == 0 || wl.copy >= wl.copies || wl.copies > kMaxCopies)
    throw FabricError(who + ": welcome names copy " + std::to_string(wl.copy) + " of " + std::to_string(wl.copies) +
                      " (want copy < copies <= " + std::to_string(kMaxCopies) + ")");
  return wl;
}

inline bool wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int rc;
  do rc = ::poll(&p, 1, timeout_ms);
  while (rc < 0 && errno == EINTR);
  return rc > 0;
}

inline void write_all(int fd, const void* data, size_t n, const std::string& peer) {
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

inline void read_all(int fd, void* data, size_t n, const std::string& peer) {
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

inline void send_frame(int fd, uint16_t version, uint16_t type, const std::vector<char>& payload,
                       const std::string& peer) {
  ControlFrame f{kControlMagic, version, type, static_cast<uint32_t>(payload.size()), 0};
  std::vector<char> out(reinterpret_cast<const char*>(&f), reinterpret_cast<const char*>(&f) + sizeof f);
  out.insert(out.end(), payload.begin(), payload.end());
  write_all(fd, out.data(), out.size(), peer);
}

inline ControlFrame recv_frame(int fd, std::vector<char>& payload, const std::string& peer) {
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
inline bool read_available(int fd, std::vector<char>& in) {
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
inline bool take_frame(std::vector<char>& in, ControlFrame& f, std::vector<char>& payload, const std::string& peer) {
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
inline bool send_frame_now(int fd, uint16_t version, uint16_t type, const std::vector<char>& payload) {
  ControlFrame f{kControlMagic, version, type, static_cast<uint32_t>(payload.size()), 0};
  std::vector<char> out(reinterpret_cast<const char*>(&f), reinterpret_cast<const char*>(&f) + sizeof f);
  out.insert(out.end(), payload.begin(), payload.end());
  ssize_t w;
  do w = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  return w == static_cast<ssize_t>(out.size());
}

inline void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline std::string sockaddr_str(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

inline bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

inline sockaddr_in resolve(const std::string& host, uint16_t port, const std::string& what) {
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

}  // namespace dmhnsw::fabric::ctl
