// SHINE query routing policies (paper section 7.2, Algorithm 2).
//
// Limits: integers summing exactly to b. Balanced: b/K each, the b mod K extra queries go to
// this computenode first, then to the next ids cyclically (self, self+1, ...), so routers on
// different computenodes hand their extras to different computenodes and the extra query of a
// router stays local. Adaptive: ω_i·b/K = b(σ − P_i) / Σ_p(σ − p) rounded by the largest
// remainder (exact integer arithmetic), ties again in cyclic order from self. Adaptive with
// the Demand base: b·D_i(σ − P_i) / Σ_j D_j(σ − P_j), D_i the batch's first choices of i.
#include "router/policy.hpp"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <stdexcept>

namespace dmhnsw::router {

Policy parse_policy(const std::string& name) {
  std::string t = name;
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "none") return Policy::None;
  if (t == "best-fit") return Policy::BestFit;
  if (t == "balanced") return Policy::Balanced;
  if (t == "adaptive") return Policy::Adaptive;
  throw std::invalid_argument("--routing: unknown routing policy '" + name +
                              "' (expected none, best-fit, balanced or adaptive)");
}

QuotaBase parse_quota_base(const std::string& name) {
  if (name == "even") return QuotaBase::Even;
  if (name == "demand") return QuotaBase::Demand;
  throw std::invalid_argument("--adaptive-quota: unknown quota base '" + name + "' (expected even or demand)");
}

const char* quota_base_name(QuotaBase b) { return b == QuotaBase::Demand ? "demand" : "even"; }

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::None: return "none";
    case Policy::BestFit: return "best-fit";
    case Policy::Balanced: return "balanced";
    case Policy::Adaptive: return "adaptive";
  }
  return "?";
}

namespace {

using u128 = unsigned __int128;

/// Splits `total` over weights.size() shares proportionally to the weights (Σ weights > 0):
/// floor(total·w_i/W), then one more for the largest remainders (ties: cyclic order from
/// `first`). The shares sum exactly to total.
std::vector<uint32_t> largest_remainder(uint32_t total, const std::vector<u128>& weights,
                                        uint32_t first) {
  const size_t k = weights.size();
  u128 sum = 0;
  for (u128 w : weights) sum += w;
  std::vector<uint32_t> out(k, 0);
  std::vector<u128> rem(k, 0);
  uint64_t given = 0;
  for (size_t i = 0; i < k; ++i) {
    const u128 num = static_cast<u128>(total) * weights[i];
    out[i] = static_cast<uint32_t>(num / sum);
    rem[i] = num % sum;
    given += out[i];
  }
  // Order of the extras: larger remainder first, then cyclic distance from `first`.
  std::vector<uint32_t> order(k);
  std::iota(order.begin(), order.end(), 0u);
  auto cyc = [&](uint32_t i) { return (i + k - first % k) % k; };
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return rem[a] > rem[b] || (rem[a] == rem[b] && cyc(a) < cyc(b));
  });
  for (size_t j = 0; given < total; ++j, ++given) ++out[order[j % k]];
  return out;
}

std::vector<uint32_t> equal_limits(uint32_t k, uint32_t batch, uint32_t self) {
  return largest_remainder(batch, std::vector<u128>(k, 1), self);
}

}  // namespace

RoutingPolicy::RoutingPolicy(Policy p, uint32_t num_cns, uint32_t self, uint32_t batch, QuotaBase base,
                             uint64_t queue_floor)
    : policy_(p), base_(base), k_(num_cns), self_(self), batch_(batch),
      queue_floor_(base == QuotaBase::Demand ? queue_floor : 0) {
  if (num_cns == 0) throw std::invalid_argument("RoutingPolicy: num_cns must be >= 1");
  if (self >= num_cns)
    throw std::invalid_argument("RoutingPolicy: self=" + std::to_string(self) +
                                " is not below num_cns=" + std::to_string(num_cns));
  if (batch == 0) throw std::invalid_argument("RoutingPolicy: batch must be >= 1");
  hist_.assign(k_, 0);
  limits_ = equal_limits(k_, batch_, self_);
  queue_weights_.assign(k_, 1);
}

