#pragma once
// Out-of-band bootstrap over a TCP control port: a computenode proves it holds the cluster
// token, both sides exchange fabric addresses, the memnode sends its region descriptor and
// region header. The connection stays open and carries heartbeats: it is how a computenode
// learns within seconds that a memnode has gone away.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fabric/transport.hpp"

namespace dmhnsw::fabric {

inline constexpr uint32_t kControlMagic = 0x43484D44;  // "DMHC" little-endian
inline constexpr uint16_t kControlVersion = 4;  // v3: challenge, HMAC; v4: the welcome names the copy of a replica set

/// Index mode carried in the hello and in the region header: 0 = none (any client).
enum class Mode : uint8_t { None = 0, Shine = 1, Dhnsw = 2 };
const char* mode_name(Mode m);
Mode parse_mode(const std::string& s);  // "shine" | "dhnsw" | "none"; throws naming --mode

/// Frame header of every control message. Pinned: it is the one thing every version shares.
struct ControlFrame {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t length;  // payload bytes that follow
  uint32_t reserved;
};
static_assert(sizeof(ControlFrame) == 16);
static_assert(offsetof(ControlFrame, version) == 4 && offsetof(ControlFrame, length) == 8);

/// "host:port" → (host, port); throws naming `flag`.
std::pair<std::string, uint16_t> parse_host_port(const std::string& s, const std::string& flag);
/// Where a memnode binds its control port (and, over tcp, its data endpoint) for `--listen`
/// host `host`: without a token only loopback (127.0.0.1 instead of any other host).
std::string listen_host_for(const std::string& host, const std::string& token);
/// The cluster token from `token_file` or, when empty, the DMHNSW_TOKEN variable ("" if neither).
std::string load_token(const std::string& token_file);

/// What the memnode tells a computenode at connect time.
struct Welcome {
  uint16_t memnode_id = 0;
  Mode mode = Mode::None;
  uint64_t region_base = 0;  // address of region byte 0 in the peer's RMA address space
  uint64_t region_size = 0;
  uint64_t region_key = 0;
  std::vector<char> fabric_addr;
  /// Extra endpoints of the memnode that serve only one-sided operations on the region
  /// (empty: use fabric_addr). See RegionServer's `rma_lanes`.
  std::vector<std::vector<char>> rma_lanes;
  std::array<char, kHeaderBlobBytes> header{};
  /// Replica sets (docs/replication.md): this memnode is copy `copy` of the `copies` memnodes
  /// that serve memnode id `memnode_id`, each with an identical region.
  uint8_t copy = 0, copies = 1;
  uint8_t joining = 0;  // a new copy still being filled (memnode --rejoin): not to be read yet
};

struct Hello {
  Mode mode = Mode::None;
  Provider provider = Provider::Shm;
  uint32_t cn_id = 0;
  std::string token;
  std::vector<char> fabric_addr;
};

/// A computenode's open control connection to one memnode (client side).
class ControlClient {
 public:
  /// Connects (3 s timeout), sends the hello, reads the welcome. Throws FabricError naming
  /// the memnode and the mismatch when refused. `version` is overridable for tests only.
  ControlClient(const std::string& host_port, uint16_t version = kControlVersion);
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  /// The local IP address of this connection: the interface that reaches the memnode.
  std::string local_ip() const;
  Welcome handshake(const Hello& h);
  const std::string& peer() const { return peer_; }
  int fd() const { return fd_; }
  /// Heartbeat: send a ping (non-blocking best effort). Returns false when the socket failed.
  bool send_ping();
  /// Tells the memnode another fabric address of this computenode (an endpoint it made);
  /// registered() grows by one when the memnode confirms (read by drain()).
  void send_register(const std::vector<char>& fabric_addr);
  void send_unregister(const std::vector<char>& fabric_addr);
  uint64_t registered() const { return registered_.load(); }
  /// Reads pending frames after poll() said readable. Returns false on EOF or error.
  bool drain(std::string& why);

