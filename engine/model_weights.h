#ifndef HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_H_
#define HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_H_

// Every weight of a model, organised per layer, loaded from a Hugging Face
// model directory (config.json + safetensors). The matrices (embeddings, the
// projections, the LM head) stay in the checkpoint's bf16 when it stores bf16
// (WeightMatrix: no fp32 copy is kept; the kernels read bf16); fp16 and fp32
// matrices and every vector (norms, biases, conv, A_log, D, dt_bias) are fp32.
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
// Bamba and Granite (transformers' BambaForCausalLM, GraniteMoeHybridForCausalLM),
// decoder layer L = blocks 2L (mixer) and 2L + 1 (feed-forward):
//   model.embed_tokens.weight                                 [vocab, hidden]
//   model.layers.{L}.input_layernorm.weight                   block 2L's norm
//   model.layers.{L}.mamba.* | model.layers.{L}.self_attn.*   block 2L
//   Bamba:   model.layers.{L}.pre_ff_layernorm.weight         block 2L + 1's norm
//            model.layers.{L}.feed_forward.{gate,up,down}_proj.weight (+ .bias with mlp_bias)
//   Granite: model.layers.{L}.post_attention_layernorm.weight block 2L + 1's norm
//            model.layers.{L}.shared_mlp.input_linear.weight  [2 * shared, hidden] rows [gate | up]
//            model.layers.{L}.shared_mlp.output_linear.weight [hidden, shared]
//            model.layers.{L}.block_sparse_moe.router.layer.weight    [experts, hidden]
//            model.layers.{L}.block_sparse_moe.input_linear.weight    [experts, 2 * inter, hidden]
//            model.layers.{L}.block_sparse_moe.output_linear.weight   [experts, hidden, inter]
// Nemotron-H 'E' blocks: P.layers.{i}.mixer.gate.weight [experts, hidden],
// .gate.e_score_correction_bias [experts], .experts.{e}.up_proj.weight [inter, d],
// .experts.{e}.down_proj.weight [d, inter] (as save_pretrained writes them; the
// fused in-memory .experts.up_proj [experts, inter, d] / .experts.down_proj are
// accepted too), .shared_experts.{up,down}_proj.weight; with moe_latent_size L,
// .fc1_latent_proj.weight [L, hidden] and .fc2_latent_proj.weight [hidden, L],
// and d = L (else d = hidden).
//   model.final_layernorm.weight (Bamba) | model.norm.weight (Granite)
// Zamba2 (Zamba2ForCausalLM), layer i: a Mamba2 layer as model.layers.{i}.input_layernorm
// and model.layers.{i}.mamba.*; a hybrid layer as model.layers.{i}.linear.weight,
// model.layers.{i}.mamba_decoder.{input_layernorm, mamba.*} and its shared transformer
// block under model.layers.{i}.shared_transformer.* (input_layernorm, self_attn.*_proj,
// pre_ff_layernorm, feed_forward.{gate_up,down}_proj), whose adapters are indexed by use:
// hybrid layer i, use u (its rank among the hybrid layers) of memory block
// b = u % num_mem_blocks, runs ...self_attn.linear_{q,k,v}_adapter_list.{u}.{0,1} and
// ...feed_forward.gate_up_proj_adapter_list.{u}.{0,1}; its module holds the adapters of
// every use u' of block b (the others unused by it); final_layernorm; head as below.
// As transformers 5 runs it (each hybrid layer has its own module; tie_word_embeddings
// ties them per tensor, PreTrainedModel.tie_weights), hybrid layer i runs, for each
// tensor of its block and of its use's adapters, the one stored under its own index;
// if none, with tie_word_embeddings the one stored under the first layer of block b
// that stores it (published files keep the block under the first use only), and
// without it none (transformers would initialise it at random): INVALID_ARGUMENT. So
// a copy under a later use that differs (save_pretrained of an untied model writes
// every layer's own) is that layer's own block; copies equal in dtype, shape and bytes
// to an earlier use's are one tensor, loaded, counted and fingerprinted once (under
// the earlier name), and a layer whose every tensor is such runs the earlier block
// (shared_blocks() holds the distinct ones). A stored shared_transformer tensor of
// the wrong shape is refused (transformers' load fails), used or not; one that
// transformers' module lacks (another block's adapter index) is unexpected.
// Falcon-H1 (FalconH1ForCausalLM) as Bamba, except that block 2L holds both
// model.layers.{L}.mamba.* (norm.weight only with mamba_rms_norm) and
// model.layers.{L}.self_attn.*.
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
// Qwen3-Next and Qwen3.5 (Qwen3NextForCausalLM, Qwen3_5ForCausalLM,
// Qwen3_5MoeForConditionalGeneration; engine/qwen3_next_config.h), decoder layer
// L = blocks 2L and 2L + 1, under P = model. or model.language_model. (the
// image-text form, whose vision tower model.visual.* is not read):
//   P.layers.{L}.input_layernorm.weight, then P.layers.{L}.linear_attn.* (Gated
//   DeltaNet: in_proj_qkvz + in_proj_ba, or in_proj_qkv + in_proj_z +
//   in_proj_b + in_proj_a; conv1d, dt_bias, A_log, norm, out_proj) or
//   P.layers.{L}.self_attn.{q,k,v,o}_proj, q_norm, k_norm (q_proj [2 * q_dim, hidden]);
//   P.layers.{L}.post_attention_layernorm.weight, then P.layers.{L}.mlp.*: a
//   dense {gate,up,down}_proj, or gate.weight (router), experts.{e}.{gate,up,down}_proj
//   (or the fused experts.gate_up_proj / experts.down_proj), shared_expert.*,
//   shared_expert_gate.weight;
//   P.norm.weight. Their RMSNorm weights (layer norms, the final norm, q_norm,
//   k_norm) are zero-centred: held as 1 + w, computed in fp32 as transformers
//   does. MTP tensors (mtp.*) are not read.
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

