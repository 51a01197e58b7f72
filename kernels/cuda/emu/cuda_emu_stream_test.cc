// The emulator's asynchrony (cuda_emu.h, "Asynchrony"; emu/stream_queues.h):
// work queued on a stream runs only when something orders it, so each class
// of missing synchronisation gives a wrong result here: a copy on one stream
// of what a kernel on another writes, with no cudaStreamWaitEvent between
// them; a host read after an async copy, with no synchronisation; a result
// read after an unchecked cudaEventQuery. The same code with the
// synchronisation gives the right result.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/cuda/emu/emu_test_kernels.h"

namespace hybridserve::kernels::cuda_emu {
namespace {

using test_kernels::DeviceBuffer;
using test_kernels::Id;

constexpr int kN = 256;

// data[i] = value for i < n.
void FillKernel(int* data, int value, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) data[i] = value;
}

cudaError_t Fill(int* data, int value, cudaStream_t stream) {
  return EmuLaunch(Id(&FillKernel), dim3(kN / 128), dim3(128), 0, stream, [=] { FillKernel(data, value, kN); });
}

// Sets the order of forced drains for the scope, then restores the
// environment's (HS_CUDA_EMU_STREAM_ORDER may be set for the whole binary).
class ScopedStreamOrder {
 public:
  explicit ScopedStreamOrder(internal::StreamOrder order, uint64_t seed = 1) {
    internal::SetStreamOrderForTesting(order, seed);
  }
  ~ScopedStreamOrder() { internal::ResetStreamOrderForTesting(); }
  ScopedStreamOrder(const ScopedStreamOrder&) = delete;
  ScopedStreamOrder& operator=(const ScopedStreamOrder&) = delete;
};

// Two streams, destroyed (their work run) at the end of the scope.
struct TwoStreams {
  explicit TwoStreams(unsigned int flags) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&a, flags), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&b, flags), cudaSuccess);
  }
  ~TwoStreams() {
    EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
  }
  cudaStream_t a = nullptr;
  cudaStream_t b = nullptr;
};

// A pinned host array of kN ints, filled with -7 (the "old bytes" on the host).
class PinnedInts {
 public:
  PinnedInts() {
    EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&p_), kN * sizeof(int)), cudaSuccess);
    for (int i = 0; i < kN; ++i) p_[i] = -7;
  }
  ~PinnedInts() { EXPECT_EQ(cudaFreeHost(p_), cudaSuccess); }
  int* get() const { return p_; }
  std::vector<int> values() const { return std::vector<int>(p_, p_ + kN); }

 private:
  int* p_ = nullptr;
};

// Stream a: a kernel fills `src` with 5; stream b: copies `src` to `dst`,
// after the kernel only if `wait`. Then the device synchronises: what `dst`
// holds.
std::vector<int> KernelOnAThenCopyOnB(bool wait, unsigned int flags) {
  DeviceBuffer<int> src(kN), dst(kN);
  src.Write(std::vector<int>(kN, 1));
  dst.Write(std::vector<int>(kN, 0));
  {
    TwoStreams s(flags);
    cudaEvent_t written;
    EXPECT_EQ(cudaEventCreate(&written), cudaSuccess);
    EXPECT_EQ(Fill(src.get(), 5, s.a), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(written, s.a), cudaSuccess);
    if (wait) EXPECT_EQ(cudaStreamWaitEvent(s.b, written, 0), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(dst.get(), src.get(), kN * sizeof(int), cudaMemcpyDeviceToDevice, s.b), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(written), cudaSuccess);
  }
  EXPECT_EQ(src.Read(), std::vector<int>(kN, 5)) << "the kernel ran, at the latest at the synchronisation";
  return dst.Read();
}

// ---- (a) Between streams ----

TEST(CudaEmuStreamTest, ACopyOnAnotherStreamWithoutAnEventWaitSeesTheOldBytes) {
  ScopedStreamOrder order(internal::StreamOrder::kReverse);
  EXPECT_EQ(KernelOnAThenCopyOnB(/*wait=*/false, cudaStreamNonBlocking), std::vector<int>(kN, 1));
  // Blocking streams are no more ordered with each other.
  EXPECT_EQ(KernelOnAThenCopyOnB(/*wait=*/false, cudaStreamDefault), std::vector<int>(kN, 1));
}

TEST(CudaEmuStreamTest, ACopyOnAnotherStreamAfterAnEventWaitSeesTheKernelsWrites) {
  for (const internal::StreamOrder o :
       {internal::StreamOrder::kReverse, internal::StreamOrder::kSubmission, internal::StreamOrder::kShuffle}) {
    ScopedStreamOrder order(o, 3);
    EXPECT_EQ(KernelOnAThenCopyOnB(/*wait=*/true, cudaStreamNonBlocking), std::vector<int>(kN, 5));
    EXPECT_EQ(KernelOnAThenCopyOnB(/*wait=*/true, cudaStreamDefault), std::vector<int>(kN, 5));
  }
}

