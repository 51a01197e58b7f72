#include "engine/model_config_families.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/config_fields.h"
#include "engine/model_config.h"

namespace hybridserve::engine::config_internal {

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
    return absl::UnimplementedError(absl::StrCat(key, " \"", act, "\" is not supported (only silu is implemented)"));
  }
  return absl::OkStatus();
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// transformers' defaults for fields the Nemotron-H and Mamba2 parsers treat as optional.
constexpr int64_t kDefaultNemotronChunk = 128;
constexpr double kDefaultTimeStepMin = 0.001;
constexpr double kDefaultTimeStepMax = 0.1;

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
// relu2 shared expert, sigmoid group-limited top-k routing, and with
// moe_latent_size the latent projections around the routed experts.
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
  // An integer or null (transformers' NemotronHConfig types it `int | None`; 0
  // builds a zero-width projection its forward cannot run); larger than
  // hidden_size is allowed, as transformers allows it.
  if (f.Has("moe_latent_size")) {
    ASSIGN_OR_RETURN(moe.latent_size, f.Int({"moe_latent_size"}, std::nullopt));
    RETURN_IF_ERROR(CheckDim("moe_latent_size", moe.latent_size));
  }
  return absl::OkStatus();
}

// The Mamba2 mixer of Bamba and Granite (both name their fields mamba_*; d_inner
// is mamba_expand * hidden_size; mamba_d_head may be "auto").
// transformers 5.23 BambaMixer / GraniteMoeHybridMambaLayer: the chunked path
// clamps dt to time_step_limit, the one-step decode does not; the gated norm
// groups are d_inner / n_groups; norm after the gate.
// Falcon-H1 states d_inner as mamba_d_ssm when it is not null.
absl::Status ParseMambaPrefixed(const ConfigFields& f, int64_t hidden_size, Mamba2Params& m) {
  ASSIGN_OR_RETURN(m.num_heads, f.Int({"mamba_n_heads"}, 128));
  ASSIGN_OR_RETURN(m.state_size, f.Int({"mamba_d_state"}, 256));
  ASSIGN_OR_RETURN(m.n_groups, f.Int({"mamba_n_groups"}, 1));
  ASSIGN_OR_RETURN(m.conv_kernel, f.Int({"mamba_d_conv"}, kDefaultConvKernel));
  ASSIGN_OR_RETURN(m.chunk_size, f.Int({"mamba_chunk_size"}, kDefaultMamba2Chunk));
  ASSIGN_OR_RETURN(m.use_conv_bias, f.Bool({"mamba_conv_bias"}, true));
  ASSIGN_OR_RETURN(m.use_in_proj_bias, f.Bool({"mamba_proj_bias"}, false));
  m.use_out_proj_bias = m.use_in_proj_bias;
  ASSIGN_OR_RETURN(int64_t expand, f.Int({"mamba_expand"}, kDefaultMamba2Expand));
  if (expand < 1 || expand > kMaxDim || hidden_size < 1 || hidden_size > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("mamba_expand (", expand, ") must be positive"));
  }
  ASSIGN_OR_RETURN(const int64_t d_inner, f.Int({"mamba_d_ssm"}, expand * hidden_size));
  if (d_inner < 1 || d_inner > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("mamba_d_ssm (", d_inner, ") must be in [1, ", kMaxDim, "]"));
  }
  if (f.Has("mamba_d_head") && f.Get("mamba_d_head").is_string() &&
      f.Get("mamba_d_head").get<std::string>() == "auto") {
    m.head_dim = m.num_heads > 0 ? d_inner / m.num_heads : 0;
  } else {
    ASSIGN_OR_RETURN(m.head_dim, f.Int({"mamba_d_head"}, m.num_heads > 0 ? d_inner / m.num_heads : 0));
  }
  if (m.num_heads < 1 || m.num_heads > kMaxDim || m.head_dim < 1 || m.head_dim > kMaxDim ||
      m.num_heads * m.head_dim != d_inner) {
    return absl::InvalidArgumentError(absl::StrCat("mamba_n_heads (", m.num_heads, ") * mamba_d_head (", m.head_dim,
                                                   ") must equal d_inner (", d_inner,
                                                   ": mamba_d_ssm, else mamba_expand * hidden_size)"));
  }
  ASSIGN_OR_RETURN(m.time_step_limit, f.Range({"time_step_limit"}, DtClamp{}));
  m.norm_group_size = m.n_groups > 0 ? m.d_inner() / m.n_groups : 0;
  m.prefill_dt_clamp = m.time_step_limit;
  m.decode_dt_clamp = DtClamp{};
  return absl::OkStatus();
}

