#include "engine/layer_runner.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/matmul.h"
#include "kernels/kernel_status.h"
#include "kernels/matmul_params.h"

namespace hybridserve::engine {

absl::Status KernelStatusToStatus(int kernel_status, absl::string_view kernel) {
  if (kernel_status == kernels::kKernelOk) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("kernel ", kernel, " failed: ", kernels::KernelStatusName(kernel_status)));
}

absl::Status Linear(const LayerEnv& env, const float* a, int64_t m, int64_t k, absl::Span<const float> w, int64_t n,
                    absl::Span<const float> bias, float* out, bool accumulate, absl::string_view what) {
  kernels::MatmulParams p;
  p.a = a;
  p.w = w.data();
  p.bias = bias.empty() ? nullptr : bias.data();
  p.out = out;
  p.m = m;
  p.n = n;
  p.k = k;
  p.accumulate = accumulate;
  return KernelStatusToStatus(kernels::cpu::Matmul(p, env.matmul_mode, env.pool), what);
}

}  // namespace hybridserve::engine