TEST(CudaEmuStreamTest, SubmissionOrderHidesTheMissingWaitThatTheReverseOrderShows) {
  // Why reverse is the default: run in the order the host submitted (what a
  // GPU usually does), the missing wait passes.
  ScopedStreamOrder order(internal::StreamOrder::kSubmission);
  EXPECT_EQ(KernelOnAThenCopyOnB(/*wait=*/false, cudaStreamNonBlocking), std::vector<int>(kN, 5));
}

TEST(CudaEmuStreamTest, AWaitCoversTheWorkBeforeTheRecordOnly) {
  ScopedStreamOrder order(internal::StreamOrder::kReverse);
  DeviceBuffer<int> src(kN), dst(kN);
  {
    TwoStreams s(cudaStreamNonBlocking);
    cudaEvent_t first;
    ASSERT_EQ(cudaEventCreate(&first), cudaSuccess);
    ASSERT_EQ(Fill(src.get(), 1, s.a), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(first, s.a), cudaSuccess);
    ASSERT_EQ(Fill(src.get(), 2, s.a), cudaSuccess);  // after the record: b does not wait for it
    ASSERT_EQ(cudaStreamWaitEvent(s.b, first, 0), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(dst.get(), src.get(), kN * sizeof(int), cudaMemcpyDeviceToDevice, s.b), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s.b), cudaSuccess);
    EXPECT_EQ(dst.Read(), std::vector<int>(kN, 1));
    // The second fill is still queued.
    std::vector<int> now(kN);
    ASSERT_EQ(cudaMemcpyAsync(now.data(), src.get(), kN * sizeof(int), cudaMemcpyDeviceToHost, s.b), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s.b), cudaSuccess);
    EXPECT_EQ(now, std::vector<int>(kN, 1));
    ASSERT_EQ(cudaStreamSynchronize(s.a), cudaSuccess);
    EXPECT_EQ(src.Read(), std::vector<int>(kN, 2));
    EXPECT_EQ(cudaEventDestroy(first), cudaSuccess);
  }
}

