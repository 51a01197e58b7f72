#include "engine/model_config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/config_fields.h"
#include "engine/model_config_families.h"

namespace hybridserve::engine {
namespace config_internal {

absl::StatusOr<LayerKind> KindFromBlockType(const Json& v, size_t index) {
  if (!v.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers_block_type[", index, "] must be a string, got ", Excerpt(v)));
  }
  const std::string name = v.get<std::string>();
  if (name == "mamba" || name == "linear_attention") return LayerKind::kMamba2;
  if (name == "attention" || name == "full_attention") return LayerKind::kAttention;
  if (name == "mlp") return LayerKind::kMlp;
  if (name == "moe") return LayerKind::kMoe;
  return absl::InvalidArgumentError(absl::StrCat("layers_block_type[", index, "] has unknown block type \"", name,
                                                 "\" (expected linear_attention, full_attention, mlp or moe)"));
}

absl::Status CheckSiluActivation(const ConfigFields& f, absl::string_view key) {
  ASSIGN_OR_RETURN(std::string act, f.String({key}, "silu"));
  if (act != "silu" && act != "swish") {
    return absl::UnimplementedError(absl::StrCat(key, " \"", act, "\" is not supported (only silu)"));
  }
  return absl::OkStatus();
}

absl::Status CheckDim(absl::string_view name, int64_t value) {
  if (value < 1 || value > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(name, " (", value, ") must be in [1, ", kMaxDim, "]"));
  }
  return absl::OkStatus();
}

}  // namespace config_internal

namespace {

using config_internal::ConfigFields;
using config_internal::Excerpt;
using config_internal::Json;
using config_internal::TagNonFiniteTokens;

using config_internal::CheckDim;
using config_internal::CheckSiluActivation;
using config_internal::kDefaultConvKernel;
using config_internal::kDefaultMamba2Chunk;
using config_internal::kDefaultMamba2Expand;
using config_internal::KindFromBlockType;
using config_internal::kMaxDim;
using config_internal::kMaxLayers;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr size_t kMaxConfigBytes = 16 << 20;

// transformers' defaults for fields this parser treats as optional.
constexpr int64_t kDefaultNemotronChunk = 128;
constexpr double kDefaultNormEps = 1e-5;
constexpr double kDefaultTimeStepMin = 0.001;
constexpr double kDefaultTimeStepMax = 0.1;

absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

absl::StatusOr<LayerKind> KindFromSymbol(char c, size_t index) {
  switch (c) {
    case 'M':
      return LayerKind::kMamba2;
    case '*':
      return LayerKind::kAttention;
    case '-':
      return LayerKind::kMlp;
    case 'E':
      return LayerKind::kMoe;
    default:
      return absl::InvalidArgumentError(absl::StrCat("hybrid_override_pattern: layer ", index, " has unknown symbol '",
                                                     std::string(1, c), "' (expected M, * or -)"));
  }
}

std::string PatternOf(const std::vector<LayerKind>& layers) {
  std::string pattern;
  for (LayerKind kind : layers) pattern.push_back(LayerKindSymbol(kind));
  return pattern;
}

absl::StatusOr<std::vector<LayerKind>> NemotronLayers(const ConfigFields& f) {
  std::optional<std::vector<LayerKind>> from_pattern;
  std::optional<std::vector<LayerKind>> from_list;
  if (f.Has("hybrid_override_pattern")) {
    const Json& v = f.Get("hybrid_override_pattern");
    if (!v.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("hybrid_override_pattern must be a string, got ", Excerpt(v)));
    }
    const std::string pattern = v.get<std::string>();
    from_pattern.emplace();
    for (size_t i = 0; i < pattern.size(); ++i) {
      ASSIGN_OR_RETURN(LayerKind kind, KindFromSymbol(pattern[i], i));
      from_pattern->push_back(kind);
    }
  }
  if (f.Has("layers_block_type")) {
    const Json& v = f.Get("layers_block_type");
    if (!v.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("layers_block_type must be a list, got ", Excerpt(v)));
    }
    from_list.emplace();
    for (size_t i = 0; i < v.size(); ++i) {
      ASSIGN_OR_RETURN(LayerKind kind, KindFromBlockType(v[i], i));
      from_list->push_back(kind);
    }
  }
  if (from_pattern.has_value() && from_list.has_value() && *from_pattern != *from_list) {
    return absl::InvalidArgumentError(absl::StrCat("hybrid_override_pattern (\"", PatternOf(*from_pattern),
                                                   "\") and layers_block_type (\"", PatternOf(*from_list),
                                                   "\") disagree"));
  }
  std::vector<LayerKind> layers;
  if (from_list.has_value()) {
    layers = std::move(*from_list);
  } else if (from_pattern.has_value()) {
    layers = std::move(*from_pattern);
  } else {
    return absl::InvalidArgumentError("hybrid_override_pattern or layers_block_type is required but missing");
  }
  if (layers.empty()) return absl::InvalidArgumentError("the layer pattern is empty");
  if (f.Has("num_hidden_layers")) {
    ASSIGN_OR_RETURN(int64_t n, ConfigFields::ToInt("num_hidden_layers", f.Get("num_hidden_layers")));
    if (n != static_cast<int64_t>(layers.size())) {
      return absl::InvalidArgumentError(absl::StrCat("num_hidden_layers (", n, ") does not match the ", layers.size(),
                                                     " layers of the layer pattern"));
    }
  }
  return layers;
}

