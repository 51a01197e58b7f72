// The CUDA causal conv1d kernels (kernels/cuda/conv1d.cu) against the CPU
// kernels, on the emulated build and (where a device is present) on the GPU.
//
// Tolerances, and why: every output element is summed in the order the params
// document (bias, then fmaf over k = 0 .. d_conv-1), which the CUDA kernels
// follow exactly, so
//   - without SiLU the output has the CPU's bits on every target (checked
//     bitwise, a GPU included);
//   - with SiLU the emulator has the CPU's bits (same libm expf); a GPU's expf
//     is within 2 ulp: rtol 1e-6 (~16 ulp) there;
//   - the conv state is a copy of inputs: bitwise everywhere.
// Splitting a prefill (state carried) and the one-step update form give the
// same bits as one prefill call on the same target, SiLU included.

#include "kernels/cpu/conv1d.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels {
namespace {

using cpu::testing::BitsEqual;
using cpu::testing::RandomVector;
using cuda_testing::CudaTargetName;
using cuda_testing::CudaTestTargets;

constexpr double kGpuSiluRtol = 1e-6;
constexpr double kGpuSiluAtol = 1e-30;
constexpr float kSentinel = 7.25f;  // fills rows and padding a kernel must not write

class Conv1dTest : public cuda_testing::CudaKernelTest {
 protected:
  // Against the CPU: bitwise unless SiLU ran on a GPU.
  ::testing::AssertionResult OutputMatch(const std::vector<float>& got, const std::vector<float>& want, bool silu) {
    if (!silu || emulated()) return BitsEqual(got, want);
    return cuda_testing::AllClose(got, want, kGpuSiluAtol, kGpuSiluRtol);
  }
};

struct PrefillCase {
  int64_t seqlen, channels, d_conv;
  bool state, bias, silu, strided;
};

TEST_P(Conv1dTest, PrefillMatchesCpu) {
  std::mt19937 rng(51);
  std::vector<PrefillCase> cases;
  for (int64_t channels : {1, 7, 33, 257}) {
    for (int64_t d_conv : {1, 2, 3, 4, 5}) {
      for (int64_t seqlen : {1, 2, 5, 17, 40}) {
        const int bits = std::uniform_int_distribution<int>(0, 15)(rng);
        cases.push_back({seqlen, channels, d_conv, (bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, (bits & 8) != 0});
      }
    }
  }
  cases.push_back({40, 33, 4, true, true, true, true});
  cases.push_back({40, 33, 4, true, true, false, false});
  cases.push_back({3, 9, 6, true, false, false, true});  // seqlen < d_conv - 1: the state only shifts
  for (const PrefillCase& pc : cases) {
    const int64_t xs = pc.strided ? 3 * pc.channels + 2 : pc.channels;  // x: a slice of in_proj's output
    const int64_t os = pc.strided ? pc.channels + 1 : pc.channels;
    const int64_t hist = pc.d_conv - 1;
    std::vector<float> x = RandomVector(rng, pc.seqlen * xs, -2.0f, 2.0f);
    std::vector<float> weight = RandomVector(rng, pc.channels * pc.d_conv);
    std::vector<float> bias = RandomVector(rng, pc.channels);
    std::vector<float> state = RandomVector(rng, pc.channels * hist + 1, -2.0f, 2.0f);
    std::vector<float> want(pc.seqlen * os, kSentinel);
    std::vector<float> want_state = state;
    CausalConv1dParams p;
    p.seqlen = pc.seqlen;
    p.channels = pc.channels;
    p.d_conv = pc.d_conv;
    p.silu = pc.silu;
    p.x_token_stride = pc.strided ? xs : 0;
    p.out_token_stride = pc.strided ? os : 0;
    p.x = x.data();
    p.weight = weight.data();
    p.bias = pc.bias ? bias.data() : nullptr;
    p.conv_state = pc.state ? want_state.data() : nullptr;
    p.out = want.data();
    ASSERT_EQ(cpu::CausalConv1d(p, nullptr), kKernelOk);

    DeviceBuffer dx = Up(x), dw = Up(weight), db = Up(bias), ds = Up(state);
    DeviceBuffer dout = Up(std::vector<float>(pc.seqlen * os, kSentinel));
    p.x = dx.as<float>();
    p.weight = dw.as<float>();
    p.bias = pc.bias ? db.as<float>() : nullptr;
    p.conv_state = pc.state ? ds.as<float>() : nullptr;
    p.out = dout.as<float>();
    ASSERT_EQ(b().CausalConv1d(p), kKernelOk);
    const std::string what = "seqlen " + std::to_string(pc.seqlen) + " channels " + std::to_string(pc.channels) +
                             " d_conv " + std::to_string(pc.d_conv) + " state " + std::to_string(pc.state) + " bias " +
                             std::to_string(pc.bias) + " silu " + std::to_string(pc.silu) + " strided " +
                             std::to_string(pc.strided);
    EXPECT_TRUE(OutputMatch(Down(dout), want, pc.silu)) << what;
    // The state (with one float past its end that must stay) bitwise; unchanged without conv_state.
    EXPECT_TRUE(BitsEqual(Down(ds), pc.state ? want_state : state)) << what;
  }
}

// Cutting a sequence anywhere (empty and one-token pieces included) and
// carrying the state gives the unsplit call's bits, on the target itself.
TEST_P(Conv1dTest, PrefillSplitAnywhereEqualsUnsplitBitwise) {
  std::mt19937 rng(52);
  for (int64_t d_conv : {2, 4, 5}) {
    for (bool silu : {false, true}) {
      const int64_t seqlen = 50, channels = 37, hist = d_conv - 1;
      std::vector<float> x = RandomVector(rng, seqlen * channels, -2.0f, 2.0f);
      std::vector<float> weight = RandomVector(rng, channels * d_conv);
      std::vector<float> bias = RandomVector(rng, channels);
      std::vector<float> state0 = RandomVector(rng, channels * hist, -2.0f, 2.0f);
      DeviceBuffer dx = Up(x), dw = Up(weight), db = Up(bias);
      CausalConv1dParams p;
      p.weight = dw.as<float>();
      p.bias = db.as<float>();
      p.channels = channels;
      p.d_conv = d_conv;
      p.silu = silu;

      DeviceBuffer ds = Up(state0), dout = Up(std::vector<float>(seqlen * channels, kSentinel));
      p.x = dx.as<float>();
      p.out = dout.as<float>();
      p.conv_state = ds.as<float>();
      p.seqlen = seqlen;
      ASSERT_EQ(b().CausalConv1d(p), kKernelOk);
      const std::vector<float> whole = Down(dout), whole_state = Down(ds);

      for (const std::vector<int64_t>& cuts :
           {std::vector<int64_t>{1, 2, 3, 20, 20, 49}, std::vector<int64_t>{17, 33}, std::vector<int64_t>{0, 48}}) {
        DeviceBuffer ds2 = Up(state0), dout2 = Up(std::vector<float>(seqlen * channels, kSentinel));
        int64_t begin = 0;
        std::vector<int64_t> ends = cuts;
        ends.push_back(seqlen);
        for (int64_t end : ends) {
          p.x = dx.as<float>() + begin * channels;
          p.out = dout2.as<float>() + begin * channels;
          p.conv_state = ds2.as<float>();
          p.seqlen = end - begin;
          ASSERT_EQ(b().CausalConv1d(p), kKernelOk);
          begin = end;
        }
        EXPECT_TRUE(BitsEqual(Down(dout2), whole)) << "d_conv " << d_conv << " silu " << silu;
        EXPECT_TRUE(BitsEqual(Down(ds2), whole_state)) << "d_conv " << d_conv << " silu " << silu;
      }
    }
  }
}

// Sequences prefilled, then decoded one token at a time by the update form in
// a batch with padding rows and permuted slots: outputs and final states have
// the bits of one prefill over the whole sequence, on the target itself; the
// padding rows and unused slots are untouched. Also against the CPU update.
TEST_P(Conv1dTest, UpdateEqualsPrefillBitwise) {
  std::mt19937 rng(53);
  for (int64_t d_conv : {1, 4, 6}) {
    for (bool silu : {false, true}) {
      const int64_t channels = 45, num_slots = 5, prefix = 7, steps = 3, hist = d_conv - 1;
      const std::vector<int32_t> slots = {3, -1, 0, 4};  // row 1 is padding; slots 1 and 2 unused
      const int64_t batch = static_cast<int64_t>(slots.size());
      const int64_t total = prefix + steps;
      std::vector<float> weight = RandomVector(rng, channels * d_conv);
      std::vector<float> bias = RandomVector(rng, channels);
      std::vector<float> pool0 = RandomVector(rng, num_slots * channels * hist + 1, -2.0f, 2.0f);
      std::vector<std::vector<float>> seq(batch);
      for (auto& s : seq) s = RandomVector(rng, total * channels, -2.0f, 2.0f);
      DeviceBuffer dw = Up(weight), db = Up(bias);

      // Reference: each sequence in one prefill call from its slot's entry state.
      std::vector<std::vector<float>> ref_out(batch), ref_state(batch);
      for (int64_t r = 0; r < batch; ++r) {
        if (slots[r] < 0) continue;
        std::vector<float> st(pool0.begin() + slots[r] * channels * hist,
                              pool0.begin() + (slots[r] + 1) * channels * hist);
        DeviceBuffer dx = Up(seq[r]), ds = Up(st), dout = Up(std::vector<float>(total * channels));
        CausalConv1dParams p;
        p.x = dx.as<float>();
        p.weight = dw.as<float>();
        p.bias = db.as<float>();
        p.conv_state = hist > 0 ? ds.as<float>() : nullptr;
        p.out = dout.as<float>();
        p.seqlen = total;
        p.channels = channels;
        p.d_conv = d_conv;
        p.silu = silu;
        ASSERT_EQ(b().CausalConv1d(p), kKernelOk);
        ref_out[r] = Down(dout);
        ref_state[r] = hist > 0 ? Down(ds) : std::vector<float>();
      }

      // Prefill the prefix of each sequence into its slot of the pool, then decode.
      DeviceBuffer dpool = Up(pool0), dslots = Up(slots);
      std::vector<float> cpu_pool = pool0;
      for (int64_t r = 0; r < batch; ++r) {
        if (slots[r] < 0 || hist == 0) continue;
        DeviceBuffer dx = Up(seq[r]), dout = Up(std::vector<float>(prefix * channels));
        CausalConv1dParams p;
        p.x = dx.as<float>();
        p.weight = dw.as<float>();
        p.bias = db.as<float>();
        p.conv_state = dpool.as<float>() + slots[r] * channels * hist;
        p.out = dout.as<float>();
        p.seqlen = prefix;
        p.channels = channels;
        p.d_conv = d_conv;
        p.silu = silu;
        ASSERT_EQ(b().CausalConv1d(p), kKernelOk);
        p.x = seq[r].data();
        p.weight = weight.data();
        p.bias = bias.data();
        p.conv_state = cpu_pool.data() + slots[r] * channels * hist;
        std::vector<float> cpu_out(prefix * channels);
        p.out = cpu_out.data();
        ASSERT_EQ(cpu::CausalConv1d(p, nullptr), kKernelOk);
      }
      for (int64_t step = 0; step < steps; ++step) {
        const int64_t t = prefix + step;
        const int64_t xs = channels + 3;  // rows of a wider buffer
        std::vector<float> x(batch * xs, kSentinel);
        for (int64_t r = 0; r < batch; ++r) {
          for (int64_t c = 0; c < channels; ++c) x[r * xs + c] = seq[r][t * channels + c];
        }
        DeviceBuffer dx = Up(x), dout = Up(std::vector<float>(batch * channels, kSentinel));
        CausalConv1dUpdateParams u;
        u.x = dx.as<float>();
        u.weight = dw.as<float>();
        u.bias = db.as<float>();
        u.conv_state = dpool.as<float>();
        u.state_slots = dslots.as<int32_t>();
        u.out = dout.as<float>();
        u.batch = batch;
        u.num_slots = num_slots;
        u.channels = channels;
        u.d_conv = d_conv;
        u.silu = silu;
        u.x_batch_stride = xs;
        ASSERT_EQ(b().CausalConv1dUpdate(u), kKernelOk);
        const std::vector<float> got = Down(dout);

        std::vector<float> cpu_out(batch * channels, kSentinel);
        u.x = x.data();
        u.weight = weight.data();
        u.bias = bias.data();
        u.conv_state = cpu_pool.data();
        u.state_slots = slots.data();
        u.out = cpu_out.data();
        ASSERT_EQ(cpu::CausalConv1dUpdate(u, nullptr), kKernelOk);
        EXPECT_TRUE(OutputMatch(got, cpu_out, silu)) << "vs CPU, d_conv " << d_conv << " step " << step;

        for (int64_t r = 0; r < batch; ++r) {
          if (slots[r] < 0) {
            for (int64_t c = 0; c < channels; ++c) ASSERT_EQ(got[r * channels + c], kSentinel) << "padding row";
            continue;
          }
          EXPECT_TRUE(BitsEqual(got.data() + r * channels, ref_out[r].data() + t * channels, channels))
              << "d_conv " << d_conv << " silu " << silu << " step " << step << " row " << r;
        }
      }
      const std::vector<float> pool = Down(dpool);
      EXPECT_TRUE(BitsEqual(pool, cpu_pool)) << "d_conv " << d_conv;
      for (int64_t r = 0; r < batch; ++r) {
        if (slots[r] < 0 || hist == 0) continue;
        EXPECT_TRUE(BitsEqual(pool.data() + slots[r] * channels * hist, ref_state[r].data(), channels * hist))
            << "final state, d_conv " << d_conv << " row " << r;
      }
      for (int32_t unused : {1, 2}) {  // untouched, bit for bit
        EXPECT_TRUE(BitsEqual(pool.data() + unused * channels * hist, pool0.data() + unused * channels * hist,
                              channels * hist));
      }
      EXPECT_EQ(pool.back(), pool0.back());  // past the pool's end
    }
  }
}

TEST_P(Conv1dTest, UpdateWithoutSlotsMatchesCpu) {
  std::mt19937 rng(54);
  for (int64_t channels : {1, 7, 130}) {
    for (bool silu : {false, true}) {
      const int64_t batch = 3, num_slots = 4, d_conv = 4, hist = 3;
      const int64_t os = channels + 2;
      std::vector<float> x = RandomVector(rng, batch * channels, -2.0f, 2.0f);
      std::vector<float> weight = RandomVector(rng, channels * d_conv);
      std::vector<float> pool = RandomVector(rng, num_slots * channels * hist, -2.0f, 2.0f);
      std::vector<float> want(batch * os, kSentinel), want_pool = pool;
      CausalConv1dUpdateParams u;
      u.batch = batch;
      u.num_slots = num_slots;
      u.channels = channels;
      u.d_conv = d_conv;
      u.silu = silu;
      u.out_batch_stride = os;
      u.x = x.data();
      u.weight = weight.data();
      u.conv_state = want_pool.data();
      u.out = want.data();
      ASSERT_EQ(cpu::CausalConv1dUpdate(u, nullptr), kKernelOk);
      DeviceBuffer dx = Up(x), dw = Up(weight), dpool = Up(pool), dout = Up(std::vector<float>(batch * os, kSentinel));
      u.x = dx.as<float>();
      u.weight = dw.as<float>();
      u.conv_state = dpool.as<float>();
      u.out = dout.as<float>();
      ASSERT_EQ(b().CausalConv1dUpdate(u), kKernelOk);
      EXPECT_TRUE(OutputMatch(Down(dout), want, silu)) << "channels " << channels;
      EXPECT_TRUE(BitsEqual(Down(dpool), want_pool)) << "channels " << channels;
    }
  }
}

// A slot >= num_slots (only visible on the device) skips its row, raises the
// flag reported by the next Synchronize, and leaves the other rows right.
TEST_P(Conv1dTest, UpdateBadSlotSkipsItsRowAndRaisesTheFlag) {
  std::mt19937 rng(55);
  const int64_t channels = 20, num_slots = 3, d_conv = 4, hist = 3;
  const std::vector<int32_t> slots = {0, 3, 2, 1000};
  const std::vector<int32_t> valid_slots = {0, -1, 2, -1};  // what the other rows must equal
  const int64_t batch = static_cast<int64_t>(slots.size());
  std::vector<float> x = RandomVector(rng, batch * channels, -2.0f, 2.0f);
  std::vector<float> weight = RandomVector(rng, channels * d_conv);
  std::vector<float> bias = RandomVector(rng, channels);
  std::vector<float> pool = RandomVector(rng, num_slots * channels * hist, -2.0f, 2.0f);
  std::vector<float> want(batch * channels, kSentinel), want_pool = pool;
  CausalConv1dUpdateParams u;
  u.batch = batch;
  u.num_slots = num_slots;
  u.channels = channels;
  u.d_conv = d_conv;
  u.x = x.data();
  u.weight = weight.data();
  u.bias = bias.data();
  u.conv_state = want_pool.data();
  u.state_slots = valid_slots.data();
  u.out = want.data();
  ASSERT_EQ(cpu::CausalConv1dUpdate(u, nullptr), kKernelOk);

  DeviceBuffer dx = Up(x), dw = Up(weight), db = Up(bias), dpool = Up(pool), dslots = Up(slots);
  DeviceBuffer dout = Up(std::vector<float>(batch * channels, kSentinel));
  u.x = dx.as<float>();
  u.weight = dw.as<float>();
  u.bias = db.as<float>();
  u.conv_state = dpool.as<float>();
  u.state_slots = dslots.as<int32_t>();
  u.out = dout.as<float>();
  ASSERT_EQ(b().CausalConv1dUpdate(u), kKernelOk);  // the launcher cannot see device slots
  EXPECT_EQ(b().Synchronize(), kKernelInvalidArgument);
  EXPECT_EQ(b().Synchronize(), kKernelOk);  // reported once
  EXPECT_TRUE(OutputMatch(Down(dout), want, /*silu=*/true));
  EXPECT_TRUE(BitsEqual(Down(dpool), want_pool));
}

TEST_P(Conv1dTest, RejectsInvalidArguments) {
  DeviceBuffer buf = Up(std::vector<float>(256, 0.5f));
  float* d = buf.as<float>();
  CausalConv1dParams p;
  p.x = d;
  p.weight = d + 64;
  p.conv_state = d + 128;
  p.out = d + 192;
  p.seqlen = 2;
  p.channels = 8;
  p.d_conv = 4;
  EXPECT_EQ(b().CausalConv1d(p), kKernelOk);
  CausalConv1dParams bad = p;
  bad.x = nullptr;
  EXPECT_EQ(b().CausalConv1d(bad), kKernelInvalidArgument);
  bad = p;
  bad.weight = nullptr;
  EXPECT_EQ(b().CausalConv1d(bad), kKernelInvalidArgument);
  bad = p;
  bad.out = nullptr;
  EXPECT_EQ(b().CausalConv1d(bad), kKernelInvalidArgument);
  bad = p;
  bad.seqlen = -1;
  EXPECT_EQ(b().CausalConv1d(bad), kKernelInvalidArgument);
  bad = p;
  bad.channels = 0;
  EXPECT_EQ(b().CausalConv1d(bad), kKernelInvalidArgument);
  bad = p;
  bad.d_conv = 0;
  EXPECT_EQ(b().CausalConv1d(bad), kKernelInvalidArgument);
  bad = p;
  bad.seqlen = 0;  // nothing to do, state unchanged
  EXPECT_EQ(b().CausalConv1d(bad), kKernelOk);

  CausalConv1dUpdateParams u;
  u.x = d;
  u.weight = d + 64;
  u.conv_state = d + 128;
  u.out = d + 192;
  u.batch = 2;
  u.num_slots = 2;
  u.channels = 8;
  u.d_conv = 4;
  EXPECT_EQ(b().CausalConv1dUpdate(u), kKernelOk);
  CausalConv1dUpdateParams ub = u;
  ub.conv_state = nullptr;
  EXPECT_EQ(b().CausalConv1dUpdate(ub), kKernelInvalidArgument);
  ub = u;
  ub.x = nullptr;
  EXPECT_EQ(b().CausalConv1dUpdate(ub), kKernelInvalidArgument);
  ub = u;
  ub.batch = -1;
  EXPECT_EQ(b().CausalConv1dUpdate(ub), kKernelInvalidArgument);
  ub = u;
  ub.channels = 0;
  EXPECT_EQ(b().CausalConv1dUpdate(ub), kKernelInvalidArgument);
  ub = u;
  ub.d_conv = 0;
  EXPECT_EQ(b().CausalConv1dUpdate(ub), kKernelInvalidArgument);
  ub = u;
  ub.num_slots = 1;  // no state_slots: row 1 would use slot 1
  EXPECT_EQ(b().CausalConv1dUpdate(ub), kKernelInvalidArgument);
  ub = u;
  ub.batch = 0;
  EXPECT_EQ(b().CausalConv1dUpdate(ub), kKernelOk);
  EXPECT_EQ(b().Synchronize(), kKernelOk);
}

INSTANTIATE_TEST_SUITE_P(Cuda, Conv1dTest, CudaTestTargets(), CudaTargetName);

}  // namespace
}  // namespace hybridserve::kernels