// Attention of Bamba, Granite and Falcon-H1: q/k/v/o projections, each with a
// bias when attention_bias (transformers 5.23 BambaAttention,
// GraniteMoeHybridAttention and FalconH1Attention build all four with
// bias=config.attention_bias).
absl::Status ParseLlamaStyleAttention(const ConfigFields& f, int64_t hidden_size, AttentionParams& a) {
  ASSIGN_OR_RETURN(a.num_heads, f.Int({"num_attention_heads"}, std::nullopt));
  ASSIGN_OR_RETURN(a.num_kv_heads, f.Int({"num_key_value_heads"}, a.num_heads));
  RETURN_IF_ERROR(CheckDim("num_attention_heads", a.num_heads));
  ASSIGN_OR_RETURN(a.head_dim, f.Int({"head_dim"}, hidden_size / a.num_heads));
  ASSIGN_OR_RETURN(a.use_bias, f.Bool({"attention_bias"}, false));
  return absl::OkStatus();
}

// The object that holds the RoPE parameters, as transformers 5.23
// (convert_rope_params_to_dict) reads them: the legacy rope_scaling when set
// (it replaces rope_parameters), else rope_parameters, else none (top-level
// fields only). A field the object lacks comes from the top level.
const char* RopeObjectKey(const ConfigFields& f) {
  if (f.Has("rope_scaling")) return "rope_scaling";
  if (f.Has("rope_parameters")) return "rope_parameters";
  return nullptr;
}

// rope_type "default" (only), rope_theta (10000 when absent everywhere).
absl::Status ParseRope(const ConfigFields& f, AttentionParams& a) {
  ASSIGN_OR_RETURN(a.rope_theta, f.Float({"rope_theta"}, 10000.0));
  if (const char* key = RopeObjectKey(f); key != nullptr) {
    const Json& rp = f.Get(key);
    if (!rp.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(key, " must be an object, got ", Excerpt(rp)));
    }
    ConfigFields r(rp);
    ASSIGN_OR_RETURN(std::string type, r.String({"rope_type", "type"}, "default"));
    if (type != "default") {
      return absl::UnimplementedError(
          absl::StrCat(key, ".rope_type \"", type, "\" is not supported (only default RoPE is implemented)"));
    }
    ASSIGN_OR_RETURN(a.rope_theta, r.Float({"rope_theta"}, a.rope_theta));
  }
  if (!(a.rope_theta > 0.0) || !std::isfinite(a.rope_theta)) {
    return absl::InvalidArgumentError(absl::StrCat("rope_theta (", a.rope_theta, ") must be positive"));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> Multiplier(const ConfigFields& f, absl::string_view key) {
  ASSIGN_OR_RETURN(double v, f.Float({key}, 1.0));
  if (!std::isfinite(v) || v == 0.0 || std::fabs(v) > 1e30) {
    return absl::InvalidArgumentError(absl::StrCat(key, " (", v, ") must be finite and non-zero"));
  }
  return static_cast<float>(v);
}

// A list of `n` numbers (each a non-zero finite multiplier), or all ones when absent.
absl::Status Multipliers(const ConfigFields& f, absl::string_view key, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = 1.0f;
  if (!f.Has(key)) return absl::OkStatus();
  const Json& v = f.Get(key);
  if (!v.is_array() || v.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(key, " must be a list of ", n, " numbers, got ", Excerpt(v)));
  }
  for (size_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(double x, ConfigFields::ToFloat(absl::StrCat(key, "[", i, "]"), v[i]));
    if (!std::isfinite(x) || x == 0.0 || std::fabs(x) > 1e30) {
      return absl::InvalidArgumentError(absl::StrCat(key, "[", i, "] (", x, ") must be finite and non-zero"));
    }
    out[i] = static_cast<float>(x);
  }
  return absl::OkStatus();
}

