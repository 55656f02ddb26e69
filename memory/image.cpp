#include "memory/image.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "common/units.hpp"

namespace dmhnsw::memory {

// ---------------------------------------------------------------------------- used bytes
uint64_t region_used_bytes(const RegionHeader& h) {
  if (h.mode == static_cast<uint8_t>(Mode::Dhnsw)) {  // [0, data end): the scratch area after it is not kept
    uint64_t end = h.mode_words[dhnsw_word::kDataEnd];
    return end > 0 && end <= h.region_size ? end : h.region_size;
  }
  uint64_t bump = h.mode_words[shine_word::kBump];
  uint64_t used = std::max(bump, h.data_offset);
  used = std::max<uint64_t>(used, sizeof(RegionHeader));
  return std::min(used, h.region_size);
}

// ---------------------------------------------------------------------------- file I/O
namespace {

constexpr uint64_t kHdr = sizeof(ImageHeader);
constexpr size_t kChunk = 8u << 20;

std::string err(const std::string& path, const std::string& what) { return path + ": " + what; }
std::string at(const std::string& path, uint64_t offset, const std::string& what) {
  return path + ": byte offset " + std::to_string(offset) + ": " + what;
}
std::string sz(uint64_t n) { return format_bytes(n) + " (" + std::to_string(n) + " bytes)"; }
std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

void write_all(int fd, const char* p, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(at(path, offset, std::string("write failed: ") + std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

/// Reads exactly n bytes at offset; a short file is reported as truncation at `offset + got`.
void read_all(int fd, char* p, size_t n, uint64_t offset, const std::string& path, uint64_t promised) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(at(path, offset, std::string("read failed: ") + std::strerror(errno)));
    }
    if (r == 0)
      throw std::runtime_error(err(path, "truncated: the data ends at byte " + std::to_string(offset) + ", expected " +
                                             std::to_string(promised) + " bytes"));
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

uint64_t header_checksum_of(const ImageHeader& h) { return checksum64(&h, offsetof(ImageHeader, header_checksum)); }

/// Checks the file header of an open image and the file size.
ImageHeader check_header(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error(err(path, std::string("cannot stat: ") + std::strerror(errno)));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHdr)
    throw std::runtime_error(err(path, "truncated: the file ends at byte " + std::to_string(size) + ", inside the " +
                                           std::to_string(kHdr) + "-byte image header"));
  ImageHeader h;
  read_all(fd, reinterpret_cast<char*>(&h), kHdr, 0, path, kHdr);
  if (std::memcmp(h.magic, kImageMagic, sizeof h.magic) != 0)
    throw std::runtime_error(at(path, 0, "not a dmhnsw region image (bad magic)"));
  if (h.version != kImageFormatVersion)
    throw std::runtime_error(at(path, offsetof(ImageHeader, version),
                                "image format version " + std::to_string(h.version) + ", this build reads version " +
                                    std::to_string(kImageFormatVersion)));
  uint64_t hc = header_checksum_of(h);
  if (hc != h.header_checksum)
    throw std::runtime_error(at(path, offsetof(ImageHeader, header_checksum),
                                "image header checksum mismatch (stored " + hex(h.header_checksum) + ", computed " +
                                    hex(hc) + "): the header is corrupted"));
  if (h.region_size < kMinRegionBytes)
    throw std::runtime_error(at(path, offsetof(ImageHeader, region_size),
                                "region size " + sz(h.region_size) + " is below the minimum " + sz(kMinRegionBytes)));
  if (h.used_bytes < sizeof(RegionHeader) || h.used_bytes > h.region_size)
    throw std::runtime_error(at(path, offsetof(ImageHeader, used_bytes),
                                "used bytes " + std::to_string(h.used_bytes) + " outside [" +
                                    std::to_string(sizeof(RegionHeader)) + ", region size " +
                                    std::to_string(h.region_size) + "]"));
  const uint64_t expect = kHdr + h.used_bytes;
  if (size < expect)
    throw std::runtime_error(err(path, "truncated: the data ends at byte " + std::to_string(size) +
                                           ", but the header promises " + std::to_string(expect) + " bytes (" +
                                           std::to_string(kHdr) + "-byte header + " + std::to_string(h.used_bytes) +
                                           " region bytes)"));
  if (size > expect)
    throw std::runtime_error(at(path, expect,
                                std::to_string(size - expect) + " unexpected bytes after the end of the image body"));
  return h;
}

void fsync_dir(const std::filesystem::path& file) {
  auto dir = file.parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself succeeded
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

ImageInfo write_image(const std::string& path, const char* region, uint64_t region_size, uint64_t used,
                      uint16_t memnode_id) {
  if (region_size < sizeof(RegionHeader) || used < sizeof(RegionHeader) || used > region_size)
    throw std::runtime_error(err(path, "cannot write an image of " + std::to_string(used) + " bytes of a region of " +
                                           std::to_string(region_size) + " bytes"));
  RegionHeader rh;
  std::memcpy(&rh, region, sizeof rh);
  validate_region_header(rh, "memnode " + std::to_string(memnode_id) + " region");
  if (rh.memnode_id != memnode_id || rh.region_size != region_size)
    throw std::runtime_error(err(path, "the region header says memnode " + std::to_string(rh.memnode_id) + ", " +
                                           std::to_string(rh.region_size) + " bytes; expected memnode " +
                                           std::to_string(memnode_id) + ", " + std::to_string(region_size) + " bytes"));

  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));  // the index is the user's data
  if (fd.get() < 0) throw std::runtime_error(err(tmp, std::string("cannot create: ") + std::strerror(errno)));
  try {
    ImageHeader h{};
    std::memcpy(h.magic, kImageMagic, sizeof h.magic);
    h.version = kImageFormatVersion;
    h.memnode_id = memnode_id;
    h.mode = rh.mode;
    h.region_size = region_size;
    h.used_bytes = used;
    h.created_unix_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
    // Placeholder header first (a crash leaves an invalid .tmp, never a valid-looking one).
    ImageHeader zero{};
    write_all(fd.get(), reinterpret_cast<const char*>(&zero), kHdr, 0, tmp);
    // Body: copy, checksum the copy, write the copy.
    std::unique_ptr<char[]> buf(new char[kChunk]);
    Checksum64 sum;
    for (uint64_t off = 0; off < used;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, used - off));
      std::memcpy(buf.get(), region + off, n);
      sum.update(buf.get(), n);
      write_all(fd.get(), buf.get(), n, kHdr + off, tmp);
      off += n;
    }
    h.body_checksum = sum.digest();
    h.header_checksum = header_checksum_of(h);
    write_all(fd.get(), reinterpret_cast<const char*>(&h), kHdr, 0, tmp);
    if (::fsync(fd.get()) != 0)
      throw std::runtime_error(err(tmp, std::string("fsync failed: ") + std::strerror(errno)));
    if (::close(fd.release()) != 0)
      throw std::runtime_error(err(tmp, std::string("close failed: ") + std::strerror(errno)));
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error(err(path, "cannot rename " + tmp + " to it: " + std::strerror(errno)));
    fsync_dir(path);

