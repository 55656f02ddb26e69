#pragma once
// Region images: a memnode's region written to a file and served again later
// (`memnode --load FILE`). Layout of an image file:
//
//   [ImageHeader, 128 bytes][body: region bytes [0, used)]
//
// The header carries a magic, a format version, the memnode id, the region size, the number
// of meaningful bytes (`used`), a checksum of the body and a checksum of the header itself.
// Images are written to `PATH.tmp`, fsynced and renamed, so a crash never leaves a partial
// file under the final name. Loading refuses (std::runtime_error naming the file and the byte
// offset) a truncated, corrupted or mismatched file. Little-endian, like the region itself.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/checksum.hpp"
#include "common/region.hpp"

namespace dmhnsw::memory {

static_assert(std::endian::native == std::endian::little, "image files are little-endian");

inline constexpr char kImageMagic[8] = {'D', 'M', 'H', 'N', 'S', 'W', 'I', 'M'};
inline constexpr uint32_t kImageFormatVersion = 1;

/// The file header of a region image. Pinned: it crosses machines and time.
struct ImageHeader {
  char magic[8];             // kImageMagic
  uint32_t version;          // kImageFormatVersion
  uint16_t memnode_id;       // the memnode whose region this is
  uint8_t mode;              // fabric::Mode of the region (informational; the body's header rules)
  uint8_t reserved0;
  uint64_t region_size;      // size of the region the image was taken from
  uint64_t used_bytes;       // body length: region bytes [0, used_bytes)
  uint64_t body_checksum;    // checksum64 of the body
  uint64_t created_unix_ns;  // wall-clock time of writing (informational)
  uint64_t reserved1[9];     // zero
  uint64_t header_checksum;  // checksum64 of the bytes before this field
};
static_assert(std::is_trivially_copyable_v<ImageHeader> && std::is_standard_layout_v<ImageHeader>);
static_assert(sizeof(ImageHeader) == 128);
static_assert(offsetof(ImageHeader, version) == 8);
static_assert(offsetof(ImageHeader, memnode_id) == 12);
static_assert(offsetof(ImageHeader, mode) == 14);
static_assert(offsetof(ImageHeader, region_size) == 16);
static_assert(offsetof(ImageHeader, used_bytes) == 24);
static_assert(offsetof(ImageHeader, body_checksum) == 32);
static_assert(offsetof(ImageHeader, created_unix_ns) == 40);
static_assert(offsetof(ImageHeader, header_checksum) == 120);

/// The checksum of image headers and bodies (common/checksum.hpp; names kept here for callers).
using dmhnsw::Checksum64;
using dmhnsw::checksum64;

/// How much of a region is meaningful, i.e. what an image must hold: region bytes
/// [0, result). Modes None and SHINE: max(bump word mode_words[shine_word::kBump],
/// data_offset), the data offset alone when the bump word is 0, never more than the region.
/// Mode d-HNSW: [0, mode word dhnsw_word::kDataEnd), the end of the last group (the scratch
/// area follows it); the whole region when that word is 0.
uint64_t region_used_bytes(const RegionHeader& h);

/// What was written or loaded.
struct ImageInfo {
  std::string path;
  uint16_t memnode_id = 0;
  Mode mode = Mode::None;
  uint64_t region_size = 0;  // of the region the image was taken from
  uint64_t used_bytes = 0;   // body bytes
  uint64_t file_bytes = 0;   // header + body
  uint64_t body_checksum = 0;
  uint64_t node_count = 0;   // mode_words[shine_word::kNodeCount] of the region header
};

/// Writes region bytes [0, used) of a region of `region_size` bytes to `path`: first to
/// `path + ".tmp"`, then fsync and rename (and fsync of the directory). The body is copied
/// chunk by chunk and the checksum taken over the copied bytes, so the file is always
/// self-consistent; a region being modified meanwhile gives an image of no single instant
/// (store an index while it is quiescent). The region must start with a valid RegionHeader
/// of `memnode_id`. Throws std::runtime_error naming the file (the temporary file is removed).
ImageInfo write_image(const std::string& path, const char* region, uint64_t region_size, uint64_t used,
                      uint16_t memnode_id);

/// Reads and checks the file header only: magic, version, header checksum, plausible sizes,
/// and that the file is exactly header + used bytes long (a truncated file names the offset
/// where its data ends). Used to size the region before loading.
ImageHeader read_image_header(const std::string& path);

/// Loads an image into a region of `region_size` bytes (zeroed beyond the image's `used`
/// bytes by the caller, e.g. fresh anonymous memory). Checks everything read_image_header
/// checks, that the image's region fits (image region size <= region_size, else an error
/// naming both sizes and --region), the body checksum, the region header inside the body
/// (validate_region_header) and that both the file and the region header belong to memnode
/// `expected_id` (--id). When the region is larger than the image's, the loaded header's
/// region_size is raised to `region_size` (the extra room is free space at the end).
/// On failure the first page of the region is zeroed (no half-loaded header is served) and
/// std::runtime_error names the file and the byte offset.
ImageInfo load_image(const std::string& path, char* region, uint64_t region_size, uint16_t expected_id);

}  // namespace dmhnsw::memory
