#ifndef HYBRIDSERVE_ENGINE_QWEN3_NEXT_CONFIG_H_
#define HYBRIDSERVE_ENGINE_QWEN3_NEXT_CONFIG_H_

// The config.json of a Qwen3-Next / Qwen3.5 checkpoint (issue 50), read into a
// plain struct: the Gated DeltaNet hybrids. Every form transformers 5.23
// writes is accepted:
//   qwen3_next                      the language model at the top level,
//                                   tensors under model.*;
//   qwen3_5, qwen3_5_moe            image-text: the language model under
//                                   text_config, tensors under
//                                   model.language_model.*;
//   qwen3_5_text, qwen3_5_moe_text  the text-only form, tensors under model.*.
// An absent field takes transformers 5.23's default for that model_type
// (configuration_qwen3_next.py, configuration_qwen3_5{,_moe}.py). Not wired
// into the engine's model loading yet. Thread-compatible value types.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridserve::engine {

enum class QwenLayerKind { kLinearAttention, kFullAttention };

// "linear_attention" / "full_attention", as layer_types spells them.
absl::string_view QwenLayerKindName(QwenLayerKind kind);

struct Qwen3NextConfig {
  std::string model_type;       // as the file states it (top level)
  std::string text_model_type;  // the language model's: qwen3_next, qwen3_5_text or qwen3_5_moe_text
  // "model." or "model.language_model." (the image-text forms).
  std::string tensor_prefix;

  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t num_hidden_layers = 0;
  std::vector<QwenLayerKind> layer_kinds;  // num_hidden_layers entries
  bool layer_types_explicit = false;       // false: from full_attention_interval
  int64_t full_attention_interval = 0;     // 0 when layer_types was given

  // Gated DeltaNet.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;

  // Gated attention (q_proj carries the output gate: 2 * heads * head_dim rows).
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double partial_rotary_factor = 0.0;
  double rope_theta = 0.0;
  std::string rope_type;  // "default" unless rope_parameters / rope_scaling say otherwise
  double rms_norm_eps = 0.0;
  bool attention_bias = false;

  // Feed-forward. is_moe: qwen3_next and qwen3_5_moe*; dense Qwen3.5 has none of the MoE fields.
  bool is_moe = false;
  int64_t intermediate_size = 0;  // the dense MLP's (qwen3_next's mlp_only_layers, every qwen3_5 layer); 0 if none
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;       // qwen3_5_moe always renormalises the top-k weights
  int64_t decoder_sparse_step = 1;  // qwen3_next only
  std::vector<int64_t> mlp_only_layers;

  bool tie_word_embeddings = false;

  // Keys present in the file that the engine does not run, each "key: why"
  // (vision_config, mtp_*, ...), for the loader to log.
  std::vector<std::string> ignored;

  // Whether layer `i` uses the sparse MoE block (else the dense MLP), as
  // transformers decides: not in mlp_only_layers, num_experts > 0 and
  // (i + 1) % decoder_sparse_step == 0.
  bool LayerIsMoe(int64_t i) const;
};

// Parses config.json text. INVALID_ARGUMENT naming the field for a malformed
// or inconsistent config.
absl::StatusOr<Qwen3NextConfig> ParseQwen3NextConfig(absl::string_view json_text);

struct QwenTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// How a MoE layer's routed experts are stored.
enum class QwenExpertLayout {
  // One tensor per expert, as published checkpoints hold them and as
  // transformers 5.23's save_pretrained writes them:
  // mlp.experts.{e}.{gate,up}_proj.weight [moe_intermediate, hidden],
  // mlp.experts.{e}.down_proj.weight [hidden, moe_intermediate].
  kPerExpert,
  // Fused 3-D, as transformers 5.23's model holds them after loading:
  // mlp.experts.gate_up_proj [E, 2 * moe_intermediate, hidden],
  // mlp.experts.down_proj [E, hidden, moe_intermediate].
  kFused,
};

// The language model's tensors (name and shape) of such a checkpoint, under
// config.tensor_prefix, plus lm_head.weight unless tied. The vision tower and
// MTP tensors are not listed.
std::vector<QwenTensorSpec> QwenLanguageModelTensors(const Qwen3NextConfig& config,
                                                     QwenExpertLayout experts = QwenExpertLayout::kPerExpert);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_QWEN3_NEXT_CONFIG_H_
