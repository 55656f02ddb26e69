// The memnode's side of the control protocol: one thread that accepts computenodes, checks
// their hello against its challenge, and answers heartbeats, waiting on nobody.
#include <algorithm>

#include "common/fabric/control_wire.hpp"

namespace dmhnsw::fabric {

using namespace ctl;

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
    auto until = [&](Clock::time_point t) {
      timeout = std::min<int>(timeout, static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1)));
    };
    for (const auto& p : pending_) until(p.deadline);
    for (const auto& cl : clients_) until(cl.heard + std::chrono::milliseconds(c_.silent_ms));
    std::vector<pollfd> fds;
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& cl : clients_) fds.push_back({cl.fd, POLLIN, 0});
    for (auto& p : pending_) fds.push_back({p.fd, POLLIN, 0});
    fds.push_back({wake_fd_, POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), timeout);
    if (rc < 0) continue;
    // Clients first, then connections waiting for their hello (indexes stay valid), then new ones.
    std::vector<Client> keep;
    now = Clock::now();
    for (size_t i = 0; i < clients_.size(); ++i) {
      auto& cl = clients_[i];
      if ((fds[1 + i].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && !serve(cl)) {
        drop(cl, "disconnected");
      } else if (now - cl.heard > std::chrono::milliseconds(c_.silent_ms)) {
        drop(cl, "sent nothing for " + std::to_string(c_.silent_ms) + " ms (stopped or cut off): dropped");
      } else {
        keep.push_back(std::move(cl));
      }
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

void ControlServer::drop(Client& cl, const std::string& why) {
  spdlog::info("computenode {} ({}) {}", cl.cn_id, cl.from, why);
  if (c_.on_forget)
    for (const auto& a : cl.addrs) c_.on_forget(cl.cn_id, a);
  if (c_.on_leave) c_.on_leave(cl.cn_id);
  ::close(cl.fd);
}

bool ControlServer::serve(Client& cl) {
  const std::string who = "computenode " + std::to_string(cl.cn_id) + " at " + cl.from;
  const size_t had = cl.in.size();
  if (!read_available(cl.fd, cl.in)) return false;
  if (cl.in.size() > had) cl.heard = Clock::now();
  try {
    ControlFrame f{};
    std::vector<char> payload;
    while (take_frame(cl.in, f, payload, who)) {
      if (f.type == kRegister) {
        const std::vector<char> addr = decode_register(payload, who);
        if (c_.on_register) c_.on_register(cl.cn_id, addr);
        cl.addrs.push_back(addr);
      } else if (f.type == kUnregister) {
        // Only an address this connection registered; the hello's (addrs[0]) stays its own.
        const std::vector<char> addr = decode_register(payload, who);
        if (auto it = cl.addrs.empty() ? cl.addrs.end() : std::find(cl.addrs.begin() + 1, cl.addrs.end(), addr);
            it != cl.addrs.end()) {
          cl.addrs.erase(it);
          if (c_.on_forget) c_.on_forget(cl.cn_id, addr);
        }
      }
      const uint16_t answer = f.type == kPing ? kPong : f.type == kRegister ? kRegistered : 0;
      if (answer != 0 && !send_frame_now(cl.fd, f.version, answer, {})) {
        spdlog::warn("dropped {}: it does not take its answers", who);
        return false;
      }
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
    const HelloPayload hp = decode_hello(payload, who);
    const Hello& h = hp.hello;
    const bool has_token = hp.has_token;
    const std::vector<char>& proof = hp.proof;
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
    const auto hdr = c_.header ? c_.header() : std::array<char, kHeaderBlobBytes>{};
    Writer w;  // from here nothing throws before on_join (key_for registers the computenode's key)
    w.put(c_.memnode_id);
    w.put(static_cast<uint8_t>(mine));
    w.put(c_.region_base);
    w.put(c_.region_size);
    w.put(c_.key_for ? c_.key_for(h.cn_id, h.fabric_addr) : c_.region_key);
    w.bytes(c_.fabric_addr.data(), c_.fabric_addr.size());
    w.put(static_cast<uint16_t>(c_.rma_lanes.size()));
    for (const auto& l : c_.rma_lanes) w.bytes(l.data(), l.size());
    w.b.insert(w.b.end(), hdr.begin(), hdr.end());
    w.put(c_.copy);
    w.put(c_.copies);
    w.put(static_cast<uint8_t>(c_.joining && c_.joining() ? 1 : 0));
    if (c_.on_join) c_.on_join(h.cn_id, h.fabric_addr);
    if (!send_frame_now(fd, kControlVersion, kWelcome, w.b)) {
      spdlog::warn("dropped {}: it does not take its welcome", who);
      if (c_.on_forget) c_.on_forget(h.cn_id, h.fabric_addr);
      if (c_.on_leave) c_.on_leave(h.cn_id);
      ::close(fd);
      return;
    }
    spdlog::info("accepted {} (mode {})", who, mode_name(h.mode));
    clients_.push_back({fd, h.cn_id, from, std::move(p.in), {h.fabric_addr}, Clock::now()});
  } catch (const std::exception& e) {
    spdlog::warn("dropped {}: {}", who, e.what());
    ::close(fd);
  }
}

}  // namespace dmhnsw::fabric
