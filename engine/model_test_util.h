#ifndef HYBRIDSERVE_ENGINE_MODEL_TEST_UTIL_H_
#define HYBRIDSERVE_ENGINE_MODEL_TEST_UTIL_H_

// Shared helpers of the Model tests: fixture paths, loading models and golden
// outputs, bitwise and tolerance comparisons. Test-only.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "engine/sequence_state.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace hybridserve::engine::testing {

inline constexpr absl::string_view kNemotronTiny = "tests/fixtures/golden/nemotron_h_tiny";
inline constexpr absl::string_view kMamba2Tiny = "tests/fixtures/golden/mamba2_tiny";
// Nemotron-H with tie_word_embeddings=true and its own stored lm_head.weight.
inline constexpr absl::string_view kNemotronTiedTiny = "tests/fixtures/golden/nemotron_h_tied_tiny";
// Bamba (attention at layer 1; tiny2: attention at 0 and 3, mlp_bias, one kv head).
inline constexpr absl::string_view kBambaTiny = "tests/fixtures/golden/bamba_tiny";
inline constexpr absl::string_view kBambaTiny2 = "tests/fixtures/golden/bamba_tiny2";
// GraniteMoeHybrid: MoE (8 experts, top 2, shared expert, no RoPE) and dense (RoPE, tied).
inline constexpr absl::string_view kGraniteMoeTiny = "tests/fixtures/golden/granite_moe_tiny";
inline constexpr absl::string_view kGraniteDenseTiny = "tests/fixtures/golden/granite_dense_tiny";
// The MoE shape again with position_embedding_type "nope" (as the published
// Granite 4.0-H configs say; no positions), other weights.
inline constexpr absl::string_view kGraniteNopeTiny = "tests/fixtures/golden/granite_nope_tiny";
// Granite with attention biases (attention_bias: q/k/v/o_proj), RoPE, "*M*M", MoE.
inline constexpr absl::string_view kGraniteAttnBiasTiny = "tests/fixtures/golden/granite_attn_bias_tiny";
// Falcon-H1 (parallel Mamba2 + attention, every multiplier distinct): no gated
// norm; tiny2: gated norm before the gate, tied, explicit head_dim; tiny3: gated
// norm after the gate, two norm groups.
inline constexpr absl::string_view kFalconTiny = "tests/fixtures/golden/falcon_h1_tiny";
inline constexpr absl::string_view kFalconTiny2 = "tests/fixtures/golden/falcon_h1_tiny2";
inline constexpr absl::string_view kFalconTiny3 = "tests/fixtures/golden/falcon_h1_tiny3";
// Falcon-H1 with one of the mixer's projection biases: out_proj's alone
// (projectors_bias, no mixer norm) and in_proj's alone (mamba_proj_bias, gated
// norm, and attention biases).
inline constexpr absl::string_view kFalconOutBiasTiny = "tests/fixtures/golden/falcon_h1_out_bias_tiny";
inline constexpr absl::string_view kFalconInBiasTiny = "tests/fixtures/golden/falcon_h1_in_bias_tiny";
// Nemotron-H with MoE ('E') blocks: "ME*E-M", 8 experts top-2 in 2 groups keeping 1,
// norm_topk_prob, scaling 2.5; tiny2: "EM*EME", 16 experts top-4, one group, no norm.
inline constexpr absl::string_view kNemotronMoeTiny = "tests/fixtures/golden/nemotron_h_moe_tiny";
inline constexpr absl::string_view kNemotronMoeTiny2 = "tests/fixtures/golden/nemotron_h_moe_tiny2";
// moe_tiny's shape with MoE latent projections (moe_latent_size 12: experts 12
// wide between fc1_latent_proj [12, 32] and fc2_latent_proj [32, 12]).
inline constexpr absl::string_view kNemotronLatentMoeTiny = "tests/fixtures/golden/nemotron_h_latent_moe_tiny";
// nemotron_h_moe_tiny's shape with mlp_bias: the shared experts' and the MLP
// layer's up/down biases.
inline constexpr absl::string_view kNemotronMoeBiasTiny = "tests/fixtures/golden/nemotron_h_moe_bias_tiny";
// Zamba2: shared attention blocks with per-use adapters (tiny: one block used
// twice, no RoPE; tiny2: two blocks, a hybrid layer first, RoPE).
inline constexpr absl::string_view kZambaTiny = "tests/fixtures/golden/zamba2_tiny";
inline constexpr absl::string_view kZambaTiny2 = "tests/fixtures/golden/zamba2_tiny2";
// Scaled down from a published checkpoint's config (tools/scale_config.py):
// Bamba-9B's config.json as written (attention inside the Mamba2 run, one
// n_group, legacy attn_rotary_emb / mamba_dt_rank, no rope or mlp_bias fields),
// 3 layers "M*M", hidden 64.
inline constexpr absl::string_view kPublicBamba9b = "tests/fixtures/golden/public_bamba_9b";
// Zamba2 as issue 46's testers had it: one block, a hybrid layer first, the
// block's tensors written under every hybrid layer using it, no attention adapters.
inline constexpr absl::string_view kZambaPerUseTiny = "tests/fixtures/golden/zamba2_per_use_tiny";
// Zamba2 untied (tie_word_embeddings false), as save_pretrained writes a randomly
// initialised model: one block used three times, each hybrid layer's its own draw
// under its own index (transformers runs each layer's own), attention adapters.
inline constexpr absl::string_view kZambaUntiedTiny = "tests/fixtures/golden/zamba2_untied_tiny";
// Gated DeltaNet hybrids (issue 50), each as transformers' save_pretrained
// writes it: Qwen3-Next with attention first and MoE in every layer (per-expert
// tensors), and one with dense layers (decoder_sparse_step / mlp_only_layers);
// Qwen3.5 dense in the text-only form (qwen3_5_text, tied); Qwen3.5-MoE in the
// image-text form (qwen3_5_moe, model.language_model.* beside a vision tower).
inline constexpr absl::string_view kQwen3NextTiny = "tests/fixtures/golden/qwen3_next_tiny";
inline constexpr absl::string_view kQwen3NextSparseTiny = "tests/fixtures/golden/qwen3_next_sparse_tiny";
inline constexpr absl::string_view kQwen35Tiny = "tests/fixtures/golden/qwen3_5_tiny";
inline constexpr absl::string_view kQwen35MoeTiny = "tests/fixtures/golden/qwen3_5_moe_tiny";
inline constexpr absl::string_view kDefaultModel = "models/default";
// Golden references of the default model (tools/make_golden.py --only default), without the model.
inline constexpr absl::string_view kDefaultModelGolden = "tests/fixtures/golden/default";

