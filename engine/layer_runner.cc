#include "engine/layer_runner.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/activation_params.h"
#include "kernels/matmul_params.h"
#include "kernels/rows_params.h"

namespace hybridserve::engine {

absl::StatusOr<void*> Workspace::GetBytes(WorkspaceBuffer index, int64_t bytes) {
  kernels::DeviceBuffer& b = buffers_[static_cast<size_t>(index)];
  if (b.bytes() < bytes) {
    b.Reset();  // free first: the old contents are not kept
    ++generation_;
    RETURN_IF_ERROR(KernelStatusToStatus(backend_.Allocate(bytes, &b),
                                         absl::StrCat("growing workspace buffer ", index, " to ", bytes, " bytes")));
  }
  return b.data();
}

absl::StatusOr<void*> Workspace::UploadBytes(WorkspaceBuffer index, const void* host, int64_t bytes) {
  ASSIGN_OR_RETURN(void* device, GetBytes(index, bytes));
  RETURN_IF_ERROR(
      KernelStatusToStatus(backend_.CopyToDevice(device, host, bytes), absl::StrCat("uploading index array ", index)));
  return device;
}

absl::StatusOr<const int32_t*> Workspace::Upload(WorkspaceBuffer index, const int32_t* host, int64_t count) {
  ASSIGN_OR_RETURN(void* device, UploadBytes(index, host, count * static_cast<int64_t>(sizeof(int32_t))));
  return static_cast<const int32_t*>(device);
}

absl::StatusOr<const int64_t*> Workspace::Upload(WorkspaceBuffer index, const int64_t* host, int64_t count) {
  ASSIGN_OR_RETURN(void* device, UploadBytes(index, host, count * static_cast<int64_t>(sizeof(int64_t))));
  return static_cast<const int64_t*>(device);
}

absl::StatusOr<const float*> Workspace::Upload(WorkspaceBuffer index, const float* host, int64_t count) {
  ASSIGN_OR_RETURN(void* device, UploadBytes(index, host, count * static_cast<int64_t>(sizeof(float))));
  return static_cast<const float*>(device);
}

kernels::MatmulParams LinearParams(const float* a, int64_t m, int64_t k, const DeviceMatrix& w, int64_t n,
                                   const float* bias, float* out, bool accumulate) {
  kernels::MatmulParams p;
  p.a = a;
  p.w = w.f32;
  p.w_bf16 = w.bf16;
  p.bias = bias;
  p.out = out;
  p.m = m;
  p.n = n;
  p.k = k;
  p.accumulate = accumulate;
  return p;
}

absl::Status Linear(const LayerEnv& env, const float* a, int64_t m, int64_t k, const DeviceMatrix& w, int64_t n,
                    const float* bias, float* out, bool accumulate, absl::string_view what) {
  return KernelStatusToStatus(env.backend->Matmul(LinearParams(a, m, k, w, n, bias, out, accumulate), env.matmul_mode),
                              what);
}

absl::Status LinearToResidual(const LayerEnv& env, const float* a, int64_t m, int64_t k, const DeviceMatrix& w,
                              int64_t n, const float* bias, float* residual, absl::string_view what) {
  if (env.residual_multiplier == 1.0f) return Linear(env, a, m, k, w, n, bias, residual, /*accumulate=*/true, what);
  ASSIGN_OR_RETURN(float* y, env.workspace->Get<float>(kBlockOut, m * n));
  RETURN_IF_ERROR(Linear(env, a, m, k, w, n, bias, y, /*accumulate=*/false, what));
  return AddToResidual(env, y, m, n, residual);
}

absl::StatusOr<const float*> ScaledInput(const LayerEnv& env, const float* x, int64_t n, int64_t dim, float alpha) {
  if (alpha == 1.0f) return x;
  ASSIGN_OR_RETURN(float* out, env.workspace->Get<float>(kMixerInput, n * dim));
  kernels::ActivationParams p;
  p.x = x;
  p.out = out;
  p.n_rows = n;
  p.dim = dim;
  p.kind = kernels::ActivationKind::kScale;
  p.alpha = alpha;
  RETURN_IF_ERROR(KernelStatusToStatus(env.backend->Activation(p), "Activation(scale input)"));
  return out;
}

absl::Status ScaleColumns(const LayerEnv& env, float* x, int64_t n, int64_t first, int64_t cols, int64_t stride,
                          float alpha) {
  if (alpha == 1.0f || n == 0) return absl::OkStatus();
  kernels::ActivationParams p;
  p.x = x + first;
  p.out = x + first;
  p.n_rows = n;
  p.dim = cols;
  p.x_row_stride = stride;
  p.out_row_stride = stride;
  p.kind = kernels::ActivationKind::kScale;
  p.alpha = alpha;
  return KernelStatusToStatus(env.backend->Activation(p), "Activation(scale columns)");
}

LayerEnv WithOutputMultiplier(LayerEnv env, float multiplier) {
  env.residual_multiplier *= multiplier;
  return env;
}

absl::Status AddToResidual(const LayerEnv& env, const float* y, int64_t m, int64_t n, float* residual) {
  kernels::ScatterAddRowsParams p;
  p.x = y;
  p.out = residual;
  p.n_rows = m;
  p.dim = n;
  p.alpha = env.residual_multiplier;
  return KernelStatusToStatus(env.backend->ScatterAddRows(p), "ScatterAddRows(residual)");
}

}  // namespace hybridserve::engine