// Nemotron-H's 'E' blocks (transformers 5.23 NemotronHMoE): relu2 experts, a
// relu2 shared expert, sigmoid group-limited top-k routing.
absl::Status ParseNemotronMoe(const ConfigFields& f, MoeParams& moe) {
  moe.router = MoeRouter::kSigmoidGroupTopK;
  moe.expert = ExpertKind::kRelu2;
  ASSIGN_OR_RETURN(moe.num_experts, f.Int({"n_routed_experts", "num_local_experts"}, 8));
  ASSIGN_OR_RETURN(moe.top_k, f.Int({"num_experts_per_tok"}, 2));
  ASSIGN_OR_RETURN(moe.intermediate_size, f.Int({"moe_intermediate_size"}, std::nullopt));
  ASSIGN_OR_RETURN(moe.shared_intermediate_size, f.Int({"moe_shared_expert_intermediate_size"}, std::nullopt));
  ASSIGN_OR_RETURN(moe.n_group, f.Int({"n_group"}, 1));
  ASSIGN_OR_RETURN(moe.topk_group, f.Int({"topk_group"}, 1));
  ASSIGN_OR_RETURN(moe.norm_topk_prob, f.Bool({"norm_topk_prob"}, true));
  ASSIGN_OR_RETURN(double scaling, f.Float({"routed_scaling_factor"}, 1.0));
  moe.routed_scaling_factor = static_cast<float>(scaling);
  if (f.Has("moe_latent_size")) {
    return absl::UnimplementedError(
        absl::StrCat("moe_latent_size (", Excerpt(f.Get("moe_latent_size")), ") is not supported"));
  }
  return absl::OkStatus();
}