// partial_rotary_factor from the RoPE object, else the top level, else `fallback`.
absl::StatusOr<double> PartialRotaryFactor(const ConfigFields& f, double fallback) {
  ASSIGN_OR_RETURN(double factor, f.Float({"partial_rotary_factor"}, fallback));
  if (const char* key = RopeObjectKey(f); key != nullptr && f.Get(key).is_object()) {
    ConfigFields r(f.Get(key));
    ASSIGN_OR_RETURN(factor, r.Float({"partial_rotary_factor"}, factor));
  }
  if (!(factor > 0.0 && factor <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("partial_rotary_factor (", factor, ") must be in (0, 1]"));
  }
  return factor;
}

absl::Status ParseDecoderLayerCount(const ConfigFields& f, int64_t& n_layers) {
  ASSIGN_OR_RETURN(n_layers, f.Int({"num_hidden_layers"}, std::nullopt));
  if (n_layers < 1 || 2 * n_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_hidden_layers (", n_layers, ") must be in [1, ", kMaxLayers / 2, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

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
    ASSIGN_OR_RETURN(m.use_in_proj_bias, f.Bool({"use_bias"}, false));
    m.use_out_proj_bias = m.use_in_proj_bias;
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
    // transformers 5.23 NemotronHAttention builds q/k/v/o_proj with bias=False
    // and every attention layer over the whole causal prefix, whatever
    // attention_bias and sliding_window say: both are read (so a malformed value
    // is still refused) and change nothing.
    ASSIGN_OR_RETURN(bool attention_bias, f.Bool({"attention_bias"}, false));
    (void)attention_bias;
    if (f.Has("sliding_window")) {  // null: absent
      ASSIGN_OR_RETURN(int64_t window, f.Int({"sliding_window"}, std::nullopt));
      (void)window;
    }
  }
  if (c.CountLayers(LayerKind::kMlp) > 0) {
    ASSIGN_OR_RETURN(c.mlp.intermediate_size, f.Int({"intermediate_size"}, std::nullopt));
    ASSIGN_OR_RETURN(std::string act, f.String({"mlp_hidden_act"}, "relu2"));
    if (act != "relu2") {
      return absl::UnimplementedError(
          absl::StrCat("mlp_hidden_act \"", act, "\" is not supported (only relu2 is implemented)"));
    }
    c.mlp.activation = MlpActivation::kRelu2;
    ASSIGN_OR_RETURN(c.mlp.use_bias, f.Bool({"mlp_bias"}, false));
  }
  if (c.CountLayers(LayerKind::kMoe) > 0) {
    ASSIGN_OR_RETURN(std::string act, f.String({"mlp_hidden_act"}, "relu2"));
    if (act != "relu2") {
      return absl::UnimplementedError(
          absl::StrCat("mlp_hidden_act \"", act, "\" is not supported (only relu2 is implemented)"));
    }
    RETURN_IF_ERROR(ParseNemotronMoe(f, c.moe));
    ASSIGN_OR_RETURN(c.moe.shared_bias, f.Bool({"mlp_bias"}, false));
    if (c.moe.shared_bias && c.moe.latent_size > 0) {
      // transformers gives fc1/fc2_latent_proj biases too with mlp_bias.
      return absl::UnimplementedError(
          "mlp_bias true with moe_latent_size is not supported (the latent projections' biases are not implemented)");
    }
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
  ASSIGN_OR_RETURN(m.use_in_proj_bias, f.Bool({"use_bias"}, false));
  m.use_out_proj_bias = m.use_in_proj_bias;
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
  // transformers 5.23 Mamba2Mixer gates before the norm (RMSNorm(y * silu(z)))
  // whatever norm_before_gate says (Mamba2Config has no such field): read, no effect.
  ASSIGN_OR_RETURN(bool norm_before_gate, f.Bool({"norm_before_gate"}, false));
  (void)norm_before_gate;
  // transformers 5.23 Mamba2Mixer: MambaRMSNormGated(group_size=intermediate_size
  // // n_groups); the chunked path clamps dt to time_step_limit, the one-step
  // decode path (mamba2_selective_state_update) does not clamp.
  m.norm_group_size = m.n_groups > 0 ? m.d_inner() / m.n_groups : 0;
  m.prefill_dt_clamp = m.time_step_limit;
  m.decode_dt_clamp = DtClamp{};
  ASSIGN_OR_RETURN(c.residual_in_fp32, f.Bool({"residual_in_fp32"}, true));
  return absl::OkStatus();
}

absl::Status ParseBamba(const ConfigFields& f, ModelConfig& c) {
  c.family = ModelFamily::kBamba;
  int64_t n_layers = 0;
  RETURN_IF_ERROR(ParseDecoderLayerCount(f, n_layers));
  std::vector<bool> attention(static_cast<size_t>(n_layers), false);
  if (f.Has("attn_layer_indices")) {
    const Json& v = f.Get("attn_layer_indices");
    if (!v.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("attn_layer_indices must be a list, got ", Excerpt(v)));
    }
    for (size_t i = 0; i < v.size(); ++i) {
      ASSIGN_OR_RETURN(int64_t index, ConfigFields::ToInt(absl::StrCat("attn_layer_indices[", i, "]"), v[i]));
      if (index < 0 || index >= n_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("attn_layer_indices[", i, "] (", index, ") is outside [0, ", n_layers, ")"));
      }
      attention[static_cast<size_t>(index)] = true;
    }
  }
  for (int64_t i = 0; i < n_layers; ++i) {
    c.layers.push_back(attention[static_cast<size_t>(i)] ? LayerKind::kAttention : LayerKind::kMamba2);
    c.layers.push_back(LayerKind::kGatedMlp);
  }
  RETURN_IF_ERROR(CheckSiluActivation(f, "hidden_act"));
  if (c.CountLayers(LayerKind::kMamba2) > 0) RETURN_IF_ERROR(ParseMambaPrefixed(f, c.hidden_size, c.mamba));
  if (c.CountLayers(LayerKind::kAttention) > 0) {
    AttentionParams& a = c.attention;
    RETURN_IF_ERROR(ParseLlamaStyleAttention(f, c.hidden_size, a));
    RETURN_IF_ERROR(ParseRope(f, a));
    // 0.5 when absent: BambaConfig's default.
    ASSIGN_OR_RETURN(const double factor, PartialRotaryFactor(f, 0.5));
    a.use_rope = true;
    a.rotary_dim = static_cast<int64_t>(static_cast<double>(a.head_dim) * factor);
  }
  ASSIGN_OR_RETURN(c.gated_mlp.intermediate_size, f.Int({"intermediate_size"}, std::nullopt));
  ASSIGN_OR_RETURN(c.gated_mlp.use_bias, f.Bool({"mlp_bias"}, false));
  return absl::OkStatus();
}

