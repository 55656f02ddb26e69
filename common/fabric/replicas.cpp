#include "common/fabric/replicas.hpp"

#include "common/fabric/replicated.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace dmhnsw::fabric {

namespace {

using Clock = std::chrono::steady_clock;

// A copy that becomes a set's primary takes atomics only this long after the previous primary
// was seen dead: a result another computenode took from the old primary has had its mirror
// posted at once (in the poll that delivered it), so it lands on the new primary first. Without
// the wait two computenodes could both be handed one bump-pointer range.
constexpr auto kPrimarySettle = std::chrono::milliseconds(200);
// A mirrored COMPARE_SWAP waits this long for the copy to hold its expected value (the copy
// applies the primary's transitions in order); past it the copy takes the primary's result.
constexpr auto kMirrorPatience = std::chrono::seconds(2);

// Reads are spread over a set's copies by address, 4 KiB pages hashed to copies: any one
// computenode's reads use every copy's bandwidth, while each byte is read from one copy only, so
// a cache in front of the memory (a CXL device's lines in the CPU's caches) holds it once.
unsigned home_copy(uint64_t offset, unsigned copies) {
  return static_cast<unsigned>(((offset >> 12) * 0x9E3779B97F4A7C15ull) >> 40) % copies;
}

bool caller_error(Status s) {
  return s == Status::OutOfBounds || s == Status::BadLocalBuffer || s == Status::UnknownNode || s == Status::Misaligned;
}

}  // namespace

// ---- ReplicatedCluster: the view

ReplicatedCluster::ReplicatedCluster(std::shared_ptr<Cluster> physical, unsigned copies, uint32_t cn_id)
    : p_(std::move(physical)), r_(copies), cn_(cn_id) {
  const auto& phys = p_->memnodes();
  if (r_ == 0 || phys.size() % r_ != 0)
    throw FabricError("replica sets: " + std::to_string(phys.size()) + " memnodes cannot form sets of " +
                      std::to_string(r_));
  const size_t n = phys.size() / r_;
  seen_dead_ = std::make_unique<std::atomic<int64_t>[]>(phys.size());
  state_ = std::make_unique<std::atomic<uint8_t>[]>(phys.size());
  for (size_t i = 0; i < phys.size(); ++i) {
    seen_dead_[i].store(0);
    state_[i].store(phys[i].joining ? kJoining : kLive);
  }
  for (size_t l = 0; l < n; ++l) {
    // The set's description: a full copy's (a joining one's header is not the set's yet).
    size_t first = l * r_;
    for (unsigned c = 0; c < r_; ++c)
      if (!phys[l * r_ + c].joining) {
        first = l * r_ + c;
        break;
      }
    MemnodeInfo info = phys[first];
    info.id = static_cast<uint16_t>(l);
    info.copy = 0;
    info.copies = static_cast<uint8_t>(r_);
    info.joining = false;
    info.address.clear();
    for (unsigned c = 0; c < r_; ++c) {
      const MemnodeInfo& o = phys[l * r_ + c];
      info.address += (c ? ", " : "") + o.address;
      if (o.region_size != info.region_size)
        throw FabricError("memnode " + std::to_string(l) + ": its copies have regions of different sizes (" +
                          std::to_string(info.region_size) + " bytes at " + phys[first].address + ", copy " +
                          std::to_string(c) + " " + std::to_string(o.region_size) + " bytes at " + o.address +
                          "): start every copy with the same --region");
    }
    infos_.push_back(info);
    sets_.push_back(std::make_unique<SetState>());
  }
}

ReplicatedCluster::~ReplicatedCluster() {
  stop_.store(true);
  if (watcher_.joinable()) watcher_.join();
}

bool ReplicatedCluster::alive(uint16_t node) const {
  for (unsigned c = 0; c < r_; ++c)
    if (copy_alive(node, c)) return true;
  return false;
}

std::string ReplicatedCluster::dead_reason(uint16_t node) const {
  std::string why = "every copy is gone:";
  for (unsigned c = 0; c < r_; ++c) {
    const uint16_t p = phys(node, c);
    why += std::string(c ? ";" : "") + " copy " + std::to_string(c) + " (" + phys_info(node, c).address + ") " +
           (state_[p].load() == kJoining && p_->alive(p) ? std::string("joining, not filled yet") : p_->dead_reason(p));
  }
  return why;
}

bool ReplicatedCluster::copy_alive(uint16_t l, unsigned c) const {
  if (l >= infos_.size()) return false;
  const uint16_t p = phys(l, c);
  if (state_[p].load() != kLive) return false;
  if (p_->alive(p)) return true;
  note_dead(p);
  return false;
}

