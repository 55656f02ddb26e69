#include "compute/serve/requests.hpp"

#include <cmath>
#include <cstring>
#include <unordered_map>

namespace dmhnsw::serve {
namespace {

/// The batch in `vectors` as n rows of `dim` floats, or why not (naming the field).
std::optional<std::string> check_vectors(const std::string& bytes, uint32_t dim, const RequestLimits& l, size_t& n) {
  if (dim != l.dim || l.dim == 0)
    return "dim: " + std::to_string(dim) + ", the index has dimension " + std::to_string(l.dim);
  if (bytes.empty()) return std::string("vectors: empty batch");
  if (bytes.size() % (4ull * dim) != 0)
    return "vectors: " + std::to_string(bytes.size()) + " bytes is not a whole number of rows of " + std::to_string(dim) +
           " float32 (" + std::to_string(4ull * dim) + " bytes each)";
  n = bytes.size() / (4ull * dim);
  if (n > l.max_batch)
    return "vectors: " + std::to_string(n) + " rows, at most " + std::to_string(l.max_batch) + " per request";
  for (size_t i = 0; i < n * dim; ++i) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    if (!std::isfinite(v))
      return "vectors: row " + std::to_string(i / dim) + ", element " + std::to_string(i % dim) + " is not finite";
  }
  return std::nullopt;
}

// Ids >= 0, each once.
std::optional<std::string> check_ids(const google::protobuf::RepeatedField<int64_t>& ids) {
  std::unordered_map<int64_t, int> seen;
  for (int i = 0; i < ids.size(); ++i) {
    const int64_t id = ids.Get(i);
    if (id < 0) return "ids: element " + std::to_string(i) + " is " + std::to_string(id) + ", want >= 0";
    auto [it, fresh] = seen.emplace(id, i);
    if (!fresh)
      return "ids: id " + std::to_string(id) + " appears twice (elements " + std::to_string(it->second) + " and " +
             std::to_string(i) + ")";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> check_search(const v1::SearchRequest& r, const RequestLimits& l, size_t& n) {
  if (auto why = check_vectors(r.vectors(), r.dim(), l, n)) return why;
  if (r.k() == 0 || r.k() > l.max_k) return "k: " + std::to_string(r.k()) + ", want 1 .. " + std::to_string(l.max_k);
  if (r.ef_search() > kMaxEfSearch)
    return "ef_search: " + std::to_string(r.ef_search()) + ", at most " + std::to_string(kMaxEfSearch);
  if (l.shine && r.probe() != 0) return std::string("probe: only a dhnsw index has partitions to probe");
  if (l.partitions != 0 && r.probe() > l.partitions)
    return "probe: " + std::to_string(r.probe()) + ", the index has " + std::to_string(l.partitions) + " partitions";
  if (r.rerank() > kMaxRerank)
    return "rerank: " + std::to_string(r.rerank()) + ", at most " + std::to_string(kMaxRerank);
  return std::nullopt;
}

std::optional<std::string> check_insert(const v1::InsertRequest& r, const RequestLimits& l, size_t& n) {
  if (auto why = check_vectors(r.vectors(), r.dim(), l, n)) return why;
  if (static_cast<size_t>(r.ids_size()) != n)
    return "ids: " + std::to_string(r.ids_size()) + " ids for " + std::to_string(n) + " vectors";
  return check_ids(r.ids());
}

std::optional<std::string> check_delete(const v1::DeleteRequest& r, const RequestLimits& l) {
  if (r.ids_size() == 0) return std::string("ids: empty, want 1 .. ") + std::to_string(l.max_batch) + " ids";
  if (static_cast<uint64_t>(r.ids_size()) > l.max_batch)
    return "ids: " + std::to_string(r.ids_size()) + " ids, at most " + std::to_string(l.max_batch) + " per request";
  return check_ids(r.ids());
}

}  // namespace dmhnsw::serve
