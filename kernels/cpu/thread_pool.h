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
// so results never depend on the thread count or on which thread ran what.
//
// Work is cut into a few chunks per thread that threads claim one at a time,
// and the caller takes part: on a busy machine, where the OS may not run a
// worker for milliseconds, the threads that do run take the chunks of the one
// that does not, and the call never waits for a worker that claimed nothing
// (a static split would wait for the slowest thread's whole share).
//
// Thread-safe: ParallelFor may be called from any thread; concurrent calls are
// serialized. A ParallelFor issued from inside a running ParallelFor chunk runs
// inline on that thread (no deadlock, no extra parallelism).
class ThreadPool {
 public:
  // Chunks per thread of a call (at most; never more than n).
  static constexpr int kChunksPerThread = 4;
  static constexpr int kMaxThreads = 1024;

  // num_threads >= 1 counts the calling thread; values < 1 are treated as 1,
  // values above kMaxThreads as kMaxThreads.
  explicit ThreadPool(int num_threads = 2);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into c = min(n, num_threads() * kChunksPerThread) contiguous
  // chunks, chunk i being [i * n / c, (i + 1) * n / c), and calls fn(begin, end)
  // once per chunk on whichever thread claims it. Returns when every chunk has
  // finished. The split depends only on n and num_threads(). n <= 0 calls
  // nothing; a pool of one thread, or n == 1, calls fn(0, n) once.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  // Claims and runs chunks of generation `gen` until none is left or `gen` is
  // no longer the current generation.
  void RunChunks(uint32_t gen);

  const int num_threads_;
  std::vector<std::thread> workers_;

  std::mutex call_mu_;  // serializes ParallelFor calls
  std::mutex mu_;       // guards stop_; the condition variables wait on it
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;

  // The job of the current generation, written by the caller before it
  // publishes the generation in claim_ (release), and read by a thread only
  // after it claimed a chunk of that generation (acquire): the caller is then
  // still waiting for that chunk, so the job is valid.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  // Bits 63-32: generation; 31-16: chunks of the call; 15-0: the next chunk to
  // claim. A claim is a compare-and-swap of the whole word, so a thread that
  // woke late can never take a chunk of a later call, nor one past the count
  // of its own (the count travels with the generation, never separately).
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> finished_{0};  // chunks of the current generation done
};

// fn(0, n) on the calling thread when pool is null, else pool->ParallelFor(n, fn).
void ParallelFor(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn);

// row_fn(r) for every r in [0, n_rows), rows of `dim` cheap (elementwise)
// elements: split over the pool in contiguous tasks of at least
// kMinElementsPerRowTask elements (one task when the rows are fewer), each
// task's rows in ascending order.
inline constexpr int64_t kMinElementsPerRowTask = 16384;
template <typename Fn>
void ParallelForRows(ThreadPool* pool, int64_t n_rows, int64_t dim, Fn row_fn) {
  const int64_t by_size = n_rows * dim / kMinElementsPerRowTask;
  const int64_t tasks = by_size < 1 ? 1 : (by_size < n_rows ? by_size : n_rows);
  ParallelFor(pool, tasks, [&](int64_t begin, int64_t end) {
    const int64_t r0 = begin * n_rows / tasks;
    const int64_t r1 = end * n_rows / tasks;
    for (int64_t r = r0; r < r1; ++r) row_fn(r);
  });
}

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_THREAD_POOL_H_