TEST(CudaEmuStreamTest, OneStreamsWorkRunsInSubmissionOrder) {
  for (const internal::StreamOrder o :
       {internal::StreamOrder::kReverse, internal::StreamOrder::kSubmission, internal::StreamOrder::kShuffle}) {
    ScopedStreamOrder order(o, 5);
    DeviceBuffer<int> d(kN);
    PinnedInts host;
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    for (int v = 1; v <= 20; ++v) {
      ASSERT_EQ(Fill(d.get(), v, s), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(d.get(), 0, sizeof(int), s), cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpyAsync(host.get(), d.get(), kN * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<int> expected(kN, 20);
    expected[0] = 0;
    EXPECT_EQ(host.values(), expected);
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  }
}

// ---- (b) Host and device ----

TEST(CudaEmuStreamTest, AHostReadAfterAnAsyncCopyWithoutASynchronisationSeesTheOldBytes) {
  DeviceBuffer<int> d(kN);
  PinnedInts pinned;
  std::vector<int> pageable(kN, -7);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(Fill(d.get(), 9, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned.get(), d.get(), kN * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pageable.data(), d.get(), kN * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(pinned.values(), std::vector<int>(kN, -7));
  EXPECT_EQ(pageable, std::vector<int>(kN, -7));
  EXPECT_EQ(internal::PendingOperationsForTesting(), 3u);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(pinned.values(), std::vector<int>(kN, 9));
  EXPECT_EQ(pageable, std::vector<int>(kN, 9));
  EXPECT_EQ(internal::PendingOperationsForTesting(), 0u);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmuStreamTest, AnAsyncCopyReadsAPageableSourceAtTheCallAndAPinnedOneWhenItRuns) {
  DeviceBuffer<int> from_pageable(kN), from_pinned(kN);
  std::vector<int> pageable(kN, 3);
  PinnedInts pinned;
  for (int i = 0; i < kN; ++i) pinned.get()[i] = 3;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(from_pageable.get(), pageable.data(), kN * sizeof(int), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(from_pinned.get(), pinned.get(), kN * sizeof(int), cudaMemcpyDefault, s), cudaSuccess);
  // Reused before the copies ran: CUDA staged the pageable bytes; a DMA reads the pinned ones late.
  for (int i = 0; i < kN; ++i) pageable[i] = pinned.get()[i] = 4;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(from_pageable.Read(), std::vector<int>(kN, 3));
  EXPECT_EQ(from_pinned.Read(), std::vector<int>(kN, 4));
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmuStreamTest, ABlockingCopyWaitsForBlockingStreamsButNotForNonBlockingOnes) {
  ScopedStreamOrder order(internal::StreamOrder::kReverse);
  DeviceBuffer<int> d(kN);
  d.Write(std::vector<int>(kN, 0));
  cudaStream_t blocking, non_blocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(Fill(d.get(), 6, blocking), cudaSuccess);
  EXPECT_EQ(d.Read(), std::vector<int>(kN, 6)) << "cudaMemcpy is legacy-stream work: after the blocking stream's";
  ASSERT_EQ(Fill(d.get(), 8, non_blocking), cudaSuccess);
  EXPECT_EQ(d.Read(), std::vector<int>(kN, 6)) << "a non-blocking stream is not ordered by cudaMemcpy";
  // Legacy-stream work orders a blocking stream's later work after it: the
  // fill of 2 runs after the memset, though submitted to another stream.
  ASSERT_EQ(cudaMemsetAsync(d.get(), 0, kN * sizeof(int), nullptr), cudaSuccess);
  ASSERT_EQ(Fill(d.get(), 2, blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_EQ(d.Read(), std::vector<int>(kN, 2));
  ASSERT_EQ(cudaStreamSynchronize(non_blocking), cudaSuccess);
  EXPECT_EQ(d.Read(), std::vector<int>(kN, 8));
  ASSERT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(non_blocking), cudaSuccess);
}

TEST(CudaEmuStreamTest, FreeAndStreamDestroyRunTheQueuedWorkFirst) {
  PinnedInts host;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  {
    DeviceBuffer<int> d(kN);
    ASSERT_EQ(Fill(d.get(), 11, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(host.get(), d.get(), kN * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  }  // cudaFree: the fill and the copy ran before the memory went
  EXPECT_EQ(host.values(), std::vector<int>(kN, 11));
  DeviceBuffer<int> d(kN);
  ASSERT_EQ(Fill(d.get(), 12, s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(internal::PendingOperationsForTesting(), 0u);
  EXPECT_EQ(d.Read(), std::vector<int>(kN, 12));
}

// ---- (c) Queries ----

TEST(CudaEmuStreamTest, AnEventQueryAnswersNotReadyOnceThenRunsTheWork) {
  DeviceBuffer<int> d(kN);
  PinnedInts host;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t done;
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess) << "an event never recorded";
  ASSERT_EQ(Fill(d.get(), 4, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(host.get(), d.get(), kN * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, s), cudaSuccess);
  // A caller that ignores the answer reads the old bytes.
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not ready is not an error";
  EXPECT_EQ(host.values(), std::vector<int>(kN, -7));
  // A poll ends: the second question runs the work.
  int polls = 1;
  while (cudaEventQuery(done) == cudaErrorNotReady) ++polls;
  EXPECT_EQ(polls, 1);
  EXPECT_EQ(host.values(), std::vector<int>(kN, 4));
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  // A new record is a new question.
  ASSERT_EQ(Fill(d.get(), 5, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_EQ(cudaEventSynchronize(done), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  EXPECT_EQ(d.Read(), std::vector<int>(kN, 5));
  EXPECT_EQ(cudaEventDestroy(done), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmuStreamTest, AStreamQueryAnswersNotReadyOnceThenRunsTheWork) {
  DeviceBuffer<int> d(kN);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess) << "nothing queued";
  ASSERT_EQ(Fill(d.get(), 6, s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(internal::PendingOperationsForTesting(), 1u);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_EQ(internal::PendingOperationsForTesting(), 0u);
  EXPECT_EQ(d.Read(), std::vector<int>(kN, 6));
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmuStreamTest, ElapsedTimeNeedsBothRecordsRun) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start, end;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  DeviceBuffer<int> d(kN);
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  ASSERT_EQ(Fill(d.get(), 1, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(end), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// ---- Faults ----

void SynchronizingKernel(int*) { cudaDeviceSynchronize(); }

TEST(CudaEmuStreamDeathTest, ARuntimeCallInsideAKernelAborts) {
  EXPECT_DEATH(
      {
        EmuLaunch(Id(&SynchronizingKernel), dim3(1), dim3(32), 0, nullptr, [] { SynchronizingKernel(nullptr); });
        cudaDeviceSynchronize();
      },
      "a CUDA runtime call inside a kernel");
}

}  // namespace
}  // namespace hybridserve::kernels::cuda_emu