// A weight matrix as it stays resident: fp32, or the checkpoint's bfloat16 bit
// patterns (the high 16 bits of an fp32). At most one of the two is non-empty;
// both are empty for an absent tensor.
struct WeightMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  bool is_bf16() const { return !bf16.empty(); }
  bool empty() const { return f32.empty() && bf16.empty(); }
  size_t size() const { return is_bf16() ? bf16.size() : f32.size(); }
  int64_t bytes() const { return static_cast<int64_t>(f32.size() * sizeof(float) + bf16.size() * sizeof(uint16_t)); }
  // The values widened to fp32 (exact).
  std::vector<float> ToFloat32() const;
};

// Member names follow the checkpoint (and the math) rather than snake_case.
struct Mamba2LayerWeights {
  WeightMatrix in_proj;              // [in_proj_rows, hidden]; rows [z | x | B | C | dt]
  std::vector<float> in_proj_bias;   // [in_proj_rows] if use_in_proj_bias, else empty
  std::vector<float> conv1d_weight;  // [conv_dim, conv_kernel] (file: [conv_dim, 1, conv_kernel])
  std::vector<float> conv1d_bias;    // [conv_dim] if use_conv_bias, else empty
  std::vector<float> dt_bias;        // [num_heads]
  std::vector<float> A_log;          // [num_heads]; A = -exp(A_log)
  std::vector<float> D;              // [num_heads]; skip connection
  std::vector<float> norm;           // [d_inner]; gated RMSNorm weight (empty without the norm)
  WeightMatrix out_proj;             // [hidden, d_inner]
  std::vector<float> out_proj_bias;  // [hidden] if use_out_proj_bias, else empty
};

struct AttentionLayerWeights {
  WeightMatrix q_proj;  // [num_heads * head_dim, hidden]
  WeightMatrix k_proj;  // [num_kv_heads * head_dim, hidden]
  WeightMatrix v_proj;  // [num_kv_heads * head_dim, hidden]
  WeightMatrix o_proj;  // [hidden, num_heads * head_dim]
  // [q_dim], [kv_dim], [kv_dim], [hidden] if AttentionParams::use_bias, else empty.
  std::vector<float> q_proj_bias, k_proj_bias, v_proj_bias, o_proj_bias;
  // AttentionParams::output_gate (Qwen): the gate rows of the stored q_proj,
  // which interleaves them per head ([q_h | gate_h]); q_proj above holds the
  // query rows alone. [q_dim, hidden] and [q_dim] (with use_bias); else empty.
  WeightMatrix gate_proj;
  std::vector<float> gate_proj_bias;
  // AttentionParams::qk_norm: [head_dim] each, stored as 1 + w (Qwen's
  // zero-centred RMSNorm); else empty.
  std::vector<float> q_norm, k_norm;
};

