// ModelConfig::CanonicalString: the text the model fingerprint hashes.

#include <string>

#include "absl/strings/str_format.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

std::string ModelConfig::CanonicalString() const {
  // %a prints floats exactly; every part is labelled so no two configs collide.
  std::string out = absl::StrFormat("hybridserve.model_config.v1;family=%s;vocab=%d;hidden=%d;pattern=%s;",
                                    ModelFamilyName(family), vocab_size, hidden_size, LayerPattern());
  if (SsmLayers() > 0) {
    const Mamba2Params& m = mamba;
    absl::StrAppendFormat(&out,
                          "mamba2{heads=%d,head_dim=%d,state=%d,groups=%d,conv=%d,chunk=%d,conv_bias=%d,bias=%d,"
                          "norm_group=%d,prefill_dt=[%a,%a],decode_dt=[%a,%a]};",
                          m.num_heads, m.head_dim, m.state_size, m.n_groups, m.conv_kernel, m.chunk_size,
                          static_cast<int>(m.use_conv_bias), static_cast<int>(m.use_in_proj_bias), m.norm_group_size,
                          m.prefill_dt_clamp.min, m.prefill_dt_clamp.max, m.decode_dt_clamp.min, m.decode_dt_clamp.max);
  }
  if (KvLayers() > 0) {
    absl::StrAppendFormat(&out, "attention{heads=%d,kv_heads=%d,head_dim=%d,rope=%d};", attention.num_heads,
                          attention.num_kv_heads, attention.head_dim, static_cast<int>(attention.use_rope));
  }
  if (CountLayers(LayerKind::kMlp) > 0) {
    absl::StrAppendFormat(&out, "mlp{intermediate=%d,act=%d,bias=%d};", mlp.intermediate_size,
                          static_cast<int>(mlp.activation), static_cast<int>(mlp.use_bias));
  }
  // Appended only where they differ from the first two families' values, so
  // their canonical strings (and model fingerprints) are unchanged.
  if (KvLayers() > 0 && (attention.use_rope || attention.scale != 0.0f)) {
    absl::StrAppendFormat(&out, "attention_ext{rotary_dim=%d,rope_theta=%a,scale=%a};", attention.rotary_dim,
                          attention.rope_theta, attention.scale);
  }
  if (KvLayers() > 0 &&
      (attention.in_multiplier != 1.0f || attention.key_multiplier != 1.0f || attention.out_multiplier != 1.0f)) {
    absl::StrAppendFormat(&out, "attention_mup{in=%a,key=%a,out=%a};", attention.in_multiplier,
                          attention.key_multiplier, attention.out_multiplier);
  }
  // bias= above is in_proj's; out_proj's is stated only where it differs (Falcon-H1).
  if (SsmLayers() > 0 && mamba.use_out_proj_bias != mamba.use_in_proj_bias) {
    absl::StrAppendFormat(&out, "mamba2_out_proj_bias=%d;", static_cast<int>(mamba.use_out_proj_bias));
  }
  if (KvLayers() > 0 && attention.use_bias) absl::StrAppendFormat(&out, "attention_bias=1;");
  if (SsmLayers() > 0 && mamba.gated_norm_eps != 0.0f) {
    absl::StrAppendFormat(&out, "mamba2_norm_eps=%a;", mamba.gated_norm_eps);
  }
  if (SsmLayers() > 0 && (!mamba.gated_norm || mamba.norm_before_gate || mamba.HasMultipliers())) {
    const Mamba2Params& m = mamba;
    absl::StrAppendFormat(&out, "mamba2_ext{gated_norm=%d,norm_before_gate=%d,in=%a,segments=[%a,%a,%a,%a,%a],out=%a};",
                          static_cast<int>(m.gated_norm), static_cast<int>(m.norm_before_gate), m.in_multiplier,
                          m.segment_multipliers[0], m.segment_multipliers[1], m.segment_multipliers[2],
                          m.segment_multipliers[3], m.segment_multipliers[4], m.out_multiplier);
  }
  if (CountLayers(LayerKind::kZambaHybrid) > 0) {
    absl::StrAppendFormat(&out, "zamba{mem_blocks=%d,adapters=%d,rank=%d,act=%d};", zamba.num_mem_blocks,
                          static_cast<int>(zamba.use_adapters), zamba.adapter_rank,
                          static_cast<int>(gated_mlp.activation));
  }
  if (CountLayers(LayerKind::kGatedMlp) > 0 || CountLayers(LayerKind::kZambaHybrid) > 0) {
    absl::StrAppendFormat(&out, "gated_mlp{intermediate=%d,bias=%d,gate_mult=%a,down_mult=%a};",
                          gated_mlp.intermediate_size, static_cast<int>(gated_mlp.use_bias), gated_mlp.gate_multiplier,
                          gated_mlp.down_multiplier);
  }
  if (CountLayers(LayerKind::kMoe) > 0) {
    absl::StrAppendFormat(
        &out,
        "moe{experts=%d,top_k=%d,intermediate=%d,shared=%d,router=%d,expert=%d,groups=%d,topk_groups=%d,"
        "norm_topk=%d,scaling=%a};",
        moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_intermediate_size, static_cast<int>(moe.router),
        static_cast<int>(moe.expert), moe.n_group, moe.topk_group, static_cast<int>(moe.norm_topk_prob),
        moe.routed_scaling_factor);
    // Only with latent projections, so the strings of MoE models without them are unchanged.
    if (moe.latent_size > 0) absl::StrAppendFormat(&out, "moe_latent{size=%d};", moe.latent_size);
    if (moe.shared_bias) absl::StrAppendFormat(&out, "moe_shared_bias=1;");
  }
  if (embedding_multiplier != 1.0f || residual_multiplier != 1.0f || logits_scaling != 1.0f ||
      logits_multiplier != 1.0f) {
    absl::StrAppendFormat(&out, "multipliers{embedding=%a,residual=%a,logits_scaling=%a,logits=%a};",
                          embedding_multiplier, residual_multiplier, logits_scaling, logits_multiplier);
  }
  if (CountLayers(LayerKind::kGatedDeltaNet) > 0) {
    absl::StrAppendFormat(&out, "gated_deltanet{k_heads=%d,v_heads=%d,k_dim=%d,v_dim=%d,conv=%d,chunk=%d};",
                          gdn.num_k_heads, gdn.num_v_heads, gdn.k_head_dim, gdn.v_head_dim, gdn.conv_kernel,
                          gdn.chunk_size);
  }
  if (KvLayers() > 0 && (attention.output_gate || attention.qk_norm)) {
    absl::StrAppendFormat(&out, "attention_gated{output_gate=%d,qk_norm=%d};", static_cast<int>(attention.output_gate),
                          static_cast<int>(attention.qk_norm));
  }
  if (CountLayers(LayerKind::kMoe) > 0 && moe.shared_gate) absl::StrAppendFormat(&out, "moe_shared_gate=1;");
  // Stated for the Qwen families only (their norms are x * (1 + w), the stored w being zero-centred).
  if (IsQwenFamily()) absl::StrAppendFormat(&out, "zero_centred_norms=1;");
  absl::StrAppendFormat(&out, "norm_eps=%a;tied=%d;", norm_eps, static_cast<int>(tie_word_embeddings));
  return out;
}

}  // namespace hybridserve::engine