absl::Status ParseGraniteMoeHybrid(const ConfigFields& f, ModelConfig& c) {
  c.family = ModelFamily::kGraniteMoeHybrid;
  int64_t n_layers = 0;
  RETURN_IF_ERROR(ParseDecoderLayerCount(f, n_layers));
  std::vector<LayerKind> mixers;
  ASSIGN_OR_RETURN(std::optional<std::string> list_key, f.Resolve({"layer_types", "layers_block_type"}));
  if (list_key.has_value()) {
    const Json& v = f.Get(*list_key);
    if (!v.is_array()) return absl::InvalidArgumentError(absl::StrCat(*list_key, " must be a list, got ", Excerpt(v)));
    for (size_t i = 0; i < v.size(); ++i) {
      ASSIGN_OR_RETURN(LayerKind kind, KindFromBlockType(v[i], i));
      if (kind != LayerKind::kMamba2 && kind != LayerKind::kAttention) {
        return absl::InvalidArgumentError(
            absl::StrCat(*list_key, "[", i, "] must be a mixer (mamba or attention), got ", Excerpt(v[i])));
      }
      mixers.push_back(kind);
    }
    if (static_cast<int64_t>(mixers.size()) != n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("num_hidden_layers (", n_layers, ") does not match the ",
                                                     mixers.size(), " entries of ", *list_key));
    }
  } else {
    mixers.assign(static_cast<size_t>(n_layers), LayerKind::kMamba2);  // transformers' default
  }
  ASSIGN_OR_RETURN(int64_t experts, f.Int({"num_local_experts"}, 8));
  if (experts < 0 || experts > 1 << 16) {
    return absl::InvalidArgumentError(absl::StrCat("num_local_experts (", experts, ") must be in [0, 65536]"));
  }
  for (LayerKind mixer : mixers) {
    c.layers.push_back(mixer);
    c.layers.push_back(experts > 0 ? LayerKind::kMoe : LayerKind::kGatedMlp);
  }
  RETURN_IF_ERROR(CheckSiluActivation(f, "hidden_act"));
  if (!f.Has("rms_norm_eps") && !f.Has("layer_norm_epsilon")) c.norm_eps = 1e-6f;  // GraniteMoeHybridConfig's default
  if (c.CountLayers(LayerKind::kMamba2) > 0) RETURN_IF_ERROR(ParseMambaPrefixed(f, c.hidden_size, c.mamba));
  if (c.CountLayers(LayerKind::kAttention) > 0) {
    AttentionParams& a = c.attention;
    RETURN_IF_ERROR(ParseLlamaStyleAttention(f, c.hidden_size, a));
    // transformers 5.23 GraniteMoeHybridModel builds rotary embeddings only for
    // "rope"; null, "nope" (what the published Granite 4.0-H configs say) and
    // any other string mean no positions.
    ASSIGN_OR_RETURN(std::string position, f.String({"position_embedding_type"}, ""));
    if (position == "rope") {
      RETURN_IF_ERROR(ParseRope(f, a));
      a.use_rope = true;
      a.rotary_dim = a.head_dim;
    }
    ASSIGN_OR_RETURN(a.scale, Multiplier(f, "attention_multiplier"));
    if (a.scale < 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat("attention_multiplier (", a.scale, ") must be positive"));
    }
  }
  ASSIGN_OR_RETURN(int64_t shared, f.Int({"shared_intermediate_size"}, 1024));
  if (experts > 0) {
    MoeParams& moe = c.moe;
    moe.num_experts = experts;
    ASSIGN_OR_RETURN(moe.top_k, f.Int({"num_experts_per_tok"}, 2));
    ASSIGN_OR_RETURN(moe.intermediate_size, f.Int({"intermediate_size"}, std::nullopt));
    moe.shared_intermediate_size = shared;
    moe.router = MoeRouter::kTopKSoftmax;
  } else {
    c.gated_mlp.intermediate_size = shared;
    c.gated_mlp.use_bias = false;
  }
  ASSIGN_OR_RETURN(c.embedding_multiplier, Multiplier(f, "embedding_multiplier"));
  ASSIGN_OR_RETURN(c.residual_multiplier, Multiplier(f, "residual_multiplier"));
  ASSIGN_OR_RETURN(c.logits_scaling, Multiplier(f, "logits_scaling"));
  return absl::OkStatus();
}

