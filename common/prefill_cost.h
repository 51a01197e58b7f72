#ifndef HYBRIDSERVE_COMMON_PREFILL_COST_H_
#define HYBRIDSERVE_COMMON_PREFILL_COST_H_

// What prefilling a model costs, as the workers describe it to the cachestore
// (proto/cachestore.proto ModelCost) and as the utility eviction values a
// cached prefix by: a token at 0-based position t costs
//   flops_per_token + flops_per_token_context * (t + 1)
// FLOPs (attention over the t + 1 keys up to itself). engine/model_flops.h
// computes it from a model's config. Shared by the engine (which computes
// it) and the cachestore (which carries and uses it) so that neither mirrors
// the other's type. Value type; thread-safe.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace hybridserve {

struct PrefillCost {
  double flops_per_token = 0;          // C
  double flops_per_token_context = 0;  // A

  // FLOPs of tokens [0, p): p*C + A*p*(p+1)/2.
  double PrefixFlops(int64_t p) const {
    const double n = static_cast<double>(p);
    return n * flops_per_token + flops_per_token_context * n * (n + 1) / 2;
  }
  bool operator==(const PrefillCost& o) const {
    return flops_per_token == o.flops_per_token && flops_per_token_context == o.flops_per_token_context;
  }
  bool operator!=(const PrefillCost& o) const { return !(*this == o); }
};

// Above any model's per-token cost by many orders of magnitude (a 1e12-parameter
// model costs about 2e12 FLOPs per token), and far enough below the largest
// double that a prefix's FLOPs over the longest prompt stay finite.
inline constexpr double kMaxPrefillFlops = 1e30;

// The field of `cost` that is not a finite number in [0, kMaxPrefillFlops],
// as "flops_per_token nan is not a finite number in [0, 1e+30]" (the first
// that is not); empty when both are.
inline std::string PrefillCostProblem(const PrefillCost& cost) {
  const auto problem = [](const char* field, double v) -> std::string {
    if (std::isfinite(v) && v >= 0 && v <= kMaxPrefillFlops) return "";
    char text[128];
    std::snprintf(text, sizeof(text), "%s %g is not a finite number in [0, %g]", field, v, kMaxPrefillFlops);
    return text;
  };
  const std::string per_token = problem("flops_per_token", cost.flops_per_token);
  return per_token.empty() ? problem("flops_per_token_context", cost.flops_per_token_context) : per_token;
}

}  // namespace hybridserve

#endif  // HYBRIDSERVE_COMMON_PREFILL_COST_H_