// The weights of a model directory (relative to the runfiles); fails the
// current test (ADD_FAILURE) and returns null on error.
std::unique_ptr<ModelWeights> LoadWeights(absl::string_view model_dir);

// The weights of `model_dir` with every fp32 value cut to its top 16 bits (a
// bf16 value), stored as BF16 tensors (`as_bf16`) or as the same values in
// F32 tensors, written under TEST_TMPDIR and loaded: two checkpoints of
// identical values, one with bf16 matrices and one with fp32. ADD_FAILURE and
// null on error.
std::unique_ptr<ModelWeights> LoadWeightsCutToBf16(absl::string_view model_dir, bool as_bf16);

// A model over `weights`; ADD_FAILURE and null on error.
std::unique_ptr<Model> MakeModel(const ModelWeights& weights, const ModelOptions& options);

// Where a model test runs: the CPU backend, or the CUDA backend built for the
// host emulator (kernels/cuda/emu; every machine) or for the GPU.
enum class TestTarget { kCpu, kCudaEmulated, kCudaGpu };
// "" for kCpu, "CudaEmulated", "CudaGpu": a suffix for test names.
std::string TestTargetName(TestTarget target);
// A fixture directory's last component in CamelCase, for test names:
// ".../nemotron_h_tiny" -> "NemotronHTiny", "models/default" -> "Default".
std::string FixtureTestName(absl::string_view model_dir);
// The backend a test passes as ModelOptions::backend: null for kCpu (the model
// makes its own); for kCudaGpu on a machine without a GPU, null after
// GTEST_SKIP_ with the reason, and *skipped is set (where HS_REQUIRE_GPUS
// declares a GPU: null after a fatal failure, *skipped unset). The backend
// must outlive the models made on it.
std::unique_ptr<kernels::Backend> MakeTargetBackend(TestTarget target, bool* skipped);

// One prompt of golden.safetensors (tools/make_golden.py).
struct GoldenCase {
  std::vector<TokenId> prompt;
  std::vector<float> logits;         // [len, vocab], uncached forward
  std::vector<TokenId> greedy;       // [12], generate(do_sample=False), cached decode
  std::vector<float> greedy_logits;  // [12, vocab]
};
// Every prompt of `model_dir`/golden.safetensors; ADD_FAILURE and empty on error.
std::vector<GoldenCase> LoadGolden(absl::string_view model_dir);

// Seeded uniform token ids in [0, vocab).
std::vector<TokenId> RandomTokens(uint64_t seed, int64_t n, int64_t vocab);

// Index of the largest value (the first on ties).
int64_t ArgMax(absl::Span<const float> row);
// Largest |a[i] - b[i]|; +infinity when the sizes differ or when either input
// holds a NaN or an infinity anywhere, so `MaxAbsDiff(x, y) <= tol` fails on
// non-finite values (std::max(m, NaN) would keep m and hide a NaN).
float MaxAbsDiff(absl::Span<const float> a, absl::Span<const float> b);
// Same size, the same bytes (memcmp: distinguishes -0 from 0), and every value
// finite. Logits and states of a correct model are always finite, so a NaN or
// an infinity at the same index of both inputs is two wrong answers agreeing,
// not a match: it fails, and the message names the first such element.
::testing::AssertionResult BitEqual(absl::Span<const float> a, absl::Span<const float> b);
// Every field bit-identical and finite (as BitEqual); `what` describes the first difference when not.
bool StatesBitEqual(const SequenceState& a, const SequenceState& b, std::string* what);
// Largest absolute difference over the SSM and conv states; +infinity when the
// layer counts differ or any value is non-finite (as MaxAbsDiff).
float StatesMaxAbsDiff(const SequenceState& a, const SequenceState& b);

// Page bytes of pages [0, n_pages) of a sequence; ADD_FAILURE on error.
std::vector<std::string> ExportPages(const Model& model, SequenceId id, int64_t n_pages);
std::vector<absl::string_view> Views(const std::vector<std::string>& pages);

// The model's next token after greedy decoding: feeds argmax(logits) for
// `steps` decode steps and returns the tokens (the first is argmax(logits)).
std::vector<TokenId> GreedyDecode(Model& model, SequenceId id, absl::Span<const float> logits, int steps);

}  // namespace hybridserve::engine::testing

#endif  // HYBRIDSERVE_ENGINE_MODEL_TEST_UTIL_H_