 private:
  std::string peer_;
  uint16_t version_;
  int fd_ = -1;
  std::mutex send_mu_;  // the heartbeat thread and endpoint registrations both send
  std::vector<char> in_;  // received bytes of a frame not complete yet (drain)
  std::atomic<uint64_t> registered_{0};
};

/// Server side, run by the memnode: accepts computenodes, checks them, answers heartbeats.
/// One thread serves every connection without blocking on any: a connection gets one deadline
/// (kHelloMs) for its whole hello, at most kMaxPending wait for theirs, and a peer that does not
/// take what it is sent, or sends nothing for Config::silent_ms, is dropped, so a slow or
/// silent client delays nobody.
class ControlServer {
 public:
  struct Config {
    std::string listen;  // host:port (port 0 = pick one)
    std::string token;   // "" = no token: only loopback allowed
    uint16_t memnode_id = 0;
    uint8_t copy = 0, copies = 1;  // memnode --copy, --replicas
    std::function<bool()> joining;  // memnode --rejoin, until the copy is full
    Provider provider = Provider::Shm;
    uint64_t region_base = 0, region_size = 0, region_key = 0;
    std::vector<char> fabric_addr;
    std::vector<std::vector<char>> rma_lanes;
    std::function<Mode()> mode;                                                 // current region mode
    std::function<std::array<char, kHeaderBlobBytes>()> header;                 // current header bytes
    std::function<void(uint32_t cn_id, const std::vector<char>& addr)> on_join;  // accepted computenode
    // The region key of this computenode's welcome (its own registration, revoked through
    // on_forget of its hello address); unset: region_key for everyone.
    std::function<uint64_t(uint32_t cn_id, const std::vector<char>& addr)> key_for;
    std::function<void(uint32_t cn_id)> on_leave;
    std::function<void(uint32_t cn_id, const std::vector<char>& addr)> on_register;  // another endpoint
    // Each address a connection brought (hello, registrations) when that connection closes:
    // two processes may use one computenode id, and one leaving must not unseat the other.
    std::function<void(uint32_t cn_id, const std::vector<char>& addr)> on_forget;
    // A computenode pings every 500 ms; one that sends nothing for this long (stopped, or cut
    // off without a FIN) is dropped like one that closed: its key revoked, its peers told.
    int silent_ms = 10000;  // 20 pings missed; its peers fail within 10 s, not after a lock or barrier timeout
  };
  explicit ControlServer(Config c);
  ~ControlServer();
  /// The bound "host:port" (with the real port when 0 was asked).
  std::string bound() const { return bound_; }
  /// Serves until stop() (poll loop in the calling thread).
  void run();
  void stop();

 private:
  static constexpr int kHelloMs = 3000;
  static constexpr size_t kMaxPending = 32;
  using Clock = std::chrono::steady_clock;
  struct Client {
    int fd;
    uint32_t cn_id;
    std::string from;
    std::vector<char> in;  // bytes of a frame not complete yet
    std::vector<std::vector<char>> addrs;  // the hello's fabric address and those registered since
    Clock::time_point heard;               // its last bytes
  };
  struct Pending {  // connected, no complete hello yet
    int fd;
    std::string from;
    std::vector<char> in;
    Clock::time_point deadline;
    std::vector<char> nonce;  // the challenge sent at accept: the hello's proof must be over it
  };
  void accept_all();
  bool serve(Client& cl);  // false: drop the connection
  void drop(Client& cl, const std::string& why);
  /// Answers a complete hello: welcome (the connection joins clients_) or refuse (closed).
  void handle_hello(Pending& p, uint16_t version, uint16_t type, const std::vector<char>& payload);
  Config c_;
  int listen_fd_ = -1;
  std::string bound_;
  std::atomic<bool> stop_{false};
  int wake_fd_ = -1;  // eventfd: stop() wakes run() at once, so run() need not wake to look
  std::vector<Client> clients_;
  std::vector<Pending> pending_;
};

}  // namespace dmhnsw::fabric
