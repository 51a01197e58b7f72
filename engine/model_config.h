#ifndef HYBRIDSERVE_ENGINE_MODEL_CONFIG_H_
#define HYBRIDSERVE_ENGINE_MODEL_CONFIG_H_

// The architecture of a model, parsed from a Hugging Face `config.json`.
//
// Families of this version (docs/ARCHITECTURE.md section 3):
//   nemotron_h  layer pattern from `hybrid_override_pattern` ("M*M-") and/or
//               `layers_block_type` (["mamba"|"linear_attention",
//               "attention"|"full_attention", "mlp"]); legacy `mamba_*` names.
//   mamba2      `num_hidden_layers` Mamba2 layers.
//   bamba       each decoder layer is a Mamba2 or attention mixer (attention at
//               `attn_layer_indices`) followed by a gated MLP; partial RoPE.
//   granitemoehybrid  each decoder layer is a Mamba2 or attention mixer
//               (`layer_types`, legacy `layers_block_type`) followed by a mixture
//               of experts with a shared gated MLP, or by the shared MLP alone
//               (`num_local_experts` 0); no RoPE unless position_embedding_type
//               is "rope"; μP multipliers (embedding, residual, attention, logits).
//   falcon_h1   each decoder layer is a parallel block (Mamba2 and attention on
//               the same normed input, their scaled outputs summed) followed by a
//               gated MLP; RoPE; μP multipliers on nearly every projection.
//   zamba2      each layer is a Mamba2 layer ('M') or a hybrid layer ('Z'): one
//               of num_mem_blocks shared transformer blocks (attention then a
//               gated MLP, no residuals inside, over [hidden | embeddings]) with
//               per-use low-rank adapters, projected and added to the Mamba2
//               layer's input (not to the residual). Each hybrid layer keeps its
//               own KV pages; the shared block's weights are reused.
// A model is a list of blocks (`LayerKind`s) plus one parameter struct per kind
// (all blocks of a kind share their hyper-parameters). Each block is an RMSNorm,
// its computation, and a residual add. Nemotron-H and Mamba2 layers are one block
// each; a Bamba or Granite decoder layer i is two blocks, 2i (the mixer, after
// input_layernorm) and 2i + 1 (the feed-forward part, after pre_ff_layernorm /
// post_attention_layernorm). A new family (Zamba2, Falcon-H1) adds kinds and
// their structs.
//
// Math that the reference implementation (transformers 5.23, fp32) fixes and a
// config file does not state is recorded here too, so the engine reads one place:
// see `Mamba2Params::norm_group_size`, `prefill_dt_clamp` and `decode_dt_clamp`,
// `AttentionParams::use_rope`.
//
// Field rules: a shape-defining dimension (vocab_size, hidden_size, head counts,
// head and state sizes, n_groups, intermediate_size, the layer pattern) is
// required, since a default would silently describe a different checkpoint;
// every other field takes transformers' default when absent.
//
// Errors: an inconsistent or malformed value is INVALID_ARGUMENT naming the
// field; a well-formed feature this version cannot run (MoE layers, another
// model_type, another activation) is UNIMPLEMENTED naming the field.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridserve::engine {

enum class ModelFamily {
  kNemotronH,         // model_type "nemotron_h"
  kMamba2,            // model_type "mamba2"
  kBamba,             // model_type "bamba"
  kGraniteMoeHybrid,  // model_type "granitemoehybrid"
  kFalconH1,          // model_type "falcon_h1"
  kZamba2,            // model_type "zamba2"
  kQwen3Next,         // model_type "qwen3_next"
  kQwen3_5,           // model_type "qwen3_5" / "qwen3_5_text" (dense)
  kQwen3_5Moe,        // model_type "qwen3_5_moe" / "qwen3_5_moe_text"
};

// What a layer computes between its pre-norm and its residual add.
enum class LayerKind {
  kMamba2,         // Mamba2 mixer (SSD), parameters in Mamba2Params
  kAttention,      // causal grouped-query attention, parameters in AttentionParams
  kMlp,            // two-matrix MLP, parameters in MlpParams
  kGatedMlp,       // SwiGLU MLP down(silu(gate(x)) * up(x)), parameters in GatedMlpParams
  kMoe,            // mixture of experts (+ shared expert), parameters in MoeParams
  kParallel,       // a Mamba2 mixer and attention on the same input, outputs summed (Falcon-H1)
  kZambaHybrid,    // Zamba2's hybrid layer: a shared attention block's output added to a Mamba2 layer's input
  kGatedDeltaNet,  // Gated DeltaNet mixer (Qwen3-Next, Qwen3.5), parameters in GatedDeltaNetParams
};

