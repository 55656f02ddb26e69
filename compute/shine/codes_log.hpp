#pragma once
// What a computenode holds of a shine index's codes, so that its searches compare nodes without
// reading their vectors: every node's code read from the memnodes' codes logs
// (compute/shine/layout.hpp CodesLog), by node. A node whose entry is
// missing (never written, or past a full log) has none here: searches read its vector.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/fabric/transport.hpp"
#include "compute/shine/graph.hpp"

namespace dmhnsw::shine {

class LocalCodes {
 public:
  /// Reads every memnode's log entries [0, count) in READs of up to 4 MiB; the later entry of a
  /// node holds (its record was reused for another vector). Throws naming --rerank when the
  /// index has no codes.
  static LocalCodes load(fabric::Endpoint& ep, const GraphParams& p);
  /// Reads the entries the logs gained since (one READ of each memnode's count, then the new
  /// entries): the codes of nodes other computenodes inserted meanwhile. Returns how many
  /// entries it read. Not concurrent with find(): callers refresh between searches.
  uint64_t refresh(fabric::Endpoint& ep, const GraphParams& p);
  size_t code_size() const { return code_size_; }
  size_t size() const { return count_; }
  uint64_t bytes() const { return records_.size() + sizeof(Slot) * table_.size(); }
  /// Requests the cache line of the node's table slot (before find(): a hop looks up all its
  /// neighbours, whose slots are spread over the table).
  void prefetch(RemotePtr node) const {
    if (!table_.empty()) __builtin_prefetch(&table_[slot_of(node.raw())]);
  }
  /// The node's code, or null.
  const uint8_t* find(RemotePtr node) const {
    const uint8_t* r = record(node.raw());
    return r == nullptr ? nullptr : r + 8;
  }
  /// The node's code and its label, or null.
  const uint8_t* find(RemotePtr node, uint64_t* label) const {
    const uint8_t* r = record(node.raw());
    if (r == nullptr) return nullptr;
    std::memcpy(label, r, 8);
    return r + 8;
  }
  /// The node's label; std::out_of_range when it has no code here.
  uint64_t label(RemotePtr node) const {
    uint64_t l = 0;
    if (find(node, &l) == nullptr) throw std::out_of_range("no code held for node " + std::to_string(node.raw()));
    return l;
  }
  uint64_t refreshed() const { return refreshed_; }  // entries read by refresh() so far
  /// Entries each memnode's log holds (as counted when loaded, at most its capacity).
  const std::vector<uint64_t>& entries() const { return entries_; }

 private:
  // An open-addressing table (linear probing, at most half full) from a node to its record: one
  // cache line per lookup instead of a node-based map's chain, so a hop over a million codes
  // costs about two memory accesses per neighbour (slot, record), both prefetchable.
  struct Slot {
    uint64_t key = 0;  // a node's RemotePtr (never 0: data areas start past the header); 0: empty
    uint64_t at = 0;   // its record's offset in records_
  };
  static_assert(sizeof(Slot) == 16);
  size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 24) & (table_.size() - 1); }
  const uint8_t* record(uint64_t key) const {
    if (table_.empty()) return nullptr;
    for (size_t i = slot_of(key);; i = (i + 1) & (table_.size() - 1)) {
      if (table_[i].key == key) return records_.data() + table_[i].at;
      if (table_[i].key == 0) return nullptr;
    }
  }
  /// The record of `key` (a new one when absent): its label, then its code.
  uint8_t* upsert(uint64_t key);
  size_t code_size_ = 0;
  size_t stride_ = 0;  // bytes per record: 8 (label) + the code, rounded up to 8
  size_t count_ = 0;
  std::vector<Slot> table_;
  std::vector<uint8_t> records_;
  std::vector<uint64_t> entries_;
  uint64_t refreshed_ = 0;
  /// Entries [first, count) of memnode m's log into the table; returns where the next refresh
  /// starts (an unwritten entry among the last kRecentEntries, else count).
  static constexpr uint64_t kRecentEntries = 4096;
  uint64_t read_entries(fabric::Endpoint& ep, const GraphParams& p, uint16_t m, uint64_t first, uint64_t count);
};

}  // namespace dmhnsw::shine