int ReplicatedCluster::primary(uint16_t l) const {
  for (unsigned c = 0; c < r_; ++c)
    if (copy_alive(l, c)) return static_cast<int>(c);
  return -1;
}

void ReplicatedCluster::settle(uint16_t l, unsigned c) const {
  int64_t latest = 0;
  for (unsigned b = 0; b < c; ++b) latest = std::max(latest, seen_dead_[phys(l, b)].load());
  if (latest == 0) return;
  const auto ready = Clock::time_point(Clock::duration(latest)) + kPrimarySettle;
  if (Clock::now() < ready) std::this_thread::sleep_until(ready);
}

void ReplicatedCluster::fence(uint16_t l, unsigned c, const std::string& why) {
  const uint16_t p = phys(l, c);
  if (p_->alive(p) && state_[p].load() == kLive) {
    spdlog::warn("memnode {} copy {} ({}): {}; its set goes on without it", l, c, phys_info(l, c).address, why);
    p_->declare_dead(p, why);
  }
  note_dead(p);
}

void ReplicatedCluster::note_dead(uint16_t p) const {
  uint8_t live = kLive;
  if (state_[p].compare_exchange_strong(live, kDead)) {
    seen_dead_[p].store(Clock::now().time_since_epoch().count());
    failovers_.fetch_add(1);
  }
}

int64_t ReplicatedCluster::in_flight(uint16_t l, bool unmarked_only) const {
  // seq_cst loads after the watcher's seq_cst store of `frozen`/`marking`, against the
  // endpoints' seq_cst increments before their seq_cst loads of it (Dekker; no fences, which
  // ThreadSanitizer does not model).
  std::lock_guard lock(counts_mu_);
  int64_t n = 0;
  for (const SetCount* c : counts_)
    n += (unmarked_only ? c[l].unmarked : c[l].in_flight).load(std::memory_order_seq_cst);
  return n;
}

void ReplicatedCluster::enroll(const SetCount* counts) {
  std::lock_guard lock(counts_mu_);
  counts_.push_back(counts);
}

void ReplicatedCluster::withdraw(const SetCount* counts) {
  std::lock_guard lock(counts_mu_);
  std::erase(counts_, counts);
}

ReplicaView ReplicatedCluster::view() const {
  ReplicaView v;
  v.copies = r_;
  for (uint16_t l = 0; l < infos_.size(); ++l) {
    v.live.emplace_back();
    for (unsigned c = 0; c < r_; ++c) v.live.back().push_back(copy_alive(l, c));
  }
  v.failovers = failovers_.load();
  v.read_retries = read_retries_.load();
  v.rejoins = rejoins_.load();
  return v;
}

// ---- ReplicatedEndpoint

ReplicatedEndpoint::ReplicatedEndpoint(ReplicatedCluster& c, std::unique_ptr<Endpoint> inner, bool control)
    : c_(c), inner_(std::move(inner)), control_(control) {
  if (control_) return;
  counts_ = std::make_unique<SetCount[]>(c_.memnodes().size());
  c_.enroll(counts_.get());
}

ReplicatedEndpoint::~ReplicatedEndpoint() {
  // A caller that gave up on its operations: they leave the sets' counts with this endpoint.
  if (counts_) c_.withdraw(counts_.get());
}

void ReplicatedEndpoint::uncount(const Pending& p) {
  if (control_) return;
  SetCount& n = counts_[p.op.remote.node()];
  if (p.op.kind != OpKind::Read && !p.marks) add(n.unmarked, -1);
  add(n.in_flight, -1);
}

uint32_t ReplicatedEndpoint::open(const Op& op) {
  uint32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    i = static_cast<uint32_t>(pend_.size());
    pend_.emplace_back();
  }
  Pending& p = pend_[i];
  p = Pending{};
  p.op = op;
  p.active = true;
  ++live_;
  if (!control_ && op.kind != OpKind::Read) {
    // A rejoin in the set: this change is marked when done, so the copier copies its chunks
    // again. Counted before `marking` is read, both seq_cst: the watcher that sets `marking`
    // and then sums the counts either sees this change or is seen by it.
    std::atomic<int64_t>& n = counts_[op.remote.node()].unmarked;
    n.fetch_add(1, std::memory_order_seq_cst);
    p.marks = c_.set(op.remote.node()).marking.load(std::memory_order_seq_cst);
    if (p.marks) add(n, -1);
  }
  return i;
}

