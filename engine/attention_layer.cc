#include "engine/attention_layer.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/attention.h"

namespace hybridserve::engine {
namespace {

namespace kc = kernels::cpu;

// Workspace buffers.
constexpr int kQkv = 0;  // [n, q_dim + 2 * kv_dim]
constexpr int kOut = 1;  // [n, q_dim]

class AttentionLayerRunner final : public LayerRunner {
 public:
  AttentionLayerRunner(const ModelConfig& config, const AttentionLayerWeights& w, int64_t kv_layer, const LayerEnv& env)
      : config_(config), p_(config.attention), w_(w), kv_layer_(kv_layer), env_(env) {
    // Rows [q | k | v] of one matrix: each output element is the same dot
    // product as with three matrices (bit-identical in deterministic mode).
    qkv_.reserve(w.q_proj.size() + w.k_proj.size() + w.v_proj.size());
    qkv_.insert(qkv_.end(), w.q_proj.begin(), w.q_proj.end());
    qkv_.insert(qkv_.end(), w.k_proj.begin(), w.k_proj.end());
    qkv_.insert(qkv_.end(), w.v_proj.begin(), w.v_proj.end());
  }

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    const int64_t n = seg.n_tokens;
    float* qkv = env_.workspace->Get(kQkv, n * qkv_rows());
    RETURN_IF_ERROR(Linear(env_, normed, n, config_.hidden_size, qkv_, qkv_rows(), /*bias=*/{}, qkv,
                           /*accumulate=*/false, "attention qkv_proj"));
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
    RETURN_IF_ERROR(KernelStatusToStatus(kc::KvAppend(append, env_.pool), "KvAppend"));

    float* out = env_.workspace->Get(kOut, n * p_.q_dim());
    kernels::AttentionPrefillParams attn;
    attn.cache = cache;
    attn.q = qkv;
    attn.q_token_stride = qkv_rows();
    attn.out = out;
    attn.block_table = seg.block_table;
    attn.start_pos = seg.start_pos;
    attn.n_tokens = n;
    attn.n_heads = p_.num_heads;
    RETURN_IF_ERROR(KernelStatusToStatus(kc::AttentionPrefill(attn, env_.pool), "AttentionPrefill"));

    return Linear(env_, out, n, p_.q_dim(), w_.o_proj, config_.hidden_size, /*bias=*/{}, residual,
                  /*accumulate=*/true, "attention o_proj");
  }

  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    const int64_t n = batch.batch;
    float* qkv = env_.workspace->Get(kQkv, n * qkv_rows());
    RETURN_IF_ERROR(Linear(env_, normed, n, config_.hidden_size, qkv_, qkv_rows(), /*bias=*/{}, qkv,
                           /*accumulate=*/false, "attention qkv_proj"));
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
    RETURN_IF_ERROR(KernelStatusToStatus(kc::KvAppendDecode(append, env_.pool), "KvAppendDecode"));

    float* out = env_.workspace->Get(kOut, n * p_.q_dim());
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
    RETURN_IF_ERROR(KernelStatusToStatus(kc::AttentionDecode(attn, env_.pool), "AttentionDecode"));

    return Linear(env_, out, n, p_.q_dim(), w_.o_proj, config_.hidden_size, /*bias=*/{}, residual,
                  /*accumulate=*/true, "attention o_proj");
  }

 private:
  int64_t qkv_rows() const { return p_.q_dim() + 2 * p_.kv_dim(); }

  const ModelConfig& config_;
  const AttentionParams& p_;
  const AttentionLayerWeights& w_;
  const int64_t kv_layer_;
  const LayerEnv env_;
  std::vector<float> qkv_;  // [q_dim + 2 * kv_dim, hidden]
};

}  // namespace

absl::StatusOr<std::unique_ptr<LayerRunner>> NewAttentionLayerRunner(const ModelConfig& config,
                                                                     const AttentionLayerWeights& weights,
                                                                     int64_t kv_layer, const LayerEnv& env) {
  if (config.attention.use_rope) {
    return absl::UnimplementedError("attention with RoPE is not supported by this engine version");
  }
  return std::unique_ptr<LayerRunner>(new AttentionLayerRunner(config, weights, kv_layer, env));
}

}  // namespace hybridserve::engine