absl::Status ParseNemotronH(const ConfigFields& f, ModelConfig& c) {
  c.family = ModelFamily::kNemotronH;
  ASSIGN_OR_RETURN(c.layers, NemotronLayers(f));
  if (c.CountLayers(LayerKind::kMamba2) > 0) {
    Mamba2Params& m = c.mamba;
    ASSIGN_OR_RETURN(m.num_heads, f.Int({"mamba_num_heads"}, std::nullopt));
    ASSIGN_OR_RETURN(m.head_dim, f.Int({"mamba_head_dim"}, std::nullopt));
    ASSIGN_OR_RETURN(m.state_size, f.Int({"ssm_state_size"}, std::nullopt));
    ASSIGN_OR_RETURN(m.n_groups, f.Int({"n_groups", "mamba_n_groups"}, std::nullopt));
    ASSIGN_OR_RETURN(m.conv_kernel, f.Int({"conv_kernel", "mamba_d_conv"}, kDefaultConvKernel));
    ASSIGN_OR_RETURN(m.chunk_size, f.Int({"chunk_size", "mamba_chunk_size"}, kDefaultNemotronChunk));
    ASSIGN_OR_RETURN(m.use_conv_bias, f.Bool({"use_conv_bias", "mamba_conv_bias"}, true));
    ASSIGN_OR_RETURN(m.use_bias, f.Bool({"use_bias"}, false));
    // d_inner is mamba_num_heads * mamba_head_dim; `expand` is informational
    // (e.g. Nemotron-Nano-9B-v2 states expand 2 with 128 * 80 != 2 * 4480).
    ASSIGN_OR_RETURN(int64_t expand, f.Int({"expand", "mamba_expand"}, kDefaultMamba2Expand));
    (void)expand;
    ASSIGN_OR_RETURN(double dt_min, f.Float({"time_step_min", "mamba_dt_min"}, kDefaultTimeStepMin));
    ASSIGN_OR_RETURN(double dt_max, f.Float({"time_step_max", "mamba_dt_max"}, kDefaultTimeStepMax));
    m.time_step_min = static_cast<float>(dt_min);
    m.time_step_max = static_cast<float>(dt_max);
    ASSIGN_OR_RETURN(m.time_step_limit, f.Range({"time_step_limit", "mamba_dt_limit"}, DtClamp{}));
    RETURN_IF_ERROR(CheckSiluActivation(f, "mamba_hidden_act"));
    m.norm_group_size = m.n_groups > 0 ? m.d_inner() / m.n_groups : 0;
    m.prefill_dt_clamp = DtClamp{m.time_step_min, kInf};
    m.decode_dt_clamp = DtClamp{};
  }
  if (c.CountLayers(LayerKind::kAttention) > 0) {
    AttentionParams& a = c.attention;
    ASSIGN_OR_RETURN(a.num_heads, f.Int({"num_attention_heads"}, std::nullopt));
    ASSIGN_OR_RETURN(a.num_kv_heads, f.Int({"num_key_value_heads"}, a.num_heads));
    ASSIGN_OR_RETURN(a.head_dim, f.Int({"head_dim", "attention_head_dim"}, std::nullopt));
    a.use_rope = false;
    ASSIGN_OR_RETURN(bool attention_bias, f.Bool({"attention_bias"}, false));
    if (attention_bias) {
      return absl::UnimplementedError("attention_bias true is not supported (Nemotron-H attention has no biases)");
    }
    if (f.Has("sliding_window")) {
      return absl::UnimplementedError(
          absl::StrCat("sliding_window (", Excerpt(f.Get("sliding_window")), ") is not supported"));
    }
  }
  if (c.CountLayers(LayerKind::kMlp) > 0) {
    ASSIGN_OR_RETURN(c.mlp.intermediate_size, f.Int({"intermediate_size"}, std::nullopt));
    ASSIGN_OR_RETURN(std::string act, f.String({"mlp_hidden_act"}, "relu2"));
    if (act != "relu2") {
      return absl::UnimplementedError(absl::StrCat("mlp_hidden_act \"", act, "\" is not supported (only relu2)"));
    }
    c.mlp.activation = MlpActivation::kRelu2;
    ASSIGN_OR_RETURN(c.mlp.use_bias, f.Bool({"mlp_bias"}, false));
  }
  if (c.CountLayers(LayerKind::kMoe) > 0) {
    ASSIGN_OR_RETURN(std::string act, f.String({"mlp_hidden_act"}, "relu2"));
    if (act != "relu2") {
      return absl::UnimplementedError(absl::StrCat("mlp_hidden_act \"", act, "\" is not supported (only relu2)"));
    }
    ASSIGN_OR_RETURN(bool bias, f.Bool({"mlp_bias"}, false));
    if (bias) return absl::UnimplementedError("mlp_bias true is not supported with MoE layers");
    RETURN_IF_ERROR(ParseNemotronMoe(f, c.moe));
  }
  ASSIGN_OR_RETURN(c.residual_in_fp32, f.Bool({"residual_in_fp32"}, false));
  return absl::OkStatus();
}