uint32_t RoutingPolicy::choose(const uint32_t* ranked) {
  uint32_t target;
  switch (policy_) {
    case Policy::None:
      target = self_;
      break;
    case Policy::BestFit:
      target = ranked[0];
      break;
    case Policy::Balanced:
    case Policy::Adaptive:
    default: {
      target = ranked[0];  // every computenode at its limit (cannot happen within a batch)
      for (uint32_t j = 0; j < k_; ++j) {
        const uint32_t cn = ranked[j];
        if (cn < k_ && hist_[cn] < limits_[cn]) {
          target = cn;
          break;
        }
      }
      break;
    }
  }
  if (target < k_) ++hist_[target];
  ++routed_;
  return target;
}

std::vector<uint32_t> RoutingPolicy::choose_batch(const std::vector<const uint32_t*>& ranked,
                                                  const std::vector<float>& regret) {
  if (regret.size() != ranked.size())
    throw std::invalid_argument("RoutingPolicy::choose_batch: " + std::to_string(regret.size()) + " regrets for " +
                                std::to_string(ranked.size()) + " queries");
  if (policy_ == Policy::Adaptive && base_ == QuotaBase::Demand && routed_ == 0 && !ranked.empty()) {
    std::vector<u128> w(k_, 0);
    for (const uint32_t* r : ranked)
      if (r[0] < k_) ++w[r[0]];
    u128 total = 0;
    for (uint32_t i = 0; i < k_; ++i) total += w[i] *= queue_weights_[i];
    // total = 0: nothing wanted where there is room (every first choice has the only nonempty
    // queue); the limits end_batch set from the queue weights alone stay, as with Even.
    if (total > 0) limits_ = largest_remainder(batch_, w, self_);
  }
  std::vector<size_t> order(ranked.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (policy_ == Policy::Balanced || policy_ == Policy::Adaptive)
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return regret[a] > regret[b]; });
  std::vector<uint32_t> out(ranked.size());
  if (policy_ != Policy::Balanced && policy_ != Policy::Adaptive) {
    for (size_t x : order) out[x] = choose(ranked[x]);
    return out;
  }
  // Two passes: first every query whose first choice still has room takes it; then the rest
  // go down their rankings. So a query moved off a full computenode never takes the place of
  // one that wanted that computenode first.
  std::vector<size_t> rest;
  for (size_t x : order) {
    const uint32_t first = ranked[x][0];
    if (first < k_ && hist_[first] < limits_[first]) {
      out[x] = first;
      ++hist_[first];
      ++routed_;
    } else {
      rest.push_back(x);
    }
  }
  for (size_t x : rest) out[x] = choose(ranked[x]);
  return out;
}

bool RoutingPolicy::batch_full() const {
  return (policy_ == Policy::Balanced || policy_ == Policy::Adaptive) && routed_ >= batch_;
}

void RoutingPolicy::end_batch(const std::vector<uint64_t>& queue_lengths) {
  std::fill(hist_.begin(), hist_.end(), 0u);
  routed_ = 0;
  if (policy_ != Policy::Adaptive) return;
  if (queue_lengths.size() != k_)
    throw std::invalid_argument("RoutingPolicy::end_batch: " +
                                std::to_string(queue_lengths.size()) +
                                " queue lengths for " + std::to_string(k_) + " computenodes");
  // ω_i·b/K = b(σ − P_i) / Σ_p(σ − p), with Σ_p(σ − p) = (K − 1)σ.
  std::vector<uint64_t> backlog(queue_lengths);
  for (uint64_t& p : backlog) p = p > queue_floor_ ? p - queue_floor_ : 0;
  u128 sigma = 0;
  for (uint64_t p : backlog) sigma += p;
  std::vector<u128> weights(k_);
  u128 denom = 0;
  for (uint32_t i = 0; i < k_; ++i) {
    weights[i] = sigma - backlog[i];
    denom += weights[i];
  }
  if (sigma == 0 || denom == 0) {
    limits_ = equal_limits(k_, batch_, self_);
    queue_weights_.assign(k_, 1);
    return;
  }
  limits_ = largest_remainder(batch_, weights, self_);
  for (uint32_t i = 0; i < k_; ++i) queue_weights_[i] = static_cast<uint64_t>(weights[i]);
}

}  // namespace dmhnsw::router
