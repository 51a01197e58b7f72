#include "engine/gated_deltanet_layer.h"

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/conv1d_params.h"
#include "kernels/gated_delta_params.h"
#include "kernels/norm_params.h"

namespace hybridserve::engine {
namespace {

// Workspace buffers.
constexpr WorkspaceBuffer kProj = kScratch0;   // [n, in_proj_rows]: q | k | v | z | b | a
constexpr WorkspaceBuffer kQkv = kScratch1;    // [n, conv_dim]: the conv output q | k | v
constexpr WorkspaceBuffer kGates = kScratch2;  // g [n, v_heads], then beta [n, v_heads]
constexpr WorkspaceBuffer kOut = kScratch3;    // [n, value_dim]: the rule's output, then normed and gated

class GatedDeltaNetLayerRunner final : public LayerRunner {
 public:
  GatedDeltaNetLayerRunner(const ModelConfig& config, const DeviceGatedDeltaNetWeights& w, int64_t state_layer,
                           const LayerEnv& env)
      : config_(config), p_(config.gdn), w_(w), state_layer_(state_layer), env_(env) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    const int64_t n = seg.n_tokens;
    ASSIGN_OR_RETURN(float* proj, Project(normed, n));

    ASSIGN_OR_RETURN(float* qkv, env_.workspace->Get<float>(kQkv, n * p_.conv_dim()));
    kernels::CausalConv1dParams conv;
    conv.x = proj;
    conv.x_token_stride = rows();
    conv.weight = w_.conv1d_weight;
    conv.conv_state = env_.state_slots->conv(state_layer_, seg.state_slot);
    conv.out = qkv;
    conv.seqlen = n;
    conv.channels = p_.conv_dim();
    conv.d_conv = p_.conv_kernel;
    conv.silu = true;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->CausalConv1d(conv), "CausalConv1d(gated deltanet)"));

