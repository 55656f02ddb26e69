#pragma once
// hnswlib's space over DistanceComputer's kernel (hnswlib's own code, the copy chosen for this
// CPU at start-up), for hnswlib-bench and the tests that build hnswlib indexes to compare with.
// <hnswlib/hnswlib.h> defines non-inline functions and globals: include this header from one
// translation unit per binary only.
//
// Under AddressSanitizer (tools/test.sh --sanitize address,undefined) hnswlib's graph code is
// compiled without its SSE paths, which only add prefetches here (the distances are
// DistanceComputer's): hnswlib 0.6.2's searchBaseLayer and addPoint prefetch the neighbour
// after a list's last one, reading 4 bytes past an upper level's list, the end of its malloc'd
// block, which ASan reports. The read is hnswlib's; hiding it this way hides nothing of ours.
#if defined(__SANITIZE_ADDRESS__) && !defined(NO_MANUAL_VECTORIZATION)
#define NO_MANUAL_VECTORIZATION
#endif
#include <hnswlib/hnswlib.h>

#include <cstddef>
#include <string>

#include "common/distance.hpp"

namespace dmhnsw {

class DispatchedSpace final : public hnswlib::SpaceInterface<float> {
 public:
  DispatchedSpace(Metric metric, std::size_t dim) : dist_(metric, dim), dim_(dim) {}
  std::size_t get_data_size() override { return dim_ * sizeof(float); }
  hnswlib::DISTFUNC<float> get_dist_func() override { return dist_.kernel(); }
  void* get_dist_func_param() override { return &dim_; }
  const std::string& kernel_name() const { return dist_.kernel_name(); }

 private:
  DistanceComputer dist_;
  std::size_t dim_;
};

}  // namespace dmhnsw
