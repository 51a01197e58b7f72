#ifndef HYBRIDSERVE_BENCH_KERNELS_DEVICE_BENCH_UTIL_H_
#define HYBRIDSERVE_BENCH_KERNELS_DEVICE_BENCH_UTIL_H_

// What the benchmarks of a Backend's device kernels share: exit on a kernel
// error, device buffers (zeroed size allowed, random contents), and the time
// of one call.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "kernels/backend.h"

namespace hybridserve::bench {

inline void Check(int status, const char* what) {
  if (status != 0) {
    std::fprintf(stderr, "%s failed: kernel status %d\n", what, status);
    std::exit(1);
  }
}

inline kernels::DeviceBuffer Buffer(kernels::Backend& b, int64_t bytes) {
  kernels::DeviceBuffer buf;
  Check(b.Allocate(std::max<int64_t>(bytes, 1), &buf), "Allocate");
  return buf;
}

// `floats` values drawn uniformly from [lo, hi) with `seed`, on the device.
inline kernels::DeviceBuffer Random(kernels::Backend& b, int64_t floats, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> host(static_cast<size_t>(floats));
  for (float& f : host) f = dist(rng);
  kernels::DeviceBuffer buf = Buffer(b, floats * 4);
  Check(b.CopyToDevice(buf.data(), host.data(), floats * 4), "CopyToDevice");
  return buf;
}

// Seconds per call: best of `reps` batches of `calls` calls, after one untimed
// call; each batch ends with a synchronisation.
inline double SecondsPerCall(kernels::Backend& b, int reps, int calls, const std::function<void()>& call) {
  call();
  Check(b.Synchronize(), "Synchronize");
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) call();
    Check(b.Synchronize(), "Synchronize");
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls);
  }
  return best;
}

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_KERNELS_DEVICE_BENCH_UTIL_H_
