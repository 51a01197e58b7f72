#ifndef HYBRIDSERVE_KERNELS_CPU_THREAD_POOL_H_
#define HYBRIDSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hybridserve::kernels::cpu {

// A small persistent pool for the CPU kernels: num_threads - 1 worker threads
// plus the calling thread. Kernels partition outputs, never reductions, over it,
// so results never depend on the thread count.
//
// Thread-safe: ParallelFor may be called from any thread; concurrent calls are
// serialized. A ParallelFor issued from inside a running ParallelFor range runs
// inline on that thread (no deadlock, no extra parallelism).
class ThreadPool {
 public:
  // num_threads >= 1 counts the calling thread; values < 1 are treated as 1.
  explicit ThreadPool(int num_threads = 2);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into min(n, num_threads()) contiguous ranges, range i being
  // [i * n / r, (i + 1) * n / r), and calls fn(begin, end) once per range (range
  // 0 on the calling thread). Returns when every range has finished. The split
  // depends only on n and num_threads(). n <= 0 calls nothing.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);
  void RunRange(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;

  std::mutex call_mu_;  // serializes ParallelFor calls
  std::mutex mu_;       // guards stop_ and the hand-off below
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;

  // The job of the current generation; written before generation_ is bumped.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int ranges_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers that have not finished the current generation
};

// fn(0, n) on the calling thread when pool is null, else pool->ParallelFor(n, fn).
void ParallelFor(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_THREAD_POOL_H_
