#include "memory/region_memory.hpp"

#include <numa.h>
#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/units.hpp"

namespace dmhnsw::memory {

namespace {
constexpr uint64_t kHugePage = 2u << 20;
}

RegionMemory::RegionMemory(uint64_t bytes, bool hugepages, int numa_node, bool shared, const std::string& dax)
    : size_(bytes), numa_node_(numa_node) {
  if (numa_node >= 0) {
    if (numa_available() < 0)
      throw std::runtime_error("--numa-node " + std::to_string(numa_node) + ": this kernel has no NUMA support");
    if (numa_node > numa_max_node())
      throw std::runtime_error("--numa-node " + std::to_string(numa_node) + ": this machine has NUMA nodes 0.." +
                               std::to_string(numa_max_node()));
  }
  void* p = MAP_FAILED;
  if (shared && !dax.empty()) {
    fd_ = ::open(dax.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);  // a file is created, a device must exist
    if (fd_ < 0) throw std::runtime_error("--dax " + dax + ": cannot open it: " + std::strerror(errno));
    struct stat st {};
    ::fstat(fd_, &st);
    mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;  // device-DAX maps in 2 MiB units
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < mapped_ &&
        ::ftruncate(fd_, static_cast<off_t>(mapped_)) != 0)
      throw std::runtime_error("--dax " + dax + ": cannot grow it to " + format_bytes(mapped_) + ": " +
                               std::strerror(errno));
    p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("--dax " + dax + ": cannot map " + format_bytes(mapped_) + " of it: " +
                               std::strerror(errno));
    dax_ = dax;
  }
  if (shared && p == MAP_FAILED && hugepages) {
    // A memory object computenodes on this host map (--provider cxl), on hugetlbfs when asked:
    // the pages are taken at the mapping, which fails when too few are free.
    const uint64_t huge_bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const int fd = ::memfd_create("dmhnsw-region", MFD_CLOEXEC | MFD_HUGETLB);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(huge_bytes)) == 0)
      p = ::mmap(nullptr, huge_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED) {
      fd_ = fd;
      mapped_ = huge_bytes;
      huge_ = true;
    } else {
      const int err = errno;
      spdlog::warn("--hugepages: cannot map {} of shared memory on 2 MiB hugepages ({}); falling back to normal "
                   "pages (reserve some with: echo N > /proc/sys/vm/nr_hugepages)",
                   format_bytes(huge_bytes), std::strerror(err));
      if (fd >= 0) ::close(fd);
    }
  }
  if (shared && p == MAP_FAILED) {
    mapped_ = (bytes + 4095) / 4096 * 4096;
    fd_ = ::memfd_create("dmhnsw-region", MFD_CLOEXEC);
    if (fd_ < 0 || ::ftruncate(fd_, static_cast<off_t>(mapped_)) != 0)
      throw std::runtime_error("--region " + format_bytes(bytes) + ": cannot create a shared memory object: " +
                               std::strerror(errno));
    p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("--region " + format_bytes(bytes) + ": cannot map the shared memory object: " +
                               std::strerror(errno));
  }
  if (p == MAP_FAILED && hugepages) {
    mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1,
               0);
    if (p == MAP_FAILED)
      spdlog::warn("--hugepages: cannot map {} on 2 MiB hugepages ({}); falling back to normal pages "
                   "(reserve some with: echo N > /proc/sys/vm/nr_hugepages)",
                   format_bytes(mapped_), std::strerror(errno));
    else
      huge_ = true;
  }
  if (p == MAP_FAILED) {
    mapped_ = (bytes + 4095) / 4096 * 4096;
    // Populated up front, as RDMA registration pins it: no page faults on the data path.
    p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("--region " + format_bytes(bytes) + ": cannot map the region: " + std::strerror(errno));
    if (hugepages) ::madvise(p, mapped_, MADV_HUGEPAGE);  // transparent hugepages, best effort
  }
  data_ = static_cast<char*>(p);
  if (numa_node >= 0) {
    numa_tonode_memory(data_, mapped_, numa_node);
    spdlog::info("region bound to NUMA node {}", numa_node);
  }
}

RegionMemory::~RegionMemory() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
  if (fd_ >= 0) ::close(fd_);
}

std::string RegionMemory::describe() const {
  if (!dax_.empty()) return format_bytes(size_) + " mapped from " + dax_;
  return format_bytes(size_) + (huge_ ? " on 2 MiB hugepages" : " on normal pages") +
         (numa_node_ >= 0 ? ", NUMA node " + std::to_string(numa_node_) : std::string());
}

}  // namespace dmhnsw::memory
