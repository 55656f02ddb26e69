#include "common/region.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "common/units.hpp"

namespace dmhnsw {

RegionHeader make_region_header(uint16_t memnode_id, uint64_t size) {
  if (size < kMinRegionBytes)
    throw std::runtime_error("--region: " + format_bytes(size) + " is too small (at least " +
                             format_bytes(kMinRegionBytes) + ")");
  RegionHeader h{};
  h.magic = kRegionMagic;
  h.version = kRegionFormatVersion;
  h.mode = static_cast<uint8_t>(Mode::None);
  h.memnode_id = memnode_id;
  h.memnode_count = 0;
  h.region_size = size;
  h.scratch_offset = kHeaderPageBytes;
  h.scratch_size = std::min<uint64_t>(64u << 20, (size / 4) / kHeaderPageBytes * kHeaderPageBytes);
  h.data_offset = h.scratch_offset + h.scratch_size;
  return h;
}

std::string suggested_region(uint64_t need) {
  const uint64_t step = 64ull << 20;
  const uint64_t padded = need + need / 10;
  const uint64_t r = std::max(kMinUsefulRegionBytes, (padded + step - 1) / step * step);
  return r % (1ull << 30) == 0 ? std::to_string(r >> 30) + "GiB" : std::to_string(r >> 20) + "MiB";
}

RegionHeader read_live_header(fabric::Cluster& c, fabric::Endpoint& ep, uint16_t m) {
  RegionHeader h;
  ep.read(RemotePtr(m, 0), &h, sizeof h);
  validate_region_header(h, "memnode " + std::to_string(m) + " (" + c.memnodes()[m].address + ")");
  return h;
}

void validate_region_header(const RegionHeader& h, const std::string& what) {
  if (h.magic != kRegionMagic) throw std::runtime_error(what + ": region header at offset 0: bad magic");
  if (h.version != kRegionFormatVersion)
    throw std::runtime_error(what + ": region header at offset 8: format version " + std::to_string(h.version) +
                             ", expected " + std::to_string(kRegionFormatVersion));
  if (h.mode > static_cast<uint8_t>(Mode::Dhnsw))
    throw std::runtime_error(what + ": region header at offset 12: unknown mode " + std::to_string(h.mode));
  if (h.scratch_offset < kHeaderPageBytes || h.scratch_offset > h.region_size ||
      h.scratch_size > h.region_size - h.scratch_offset)
    throw std::runtime_error(what + ": region header at offset 40: scratch area outside the region");
  if (h.data_offset > h.region_size)
    throw std::runtime_error(what + ": region header at offset 56: data area outside the region");
}

RegionHeader header_from_blob(const std::array<char, fabric::kHeaderBlobBytes>& blob, const std::string& what) {
  RegionHeader h;
  std::memcpy(&h, blob.data(), sizeof h);
  validate_region_header(h, what);
  return h;
}

/// ", N used (P %)": the region bytes up to the end of the index's data (shine: the bump
/// pointer; d-HNSW: the data end, scratch excluded); "" for an empty region.
static std::string used_text(const RegionHeader& h) {
  uint64_t end = 0;
  if (h.mode == static_cast<uint8_t>(Mode::Shine)) end = h.mode_words[shine_word::kBump];
  if (h.mode == static_cast<uint8_t>(Mode::Dhnsw)) end = h.mode_words[dhnsw_word::kDataEnd];
  if (end == 0 || end > h.region_size || h.region_size == 0) return "";
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f", 100.0 * static_cast<double>(end) / static_cast<double>(h.region_size));
  return ", " + format_bytes(end) + " used (" + pct + " %)";
}

std::string describe(const RegionHeader& h) {
  return "memnode " + std::to_string(h.memnode_id) + ": region " + format_bytes(h.region_size) + ", format v" +
         std::to_string(h.version) + ", mode " + fabric::mode_name(static_cast<Mode>(h.mode)) + ", dim " +
         std::to_string(h.dim) + ", epoch " + std::to_string(h.epoch) + ", scratch " + format_bytes(h.scratch_size) +
         " at " + std::to_string(h.scratch_offset) + ", data from " + std::to_string(h.data_offset) + used_text(h);
}

}  // namespace dmhnsw
