#pragma once
// SHINE query routing policies (paper section 7.2, Algorithm 2). Pure bookkeeping: which
// computenode a query goes to, given the oracle's ranking; no transport here.
#include <cstdint>
#include <string>
#include <vector>

namespace dmhnsw::router {

enum class Policy { None, BestFit, Balanced, Adaptive };
Policy parse_policy(const std::string& name);  // "none" | "best-fit" | "balanced" | "adaptive"; throws naming --routing
const char* policy_name(Policy p);

/// What adaptive routing scales by the queue weights (σ − P_i):
///   Even    the paper's Algorithm 2: limit_i ∝ (σ − P_i), i.e. ω_i·b/K. With equal queues
///           every computenode gets b/K, whatever the oracle prefers (= balanced).
///   Demand  limit_i ∝ D_i·(σ − P_i), D_i = the queries of the batch whose first choice is i,
///           and P_i counts only the backlog beyond the threshold t (queue_floor): a queue
///           of up to t is the buffer a computenode is meant to have. With no backlog this
///           is best-fit; a computenode that falls behind keeps less of its demand. Needs
///           choose_batch (the demand of a batch is known only with the whole batch);
///           choose() alone uses the queue weights' limits.
enum class QuotaBase { Even, Demand };
QuotaBase parse_quota_base(const std::string& name);  // "even" | "demand"; throws naming --adaptive-quota
const char* quota_base_name(QuotaBase b);

class RoutingPolicy {
 public:
  /// `self`: this computenode; `batch`: b, queries per batch (balanced, adaptive).
  /// `queue_floor`: QuotaBase::Demand only, the queue length that is not backlog (t).
  RoutingPolicy(Policy p, uint32_t num_cns, uint32_t self, uint32_t batch = 1000, QuotaBase base = QuotaBase::Even,
                uint64_t queue_floor = 0);

  /// The computenode for a query whose oracle ranking is `ranked` (num_cns ids, best
  /// first): none → self; best-fit → ranked[0]; balanced/adaptive → the first in ranked
  /// order whose count in this batch is below its limit. Counts the query.
  uint32_t choose(const uint32_t* ranked);
  /// Chooses for several queries at once: ranked[x] is query x's ranking, regret[x] what it
  /// loses by leaving its first choice (its oracle score at ranked[x][1] minus the one at
  /// ranked[x][0]). Balanced/adaptive: the queries with the largest regret choose first
  /// (ties: input order), so the ones near a partition boundary are the ones moved when a
  /// computenode's limit is reached; first every query that fits its first choice takes it,
  /// then the others go down their rankings (a moved query never displaces a first choice).
  /// Other policies: choose() in input order. Returns the
  /// targets in input order.
  std::vector<uint32_t> choose_batch(const std::vector<const uint32_t*>& ranked, const std::vector<float>& regret);
  /// True when `batch` queries were chosen since the last reset (balanced, adaptive).
  bool batch_full() const;
  /// Ends the batch: resets the histogram. Adaptive: the new limits from every
  /// computenode's working-queue length (Algorithm 2: ω_i = K(σ − P_i) / Σ_p(σ − p), limit
  /// ω_i·b/K, rounded so the limits sum to b; all equal when every queue is empty). With
  /// QuotaBase::Demand the weights σ − P_i are kept for the next choose_batch.
  void end_batch(const std::vector<uint64_t>& queue_lengths);

  const std::vector<uint32_t>& limits() const { return limits_; }
  const std::vector<uint32_t>& histogram() const { return hist_; }
  Policy policy() const { return policy_; }
  QuotaBase quota_base() const { return base_; }

 private:
  Policy policy_;
  QuotaBase base_;
  uint32_t k_, self_, batch_, routed_ = 0;
  uint64_t queue_floor_;
  std::vector<uint32_t> limits_, hist_;
  std::vector<uint64_t> queue_weights_;  // σ − P_i of the last end_batch (all 1 before, or when σ = 0)
};

}  // namespace dmhnsw::router
