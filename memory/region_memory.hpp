#pragma once
// The memory behind a memnode's region: anonymous memory, optionally on hugepages and bound
// to a NUMA node.
#include <cstdint>
#include <string>

namespace dmhnsw::memory {

class RegionMemory {
 public:
  /// `numa_node` < 0: no binding. Hugepages fall back to normal pages with a warning.
  /// `shared`: a shared memory object (memfd) that other processes can map (--provider cxl).
  /// `dax`: map the shared region from this device-DAX or file instead (grown to `bytes` if a
  /// smaller regular file).
  RegionMemory(uint64_t bytes, bool hugepages, int numa_node, bool shared = false, const std::string& dax = "");
  ~RegionMemory();
  RegionMemory(const RegionMemory&) = delete;
  RegionMemory& operator=(const RegionMemory&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool on_hugepages() const { return huge_; }
  std::string describe() const;
  /// The shared memory object's fd (-1 unless `shared`).
  int fd() const { return fd_; }

 private:
  char* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t mapped_ = 0;
  bool huge_ = false;
  int numa_node_ = -1;
  int fd_ = -1;
  std::string dax_;
};

}  // namespace dmhnsw::memory
