#include "engine/mamba2_layer.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/activation_params.h"
#include "kernels/conv1d_params.h"
#include "kernels/norm_params.h"
#include "kernels/ssd_params.h"

namespace hybridserve::engine {
namespace {

// Workspace buffers.
constexpr WorkspaceBuffer kProj = kScratch0;  // [n, in_proj_rows]: z | xBC | dt_raw
constexpr WorkspaceBuffer kXbc = kScratch1;   // [n, conv_dim]: conv output x | B | C
constexpr WorkspaceBuffer kDt = kScratch2;    // [n, n_heads]
constexpr WorkspaceBuffer kY = kScratch3;     // [n, d_inner]

class Mamba2LayerRunner final : public LayerRunner {
 public:
  Mamba2LayerRunner(const ModelConfig& config, const DeviceMamba2Weights& w, int64_t state_layer, const LayerEnv& env)
      : config_(config),
        p_(config.mamba),
        w_(w),
        state_layer_(state_layer),
        env_(WithOutputMultiplier(env, config.mamba.out_multiplier)) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    const int64_t n = seg.n_tokens;
    ASSIGN_OR_RETURN(float* proj, Project(normed, n));

    ASSIGN_OR_RETURN(float* xbc, env_.workspace->Get<float>(kXbc, n * p_.conv_dim()));
    kernels::CausalConv1dParams conv;
    conv.x = proj + p_.d_inner();
    conv.x_token_stride = rows();
    conv.weight = w_.conv1d_weight;
    conv.bias = w_.conv1d_bias;
    conv.conv_state = env_.state_slots->conv(state_layer_, seg.state_slot);
    conv.out = xbc;
    conv.seqlen = n;
    conv.channels = p_.conv_dim();
    conv.d_conv = p_.conv_kernel;
    conv.silu = true;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->CausalConv1d(conv), "CausalConv1d"));

    ASSIGN_OR_RETURN(float* dt, Dt(proj, n, p_.prefill_dt_clamp));