// A Gated DeltaNet mixer (GatedDeltaNetParams). The input projections are
// held as one matrix in the engine's row order [q | k | v | z | b | a] (all
// heads of each part in order): Qwen3-Next's in_proj_qkvz / in_proj_ba, which
// interleave the parts per key head, and Qwen3.5's in_proj_qkv, in_proj_z,
// in_proj_b, in_proj_a are put into it row by row (values unchanged).
struct GatedDeltaNetLayerWeights {
  WeightMatrix in_proj;              // [in_proj_rows, hidden]
  std::vector<float> conv1d_weight;  // [conv_dim, conv_kernel] (file: [conv_dim, 1, conv_kernel]); no bias
  std::vector<float> dt_bias;        // [num_v_heads]
  std::vector<float> A_log;          // [num_v_heads]
  std::vector<float> norm;           // [value_dim]: the file's [v_head_dim] repeated per value head
  WeightMatrix out_proj;             // [hidden, value_dim]
};

struct MlpLayerWeights {
  WeightMatrix up_proj;               // [intermediate, hidden]
  std::vector<float> up_proj_bias;    // [intermediate] if mlp_bias, else empty
  WeightMatrix down_proj;             // [hidden, intermediate]
  std::vector<float> down_proj_bias;  // [hidden] if mlp_bias, else empty
};

// down(silu(gate(x)) * up(x)).
struct GatedMlpLayerWeights {
  WeightMatrix gate_up;               // [2 * intermediate, hidden]: rows [gate | up]
  std::vector<float> gate_up_bias;    // [2 * intermediate] if biased, else empty
  WeightMatrix down_proj;             // [hidden, intermediate]
  std::vector<float> down_proj_bias;  // [hidden] if biased, else empty
};

// The up projections' rows are [gate | up] per expert for SwiGLU experts
// (Granite), up alone for relu2 experts (Nemotron-H): MoeParams::up_rows.
// d = MoeParams::expert_dim(hidden): the latent size with latent projections, else hidden.
struct MoeLayerWeights {
  // [num_experts, hidden]; with MoeParams::shared_gate, [num_experts + 1, hidden],
  // the shared expert's gate (shared_expert_gate.weight) the last row.
  WeightMatrix router;
  std::vector<float> router_bias;  // [num_experts]: e_score_correction_bias (Nemotron-H), else empty
  WeightMatrix latent_in;          // [latent, hidden]: fc1_latent_proj; empty without latent projections
  WeightMatrix latent_out;         // [hidden, latent]: fc2_latent_proj
  WeightMatrix experts_up;         // [num_experts * up_rows(inter), d]
  WeightMatrix experts_down;       // [num_experts * d, inter]: expert e's rows [e * d, ...)
  WeightMatrix shared_up;          // [up_rows(shared), hidden]; empty without a shared expert
  WeightMatrix shared_down;        // [hidden, shared]
  // [up_rows(shared)] and [hidden] if MoeParams::shared_bias, else empty.
  std::vector<float> shared_up_bias, shared_down_bias;
};

// A low-rank adapter: y += up(down(x)); both empty for a use without one.
struct LoraWeights {
  WeightMatrix down;  // [rank, in]
  WeightMatrix up;    // [out, rank]
};

// Zamba2: one shared transformer block, its weights used by every hybrid
// layer of its memory block that runs the same tensors (see the top).
struct ZambaSharedBlockWeights {
  std::vector<float> input_norm;    // [2 * hidden]
  AttentionLayerWeights attention;  // q/k/v [*, 2 * hidden], o [hidden, q_dim]
  std::vector<float> pre_ff_norm;   // [hidden]
  GatedMlpLayerWeights mlp;         // gate_up [2 * inter, hidden], down [hidden, inter]
};

