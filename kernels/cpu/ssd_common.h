#ifndef HYBRIDSERVE_KERNELS_CPU_SSD_COMMON_H_
#define HYBRIDSERVE_KERNELS_CPU_SSD_COMMON_H_

// Internal to the SSD kernels: parameter checks and resolved strides.

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

// Shapes and required pointers shared by both scans (block_size not checked).
inline bool ValidScanParams(const SsdChunkScanParams& p) {
  if (p.seqlen < 0 || p.n_heads <= 0 || p.head_dim <= 0 || p.d_state <= 0 || p.n_groups <= 0 ||
      p.n_heads % p.n_groups != 0 || p.chunk_size <= 0 || p.start_pos < 0) {
    return false;
  }
  if (p.seqlen > 0 && (p.x == nullptr || p.dt == nullptr || p.B == nullptr || p.C == nullptr || p.y == nullptr)) {
    return false;
  }
  return p.A != nullptr;
}

}  // namespace hybridserve::kernels::cpu::ssd_internal

#endif  // HYBRIDSERVE_KERNELS_CPU_SSD_COMMON_H_
