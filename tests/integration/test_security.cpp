// Outsiders against a memnode's data path over tcp. A raw libfabric client (the kind anyone on
// the host or network can write) that reaches the memnode's data endpoint but was never handed
// the region key gets no READ, WRITE, FETCH_ADD or COMPARE_SWAP through, with the key the
// memnode used to register with (0xD40000 + id) or any other guess; given the key of a
// welcome, the same client reads, so the refusals are the key's doing; and the key changes at
// every start.
#include <catch2/catch.hpp>
#include <mutex>
#include <optional>
#include <condition_variable>

#include <rdma/fi_atomic.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include "common/fabric/bootstrap.hpp"
#include "common/fabric/cxl/cxl.hpp"
#include "common/fabric/libfabric/lf.hpp"
#include "memory/admin.hpp"
#include "memory/relay_protocol.hpp"
#include "proc.hpp"

namespace relay = dmhnsw::relay;

using namespace dmhnsw;
using namespace dmhnsw::testing;
namespace lf = dmhnsw::fabric::lf;

namespace {

/// The outsider: a tcp endpoint of its own, a registered 4 KiB buffer, the memnode's address.
struct Outsider {
  std::shared_ptr<lf::Domain> d = lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1");
  lf::RawEndpoint ep{d, false};
  std::vector<char> buf = std::vector<char>(8192, 0);  // sends from the front, receives at 4096
  lf::MemoryRegion mr{d, buf.data(), buf.size(), FI_READ | FI_WRITE | FI_SEND | FI_RECV, d->next_local_key()};
  fi_addr_t peer = FI_ADDR_UNSPEC;
  fi_context2 ctx{};
  std::vector<void*> others;  // contexts of completions that were not the awaited operation's

