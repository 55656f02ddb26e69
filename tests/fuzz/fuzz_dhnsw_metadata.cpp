// The d-HNSW metadata block (compute/dhnsw/layout.hpp: check_meta_header, decode_metadata,
// validate_metadata), as a computenode reads it from memnode 0 and a memnode checks a loaded
// image. Input: [fix byte][memnode byte][region size u64][block bytes...]. Bit 0 of the fix
// byte makes the block's magic, version and checksum right (so the fuzzer gets past them);
// bit 1 also sets block_bytes to the length given. A block that decodes is then used as the
// query and insert paths use it: every sub's fetch range, the live descriptor's offset and
// the next overflow record must lie where validate_metadata promises (inside its group, the
// region and the block).
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "compute/dhnsw/layout.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;
using namespace dmhnsw::dhnsw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t fix = in.byte();
  const uint8_t mn = in.byte();
  const uint32_t memnode = mn == 0xFF ? kAnyMemnode : mn % 4u;
  const uint64_t region_size = in.take<uint64_t>();
  std::vector<char> block = in.rest();
  if ((fix & 1) && block.size() >= sizeof(MetaHeader)) {
    MetaHeader h;
    std::memcpy(&h, block.data(), sizeof h);
    std::memcpy(h.magic, kMetaMagic, sizeof h.magic);
    h.version = h.max_copies > 1 ? kMetaFormatVersion : kMetaFormatVersionNoCopies;
    if (fix & 2) h.block_bytes = block.size() / kAlign * kAlign;
    std::memcpy(block.data(), &h, sizeof h);
    if (h.block_bytes <= block.size()) {
      h.checksum = metadata_checksum(block.data(), h.block_bytes);
      std::memcpy(block.data(), &h, sizeof h);
    }
  }
  try {
    const MetaHeader h = check_meta_header(block.data(), block.size(), region_size, "fuzz");
    DMHNSW_FUZZ_CHECK(h.block_bytes >= sizeof(MetaHeader) && h.metadata_offset + h.block_bytes <= region_size);
    const Metadata md = decode_metadata(block.data(), block.size(), region_size, memnode, "fuzz");
    DMHNSW_FUZZ_CHECK(md.subs.size() == md.header.num_subs && md.meta_index.size() == md.header.meta_index_bytes);
    const uint64_t block_end = h.metadata_offset + h.block_bytes;
    for (uint32_t i = 0; i < md.subs.size(); ++i) {
      const SubDesc& d = md.subs[i];
      DMHNSW_FUZZ_CHECK(live_desc_offset(h, i) + sizeof(SubDesc) <= block_end);
      const auto [off, len] = fetch_range(d);
      const uint64_t gend = d.group_offset + d.group_bytes;
      DMHNSW_FUZZ_CHECK(off >= d.group_offset && len <= gend - off);
      if (memnode == kAnyMemnode || memnode == d.memnode) DMHNSW_FUZZ_CHECK(gend <= region_size);
      DMHNSW_FUZZ_CHECK(block_offset_in_fetch(d) + d.block_bytes <= len);
      for (const ArraySlot& s : d.arrays) DMHNSW_FUZZ_CHECK(s.offset + s.capacity <= d.block_bytes);
      const SubDesc* partner = d.partner == kNoPartner ? nullptr : &md.subs[d.partner];
      const uint64_t room = overflow_free(d, partner);
      if (room >= kAlign) {
        const uint64_t at = next_overflow_record_offset(d, kAlign);
        DMHNSW_FUZZ_CHECK(at >= d.overflow_offset && at + kAlign <= d.overflow_offset + d.overflow_bytes);
      }
    }
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
