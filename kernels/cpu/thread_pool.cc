#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace hybridserve::kernels::cpu {
namespace {

// True while this thread runs a ParallelFor chunk: nested calls run inline.
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

uint32_t Generation(uint64_t claim) { return static_cast<uint32_t>(claim >> 32); }
int64_t ChunkCount(uint64_t claim) { return static_cast<int64_t>((claim >> 16) & 0xffffu); }
int64_t NextChunk(uint64_t claim) { return static_cast<int64_t>(claim & 0xffffu); }

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::clamp(num_threads, 1, kMaxThreads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(uint32_t gen) {
  uint64_t c = claim_.load(std::memory_order_acquire);
  while (true) {
    if (Generation(c) != gen) return;
    const int64_t index = NextChunk(c);
    const int64_t chunks = ChunkCount(c);
    if (index >= chunks) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    const int64_t begin = index * n_ / chunks;
    const int64_t end = (index + 1) * n_ / chunks;
    tls_in_parallel_region = true;
    (*fn_)(begin, end);
    tls_in_parallel_region = false;
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  while (true) {
    uint32_t gen = seen;
    auto changed = [&] { return (gen = Generation(claim_.load(std::memory_order_acquire))) != seen; };
    if (!SpinUntil(changed)) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || changed(); });
      if (stop_) return;
    }
    seen = gen;
    RunChunks(gen);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1 || tls_in_parallel_region) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  const int64_t chunks = std::min<int64_t>(n, int64_t{num_threads_} * kChunksPerThread);
  fn_ = &fn;
  n_ = n;
  finished_.store(0, std::memory_order_relaxed);
  const uint32_t gen = Generation(claim_.load(std::memory_order_relaxed)) + 1;
  {
    // fn_ and n_ are read only after a successful claim of this generation:
    // the caller is then still waiting for that chunk, and the job is valid.
    // Under mu_, so that a worker between its predicate check and its wait
    // cannot miss the notification.
    std::lock_guard<std::mutex> lock(mu_);
    claim_.store(static_cast<uint64_t>(gen) << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
  }
  work_cv_.notify_all();
  RunChunks(gen);
  auto all_done = [&] { return finished_.load(std::memory_order_acquire) == chunks; };
  if (!SpinUntil(all_done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, all_done);
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
