#include "compute/shine/codes_log.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dmhnsw::shine {

LocalCodes LocalCodes::load(fabric::Endpoint& ep, const GraphParams& p) {
  if (!p.codes) throw std::invalid_argument("--rerank: the shine index has no codes (build it with --codes)");
  LocalCodes lc;
  const CodesLog& log = p.codes_log;
  lc.code_size_ = log.code_size;
  const uint64_t eb = log.entry_bytes();
  const uint64_t per_read = std::max<uint64_t>(1, (4u << 20) / eb);
  std::vector<char> buf;
  for (uint16_t m = 0; m < p.ids.memnodes; ++m) {  // set for every stored index (format_or_attach)
    uint64_t count = 0;
    ep.read(RemotePtr(m, mode_word_offset(shine_word::kCodesLogCount)), &count, 8);
    count = std::min(count, log.capacity);
    lc.entries_.push_back(count);
    for (uint64_t first = 0; first < count; first += per_read) {
      const uint64_t n = std::min(per_read, count - first);
      buf.resize(n * eb);
      ep.read(RemotePtr(m, log.entry_offset(first)), buf.data(), buf.size());
      for (uint64_t i = 0; i < n; ++i) {
        const char* e = buf.data() + i * eb;
        uint64_t raw, label;
        std::memcpy(&raw, e, 8);
        std::memcpy(&label, e + 8, 8);
        const RemotePtr node = RemotePtr::from_raw(raw);
        if (raw == 0 || node.node() != m) continue;  // allocated, never written (its inserter died)
        auto [it, fresh] = lc.at_.emplace(raw, static_cast<uint32_t>(lc.labels_.size()));
        if (fresh) {
          lc.labels_.push_back(label);
          lc.codes_.resize(lc.codes_.size() + lc.code_size_);
        } else {
          lc.labels_[it->second] = label;
        }
        std::memcpy(lc.codes_.data() + size_t{it->second} * lc.code_size_, e + 16, lc.code_size_);
      }
    }
  }
  return lc;
}

}  // namespace dmhnsw::shine
