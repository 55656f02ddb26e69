#pragma once
// The checks of `computenode serve`'s requests (proto/dmhnsw.proto), apart from the service so
// that a fuzz harness (tests/fuzz/fuzz_serve.cpp) can feed them any bytes. Each returns why a
// request is refused, naming its field first, or nothing.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "dmhnsw.pb.h"

namespace dmhnsw::serve {

struct RequestLimits {
  uint32_t dim = 0;         // the index's dimension (> 0)
  uint32_t max_k = 100;
  uint32_t max_batch = 10000;
  uint32_t partitions = 0;  // dhnsw: sub-HNSWs (the largest probe); 0: shine
  bool shine = false;
};

inline constexpr uint32_t kMaxEfSearch = 100000;
/// A request's rerank: vectors re-read per query at most (each is one READ of a full vector).
inline constexpr uint32_t kMaxRerank = 1024;

/// A search: n rows of finite floats, k, efSearch, probe and rerank within the limits (whether
/// the index can rerank at all is its backend's to say).
std::optional<std::string> check_search(const v1::SearchRequest& r, const RequestLimits& l, size_t& n);
/// An insert: n rows of finite floats with n distinct ids >= 0.
std::optional<std::string> check_insert(const v1::InsertRequest& r, const RequestLimits& l, size_t& n);
/// A delete: 1 .. max_batch distinct ids >= 0.
std::optional<std::string> check_delete(const v1::DeleteRequest& r, const RequestLimits& l);

}  // namespace dmhnsw::serve
