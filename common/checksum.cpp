#include "common/checksum.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace dmhnsw {

namespace {

constexpr uint64_t kMulA = 0xA24BAED4963EE407ull;  // odd multipliers
constexpr uint64_t kMulB = 0x9FB21C651E98DF25ull;
constexpr uint64_t kSeeds[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull,
                                0x082EFA98EC4E6C89ull};  // digits of pi

inline uint64_t load64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
/// One lane step: a bijection of `lane` for every word.
inline uint64_t absorb(uint64_t lane, uint64_t w) {
  lane = (lane ^ w) * kMulA;
  return lane ^ (lane >> 31);
}
/// Final avalanche: a bijection.
inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 29;
  h *= kMulB;
  h ^= h >> 32;
  h *= kMulA;
  return h ^ (h >> 29);
}

}  // namespace

Checksum64::Checksum64() { std::copy(std::begin(kSeeds), std::end(kSeeds), lane_); }

void Checksum64::stripe(const unsigned char* p) {
  lane_[0] = absorb(lane_[0], load64(p));
  lane_[1] = absorb(lane_[1], load64(p + 8));
  lane_[2] = absorb(lane_[2], load64(p + 16));
  lane_[3] = absorb(lane_[3], load64(p + 24));
}

void Checksum64::update(const void* data, size_t len) {
  if (len == 0) return;  // data may be null (an empty vector's): memcpy must not see it
  auto p = static_cast<const unsigned char*>(data);
  total_ += len;
  if (npending_ > 0) {
    size_t take = std::min(len, sizeof pending_ - npending_);
    std::memcpy(pending_ + npending_, p, take);
    npending_ += take;
    p += take;
    len -= take;
    if (npending_ < sizeof pending_) return;
    stripe(pending_);
    npending_ = 0;
  }
  for (; len >= 32; p += 32, len -= 32) stripe(p);
  std::memcpy(pending_, p, len);
  npending_ = len;
}

uint64_t Checksum64::digest() const {
  uint64_t h = avalanche(total_ ^ kSeeds[0]);
  for (uint64_t l : lane_) h = avalanche(h ^ l);
  size_t i = 0;
  for (; i + 8 <= npending_; i += 8) h = avalanche(h ^ load64(pending_ + i));
  if (i < npending_) {
    unsigned char last[8] = {};
    std::memcpy(last, pending_ + i, npending_ - i);
    h = avalanche(h ^ load64(last));
  }
  return h;
}

uint64_t checksum64(const void* data, size_t len) {
  Checksum64 c;
  c.update(data, len);
  return c.digest();
}

}  // namespace dmhnsw
