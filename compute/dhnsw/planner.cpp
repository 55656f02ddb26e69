#include "compute/dhnsw/planner.hpp"

#include <algorithm>
#include <map>

namespace dmhnsw::dhnsw {

BatchPlan plan_batch(const std::vector<std::vector<uint32_t>>& probes, bool regroup,
                     const std::function<bool(uint32_t)>& cached) {
  BatchPlan plan;
  if (!regroup) {
    std::map<uint32_t, bool> distinct;
    for (uint32_t q = 0; q < probes.size(); ++q)
      for (uint32_t s : probes[q]) {
        plan.entries.push_back({s, {q}, false});
        distinct[s] = true;
      }
    plan.needed = distinct.size();
    return plan;
  }
  std::map<uint32_t, std::vector<uint32_t>> by_sub;  // ordered by id: ties break by lower id
  for (uint32_t q = 0; q < probes.size(); ++q)
    for (uint32_t s : probes[q]) {
      auto& v = by_sub[s];
      if (v.empty() || v.back() != q) v.push_back(q);  // a query probing a sub twice searches it once
    }
  for (auto& [s, qs] : by_sub) plan.entries.push_back({s, std::move(qs), false});
  std::stable_sort(plan.entries.begin(), plan.entries.end(),
                   [](const PlanEntry& a, const PlanEntry& b) { return a.queries.size() > b.queries.size(); });
  plan.needed = plan.entries.size();
  for (auto& e : plan.entries)
    if (cached && cached(e.sub)) {
      e.cached = true;
      ++plan.cache_hits;
    }
  return plan;
}

}  // namespace dmhnsw::dhnsw
