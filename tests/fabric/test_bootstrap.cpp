// The bootstrap protocol over real TCP sockets on loopback: acceptance and every refusal.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/fabric/bootstrap.hpp"
#include "common/fabric/cluster.hpp"

using namespace dmhnsw::fabric;

namespace {
struct Server {
  std::vector<std::string> joined;
  std::atomic<int> left{0};
  std::mutex mu;  // the server thread calls on_register and on_forget
  std::vector<std::string> registered, forgotten;
  std::unique_ptr<ControlServer> srv;
  std::thread th;
  Server(const std::string& token, Mode mode, const std::string& listen = "127.0.0.1:0", int silent_ms = 15000) {
    ControlServer::Config c;
    c.listen = listen;
    c.token = token;
    c.memnode_id = 4;
    c.provider = Provider::Tcp;
    c.region_base = 0x1000;
    c.region_size = 1 << 20;
    c.region_key = 77;
    c.fabric_addr = {'a', 'b', 'c'};
    c.mode = [mode] { return mode; };
    c.header = [] {
      std::array<char, kHeaderBlobBytes> h{};
      h[0] = 'H';
      return h;
    };
    c.on_join = [this](uint32_t cn, const std::vector<char>&) { joined.push_back(std::to_string(cn)); };
    c.on_leave = [this](uint32_t) { left.fetch_add(1); };
    c.on_register = [this](uint32_t, const std::vector<char>& a) {
      std::lock_guard g(mu);
      registered.emplace_back(a.begin(), a.end());
    };
    c.on_forget = [this](uint32_t, const std::vector<char>& a) {
      std::lock_guard g(mu);
      forgotten.emplace_back(a.begin(), a.end());
    };
    c.silent_ms = silent_ms;
    srv = std::make_unique<ControlServer>(c);
    th = std::thread([this] { srv->run(); });
  }
  ~Server() {
    srv->stop();
    th.join();
  }
};

/// A plain TCP connection to `bound` ("127.0.0.1:PORT"), as anyone on the host could open.
int raw_connect(const std::string& bound) {
  auto [host, port] = parse_host_port(bound, "test");
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
  return fd;
}

/// True once the server has closed `fd` (EOF or a failed send).
bool closed_by_server(int fd) {
  char b;
  ssize_t r = ::recv(fd, &b, 1, MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

Hello hello(const std::string& token, Mode mode = Mode::Shine, Provider p = Provider::Tcp) {
  Hello h;
  h.mode = mode;
  h.provider = p;
  h.cn_id = 9;
  h.token = token;
  h.fabric_addr = {'x'};
  return h;
}
}  // namespace

TEST_CASE("bootstrap: a computenode with the right token gets the region descriptor", "[bootstrap]") {
  Server s("s3cret", Mode::None);
  ControlClient c(s.srv->bound());
  Welcome w = c.handshake(hello("s3cret"));
  CHECK(w.memnode_id == 4);
  CHECK(w.region_base == 0x1000);
  CHECK(w.region_size == 1 << 20);
  CHECK(w.region_key == 77);
  CHECK(w.fabric_addr == std::vector<char>{'a', 'b', 'c'});
  CHECK(w.header[0] == 'H');
  CHECK(c.local_ip() == "127.0.0.1");
  CHECK(c.send_ping());
}

TEST_CASE("bootstrap: a wrong token is refused with a message naming the token", "[bootstrap]") {
  Server s("s3cret", Mode::None);
  ControlClient c(s.srv->bound());
  CHECK_THROWS_WITH(c.handshake(hello("guess")), Catch::Contains("refused") && Catch::Contains("wrong cluster token"));
  ControlClient c2(s.srv->bound());
  CHECK_THROWS_WITH(c2.handshake(hello("")), Catch::Contains("wrong cluster token"));
}

TEST_CASE("bootstrap: a wrong protocol version is refused naming both versions", "[bootstrap]") {
  Server s("", Mode::None);
  ControlClient c(s.srv->bound(), kControlVersion + 1);
  CHECK_THROWS_WITH(c.handshake(hello("")), Catch::Contains("version mismatch") &&
                                                Catch::Contains("v" + std::to_string(kControlVersion)) &&
                                                Catch::Contains("v" + std::to_string(kControlVersion + 1)));
}

TEST_CASE("bootstrap: a wrong mode or provider is refused naming both", "[bootstrap]") {
  Server s("", Mode::Dhnsw);
  ControlClient c(s.srv->bound());
  CHECK_THROWS_WITH(c.handshake(hello("", Mode::Shine)),
                    Catch::Contains("mode mismatch") && Catch::Contains("dhnsw") && Catch::Contains("shine"));
  ControlClient c2(s.srv->bound());
  CHECK_THROWS_WITH(c2.handshake(hello("", Mode::Dhnsw, Provider::Shm)),
                    Catch::Contains("provider mismatch") && Catch::Contains("tcp") && Catch::Contains("shm"));
  ControlClient c3(s.srv->bound());
  CHECK_NOTHROW(c3.handshake(hello("", Mode::None)));  // selftests connect to any mode
}

TEST_CASE("bootstrap: a hello sent a byte at a time and silent connections delay no join and no heartbeat",
          "[bootstrap]") {
  using namespace std::chrono;
  Server s("s3cret", Mode::None);
  ControlClient member(s.srv->bound());
  member.handshake(hello("s3cret"));
  // A client that says its hello one byte at a time (the 3 s timeout used to be per read, and
  // it held the server's only thread), and more silent connections than the server keeps.
  const int slow = raw_connect(s.srv->bound());
  const auto slow_start = steady_clock::now();
  const uint32_t magic = kControlMagic;
  CHECK(::send(slow, &magic, 1, MSG_NOSIGNAL) == 1);
  std::vector<int> silent;
  for (int i = 0; i < 40; ++i) silent.push_back(raw_connect(s.srv->bound()));

  // A computenode joins at once, and the member's heartbeat is answered at once.
  auto t0 = steady_clock::now();
  ControlClient c(s.srv->bound());
  CHECK_NOTHROW(c.handshake(hello("s3cret")));
  CHECK(steady_clock::now() - t0 < milliseconds(500));
  t0 = steady_clock::now();
  REQUIRE(member.send_ping());
  pollfd p{member.fd(), POLLIN, 0};
  CHECK(::poll(&p, 1, 1000) == 1);
  CHECK(steady_clock::now() - t0 < milliseconds(500));
  std::string why;
  CHECK(member.drain(why));

  // The slow client is dropped once its whole hello took longer than the deadline.
  bool dropped = false;
  for (int i = 1; i < 4 && !dropped; ++i) {
    std::this_thread::sleep_for(milliseconds(600));
    dropped = closed_by_server(slow) ||
              ::send(slow, reinterpret_cast<const char*>(&magic) + i, 1, MSG_NOSIGNAL) != 1;
  }
  while (!dropped && steady_clock::now() - slow_start < seconds(6)) {
    std::this_thread::sleep_for(milliseconds(100));
    dropped = closed_by_server(slow);
  }
  CHECK(dropped);
  CHECK(steady_clock::now() - slow_start < seconds(5));
  ::close(slow);
  for (int fd : silent) ::close(fd);
}

TEST_CASE("bootstrap: a member that sends nothing for the silent time is dropped and one that pings stays",
          "[bootstrap]") {
  using namespace std::chrono;
  Server s("s3cret", Mode::None, "127.0.0.1:0", 1000);
  ControlClient quiet(s.srv->bound()), pinging(s.srv->bound());
  quiet.handshake(hello("s3cret"));
  pinging.handshake(hello("s3cret"));
  const auto t0 = steady_clock::now();
  bool quiet_dropped = false;
  std::string why;
  while (steady_clock::now() - t0 < milliseconds(2500)) {
    REQUIRE(pinging.send_ping());
    std::this_thread::sleep_for(milliseconds(250));
    REQUIRE(pinging.drain(why));
    if (!quiet_dropped && closed_by_server(quiet.fd())) {
      quiet_dropped = true;
      CHECK(steady_clock::now() - t0 < milliseconds(1900));
    }
  }
  CHECK(quiet_dropped);
  CHECK(s.left.load() == 1);  // on_leave ran for the silent one only: its key and presence go
  CHECK(!closed_by_server(pinging.fd()));
}

TEST_CASE("bootstrap: an unregistered endpoint address is forgotten at once and the hello's address only when the member leaves",
          "[bootstrap]") {
  using namespace std::chrono;
  Server s("s3cret", Mode::None);
  auto snapshot = [&s](std::vector<std::string> Server::*v) {
    std::lock_guard g(s.mu);
    return s.*v;
  };
  auto wait_for = [&](auto pred) {
    const auto end = steady_clock::now() + seconds(3);
    while (!pred() && steady_clock::now() < end) std::this_thread::sleep_for(milliseconds(10));
    return pred();
  };
  {
    ControlClient c(s.srv->bound());
    Hello h = hello("s3cret");
    c.handshake(h);
    c.send_register({'e', '1'});
    c.send_register({'e', '2'});
    REQUIRE(wait_for([&] { return snapshot(&Server::registered).size() == 2; }));
    c.send_unregister({'e', '1'});
    c.send_unregister(h.fabric_addr);  // the hello's own address is not the client's to drop
    c.send_unregister({'x', 'y'});     // never registered: nothing to forget
    REQUIRE(wait_for([&] { return !snapshot(&Server::forgotten).empty(); }));
    std::this_thread::sleep_for(milliseconds(200));
    CHECK(snapshot(&Server::forgotten) == std::vector<std::string>{"e1"});
  }
  // Leaving forgets what is left: the hello's address and e2, not e1 a second time.
  REQUIRE(wait_for([&] { return s.left.load() == 1; }));
  auto f = snapshot(&Server::forgotten);
  std::sort(f.begin() + 1, f.end());
  const std::vector<char> hello_addr = hello("s3cret").fabric_addr;
  std::vector<std::string> want{"e1", "e2", std::string(hello_addr.begin(), hello_addr.end())};
  std::sort(want.begin() + 1, want.end());
  CHECK(f == want);
}

namespace {
/// Reads exactly `n` bytes (or fewer once `fd` closes or 2 s pass).
std::vector<char> read_n(int fd, size_t n) {
  std::vector<char> out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (out.size() < n && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char b[4096];
    ssize_t r = ::recv(fd, b, std::min(sizeof b, n - out.size()), 0);
    if (r <= 0) break;
    out.insert(out.end(), b, b + r);
  }
  return out;
}
}  // namespace

TEST_CASE("bootstrap: the token never crosses the wire and a replayed hello is refused", "[bootstrap]") {
  // A fake memnode: sends a challenge (frame type 6, 32 bytes of nonce) and keeps the hello.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 1) == 0);
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::vector<char> hello_frame;
  std::thread fake([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    ControlFrame f{kControlMagic, kControlVersion, 6, 32, 0};
    std::vector<char> out(reinterpret_cast<char*>(&f), reinterpret_cast<char*>(&f) + sizeof f);
    out.resize(out.size() + 32, 7);
    ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    hello_frame = read_n(fd, sizeof f);
    if (hello_frame.size() == sizeof f) {
      std::memcpy(&f, hello_frame.data(), sizeof f);
      auto body = read_n(fd, f.length);
      hello_frame.insert(hello_frame.end(), body.begin(), body.end());
    }
    ::close(fd);  // no welcome
  });
  {
    ControlClient c("127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
    CHECK_THROWS(c.handshake(hello("s3cret-token")));
  }
  fake.join();
  ::close(lfd);
  REQUIRE(hello_frame.size() > sizeof(ControlFrame));
  const std::string wire(hello_frame.begin(), hello_frame.end());
  CHECK(wire.find("s3cret-token") == std::string::npos);
  CHECK(wire.find("s3cret") == std::string::npos);

  // The captured hello, replayed to a real memnode with that token, answers another nonce.
  Server s("s3cret-token", Mode::None);
  int fd = raw_connect(s.srv->bound());
  REQUIRE(read_n(fd, sizeof(ControlFrame) + 32).size() == sizeof(ControlFrame) + 32);  // its challenge
  REQUIRE(::send(fd, hello_frame.data(), hello_frame.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(hello_frame.size()));
  auto reply = read_n(fd, sizeof(ControlFrame));
  REQUIRE(reply.size() == sizeof(ControlFrame));
  ControlFrame rf;
  std::memcpy(&rf, reply.data(), sizeof rf);
  CHECK(rf.type == 3);  // refuse
  auto msg = read_n(fd, rf.length);
  CHECK_THAT(std::string(msg.begin(), msg.end()), Catch::Contains("wrong cluster token"));
  ::close(fd);
  CHECK(s.joined.empty());
}

TEST_CASE("bootstrap: without a token the control port is bound to loopback only", "[bootstrap]") {
  Server s("", Mode::None, "0.0.0.0:0");
  CHECK(s.srv->bound().rfind("127.0.0.1:", 0) == 0);
}

TEST_CASE("bootstrap: helpers parse addresses and name the flag", "[bootstrap]") {
  CHECK(parse_host_port("10.0.0.1:7000", "--listen") == std::pair<std::string, uint16_t>{"10.0.0.1", 7000});
  CHECK_THROWS_WITH(parse_host_port("nohost", "--memnodes"), Catch::Contains("--memnodes"));
  CHECK_THROWS_WITH(parse_host_port("h:99999", "--listen"), Catch::Contains("--listen"));
  CHECK_THROWS_WITH(ControlClient("127.0.0.1:1"), Catch::Contains("127.0.0.1:1"));
  CHECK_THROWS_WITH(parse_provider("ib"), Catch::Contains("--provider"));
  CHECK_THROWS_WITH(load_token("/nonexistent/token"), Catch::Contains("--token-file") && Catch::Contains("/nonexistent/token"));
}

TEST_CASE("bootstrap: a token file and DMHNSW_TOKEN holding the same token give the same token", "[bootstrap]") {
  const std::string path = "/tmp/dmhnsw-token-" + std::to_string(::getpid());
  { std::ofstream(path) << "sesame \t\r\nsecond line\n"; }
  ::setenv("DMHNSW_TOKEN", "sesame \t\n", 1);
  CHECK(load_token(path) == "sesame");
  CHECK(load_token("") == "sesame");
  ::setenv("DMHNSW_TOKEN", "  ", 1);
  CHECK_THROWS_WITH(load_token(""), Catch::Contains("DMHNSW_TOKEN"));
  ::unsetenv("DMHNSW_TOKEN");
  CHECK(load_token("").empty());
  std::remove(path.c_str());
}

TEST_CASE("rma_lane_for: with lanes >= computenodes no two computenodes share a lane", "[fabric][lanes]") {
  for (uint32_t k = 1; k <= 8; ++k)
    for (uint64_t lanes = k; lanes <= 12; ++lanes) {
      std::vector<std::set<uint64_t>> used(k);
      for (uint32_t c = 0; c < k; ++c)
        for (uint64_t e = 0; e < 3 * lanes; ++e) {
          const uint64_t l = dmhnsw::fabric::rma_lane_for(c, k, e, lanes);
          REQUIRE(l < lanes);
          CHECK(l % k == c);  // computenode c's lanes: c, c + k, ...
          used[c].insert(l);
        }
      INFO("k=" << k << " lanes=" << lanes);
      for (uint32_t c = 0; c < k; ++c) CHECK(used[c].size() == (lanes - c + k - 1) / k);  // and all of them
    }
  // 2 computenodes, 4 lanes: computenode 1's endpoints take lanes 1, 3, 1, 3, ...
  CHECK(dmhnsw::fabric::rma_lane_for(1, 2, 0, 4) == 1);
  CHECK(dmhnsw::fabric::rma_lane_for(1, 2, 1, 4) == 3);
  CHECK(dmhnsw::fabric::rma_lane_for(1, 2, 2, 4) == 1);
  // Fewer lanes than computenodes, or the count unknown: spread, first endpoints apart.
  for (uint32_t c = 0; c < 3; ++c) CHECK(dmhnsw::fabric::rma_lane_for(c, 5, 0, 3) == c);
  CHECK(dmhnsw::fabric::rma_lane_for(1, 0, 1, 4) == (1 + 7919) % 4);
}
