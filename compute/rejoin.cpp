#include "common/timing.hpp"
#include "compute/rejoin.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/fabric/rejoin_layout.hpp"
#include "common/fabric/replicas.hpp"
#include "common/presence.hpp"
#include "common/region.hpp"

namespace dmhnsw::compute {

using fabric::FabricError;
using fabric::RejoinBlock;

namespace {

constexpr uint64_t kPiece = 4u << 20;  // bytes per READ and WRITE of the copy
constexpr uint64_t kFinalPassChunks = 16;  // few enough marked chunks: freeze and copy them
constexpr unsigned kMaxPasses = 20;


class Copier {
 public:
  Copier(fabric::Cluster& c, const RejoinOptions& o) : c_(c), o_(o) {
    phys_ = fabric::replicas_physical(c, &r_);
    if (!phys_) throw std::invalid_argument("rejoin: the memnodes form no replica sets (memnode --replicas R)");
    if (o.memnode >= c.memnodes().size())
      throw std::invalid_argument("--memnode " + std::to_string(o.memnode) + ": the index has memnodes 0.." +
                                  std::to_string(c.memnodes().size() - 1));
    if (o.copy >= r_)
      throw std::invalid_argument("--copy " + std::to_string(o.copy) + ": its set has copies 0.." + std::to_string(r_ - 1));
    j_ = static_cast<uint16_t>(o.memnode * r_ + o.copy);
    name_ = "memnode " + std::to_string(o.memnode) + " copy " + std::to_string(o.copy) + " (" +
            phys_->memnodes()[j_].address + ")";
    const auto view = fabric::replica_view(c);
    if (view.live[o.memnode][o.copy]) throw std::invalid_argument(name_ + " is a full copy already");
    if (!phys_->alive(j_))
      throw std::invalid_argument(name_ + " is not connected: start the new memnode there with --rejoin");
    for (unsigned k = 0; k < r_ && src_ < 0; ++k)
      if (view.live[o.memnode][k]) src_ = static_cast<int>(o.memnode * r_ + k);
    if (src_ < 0) throw std::invalid_argument("memnode " + std::to_string(o.memnode) + ": no live copy to copy from");
    const RegionHeader h = header_from_blob(c.memnodes()[o.memnode].header, "memnode " + std::to_string(o.memnode));
    region_ = c.memnodes()[o.memnode].region_size;
    chunk_ = fabric::rejoin_chunk(region_);
    chunks_ = (region_ + chunk_ - 1) / chunk_;
    if (h.scratch_size < 2 * fabric::kRejoinMaxChunks)
      throw std::invalid_argument("memnode " + std::to_string(o.memnode) + ": scratch area too small for the marks");
    marks_ = h.scratch_offset + h.scratch_size - fabric::kRejoinMaxChunks;  // past the board's groups in use
    ep_ = fabric::make_control_endpoint(c, 16u << 20);
    pep_ = phys_->make_endpoint(2 * kPiece + (1u << 20));
    buf_ = pep_->alloc(kPiece);
  }

  RejoinResult run() {
    RejoinResult res;
    res.region_bytes = region_;
    res.chunk_bytes = chunk_;
    const auto t0 = Clock::now();
    RejoinBlock b = read_block();
    if (b.magic == fabric::kRejoinMagic && b.phase != fabric::kRejoinIdle)
      throw FabricError("memnode " + std::to_string(o_.memnode) + ": a rejoin of copy " + std::to_string(b.copy) +
                        " by computenode " + std::to_string(b.owner - 1) + " is under way");
    gen_ = b.magic == fabric::kRejoinMagic ? b.gen : 0;
    // 1. Every computenode marks the chunks it changes from now on.
    publish(fabric::kRejoinMarking, 0);
    try {
      wait_acks("mark its changes");
      zero_marks(0, chunks_);
      // 2. The first pass: the whole region.
      const auto t1 = Clock::now();
      for (uint64_t k = 0; k < chunks_; k += kPiece / chunk_) res.first_pass_bytes += copy_chunks(k, kPiece / chunk_);
      res.first_pass_s = seconds_since(t1);
      spdlog::info("rejoin {}: first pass {:.1f} MiB in {:.2f} s ({:.2f} GB/s)", name_, res.first_pass_bytes / 1048576.0,
                   res.first_pass_s, res.first_pass_gbps());
      // 3. Passes over what changed meanwhile, until little is left.
      for (;;) {
        const std::vector<uint64_t> dirty = marked();
        if (dirty.size() <= kFinalPassChunks || res.passes >= kMaxPasses) break;
        ++res.passes;
        for (uint64_t k : dirty) zero_marks(k, 1);
        for (uint64_t k : dirty) res.recopied_bytes += copy_chunks(k, 1);
      }
      // 4. Frozen: no computenode changes the set; the last marked chunks; then a full copy.
      const auto tf = Clock::now();
      publish(fabric::kRejoinFrozen, 0);
      wait_acks("stop its operations on the set");
      for (uint64_t k : marked()) res.final_bytes += copy_chunks(k, 1);
      finish();
      res.frozen_ms = seconds_since(tf) * 1e3;
    } catch (...) {
      try {
        publish(fabric::kRejoinIdle, 0);  // computenodes go on without the new copy
      } catch (const std::exception&) {
      }
      throw;
    }
    res.total_s = seconds_since(t0);
    return res;
  }