absl::Status ParseMamba2(const ConfigFields& f, ModelConfig& c) {
  c.family = ModelFamily::kMamba2;
  ASSIGN_OR_RETURN(int64_t n_layers, f.Int({"num_hidden_layers"}, std::nullopt));
  if (n_layers < 1 || n_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_hidden_layers (", n_layers, ") must be in [1, ", kMaxLayers, "]"));
  }
  c.layers.assign(static_cast<size_t>(n_layers), LayerKind::kMamba2);
  Mamba2Params& m = c.mamba;
  ASSIGN_OR_RETURN(m.num_heads, f.Int({"num_heads"}, std::nullopt));
  ASSIGN_OR_RETURN(m.head_dim, f.Int({"head_dim"}, std::nullopt));
  ASSIGN_OR_RETURN(m.state_size, f.Int({"state_size"}, std::nullopt));
  ASSIGN_OR_RETURN(m.n_groups, f.Int({"n_groups"}, std::nullopt));
  ASSIGN_OR_RETURN(m.conv_kernel, f.Int({"conv_kernel"}, kDefaultConvKernel));
  ASSIGN_OR_RETURN(m.chunk_size, f.Int({"chunk_size"}, kDefaultMamba2Chunk));
  ASSIGN_OR_RETURN(m.use_conv_bias, f.Bool({"use_conv_bias"}, true));
  ASSIGN_OR_RETURN(m.use_bias, f.Bool({"use_bias"}, false));
  ASSIGN_OR_RETURN(int64_t expand, f.Int({"expand"}, kDefaultMamba2Expand));
  if (expand < 1 || expand > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("expand (", expand, ") must be positive"));
  }
  if (m.num_heads > 0 && m.head_dim > 0 && m.num_heads <= kMaxDim && m.head_dim <= kMaxDim &&
      c.hidden_size <= kMaxDim && m.num_heads * m.head_dim != expand * c.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads (", m.num_heads, ") * head_dim (", m.head_dim,
                                                   ") = ", m.num_heads * m.head_dim, " does not match expand (", expand,
                                                   ") * hidden_size (", c.hidden_size, ") = ", expand * c.hidden_size));
  }
  ASSIGN_OR_RETURN(double dt_min, f.Float({"time_step_min"}, kDefaultTimeStepMin));
  ASSIGN_OR_RETURN(double dt_max, f.Float({"time_step_max"}, kDefaultTimeStepMax));
  m.time_step_min = static_cast<float>(dt_min);
  m.time_step_max = static_cast<float>(dt_max);
  ASSIGN_OR_RETURN(m.time_step_limit, f.Range({"time_step_limit"}, DtClamp{}));
  RETURN_IF_ERROR(CheckSiluActivation(f, "hidden_act"));
  ASSIGN_OR_RETURN(bool norm_before_gate, f.Bool({"norm_before_gate"}, false));
  if (norm_before_gate) {
    return absl::UnimplementedError("norm_before_gate true is not supported (the gated norm is RMSNorm(y * silu(z)))");
  }
  // transformers 5.23 Mamba2Mixer: MambaRMSNormGated(group_size=intermediate_size
  // // n_groups); the chunked path clamps dt to time_step_limit, the one-step
  // decode path (mamba2_selective_state_update) does not clamp.
  m.norm_group_size = m.n_groups > 0 ? m.d_inner() / m.n_groups : 0;
  m.prefill_dt_clamp = m.time_step_limit;
  m.decode_dt_clamp = DtClamp{};
  ASSIGN_OR_RETURN(c.residual_in_fp32, f.Bool({"residual_in_fp32"}, true));
  return absl::OkStatus();
}

absl::Status ParseCommon(const ConfigFields& f, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.vocab_size, f.Int({"vocab_size"}, std::nullopt));
  ASSIGN_OR_RETURN(c.hidden_size, f.Int({"hidden_size"}, std::nullopt));
  ASSIGN_OR_RETURN(double eps, f.Float({"layer_norm_epsilon", "rms_norm_eps"}, kDefaultNormEps));
  c.norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool({"tie_word_embeddings"}, false));
  ASSIGN_OR_RETURN(c.eos_token_ids, f.TokenIds("eos_token_id"));
  ASSIGN_OR_RETURN(c.bos_token_ids, f.TokenIds("bos_token_id"));
  ASSIGN_OR_RETURN(c.pad_token_ids, f.TokenIds("pad_token_id"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int({"max_position_embeddings"}, 0));
  ASSIGN_OR_RETURN(c.dtype, f.String({"dtype", "torch_dtype"}, ""));
  ASSIGN_OR_RETURN(c.name_or_path, f.String({"_name_or_path"}, ""));
  return absl::OkStatus();
}

