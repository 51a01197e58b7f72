#ifndef HYBRIDSERVE_BENCH_KERNELS_BENCH_UTIL_H_
#define HYBRIDSERVE_BENCH_KERNELS_BENCH_UTIL_H_

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <vector>

namespace hybridserve::bench {

inline double SecondsOf(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Times the candidates interleaved (one run of each per round, after a warm-up
// run of each) for about `budget_s` seconds in total, and returns the best
// (minimum) time of each in seconds. Interleaving and taking the minimum keep
// the ratios meaningful on a machine shared with other work.
inline std::vector<double> BestSecondsInterleaved(const std::vector<std::function<void()>>& fns, double budget_s,
                                                  int min_rounds = 5, int max_rounds = 2000) {
  std::vector<double> best(fns.size(), std::numeric_limits<double>::infinity());
  double round_s = 0;
  for (const auto& fn : fns) round_s += SecondsOf(fn);
  const int rounds = std::min(max_rounds, std::max(min_rounds, static_cast<int>(budget_s / std::max(round_s, 1e-7))));
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) best[i] = std::min(best[i], SecondsOf(fns[i]));
  }
  return best;
}

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_KERNELS_BENCH_UTIL_H_