    ImageInfo info;
    info.path = path;
    info.memnode_id = memnode_id;
    info.mode = static_cast<Mode>(rh.mode);
    info.region_size = region_size;
    info.used_bytes = used;
    info.file_bytes = kHdr + used;
    info.body_checksum = h.body_checksum;
    info.node_count = rh.mode_words[shine_word::kNodeCount];
    return info;
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

ImageHeader read_image_header(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw std::runtime_error(err(path, std::string("cannot open: ") + std::strerror(errno)));
  return check_header(fd.get(), path);
}

ImageInfo load_image(const std::string& path, char* region, uint64_t region_size, uint16_t expected_id) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw std::runtime_error(err(path, std::string("cannot open: ") + std::strerror(errno)));
  const ImageHeader h = check_header(fd.get(), path);
  if (h.memnode_id != expected_id)
    throw std::runtime_error(at(path, offsetof(ImageHeader, memnode_id),
                                "the image is of memnode " + std::to_string(h.memnode_id) +
                                    ", but this memnode is --id " + std::to_string(expected_id)));
  if (h.region_size > region_size)
    throw std::runtime_error(at(path, offsetof(ImageHeader, region_size),
                                "the image holds a region of " + sz(h.region_size) +
                                    ", larger than this memnode's region of " + sz(region_size) +
                                    " (--region); start the memnode with --region " + std::to_string(h.region_size) +
                                    " or more, or without --region"));
  try {
    Checksum64 sum;
    for (uint64_t off = 0; off < h.used_bytes;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, h.used_bytes - off));
      read_all(fd.get(), region + off, n, kHdr + off, path, kHdr + h.used_bytes);
      sum.update(region + off, n);
      off += n;
    }
    uint64_t bc = sum.digest();
    if (bc != h.body_checksum)
      throw std::runtime_error(err(path, "body checksum mismatch over file bytes [" + std::to_string(kHdr) + ", " +
                                             std::to_string(kHdr + h.used_bytes) + ") (stored at offset " +
                                             std::to_string(offsetof(ImageHeader, body_checksum)) + ": " +
                                             hex(h.body_checksum) + ", computed " + hex(bc) +
                                             "): the image is corrupted"));
    RegionHeader rh;
    std::memcpy(&rh, region, sizeof rh);
    validate_region_header(rh, path + " (image body; file offset = region offset + " + std::to_string(kHdr) + ")");
    if (rh.region_size != h.region_size)
      throw std::runtime_error(at(path, kHdr + offsetof(RegionHeader, region_size),
                                  "the region header says region size " + std::to_string(rh.region_size) +
                                      ", the image header (offset 16) says " + std::to_string(h.region_size)));
    if (rh.memnode_id != expected_id)
      throw std::runtime_error(at(path, kHdr + offsetof(RegionHeader, memnode_id),
                                  "the region header is of memnode " + std::to_string(rh.memnode_id) +
                                      ", but this memnode is --id " + std::to_string(expected_id)));
    if (region_size > rh.region_size) {
      rh.region_size = region_size;  // the extra room is free space at the end of the region
      std::memcpy(region, &rh, sizeof rh);
    }
    ImageInfo info;
    info.path = path;
    info.memnode_id = expected_id;
    info.mode = static_cast<Mode>(rh.mode);
    info.region_size = h.region_size;
    info.used_bytes = h.used_bytes;
    info.file_bytes = kHdr + h.used_bytes;
    info.body_checksum = h.body_checksum;
    info.node_count = rh.mode_words[shine_word::kNodeCount];
    return info;
  } catch (...) {
    std::memset(region, 0, static_cast<size_t>(std::min<uint64_t>(region_size, kHeaderPageBytes)));
    throw;
  }
}

}  // namespace dmhnsw::memory
