// The emulator's scheduling orders (HS_CUDA_EMU_ORDER): ascending hides a
// race that descending and shuffled orders expose; every order runs each
// round as a permutation of its threads; race-free kernels give the same bits
// in every order.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/cuda/emu/emu_test_kernels.h"

namespace hybridserve::kernels::cuda_emu {
namespace {

using test_kernels::BlockReduceKernel;
using test_kernels::DeviceBuffer;
using test_kernels::Id;
using test_kernels::kFull;
using test_kernels::ShuffleKernel;
using test_kernels::ShuffleOut;

// Sets the emulator's scheduling order for the scope, then restores the
// environment's (HS_CUDA_EMU_ORDER may be set for the whole binary).
class ScopedScheduleOrder {
 public:
  explicit ScopedScheduleOrder(internal::ScheduleOrder order, uint64_t seed = 1) {
    internal::SetScheduleOrderForTesting(order, seed);
  }
  ~ScopedScheduleOrder() { internal::ResetScheduleOrderForTesting(); }
  ScopedScheduleOrder(const ScopedScheduleOrder&) = delete;
  ScopedScheduleOrder& operator=(const ScopedScheduleOrder&) = delete;
};

constexpr int kRaceThreads = 64;

// Deliberately racy: thread i writes cell i, then reads its neighbours' cells
// with no barrier in between. Dynamic shared memory starts as 0xFF bytes, so
// a neighbour that has not run yet reads as -1. out[0..64): cell i-1 as seen
// by thread i; out[64..128): cell i+1 as seen by thread i.
void NeighbourRaceKernel(int* out) {
  int* cells = static_cast<int*>(DynamicSharedMemory());
  const int t = static_cast<int>(threadIdx.x);
  cells[t] = t;
  out[t] = t > 0 ? cells[t - 1] : 0;
  out[kRaceThreads + t] = t + 1 < kRaceThreads ? cells[t + 1] : kRaceThreads;
}

std::vector<int> RunNeighbourRace() {
  DeviceBuffer<int> d_out(2 * kRaceThreads);
  EXPECT_EQ(EmuLaunch(Id(&NeighbourRaceKernel), dim3(1), dim3(kRaceThreads), kRaceThreads * sizeof(int), nullptr,
                      [o = d_out.get()] { NeighbourRaceKernel(o); }),
            cudaSuccess);
  return d_out.Read();
}

// The "correct" neighbour values: what a thread would read after a barrier.
bool SawPrevious(const std::vector<int>& out, int t) { return out[t] == (t > 0 ? t - 1 : 0); }
bool SawNext(const std::vector<int>& out, int t) { return out[kRaceThreads + t] == t + 1; }

TEST(CudaEmuScheduleTest, AscendingOrderHidesAReadOfALowerThreadsUnsyncedWrite) {
  ScopedScheduleOrder order(internal::ScheduleOrder::kAscending);
  const std::vector<int> out = RunNeighbourRace();
  for (int t = 0; t < kRaceThreads; ++t) {
    EXPECT_TRUE(SawPrevious(out, t)) << "thread " << t << " read " << out[t];
    // Thread i + 1 has not run yet when thread i reads its cell.
    if (t + 1 < kRaceThreads) EXPECT_EQ(out[kRaceThreads + t], -1) << "thread " << t;
  }
}

TEST(CudaEmuScheduleTest, DescendingOrderExposesTheRaceAscendingHides) {
  ScopedScheduleOrder order(internal::ScheduleOrder::kDescending);
  const std::vector<int> out = RunNeighbourRace();
  for (int t = 0; t < kRaceThreads; ++t) {
    if (t > 0) EXPECT_EQ(out[t], -1) << "thread " << t;
    EXPECT_TRUE(SawNext(out, t)) << "thread " << t << " read " << out[kRaceThreads + t];
  }
}

TEST(CudaEmuScheduleTest, ShuffleOrderGivesBothOutcomesOfTheRaceAndRepeatsPerSeed) {
  std::vector<int> first;
  {
    ScopedScheduleOrder order(internal::ScheduleOrder::kShuffle, 42);
    first = RunNeighbourRace();
  }
  int saw_previous = 0;
  int saw_next = 0;
  for (int t = 1; t + 1 < kRaceThreads; ++t) {
    saw_previous += SawPrevious(first, t);
    saw_next += SawNext(first, t);
    // Exactly one of two neighbours ran first, unless both or neither did.
    EXPECT_TRUE(SawPrevious(first, t) || first[t] == -1) << t;
    EXPECT_TRUE(SawNext(first, t) || first[kRaceThreads + t] == -1) << t;
  }
  // A random order of 64 threads: each outcome about half the time (the seed
  // fixes the outcome; these bounds hold for it and for almost any other).
  EXPECT_GT(saw_previous, 8);
  EXPECT_LT(saw_previous, 54);
  EXPECT_GT(saw_next, 8);
  EXPECT_LT(saw_next, 54);
  {
    ScopedScheduleOrder order(internal::ScheduleOrder::kShuffle, 42);
    EXPECT_EQ(RunNeighbourRace(), first);
  }
  {
    ScopedScheduleOrder order(internal::ScheduleOrder::kShuffle, 43);
    EXPECT_NE(RunNeighbourRace(), first);
  }
}

// out[block * 256 + t] = the position at which thread t of the block first ran
// and, after a barrier, ran again (offset by 1000).
void TicketKernel(int* out) {
  __shared__ int next_ticket;
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) next_ticket = 0;
  __syncthreads();
  const int after_barrier = atomicAdd(&next_ticket, 1);
  out[blockIdx.x * 2 * 256 + t] = after_barrier;
  __syncthreads();
  // A warp collective's release is a round too.
  const int lane_sum = __shfl_xor_sync(kFull, t, 1);
  out[blockIdx.x * 2 * 256 + 256 + t] = atomicAdd(&next_ticket, 1) - 256 + 1000 * (lane_sum != (t ^ 1));
}

std::vector<int> RunTickets() {
  DeviceBuffer<int> d_out(2 * 2 * 256);
  EXPECT_EQ(EmuLaunch(Id(&TicketKernel), dim3(2), dim3(256), 0, nullptr, [o = d_out.get()] { TicketKernel(o); }),
            cudaSuccess);
  return d_out.Read();
}

TEST(CudaEmuScheduleTest, EveryOrderRunsEachRoundAsAPermutationOfItsThreads) {
  for (const auto mode :
       {internal::ScheduleOrder::kAscending, internal::ScheduleOrder::kDescending, internal::ScheduleOrder::kShuffle}) {
    ScopedScheduleOrder order(mode, 7);
    const std::vector<int> out = RunTickets();
    for (int b = 0; b < 2; ++b) {
      for (int round = 0; round < 2; ++round) {
        std::vector<int> tickets(out.begin() + (2 * b + round) * 256, out.begin() + (2 * b + round + 1) * 256);
        std::vector<int> sorted = tickets;
        std::sort(sorted.begin(), sorted.end());
        for (int i = 0; i < 256; ++i) ASSERT_EQ(sorted[i], i) << "block " << b << " round " << round;
        if (round == 1) continue;  // warp rounds interleave with other warps' threads
        // After the barrier: thread 0 released it in descending order, 255 in ascending.
        for (int t = 0; t < 256; ++t) {
          if (mode == internal::ScheduleOrder::kAscending) {
            EXPECT_EQ(tickets[t], t == 255 ? 0 : t + 1) << "thread " << t;
          } else if (mode == internal::ScheduleOrder::kDescending) {
            EXPECT_EQ(tickets[t], 255 - t) << "thread " << t;
          }
        }
      }
    }
  }
}

TEST(CudaEmuScheduleTest, RaceFreeReductionsGiveTheSameBitsInEveryOrder) {
  const int blocks = 5;
  std::vector<int64_t> in(blocks * 256);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>((i * 7919) % 1000) - 300;
  DeviceBuffer<int64_t> d_in(in.size());
  d_in.Write(in);
  std::vector<std::vector<int64_t>> sums;
  std::vector<std::vector<float>> shuffles;
  for (const auto mode :
       {internal::ScheduleOrder::kAscending, internal::ScheduleOrder::kDescending, internal::ScheduleOrder::kShuffle}) {
    ScopedScheduleOrder order(mode, 3);
    DeviceBuffer<int64_t> d_out(blocks);
    ASSERT_EQ(EmuLaunch(Id(&BlockReduceKernel), dim3(blocks), dim3(256), 0, nullptr,
                        [i = d_in.get(), o = d_out.get()] { BlockReduceKernel(i, o); }),
              cudaSuccess);
    sums.push_back(d_out.Read());
    DeviceBuffer<ShuffleOut> d_shuffle(1);
    ASSERT_EQ(EmuLaunch(Id(&ShuffleKernel), dim3(1), dim3(64), 0, nullptr, [o = d_shuffle.get()] { ShuffleKernel(o); }),
              cudaSuccess);
    const ShuffleOut shuffle = d_shuffle.Read()[0];
    shuffles.emplace_back(shuffle.sum, shuffle.sum + 64);
  }
  EXPECT_EQ(sums[1], sums[0]);
  EXPECT_EQ(sums[2], sums[0]);
  EXPECT_EQ(shuffles[1], shuffles[0]);
  EXPECT_EQ(shuffles[2], shuffles[0]);
}

}  // namespace
}  // namespace hybridserve::kernels::cuda_emu