    ASSIGN_OR_RETURN(float* y, env_.workspace->Get<float>(kY, n * p_.d_inner()));
    float* state = env_.state_slots->ssm(state_layer_, seg.state_slot);
    kernels::SsdChunkScanParams scan;
    scan.x = xbc;
    scan.x_token_stride = p_.conv_dim();
    scan.dt = dt;
    scan.A = w_.A;
    scan.B = xbc + p_.d_inner();
    scan.C = xbc + p_.d_inner() + p_.n_groups * p_.state_size;
    scan.bc_token_stride = p_.conv_dim();
    scan.D = w_.D;
    scan.initial_state = state;
    scan.final_state = state;
    scan.y = y;
    scan.seqlen = n;
    scan.n_heads = p_.num_heads;
    scan.head_dim = p_.head_dim;
    scan.d_state = p_.state_size;
    scan.n_groups = p_.n_groups;
    scan.chunk_size = p_.chunk_size;
    scan.start_pos = seg.start_pos;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->SsdChunkScan(scan), "SsdChunkScan"));

    return GateAndProject(proj, y, n, residual);
  }

  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    const int64_t n = batch.batch;
    ASSIGN_OR_RETURN(float* proj, Project(normed, n));

    ASSIGN_OR_RETURN(float* xbc, env_.workspace->Get<float>(kXbc, n * p_.conv_dim()));
    kernels::CausalConv1dUpdateParams conv;
    conv.x = proj + p_.d_inner();
    conv.x_batch_stride = rows();
    conv.weight = w_.conv1d_weight;
    conv.bias = w_.conv1d_bias;
    conv.conv_state = env_.state_slots->conv_pool(state_layer_);
    conv.state_slots = batch.state_slots;
    conv.out = xbc;
    conv.batch = n;
    conv.num_slots = env_.state_slots->num_slots();
    conv.channels = p_.conv_dim();
    conv.d_conv = p_.conv_kernel;
    conv.silu = true;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->CausalConv1dUpdate(conv), "CausalConv1dUpdate"));

    ASSIGN_OR_RETURN(float* dt, Dt(proj, n, p_.decode_dt_clamp));

    ASSIGN_OR_RETURN(float* y, env_.workspace->Get<float>(kY, n * p_.d_inner()));
    kernels::SelectiveStateUpdateParams step;
    step.state = env_.state_slots->ssm_pool(state_layer_);
    step.state_slots = batch.state_slots;
    step.x = xbc;
    step.x_batch_stride = p_.conv_dim();
    step.dt = dt;
    step.A = w_.A;
    step.B = xbc + p_.d_inner();
    step.C = xbc + p_.d_inner() + p_.n_groups * p_.state_size;
    step.bc_batch_stride = p_.conv_dim();
    step.D = w_.D;
    step.y = y;
    step.batch = n;
    step.num_slots = env_.state_slots->num_slots();
    step.n_heads = p_.num_heads;
    step.head_dim = p_.head_dim;
    step.d_state = p_.state_size;
    step.n_groups = p_.n_groups;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->SelectiveStateUpdate(step), "SelectiveStateUpdate"));

    return GateAndProject(proj, y, n, residual);
  }

 private:
  int64_t rows() const { return p_.in_proj_rows(); }

  // in_proj(in_multiplier * x), its segments [z | x | B | C | dt] times their
  // multipliers (Falcon-H1; all 1 elsewhere), [n, rows] in the kProj buffer.
  absl::StatusOr<float*> Project(const float* normed, int64_t n) {
    ASSIGN_OR_RETURN(const float* x, ScaledInput(env_, normed, n, config_.hidden_size, p_.in_multiplier));
    ASSIGN_OR_RETURN(float* proj, env_.workspace->Get<float>(kProj, n * rows()));
    RETURN_IF_ERROR(Linear(env_, x, n, config_.hidden_size, w_.in_proj, rows(), w_.in_proj_bias, proj,
                           /*accumulate=*/false, "mamba2 in_proj"));
    const int64_t gs = p_.n_groups * p_.state_size;
    const int64_t widths[5] = {p_.d_inner(), p_.d_inner(), gs, gs, p_.num_heads};
    int64_t first = 0;
    for (int s = 0; s < 5; ++s) {
      RETURN_IF_ERROR(ScaleColumns(env_, proj, n, first, widths[s], rows(), p_.segment_multipliers[s]));
      first += widths[s];
    }
    return proj;
  }

  // dt = clamp(softplus(dt_raw + dt_bias)), [n, n_heads] in the kDt buffer.
  absl::StatusOr<float*> Dt(const float* proj, int64_t n, const DtClamp& clamp) {
    ASSIGN_OR_RETURN(float* dt, env_.workspace->Get<float>(kDt, n * p_.num_heads));
    kernels::DtSoftplusParams d;
    d.dt_raw = proj + p_.d_inner() + p_.conv_dim();
    d.dt_raw_row_stride = rows();
    d.dt_bias = w_.dt_bias;
    d.dt = dt;
    d.n_tokens = n;
    d.n_heads = p_.num_heads;
    d.dt_min = clamp.min;
    d.dt_max = clamp.max;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->DtSoftplus(d), "DtSoftplus"));
    return dt;
  }

  // residual += out_proj(gated_rmsnorm(y, z)), or out_proj(y * silu(z))
  // without the norm; y is gated in place.
  absl::Status GateAndProject(const float* proj, float* y, int64_t n, float* residual) {
    if (!p_.gated_norm) {
      kernels::SwiGluParams gate;  // silu(z) * y: the product transformers forms as y * silu(z)
      gate.gate = proj;
      gate.gate_row_stride = rows();
      gate.up = y;
      gate.out = y;
      gate.n_rows = n;
      gate.dim = p_.d_inner();
      RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->SwiGlu(gate), "SwiGlu(mamba2 gate)"));
      return LinearToResidual(env_, y, n, p_.d_inner(), w_.out_proj, config_.hidden_size, w_.out_proj_bias, residual,
                              "mamba2 out_proj");
    }
    kernels::GatedRmsNormParams g;
    g.x = y;
    g.z = proj;
    g.z_row_stride = rows();
    g.weight = w_.norm;
    g.out = y;
    g.n_rows = n;
    g.dim = p_.d_inner();
    g.group_size = p_.norm_group_size;
    g.eps = config_.norm_eps;
    g.norm_before_gate = p_.norm_before_gate;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->GatedRmsNorm(g), "GatedRmsNorm"));
    return LinearToResidual(env_, y, n, p_.d_inner(), w_.out_proj, config_.hidden_size, w_.out_proj_bias, residual,
                            "mamba2 out_proj");
  }

  const ModelConfig& config_;
  const Mamba2Params& p_;
  const DeviceMamba2Weights& w_;
  const int64_t state_layer_;
  const LayerEnv env_;
};

}  // namespace

std::unique_ptr<LayerRunner> NewMamba2LayerRunner(const ModelConfig& config, const DeviceMamba2Weights& weights,
                                                  int64_t state_layer, const LayerEnv& env) {
  return std::make_unique<Mamba2LayerRunner>(config, weights, state_layer, env);
}

}  // namespace hybridserve::engine