void ReplicatedEndpoint::finish(uint32_t i, Status s) {
  Pending& p = pend_[i];
  uncount(p);
  ready_.push_back({p.op.tag, s, p.op.kind, p.op.remote.node()});
  p.active = false;
  p.scratch.clear();
  free_.push_back(i);
  --live_;
}

bool ReplicatedEndpoint::first_stage(uint32_t i, std::vector<Op>& out) {
  Pending& p = pend_[i];
  const uint16_t l = p.op.remote.node();
  const unsigned r = c_.copies();
  auto physical = [&](unsigned c) {
    Op o = p.op;
    o.remote = RemotePtr(c_.phys(l, c), p.op.remote.offset());
    o.tag = i;
    return o;
  };
  switch (p.op.kind) {
    case OpKind::Read: {
      const unsigned home = home_copy(p.op.remote.offset(), r);
      for (unsigned k = 0; k < r; ++k) {  // the address's copy, else the next live one not tried yet
        const unsigned c = (home + k) % r;
        if ((p.tried >> c & 1) || !c_.copy_alive(l, c)) continue;
        p.tried |= 1u << c;
        p.waiting = 1;
        out.push_back(physical(c));
        return true;
      }
      return false;
    }
    case OpKind::Write:
      for (unsigned c = 0; c < r; ++c)
        if (c_.copy_alive(l, c)) {
          out.push_back(physical(c));
          ++p.waiting;
        }
      return p.waiting > 0;
    case OpKind::FetchAdd:
    case OpKind::CompareSwap:
      for (unsigned c = 0; c < r; ++c) {
        if ((p.tried >> c & 1) || !c_.copy_alive(l, c)) continue;
        c_.settle(l, c);
        p.tried |= 1u << c;
        p.primary = static_cast<uint8_t>(c);
        p.waiting = 1;
        out.push_back(physical(c));
        return true;
      }
      return false;
  }
  return false;
}

void ReplicatedEndpoint::post_now(std::vector<Op>& ops) {
  // Ops go out in one doorbell. A provider refuses the whole batch when one op's memnode is dead
  // (nothing posted): the ops to copies that died since they were chosen complete as failures
  // (and move to other copies), the rest are posted again. Only a refusal that no dead copy
  // explains fails every op.
  for (int tries = 0; !ops.empty(); ++tries) {
    const Status s = inner_->post(ops);
    sync_counters();
    if (s == Status::Ok) {
      ops.clear();
      return;
    }
    std::vector<Op> batch, failed;
    batch.swap(ops);
    for (const Op& o : batch) (c_.physical()->alive(o.remote.node()) ? ops : failed).push_back(o);
    if (failed.empty() || tries >= 3) {
      failed.insert(failed.end(), ops.begin(), ops.end());
      ops.clear();
    }
    for (const Op& o : failed)
      on_completion({o.tag, c_.physical()->alive(o.remote.node()) ? s : Status::PeerDead, o.kind, o.remote.node()});
  }
}

Status ReplicatedEndpoint::post(std::span<const Op> ops) {
  for (const Op& op : ops)
    if (op.remote.node() >= c_.memnodes().size()) return Status::UnknownNode;
  if (!control_ && (!held_.empty() || !enter(ops))) {
    // A set frozen for the last step of a rejoin takes no operation: they wait here, in order.
    held_.insert(held_.end(), ops.begin(), ops.end());
    return Status::Ok;
  }
  return post_logical(ops);
}

bool ReplicatedEndpoint::enter(std::span<const Op> ops) {
  // Counted before `frozen` is read, both seq_cst: the watcher that sets `frozen` and then
  // waits for the sum to reach 0 either waits for these operations or is seen by them.
  for (const Op& op : ops) counts_[op.remote.node()].in_flight.fetch_add(1, std::memory_order_seq_cst);
  bool frozen = false;
  for (const Op& op : ops) frozen = frozen || c_.set(op.remote.node()).frozen.load(std::memory_order_seq_cst);
  if (!frozen) return true;
  for (const Op& op : ops) add(counts_[op.remote.node()].in_flight, -1);
  return false;
}

Status ReplicatedEndpoint::post_logical(std::span<const Op> ops) {
  std::vector<Op>& phys = phys_;  // kept across posts: no allocation per post
  std::vector<uint32_t>& opened = opened_;
  phys.clear();
  opened.clear();
  for (const Op& op : ops) {
    const uint32_t i = open(op);
    opened.push_back(i);
    if (!first_stage(i, phys)) {
      for (uint32_t j : opened) {  // nothing of the batch is posted
        Pending& p = pend_[j];
        uncount(p);
        p.active = false;
        free_.push_back(j);
        --live_;
      }
      if (!control_)  // entered, not opened
        for (size_t k = opened.size(); k < ops.size(); ++k) add(counts_[ops[k].remote.node()].in_flight, -1);
      return Status::PeerDead;
    }
  }
  post_now(phys);
  return Status::Ok;
}