absl::Status CheckClamp(absl::string_view name, const DtClamp& clamp) {
  if (std::isnan(clamp.min) || std::isnan(clamp.max) || clamp.min < 0.0f || clamp.min > clamp.max ||
      clamp.min == kInf) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " [", clamp.min, ", ", clamp.max, "] must satisfy 0 <= low <= high, low finite"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMamba(const ModelConfig& c) {
  const Mamba2Params& m = c.mamba;
  const bool nemotron = c.family == ModelFamily::kNemotronH;
  const bool prefixed = c.family == ModelFamily::kBamba || c.family == ModelFamily::kGraniteMoeHybrid ||
                        c.family == ModelFamily::kFalconH1;
  const char* heads_name = nemotron ? "mamba_num_heads" : prefixed ? "mamba_n_heads" : "num_heads";
  const char* head_dim_name = nemotron ? "mamba_head_dim" : prefixed ? "mamba_d_head" : "head_dim";
  const char* state_name = nemotron ? "ssm_state_size" : prefixed ? "mamba_d_state" : "state_size";
  RETURN_IF_ERROR(CheckDim(heads_name, m.num_heads));
  RETURN_IF_ERROR(CheckDim(head_dim_name, m.head_dim));
  RETURN_IF_ERROR(CheckDim(state_name, m.state_size));
  RETURN_IF_ERROR(CheckDim("n_groups", m.n_groups));
  if (m.num_heads % m.n_groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(heads_name, " (", m.num_heads, ") is not divisible by n_groups (", m.n_groups, ")"));
  }
  RETURN_IF_ERROR(CheckDim(absl::StrCat(heads_name, " * ", head_dim_name, " (d_inner)"), m.d_inner()));
  RETURN_IF_ERROR(CheckDim("in_proj rows (2 * d_inner + 2 * n_groups * state_size + num_heads)", m.in_proj_rows()));
  if (m.conv_kernel < 1 || m.conv_kernel > 256) {
    return absl::InvalidArgumentError(absl::StrCat("conv_kernel (", m.conv_kernel, ") must be in [1, 256]"));
  }
  if (m.chunk_size < 1 || m.chunk_size > kMaxDim || (m.chunk_size & (m.chunk_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_size (", m.chunk_size, ") must be a power of two"));
  }
  if (m.norm_group_size < 1 || m.d_inner() % m.norm_group_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gated norm group size (", m.norm_group_size, ") must divide d_inner (", m.d_inner(), ")"));
  }
  if (!(m.time_step_min > 0.0f) || !(m.time_step_min <= m.time_step_max) || !std::isfinite(m.time_step_max)) {
    return absl::InvalidArgumentError(absl::StrCat("time_step_min (", m.time_step_min, ") and time_step_max (",
                                                   m.time_step_max, ") must satisfy 0 < min <= max < inf"));
  }
  RETURN_IF_ERROR(CheckClamp("time_step_limit", m.time_step_limit));
  RETURN_IF_ERROR(CheckClamp("prefill dt clamp", m.prefill_dt_clamp));
  RETURN_IF_ERROR(CheckClamp("decode dt clamp", m.decode_dt_clamp));
  return absl::OkStatus();
}

absl::Status ValidateAttention(const AttentionParams& a) {
  RETURN_IF_ERROR(CheckDim("num_attention_heads", a.num_heads));
  RETURN_IF_ERROR(CheckDim("num_key_value_heads", a.num_kv_heads));
  RETURN_IF_ERROR(CheckDim("head_dim", a.head_dim));
  if (a.num_heads % a.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads (", a.num_heads,
                                                   ") is not divisible by num_key_value_heads (", a.num_kv_heads, ")"));
  }
  RETURN_IF_ERROR(CheckDim("num_attention_heads * head_dim", a.q_dim()));
  if (a.use_rope && (a.rotary_dim < 2 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary dimension (", a.rotary_dim, ") must be even and in [2, head_dim ", a.head_dim, "]"));
  }
  if (a.use_rope && (!(a.rope_theta > 0.0) || !std::isfinite(a.rope_theta))) {
    return absl::InvalidArgumentError(absl::StrCat("rope_theta (", a.rope_theta, ") must be positive"));
  }
  if (!(a.scale >= 0.0f) || !std::isfinite(a.scale)) {
    return absl::InvalidArgumentError(absl::StrCat("attention scale (", a.scale, ") must be finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMoe(const MoeParams& moe) {
  RETURN_IF_ERROR(CheckDim("num_local_experts", moe.num_experts));
  if (moe.top_k < 1 || moe.top_k > moe.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_experts_per_tok (", moe.top_k, ") must be in [1, num_local_experts ", moe.num_experts, "]"));
  }
  RETURN_IF_ERROR(CheckDim("intermediate_size (per expert)", moe.intermediate_size));
  if (moe.shared_intermediate_size != 0) {
    RETURN_IF_ERROR(CheckDim("shared_intermediate_size", moe.shared_intermediate_size));
  }
  if (moe.router == MoeRouter::kSigmoidGroupTopK) {
    if (moe.n_group < 1 || moe.num_experts % moe.n_group != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("n_group (", moe.n_group, ") must divide n_routed_experts (", moe.num_experts, ")"));
    }
    if (moe.n_group > 1 && moe.num_experts / moe.n_group < 2) {
      return absl::InvalidArgumentError(absl::StrCat("n_group (", moe.n_group,
                                                     ") leaves fewer than two experts per group (a group is scored "
                                                     "by its two best experts)"));
    }
    if (moe.topk_group < 1 || moe.topk_group > moe.n_group) {
      return absl::InvalidArgumentError(
          absl::StrCat("topk_group (", moe.topk_group, ") must be in [1, n_group ", moe.n_group, "]"));
    }
    if (moe.top_k > moe.topk_group * (moe.num_experts / moe.n_group)) {
      return absl::InvalidArgumentError(absl::StrCat("num_experts_per_tok (", moe.top_k,
                                                     ") exceeds the experts of topk_group groups (",
                                                     moe.topk_group * (moe.num_experts / moe.n_group), ")"));
    }
    if (!std::isfinite(moe.routed_scaling_factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("routed_scaling_factor (", moe.routed_scaling_factor, ") must be finite"));
    }
  }
  return absl::OkStatus();
}

// Bamba and Granite: blocks alternate a mixer and a feed-forward block.
absl::Status ValidateDecoderLayers(const ModelConfig& c) {
  if (c.layers.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a ", ModelFamilyName(c.family),
                                                   " model has two blocks per decoder layer, got pattern \"",
                                                   c.LayerPattern(), "\""));
  }
  for (size_t i = 0; i < c.layers.size(); i += 2) {
    const bool mixer = c.family == ModelFamily::kFalconH1
                           ? c.layers[i] == LayerKind::kParallel
                           : c.layers[i] == LayerKind::kMamba2 || c.layers[i] == LayerKind::kAttention;
    const bool ffn = c.layers[i + 1] == LayerKind::kGatedMlp || c.layers[i + 1] == LayerKind::kMoe;
    if (!mixer || !ffn) {
      return absl::InvalidArgumentError(absl::StrCat("a ", ModelFamilyName(c.family),
                                                     " decoder layer is a mixer then a feed-forward block, got \"",
                                                     c.LayerPattern().substr(i, 2), "\" at block ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTokenIds(absl::string_view name, const std::vector<int64_t>& ids, int64_t vocab) {
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(name, " (", id, ") is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kNemotronH:
      return "nemotron_h";
    case ModelFamily::kMamba2:
      return "mamba2";
    case ModelFamily::kBamba:
      return "bamba";
    case ModelFamily::kGraniteMoeHybrid:
      return "granitemoehybrid";
    case ModelFamily::kFalconH1:
      return "falcon_h1";
  }
  return "unknown";
}

absl::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kMamba2:
      return "mamba2";
    case LayerKind::kAttention:
      return "attention";
    case LayerKind::kMlp:
      return "mlp";
    case LayerKind::kGatedMlp:
      return "gated_mlp";
    case LayerKind::kMoe:
      return "moe";
    case LayerKind::kParallel:
      return "parallel";
  }
  return "unknown";
}

char LayerKindSymbol(LayerKind kind) {
  switch (kind) {
    case LayerKind::kMamba2:
      return 'M';
    case LayerKind::kAttention:
      return '*';
    case LayerKind::kMlp:
      return '-';
    case LayerKind::kGatedMlp:
      return 'G';
    case LayerKind::kMoe:
      return 'E';
    case LayerKind::kParallel:
      return 'P';
  }
  return '?';
}

int64_t ModelConfig::CountLayers(LayerKind kind) const {
  int64_t n = 0;
  for (LayerKind k : layers) n += k == kind ? 1 : 0;
  return n;
}

std::string ModelConfig::LayerPattern() const { return PatternOf(layers); }

absl::Status ModelConfig::Validate() const {
  RETURN_IF_ERROR(CheckDim("vocab_size", vocab_size));
  RETURN_IF_ERROR(CheckDim("hidden_size", hidden_size));
  if (layers.empty() || num_layers() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model has ", layers.size(), " layers; expected 1 to ", kMaxLayers));
  }
  if (family == ModelFamily::kMamba2 && CountLayers(LayerKind::kMamba2) != num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a mamba2 model has only Mamba2 layers, got pattern \"", LayerPattern(), "\""));
  }
  if (SsmLayers() > 0) RETURN_IF_ERROR(ValidateMamba(*this));
  if (KvLayers() > 0) RETURN_IF_ERROR(ValidateAttention(attention));
  if (CountLayers(LayerKind::kMlp) > 0) RETURN_IF_ERROR(CheckDim("intermediate_size", mlp.intermediate_size));
  if (CountLayers(LayerKind::kGatedMlp) > 0) {
    RETURN_IF_ERROR(CheckDim("intermediate_size (gated MLP)", gated_mlp.intermediate_size));
  }
  if (CountLayers(LayerKind::kMoe) > 0) RETURN_IF_ERROR(ValidateMoe(moe));
  const bool decoder_layers =
      family == ModelFamily::kBamba || family == ModelFamily::kGraniteMoeHybrid || family == ModelFamily::kFalconH1;
  if (family != ModelFamily::kFalconH1 && CountLayers(LayerKind::kParallel) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("only a falcon_h1 model has parallel blocks, got pattern \"", LayerPattern(), "\""));
  }
  if (decoder_layers) RETURN_IF_ERROR(ValidateDecoderLayers(*this));
  if (!decoder_layers && CountLayers(LayerKind::kGatedMlp) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", ModelFamilyName(family), " model has no gated MLP blocks, got pattern \"", LayerPattern(), "\""));
  }
  for (const auto& [name, value] : {std::pair<const char*, float>{"embedding_multiplier", embedding_multiplier},
                                    {"residual_multiplier", residual_multiplier},
                                    {"logits_scaling", logits_scaling},
                                    {"lm_head_multiplier", logits_multiplier},
                                    {"ssm_in_multiplier", mamba.in_multiplier},
                                    {"ssm_out_multiplier", mamba.out_multiplier},
                                    {"attention_in_multiplier", attention.in_multiplier},
                                    {"key_multiplier", attention.key_multiplier},
                                    {"attention_out_multiplier", attention.out_multiplier},
                                    {"mlp gate multiplier", gated_mlp.gate_multiplier},
                                    {"mlp down multiplier", gated_mlp.down_multiplier},
                                    {"ssm_multipliers[0]", mamba.segment_multipliers[0]},
                                    {"ssm_multipliers[1]", mamba.segment_multipliers[1]},
                                    {"ssm_multipliers[2]", mamba.segment_multipliers[2]},
                                    {"ssm_multipliers[3]", mamba.segment_multipliers[3]},
                                    {"ssm_multipliers[4]", mamba.segment_multipliers[4]}}) {
    if (!std::isfinite(value) || value == 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(name, " (", value, ") must be finite and non-zero"));
    }
  }
  if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps)) {
    return absl::InvalidArgumentError(absl::StrCat("layer_norm_epsilon (", norm_eps, ") must be positive and finite"));
  }
  RETURN_IF_ERROR(ValidateTokenIds("eos_token_id", eos_token_ids, vocab_size));
  RETURN_IF_ERROR(ValidateTokenIds("bos_token_id", bos_token_ids, vocab_size));
  RETURN_IF_ERROR(ValidateTokenIds("pad_token_id", pad_token_ids, vocab_size));
  if (max_position_embeddings < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_position_embeddings (", max_position_embeddings, ") must not be negative"));
  }
  return absl::OkStatus();
}