absl::string_view ModelFamilyName(ModelFamily family);  // "nemotron_h", "mamba2", "bamba", "granitemoehybrid"
absl::string_view LayerKindName(LayerKind kind);        // "mamba2", "attention", "mlp", "gated_mlp", "moe"
// One character per block: 'M' Mamba2, '*' attention, '-' MLP (Nemotron-H's
// hybrid_override_pattern alphabet), 'G' gated MLP, 'E' mixture of experts,
// 'P' parallel Mamba2 + attention, 'Z' Zamba2 hybrid (shared block + Mamba2),
// 'D' Gated DeltaNet.
char LayerKindSymbol(LayerKind kind);

// Clamp applied to dt = softplus(dt_raw + dt_bias) before discretization.
// {0, +inf} is a no-op (softplus is positive).
struct DtClamp {
  float min = 0.0f;
  float max = std::numeric_limits<float>::infinity();

  bool IsNoOp() const { return min <= 0.0f && max == std::numeric_limits<float>::infinity(); }
};

// Hyper-parameters of every Mamba2 mixer of the model.
// in_proj rows are [z (d_inner) | x (d_inner) | B (n_groups*state_size) |
// C (n_groups*state_size) | dt (num_heads)]; the conv runs over [x | B | C].
struct Mamba2Params {
  int64_t num_heads = 0;    // nemotron_h: mamba_num_heads; mamba2: num_heads
  int64_t head_dim = 0;     // nemotron_h: mamba_head_dim; mamba2: head_dim
  int64_t state_size = 0;   // d_state (nemotron_h: ssm_state_size)
  int64_t n_groups = 0;     // B/C groups; num_heads % n_groups == 0
  int64_t conv_kernel = 4;  // d_conv
  int64_t chunk_size = 0;   // SSD chunk, a power of two
  bool use_conv_bias = true;
  // Biases of in_proj and of out_proj. One config field sets both (use_bias,
  // mamba_proj_bias), except Falcon-H1's: mamba_proj_bias for in_proj,
  // projectors_bias for out_proj.
  bool use_in_proj_bias = false;
  bool use_out_proj_bias = false;
  // Gated RMSNorm out = RMSNorm(y * silu(z)) * weight, normalized over groups of
  // this many consecutive channels of d_inner: d_inner / n_groups for both
  // Nemotron-H and transformers' Mamba2 (checked against the golden fixtures).
  int64_t norm_group_size = 0;
  // dt clamps of the reference. Nemotron-H: prefill (chunked scan) clamps to
  // >= time_step_min and ignores time_step_limit; the one-token decode step
  // does not clamp. Mamba2: prefill clamps to time_step_limit (default
  // [0, inf]); decode does not clamp.
  DtClamp prefill_dt_clamp;
  DtClamp decode_dt_clamp;
  // As stated by the config (initialisation ranges; the clamps above derive from them).
  float time_step_min = 0.001f;
  float time_step_max = 0.1f;
  DtClamp time_step_limit;
  // The gated norm: RMSNorm with `norm` weights (norm_before_gate false:
  // RMSNorm(y * silu(z)); true: RMSNorm(y) * silu(z)), or, without it
  // (Falcon-H1's mamba_rms_norm false), y * silu(z) and no norm weights.
  bool gated_norm = true;
  bool norm_before_gate = false;
  // Falcon-H1's multipliers (1 elsewhere): the input is multiplied by
  // in_multiplier before in_proj; in_proj's output segments [z | x | B | C | dt]
  // by segment_multipliers; the output by out_multiplier before the residual add.
  float in_multiplier = 1.0f;
  float segment_multipliers[5] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  float out_multiplier = 1.0f;
  // The gated norm's epsilon; 0: the model's norm_eps (Zamba2 fixes 1e-5).
  float gated_norm_eps = 0.0f;

