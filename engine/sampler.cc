#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace hybridserve::engine {
namespace {

// SplitMix64's output function (Steele, Lea, Flood 2014; the constants of
// Vigna's splitmix64.c).
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Candidate order: higher logit first, then lower token id. A strict weak
// order on a row without NaN.
struct MoreLikely {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); }
};

// The `n` most likely tokens of `logits` with their raw logprobs (logit - lse),
// most likely first. O(vocab) for small n.
std::vector<TokenLogprob> TopLogprobs(absl::Span<const float> logits, int32_t n, double log_sum_exp) {
  n = static_cast<int32_t>(std::min<size_t>(n, logits.size()));
  const MoreLikely more_likely{logits.data()};
  std::vector<int32_t> top;  // sorted most likely first, at most n entries
  top.reserve(n + 1);
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (static_cast<int32_t>(top.size()) == n && !more_likely(i, top.back())) continue;
    top.insert(std::upper_bound(top.begin(), top.end(), i, more_likely), i);
    if (static_cast<int32_t>(top.size()) > n) top.pop_back();
  }
  std::vector<TokenLogprob> out;
  out.reserve(top.size());
  for (int32_t id : top) {
    out.push_back(TokenLogprob{id, static_cast<float>(static_cast<double>(logits[id]) - log_sum_exp)});
  }
  return out;
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be finite and >= 0, got ", params.temperature));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0 disables), got ", params.top_k));
  }
  // NaN fails both comparisons, so it is rejected too.
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", params.top_p));
  }
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs, "], got ", params.top_logprobs));
  }
  if (params.top_logprobs > 0 && !params.logprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs = ", params.top_logprobs, " requires logprobs to be set"));
  }
  return absl::OkStatus();
}

uint64_t SeedFromRequestId(absl::string_view request_id) {
  return common::Checksum64(request_id.data(), request_id.size());
}

double SamplingUniform(uint64_t seed, int64_t step) {
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;  // SplitMix64's increment
  // Unsigned arithmetic: wraps by definition.
  const uint64_t z = Mix64(Mix64(seed) + (static_cast<uint64_t>(step) + 1) * kGamma);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

absl::StatusOr<Sampler> Sampler::Create(const SamplingParams& params) {
  absl::Status status = ValidateSamplingParams(params);
  if (!status.ok()) return status;
  return Sampler(params);
}

absl::StatusOr<SampledToken> Sampler::Sample(absl::Span<const float> logits, int64_t step) {
  if (logits.empty()) return absl::InvalidArgumentError("empty logits row");
  if (logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("vocab ", logits.size(), " does not fit a token id"));
  }
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step));

  // One pass: reject NaN and +inf, find the argmax (first maximum = lowest
  // id) and the smallest finite logit.
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int32_t vocab = static_cast<int32_t>(logits.size());
  int32_t argmax = 0;
  float max_logit = -kInf;
  float min_logit = kInf;
  for (int32_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (!(l < kInf)) return absl::InternalError(absl::StrCat("logit of token ", i, " is ", l));  // NaN or +inf
    if (l > max_logit) {
      max_logit = l;
      argmax = i;
    }
    if (l < min_logit && l > -kInf) min_logit = l;
  }
  if (max_logit == -kInf) return absl::InternalError(absl::StrCat("all ", vocab, " logits are -inf"));

  SampledToken out;
  out.token = IsGreedy() ? argmax : Draw(logits, max_logit, min_logit, step);
  if (params_.logprobs) {
    double sum = 0.0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
    const double log_sum_exp = max_logit + std::log(sum);
    out.logprob = static_cast<float>(static_cast<double>(logits[out.token]) - log_sum_exp);
    if (params_.top_logprobs > 0) out.top_logprobs = TopLogprobs(logits, params_.top_logprobs, log_sum_exp);
  }
  return out;
}

void Sampler::KeepTopK(absl::Span<const float> logits, float max_logit) {
  const MoreLikely more_likely{logits.data()};
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const size_t k = static_cast<size_t>(params_.top_k);
  // A heap whose front is the worst of the best k so far: most tokens are
  // rejected by one comparison with it.
  ids_.clear();
  for (int32_t i = 0; i < vocab; ++i) {
    if (ids_.size() < k) {
      ids_.push_back(i);
      std::push_heap(ids_.begin(), ids_.end(), more_likely);
    } else if (more_likely(i, ids_.front())) {
      std::pop_heap(ids_.begin(), ids_.end(), more_likely);
      ids_.back() = i;
      std::push_heap(ids_.begin(), ids_.end(), more_likely);
    }
  }
  std::sort(ids_.begin(), ids_.end(), more_likely);  // rank order
  const double inv_temperature = 1.0 / static_cast<double>(params_.temperature);
  const auto weight = [&](int32_t id) {
    return std::exp((static_cast<double>(logits[id]) - max_logit) * inv_temperature);
  };
  if (params_.top_p < 1.0f) {
    id_order_.assign(ids_.begin(), ids_.end());
    std::sort(id_order_.begin(), id_order_.end());
    double total = 0.0;
    for (int32_t id : id_order_) total += weight(id);
    const double mass = static_cast<double>(params_.top_p) * total;
    double before = 0.0;
    size_t keep = 0;
    while (keep < ids_.size() && before < mass) before += weight(ids_[keep++]);
    ids_.resize(keep);
  }
  std::sort(ids_.begin(), ids_.end());  // the draw walks id order
  weights_.resize(ids_.size());
  for (size_t j = 0; j < ids_.size(); ++j) weights_[j] = weight(ids_[j]);
}

