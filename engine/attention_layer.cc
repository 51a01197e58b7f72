#include "engine/attention_layer.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/activation_params.h"
#include "kernels/attention_params.h"
#include "kernels/matmul_params.h"
#include "kernels/norm_params.h"

namespace hybridserve::engine {
namespace {

// Workspace buffers.
constexpr WorkspaceBuffer kQkv = kScratch0;         // [n, qkv_rows()]
constexpr WorkspaceBuffer kOut = kScratch1;         // [n, q_dim]
constexpr WorkspaceBuffer kAdapterLow = kScratch2;  // [n, 3 * rank]: the adapters' down projections

class AttentionLayerRunner final : public LayerRunner {
 public:
  AttentionLayerRunner(const ModelConfig& config, const DeviceAttentionWeights& w, int64_t kv_layer,
                       const LayerEnv& env, const AttentionRunnerOptions& options)
      : options_(options),
        config_(config),
        p_(config.attention),
        w_(w),
        kv_layer_(kv_layer),
        env_(WithOutputMultiplier(env, config.attention.out_multiplier)) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    const int64_t n = seg.n_tokens;
    ASSIGN_OR_RETURN(float* qkv, env_.workspace->Get<float>(kQkv, n * qkv_rows()));
    RETURN_IF_ERROR(Project(normed, n, qkv));
    RETURN_IF_ERROR(NormQueriesAndKeys(qkv, n));
    RETURN_IF_ERROR(RotateQueriesAndKeys(qkv, n, /*positions=*/nullptr, seg.start_pos));
    const kernels::PagedKvCache cache = env_.kv_pages->cache(kv_layer_);

    kernels::KvAppendParams append;
    append.cache = cache;
    append.k = qkv + p_.q_dim();
    append.v = qkv + p_.q_dim() + p_.kv_dim();
    append.k_token_stride = qkv_rows();
    append.v_token_stride = qkv_rows();
    append.block_table = seg.block_table;
    append.start_pos = seg.start_pos;
    append.n_tokens = n;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->KvAppend(append), "KvAppend"));

