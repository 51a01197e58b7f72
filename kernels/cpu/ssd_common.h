#ifndef HYBRIDSERVE_KERNELS_CPU_SSD_COMMON_H_
#define HYBRIDSERVE_KERNELS_CPU_SSD_COMMON_H_

// Internal to the SSD kernels: resolved strides (the parameter checks are
// CheckSsdChunkScanParams in kernels/ssd_params.h).

#include <cstdint>

#include "kernels/ssd_params.h"

namespace hybridserve::kernels::cpu::ssd_internal {

struct ScanStrides {
  int64_t x = 0;
  int64_t dt = 0;
  int64_t bc = 0;
  int64_t y = 0;
};

inline ScanStrides ResolveStrides(const SsdChunkScanParams& p) {
  ScanStrides s;
  s.x = p.x_token_stride ? p.x_token_stride : p.n_heads * p.head_dim;
  s.dt = p.dt_token_stride ? p.dt_token_stride : p.n_heads;
  s.bc = p.bc_token_stride ? p.bc_token_stride : p.n_groups * p.d_state;
  s.y = p.y_token_stride ? p.y_token_stride : p.n_heads * p.head_dim;
  return s;
}

}  // namespace hybridserve::kernels::cpu::ssd_internal

#endif  // HYBRIDSERVE_KERNELS_CPU_SSD_COMMON_H_
