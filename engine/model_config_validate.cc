// ModelConfig::Validate: the rules of model_config.h ("Field rules").

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/model_config.h"
#include "engine/model_config_families.h"

namespace hybridserve::engine {
namespace config_internal {

absl::Status CheckDim(absl::string_view name, int64_t value) {
  if (value < 1 || value > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(name, " (", value, ") must be in [1, ", kMaxDim, "]"));
  }
  return absl::OkStatus();
}

}  // namespace config_internal

namespace {

using config_internal::CheckDim;
using config_internal::kMaxDim;
using config_internal::kMaxLayers;

constexpr float kInf = std::numeric_limits<float>::infinity();

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
                        c.family == ModelFamily::kFalconH1 || c.family == ModelFamily::kZamba2;
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
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size (", m.chunk_size,
                     ") must be a power of two (the engine runs powers of two only; transformers runs any)"));
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
  if (moe.shared_bias && moe.expert != ExpertKind::kRelu2) {
    return absl::InvalidArgumentError("the shared expert's biases (mlp_bias) need relu2 experts (Nemotron-H)");
  }
  if (moe.shared_intermediate_size != 0) {
    RETURN_IF_ERROR(CheckDim("shared_intermediate_size", moe.shared_intermediate_size));
  }
  if (moe.latent_size != 0) RETURN_IF_ERROR(CheckDim("moe_latent_size", moe.latent_size));
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
    const bool mixer = c.family == ModelFamily::kFalconH1 ? c.layers[i] == LayerKind::kParallel
                       : c.IsQwenFamily()
                           ? c.layers[i] == LayerKind::kGatedDeltaNet || c.layers[i] == LayerKind::kAttention
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

absl::Status ValidateGatedDeltaNet(const GatedDeltaNetParams& g) {
  RETURN_IF_ERROR(CheckDim("linear_num_key_heads", g.num_k_heads));
  RETURN_IF_ERROR(CheckDim("linear_num_value_heads", g.num_v_heads));
  if (g.num_v_heads % g.num_k_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("linear_num_value_heads (", g.num_v_heads,
                                                   ") must be a multiple of linear_num_key_heads (", g.num_k_heads,
                                                   ")"));
  }
  RETURN_IF_ERROR(CheckDim("linear_key_head_dim", g.k_head_dim));
  RETURN_IF_ERROR(CheckDim("linear_value_head_dim", g.v_head_dim));
  RETURN_IF_ERROR(CheckDim("linear_conv_kernel_dim", g.conv_kernel));
  if (g.chunk_size <= 0 || (g.chunk_size & (g.chunk_size - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Gated DeltaNet chunk size (", g.chunk_size, ") must be a power of two"));
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
  if (CountLayers(LayerKind::kGatedDeltaNet) > 0) {
    if (!IsQwenFamily() || SsmLayers() > 0) {
      return absl::InvalidArgumentError(absl::StrCat("only a Qwen3-Next / Qwen3.5 model has Gated DeltaNet blocks, ",
                                                     "and none has Mamba2 blocks too; got ", ModelFamilyName(family),
                                                     " pattern \"", LayerPattern(), "\""));
    }
    RETURN_IF_ERROR(ValidateGatedDeltaNet(gdn));
  }
  if (KvLayers() > 0) RETURN_IF_ERROR(ValidateAttention(attention));
  if (CountLayers(LayerKind::kMlp) > 0) RETURN_IF_ERROR(CheckDim("intermediate_size", mlp.intermediate_size));
  if (CountLayers(LayerKind::kGatedMlp) > 0) {
    RETURN_IF_ERROR(CheckDim("intermediate_size (gated MLP)", gated_mlp.intermediate_size));
  }
  if (CountLayers(LayerKind::kMoe) > 0) RETURN_IF_ERROR(ValidateMoe(moe));
  const bool decoder_layers = family == ModelFamily::kBamba || family == ModelFamily::kGraniteMoeHybrid ||
                              family == ModelFamily::kFalconH1 || IsQwenFamily();
  if (family != ModelFamily::kZamba2 && CountLayers(LayerKind::kZambaHybrid) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("only a zamba2 model has hybrid blocks, got pattern \"", LayerPattern(), "\""));
  }
  if (family != ModelFamily::kFalconH1 && CountLayers(LayerKind::kParallel) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("only a falcon_h1 model has parallel blocks, got pattern \"", LayerPattern(), "\""));
  }
  if (decoder_layers) RETURN_IF_ERROR(ValidateDecoderLayers(*this));
  if (family == ModelFamily::kZamba2) {
    for (LayerKind kind : layers) {
      if (kind != LayerKind::kMamba2 && kind != LayerKind::kZambaHybrid) {
        return absl::InvalidArgumentError(
            absl::StrCat("a zamba2 model has Mamba2 and hybrid blocks only, got pattern \"", LayerPattern(), "\""));
      }
    }
    if (CountLayers(LayerKind::kZambaHybrid) > 0) {
      RETURN_IF_ERROR(CheckDim("intermediate_size", gated_mlp.intermediate_size));
      RETURN_IF_ERROR(CheckDim("num_mem_blocks", zamba.num_mem_blocks));
      RETURN_IF_ERROR(CheckDim("adapter_rank", zamba.adapter_rank));  // the MLP's adapters are always there
    }
  }
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

}  // namespace hybridserve::engine