void ReplicatedEndpoint::changed(uint32_t i) {
  Pending& p = pend_[i];
  const uint16_t l = p.op.remote.node();
  auto& st = c_.set(l);
  const uint64_t marks = st.marks.load(), chunk = st.chunk.load();
  if (!p.marks || marks == 0 || chunk == 0) return finish(i, p.status);
  const uint64_t len = p.op.kind == OpKind::Write ? std::max<uint64_t>(p.op.len, 1) : 8;
  const uint64_t lo = p.op.remote.offset() / chunk, hi = (p.op.remote.offset() + len - 1) / chunk;
  if (hi >= kRejoinMaxChunks) return finish(i, p.status);
  if (ones_.size() == 0) {
    ones_ = inner_->alloc(kRejoinMaxChunks);
    std::memset(ones_.data(), 1, ones_.size());
  }
  std::vector<Op> ops;
  p.stage = Stage::Mark;
  for (unsigned c = 0; c < c_.copies(); ++c) {
    if (!c_.copy_alive(l, c)) continue;
    ops.push_back(Op::write(RemotePtr(c_.phys(l, c), marks + lo), ones_.data(), hi - lo + 1, i));
    ++p.waiting;
  }
  if (ops.empty()) return finish(i, p.status);
  post_now(ops);
}

void ReplicatedEndpoint::start_mirrors(uint32_t i) {
  Pending& p = pend_[i];
  uint64_t old = 0;
  std::memcpy(&old, p.op.local, 8);
  if (p.op.kind == OpKind::CompareSwap && old != p.op.compare) return finish(i, Status::Ok);  // nothing changed
  const uint16_t l = p.op.remote.node();
  std::vector<Op> ops;
  p.stage = Stage::Mirrors;
  p.mirror_start = Clock::now();
  p.scratch.resize(c_.copies());
  for (unsigned c = 0; c < c_.copies(); ++c) {
    if (c == p.primary || !c_.copy_alive(l, c)) continue;
    p.scratch[c] = inner_->alloc(8);
    Op o = p.op;
    o.remote = RemotePtr(c_.phys(l, c), p.op.remote.offset());
    o.local = p.scratch[c].data();
    o.tag = i;
    ops.push_back(o);
    ++p.waiting;
  }
  if (ops.empty()) return changed(i);
  post_now(ops);
}

void ReplicatedEndpoint::on_completion(const Completion& pc) {
  const uint32_t i = static_cast<uint32_t>(pc.tag);
  if (i >= pend_.size() || !pend_[i].active) return;
  Pending& p = pend_[i];
  const uint16_t l = p.op.remote.node();
  const unsigned c = pc.node % c_.copies();
  --p.waiting;
  if (pc.status != Status::Ok && caller_error(pc.status)) {
    if (p.status == Status::Ok) p.status = pc.status;
  } else if (pc.status != Status::Ok) {
    c_.fence(l, c, std::string("failed a ") + op_name(pc.kind) + " (" + status_name(pc.status) + ")");
  }
  const bool copy_failed = pc.status != Status::Ok && !caller_error(pc.status);

  if (p.stage == Stage::Mark) {  // a mark that a copy missed is as gone as the copy
    if (p.waiting == 0) finish(i, p.status);
    return;
  }
  if (p.stage == Stage::First && p.op.kind == OpKind::Write) {
    if (pc.status == Status::Ok) ++p.succeeded;
    if (p.waiting > 0) return;
    if (p.status != Status::Ok) return finish(i, p.status);
    if (p.succeeded == 0) return finish(i, Status::PeerDead);
    return changed(i);
  }
  if (p.stage == Stage::First) {  // READ or the primary's atomic
    if (copy_failed) {
      std::vector<Op> again;
      if (!first_stage(i, again)) return finish(i, Status::PeerDead);
      if (p.op.kind == OpKind::Read) c_.count_read_retry();
      return post_now(again);
    }
    if (pc.status != Status::Ok) return finish(i, pc.status);
    if (p.op.kind == OpKind::Read) return finish(i, Status::Ok);
    return start_mirrors(i);
  }
  // A mirror of an atomic.
  if (pc.status == Status::Ok && p.op.kind == OpKind::CompareSwap) {
    uint64_t seen = 0;
    std::memcpy(&seen, p.scratch[c].data(), 8);
    if (seen != p.op.compare) {
      // The copy has not yet taken an earlier transition of the primary's: try again; after
      // kMirrorPatience the primary's result wins.
      Op o = p.op;
      o.remote = RemotePtr(c_.phys(l, c), p.op.remote.offset());
      o.local = p.scratch[c].data();
      o.tag = i;
      if (Clock::now() - p.mirror_start > kMirrorPatience) o.compare = seen;
      ++p.waiting;
      std::vector<Op> again{o};
      return post_now(again);
    }
  }
  if (p.waiting == 0) {
    if (p.status != Status::Ok) return finish(i, p.status);
    changed(i);
  }
}

