#include "kernels/cpu/conv1d.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::BitsEqual;

struct ConvProblem {
  int64_t seqlen, channels, d_conv;
  std::vector<float> x, weight, bias;
  ConvProblem(int64_t seqlen_in, int64_t channels_in, int64_t d_conv_in, uint32_t seed)
      : seqlen(seqlen_in), channels(channels_in), d_conv(d_conv_in) {
    std::mt19937 rng(seed);
    x = testing::RandomVector(rng, seqlen * channels, -2.0f, 2.0f);
    weight = testing::RandomVector(rng, channels * d_conv);
    bias = testing::RandomVector(rng, channels);
  }

  // Runs tokens [begin, end) with `state` carried in and out.
  std::vector<float> Run(int64_t begin, int64_t end, std::vector<float>& state, bool silu, ThreadPool* pool) const {
    std::vector<float> out((end - begin) * channels, NAN);
    CausalConv1dParams p;
    p.x = x.data() + begin * channels;
    p.weight = weight.data();
    p.bias = bias.data();
    p.conv_state = state.data();
    p.out = out.data();
    p.seqlen = end - begin;
    p.channels = channels;
    p.d_conv = d_conv;
    p.silu = silu;
    EXPECT_EQ(CausalConv1d(p, pool), kKernelOk);
    return out;
  }
};

TEST(CausalConv1dTest, MatchesDirectDefinition) {
  const ConvProblem pr(37, 21, 4, 1);
  std::vector<float> state(pr.channels * 3, 0.0f);
  const std::vector<float> out = pr.Run(0, pr.seqlen, state, /*silu=*/true, nullptr);
  std::vector<double> want(out.size());
  for (int64_t t = 0; t < pr.seqlen; ++t) {
    for (int64_t c = 0; c < pr.channels; ++c) {
      double acc = pr.bias[c];
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t j = t + k - 3;
        if (j >= 0) acc += static_cast<double>(pr.weight[c * 4 + k]) * pr.x[j * pr.channels + c];
      }
      want[t * pr.channels + c] = acc / (1.0 + std::exp(-acc));
    }
  }
  // fp32 sum of 5 terms and fp32 SiLU against double: a few ulps; 1e-5 relative
  // plus 1e-6 absolute (values are O(1)) is ~100 ulps of margin.
  EXPECT_TRUE(testing::AllClose(out, want, 1e-5, 1e-6));
  // The state holds the last d_conv - 1 inputs, oldest first.
  for (int64_t c = 0; c < pr.channels; ++c) {
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(state[c * 3 + j], pr.x[(pr.seqlen - 3 + j) * pr.channels + c]);
    }
  }
}

TEST(CausalConv1dTest, SplitAnywhereIsBitIdenticalToOneCall) {
  for (int64_t d_conv : {1, 2, 4}) {
    const ConvProblem pr(50, 300, d_conv, 2);
    ThreadPool pool(2);
    std::vector<float> state_whole(pr.channels * (d_conv - 1) + 1, 0.0f);
    const std::vector<float> whole = pr.Run(0, pr.seqlen, state_whole, true, &pool);
    // Splits include pieces shorter than d_conv - 1 (state partly carried through).
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{1}, {2, 3}, {17}, {1, 2, 3, 4, 5, 49}, {25, 26}}) {
      std::vector<float> state(pr.channels * (d_conv - 1) + 1, 0.0f);
      std::vector<float> joined;
      int64_t begin = 0;
      std::vector<int64_t> ends = cuts;
      ends.push_back(pr.seqlen);
      for (int64_t end : ends) {
        const std::vector<float> part = pr.Run(begin, end, state, true, begin % 2 ? &pool : nullptr);
        joined.insert(joined.end(), part.begin(), part.end());
        begin = end;
      }
      EXPECT_TRUE(BitsEqual(joined, whole)) << "d_conv " << d_conv << " first cut " << cuts[0];
      EXPECT_TRUE(BitsEqual(state, state_whole));
    }
  }
}

// The update form runs the prefill form's per-element arithmetic (same fma
// order, same SiLU), so it is checked bit for bit, not with a tolerance.
TEST(CausalConv1dUpdateTest, StepsAreBitIdenticalToPrefill) {
  const ConvProblem pr(12, 40, 4, 3);
  const ConvProblem other(12, 40, 4, 4);  // a second sequence in the batch
  std::vector<float> state_ref(pr.channels * 3, 0.0f);
  const std::vector<float> want = pr.Run(0, pr.seqlen, state_ref, true, nullptr);

  // Prefill the first 5 tokens, then decode the rest one at a time in a batch
  // of 3 rows: [padding, other, this], slots into a pool of 4.
  std::vector<float> pool_state(4 * pr.channels * 3, 0.0f);
  std::vector<float> own_state(pr.channels * 3, 0.0f);
  const std::vector<float> head = pr.Run(0, 5, own_state, true, nullptr);
  EXPECT_TRUE(BitsEqual(head.data(), want.data(), 5 * pr.channels));
  std::copy(own_state.begin(), own_state.end(), pool_state.begin() + 2 * pr.channels * 3);
  const std::vector<int32_t> slots = {-1, 0, 2};
  ThreadPool pool(2);
  for (int64_t t = 5; t < pr.seqlen; ++t) {
    std::vector<float> x(3 * pr.channels, 0.0f), out(3 * pr.channels, -5.0f);
    std::copy_n(other.x.begin() + t * pr.channels, pr.channels, x.begin() + pr.channels);
    std::copy_n(pr.x.begin() + t * pr.channels, pr.channels, x.begin() + 2 * pr.channels);
    CausalConv1dUpdateParams p;
    p.x = x.data();
    p.weight = pr.weight.data();
    p.bias = pr.bias.data();
    p.conv_state = pool_state.data();
    p.state_slots = slots.data();
    p.out = out.data();
    p.batch = 3;
    p.num_slots = 4;
    p.channels = pr.channels;
    p.d_conv = 4;
    ASSERT_EQ(CausalConv1dUpdate(p, &pool), kKernelOk);
    EXPECT_TRUE(BitsEqual(out.data() + 2 * pr.channels, want.data() + t * pr.channels, pr.channels)) << "token " << t;
    EXPECT_EQ(out[0], -5.0f) << "padding row written";
  }
  EXPECT_TRUE(BitsEqual(pool_state.data() + 2 * pr.channels * 3, state_ref.data(), pr.channels * 3));
}

TEST(CausalConv1dTest, RejectsInvalidParams) {
  CausalConv1dParams p;
  EXPECT_EQ(CausalConv1d(p, nullptr), kKernelInvalidArgument);
  CausalConv1dUpdateParams u;
  EXPECT_EQ(CausalConv1dUpdate(u, nullptr), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
