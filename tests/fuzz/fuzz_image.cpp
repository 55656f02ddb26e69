// Region images (memory/image.hpp: read_image_header, load_image, as `memnode --load` runs
// them) and the region header inside (common/region.hpp: validate_region_header through
// header_from_blob, describe, region_used_bytes). Input: [fix byte][image file bytes...].
// With bit 0 of the fix byte set the harness makes the file header consistent first (region
// size 1 MiB, used bytes = the body's length, both checksums) so that the fuzzer reaches the
// body's region header; bit 1 also sets the body's memnode id and region size to match. The
// body's first 512 bytes are also checked as the region header of a welcome.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "common/checksum.hpp"
#include "common/region.hpp"
#include "memory/image.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace dmhnsw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr uint64_t kRegion = kMinRegionBytes;  // the smallest region an image may hold
  static fuzz::TempFile file(".img");
  static std::vector<char> region(kRegion);
  fuzz::Input in(data, size);
  const uint8_t fix = in.byte();
  std::vector<char> bytes = in.rest();
  using memory::ImageHeader;
  if ((fix & 1) && bytes.size() >= sizeof(ImageHeader) && bytes.size() - sizeof(ImageHeader) <= kRegion) {
    ImageHeader h;
    std::memcpy(&h, bytes.data(), sizeof h);
    std::memcpy(h.magic, memory::kImageMagic, sizeof h.magic);
    h.version = memory::kImageFormatVersion;
    h.region_size = kRegion;
    h.used_bytes = bytes.size() - sizeof h;
    if ((fix & 2) && h.used_bytes >= sizeof(RegionHeader)) {
      RegionHeader rh;
      std::memcpy(&rh, bytes.data() + sizeof h, sizeof rh);
      rh.magic = kRegionMagic;
      rh.version = kRegionFormatVersion;
      rh.memnode_id = h.memnode_id;
      rh.region_size = kRegion;
      std::memcpy(bytes.data() + sizeof h, &rh, sizeof rh);
    }
    h.body_checksum = checksum64(bytes.data() + sizeof h, h.used_bytes);
    h.header_checksum = checksum64(&h, offsetof(ImageHeader, header_checksum));
    std::memcpy(bytes.data(), &h, sizeof h);
  }
  const std::string& path = file.write(bytes);
  try {
    const ImageHeader h = memory::read_image_header(path);
    DMHNSW_FUZZ_CHECK(sizeof h + h.used_bytes == bytes.size() && h.used_bytes <= h.region_size);
    std::memset(region.data(), 0, region.size());
    const memory::ImageInfo info = memory::load_image(path, region.data(), region.size(), h.memnode_id);
    DMHNSW_FUZZ_CHECK(info.used_bytes == h.used_bytes && info.used_bytes <= kRegion);
    std::array<char, fabric::kHeaderBlobBytes> blob;
    std::memcpy(blob.data(), region.data(), blob.size());
    const RegionHeader rh = header_from_blob(blob, "loaded region");  // what a computenode gets in its welcome
    DMHNSW_FUZZ_CHECK(rh.region_size == kRegion && rh.memnode_id == h.memnode_id);
    DMHNSW_FUZZ_CHECK(memory::region_used_bytes(rh) <= rh.region_size);
    (void)describe(rh);
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  // The body's first bytes as the header blob of a welcome (what a computenode checks).
  try {
    std::array<char, fabric::kHeaderBlobBytes> blob{};
    if (bytes.size() > sizeof(ImageHeader))
      std::memcpy(blob.data(), bytes.data() + sizeof(ImageHeader), std::min(bytes.size() - sizeof(ImageHeader), blob.size()));
    const RegionHeader rh = header_from_blob(blob, "welcome");
    DMHNSW_FUZZ_CHECK(rh.data_offset <= rh.region_size && rh.scratch_offset + rh.scratch_size <= rh.region_size);
    DMHNSW_FUZZ_CHECK(memory::region_used_bytes(rh) <= rh.region_size);
    (void)describe(rh);
  } catch (const std::exception& e) {
    fuzz::refused(e);
  }
  return 0;
}
