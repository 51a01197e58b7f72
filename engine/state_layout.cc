#include "engine/state_layout.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace hybridserve::engine {
namespace {

// Bumped when the meaning of the fields or the array formats change.
constexpr char kLayoutFingerprintTag[] = "hybridserve/state-layout/v1/f32";

absl::Status CheckArray(absl::string_view what, size_t index, size_t actual, int64_t expected) {
  if (actual == static_cast<uint64_t>(expected)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, "[", index, "] has ", actual, " floats, the layout and position need ", expected));
}

absl::Status CheckArrays(absl::string_view what, const std::vector<absl::Span<const float>>& arrays, int32_t count,
                         int64_t floats) {
  if (arrays.size() != static_cast<size_t>(count)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", arrays.size(), " arrays, the layout has ", count));
  }
  for (size_t i = 0; i < arrays.size(); ++i) RETURN_IF_ERROR(CheckArray(what, i, arrays[i].size(), floats));
  return absl::OkStatus();
}

}  // namespace

StateLayout StateLayout::ForModel(const ModelConfig& config, int64_t page_size) {
  StateLayout l;
  const bool attention = config.KvLayers() > 0;
  // The recurrent arrays: Mamba2's [heads, head_dim, d_state] SSM state, or a
  // Gated DeltaNet's [v_heads, k_head_dim, v_head_dim] delta-rule state; both
  // with a [conv_dim, conv_kernel - 1] conv state (a model has one kind only).
  l.mamba_layers = static_cast<int32_t>(config.RecurrentLayers());
  if (config.SsmLayers() > 0) {
    const Mamba2Params& m = config.mamba;
    l.ssm_heads = static_cast<int32_t>(m.num_heads);
    l.ssm_head_dim = static_cast<int32_t>(m.head_dim);
    l.ssm_state = static_cast<int32_t>(m.state_size);
    l.conv_dim = static_cast<int32_t>(m.conv_dim());
    l.conv_kernel = static_cast<int32_t>(m.conv_kernel);
  } else if (config.RecurrentLayers() > 0) {
    const GatedDeltaNetParams& g = config.gdn;
    l.ssm_heads = static_cast<int32_t>(g.num_v_heads);
    l.ssm_head_dim = static_cast<int32_t>(g.k_head_dim);
    l.ssm_state = static_cast<int32_t>(g.v_head_dim);
    l.conv_dim = static_cast<int32_t>(g.conv_dim());
    l.conv_kernel = static_cast<int32_t>(g.conv_kernel);
  }
  l.attention_layers = static_cast<int32_t>(config.KvLayers());
  l.kv_heads = attention ? static_cast<int32_t>(config.attention.num_kv_heads) : 0;
  l.kv_head_dim = attention ? static_cast<int32_t>(config.attention.head_dim) : 0;
  l.page_size = static_cast<int32_t>(page_size);
  l.vocab = static_cast<int32_t>(config.vocab_size);
  return l;
}

int64_t StateLayout::ssm_state_floats() const { return int64_t{ssm_heads} * ssm_head_dim * ssm_state; }

int64_t StateLayout::conv_state_floats() const { return conv_kernel < 1 ? 0 : int64_t{conv_dim} * (conv_kernel - 1); }

int64_t StateLayout::kv_token_floats() const { return int64_t{kv_heads} * kv_head_dim; }

int64_t StateLayout::page_kv_floats() const { return int64_t{page_size} * kv_token_floats(); }

int64_t StateLayout::tail_tokens(int64_t position) const { return page_size < 1 ? 0 : position % page_size; }

int64_t StateLayout::tail_kv_floats(int64_t position) const { return tail_tokens(position) * kv_token_floats(); }

int64_t StateLayout::page_bytes() const {
  return int64_t{attention_layers} * 2 * page_kv_floats() * static_cast<int64_t>(sizeof(float));
}

int64_t StateLayout::full_pages(int64_t positions) const { return page_size < 1 ? 0 : positions / page_size; }

int64_t StateLayout::pages_for(int64_t positions) const {
  return attention_layers == 0 || page_size < 1 ? 0 : (positions + page_size - 1) / page_size;
}

int64_t StateLayout::recurrent_state_bytes() const {
  return int64_t{mamba_layers} * (ssm_state_floats() + conv_state_floats()) * static_cast<int64_t>(sizeof(float));
}

