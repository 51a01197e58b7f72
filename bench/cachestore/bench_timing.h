#ifndef HYBRIDSERVE_BENCH_CACHESTORE_BENCH_TIMING_H_
#define HYBRIDSERVE_BENCH_CACHESTORE_BENCH_TIMING_H_

// Timing helpers for the cachestore benchmarks: medians of repeated
// measurements, so ratios against a baseline taken in the same run are stable.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hybridserve::bench {

// Keeps the compiler from discarding a computed value (as benchmark::DoNotOptimize).
template <typename T>
inline void KeepAlive(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median over `reps` repetitions of the mean nanoseconds per call of `fn`.
// Each repetition runs fn enough times to take about `rep_seconds`; one
// untimed repetition warms caches and allocators first.
template <typename Fn>
double MedianNanosPerCall(Fn&& fn, int reps = 7, double rep_seconds = 0.04) {
  int64_t calls = 1;
  for (;;) {  // calibrate
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) fn();
    const double s = SecondsSince(start);
    if (s >= rep_seconds / 4 || calls >= (int64_t{1} << 30)) {
      calls = std::max<int64_t>(1, static_cast<int64_t>(calls * rep_seconds / std::max(s, 1e-9)));
      break;
    }
    calls *= 4;
  }
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) fn();
    per_call.push_back(SecondsSince(start) * 1e9 / static_cast<double>(calls));
  }
  return Median(per_call);
}

// Median wall seconds of `reps` runs of fn(rep) after `warmup` untimed runs
// (fn receives the run index, warm-ups first, so every run can differ).
template <typename Fn>
double MedianSeconds(int reps, int warmup, Fn&& fn) {
  int index = 0;
  for (int i = 0; i < warmup; ++i) fn(index++);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn(index++);
    t.push_back(SecondsSince(start));
  }
  return Median(t);
}

// Times several candidates in interleaved rounds (every candidate once per
// round, a few milliseconds each), so that load from other processes on a
// shared machine hits all of them alike. Reports medians over rounds (ratios
// taken within a round) and bests (fewest ns in any round). Not thread-safe.
class InterleavedTimer {
 public:
  // Returns the candidate's id.
  int Add(std::string name, std::function<void()> fn) {
    candidates_.push_back(Candidate{std::move(name), std::move(fn), 1, {}});
    return static_cast<int>(candidates_.size()) - 1;
  }

  void Run(int rounds = 15, double slot_seconds = 0.006) {
    for (Candidate& c : candidates_) {  // calibrate; also warms up
      for (;;) {
        const auto start = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < c.calls; ++i) c.fn();
        const double s = SecondsSince(start);
        if (s >= slot_seconds / 4 || c.calls >= (int64_t{1} << 30)) {
          c.calls = std::max<int64_t>(1, static_cast<int64_t>(c.calls * slot_seconds / std::max(s, 1e-9)));
          break;
        }
        c.calls *= 4;
      }
    }
    for (int r = 0; r < rounds; ++r) {
      for (Candidate& c : candidates_) {
        const auto start = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < c.calls; ++i) c.fn();
        c.nanos.push_back(SecondsSince(start) * 1e9 / static_cast<double>(c.calls));
      }
    }
  }

  // Median nanoseconds per call over the rounds.
  double Nanos(int id) const { return Median(candidates_[id].nanos); }

  // Fewest nanoseconds per call in any round: on a shared machine, the
  // estimate least disturbed by other processes.
  double BestNanos(int id) const {
    return *std::min_element(candidates_[id].nanos.begin(), candidates_[id].nanos.end());
  }

  // BestNanos(id) / BestNanos(baseline).
  double BestRatio(int id, int baseline) const { return BestNanos(id) / BestNanos(baseline); }

  // Median over the rounds of time(id) / time(baseline) within the round.
  double Ratio(int id, int baseline) const {
    std::vector<double> r;
    for (size_t i = 0; i < candidates_[id].nanos.size(); ++i) {
      r.push_back(candidates_[id].nanos[i] / candidates_[baseline].nanos[i]);
    }
    return Median(r);
  }

 private:
  struct Candidate {
    std::string name;
    std::function<void()> fn;
    int64_t calls;
    std::vector<double> nanos;  // per round
  };
  std::vector<Candidate> candidates_;
};

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_CACHESTORE_BENCH_TIMING_H_
