#include "compute/shine/codes_log.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dmhnsw::shine {

LocalCodes LocalCodes::load(fabric::Endpoint& ep, const GraphParams& p) {
  if (!p.codes) throw std::invalid_argument("--rerank: the shine index has no codes (build it with --codes)");
  LocalCodes lc;
  lc.code_size_ = p.codes_log.code_size;
  lc.stride_ = (8 + lc.code_size_ + 7) / 8 * 8;
  lc.entries_.assign(p.ids.memnodes, 0);  // set for every stored index (format_or_attach)
  lc.refresh(ep, p);
  lc.refreshed_ = 0;
  return lc;
}

uint64_t LocalCodes::refresh(fabric::Endpoint& ep, const GraphParams& p) {
  uint64_t got = 0;
  for (uint16_t m = 0; m < entries_.size(); ++m) {
    uint64_t count = 0;
    ep.read(RemotePtr(m, mode_word_offset(shine_word::kCodesLogCount)), &count, 8);
    count = std::min(count, p.codes_log.capacity);
    if (count <= entries_[m]) continue;
    const uint64_t next = read_entries(ep, p, m, entries_[m], count);
    got += next - entries_[m];
    entries_[m] = next;
  }
  refreshed_ += got;
  return got;
}

uint64_t LocalCodes::read_entries(fabric::Endpoint& ep, const GraphParams& p, uint16_t m, uint64_t from,
                                  uint64_t count) {
  uint64_t hole = count;  // the first entry not written yet
  const CodesLog& log = p.codes_log;
  const uint64_t eb = log.entry_bytes();
  const uint64_t per_read = std::max<uint64_t>(1, (4u << 20) / eb);
  std::vector<char> buf;
  for (uint64_t first = from; first < count; first += per_read) {
    const uint64_t n = std::min(per_read, count - first);
    buf.resize(n * eb);
    ep.read(RemotePtr(m, log.entry_offset(first)), buf.data(), buf.size());
    for (uint64_t i = 0; i < n; ++i) {
      const char* e = buf.data() + i * eb;
      uint64_t raw, label;
      std::memcpy(&raw, e, 8);
      std::memcpy(&label, e + 8, 8);
      const RemotePtr node = RemotePtr::from_raw(raw);
      // Allocated, never written (its inserter died), or not written yet: an inserter takes
      // the slot (count) before it writes the entry; such a node is read as a vector.
      if (raw == 0 || node.node() != m) {
        hole = std::min(hole, first + i);
        continue;
      }
      uint8_t* r = upsert(raw);
      std::memcpy(r, &label, 8);
      std::memcpy(r + 8, e + 16, code_size_);
    }
  }
  // A hole among the last entries is an insert still writing: read again from it next time.
  // An older one is an inserter that died; its node stays without a code (read as a vector).
  return count - hole <= kRecentEntries ? hole : count;
}

uint8_t* LocalCodes::upsert(uint64_t key) {
  if (2 * (count_ + 1) > table_.size()) {  // grow: at most half full
    std::vector<Slot> old(std::max<size_t>(1024, 2 * table_.size()));
    old.swap(table_);
    for (const Slot& s : old)
      if (s.key != 0) {
        size_t i = slot_of(s.key);
        while (table_[i].key != 0) i = (i + 1) & (table_.size() - 1);
        table_[i] = s;
      }
  }
  size_t i = slot_of(key);
  while (table_[i].key != 0 && table_[i].key != key) i = (i + 1) & (table_.size() - 1);
  if (table_[i].key == 0) {  // a node seen for the first time (else its record was reused: overwritten)
    table_[i] = {key, records_.size()};
    records_.resize(records_.size() + stride_);
    ++count_;
  }
  return records_.data() + table_[i].at;
}

}  // namespace dmhnsw::shine