  bool HasMultipliers() const {
    bool any = in_multiplier != 1.0f || out_multiplier != 1.0f;
    for (float m : segment_multipliers) any = any || m != 1.0f;
    return any;
  }
  int64_t d_inner() const { return num_heads * head_dim; }
  int64_t conv_dim() const { return d_inner() + 2 * n_groups * state_size; }
  int64_t in_proj_rows() const { return d_inner() + conv_dim() + num_heads; }
  int64_t heads_per_group() const { return n_groups > 0 ? num_heads / n_groups : 0; }
};

// Hyper-parameters of every attention layer. Bamba, Granite and Falcon-H1 run
// attention biases (attention_bias: q, k, v and o projections); Nemotron-H's
// attention has none whatever its config says (transformers builds none).
// Nemotron-H and Granite (position_embedding_type null or "nope") have no position
// encoding; Bamba rotates the first half of each head (rotate-half RoPE,
// partial_rotary_factor 0.5, fixed by transformers); Granite with
// position_embedding_type "rope" rotates all of it. Scores are scaled by
// `scale` (Granite's attention_multiplier), or head_dim^-0.5 when it is 0.
struct AttentionParams {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // num_heads % num_kv_heads == 0
  int64_t head_dim = 0;
  bool use_rope = false;
  int64_t rotary_dim = 0;  // even, <= head_dim, when use_rope
  double rope_theta = 10000.0;
  float scale = 0.0f;     // 0: head_dim^-0.5
  bool use_bias = false;  // biases of q_proj, k_proj, v_proj and o_proj
  // Falcon-H1 (1 elsewhere): the input is multiplied by in_multiplier, the keys
  // (before RoPE) by key_multiplier, the output by out_multiplier before the
  // residual add.
  float in_multiplier = 1.0f;
  float key_multiplier = 1.0f;
  float out_multiplier = 1.0f;
  // Qwen3-Next / Qwen3.5 gated attention (false elsewhere): q_proj also
  // yields a gate per query channel (stored interleaved per head, [q_h | gate_h]),
  // and the output is attn * sigmoid(gate) before o_proj (output_gate); each
  // head of q and k is RMS-normed by q_norm / k_norm before RoPE (qk_norm).
  bool output_gate = false;
  bool qk_norm = false;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t group_size() const { return num_kv_heads > 0 ? num_heads / num_kv_heads : 0; }
};

enum class MlpActivation {
  kRelu2,  // "relu2": down(relu(up(x))^2)
};

// Hyper-parameters of every MLP layer: down(act(up(x))), no gate matrix.
struct MlpParams {
  int64_t intermediate_size = 0;
  MlpActivation activation = MlpActivation::kRelu2;
  bool use_bias = false;  // mlp_bias: biases of up_proj and down_proj
};

// Hyper-parameters of every gated MLP block: down(silu(gate(x)) * up(x)).
// Bamba's feed_forward (gate_proj, up_proj, down_proj, biases with mlp_bias);
// Granite's shared_mlp (input_linear = [gate | up], output_linear; no biases).
// Falcon-H1 scales the gate before silu and the output before the residual add.
// The gate's activation: silu (SwiGLU), or gelu (erf form; Zamba2).
enum class GateActivation {
  kSilu,
  kGelu,
};

struct GatedMlpParams {
  int64_t intermediate_size = 0;
  bool use_bias = false;
  GateActivation activation = GateActivation::kSilu;
  float gate_multiplier = 1.0f;
  float down_multiplier = 1.0f;
};

// How a mixture-of-experts block picks and weighs its experts.
enum class MoeRouter {
  // Granite: top_k of the router logits (largest first), then a softmax over
  // those k logits.
  kTopKSoftmax,
  // Nemotron-H (DeepSeek-V3 style): scores = sigmoid(logits); choice = scores +
  // e_score_correction_bias; the experts split into n_group groups, a group
  // scored by the sum of its two best choices, the topk_group best groups
  // kept; the top_k best choices among their experts; weights = their
  // scores, divided by (their sum + 1e-20) when norm_topk_prob, times
  // routed_scaling_factor.
  kSigmoidGroupTopK,
  // Qwen3-Next / Qwen3.5-MoE: a softmax over all router logits (fp32), the
  // top_k largest probabilities (torch.topk's order on the CPU), divided by
  // their sum when norm_topk_prob.
  kSoftmaxTopK,
};

