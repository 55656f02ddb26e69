// libfabric transport, memory side: a registered region served over one endpoint (plus RMA
// lanes), messages from computenodes, and the target-side progress shm and tcp need.
// One unit: it is one class, whose admitted addresses, lanes and reply queue every part uses;
// its event loop (run) is split into its steps below.
#include <poll.h>
#include <sched.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "common/fabric/libfabric/lf.hpp"
#include "common/fabric/region_backend.hpp"

namespace dmhnsw::fabric {

using Clock = std::chrono::steady_clock;

namespace {

/// The region's key where the provider takes the one we ask for (tcp, shm): random at every
/// start and handed out only in the welcome, after the token check, so it is a capability. A
/// fixed key let anyone who reached the data endpoint read and write the region.
uint64_t random_region_key(const lf::Domain& d) {
  const size_t bytes = d.info()->domain_attr->mr_key_size;
  for (;;) {
    uint64_t k = 0;
    if (::getrandom(&k, sizeof k, 0) != static_cast<ssize_t>(sizeof k))
      throw FabricError(std::string("getrandom for the region key: ") + std::strerror(errno));
    if (bytes > 0 && bytes < sizeof k) k &= (uint64_t{1} << (8 * bytes)) - 1;
    // Clear of the keys this domain gives its own buffers (next_local_key), and not 0.
    if (k != 0 && (k < lf::Domain::kLocalKeyBase || k >= lf::Domain::kLocalKeyBase + (uint64_t{1} << 20))) return k;
  }
}

class LfRegionServer final : public RegionBackend {
 public:
  LfRegionServer(Provider p, const std::string& listen_host, char* region, uint64_t size, uint16_t memnode_id,
                 unsigned rma_lanes);
  std::vector<char> fabric_address() const override;
  std::vector<std::vector<char>> rma_lane_addresses() const override;
  uint64_t remote_base() const override;
  uint64_t key() const override;
  uint64_t client_key(uint32_t cn_id, const std::vector<char>& addr) override;
  std::string describe() const override;
  void add_client(uint32_t cn_id, const std::vector<char>& fabric_addr) override;
  void remove_client(uint32_t cn_id) override;
  void add_client_address(uint32_t cn_id, const std::vector<char>& fabric_addr) override;
  void remove_client_address(uint32_t cn_id, const std::vector<char>& fabric_addr) override;
  void set_handler(RegionServer::Handler h) override;
  void send_to(uint64_t sender, const void* data, size_t len) override;
  void set_tick(std::function<void()> tick, int period_ms) override;
  void run(const std::atomic<bool>& stop) override;
  /// Fault injection (DMHNSW_FAULT_STALL_FILE=PATH): true once PATH exists (looked for every
  /// 100 ms), and fabric progress stops while the control connection keeps answering.
  bool fault_stalled(const char* stall_file, Clock::time_point& next_check);
  /// The tick, departures, queued replies and abandoned lanes, each on its own period.
  void housekeeping(Clock::time_point& next_tick, Clock::time_point& next_lane_check);
  /// A failed completion: a reply that could not go (dropped) or a receive to post again.
  void on_cq_error(fid_cq* cq);
  /// A batch of completions: replies sent, messages received (handled, receive posted again).
  void on_completions(const fi_cq_msg_entry* e, const fi_addr_t* src, ssize_t n);
  RegionServer::Stats stats() const override;
  double progress_stalled_seconds() const override;

