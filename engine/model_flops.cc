#include "engine/model_flops.h"

namespace hybridserve::engine {
namespace {

double D(int64_t v) { return static_cast<double>(v); }

// Every term is an integer product well below 2^53 for any real model, so
// the sums are exact whatever their order.
double Mamba2Flops(const ModelConfig& c) {
  const double h = D(c.hidden_size);
  const Mamba2Params& m = c.mamba;
  const double d_inner = D(m.d_inner());
  const double bc = 2 * D(m.n_groups * m.state_size);
  return 2 * h * (2 * d_inner + bc + D(m.num_heads)) + 2 * (d_inner + bc) * D(m.conv_kernel) +
         4 * d_inner * D(m.state_size) + 2 * d_inner * h;
}

// q, k, v projections (and Qwen's output gate) from `in` channels and o back to hidden_size.
double AttentionProjectionFlops(const ModelConfig& c, double in) {
  const double q = D(c.attention.q_dim());
  const double kv = D(c.attention.kv_dim());
  const double gate = c.attention.output_gate ? q : 0;
  return 2 * in * (q + 2 * kv + gate) + 2 * q * D(c.hidden_size);
}

// in_proj, the conv, the delta rule's four state products per value head
// (decay, S^T k, the rank-1 update, S^T q) and out_proj.
double GatedDeltaNetFlops(const ModelConfig& c) {
  const double h = D(c.hidden_size);
  const GatedDeltaNetParams& g = c.gdn;
  return 2 * h * D(g.in_proj_rows()) + 2 * D(g.conv_dim()) * D(g.conv_kernel) +
         7 * D(g.num_v_heads) * D(g.k_head_dim) * D(g.v_head_dim) + 2 * D(g.value_dim()) * h;
}

// An expert of `inter` reading and writing `dim` channels.
double ExpertFlops(const ModelConfig& c, int64_t dim, int64_t inter) {
  return 2 * D(dim) * D(c.moe.up_rows(inter)) + 2 * D(inter) * D(dim);
}

double MoeFlops(const ModelConfig& c) {
  const double h = D(c.hidden_size);
  const double router = 2 * h * D(c.moe.num_experts);
  const double latent = 4 * h * D(c.moe.latent_size);  // fc1 and fc2; 0 without them
  return router + latent + D(c.moe.top_k) * ExpertFlops(c, c.moe.expert_dim(c.hidden_size), c.moe.intermediate_size) +
         ExpertFlops(c, c.hidden_size, c.moe.shared_intermediate_size);
}

double ZambaSharedFlops(const ModelConfig& c) {
  const double h = D(c.hidden_size);
  const double q = D(c.attention.q_dim());
  const double kv = D(c.attention.kv_dim());
  const double r = D(c.zamba.adapter_rank);
  const double inter = D(c.gated_mlp.intermediate_size);
  const double qkv_adapters = c.zamba.use_adapters ? 2 * (2 * h) * 3 * r + 2 * r * (q + 2 * kv) : 0;
  return AttentionProjectionFlops(c, 2 * h) + qkv_adapters + 6 * h * inter + 2 * h * r + 2 * r * 2 * inter + 2 * h * h;
}

}  // namespace

PrefillCost ModelPrefillCost(const ModelConfig& config) {
  const double h = D(config.hidden_size);
  const double mamba = Mamba2Flops(config);
  const double attention = AttentionProjectionFlops(config, h);
  const double n_mamba = D(config.CountLayers(LayerKind::kMamba2));
  const double n_attention = D(config.CountLayers(LayerKind::kAttention));
  const double n_mlp = D(config.CountLayers(LayerKind::kMlp));
  const double n_gated = D(config.CountLayers(LayerKind::kGatedMlp));
  const double n_moe = D(config.CountLayers(LayerKind::kMoe));
  const double n_parallel = D(config.CountLayers(LayerKind::kParallel));
  const double n_zamba = D(config.CountLayers(LayerKind::kZambaHybrid));
  PrefillCost cost;
  cost.flops_per_token = n_mamba * mamba + n_attention * attention + n_mlp * 4 * h * D(config.mlp.intermediate_size);
  // Kinds a model does not have add nothing (their parameters may be unset).
  if (n_gated > 0) cost.flops_per_token += n_gated * 6 * h * D(config.gated_mlp.intermediate_size);
  if (n_moe > 0) cost.flops_per_token += n_moe * MoeFlops(config);
  if (n_parallel > 0) cost.flops_per_token += n_parallel * (mamba + attention);
  if (n_zamba > 0) cost.flops_per_token += n_zamba * (mamba + ZambaSharedFlops(config));
  const double n_gdn = D(config.CountLayers(LayerKind::kGatedDeltaNet));
  if (n_gdn > 0) cost.flops_per_token += n_gdn * GatedDeltaNetFlops(config);
  cost.flops_per_token_context = 4 * D(config.attention.q_dim()) * (n_attention + n_parallel + n_zamba);
  return cost;
}

}  // namespace hybridserve::engine
