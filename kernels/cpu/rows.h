#ifndef HYBRIDSERVE_KERNELS_CPU_ROWS_H_
#define HYBRIDSERVE_KERNELS_CPU_ROWS_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/rows_params.h"

namespace hybridserve::kernels::cpu {

// Row gather and scatter-add (kernels/rows_params.h): the reference the CUDA
// kernels are compared with bit for bit. Return a KernelStatus:
// kKernelInvalidArgument (nothing written) when the params' check fails. Index
// values are not range-checked (the caller's precondition). pool may be null
// (runs on the caller); rows are split over it, so ScatterAddRows relies on
// its distinct-index precondition.
int GatherRows(const GatherRowsParams& p, ThreadPool* pool);
int ScatterAddRows(const ScatterAddRowsParams& p, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_ROWS_H_
