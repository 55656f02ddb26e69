#include "compute/dhnsw/index.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "common/region.hpp"
#include "compute/dhnsw/sub_search.hpp"
#include "compute/dhnsw/subindex.hpp"

namespace dmhnsw::dhnsw {

Index load_index(fabric::Cluster& c, fabric::Endpoint& ep) {
  if (c.memnodes().empty()) throw std::runtime_error("dhnsw: no memnode");
  Index idx;
  // The headers as they are now (a rebuild moves the metadata block), not as served at connect.
  auto live_header = [&](uint16_t m) { return read_live_header(c, ep, m); };
  RegionHeader h0 = live_header(0);
  if (h0.mode != static_cast<uint8_t>(Mode::Dhnsw))
    throw std::runtime_error("memnode 0 holds no d-HNSW index (region mode " +
                             std::string(fabric::mode_name(static_cast<Mode>(h0.mode))) +
                             "): build one (`computenode --mode dhnsw build --data FILE`), or start the memnodes with --load "
                             "IMAGE (written by `build --store-index`, `snapshot` or build/bin/dhnsw-build)");
  const uint64_t off = h0.mode_words[dhnsw_word::kMetadataOffset], len = h0.mode_words[dhnsw_word::kMetadataSize];
  if (len < sizeof(MetaHeader) || off > h0.region_size || len > h0.region_size - off)
    throw std::runtime_error("memnode 0: region header at offset " +
                             std::to_string(mode_word_offset(dhnsw_word::kMetadataOffset)) +
                             ": metadata block [" + std::to_string(off) + ", +" + std::to_string(len) +
                             ") outside the region of " + std::to_string(h0.region_size) + " bytes");
  std::vector<char> block(len);
  ep.read(RemotePtr(0, off), block.data(), len);
  const std::string what = "memnode 0 metadata block";
  Metadata md = decode_metadata(block.data(), len, h0.region_size, 0, what);  // header, checksum, bounds
  idx.header = md.header;
  idx.subs = std::move(md.subs);
  const MetaHeader& h = idx.header;
  if (h.num_memnodes != c.memnodes().size())
    throw std::runtime_error("the d-HNSW index spans " + std::to_string(h.num_memnodes) + " memnode(s), --memnodes names " +
                             std::to_string(c.memnodes().size()));
  for (const auto& mn : c.memnodes()) {  // every group against the region of the memnode holding it
    RegionHeader r = live_header(mn.id);
    if (r.mode != static_cast<uint8_t>(Mode::Dhnsw) || r.dim != h.dim)
      throw std::runtime_error("memnode " + std::to_string(mn.id) + " (" + mn.address +
                               ") does not hold the same d-HNSW index as memnode 0");
    if (mn.id != 0) validate_metadata(h, idx.subs, r.region_size, mn.id, what);
  }
  idx.meta = deserialize_meta(md.meta_index.data(), md.meta_index.size(), what + " (meta-HNSW)");
  idx.list_ranges = neighbors_per_level(h.m);
  if (!md.codes.empty()) {
    const uint64_t at = h.metadata_offset + h.codes_offset;
    idx.codes = compute::Quantizer::load(md.codes.data(), md.codes.size(), "memnode 0", at);
    if (idx.codes->code_size() != h.code_size || idx.codes->dim() != h.dim ||
        (idx.codes->metric() == Metric::IP) != idx.inner_product())
      throw std::runtime_error("memnode 0: the quantizer block at offset " + std::to_string(at) + " (dimension " +
                               std::to_string(idx.codes->dim()) + ", code size " +
                               std::to_string(idx.codes->code_size()) + ") does not fit the index's header");
  }
  idx.metadata_bytes = len;
  return idx;
}

}  // namespace dmhnsw::dhnsw
