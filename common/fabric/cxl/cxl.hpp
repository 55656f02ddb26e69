#pragma once
// Internal to common/fabric: the `cxl` provider's wire structs and socket helpers. A memnode's
// region is a shared memory object (memfd); after the token check on the control port, a
// computenode connects to the memnode's Unix socket (abstract name, handed out only in the
// welcome), proves it joined (its id and the nonce its hello carried) and receives the region's
// file descriptor (SCM_RIGHTS) to map. One-sided operations are then loads, stores and atomic
// instructions on the mapping: the memnode's CPU takes no part. Messages (relay, admin) travel
// as frames on the same kind of socket, one connection per endpoint and memnode.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dmhnsw::fabric::cxl {

inline constexpr uint32_t kHelloMagic = 0x4C58434Du;  // "MCXL"
inline constexpr size_t kNonceBytes = 16;
inline constexpr uint32_t kMaxFrame = 64u << 20;

/// First bytes on a socket connection: who connects and whether it wants the region's fd.
struct Hello {
  uint32_t magic;
  uint32_t cn_id;
  uint8_t nonce[kNonceBytes];
  uint8_t want_fd;  // 1: the mapping connection; 0: a message channel
  uint8_t reserved[7];
};
static_assert(std::is_trivially_copyable_v<Hello> && sizeof(Hello) == 32);

/// The memnode's answer to a Hello (with the fd as SCM_RIGHTS when asked for).
struct Accept {
  uint32_t magic;
  uint32_t ok;           // 0: refused (not joined with that nonce)
  uint64_t region_size;  // bytes to map
};
static_assert(std::is_trivially_copyable_v<Accept> && sizeof(Accept) == 16);

/// Writes all of [data, data + len) (MSG_NOSIGNAL); false when the peer is gone.
bool write_all(int fd, const void* data, size_t len);
/// Reads exactly len bytes, waiting at most timeout_ms in total; false on EOF, error or timeout.
bool read_all(int fd, void* data, size_t len, int timeout_ms);
/// Sends `data` with `pass_fd` attached (SCM_RIGHTS).
bool send_with_fd(int sock, const void* data, size_t len, int pass_fd);
/// Receives exactly `len` bytes and the fd attached to them (-1 when none), within timeout_ms.
bool recv_with_fd(int sock, void* data, size_t len, int* fd_out, int timeout_ms);
/// A connected Unix socket to the abstract name `name` (no leading NUL), or -1 with errno.
int connect_abstract(const std::string& name);

}  // namespace dmhnsw::fabric::cxl