absl::Status ParseFalconH1(const ConfigFields& f, ModelConfig& c) {
  c.family = ModelFamily::kFalconH1;
  int64_t n_layers = 0;
  RETURN_IF_ERROR(ParseDecoderLayerCount(f, n_layers));
  for (int64_t i = 0; i < n_layers; ++i) {
    c.layers.push_back(LayerKind::kParallel);
    c.layers.push_back(LayerKind::kGatedMlp);
  }
  RETURN_IF_ERROR(CheckSiluActivation(f, "hidden_act"));

  // transformers 5.23 FalconH1Mixer: chunked path clamps dt to time_step_limit,
  // decode does not; the gated norm (mamba_rms_norm) groups by mamba_n_groups.
  Mamba2Params& m = c.mamba;
  RETURN_IF_ERROR(ParseMambaPrefixed(f, c.hidden_size, m));
  ASSIGN_OR_RETURN(m.gated_norm, f.Bool({"mamba_rms_norm"}, false));
  ASSIGN_OR_RETURN(m.norm_before_gate, f.Bool({"mamba_norm_before_gate"}, true));
  // FalconH1Mixer: in_proj's bias is mamba_proj_bias (parsed above), out_proj's
  // is projectors_bias; each may be set without the other.
  ASSIGN_OR_RETURN(m.use_out_proj_bias, f.Bool({"projectors_bias"}, false));
  ASSIGN_OR_RETURN(m.in_multiplier, Multiplier(f, "ssm_in_multiplier"));
  ASSIGN_OR_RETURN(m.out_multiplier, Multiplier(f, "ssm_out_multiplier"));
  RETURN_IF_ERROR(Multipliers(f, "ssm_multipliers", 5, m.segment_multipliers));

  AttentionParams& a = c.attention;
  RETURN_IF_ERROR(ParseLlamaStyleAttention(f, c.hidden_size, a));
  RETURN_IF_ERROR(ParseRope(f, a));
  ASSIGN_OR_RETURN(const double factor, PartialRotaryFactor(f, 1.0));
  a.use_rope = true;
  a.rotary_dim = static_cast<int64_t>(static_cast<double>(a.head_dim) * factor);
  ASSIGN_OR_RETURN(a.in_multiplier, Multiplier(f, "attention_in_multiplier"));
  ASSIGN_OR_RETURN(a.key_multiplier, Multiplier(f, "key_multiplier"));
  ASSIGN_OR_RETURN(a.out_multiplier, Multiplier(f, "attention_out_multiplier"));

  ASSIGN_OR_RETURN(c.gated_mlp.intermediate_size, f.Int({"intermediate_size"}, std::nullopt));
  ASSIGN_OR_RETURN(c.gated_mlp.use_bias, f.Bool({"mlp_bias"}, false));
  float mlp[2];
  RETURN_IF_ERROR(Multipliers(f, "mlp_multipliers", 2, mlp));
  c.gated_mlp.gate_multiplier = mlp[0];
  c.gated_mlp.down_multiplier = mlp[1];
  ASSIGN_OR_RETURN(c.embedding_multiplier, Multiplier(f, "embedding_multiplier"));
  ASSIGN_OR_RETURN(c.logits_multiplier, Multiplier(f, "lm_head_multiplier"));
  return absl::OkStatus();
}

