#ifndef HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_H_
#define HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_H_

// Every weight of a model, converted to fp32 and organised per layer, loaded
// from a Hugging Face model directory (config.json + safetensors).
//
// Tensor names (transformers' NemotronHForCausalLM / Mamba2ForCausalLM):
//   P.embeddings.weight (legacy Mamba2: P.embedding.weight)   [vocab, hidden]
//   P.layers.{i}.norm.weight                                  [hidden]
//   P.layers.{i}.mixer.*  (see the per-kind structs)
//   P.norm_f.weight                                           [hidden]
//   lm_head.weight  (optional when tie_word_embeddings)       [vocab, hidden]
// where the prefix P is "backbone" (files) or "model" (transformers' in-memory
// name), the same for every tensor. Matrices are row-major [out, in], as stored.
//
// The LM head is the weight transformers 5 computes the logits with:
//   - lm_head.weight stored: that tensor, whatever tie_word_embeddings says.
//     transformers never ties Nemotron-H (NemotronHForCausalLM has no tied
//     weights, so save_pretrained writes its own head even with
//     tie_word_embeddings true), and PreTrainedModel.tie_weights leaves a
//     Mamba2 head untied when the file stores one that differs from the
//     embeddings. When tied and a byte-for-byte copy of the embeddings (same
//     dtype, shape and bytes), the head is the embeddings object itself.
//   - absent and tie_word_embeddings: the embeddings. (transformers'
//     Mamba2ForCausalLM ties; its NemotronHForCausalLM would leave the head
//     randomly initialised and report it missing.)
//   - absent and not tied: a missing tensor.
// Loading checks the exact set of names and every shape against the config:
// a missing tensor, a wrong shape or an unexpected tensor is INVALID_ARGUMENT
// naming the tensor. Nemotron-H's multi-token-prediction tensors (`mtp.*`)
// are skipped, as transformers does.

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hash.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace hybridserve::engine {

// Member names follow the checkpoint (and the math) rather than snake_case.
struct Mamba2LayerWeights {
  std::vector<float> in_proj;        // [in_proj_rows, hidden]; rows [z | x | B | C | dt]
  std::vector<float> in_proj_bias;   // [in_proj_rows] if use_bias, else empty
  std::vector<float> conv1d_weight;  // [conv_dim, conv_kernel] (file: [conv_dim, 1, conv_kernel])
  std::vector<float> conv1d_bias;    // [conv_dim] if use_conv_bias, else empty
  std::vector<float> dt_bias;        // [num_heads]
  std::vector<float> A_log;          // [num_heads]; A = -exp(A_log)
  std::vector<float> D;              // [num_heads]; skip connection
  std::vector<float> norm;           // [d_inner]; gated RMSNorm weight
  std::vector<float> out_proj;       // [hidden, d_inner]
  std::vector<float> out_proj_bias;  // [hidden] if use_bias, else empty
};

struct AttentionLayerWeights {
  std::vector<float> q_proj;  // [num_heads * head_dim, hidden]
  std::vector<float> k_proj;  // [num_kv_heads * head_dim, hidden]
  std::vector<float> v_proj;  // [num_kv_heads * head_dim, hidden]
  std::vector<float> o_proj;  // [hidden, num_heads * head_dim]
};

struct MlpLayerWeights {
  std::vector<float> up_proj;         // [intermediate, hidden]
  std::vector<float> up_proj_bias;    // [intermediate] if mlp_bias, else empty
  std::vector<float> down_proj;       // [hidden, intermediate]
  std::vector<float> down_proj_bias;  // [hidden] if mlp_bias, else empty
};

struct LayerWeights {
  LayerKind kind = LayerKind::kMamba2;
  std::vector<float> norm;  // [hidden]; RMSNorm before the mixer
  std::variant<Mamba2LayerWeights, AttentionLayerWeights, MlpLayerWeights> mixer;

  // Precondition: `kind` matches (checked by std::get).
  const Mamba2LayerWeights& mamba2() const { return std::get<Mamba2LayerWeights>(mixer); }
  const AttentionLayerWeights& attention() const { return std::get<AttentionLayerWeights>(mixer); }
  const MlpLayerWeights& mlp() const { return std::get<MlpLayerWeights>(mixer); }
};

// Immutable after loading; thread-safe for concurrent reads.
class ModelWeights {
 public:
  // Reads `model_dir`/config.json, then the weights.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> LoadDirectory(const std::string& model_dir);
  // Loads the weights of `config` from `model_dir` (model.safetensors or a
  // sharded index).
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const ModelConfig& config, const std::string& model_dir);
  // Loads from an open checkpoint (tests, custom layouts).
  static absl::StatusOr<std::unique_ptr<ModelWeights>> FromCheckpoint(const ModelConfig& config,
                                                                      const SafetensorsCheckpoint& checkpoint);

  ModelWeights(const ModelWeights&) = delete;
  ModelWeights& operator=(const ModelWeights&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::vector<float>& embeddings() const { return embeddings_; }  // [vocab, hidden]
  const std::vector<float>& norm_f() const { return norm_f_; }          // [hidden]
  // [vocab, hidden]; the embeddings object itself when the model is tied and
  // stores no head of its own (none, or an exact copy of the embeddings).
  const std::vector<float>& lm_head() const { return tied_ ? embeddings_ : lm_head_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const LayerWeights& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }

  // XXH3-128 over the config's CanonicalString() and, per tensor in canonical
  // name order (prefix stripped), its name, dtype, shape and stored bytes. Equal
  // for the same model in any sharding or prefix; differs for another dtype.
  // Every tensor the model uses is covered: a stored lm_head.weight that is the
  // head (above) is hashed like any other; an exact copy of tied embeddings is
  // not hashed again (the same model as without it).
  const common::Hash128& fingerprint() const { return fingerprint_; }
  // Number of distinct parameters (a head that is the embeddings counted once).
  int64_t num_parameters() const { return num_parameters_; }

 private:
  class Loader;
  ModelWeights() = default;

  ModelConfig config_;
  std::vector<float> embeddings_;
  std::vector<float> norm_f_;
  std::vector<float> lm_head_;  // empty when tied_
  bool tied_ = false;           // lm_head() is embeddings_
  std::vector<LayerWeights> layers_;
  common::Hash128 fingerprint_;
  int64_t num_parameters_ = 0;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_H_
