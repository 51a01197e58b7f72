#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <chrono>

namespace hybridserve::kernels::cpu {
namespace {

// True while this thread runs a ParallelFor range: nested calls run inline.
thread_local bool tls_in_parallel_region = false;

// How long a waiting thread spins before it blocks. Kernel calls of a decode
// step follow each other within microseconds; a short spin saves the futex
// wake-up latency, and blocking afterwards keeps idle pools off the cores.
constexpr auto kSpinTime = std::chrono::microseconds(50);

template <typename Pred>
bool SpinUntil(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    if (pred()) return true;
    _mm_pause();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() > deadline) return pred();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunRange(int index) {
  if (index >= ranges_) return;
  const int64_t begin = index * n_ / ranges_;
  const int64_t end = (index + 1) * n_ / ranges_;
  tls_in_parallel_region = true;
  (*fn_)(begin, end);
  tls_in_parallel_region = false;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    uint64_t gen = seen;
    if (!SpinUntil([&] { return (gen = generation_.load(std::memory_order_acquire)) != seen; })) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || (gen = generation_.load(std::memory_order_acquire)) != seen; });
      if (stop_) return;
    }
    seen = gen;
    RunRange(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1 || tls_in_parallel_region) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    ranges_ = static_cast<int>(n < num_threads_ ? n : num_threads_);
    pending_.store(num_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  RunRange(0);
  if (!SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  fn_ = nullptr;
}

void ParallelFor(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(0, n);
    return;
  }
  pool->ParallelFor(n, fn);
}

}  // namespace hybridserve::kernels::cpu