absl::Status ParseZamba2(const ConfigFields& f, ModelConfig& c) {
  c.family = ModelFamily::kZamba2;
  int64_t n_layers = 0;
  RETURN_IF_ERROR(ParseDecoderLayerCount(f, n_layers));
  if (f.Has("layers_block_type")) {
    const Json& v = f.Get("layers_block_type");
    if (!v.is_array() || static_cast<int64_t>(v.size()) != n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layers_block_type must be a list of num_hidden_layers (",
                                                     n_layers, ") entries, got ", Excerpt(v)));
    }
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string type = v[i].is_string() ? v[i].get<std::string>() : "";
      if (type == "mamba" || type == "linear_attention") {
        c.layers.push_back(LayerKind::kMamba2);
      } else if (type == "hybrid") {
        c.layers.push_back(LayerKind::kZambaHybrid);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("layers_block_type[", i, "] (", Excerpt(v[i]), ") must be mamba, linear_attention or hybrid"));
      }
    }
  } else {
    return absl::InvalidArgumentError("layers_block_type is required but missing");
  }
  // transformers 5.23 Zamba2: use_long_context only sets max_position_embeddings
  // to 16384 (Zamba2Config.__post_init__); its rotary embedding reads rope_theta
  // as given, so the logits are those without it.
  ASSIGN_OR_RETURN(bool long_context, f.Bool({"use_long_context"}, false));
  if (long_context) c.max_position_embeddings = 16384;
  ASSIGN_OR_RETURN(bool bias, f.Bool({"add_bias_linear"}, false));

  // transformers 5.23 Zamba2MambaMixer: d_inner = mamba_expand * hidden; the
  // chunked path clamps dt to >= time_step_min, the decode step does not; the
  // gated norm (after the gate) groups by mamba_ngroups with epsilon 1e-5.
  Mamba2Params& m = c.mamba;
  ASSIGN_OR_RETURN(m.num_heads, f.Int({"n_mamba_heads"}, 8));
  ASSIGN_OR_RETURN(m.head_dim, f.Int({"mamba_headdim"}, std::nullopt));
  ASSIGN_OR_RETURN(m.state_size, f.Int({"mamba_d_state"}, 64));
  ASSIGN_OR_RETURN(m.n_groups, f.Int({"mamba_ngroups"}, 1));
  ASSIGN_OR_RETURN(m.conv_kernel, f.Int({"mamba_d_conv"}, kDefaultConvKernel));
  ASSIGN_OR_RETURN(m.chunk_size, f.Int({"chunk_size"}, kDefaultMamba2Chunk));
  // transformers 5.23 Zamba2MambaMixer builds conv1d with bias=True whatever
  // use_conv_bias says (and save_pretrained writes that bias): read, no effect.
  ASSIGN_OR_RETURN(bool use_conv_bias, f.Bool({"use_conv_bias"}, true));
  (void)use_conv_bias;
  m.use_conv_bias = true;
  m.use_in_proj_bias = bias;
  m.use_out_proj_bias = bias;
  ASSIGN_OR_RETURN(int64_t expand, f.Int({"mamba_expand"}, kDefaultMamba2Expand));
  if (expand < 1 || expand > kMaxDim || c.hidden_size < 1 || c.hidden_size > kMaxDim ||
      m.num_heads * m.head_dim != expand * c.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("n_mamba_heads (", m.num_heads, ") * mamba_headdim (", m.head_dim,
                                                   ") must equal mamba_expand (", expand, ") * hidden_size (",
                                                   c.hidden_size, ")"));
  }
  ASSIGN_OR_RETURN(double dt_min, f.Float({"time_step_min"}, 0.001));
  ASSIGN_OR_RETURN(double dt_max, f.Float({"time_step_max"}, 0.1));
  m.time_step_min = static_cast<float>(dt_min);
  m.time_step_max = static_cast<float>(dt_max);
  m.norm_group_size = m.n_groups > 0 ? m.d_inner() / m.n_groups : 0;
  m.prefill_dt_clamp = DtClamp{m.time_step_min, std::numeric_limits<float>::infinity()};
  m.decode_dt_clamp = DtClamp{};
  m.gated_norm_eps = 1e-5f;

  if (c.CountLayers(LayerKind::kZambaHybrid) > 0) {
    AttentionParams& a = c.attention;
    ASSIGN_OR_RETURN(a.num_heads, f.Int({"num_attention_heads"}, 32));
    RETURN_IF_ERROR(CheckDim("num_attention_heads", a.num_heads));
    ASSIGN_OR_RETURN(a.num_kv_heads, f.Int({"num_key_value_heads"}, a.num_heads));
    a.head_dim = 2 * c.hidden_size / a.num_heads;
    if (a.head_dim * a.num_heads != 2 * c.hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat("num_attention_heads (", a.num_heads,
                                                     ") must divide the attention width 2 * hidden_size (",
                                                     2 * c.hidden_size, ")"));
    }
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.head_dim) / 2.0));
    ASSIGN_OR_RETURN(a.use_rope, f.Bool({"use_mem_rope"}, false));
    if (a.use_rope) {
      RETURN_IF_ERROR(ParseRope(f, a));
      a.rotary_dim = a.head_dim;
    }
    ZambaParams& z = c.zamba;
    ASSIGN_OR_RETURN(z.num_mem_blocks, f.Int({"num_mem_blocks"}, 1));
    RETURN_IF_ERROR(CheckDim("num_mem_blocks", z.num_mem_blocks));
    ASSIGN_OR_RETURN(z.use_adapters, f.Bool({"use_shared_attention_adapter"}, false));
    ASSIGN_OR_RETURN(z.adapter_rank, f.Int({"adapter_rank"}, 128));
    RETURN_IF_ERROR(CheckDim("adapter_rank", z.adapter_rank));  // the MLP's adapters exist either way
    if (z.use_adapters && a.num_kv_heads != a.num_heads) {
      return absl::UnimplementedError(
          "use_shared_attention_adapter with num_key_value_heads != num_attention_heads is not supported (the "
          "adapters' k and v widths would not match; transformers cannot run it either)");
    }
    GatedMlpParams& mlp = c.gated_mlp;
    ASSIGN_OR_RETURN(mlp.intermediate_size, f.Int({"intermediate_size"}, 4 * c.hidden_size));
    mlp.use_bias = bias;
    ASSIGN_OR_RETURN(std::string act, f.String({"hidden_act"}, "gelu"));
    if (act == "gelu") {
      mlp.activation = GateActivation::kGelu;
    } else if (act == "silu" || act == "swish") {
      mlp.activation = GateActivation::kSilu;
    } else {
      return absl::UnimplementedError(
          absl::StrCat("hidden_act \"", act, "\" is not supported (only gelu and silu are implemented)"));
    }
  }
  if (!f.Has("tie_word_embeddings")) c.tie_word_embeddings = true;  // Zamba2Config's default
  return absl::OkStatus();
}

}  // namespace hybridserve::engine::config_internal