// Zamba2: a hybrid layer, use `use` of memory block `mem_block`, running
// shared_blocks()[block].
struct ZambaHybridLayerWeights {
  int64_t use = 0;
  int64_t mem_block = 0;                        // use % num_mem_blocks
  int64_t block = 0;                            // index into ModelWeights::shared_blocks()
  LoraWeights q_adapter, k_adapter, v_adapter;  // empty without use_shared_attention_adapter
  LoraWeights gate_up_adapter;
  WeightMatrix linear;            // [hidden, hidden]: the block's output projection
  std::vector<float> mamba_norm;  // [hidden]: RMSNorm of (hidden + linear(block output))
  Mamba2LayerWeights mamba;
};

// Falcon-H1: both mixers of a decoder layer.
struct ParallelLayerWeights {
  Mamba2LayerWeights mamba;
  AttentionLayerWeights attention;
};

struct LayerWeights {
  LayerKind kind = LayerKind::kMamba2;
  std::vector<float> norm;  // [hidden]; RMSNorm before the block
  std::variant<Mamba2LayerWeights, AttentionLayerWeights, MlpLayerWeights, GatedMlpLayerWeights, MoeLayerWeights,
               ParallelLayerWeights, ZambaHybridLayerWeights, GatedDeltaNetLayerWeights>
      mixer;

  // Precondition: `kind` matches (checked by std::get).
  const Mamba2LayerWeights& mamba2() const { return std::get<Mamba2LayerWeights>(mixer); }
  const AttentionLayerWeights& attention() const { return std::get<AttentionLayerWeights>(mixer); }
  const MlpLayerWeights& mlp() const { return std::get<MlpLayerWeights>(mixer); }
  const GatedMlpLayerWeights& gated_mlp() const { return std::get<GatedMlpLayerWeights>(mixer); }
  const MoeLayerWeights& moe() const { return std::get<MoeLayerWeights>(mixer); }
  const ParallelLayerWeights& parallel() const { return std::get<ParallelLayerWeights>(mixer); }
  const ZambaHybridLayerWeights& zamba_hybrid() const { return std::get<ZambaHybridLayerWeights>(mixer); }
  const GatedDeltaNetLayerWeights& gated_deltanet() const { return std::get<GatedDeltaNetLayerWeights>(mixer); }
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
  const WeightMatrix& embeddings() const { return embeddings_; }  // [vocab, hidden]
  const std::vector<float>& norm_f() const { return norm_f_; }    // [hidden]
  // [vocab, hidden]; the embeddings object itself when the model is tied and
  // stores no head of its own (none, or an exact copy of the embeddings).
  const WeightMatrix& lm_head() const { return tied_ ? embeddings_ : lm_head_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const LayerWeights& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }
  // Zamba2's distinct shared blocks, in order of first use (empty for other families).
  const std::vector<ZambaSharedBlockWeights>& shared_blocks() const { return shared_blocks_; }

  // XXH3-128 over the config's CanonicalString() and, per tensor in canonical
  // name order (prefix stripped), its name, dtype, shape and stored bytes. Equal
  // for the same model in any sharding or prefix; differs for another dtype.
  // Every tensor the model uses is covered: a stored lm_head.weight that is the
  // head (above) is hashed like any other; an exact copy of tied embeddings is
  // not hashed again (the same model as without it), nor is a Zamba2 shared-block
  // tensor equal to an earlier use's, nor one no layer runs.
  const common::Hash128& fingerprint() const { return fingerprint_; }
  // Number of distinct parameters (a head that is the embeddings counted once).
  int64_t num_parameters() const { return num_parameters_; }
  // Whether any matrix is kept in bf16.
  bool has_bf16_matrices() const { return has_bf16_; }
  // Resident bytes of every distinct tensor (what the weights cost in memory).
  int64_t resident_bytes() const { return resident_bytes_; }

 private:
  class Loader;
  ModelWeights() = default;

  ModelConfig config_;
  WeightMatrix embeddings_;
  std::vector<float> norm_f_;
  WeightMatrix lm_head_;  // empty when tied_
  bool tied_ = false;     // lm_head() is embeddings_
  std::vector<LayerWeights> layers_;
  std::vector<ZambaSharedBlockWeights> shared_blocks_;
  common::Hash128 fingerprint_;
  int64_t num_parameters_ = 0;
  bool has_bf16_ = false;
  int64_t resident_bytes_ = 0;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_H_