  using Handler = RegionServer::Handler;
  std::shared_ptr<lf::Domain> domain;
  std::unique_ptr<lf::RawEndpoint> ep;
  std::vector<std::unique_ptr<lf::RawEndpoint>> lanes;  // one-sided operations only
  std::unique_ptr<lf::MemoryRegion> region_mr;
  Provider provider;
  // tcp: the region registered once per admitted computenode (by hello address), closed when
  // it leaves; region_mr's key is handed to nobody then.
  std::map<std::string, std::unique_ptr<lf::MemoryRegion>> client_mrs;
  char* region = nullptr;
  uint64_t size = 0;
  uint16_t id = 0;
  std::mutex mu;  // members + handler
  // Fabric addresses of admitted computenodes (the hello's and those registered over the
  // control connection): a message is acted on only when its source is one of them.
  std::map<fi_addr_t, uint32_t> members;
  std::map<std::string, fi_addr_t> member_av;  // address bytes → AV entry
  // Entries of computenodes that left, removed from the AV by the progress thread once no
  // message to them is posted: kept, each cost the memnode about 0.3 KB (and rxm its
  // connection state) for good, ~30 KB per d-HNSW insert round of experiments/soak.
  std::vector<fi_addr_t> departed_av;
  uint64_t strangers = 0;  // messages dropped: not from a member (progress thread only)
  Handler handler;
  std::function<void()> tick;
  int tick_ms = 50;
  BufferPool bufs{36u << 20};  // receives, and kMaxQueuedPerDest replies for 32 destinations
  std::unique_ptr<lf::MemoryRegion> bufs_mr;
  std::vector<Buffer> recv_bufs;
  std::vector<std::unique_ptr<fi_context2>> recv_ctx;
  struct Outgoing {
    fi_addr_t to;
    Buffer buf;
    size_t len;
    std::unique_ptr<fi_context2> ctx;
    Clock::time_point deadline;
  };
  std::deque<Outgoing> outbox;     // not yet accepted by the provider
  // Messages held per destination, queued or posted and not yet completed: a computenode that
  // takes none of them (stopped, or reading nothing) holds at most this many buffers of
  // `bufs`, so 32 such computenodes fit in the arena before anyone else's replies are dropped.
  static constexpr unsigned kMaxQueuedPerDest = 256;
  std::map<fi_addr_t, unsigned> queued;
  void release_one(fi_addr_t to) {
    if (auto q = queued.find(to); q != queued.end() && --q->second == 0) queued.erase(q);
  }
  std::vector<Outgoing> in_flight;  // posted, waiting for the send completion
  std::atomic<uint64_t> spins{0}, waits{0}, messages{0}, dropped{0};
  std::atomic<int64_t> loop_ns{0};  // steady-clock time of run()'s last turn (0: not running)

  // The endpoints close before the buffers and registrations declared after them are freed:
  // posted receives point into `bufs`.
  ~LfRegionServer() override {
    stop_lane_thread();
    if (ep) ep->close();
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (lane_abandoned && lane_abandoned[i].load())
        (void)lanes[i].release();  // closing it would wait for the dead holder's lock: leave it
      else
        lanes[i]->close();
    }
  }

  // RMA lanes post nothing; reading their CQs drives their progress (on shm, the
  // acknowledgements of served READs that free command-queue slots), and reading their
  // counters tells the progress loop that READs are being served. Both take the lane's
  // shared-memory lock on shm, which a computenode killed inside a READ can leave held for
  // ever. So lanes are progressed by their own thread, never by the message loop: a lane
  // found stuck for kLaneStuck is abandoned (its thread too, at idle priority) and a new
  // thread carries on with the other lanes. Each computenode reads through lanes of its own
  // (FabricEndpoint), so only the dead one's lanes are lost.
  static constexpr auto kLaneStuck = std::chrono::seconds(2);
  struct LaneWatch {
    std::atomic<int> current{-1};     // the lane being read, -1 none
    std::atomic<int64_t> since_ns{0}; // when that read started
    std::atomic<pid_t> tid{0};
    std::atomic<bool> superseded{false};
  };
  std::unique_ptr<std::atomic<uint64_t>[]> lane_ops;     // per lane, as last read
  std::unique_ptr<std::atomic<bool>[]> lane_abandoned;   // per lane
  std::shared_ptr<LaneWatch> watch;
  std::thread lane_thread;
  std::atomic<bool> lanes_stop{false};
  std::atomic<bool> fault_stall{false};  // DMHNSW_FAULT_STALL_FILE: no progress at all, lanes included

