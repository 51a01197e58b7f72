#ifndef HYBRIDSERVE_ENGINE_SAMPLER_H_
#define HYBRIDSERVE_ENGINE_SAMPLER_H_

// Per-request token sampling from one row of fp32 logits [vocab].
//
// Batch independence. The random draw for a request's step t is a pure
// function of (seed, t): u = SamplingUniform(seed, t). Nothing is carried from
// one call to the next, so the token a request gets at step t depends only on
// (params, t, its logits row): never on other requests in the batch, on call
// order, or on whether prefill sampled step 0 in another process and decode
// samples the rest (docs/ARCHITECTURE.md section 6, contract 3). A retried or resumed
// request that replays the same steps gets the same tokens.
//
// Step index: the 0-based index of the generated token within the completion
// (prefill samples step 0, decode steps 1, 2, ...).
//
// Order of processing (as vLLM): raw logits -> temperature -> top-k -> top-p
// -> draw. Greedy (temperature 0, or top_k 1) is the argmax, ties to the lowest
// token id; it uses no randomness. Otherwise, exactly:
//   rank      tokens ordered by logit, descending, ties to the lower id;
//   weight    w_i = exp((logit_i - max_logit) / temperature), in double;
//   top-k     keeps the top_k best-ranked tokens;
//   top-p     keeps, of those, every token whose better-ranked tokens weigh
//             less than top_p times the weight of all of them (so the token
//             that crosses top_p is kept, and the best one always is);
//   draw      walks the kept tokens in increasing id, summing weights, and
//             returns the first at which the sum exceeds u * (their total),
//             u = SamplingUniform(seed, step).
// Every summation order is fixed, so a token depends only on the inputs and
// the platform's std::exp, never on a sort algorithm: sums over a set of
// tokens run in increasing id; top-p's "better-ranked" sums run in rank order,
// except that over a whole row (no top-k) they are taken bin by bin (tokens
// binned by logit) up to the bin where the boundary falls, then in rank order
// inside it. Cost: O(vocab) per step plus sorting the top_k tokens, or the
// tokens of one logit bin; the vocabulary is never fully sorted.
//
// Logprobs are "raw": the log-softmax of the model's logits at temperature 1
// before any top-k / top-p filtering (vLLM's default), computed in double with
// max subtraction. They describe the model, not the filtered distribution the
// token was drawn from.
//
// Logit values: -inf is a masked token (probability 0, never sampled); a row
// that is all -inf, or holds NaN or +inf (a model bug), is an INTERNAL error,
// never a crash.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hybridserve::engine {

// Largest number of alternatives a request may ask for (OpenAI's limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// Sampling parameters of one request. Defaults sample the full distribution at
// temperature 1 (the wire's defaults for these fields are not zero: docs/ARCHITECTURE.md
// section 6 makes them optional there).
struct SamplingParams {
  float temperature = 1.0f;  // >= 0 and finite; 0 selects greedy
  int32_t top_k = 0;         // >= 0; 0 disables
  float top_p = 1.0f;        // in (0, 1]; 1 disables
  uint64_t seed = 0;         // the caller derives it with SeedFromRequestId when the request has none
  bool logprobs = false;     // report the sampled token's raw logprob
  int32_t top_logprobs = 0;  // 0..kMaxTopLogprobs alternatives; > 0 requires logprobs
};

// OK, or INVALID_ARGUMENT naming the first offending field.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// The default seed of a request that gives none: XXH3-64 of its request id.
uint64_t SeedFromRequestId(absl::string_view request_id);

// The uniform draw in [0, 1) for `step` of a request seeded with `seed`: a
// counter-based generator built from SplitMix64's finalizer,
//   z = Mix64(Mix64(seed) + (step + 1) * 0x9E3779B97F4A7C15)
//   u = (z >> 11) * 2^-53
// where Mix64 is SplitMix64's output function. Pure integer arithmetic, so the
// same on every machine and build.
double SamplingUniform(uint64_t seed, int64_t step);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;  // raw log-softmax of the model's logits

  friend bool operator==(const TokenLogprob& a, const TokenLogprob& b) {
    return a.token == b.token && a.logprob == b.logprob;
  }
};

struct SampledToken {
  int32_t token = 0;
  // Raw logprob of `token`; 0 unless params.logprobs.
  float logprob = 0.0f;
  // The params.top_logprobs most likely tokens by raw logit, most likely first,
  // ties to the lower id. Empty unless params.top_logprobs > 0.
  std::vector<TokenLogprob> top_logprobs;
};

// Samples tokens for one request. Not thread-safe: it keeps scratch buffers,
// sized to the vocabulary, from one step to the next. Use one per request, or
// one per thread across requests: results never depend on which instance ran.
class Sampler {
 public:
  // INVALID_ARGUMENT if `params` is invalid (see ValidateSamplingParams).
  static absl::StatusOr<Sampler> Create(const SamplingParams& params);

  // Samples step `step` (>= 0) from `logits` [vocab]. INVALID_ARGUMENT for an
  // empty row or a negative step; INTERNAL if the row holds NaN or +inf or is
  // entirely -inf.
  absl::StatusOr<SampledToken> Sample(absl::Span<const float> logits, int64_t step);

  const SamplingParams& params() const { return params_; }

 private:
  explicit Sampler(const SamplingParams& params) : params_(params) {}

  bool IsGreedy() const { return params_.temperature == 0.0f || params_.top_k == 1; }
  // Draws step `step` from a checked row whose largest logit is `max_logit`
  // and smallest finite one `min_logit`.
  int32_t Draw(absl::Span<const float> logits, float max_logit, float min_logit, int64_t step);
  // Top-k, then top-p within it: fills ids_ with the kept tokens in id order
  // and weights_ with their weights.
  void KeepTopK(absl::Span<const float> logits, float max_logit);
  // Top-p over the whole row, with weights_[i] the weight of token i: the
  // least likely token of the nucleus, or -1 when the nucleus is every token.
  int32_t NucleusBoundary(absl::Span<const float> logits, float max_logit, float min_logit, double total);

  SamplingParams params_;
  // Scratch reused across steps; nothing in it carries over.
  std::vector<int32_t> ids_;
  std::vector<int32_t> id_order_;
  std::vector<double> weights_;
  std::vector<uint16_t> token_bin_;
  std::vector<double> bin_mass_;
  std::vector<int32_t> bin_count_;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_SAMPLER_H_