    ASSIGN_OR_RETURN(float* out, env_.workspace->Get<float>(kOut, n * p_.q_dim()));
    kernels::AttentionPrefillParams attn;
    attn.cache = cache;
    attn.q = qkv;
    attn.q_token_stride = qkv_rows();
    attn.out = out;
    attn.block_table = seg.block_table;
    attn.start_pos = seg.start_pos;
    attn.n_tokens = n;
    attn.n_heads = p_.num_heads;
    attn.scale = p_.scale;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->AttentionPrefill(attn), "AttentionPrefill"));
    RETURN_IF_ERROR(GateOutput(qkv, out, n));

    return LinearToResidual(env_, out, n, p_.q_dim(), w_.o_proj, config_.hidden_size, w_.o_proj_bias, residual,
                            "attention o_proj");
  }

  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    const int64_t n = batch.batch;
    ASSIGN_OR_RETURN(float* qkv, env_.workspace->Get<float>(kQkv, n * qkv_rows()));
    RETURN_IF_ERROR(Project(normed, n, qkv));
    RETURN_IF_ERROR(NormQueriesAndKeys(qkv, n));
    RETURN_IF_ERROR(RotateQueriesAndKeys(qkv, n, batch.positions, 0));
    const kernels::PagedKvCache cache = env_.kv_pages->cache(kv_layer_);

    kernels::KvAppendDecodeParams append;
    append.cache = cache;
    append.k = qkv + p_.q_dim();
    append.v = qkv + p_.q_dim() + p_.kv_dim();
    append.k_batch_stride = qkv_rows();
    append.v_batch_stride = qkv_rows();
    append.block_tables = batch.block_tables;
    append.block_table_stride = batch.block_table_stride;
    append.seq_lens = batch.seq_lens;
    append.batch = n;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->KvAppendDecode(append), "KvAppendDecode"));

    ASSIGN_OR_RETURN(float* out, env_.workspace->Get<float>(kOut, n * p_.q_dim()));
    kernels::AttentionDecodeParams attn;
    attn.cache = cache;
    attn.q = qkv;
    attn.q_batch_stride = qkv_rows();
    attn.out = out;
    attn.block_tables = batch.block_tables;
    attn.block_table_stride = batch.block_table_stride;
    attn.seq_lens = batch.seq_lens;
    attn.batch = n;
    attn.n_heads = p_.num_heads;
    attn.scale = p_.scale;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->AttentionDecode(attn), "AttentionDecode"));
    RETURN_IF_ERROR(GateOutput(qkv, out, n));

    return LinearToResidual(env_, out, n, p_.q_dim(), w_.o_proj, config_.hidden_size, w_.o_proj_bias, residual,
                            "attention o_proj");
  }

 private:
  // qkv = qkv_proj(in_multiplier * x) + qkv_bias, the keys times key_multiplier
  // (Falcon-H1; 1 and no bias elsewhere).
  absl::Status Project(const float* normed, int64_t n, float* qkv) {
    const int64_t in = input_dim();
    ASSIGN_OR_RETURN(const float* x, ScaledInput(env_, normed, n, in, p_.in_multiplier));
    RETURN_IF_ERROR(Linear(env_, x, n, in, w_.qkv_proj, qkv_rows(), w_.qkv_bias, qkv,
                           /*accumulate=*/false, "attention qkv_proj"));
    if (options_.adapters != nullptr) RETURN_IF_ERROR(AddAdapters(*options_.adapters, x, n, qkv));
    return ScaleColumns(env_, qkv, n, p_.q_dim(), p_.kv_dim(), qkv_rows(), p_.key_multiplier);
  }

  absl::Status AddAdapters(const QkvAdapters& a, const float* x, int64_t n, float* qkv) {
    const int64_t r = a.rank;
    ASSIGN_OR_RETURN(float* low, env_.workspace->Get<float>(kAdapterLow, n * 3 * r));
    RETURN_IF_ERROR(Linear(env_, x, n, input_dim(), a.down, 3 * r, /*bias=*/nullptr, low, /*accumulate=*/false,
                           "attention adapters down"));
    const DeviceMatrix* ups[3] = {&a.q_up, &a.k_up, &a.v_up};
    const int64_t widths[3] = {p_.q_dim(), p_.kv_dim(), p_.kv_dim()};
    int64_t column = 0;
    for (int part = 0; part < 3; ++part) {
      kernels::MatmulParams m;
      m.a = low + part * r;
      m.lda = 3 * r;
      m.w = ups[part]->f32;
      m.w_bf16 = ups[part]->bf16;
      m.out = qkv + column;
      m.ldo = qkv_rows();
      m.m = n;
      m.n = widths[part];
      m.k = r;
      m.accumulate = true;
      RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->Matmul(m, env_.matmul_mode), "attention adapter up"));
      column += widths[part];
    }
    return absl::OkStatus();
  }

  // qk_norm (Qwen): each head of q and of k RMS-normed by q_norm / k_norm,
  // in place, before RoPE. One call per head: a row's heads sit at a fixed
  // offset in rows of stride qkv_rows().
  absl::Status NormQueriesAndKeys(float* qkv, int64_t n) {
    if (!p_.qk_norm || n == 0) return absl::OkStatus();
    kernels::RmsNormParams norm;
    norm.n_rows = n;
    norm.dim = p_.head_dim;
    norm.eps = config_.norm_eps;
    norm.x_row_stride = qkv_rows();
    norm.out_row_stride = qkv_rows();
    for (int64_t h = 0; h < p_.num_heads + p_.num_kv_heads; ++h) {
      const bool query = h < p_.num_heads;
      float* x = qkv + (query ? h * p_.head_dim : p_.q_dim() + (h - p_.num_heads) * p_.head_dim);
      norm.x = x;
      norm.out = x;
      norm.weight = query ? w_.q_norm : w_.k_norm;
      RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->RmsNorm(norm), query ? "RmsNorm(q_norm)" : "RmsNorm(k_norm)"));
    }
    return absl::OkStatus();
  }

  // output_gate (Qwen): out *= sigmoid(gate), the gate columns following v in the qkv rows.
  absl::Status GateOutput(const float* qkv, float* out, int64_t n) {
    if (!p_.output_gate || n == 0) return absl::OkStatus();
    kernels::SwiGluParams gate;
    gate.gate = qkv + p_.q_dim() + 2 * p_.kv_dim();
    gate.gate_row_stride = qkv_rows();
    gate.gate_activation = kernels::ActivationKind::kSigmoid;
    gate.up = out;
    gate.out = out;
    gate.n_rows = n;
    gate.dim = p_.q_dim();
    return KernelStatusToStatus(env_.backend->SwiGlu(gate), "SwiGlu(attention output gate)");
  }

  // RoPE on the q and k parts of the qkv rows, in place (no-op without RoPE):
  // row t at positions[t], or start_pos + t when positions is null.
  absl::Status RotateQueriesAndKeys(float* qkv, int64_t n, const int64_t* positions, int64_t start_pos) {
    if (!p_.use_rope || n == 0) return absl::OkStatus();
    kernels::RopeParams rope;
    rope.positions = positions;
    rope.start_pos = start_pos;
    rope.n_tokens = n;
    rope.head_dim = p_.head_dim;
    rope.rotary_dim = p_.rotary_dim;
    rope.theta = p_.rope_theta;
    rope.x_token_stride = qkv_rows();
    rope.x = qkv;
    rope.n_heads = p_.num_heads;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->Rope(rope), "Rope(q)"));
    rope.x = qkv + p_.q_dim();
    rope.n_heads = p_.num_kv_heads;
    return KernelStatusToStatus(env_.backend->Rope(rope), "Rope(k)");
  }

  int64_t input_dim() const { return options_.input_dim > 0 ? options_.input_dim : config_.hidden_size; }

  // [q | k | v], then the output gate's columns with output_gate.
  int64_t qkv_rows() const { return p_.q_dim() + 2 * p_.kv_dim() + (p_.output_gate ? p_.q_dim() : 0); }

  const AttentionRunnerOptions options_;
  const ModelConfig& config_;
  const AttentionParams& p_;
  const DeviceAttentionWeights& w_;
  const int64_t kv_layer_;
  const LayerEnv env_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LayerRunner>> NewAttentionLayerRunner(const ModelConfig& config,
                                                                     const DeviceAttentionWeights& weights,
                                                                     int64_t kv_layer, const LayerEnv& env,
                                                                     const AttentionRunnerOptions& options) {
  return std::unique_ptr<LayerRunner>(new AttentionLayerRunner(config, weights, kv_layer, env, options));
}

}  // namespace hybridserve::engine