 private:
  RejoinBlock read_block() {
    RejoinBlock b{};
    ep_->read(RemotePtr(o_.memnode, fabric::kRejoinBlockOffset), &b, sizeof b);
    return b;
  }

  /// The block's head (not the acks) with a new gen; `done` = the copy that became full + 1.
  void publish(uint64_t phase, uint64_t done, bool to_joining_copy = false) {
    RejoinBlock b{};
    b.magic = fabric::kRejoinMagic;
    b.phase = phase;
    b.gen = ++gen_;
    b.copy = o_.copy;
    b.done_copy = done;
    b.owner = o_.cn_id + 1;
    b.marks = marks_;
    b.chunk = chunk_;
    const size_t head = offsetof(RejoinBlock, acks);
    if (to_joining_copy) pep_->write(RemotePtr(j_, fabric::kRejoinBlockOffset), &b, head);
    ep_->write(RemotePtr(o_.memnode, fabric::kRejoinBlockOffset), &b, head);
  }

  /// Every computenode connected to the set acknowledges the current gen.
  void wait_acks(const std::string& what) {
    const auto until = Clock::now() + std::chrono::seconds(o_.ack_timeout_s);
    for (;;) {
      Presence p{};
      ep_->read(RemotePtr(o_.memnode, kPresenceOffset), &p, sizeof p);
      const RejoinBlock b = read_block();
      std::string missing;
      for (uint32_t id = 0; id < kPresenceIds; ++id)
        if (p.connected[id] > 0 && b.acks[id] < gen_) missing += (missing.empty() ? "" : ", ") + std::to_string(id);
      if (missing.empty()) return;
      if (Clock::now() > until)
        throw FabricError("rejoin " + name_ + ": computenode(s) " + missing + " did not " + what + " within " +
                          std::to_string(o_.ack_timeout_s) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  std::vector<uint64_t> marked() {
    std::vector<uint8_t> m(chunks_);
    ep_->read(RemotePtr(o_.memnode, marks_), m.data(), m.size());
    std::vector<uint64_t> out;
    for (uint64_t k = 0; k < chunks_; ++k)
      if (m[k] != 0) out.push_back(k);
    return out;
  }

  void zero_marks(uint64_t first, uint64_t n) {
    std::vector<uint8_t> z(n, 0);
    ep_->write(RemotePtr(o_.memnode, marks_ + first), z.data(), n);
  }

  /// Chunks [first, first + n) from the source copy into the joining one; returns the bytes.
  /// The joining copy keeps its own join word and presence table.
  uint64_t copy_chunks(uint64_t first, uint64_t n) {
    const uint64_t lo = first * chunk_, hi = std::min(region_, (first + n) * chunk_);
    uint64_t bytes = 0;
    auto copy = [&](uint64_t a, uint64_t b) {
      for (uint64_t at = a; at < b; at += kPiece) {
        const uint64_t len = std::min(kPiece, b - at);
        pep_->read(RemotePtr(static_cast<uint16_t>(src_), at), buf_.data(), len);
        pep_->write(RemotePtr(j_, at), buf_.data(), len);
        bytes += len;
      }
    };
    if (lo < kHeaderPageBytes) {
      copy(lo, std::min(hi, fabric::kJoinWordOffset));
      copy(std::min(hi, kHeaderPageBytes), hi);
    } else {
      copy(lo, hi);
    }
    return bytes;
  }

  /// The copy is full: out of the set's dead copies, its join word cleared (its welcome says
  /// so), then every computenode told.
  void finish() {
    const uint64_t zero = 0;
    const RemotePtr dead(o_.memnode, fabric::kRejoinBlockOffset + offsetof(RejoinBlock, dead));
    uint64_t seen = read_block().dead;
    for (;;) {  // the word is changed by COMPARE_SWAP only
      const uint64_t old = ep_->compare_swap(dead, seen, seen & ~(uint64_t{1} << o_.copy));
      if (old == seen) break;
      seen = old;
    }
    const uint64_t now_dead = seen & ~(uint64_t{1} << o_.copy);  // the set's word, for the copy that joins
    pep_->write(RemotePtr(j_, fabric::kRejoinBlockOffset + offsetof(RejoinBlock, dead)), &now_dead, 8);
    publish(fabric::kRejoinIdle, o_.copy + 1, true);
    pep_->write(RemotePtr(j_, fabric::kJoinWordOffset), &zero, 8);
  }

  fabric::Cluster& c_;
  RejoinOptions o_;
  std::shared_ptr<fabric::Cluster> phys_;
  unsigned r_ = 1;
  uint16_t j_ = 0;
  int src_ = -1;
  std::string name_;
  uint64_t region_ = 0, chunk_ = 0, chunks_ = 0, marks_ = 0, gen_ = 0;
  std::unique_ptr<fabric::Endpoint> ep_, pep_;
  fabric::Buffer buf_;
};

}  // namespace

RejoinResult run_rejoin(fabric::Cluster& c, const RejoinOptions& o) { return Copier(c, o).run(); }

}  // namespace dmhnsw::compute