// What an expert (and the shared expert) computes.
enum class ExpertKind {
  kSwiGlu,  // Granite: down(silu(gate(x)) * up(x)), the up projection's rows [gate | up]
  kRelu2,   // Nemotron-H: down(relu(up(x))^2)
};

// Hyper-parameters of every mixture-of-experts block. The block's output is
// sum over the chosen experts e (ascending e) of weight_e * expert_e(x), plus
// the shared expert's output (shared_intermediate_size 0: none). With
// latent_size L > 0 (Nemotron-H's moe_latent_size, transformers 5.23
// NemotronHMoE) the routed experts run in an L-wide latent space:
//   y = fc2(sum over e of weight_e * expert_e(fc1(x))) + shared(x)
// with fc1 [L, hidden] and fc2 [hidden, L] (no biases); the router and the
// shared expert still read x itself.
struct MoeParams {
  int64_t num_experts = 0;
  int64_t top_k = 0;              // 1 <= top_k <= num_experts
  int64_t intermediate_size = 0;  // per expert
  int64_t shared_intermediate_size = 0;
  MoeRouter router = MoeRouter::kTopKSoftmax;
  ExpertKind expert = ExpertKind::kSwiGlu;
  // kSigmoidGroupTopK only.
  int64_t n_group = 1;     // divides num_experts
  int64_t topk_group = 1;  // 1 <= topk_group <= n_group
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  int64_t latent_size = 0;  // 0: no latent projections (moe_latent_size null)
  // The shared expert's up and down biases (Nemotron-H mlp_bias: transformers
  // builds shared_experts as a NemotronHMLP; the routed experts have none).
  bool shared_bias = false;
  // Qwen: the shared expert's output is multiplied by sigmoid(shared_expert_gate(x))
  // ([1, hidden]) before it is added to the routed sum.
  bool shared_gate = false;

  // The width the routed experts read and write: latent_size, else hidden.
  int64_t expert_dim(int64_t hidden) const { return latent_size > 0 ? latent_size : hidden; }
  // Rows of an expert's up projection: 2 * inter for kSwiGlu, inter for kRelu2.
  int64_t up_rows(int64_t inter) const { return expert == ExpertKind::kSwiGlu ? 2 * inter : inter; }
};

// Hyper-parameters of every Gated DeltaNet mixer (transformers'
// Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet; kernels/gated_delta_params.h):
//   [q | k | v | z | b | a] = in_proj(x)   (the loader puts Qwen3-Next's per-key-head
//                                           interleaving and Qwen3.5's four matrices
//                                           into this one row order)
//   qkv = silu(causal_conv1d(q | k | v))   conv state [conv_dim, conv_kernel - 1], no bias
//   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
//   o = gated delta rule (l2-normalised q and k; state [num_v_heads, k_head_dim, v_head_dim])
//   out = out_proj(rmsnorm(o per value head) * norm * silu(z))
struct GatedDeltaNetParams {
  int64_t num_k_heads = 0;  // linear_num_key_heads
  int64_t num_v_heads = 0;  // linear_num_value_heads, a multiple of num_k_heads
  int64_t k_head_dim = 0;   // linear_key_head_dim
  int64_t v_head_dim = 0;   // linear_value_head_dim
  int64_t conv_kernel = 4;  // linear_conv_kernel_dim
  // The chunked rule's grid (transformers' torch_chunk_gated_delta_rule: 64);
  // grid checkpoints are multiples of it.
  int64_t chunk_size = 64;

  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t in_proj_rows() const { return conv_dim() + value_dim() + 2 * num_v_heads; }
};

// Zamba2's shared transformer blocks. Block b serves the hybrid layers whose
// use index u (their rank among the hybrid layers) has u % num_mem_blocks == b.
// Its attention reads [hidden | embeddings] (2 * hidden wide) through
// `attention` (head_dim = 2 * hidden / heads, scale (head_dim / 2)^-0.5, RoPE
// when use_mem_rope); its MLP is `gated_mlp`. With adapters, each use has its
// own rank-`adapter_rank` adapters on q, k, v and on the MLP's gate|up.
struct ZambaParams {
  int64_t num_mem_blocks = 0;
  bool use_adapters = false;
  int64_t adapter_rank = 0;
};

