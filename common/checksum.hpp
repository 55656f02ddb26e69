#pragma once
// A fast 64-bit checksum (not cryptographic) for files and blocks that cross machines: region
// images (memory/image.hpp), the d-HNSW metadata block (compute/dhnsw/layout.hpp).
#include <cstddef>
#include <cstdint>

namespace dmhnsw {

/// Four independent multiply-xorshift lanes over 8-byte little-endian words, then the tail
/// and the length. Every step is a bijection of the state, so a change confined to one 8-byte
/// word is always detected. Streaming: feeding the same bytes in any split gives the same
/// digest.
class Checksum64 {
 public:
  Checksum64();
  void update(const void* data, size_t len);
  uint64_t digest() const;

 private:
  void stripe(const unsigned char* p);
  uint64_t lane_[4];
  unsigned char pending_[32];
  size_t npending_ = 0;
  uint64_t total_ = 0;
};

/// One-shot Checksum64 of [data, data + len).
uint64_t checksum64(const void* data, size_t len);

}  // namespace dmhnsw
