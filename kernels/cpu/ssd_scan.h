#ifndef HYBRIDSERVE_KERNELS_CPU_SSD_SCAN_H_
#define HYBRIDSERVE_KERNELS_CPU_SSD_SCAN_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/ssd_params.h"

namespace hybridserve::kernels::cpu {

// Mamba2 SSD chunk scan (prefill); see kernels/ssd_params.h for the math.
// Tokens are processed in blocks of block_size on the absolute grid (a block
// never straddles a chunk boundary). Within a block, for each head:
//   S_t = a_0 + ... + a_t (a_t = dt_t * A, fp32 prefix sum from the block start)
//   y_t = exp(S_t) * (C_t . state_in) + sum_{s<=t} (C_t . B_s) exp(S_t - S_s) dt_s x_s + D x_t
//   state_out = exp(S_last) state_in + sum_s exp(S_last - S_s) dt_s x_s (outer) B_s
// with every product a fixed-order register-blocked GEMM. The arithmetic of a
// block depends only on its inputs, its length and the incoming state, so the
// grid contract holds; work is partitioned over groups/heads, never over a
// reduction, so results do not depend on the pool. Returns a KernelStatus.
int SsdChunkScan(const SsdChunkScanParams& p, ThreadPool* pool);

// The same recurrence token by token (the test oracle and benchmark baseline).
// Fills y, final_state and chunk_states like SsdChunkScan (block_size ignored).
// Each token's arithmetic is SelectiveStateUpdate's. Returns a KernelStatus.
int SsdSequentialScan(const SsdChunkScanParams& p, ThreadPool* pool);

// One decode step for a batch (see SelectiveStateUpdateParams). Bit-identical to
// the corresponding step of SsdSequentialScan. Returns a KernelStatus.
int SelectiveStateUpdate(const SelectiveStateUpdateParams& p, ThreadPool* pool);

// The block length SsdChunkScan uses for these params (resolves block_size 0),
// or 0 if block_size is invalid for chunk_size.
int64_t SsdResolvedBlockSize(const SsdChunkScanParams& p);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_SSD_SCAN_H_