  void start_lane_thread() {
    watch = std::make_shared<LaneWatch>();
    lane_thread = std::thread([this, w = watch] {
      w->tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
      auto last_work = Clock::now();
      while (!lanes_stop.load(std::memory_order_relaxed) && !w->superseded.load()) {
        if (fault_stall.load(std::memory_order_relaxed)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          continue;
        }
        for (size_t i = 0; i < lanes.size(); ++i) {
          if (lane_abandoned[i].load()) continue;
          w->since_ns.store(Clock::now().time_since_epoch().count());
          w->current.store(static_cast<int>(i));
          fi_cq_msg_entry e[16];
          const ssize_t rc = fi_cq_read(lanes[i]->cq(), e, 16);
          if (rc == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(lanes[i]->cq(), &err, 0) > 0)
              spdlog::debug("memnode {}: an RMA lane reported: {}", id, fi_strerror(err.err));
          }
          const uint64_t ops = lanes[i]->remote_ops();
          if (rc > 0 || ops != lane_ops[i].load(std::memory_order_relaxed)) last_work = Clock::now();
          lane_ops[i].store(ops);
          w->current.store(-1);
          if (w->superseded.load()) {  // taken for stuck, but it was only slow: the lane is fine
            lane_abandoned[i].store(false);
            return;
          }
        }
        // While READs arrive (and 5 ms after), go round again after yielding the core (2-core
        // hosts); when idle, every 50 µs.
        if (Clock::now() - last_work < std::chrono::milliseconds(5))
          sched_yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  // From the message loop, now and then: abandons a lane whose read has not returned.
  void check_lanes() {
    if (!watch) return;
    const int cur = watch->current.load();
    if (cur < 0) return;
    const auto since = Clock::time_point(Clock::duration(watch->since_ns.load()));
    if (watch->current.load() != cur || Clock::now() - since < kLaneStuck) return;
    lane_abandoned[cur].store(true);
    watch->superseded.store(true);
    sched_param sp{};
    ::sched_setscheduler(watch->tid.load(), SCHED_IDLE, &sp);  // it spins on the lock: only on idle CPU
    lane_thread.detach();
    spdlog::error("memnode {}: RMA lane {} did not return for {} s: its lock is held by a process that died "
                  "inside the provider (a computenode killed during a READ); the lane is abandoned, the other "
                  "lanes and messages go on",
                  id, cur, std::chrono::duration_cast<std::chrono::seconds>(kLaneStuck).count());
    start_lane_thread();
  }
  void stop_lane_thread() {
    lanes_stop.store(true);
    if (lane_thread.joinable()) lane_thread.join();
  }
  uint64_t remote_ops() const {
    uint64_t n = ep->remote_ops();
    for (size_t i = 0; i < lanes.size(); ++i) n += lane_ops[i].load(std::memory_order_relaxed);
    return n;
  }
  void post_recv(size_t slot) {
    lf::check(fi_recv(ep->ep(), recv_bufs[slot].data(), lf::kWireMsgBytes, bufs_mr->desc(), FI_ADDR_UNSPEC,
                      recv_ctx[slot].get()),
              "fi_recv");
  }
  // Posts queued replies; never blocks on a computenode that does not progress.
  // Posts queued messages; never blocks on a computenode that does not progress. A
  // destination that refuses (EAGAIN) keeps its messages, in order, for the next pass while
  // the others' go out (a dead computenode must not delay everyone's replies).
  void flush_outbox() {
    if (outbox.empty()) return;
    std::vector<fi_addr_t> refused;
    const auto now = Clock::now();
    for (auto it = outbox.begin(); it != outbox.end();) {
      if (std::find(refused.begin(), refused.end(), it->to) != refused.end()) {
        ++it;
        continue;
      }
      ssize_t rc = fi_send(ep->ep(), it->buf.data(), it->len, bufs_mr->desc(), it->to, it->ctx.get());
      if (rc == -FI_EAGAIN) {
        if (now < it->deadline) {
          refused.push_back(it->to);
          ++it;
          continue;
        }
        ++dropped;
        spdlog::warn("memnode {}: dropped a message: the computenode did not accept it within 5 s", id);
        release_one(it->to);
      } else if (rc == 0) {
        in_flight.push_back(std::move(*it));
      } else {
        ++dropped;
        spdlog::warn("memnode {}: message send failed: {}", id, fi_strerror(static_cast<int>(-rc)));
        release_one(it->to);
      }
      it = outbox.erase(it);
    }
  }
  void queue_send(fi_addr_t to, const void* data, size_t n) {
    if (to == FI_ADDR_UNSPEC || n > kMaxMessage) return;
    {
      // Only to members: the relay may still name one that left, whose AV entry goes (and
      // whose slot a newcomer may get).
      std::lock_guard g(mu);
      if (members.count(to) == 0) return;
    }
    unsigned& waiting = queued[to];
    if (waiting >= kMaxQueuedPerDest) {
      if (++dropped % 1000 == 1)
        spdlog::warn("memnode {}: dropped a message to a computenode that takes none: {} replies wait for it "
                     "already ({} dropped so far)",
                     id, waiting, dropped.load());
      return;
    }
    lf::WireMsgHeader rh{lf::kWireMsgMagic, id, 0, 0, static_cast<uint32_t>(n)};
    Buffer b;
    try {
      b = bufs.alloc(sizeof rh + n);
    } catch (const FabricError&) {  // every destination's queue in use at once: drop this one
      if (++dropped % 1000 == 1)
        spdlog::warn("memnode {}: dropped a message: the send buffers are all waiting on computenodes", id);
      if (waiting == 0) queued.erase(to);
      return;
    }
    ++waiting;
    Outgoing o{to, std::move(b), sizeof rh + n, std::make_unique<fi_context2>(),
               Clock::now() + std::chrono::seconds(5)};
    std::memcpy(o.buf.data(), &rh, sizeof rh);
    std::memcpy(o.buf.data() + sizeof rh, data, n);
    outbox.push_back(std::move(o));
  }
  // Progress thread: drops what waits for departed computenodes and removes their AV entries
  // once nothing posted to them is outstanding (a completion would name a freed entry).
  void reap_departed() {
    std::vector<fi_addr_t> gone;
    {
      std::lock_guard g(mu);
      if (departed_av.empty()) return;
      gone.swap(departed_av);
    }
    std::vector<fi_addr_t> later;
    for (fi_addr_t a : gone) {
      for (auto it = outbox.begin(); it != outbox.end();) {
        if (it->to != a) {
          ++it;
          continue;
        }
        release_one(a);
        it = outbox.erase(it);
      }
      if (queued.count(a) != 0) {
        later.push_back(a);
        continue;
      }
      if (int rc = ep->remove(a); rc != 0)
        spdlog::warn("memnode {}: fi_av_remove of a departed computenode's address: {}", id, fi_strerror(-rc));
    }
    if (!later.empty()) {
      std::lock_guard g(mu);
      departed_av.insert(departed_av.end(), later.begin(), later.end());
    }
  }
  bool complete_send(void* ctx) {
    for (auto it = in_flight.begin(); it != in_flight.end(); ++it)
      if (it->ctx.get() == ctx) {
        release_one(it->to);
        in_flight.erase(it);
        return true;
      }
    return false;
  }
  void on_message(size_t slot, size_t len, fi_addr_t src) {
    const char* buf = recv_bufs[slot].data();
    lf::WireMsgHeader h;
    std::memcpy(&h, buf, sizeof h);
    if (h.magic != lf::kWireMsgMagic || h.len > kMaxMessage || h.addr_len > lf::kMaxAddrBytes ||
        len < sizeof h + h.addr_len + h.len) {
      spdlog::warn("memnode {}: dropped a malformed message ({} bytes)", id, len);
      return;
    }
    // The sender is who the provider says it is, never the address or id a header claims.
    {
      std::lock_guard g(mu);
      auto it = members.find(src);
      if (src == FI_ADDR_NOTAVAIL || src == FI_ADDR_UNSPEC || it == members.end() || it->second != h.from_cn) {
        if (++strangers % 1000 == 1)
          spdlog::warn("memnode {}: dropped a message from a fabric address no admitted computenode registered "
                       "({} so far)", id, strangers);
        return;
      }
    }
    ++messages;
    const fi_addr_t to = src;
    Message msg;
    msg.from_node = h.from_node;
    msg.from_cn = h.from_cn;
    const char* p = buf + sizeof h + h.addr_len;
    msg.payload.assign(p, p + h.len);
    Handler hd;
    {
      std::lock_guard g(mu);
      hd = handler;
    }
    msg.sender = to;
    hd(msg, [&](const void* data, size_t n) { queue_send(to, data, n); });
  }
};

LfRegionServer::LfRegionServer(Provider p, const std::string& listen_host, char* region, uint64_t size,
                               uint16_t memnode_id, unsigned rma_lanes) {
  auto& m = *this;
  m.domain = lf::Domain::open(p, listen_host, /*rma_events=*/true, /*source=*/true);
  // A CQ wait object only where fi_cq_sread really blocks and keeps progressing (tcp,
  // verbs); on shm, activity is seen through the remote-operation counter instead.
  m.ep = std::make_unique<lf::RawEndpoint>(m.domain, p != Provider::Shm);
  m.region = region;
  m.size = size;
  m.id = memnode_id;
  m.provider = p;
  m.region_mr = std::make_unique<lf::MemoryRegion>(m.domain, region, size, FI_REMOTE_READ | FI_REMOTE_WRITE,
                                                   random_region_key(*m.domain));
  m.region_mr->bind(m.ep->ep());
  for (unsigned i = 0; i < rma_lanes; ++i) {
    m.lanes.push_back(std::make_unique<lf::RawEndpoint>(m.domain, false));
    m.region_mr->bind(m.lanes.back()->ep());
  }
  m.lane_ops = std::make_unique<std::atomic<uint64_t>[]>(rma_lanes);
  m.lane_abandoned = std::make_unique<std::atomic<bool>[]>(rma_lanes);
  for (unsigned i = 0; i < rma_lanes; ++i) {
    m.lane_ops[i].store(0);
    m.lane_abandoned[i].store(false);
  }
  m.bufs_mr = std::make_unique<lf::MemoryRegion>(m.domain, m.bufs.arena(), m.bufs.arena_bytes(),
                                                 FI_SEND | FI_RECV, m.domain->next_local_key());
  m.bufs_mr->bind(m.ep->ep());
  for (size_t i = 0; i < 64; ++i) {
    m.recv_bufs.push_back(m.bufs.alloc(lf::kWireMsgBytes));
    m.recv_ctx.push_back(std::make_unique<fi_context2>());
    m.post_recv(i);
  }
  m.handler = [](const Message& in, const std::function<void(const void*, size_t)>& reply) {
    reply(in.payload.data(), in.payload.size());  // default: echo
  };
}

std::vector<char> LfRegionServer::fabric_address() const { return this->ep->name(); }
std::vector<std::vector<char>> LfRegionServer::rma_lane_addresses() const {
  std::vector<std::vector<char>> out;
  for (const auto& l : this->lanes) out.push_back(l->name());
  return out;
}
uint64_t LfRegionServer::remote_base() const { return this->region_mr->remote_base(); }
uint64_t LfRegionServer::key() const { return this->region_mr->key(); }

uint64_t LfRegionServer::client_key(uint32_t, const std::vector<char>& addr) {
  // shm serves RMA from the initiator's side and checks no key: one registration is all.
  if (this->provider != Provider::Tcp) return key();
  auto mr = std::make_unique<lf::MemoryRegion>(this->domain, this->region, this->size,
                                               FI_REMOTE_READ | FI_REMOTE_WRITE, random_region_key(*this->domain));
  mr->bind(this->ep->ep());
  for (auto& l : this->lanes) mr->bind(l->ep());
  const uint64_t k = mr->key();
  std::lock_guard g(this->mu);
  this->client_mrs[std::string(addr.begin(), addr.end())] = std::move(mr);
  return k;
}
std::string LfRegionServer::describe() const { return this->domain->describe(); }

void LfRegionServer::add_client(uint32_t cn_id, const std::vector<char>& addr) { add_client_address(cn_id, addr); }

void LfRegionServer::add_client_address(uint32_t cn_id, const std::vector<char>& addr) {
  fi_addr_t a = this->ep->insert(addr);
  std::lock_guard g(this->mu);
  this->members[a] = cn_id;
  this->member_av[std::string(addr.begin(), addr.end())] = a;
}

void LfRegionServer::remove_client_address(uint32_t cn_id, const std::vector<char>& addr) {
  std::lock_guard g(this->mu);
  this->client_mrs.erase(std::string(addr.begin(), addr.end()));  // its key stops working
  auto it = this->member_av.find(std::string(addr.begin(), addr.end()));
  if (it == this->member_av.end()) return;
  auto m = this->members.find(it->second);
  if (m != this->members.end() && m->second == cn_id) this->members.erase(m);
  this->departed_av.push_back(it->second);
  this->member_av.erase(it);
}

// Membership goes by address (remove_client_address): another process may use the same id.
void LfRegionServer::remove_client(uint32_t) {}

void LfRegionServer::set_handler(Handler h) {
  std::lock_guard g(this->mu);
  this->handler = std::move(h);
}

void LfRegionServer::send_to(uint64_t sender, const void* data, size_t len) {
  this->queue_send(static_cast<fi_addr_t>(sender), data, len);
}

void LfRegionServer::set_tick(std::function<void()> tick, int period_ms) {
  std::lock_guard g(this->mu);
  this->tick = std::move(tick);
  this->tick_ms = period_ms;
}

double LfRegionServer::progress_stalled_seconds() const {
  const int64_t t = this->loop_ns.load(std::memory_order_relaxed);
  if (t == 0) return 0;
  return std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(t))).count();
}

RegionServer::Stats LfRegionServer::stats() const {
  RegionServer::Stats s{this->spins.load(), this->waits.load(), this->messages.load(), this->remote_ops(), {}};
  for (size_t i = 0; i < this->lanes.size(); ++i) s.lane_ops.push_back(this->lane_ops[i].load());
  return s;
}

bool LfRegionServer::fault_stalled(const char* stall_file, Clock::time_point& next_check) {
  if (stall_file != nullptr && !fault_stall.load() && Clock::now() >= next_check) {
    next_check = Clock::now() + std::chrono::milliseconds(100);
    if (std::filesystem::exists(stall_file)) {
      spdlog::warn("memnode {}: {} exists: fabric progress stops (fault injection)", id, stall_file);
      fault_stall.store(true);
    }
  }
  return fault_stall.load(std::memory_order_relaxed);
}

void LfRegionServer::housekeeping(Clock::time_point& next_tick, Clock::time_point& next_lane_check) {
  if (Clock::now() >= next_tick) {
    std::function<void()> t;
    {
      std::lock_guard g(mu);
      t = tick;
      next_tick = Clock::now() + std::chrono::milliseconds(tick_ms);
    }
    if (t) t();
    reap_departed();
  }
  flush_outbox();
  if (Clock::now() >= next_lane_check) {
    next_lane_check = Clock::now() + std::chrono::milliseconds(100);
    check_lanes();
  }
}

void LfRegionServer::on_cq_error(fid_cq* cq) {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(cq, &err, 0) <= 0) return;
  if (complete_send(err.op_context)) {
    spdlog::debug("memnode {}: a reply failed: {}", id, fi_strerror(err.err));
    return;
  }
  for (size_t i = 0; i < recv_ctx.size(); ++i)
    if (err.op_context == recv_ctx[i].get() && err.err != FI_ECANCELED) post_recv(i);
}

void LfRegionServer::on_completions(const fi_cq_msg_entry* e, const fi_addr_t* src, ssize_t n) {
  for (ssize_t i = 0; i < n; ++i) {
    if (complete_send(e[i].op_context)) continue;
    for (size_t slot = 0; slot < recv_ctx.size(); ++slot) {
      if (e[i].op_context != recv_ctx[slot].get()) continue;
      on_message(slot, e[i].len, src[i]);
      post_recv(slot);
      break;
    }
  }
}

void LfRegionServer::run(const std::atomic<bool>& stop) {
  fid_cq* cq = ep->cq();
  // On shm and tcp the target's progress serves one-sided operations, which leave no
  // completion here. Spin while there is a sign of work (a completion, a queued reply, a
  // served remote operation) and for a window after it; when idle, block on the CQ's wait
  // object (tcp, verbs: the provider keeps progressing inside) or, on shm, whose wait does
  // not honour timeouts, poll with a short pause between polls.
  const auto spin_window = std::chrono::milliseconds(5);
  const bool blocking_wait = domain->provider() != Provider::Shm && lanes.empty();  // lanes need polling
  const bool counted = ep->counts_remote_ops();
  uint64_t remote_seen = remote_ops();
  auto last_work = Clock::now();
  auto next_tick = Clock::now();
  const char* stall_file = std::getenv("DMHNSW_FAULT_STALL_FILE");
  if (stall_file != nullptr && *stall_file == '\0') stall_file = nullptr;
  if (stall_file != nullptr)
    spdlog::warn("memnode {}: DMHNSW_FAULT_STALL_FILE={}: fabric progress stops when it exists (fault injection)",
                 id, stall_file);
  auto next_stall_check = Clock::now();
  auto next_lane_check = Clock::now();
  lanes_stop.store(false);
  if (!lanes.empty()) start_lane_thread();
  struct LaneThreadStop {
    LfRegionServer& m;
    ~LaneThreadStop() { m.stop_lane_thread(); }
  } lane_thread_stop{*this};
  while (!stop.load(std::memory_order_relaxed)) {
    if (fault_stalled(stall_file, next_stall_check)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    loop_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    housekeeping(next_tick, next_lane_check);
    fi_cq_msg_entry e[16];
    fi_addr_t src[16];
    ssize_t rc = fi_cq_readfrom(cq, e, 16, src);
    if (rc == -FI_EAGAIN) {
      auto now = Clock::now();
      if (counted) {
        uint64_t r = remote_ops();
        if (r != remote_seen) {
          remote_seen = r;
          last_work = now;
        }
      }
      if (!outbox.empty() || now - last_work < spin_window) {
        ++spins;
        sched_yield();  // share the core with local computenodes (2-core hosts)
        continue;
      }
      ++waits;
      if (!blocking_wait) {
        std::this_thread::sleep_for(std::chrono::microseconds(counted ? 50 : 5));
        continue;
      }
      rc = fi_cq_sreadfrom(cq, e, 16, src, nullptr, 10);
      if (rc == -FI_EAGAIN || rc == -FI_ETIMEDOUT) continue;
      if (rc > 0) last_work = Clock::now();
    }
    if (rc == -FI_EAVAIL) {
      on_cq_error(cq);
      continue;
    }
    if (rc < 0) {
      spdlog::error("memnode {}: fi_cq_read: {}", id, fi_strerror(static_cast<int>(-rc)));
      continue;
    }
    last_work = Clock::now();
    on_completions(e, src, rc);
  }
}

}  // namespace

std::unique_ptr<RegionBackend> make_lf_region_server(Provider p, const std::string& listen_host, char* region,
                                                     uint64_t size, uint16_t memnode_id, unsigned rma_lanes) {
  return std::make_unique<LfRegionServer>(p, listen_host, region, size, memnode_id, rma_lanes);
}

}  // namespace dmhnsw::fabric