  explicit Outsider(const std::vector<char>& memnode_addr) {
    mr.bind(ep.ep());
    peer = ep.insert(memnode_addr);
  }
  /// Posts one operation and waits up to 5 s for its completion: true only when it succeeded.
  bool succeeds(const std::function<ssize_t()>& post) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    ssize_t rc;
    while ((rc = post()) == -FI_EAGAIN) {
      fi_cq_read(ep.cq(), nullptr, 0);
      if (std::chrono::steady_clock::now() > end) return false;
    }
    if (rc != 0) return false;  // refused at posting
    while (std::chrono::steady_clock::now() < end) {
      fi_cq_msg_entry e{};
      rc = fi_cq_read(ep.cq(), &e, 1);
      if (rc == 1 && e.op_context != &ctx) {  // a receive's: not this operation's
        others.push_back(e.op_context);
        continue;
      }
      if (rc == 1) return true;
      if (rc == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(ep.cq(), &err, 0);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return false;  // no completion at all is no success either
  }
  bool read(uint64_t addr, uint64_t key) {
    return succeeds([&] { return fi_read(ep.ep(), buf.data(), 64, mr.desc(), peer, addr, key, &ctx); });
  }
  /// A WRITE's local completion only says the bytes left (tcp completes it on sending):
  /// whether it landed is for the region to tell (landed()).
  bool write(uint64_t addr, uint64_t key) {
    std::memset(buf.data(), 0xAB, 64);
    return succeeds([&] { return fi_write(ep.ep(), buf.data(), 64, mr.desc(), peer, addr, key, &ctx); });
  }
  /// Do the 64 bytes at `addr`, read with the real key, show write()'s pattern within `wait`?
  /// (The WRITE went over another connection, so it may arrive a little later.)
  bool landed(uint64_t addr, uint64_t key, std::chrono::milliseconds wait) {
    const auto end = std::chrono::steady_clock::now() + wait;
    do {
      std::memset(buf.data(), 0, 64);
      if (!read(addr, key)) throw std::runtime_error("the real key no longer reads");
      bool all = true;
      for (int i = 0; i < 64; ++i) all = all && static_cast<unsigned char>(buf[i]) == 0xAB;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < end);
    return false;
  }
  bool fetch_add(uint64_t addr, uint64_t key) {
    std::memset(buf.data(), 1, 8);
    return succeeds([&] {
      return fi_fetch_atomic(ep.ep(), buf.data(), 1, mr.desc(), buf.data() + 64, mr.desc(), peer, addr, key,
                             FI_UINT64, FI_SUM, &ctx);
    });
  }
  bool compare_swap(uint64_t addr, uint64_t key) {
    return succeeds([&] {
      return fi_compare_atomic(ep.ep(), buf.data(), 1, mr.desc(), buf.data() + 8, mr.desc(), buf.data() + 64,
                               mr.desc(), peer, addr, key, FI_UINT64, FI_CSWAP, &ctx);
    });
  }
};

/// What a computenode learns at connect time (the fabric address is no secret: `ss -ltn`
/// shows the listening socket; the key is what the token guards). The key works while the
/// control connection stays open: pass `keep` to hold it.
fabric::Welcome welcome_of(const std::string& memnode, const std::string& token, const std::vector<char>& me,
                           std::unique_ptr<fabric::ControlClient>* keep = nullptr, uint32_t cn_id = 9) {
  auto cc = std::make_unique<fabric::ControlClient>(memnode);
  fabric::Hello h;
  h.provider = fabric::Provider::Tcp;
  h.cn_id = cn_id;
  h.token = token;
  h.fabric_addr = me;
  fabric::Welcome w = cc->handshake(h);
  if (keep) *keep = std::move(cc);
  return w;
}

/// Pings a control connection every 500 ms, as a computenode's heartbeat does: the memnode drops
/// a member silent for 10 s and closes its key (a test that runs long, e.g. under TSan, would
/// otherwise lose the key it is checking).
class Pinger {
 public:
  explicit Pinger(fabric::ControlClient& cc) : t_([this, &cc] {
      std::unique_lock g(mu_);
      while (!cv_.wait_for(g, std::chrono::milliseconds(500), [&] { return stop_; })) cc.send_ping();
    }) {}
  ~Pinger() {
    {
      std::lock_guard g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    t_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread t_;
};

/// A computenode admitted as `cn_id` with fabric address `addr`, for as long as the returned
/// control connection stays open.
std::unique_ptr<fabric::ControlClient> admit(const std::string& memnode, const std::string& token, uint32_t cn_id,
                                             const std::vector<char>& addr) {
  auto cc = std::make_unique<fabric::ControlClient>(memnode);
  fabric::Hello h;
  h.provider = fabric::Provider::Tcp;
  h.cn_id = cn_id;
  h.token = token;
  h.fabric_addr = addr;
  cc->handshake(h);
  return cc;
}

/// A message in the computenode format: header (claiming computenode `from_cn`), the
/// sender's address, then `body`.
std::vector<char> wire_message(const std::vector<char>& me, uint32_t from_cn, const std::vector<char>& body) {
  lf::WireMsgHeader h{lf::kWireMsgMagic, 0xffff, static_cast<uint16_t>(me.size()), from_cn,
                      static_cast<uint32_t>(body.size())};
  std::vector<char> msg(reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h) + sizeof h);
  msg.insert(msg.end(), me.begin(), me.end());
  msg.insert(msg.end(), body.begin(), body.end());
  return msg;
}

/// Posts a receive, sends `msg` from `o`, and says whether an answer arrived within `wait` (the
/// receive is taken back when none did).
bool answered(Outsider& o, const std::vector<char>& msg, std::chrono::milliseconds wait = std::chrono::seconds(1)) {
  std::memcpy(o.buf.data(), msg.data(), msg.size());
  fi_context2 rctx{};
  o.others.clear();
  if (fi_recv(o.ep.ep(), o.buf.data() + 4096, 4096, o.mr.desc(), FI_ADDR_UNSPEC, &rctx) != 0) return false;
  if (!o.succeeds([&] { return fi_send(o.ep.ep(), o.buf.data(), msg.size(), o.mr.desc(), o.peer, &o.ctx); }))
    throw std::runtime_error("the provider did not take the message");
  const auto end = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < end) {
    fi_cq_msg_entry e{};
    if (fi_cq_read(o.ep.cq(), &e, 1) == 1) o.others.push_back(e.op_context);
    if (std::count(o.others.begin(), o.others.end(), static_cast<void*>(&rctx)) > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Its cancellation is reported as an error completion: read it, or the next wait sees it.
  fi_cancel(&o.ep.ep()->fid, &rctx);
  for (int k = 0; k < 200; ++k) {
    fi_cq_msg_entry e{};
    if (fi_cq_read(o.ep.cq(), &e, 1) == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(o.ep.cq(), &err, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

/// Answers `msg` with the payload of the memnode's reply (empty when none came within 1 s).
std::vector<char> reply_to(Outsider& o, const std::vector<char>& msg) {
  if (!answered(o, msg)) return {};
  lf::WireMsgHeader h;
  std::memcpy(&h, o.buf.data() + 4096, sizeof h);
  const char* p = o.buf.data() + 4096 + sizeof h + h.addr_len;
  return std::vector<char>(p, p + h.len);
}

std::vector<char> store_request(const std::string& dir) {
  const admin::StoreRequest req = admin::make_store_request(dir, 77);
  const char* p = reinterpret_cast<const char*>(&req);
  return std::vector<char>(p, p + sizeof req);
}

}  // namespace

TEST_CASE("security: without the region key an outsider's READ WRITE and atomics over tcp all fail",
          "[integration][security]") {
  TempDir dir;
  std::ofstream(dir.file("token")) << "sesame\n";
  Memnode m(dir, 3, "tcp", "127.0.0.1:0", {"--token-file", dir.file("token")});
  lf::RawEndpoint probe{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  std::unique_ptr<fabric::ControlClient> session;
  const fabric::Welcome w = welcome_of(m.address, "sesame", probe.name(), &session);
  const uint64_t header = w.region_base, data = w.region_base + w.region_size / 2;
  std::optional<Pinger> alive(std::in_place, *session);

  // With the key of the welcome, the client reads: it is a working client.
  REQUIRE(Outsider(w.fabric_addr).read(header, w.region_key));

  // Each guess from a fresh client (a failed operation may close the client's connection,
  // which must not be what makes the next one fail).
  const uint64_t old_fixed_key = 0xD40000 + 3;
  for (uint64_t guess : {old_fixed_key, uint64_t{0}, uint64_t{1}, w.region_key ^ 1, w.region_key + 1}) {
    INFO("key guessed: " << guess);
    CHECK_FALSE(Outsider(w.fabric_addr).read(header, guess));
    Outsider(w.fabric_addr).write(data, guess);
    CHECK_FALSE(Outsider(w.fabric_addr).landed(data, w.region_key, std::chrono::milliseconds(200)));
    CHECK_FALSE(Outsider(w.fabric_addr).fetch_add(header + 64, guess));
    CHECK_FALSE(Outsider(w.fabric_addr).compare_swap(data, guess));
  }
  CHECK(Outsider(w.fabric_addr).read(header, w.region_key));  // the memnode still serves
  // ... and a WRITE with the real key does land (so landed() can tell).
  Outsider(w.fabric_addr).write(data, w.region_key);
  CHECK(Outsider(w.fabric_addr).landed(data, w.region_key, std::chrono::seconds(3)));
  CHECK(m.proc->running());  // and serves on

  alive.reset();

  // A wrong token gets no welcome, so no key.
  CHECK_THROWS(welcome_of(m.address, "guess", probe.name()));

  // A restarted memnode registers its region under another key.
  m.proc->signal(SIGTERM);
  CHECK(m.proc->wait(std::chrono::seconds(10)) == 0);
  Memnode again(dir, 3, "tcp", "127.0.0.1:0", {"--token-file", dir.file("token")});
  const fabric::Welcome w2 = welcome_of(again.address, "sesame", probe.name());
  CHECK(w2.region_key != w.region_key);
  CHECK(w2.region_key != old_fixed_key);
}

TEST_CASE("security: over tcp each computenode gets a key of its own that stops working when it leaves",
          "[integration][security]") {
  TempDir dir;
  std::ofstream(dir.file("token")) << "sesame\n";
  Memnode m(dir, 1, "tcp", "127.0.0.1:0", {"--token-file", dir.file("token")});
  lf::RawEndpoint a{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  lf::RawEndpoint b{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  std::unique_ptr<fabric::ControlClient> ca, cb;
  const fabric::Welcome wa = welcome_of(m.address, "sesame", a.name(), &ca, 4);
  const fabric::Welcome wb = welcome_of(m.address, "sesame", b.name(), &cb, 5);
  CHECK(wa.region_key != wb.region_key);
  REQUIRE(Outsider(wa.fabric_addr).read(wa.region_base, wa.region_key));
  REQUIRE(Outsider(wb.fabric_addr).read(wb.region_base, wb.region_key));
  // Computenode 4 leaves (its control connection closes): its key no longer reads or writes;
  // computenode 5's still does.
  ca.reset();
  bool revoked = false;
  for (int i = 0; i < 50 && !revoked; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    revoked = !Outsider(wa.fabric_addr).read(wa.region_base, wa.region_key);
  }
  CHECK(revoked);
  const uint64_t data = wb.region_base + wb.region_size / 2;
  Outsider(wa.fabric_addr).write(data, wa.region_key);
  CHECK_FALSE(Outsider(wb.fabric_addr).landed(data, wb.region_key, std::chrono::milliseconds(300)));
  CHECK(Outsider(wb.fabric_addr).read(wb.region_base, wb.region_key));
}

TEST_CASE("security: over tcp the data endpoint listens where the control port does", "[integration][security]") {
  TempDir dir;
  // Without a token, --listen 0.0.0.0 keeps both on loopback (the data endpoint used to take
  // the first non-loopback interface, with the fixed key).
  Memnode m(dir, 0, "tcp", "0.0.0.0:0");
  CHECK(m.address.rfind("127.0.0.1:", 0) == 0);
  lf::RawEndpoint probe{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  const fabric::Welcome w = welcome_of(m.address, "", probe.name());
  REQUIRE(w.fabric_addr.size() >= sizeof(sockaddr_in));
  sockaddr_in a{};
  std::memcpy(&a, w.fabric_addr.data(), sizeof a);
  REQUIRE(a.sin_family == AF_INET);
  CHECK(ntohl(a.sin_addr.s_addr) == INADDR_LOOPBACK);

  // With a token, a wildcard is refused naming the flag: it names no interface to bind to.
  std::ofstream(dir.file("token")) << "sesame\n";
  auto r = run({bin("memnode"), "--id", "1", "--provider", "tcp", "--listen", "0.0.0.0:0", "--region", "64MiB",
                "--token-file", dir.file("token")},
               dir, "wild", std::chrono::seconds(30));
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--listen 0.0.0.0:0") && Catch::Contains("one interface"));
}

TEST_CASE("security: a memnode acts on no fabric message from an address no admitted computenode registered",
          "[integration][security]") {
  TempDir dir;
  std::ofstream(dir.file("token")) << "sesame\n";
  Memnode m(dir, 2, "tcp", "127.0.0.1:0", {"--token-file", dir.file("token")});
  lf::RawEndpoint probe{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  const std::vector<char> memnode_addr = welcome_of(m.address, "sesame", probe.name()).fabric_addr;
  // Computenode 9 stays admitted (its hello's address is the probe's); the outsider is another
  // endpoint that claims to be computenode 9 and writes its own address in the header.
  auto cn9 = admit(m.address, "sesame", 9, probe.name());
  Outsider out(memnode_addr);
  const uint32_t stats_request = 0xD4A50003u;  // an admin message the memnode answers
  std::vector<char> body(16, 0);
  std::memcpy(body.data(), &stats_request, 4);
  for (int i = 0; i < 3; ++i) CHECK_FALSE(answered(out, wire_message(out.ep.name(), 9, body)));
  CHECK(m.proc->running());
  CHECK_THAT(m.proc->output(), Catch::Contains("dropped a message from a fabric address no admitted computenode"));
}

TEST_CASE("security: an admitted computenode speaks in the relay only under its own id", "[integration][security]") {
  TempDir dir;
  Memnode m(dir, 0, "tcp");
  lf::RawEndpoint probe{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  const std::vector<char> memnode_addr = welcome_of(m.address, "", probe.name()).fabric_addr;
  // Computenode 5, admitted with its endpoint's address, its control connection kept open.
  Outsider cn5(memnode_addr);
  auto cc = admit(m.address, "", 5, cn5.ep.name());
  // A relay join from computenode 5's endpoint; `claimed` is the id inside the relay message.
  auto join = [&](uint32_t claimed) {
    return wire_message(cn5.ep.name(), 5, relay::encode(relay::Type::Join, claimed, claimed, 8, 1));
  };
  CHECK_FALSE(answered(cn5, join(3)));  // as computenode 3: dropped
  CHECK_THAT(m.proc->output(), Catch::Contains("claiming to be computenode 3"));
  CHECK(answered(cn5, join(5)));  // as itself: the relay answers
}

TEST_CASE("security: a store request is acted on only from a member and only inside --store-dir",
          "[integration][security]") {
  TempDir dir;
  std::ofstream(dir.file("token")) << "sesame\n";
  TempDir elsewhere;
  Memnode m(dir, 2, "tcp", "127.0.0.1:0", {"--token-file", dir.file("token")});  // --store-dir: the test's directory
  lf::RawEndpoint probe{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  const std::vector<char> memnode_addr = welcome_of(m.address, "sesame", probe.name()).fabric_addr;

  // A stranger's request, even claiming an admitted computenode's id: no answer, no file.
  auto cn9 = admit(m.address, "sesame", 9, probe.name());
  Outsider stranger(memnode_addr);
  CHECK(reply_to(stranger, wire_message(stranger.ep.name(), 9, store_request(elsewhere.file("loot")))).empty());
  CHECK(reply_to(stranger, wire_message(stranger.ep.name(), 9, store_request("inside"))).empty());
  CHECK_FALSE(std::filesystem::exists(elsewhere.file("loot")));
  CHECK_FALSE(std::filesystem::exists(dir.file("inside")));

  // A member's request outside the store directory: refused with the reason, nothing written.
  Outsider member(memnode_addr);
  auto cn4 = admit(m.address, "sesame", 4, member.ep.name());
  for (const std::string& target : {elsewhere.file("loot"), std::string("../escape"), std::string("/")}) {
    INFO("directory " << target);
    const std::vector<char> r = reply_to(member, wire_message(member.ep.name(), 4, store_request(target)));
    admin::StoreReply rep{};
    REQUIRE(admin::decode(r, admin::MsgType::StoreReply, rep));
    CHECK(rep.ok == 0);
    CHECK_THAT(admin::get_text(rep.message, sizeof rep.message, rep.message_len), Catch::Contains("--store-dir"));
  }
  CHECK_FALSE(std::filesystem::exists(elsewhere.file("loot")));
  CHECK_FALSE(std::filesystem::exists(dir.path.parent_path() / "escape"));

  // Inside it: written, readable by the memnode's user only.
  const std::vector<char> r = reply_to(member, wire_message(member.ep.name(), 4, store_request("snap")));
  admin::StoreReply rep{};
  REQUIRE(admin::decode(r, admin::MsgType::StoreReply, rep));
  CHECK(rep.ok == 1);
  const std::filesystem::path img = dir.file("snap/memnode-2.img");
  REQUIRE(std::filesystem::exists(img));
  CHECK((std::filesystem::status(img).permissions() & std::filesystem::perms::all) ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
}

TEST_CASE("security: a member that reads none of its replies fills only its own bounded queue",
          "[integration][security]") {
  TempDir dir;
  Memnode m(dir, 4, "tcp");
  lf::RawEndpoint probe{lf::Domain::open(fabric::Provider::Tcp, "127.0.0.1"), false};
  const std::vector<char> memnode_addr = welcome_of(m.address, "", probe.name()).fabric_addr;
  Outsider deaf(memnode_addr), other(memnode_addr);
  auto cc5 = admit(m.address, "", 5, deaf.ep.name());
  auto cc6 = admit(m.address, "", 6, other.ep.name());

  // Computenode 5 sends requests that each get a 3 KiB refusal, and posts no receive: its
  // socket fills, then the memnode's sends to it are refused and its replies wait.
  const std::vector<char> msg = wire_message(deaf.ep.name(), 5, store_request("/"));
  std::memcpy(deaf.buf.data(), msg.data(), msg.size());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  std::vector<fi_context2> ctx(20000);
  size_t sent = 0;
  while (sent < ctx.size() && std::chrono::steady_clock::now() < end) {
    const ssize_t rc = fi_send(deaf.ep.ep(), deaf.buf.data(), msg.size(), deaf.mr.desc(), deaf.peer, &ctx[sent]);
    fi_cq_msg_entry e[64];
    fi_cq_read(deaf.ep.cq(), e, 64);  // send completions only: progress, but nothing received
    if (rc == 0) ++sent;
  }
  INFO("requests sent " << sent);
  CHECK(sent > 5000);
  // Another member is answered once the memnode has worked through the flood's requests
  // (in order, a few seconds): the replies waiting for computenode 5 hold up nobody's.
  std::vector<char> stats(sizeof(admin::StatsRequest), 0);
  const uint32_t t = static_cast<uint32_t>(admin::MsgType::StatsRequest);
  std::memcpy(stats.data(), &t, 4);
  CHECK(answered(other, wire_message(other.ep.name(), 6, stats), std::chrono::seconds(20)));
  CHECK(answered(other, wire_message(other.ep.name(), 6, stats)));
  CHECK(m.proc->running());
  CHECK_THAT(m.proc->output(), Catch::Contains("replies wait for it already"));
}

TEST_CASE("security: over cxl the memnode's socket closes connections that send no hello and delays no computenode",
          "[integration][security]") {
  TempDir dir;
  Memnode m(dir, 0, "cxl");
  // Anyone on the host finds the abstract name (/proc/net/unix); the memnode's log names it too.
  const std::string log = m.proc->output();
  const auto at = log.find("socket @");
  REQUIRE(at != std::string::npos);
  const std::string name = log.substr(at + 8, log.find(')', at) - at - 8);
  std::vector<int> silent;
  for (int i = 0; i < 40; ++i) {
    const int fd = fabric::cxl::connect_abstract(name);
    REQUIRE(fd >= 0);
    silent.push_back(fd);
  }
  // A computenode joins and checks every operation meanwhile.
  auto r = run({bin("computenode"), "--provider", "cxl", "--memnodes", m.address, "selftest"}, dir, "selftest",
               std::chrono::seconds(30));
  CHECK(r.code == 0);
  // Every silent connection is closed: the oldest 8 at once (32 wait at most), the rest after 3 s.
  const auto t0 = std::chrono::steady_clock::now();
  size_t closed = 0;
  for (int fd : silent) {
    pollfd pf{fd, POLLIN, 0};
    char c;
    if (::poll(&pf, 1, 6000) == 1 && ::recv(fd, &c, 1, 0) == 0) ++closed;
    ::close(fd);
  }
  CHECK(closed == silent.size());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8));
  CHECK_THAT(m.proc->output(), Catch::Contains("wait for a hello; closing the oldest") &&
                                   Catch::Contains("sent no hello within 3 s"));
  CHECK(m.proc->running());
}

TEST_CASE("security: serve refuses a non-loopback address without the cluster token, naming the flag",
          "[integration][security]") {
  TempDir dir;
  Memnode m(dir, 0, "shm");
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--listen", "0.0.0.0:0"},
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"}}) {
    std::vector<std::string> argv{bin("computenode"), "--memnodes", m.address, "serve"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto r = run(argv, dir, "serve", std::chrono::seconds(30));
    CHECK(r.code != 0);
    CHECK_THAT(r.output, Catch::Contains(flags[flags.size() - 2] + " 0.0.0.0:0: a non-loopback address needs the "
                                         "cluster token"));
  }
}
