#include "common/fabric/bootstrap.hpp"
#include "common/fabric/control_wire.hpp"

namespace dmhnsw::fabric {

using namespace ctl;


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

// A token ends at its first line, without trailing blanks, however it was given: the same
// token in a file and in DMHNSW_TOKEN (`export DMHNSW_TOKEN="$(cat cluster.token) "`) is one token.
static std::string trim_token(std::string t) {
  if (const auto nl = t.find('\n'); nl != std::string::npos) t.resize(nl);
  while (!t.empty() && (t.back() == '\r' || t.back() == ' ' || t.back() == '\t')) t.pop_back();
  return t;
}

std::string load_token(const std::string& token_file) {
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) throw FabricError("--token-file: cannot read '" + token_file + "': " + errno_str());
    std::string t;
    std::getline(in, t);
    t = trim_token(t);
    if (t.empty()) throw FabricError("--token-file: '" + token_file + "' holds an empty token");
    return t;
  }
  const char* env = std::getenv("DMHNSW_TOKEN");
  if (env == nullptr) return {};
  const std::string t = trim_token(env);
  if (t.empty() && env[0] != '\0') throw FabricError("DMHNSW_TOKEN holds only blanks: an empty token");
  return t;
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
  if (f.type == kRefuse) {
    Reader r{payload, 0, who};
    std::string msg = r.str();
    throw FabricError(who + " refused this computenode: " + msg);
  }
  if (f.version != version_)
    throw FabricError(who + ": control protocol version mismatch: memnode speaks v" + std::to_string(f.version) +
                      ", this computenode v" + std::to_string(version_));
  if (f.type != kWelcome) throw FabricError(who + ": unexpected control message type " + std::to_string(f.type));
  return decode_welcome(payload, who);
}

void ControlClient::send_register(const std::vector<char>& fabric_addr) {
  Writer w;
  w.bytes(fabric_addr.data(), fabric_addr.size());
  std::lock_guard g(send_mu_);
  send_frame(fd_, version_, kRegister, w.b, "memnode " + peer_);
}

void ControlClient::send_unregister(const std::vector<char>& fabric_addr) {
  Writer w;
  w.bytes(fabric_addr.data(), fabric_addr.size());
  std::lock_guard g(send_mu_);
  send_frame(fd_, version_, kUnregister, w.b, "memnode " + peer_);
}

bool ControlClient::send_ping() {
  std::lock_guard g(send_mu_);
  ControlFrame f{kControlMagic, version_, kPing, 0, 0};
  ssize_t w = ::send(fd_, &f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
  return w == static_cast<ssize_t>(sizeof f) || (w < 0 && (errno == EAGAIN || errno == EINTR));
}

bool ControlClient::drain(std::string& why) {
  char buf[512];
  for (;;) {
    ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {  // pongs (their arrival is what matters) and registration answers
      in_.insert(in_.end(), buf, buf + r);
      try {
        ControlFrame f{};
        std::vector<char> payload;
        while (take_frame(in_, f, payload, "memnode " + peer_))
          if (f.type == kRegistered) registered_.fetch_add(1);
      } catch (const FabricError& e) {
        why = e.what();
        return false;
      }
      continue;
    }
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

}  // namespace dmhnsw::fabric