// Value type. Obtained from ParseModelConfig / LoadModelConfig, which validate
// it; Validate() re-checks a struct built or edited by hand.
struct ModelConfig {
  ModelFamily family = ModelFamily::kNemotronH;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  std::vector<LayerKind> layers;

  // Meaningful only when `layers` holds a layer of that kind (zero otherwise).
  Mamba2Params mamba;
  AttentionParams attention;
  MlpParams mlp;
  GatedMlpParams gated_mlp;
  MoeParams moe;
  ZambaParams zamba;
  GatedDeltaNetParams gdn;

  // μP multipliers (Granite; 1 elsewhere): the embeddings are multiplied by
  // embedding_multiplier; every block adds residual_multiplier * its output
  // to the residual stream; the logits are divided by logits_scaling.
  float embedding_multiplier = 1.0f;
  float residual_multiplier = 1.0f;
  float logits_scaling = 1.0f;
  // Falcon-H1's lm_head_multiplier: the logits are multiplied by it.
  float logits_multiplier = 1.0f;

  float norm_eps = 1e-5f;         // layer_norm_epsilon: every RMSNorm
  bool residual_in_fp32 = false;  // no effect on fp32 compute
  bool tie_word_embeddings = false;

  std::vector<int64_t> eos_token_ids;  // empty when absent or null
  std::vector<int64_t> bos_token_ids;
  std::vector<int64_t> pad_token_ids;
  int64_t max_position_embeddings = 0;  // 0 when absent
  std::string dtype;                    // `dtype` or legacy `torch_dtype`, "" when absent
  // `_name_or_path` (the hub id or local path save_pretrained recorded), "" when absent.
  std::string name_or_path;
  // What the file holds that the engine reads but does not run, one "key: why"
  // each (Qwen's vision_config, mtp_* settings, ...), for the loader's log. Not
  // in the fingerprint.
  std::vector<std::string> ignored;

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  int64_t CountLayers(LayerKind kind) const;
  // Blocks that keep an SSM state (Mamba2 and parallel blocks) and blocks
  // that keep KV pages (attention and parallel blocks).
  int64_t SsmLayers() const {
    return CountLayers(LayerKind::kMamba2) + CountLayers(LayerKind::kParallel) + CountLayers(LayerKind::kZambaHybrid);
  }
  int64_t KvLayers() const {
    return CountLayers(LayerKind::kAttention) + CountLayers(LayerKind::kParallel) +
           CountLayers(LayerKind::kZambaHybrid);
  }
  // Blocks that keep a recurrent state: the SSM ones and the Gated DeltaNet
  // ones (a model has one kind or the other, never both; Validate()).
  int64_t RecurrentLayers() const { return SsmLayers() + CountLayers(LayerKind::kGatedDeltaNet); }
  // The recurrent layers' chunk grid: Mamba2's chunk_size, the Gated DeltaNet's, or 0 without either.
  int64_t chunk_size() const {
    if (SsmLayers() > 0) return mamba.chunk_size;
    return CountLayers(LayerKind::kGatedDeltaNet) > 0 ? gdn.chunk_size : 0;
  }
  // Qwen3-Next and Qwen3.5: every RMSNorm outside the Gated DeltaNet's gated
  // norm is zero-centred (x * (1 + w)); the loader stores 1 + w.
  bool IsQwenFamily() const {
    return family == ModelFamily::kQwen3Next || family == ModelFamily::kQwen3_5 || family == ModelFamily::kQwen3_5Moe;
  }
  // The layer pattern in hybrid_override_pattern notation, e.g. "M*M-M*-".
  std::string LayerPattern() const;

  // Checks every invariant stated in this file; INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;

  // Deterministic text of every field that changes what the model computes
  // (family, sizes, pattern, kind parameters, norm epsilon, dt clamps, tying).
  // Token ids, max_position_embeddings, dtype and name_or_path are left out: they do not
  // change states. Input of the model fingerprint.
  std::string CanonicalString() const;
};

// Parses and validates the text of a config.json. Accepts the bare tokens
// Infinity, -Infinity and NaN that Python's json module writes, and
// transformers 5's tagged form {"__float__": "Infinity"}.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

// Reads `path` (a config.json) and parses it; NOT_FOUND if it cannot be read.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_CONFIG_H_
