// ModelConfig of the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5 dense and
// MoE): engine/qwen3_next_config.h reads every form of their config.json; this
// file turns what it read into the engine's blocks and kind parameters.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/config_fields.h"
#include "engine/model_config.h"
#include "engine/model_config_families.h"
#include "engine/qwen3_next_config.h"

namespace hybridserve::engine::config_internal {

bool IsQwenModelType(absl::string_view model_type) {
  return model_type == "qwen3_next" || model_type == "qwen3_5" || model_type == "qwen3_5_moe" ||
         model_type == "qwen3_5_text" || model_type == "qwen3_5_moe_text";
}

absl::Status ParseQwen(absl::string_view json_text, const Json& root, ModelConfig& c) {
  ASSIGN_OR_RETURN(Qwen3NextConfig q, ParseQwen3NextConfig(json_text));
  if (q.rope_type != "default") {
    return absl::UnimplementedError(
        absl::StrCat("rope_type \"", q.rope_type, "\" is not supported for ", q.model_type, " (default only)"));
  }
  if (q.text_model_type == "qwen3_next") {
    c.family = ModelFamily::kQwen3Next;
  } else if (q.text_model_type == "qwen3_5_text") {
    c.family = ModelFamily::kQwen3_5;
  } else {
    c.family = ModelFamily::kQwen3_5Moe;
  }
  c.vocab_size = q.vocab_size;
  c.hidden_size = q.hidden_size;
  c.norm_eps = static_cast<float>(q.rms_norm_eps);
  c.tie_word_embeddings = q.tie_word_embeddings;
  c.ignored = q.ignored;

  // Token ids and the other common fields: the language model's object (the
  // image-text forms keep them in text_config), else the top level.
  const bool nested = q.tensor_prefix != "model." && root.contains("text_config") && root["text_config"].is_object();
  const ConfigFields top(root);
  const ConfigFields text(nested ? root["text_config"] : root);
  for (auto [key, ids] : {std::pair<const char*, std::vector<int64_t>*>{"eos_token_id", &c.eos_token_ids},
                          {"bos_token_id", &c.bos_token_ids},
                          {"pad_token_id", &c.pad_token_ids}}) {
    const ConfigFields& from = text.Has(key) ? text : top;
    ASSIGN_OR_RETURN(*ids, from.TokenIds(key));
  }
  ASSIGN_OR_RETURN(c.max_position_embeddings, text.Int({"max_position_embeddings"}, 0));
  const ConfigFields& dtype_from = top.Has("dtype") || top.Has("torch_dtype") ? top : text;
  ASSIGN_OR_RETURN(c.dtype, dtype_from.String({"dtype", "torch_dtype"}, ""));
  ASSIGN_OR_RETURN(c.name_or_path, top.String({"_name_or_path"}, ""));

  // Decoder layer i: blocks 2i (its mixer) and 2i + 1 (its feed-forward part).
  c.layers.clear();
  for (int64_t i = 0; i < q.num_hidden_layers; ++i) {
    c.layers.push_back(q.layer_kinds[static_cast<size_t>(i)] == QwenLayerKind::kLinearAttention
                           ? LayerKind::kGatedDeltaNet
                           : LayerKind::kAttention);
    c.layers.push_back(q.LayerIsMoe(i) ? LayerKind::kMoe : LayerKind::kGatedMlp);
  }

  GatedDeltaNetParams& g = c.gdn;
  g.num_k_heads = q.linear_num_key_heads;
  g.num_v_heads = q.linear_num_value_heads;
  g.k_head_dim = q.linear_key_head_dim;
  g.v_head_dim = q.linear_value_head_dim;
  g.conv_kernel = q.linear_conv_kernel_dim;
  g.chunk_size = 64;

  AttentionParams& a = c.attention;
  a.num_heads = q.num_attention_heads;
  a.num_kv_heads = q.num_key_value_heads;
  a.head_dim = q.head_dim;
  a.use_rope = true;
  a.rotary_dim = static_cast<int64_t>(q.partial_rotary_factor * static_cast<double>(q.head_dim));
  a.rope_theta = q.rope_theta;
  a.use_bias = q.attention_bias;
  a.output_gate = true;
  a.qk_norm = true;

  if (c.CountLayers(LayerKind::kGatedMlp) > 0) {
    if (q.intermediate_size <= 0) {
      return absl::InvalidArgumentError("intermediate_size is required: the model has dense MLP layers");
    }
    c.gated_mlp.intermediate_size = q.intermediate_size;
  }
  if (c.CountLayers(LayerKind::kMoe) > 0) {
    MoeParams& m = c.moe;
    m.num_experts = q.num_experts;
    m.top_k = q.num_experts_per_tok;
    m.intermediate_size = q.moe_intermediate_size;
    m.shared_intermediate_size = q.shared_expert_intermediate_size;
    m.router = MoeRouter::kSoftmaxTopK;
    m.expert = ExpertKind::kSwiGlu;
    m.norm_topk_prob = q.norm_topk_prob;
    m.shared_gate = q.shared_expert_intermediate_size > 0;
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::engine::config_internal