std::string ModelConfig::CanonicalString() const {
  // %a prints floats exactly; every part is labelled so no two configs collide.
  std::string out = absl::StrFormat("hybridserve.model_config.v1;family=%s;vocab=%d;hidden=%d;pattern=%s;",
                                    ModelFamilyName(family), vocab_size, hidden_size, LayerPattern());
  if (SsmLayers() > 0) {
    const Mamba2Params& m = mamba;
    absl::StrAppendFormat(&out,
                          "mamba2{heads=%d,head_dim=%d,state=%d,groups=%d,conv=%d,chunk=%d,conv_bias=%d,bias=%d,"
                          "norm_group=%d,prefill_dt=[%a,%a],decode_dt=[%a,%a]};",
                          m.num_heads, m.head_dim, m.state_size, m.n_groups, m.conv_kernel, m.chunk_size,
                          static_cast<int>(m.use_conv_bias), static_cast<int>(m.use_bias), m.norm_group_size,
                          m.prefill_dt_clamp.min, m.prefill_dt_clamp.max, m.decode_dt_clamp.min, m.decode_dt_clamp.max);
  }
  if (KvLayers() > 0) {
    absl::StrAppendFormat(&out, "attention{heads=%d,kv_heads=%d,head_dim=%d,rope=%d};", attention.num_heads,
                          attention.num_kv_heads, attention.head_dim, static_cast<int>(attention.use_rope));
  }
  if (CountLayers(LayerKind::kMlp) > 0) {
    absl::StrAppendFormat(&out, "mlp{intermediate=%d,act=%d,bias=%d};", mlp.intermediate_size,
                          static_cast<int>(mlp.activation), static_cast<int>(mlp.use_bias));
  }
  // Appended only where they differ from the first two families' values, so
  // their canonical strings (and model fingerprints) are unchanged.
  if (KvLayers() > 0 && (attention.use_rope || attention.scale != 0.0f)) {
    absl::StrAppendFormat(&out, "attention_ext{rotary_dim=%d,rope_theta=%a,scale=%a};", attention.rotary_dim,
                          attention.rope_theta, attention.scale);
  }
  if (KvLayers() > 0 &&
      (attention.in_multiplier != 1.0f || attention.key_multiplier != 1.0f || attention.out_multiplier != 1.0f)) {
    absl::StrAppendFormat(&out, "attention_mup{in=%a,key=%a,out=%a};", attention.in_multiplier,
                          attention.key_multiplier, attention.out_multiplier);
  }
  if (SsmLayers() > 0 && (!mamba.gated_norm || mamba.norm_before_gate || mamba.HasMultipliers())) {
    const Mamba2Params& m = mamba;
    absl::StrAppendFormat(&out, "mamba2_ext{gated_norm=%d,norm_before_gate=%d,in=%a,segments=[%a,%a,%a,%a,%a],out=%a};",
                          static_cast<int>(m.gated_norm), static_cast<int>(m.norm_before_gate), m.in_multiplier,
                          m.segment_multipliers[0], m.segment_multipliers[1], m.segment_multipliers[2],
                          m.segment_multipliers[3], m.segment_multipliers[4], m.out_multiplier);
  }
  if (CountLayers(LayerKind::kGatedMlp) > 0) {
    absl::StrAppendFormat(&out, "gated_mlp{intermediate=%d,bias=%d,gate_mult=%a,down_mult=%a};",
                          gated_mlp.intermediate_size, static_cast<int>(gated_mlp.use_bias), gated_mlp.gate_multiplier,
                          gated_mlp.down_multiplier);
  }
  if (CountLayers(LayerKind::kMoe) > 0) {
    absl::StrAppendFormat(
        &out,
        "moe{experts=%d,top_k=%d,intermediate=%d,shared=%d,router=%d,expert=%d,groups=%d,topk_groups=%d,"
        "norm_topk=%d,scaling=%a};",
        moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_intermediate_size, static_cast<int>(moe.router),
        static_cast<int>(moe.expert), moe.n_group, moe.topk_group, static_cast<int>(moe.norm_topk_prob),
        moe.routed_scaling_factor);
  }
  if (embedding_multiplier != 1.0f || residual_multiplier != 1.0f || logits_scaling != 1.0f ||
      logits_multiplier != 1.0f) {
    absl::StrAppendFormat(&out, "multipliers{embedding=%a,residual=%a,logits_scaling=%a,logits=%a};",
                          embedding_multiplier, residual_multiplier, logits_scaling, logits_multiplier);
  }
  absl::StrAppendFormat(&out, "norm_eps=%a;tied=%d;", norm_eps, static_cast<int>(tie_word_embeddings));
  return out;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  if (json_text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json is ", json_text.size(), " bytes, over the limit of ", kMaxConfigBytes));
  }
  Json root;
  // nlohmann reports malformed input by exception; this is the boundary that
  // turns it into a Status.
  try {
    root = Json::parse(TagNonFiniteTokens(json_text));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("config.json must hold a JSON object");
  ConfigFields fields(root);
  ModelConfig config;
  absl::Status status;
  try {
    ASSIGN_OR_RETURN(std::string model_type, fields.String({"model_type"}, ""));
    if (model_type.empty()) return absl::InvalidArgumentError("model_type is required but missing");
    RETURN_IF_ERROR(ParseCommon(fields, config));
    if (model_type == "nemotron_h") {
      status = ParseNemotronH(fields, config);
    } else if (model_type == "mamba2") {
      status = ParseMamba2(fields, config);
    } else if (model_type == "bamba") {
      status = config_internal::ParseBamba(fields, config);
    } else if (model_type == "granitemoehybrid") {
      status = config_internal::ParseGraniteMoeHybrid(fields, config);
    } else if (model_type == "falcon_h1") {
      status = config_internal::ParseFalconH1(fields, config);
    } else {
      return absl::UnimplementedError(absl::StrCat(
          "model_type \"", model_type, "\" is not supported (nemotron_h, mamba2, bamba, granitemoehybrid, falcon_h1)"));
    }
  } catch (const Json::exception& e) {
    // Every access above is type-checked first; this only guards the boundary.
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", e.what()));
  }
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(config.Validate());
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str());
  if (!config.ok()) return WithPrefix(config.status(), absl::StrCat(path, ": "));
  return config;
}

}  // namespace hybridserve::engine