    ASSIGN_OR_RETURN(float* g, Gates(proj, n));
    ASSIGN_OR_RETURN(float* o, env_.workspace->Get<float>(kOut, n * p_.value_dim()));
    float* state = env_.state_slots->ssm(state_layer_, seg.state_slot);
    kernels::GatedDeltaParams rule;
    rule.q = qkv;
    rule.k = qkv + p_.key_dim();
    rule.v = qkv + 2 * p_.key_dim();
    rule.q_token_stride = p_.conv_dim();
    rule.k_token_stride = p_.conv_dim();
    rule.v_token_stride = p_.conv_dim();
    rule.g = g;
    rule.beta = g + n * p_.num_v_heads;
    rule.initial_state = state;
    rule.final_state = state;
    rule.o = o;
    rule.seqlen = n;
    rule.n_k_heads = p_.num_k_heads;
    rule.n_v_heads = p_.num_v_heads;
    rule.dk = p_.k_head_dim;
    rule.dv = p_.v_head_dim;
    rule.chunk_size = p_.chunk_size;
    rule.start_pos = seg.start_pos;
    rule.l2norm_qk = true;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->GatedDeltaPrefill(rule), "GatedDeltaPrefill"));
    return NormGateAndProject(proj, o, n, residual);
  }

  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    const int64_t n = batch.batch;
    ASSIGN_OR_RETURN(float* proj, Project(normed, n));

    ASSIGN_OR_RETURN(float* qkv, env_.workspace->Get<float>(kQkv, n * p_.conv_dim()));
    kernels::CausalConv1dUpdateParams conv;
    conv.x = proj;
    conv.x_batch_stride = rows();
    conv.weight = w_.conv1d_weight;
    conv.conv_state = env_.state_slots->conv_pool(state_layer_);
    conv.state_slots = batch.state_slots;
    conv.out = qkv;
    conv.batch = n;
    conv.num_slots = env_.state_slots->num_slots();
    conv.channels = p_.conv_dim();
    conv.d_conv = p_.conv_kernel;
    conv.silu = true;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->CausalConv1dUpdate(conv), "CausalConv1dUpdate(gated deltanet)"));

    ASSIGN_OR_RETURN(float* g, Gates(proj, n));
    ASSIGN_OR_RETURN(float* o, env_.workspace->Get<float>(kOut, n * p_.value_dim()));
    kernels::GatedDeltaDecodeParams step;
    step.state = env_.state_slots->ssm_pool(state_layer_);
    step.state_slots = batch.state_slots;
    step.q = qkv;
    step.k = qkv + p_.key_dim();
    step.v = qkv + 2 * p_.key_dim();
    step.q_batch_stride = p_.conv_dim();
    step.k_batch_stride = p_.conv_dim();
    step.v_batch_stride = p_.conv_dim();
    step.g = g;
    step.beta = g + n * p_.num_v_heads;
    step.o = o;
    step.batch = n;
    step.num_slots = env_.state_slots->num_slots();
    step.n_k_heads = p_.num_k_heads;
    step.n_v_heads = p_.num_v_heads;
    step.dk = p_.k_head_dim;
    step.dv = p_.v_head_dim;
    step.l2norm_qk = true;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->GatedDeltaDecode(step), "GatedDeltaDecode"));
    return NormGateAndProject(proj, o, n, residual);
  }

 private:
  int64_t rows() const { return p_.in_proj_rows(); }

  // in_proj(x), [n, rows] in the kProj buffer.
  absl::StatusOr<float*> Project(const float* normed, int64_t n) {
    ASSIGN_OR_RETURN(float* proj, env_.workspace->Get<float>(kProj, n * rows()));
    RETURN_IF_ERROR(Linear(env_, normed, n, config_.hidden_size, w_.in_proj, rows(), /*bias=*/nullptr, proj,
                           /*accumulate=*/false, "gated deltanet in_proj"));
    return proj;
  }

  // g [n, v_heads] then beta [n, v_heads] in the kGates buffer.
  absl::StatusOr<float*> Gates(const float* proj, int64_t n) {
    const int64_t heads = p_.num_v_heads;
    ASSIGN_OR_RETURN(float* g, env_.workspace->Get<float>(kGates, 2 * n * heads));
    kernels::GatedDeltaGatesParams gates;
    gates.b = proj + p_.conv_dim() + p_.value_dim();
    gates.a = gates.b + heads;
    gates.a_row_stride = rows();
    gates.b_row_stride = rows();
    gates.dt_bias = w_.dt_bias;
    gates.a_log = w_.a_log;
    gates.g = g;
    gates.beta = g + n * heads;
    gates.n_tokens = n;
    gates.n_heads = heads;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->GatedDeltaGates(gates), "GatedDeltaGates"));
    return g;
  }

  // residual += out_proj(rmsnorm(o per value head) * norm * silu(z)); o is normed in place.
  absl::Status NormGateAndProject(const float* proj, float* o, int64_t n, float* residual) {
    kernels::GatedRmsNormParams norm;
    norm.x = o;
    norm.z = proj + p_.conv_dim();
    norm.z_row_stride = rows();
    norm.weight = w_.norm;
    norm.out = o;
    norm.n_rows = n;
    norm.dim = p_.value_dim();
    norm.group_size = p_.v_head_dim;
    norm.eps = config_.norm_eps;
    norm.norm_before_gate = true;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->GatedRmsNorm(norm), "GatedRmsNorm(gated deltanet)"));
    return LinearToResidual(env_, o, n, p_.value_dim(), w_.out_proj, config_.hidden_size, /*bias=*/nullptr, residual,
                            "gated deltanet out_proj");
  }

  const ModelConfig& config_;
  const GatedDeltaNetParams& p_;
  const DeviceGatedDeltaNetWeights& w_;
  const int64_t state_layer_;
  const LayerEnv env_;
};

}  // namespace

std::unique_ptr<LayerRunner> NewGatedDeltaNetLayerRunner(const ModelConfig& config,
                                                         const DeviceGatedDeltaNetWeights& weights, int64_t state_layer,
                                                         const LayerEnv& env) {
  return std::make_unique<GatedDeltaNetLayerRunner>(config, weights, state_layer, env);
}

}  // namespace hybridserve::engine