absl::Status StateLayout::Validate() const {
  for (int i = 0; i < kStateLayoutFieldCount; ++i) {
    if (this->*kStateLayoutFields[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout ", kStateLayoutFieldNames[i], " must be >= 0, got ", this->*kStateLayoutFields[i]));
    }
  }
  auto require = [&](bool ok, absl::string_view rule) {
    return ok ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat("layout needs ", rule, ": ", ToString()));
  };
  RETURN_IF_ERROR(require(mamba_layers <= kStateMaxLayers, "mamba_layers <= 16384"));
  RETURN_IF_ERROR(require(attention_layers <= kStateMaxLayers, "attention_layers <= 16384"));
  RETURN_IF_ERROR(require(page_size >= 1, "page_size >= 1"));
  if (mamba_layers > 0) {
    RETURN_IF_ERROR(require(ssm_heads >= 1 && ssm_head_dim >= 1 && ssm_state >= 1,
                            "ssm_heads, ssm_head_dim and ssm_state >= 1 with Mamba layers"));
    RETURN_IF_ERROR(require(conv_dim >= 1 && conv_kernel >= 1, "conv_dim and conv_kernel >= 1 with Mamba layers"));
  }
  if (attention_layers > 0) {
    RETURN_IF_ERROR(require(kv_heads >= 1 && kv_head_dim >= 1, "kv_heads and kv_head_dim >= 1 with attention layers"));
  }
  // Products of three int32 fit in 93 bits: compare in 128-bit arithmetic.
  const auto fits = [](__int128 floats) { return floats <= kStateMaxArrayFloats; };
  RETURN_IF_ERROR(require(fits(__int128{ssm_heads} * ssm_head_dim * ssm_state), "an SSM state of at most 2^40 floats"));
  RETURN_IF_ERROR(require(fits(__int128{conv_dim} * conv_kernel), "a conv state of at most 2^40 floats"));
  RETURN_IF_ERROR(
      require(fits(__int128{page_size} * kv_heads * kv_head_dim), "a page of K or V of at most 2^40 floats"));
  return absl::OkStatus();
}

StateArrays StateArrays::Of(const SequenceState& state) {
  StateArrays a;
  a.position = state.position;
  auto views = [](const std::vector<std::vector<float>>& v) {
    return std::vector<absl::Span<const float>>(v.begin(), v.end());
  };
  a.ssm_states = views(state.ssm_states);
  a.conv_states = views(state.conv_states);
  a.tail_k = views(state.tail_k);
  a.tail_v = views(state.tail_v);
  a.last_logits = state.last_logits;
  return a;
}

absl::Status StateLayout::CheckState(const StateArrays& s) const {
  if (s.position < 0) return absl::InvalidArgumentError(absl::StrCat("position must be >= 0, got ", s.position));
  RETURN_IF_ERROR(CheckArrays("ssm_states", s.ssm_states, mamba_layers, ssm_state_floats()));
  RETURN_IF_ERROR(CheckArrays("conv_states", s.conv_states, mamba_layers, conv_state_floats()));
  RETURN_IF_ERROR(CheckArrays("tail_k", s.tail_k, attention_layers, tail_kv_floats(s.position)));
  RETURN_IF_ERROR(CheckArrays("tail_v", s.tail_v, attention_layers, tail_kv_floats(s.position)));
  if (!s.last_logits.empty()) RETURN_IF_ERROR(CheckArray("last_logits", 0, s.last_logits.size(), vocab));
  return absl::OkStatus();
}

common::Hash128 StateLayout::Fingerprint() const {
  std::string bytes(kLayoutFingerprintTag);
  for (const auto field : kStateLayoutFields) {
    const int32_t v = this->*field;
    bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));  // little-endian hosts only (as the codec)
  }
  return common::HashBytes(bytes);
}

std::string StateLayout::ToString() const {
  std::string out = "{";
  for (int i = 0; i < kStateLayoutFieldCount; ++i) {
    absl::StrAppend(&out, i ? " " : "", kStateLayoutFieldNames[i], "=", this->*kStateLayoutFields[i]);
  }
  return out + "}";
}

std::string StateLayout::Mismatch(const StateLayout& expected, const StateLayout& actual) {
  std::string out;
  for (int i = 0; i < kStateLayoutFieldCount; ++i) {
    if (expected.*kStateLayoutFields[i] != actual.*kStateLayoutFields[i]) {
      absl::StrAppend(&out, out.empty() ? "" : ", ", kStateLayoutFieldNames[i], " ", actual.*kStateLayoutFields[i],
                      " (expected ", expected.*kStateLayoutFields[i], ")");
    }
  }
  return out;
}

bool operator==(const StateLayout& a, const StateLayout& b) {
  for (const auto field : kStateLayoutFields) {
    if (a.*field != b.*field) return false;
  }
  return true;
}

}  // namespace hybridserve::engine
