#pragma once
// What a computenode holds of a shine index's codes (issue 31): every node's code read from the
// memnodes' codes logs (compute/shine/layout.hpp CodesLog), by node. A node whose entry is
// missing (never written, or past a full log) has none here: searches read its vector.
#include <cstdint>
#include <unordered_map>
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
  size_t size() const { return labels_.size(); }
  uint64_t bytes() const { return codes_.size() + 16 * labels_.size(); }
  /// The node's code, or null.
  const uint8_t* find(RemotePtr node) const {
    const auto it = at_.find(node.raw());
    return it == at_.end() ? nullptr : codes_.data() + it->second * code_size_;
  }
  /// The node's code and its label, or null.
  const uint8_t* find(RemotePtr node, uint64_t* label) const {
    const auto it = at_.find(node.raw());
    if (it == at_.end()) return nullptr;
    *label = labels_[it->second];
    return codes_.data() + size_t{it->second} * code_size_;
  }
  uint64_t label(RemotePtr node) const { return labels_.at(at_.at(node.raw())); }
  uint64_t refreshed() const { return refreshed_; }  // entries read by refresh() so far
  /// Entries each memnode's log holds (as counted when loaded, at most its capacity).
  const std::vector<uint64_t>& entries() const { return entries_; }

 private:
  size_t code_size_ = 0;
  std::unordered_map<uint64_t, uint32_t> at_;  // node raw -> slot
  std::vector<uint8_t> codes_;
  std::vector<uint64_t> labels_;
  std::vector<uint64_t> entries_;
  uint64_t refreshed_ = 0;
  /// Entries [first, count) of memnode m's log into the table; returns where the next refresh
  /// starts (an unwritten entry among the last kRecentEntries, else count).
  static constexpr uint64_t kRecentEntries = 4096;
  uint64_t read_entries(fabric::Endpoint& ep, const GraphParams& p, uint16_t m, uint64_t first, uint64_t count);
};

}  // namespace dmhnsw::shine