int32_t Sampler::NucleusBoundary(absl::Span<const float> logits, float max_logit, float min_logit, double total) {
  // Bin tokens by logit (bin 0 holds the highest), so that only the tokens of
  // the bin where the nucleus ends need sorting: about 4 tokens a bin, at most
  // 4096 bins (a function of the vocabulary only, so the sums are reproducible).
  const MoreLikely more_likely{logits.data()};
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const int32_t bins = std::clamp(vocab / 4, 1, 4096);
  const double range = static_cast<double>(max_logit) - min_logit;
  const double scale = range > 0.0 ? bins / range : 0.0;
  token_bin_.resize(vocab);  // `bins` marks a weightless token
  bin_mass_.assign(bins, 0.0);
  bin_count_.assign(bins, 0);
  for (int32_t i = 0; i < vocab; ++i) {
    if (weights_[i] <= 0.0) {
      token_bin_[i] = static_cast<uint16_t>(bins);  // masked or underflowed: never drawn
      continue;
    }
    const int32_t bin =
        std::min<int32_t>(bins - 1, static_cast<int32_t>((static_cast<double>(max_logit) - logits[i]) * scale));
    token_bin_[i] = static_cast<uint16_t>(bin);
    bin_mass_[bin] += weights_[i];
    ++bin_count_[bin];
  }
  const double mass = static_cast<double>(params_.top_p) * total;
  double before = 0.0;
  bool by_token = false;  // from the bin where the sum reaches `mass` on, walk token by token
  int32_t boundary = -1;
  for (int32_t bin = 0; bin < bins; ++bin) {
    if (bin_count_[bin] == 0) continue;
    if (!by_token && before + bin_mass_[bin] < mass) {
      before += bin_mass_[bin];
      continue;
    }
    by_token = true;
    ids_.clear();
    for (int32_t i = 0; i < vocab; ++i) {
      if (token_bin_[i] == bin) ids_.push_back(i);
    }
    std::sort(ids_.begin(), ids_.end(), more_likely);
    for (int32_t id : ids_) {
      if (before >= mass) return boundary;
      before += weights_[id];
      boundary = id;
    }
  }
  return -1;  // rounding kept the sum below `mass` to the end: every token is kept
}

int32_t Sampler::Draw(absl::Span<const float> logits, float max_logit, float min_logit, int64_t step) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const double fraction = SamplingUniform(params_.seed, step);
  // Walks tokens 0..count-1 of a kept set in increasing id: the first at which
  // the running sum of weights exceeds fraction * total is drawn.
  const auto walk = [fraction](int32_t count, auto id_at, auto weight_at) {
    double total = 0.0;
    for (int32_t j = 0; j < count; ++j) total += weight_at(j);
    const double target = fraction * total;
    double cumulative = 0.0;
    int32_t last_positive = 0;
    for (int32_t j = 0; j < count; ++j) {
      const double w = weight_at(j);
      if (w <= 0.0) continue;  // masked, underflowed or filtered out: never drawn
      cumulative += w;
      last_positive = j;
      if (cumulative > target) return id_at(j);
    }
    // Rounding left `target` at or past the sum: the draw fell on the last
    // token with weight (there is one: the argmax weighs 1 and is always kept).
    return id_at(last_positive);
  };

  if (params_.top_k > 0 && params_.top_k < vocab) {
    KeepTopK(logits, max_logit);
    return walk(
        static_cast<int32_t>(ids_.size()), [this](int32_t j) { return ids_[j]; },
        [this](int32_t j) { return weights_[j]; });
  }
  const double inv_temperature = 1.0 / static_cast<double>(params_.temperature);
  weights_.resize(vocab);
  double total = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    total += weights_[i] = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_temperature);
  }
  const int32_t boundary = params_.top_p < 1.0f ? NucleusBoundary(logits, max_logit, min_logit, total) : -1;
  const auto identity = [](int32_t i) { return i; };
  if (boundary < 0) return walk(vocab, identity, [this](int32_t i) { return weights_[i]; });
  const MoreLikely more_likely{logits.data()};
  return walk(vocab, identity,
              [&](int32_t i) { return i == boundary || more_likely(i, boundary) ? weights_[i] : 0.0; });
}

}  // namespace hybridserve::engine
