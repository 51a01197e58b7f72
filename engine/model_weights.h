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
//   lm_head.weight  (absent when tie_word_embeddings)         [vocab, hidden]
// where the prefix P is "backbone" (files) or "model" (transformers' in-memory
// name), the same for every tensor. Matrices are row-major [out, in], as stored.
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
  // [vocab, hidden]; the embeddings object itself when the head is tied.
  const std::vector<float>& lm_head() const { return tied_ ? embeddings_ : lm_head_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const LayerWeights& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }

  // XXH3-128 over the config's CanonicalString() and, per tensor in canonical
  // name order (prefix stripped), its name, dtype, shape and stored bytes. Equal
  // for the same model in any sharding or prefix; differs for another dtype.
  const common::Hash128& fingerprint() const { return fingerprint_; }
  // Number of distinct parameters (a tied head counted once).
  int64_t num_parameters() const { return num_parameters_; }

 private:
  class Loader;
  ModelWeights() = default;

  ModelConfig config_;
  std::vector<float> embeddings_;
  std::vector<float> norm_f_;
  std::vector<float> lm_head_;  // empty when tied
  bool tied_ = false;
  std::vector<LayerWeights> layers_;
  common::Hash128 fingerprint_;
  int64_t num_parameters_ = 0;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_H_