size_t ReplicatedEndpoint::poll_impl(std::span<Completion> out) {
  if (!held_.empty() && enter(held_)) {  // the rejoin's last step is over: post what waited, in order
    std::vector<Op> ops;
    ops.swap(held_);
    if (const Status s = post_logical(ops); s != Status::Ok)
      for (const Op& op : ops) ready_.push_back({op.tag, s, op.kind, op.remote.node()});
  }
  Completion cs[64];
  for (;;) {
    const size_t got = inner_->poll(cs);
    for (size_t k = 0; k < got; ++k) on_completion(cs[k]);
    if (got < std::size(cs)) break;
  }
  sync_counters();
  size_t n = 0;
  while (n < out.size() && ready_head_ < ready_.size()) out[n++] = ready_[ready_head_++];
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  } else if (ready_head_ >= 4096 && 2 * ready_head_ >= ready_.size()) {  // a caller that polls few at a time
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<ptrdiff_t>(ready_head_));
    ready_head_ = 0;
  }
  return n;
}

std::string ReplicatedEndpoint::describe(const Completion& c) const {
  if (c.node >= c_.memnodes().size()) return Endpoint::describe(c);
  std::string s = std::string(op_name(c.kind)) + " on memnode " + std::to_string(c.node) + " (" +
                  c_.memnodes()[c.node].address + ") failed: " + status_name(c.status);
  if (!c_.alive(c.node)) s += " [" + c_.dead_reason(c.node) + "]";
  return s;
}

Status ReplicatedEndpoint::send(uint16_t node, const void* data, size_t len) {
  if (node >= c_.memnodes().size()) return Status::UnknownNode;
  Status s = Status::PeerDead;
  for (unsigned c = 0; c < c_.copies() && s != Status::Ok; ++c)  // the first live copy takes it
    if (c_.copy_alive(node, c)) s = inner_->send(c_.phys(node, c), data, len);
  sync_counters();
  return s;
}

bool ReplicatedEndpoint::try_recv(Message& out) {
  const bool got = inner_->try_recv(out);
  sync_counters();
  // libfabric's messages carry the sender's memnode id (logical already); verbs, cxl and
  // LocalFabric name the peer the message came from (physical).
  const bool physical = c_.provider() != Provider::Shm && c_.provider() != Provider::Tcp;
  if (got && physical && out.from_node != 0xffff) out.from_node = static_cast<uint16_t>(out.from_node / c_.copies());
  return got;
}

// ---- factories

std::shared_ptr<Cluster> with_replicas(std::shared_ptr<Cluster> physical, unsigned copies, uint32_t cn_id) {
  if (copies <= 1) return physical;
  auto c = std::make_shared<ReplicatedCluster>(std::move(physical), copies, cn_id);
  c->start_watcher();
  return c;
}

std::unique_ptr<Endpoint> make_control_endpoint(Cluster& c, size_t pool_bytes) {
  if (auto r = dynamic_cast<ReplicatedCluster*>(&c)) return r->make_control_endpoint(pool_bytes);
  return c.make_endpoint(pool_bytes);
}

std::shared_ptr<Cluster> replicas_physical(const Cluster& c, unsigned* copies, uint32_t* cn_id) {
  auto r = dynamic_cast<const ReplicatedCluster*>(&c);
  if (!r) return nullptr;
  if (copies) *copies = r->copies();
  if (cn_id) *cn_id = r->cn_id();
  return r->physical();
}

uint64_t replica_failovers(const Cluster& c) {
  auto r = dynamic_cast<const ReplicatedCluster*>(&c);
  return r ? r->failovers() : 0;
}

ReplicaView replica_view(const Cluster& c) {
  if (auto r = dynamic_cast<const ReplicatedCluster*>(&c)) return r->view();
  ReplicaView v;
  for (uint16_t l = 0; l < c.memnodes().size(); ++l) v.live.push_back({c.alive(l)});
  return v;
}

}  // namespace dmhnsw::fabric
