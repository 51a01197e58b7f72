#ifndef HYBRIDSERVE_ENGINE_MODEL_FLOPS_H_
#define HYBRIDSERVE_ENGINE_MODEL_FLOPS_H_

// The forward FLOPs of prefilling a model, from its config: what a cache hit
// on a prefix saves. Workers register it with the cachestore (the utility
// eviction's cost model, proto/cachestore.proto ModelCost); the cache
// simulator (bench/cachestore/model_cost.h) uses the same numbers. Pure
// functions; thread-safe.
//
// A token at 0-based position t costs C + A*(t + 1), so a prefix of p tokens
// costs p*C + A*p*(p+1)/2 (PrefillCost::PrefixFlops). Counted: every matrix
// product (a multiply-add is 2 FLOPs) and the Mamba2 scan. Left out: norms,
// activations, RoPE, residual adds, the embedding and the LM head (the head
// runs on the last token only, hit or not). h = hidden_size.
//
// C is the sum over the blocks of their per-token FLOPs:
//   Mamba2 'M'     2*h*(2*d_inner + 2*n_groups*d_state + n_heads)   in_proj
//                + 2*conv_dim*d_conv                               causal conv
//                + 4*d_inner*d_state                               scan, recurrent form (update, read-out)
//                + 2*d_inner*h                                     out_proj
//                  d_inner = n_heads*head_dim, conv_dim = d_inner + 2*n_groups*d_state
//   attention '*'  2*h*(q_dim + 2*kv_dim) + 2*q_dim*h               q, k, v, o projections
//   MLP '-'        4*h*I                                            up, down (I = intermediate_size)
//   gated MLP 'G'  6*h*I                                            gate, up, down
//   MoE 'E'        2*h*E                                            router (E experts)
//                + 4*h*L                                            latent projections fc1, fc2 (L = moe_latent_size, 0
//                without)
//                + top_k * X(d, I) + X(h, I_shared)                 the active experts and the shared one
//                  X(d, i) = 6*d*i (SwiGLU experts) or 4*d*i (relu2 experts); X(d, 0) = 0;
//                  d = L with latent projections, else h
//   parallel 'P'   Mamba2 + attention                               both mixers on the same input (Falcon-H1)
//   Zamba2 'Z'     Mamba2                                           the layer's own mixer
//                + 2*(2h)*(q_dim + 2*kv_dim) + 2*q_dim*h           the shared block's attention over [h | e]
//                + 2*(2h)*3r + 2*r*(q_dim + 2*kv_dim)              its q, k, v adapters (use_adapters only)
//                + 6*h*I + 2*h*r + 2*r*2I                          its gated MLP and gate|up adapter
//                + 2*h*h                                           linear (block output to the Mamba2 input)
//                  r = adapter_rank; q_dim = 2h in Zamba2
// A is the attention's scores and values, 4*q_dim per context token, per
// block that attends: A = 4*q_dim*(attention + parallel + Zamba2 blocks).
// The Mamba2 scan is costed in its recurrent form: the chunked form prefill
// runs spends more on short chunks, but what a cached state saves is the
// same computation however it is scheduled.

#include "common/prefill_cost.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// The cost model of `config` (as validated by ModelConfig::Validate; a
// dimension of a kind the model has no block of is ignored).
PrefillCost ModelPrefillCost(const ModelConfig& config);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_FLOPS_H_
