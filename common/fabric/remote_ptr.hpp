#pragma once
// RemotePtr: one 64-bit word naming a byte in some memory node's region.
// High 16 bits: memory node id; low 48 bits: byte offset into that node's region.
// Zero is null (offset 0 of node 0 is the region header, never a valid object).
#include <cstdint>
#include <functional>
#include <type_traits>

namespace dmhnsw {

class RemotePtr {
 public:
  static constexpr unsigned kOffsetBits = 48;
  static constexpr uint64_t kOffsetMask = (uint64_t{1} << kOffsetBits) - 1;

  constexpr RemotePtr() = default;
  constexpr RemotePtr(uint16_t node, uint64_t offset)
      : raw_((uint64_t{node} << kOffsetBits) | (offset & kOffsetMask)) {}
  static constexpr RemotePtr from_raw(uint64_t raw) {
    RemotePtr p;
    p.raw_ = raw;
    return p;
  }

  constexpr uint64_t raw() const { return raw_; }
  constexpr uint16_t node() const { return static_cast<uint16_t>(raw_ >> kOffsetBits); }
  constexpr uint64_t offset() const { return raw_ & kOffsetMask; }
  constexpr bool is_null() const { return raw_ == 0; }
  constexpr explicit operator bool() const { return raw_ != 0; }
  constexpr RemotePtr operator+(uint64_t bytes) const { return RemotePtr(node(), offset() + bytes); }
  friend constexpr bool operator==(RemotePtr a, RemotePtr b) = default;
  friend constexpr auto operator<=>(RemotePtr a, RemotePtr b) = default;

 private:
  uint64_t raw_ = 0;
};

static_assert(sizeof(RemotePtr) == 8);
static_assert(std::is_trivially_copyable_v<RemotePtr>);
static_assert(std::is_standard_layout_v<RemotePtr>);
static_assert(RemotePtr(3, 0x1234).node() == 3 && RemotePtr(3, 0x1234).offset() == 0x1234);
static_assert(RemotePtr(0xffff, RemotePtr::kOffsetMask).raw() == ~uint64_t{0});

}  // namespace dmhnsw

template <>
struct std::hash<dmhnsw::RemotePtr> {
  size_t operator()(dmhnsw::RemotePtr p) const noexcept { return std::hash<uint64_t>{}(p.raw()); }
};
