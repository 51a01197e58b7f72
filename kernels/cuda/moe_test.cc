// A mixture-of-experts block on the device (kernels/moe_params.h): the CUDA
// MoeRoute, ExpertMatmul and MoeCombine on the emulated build and (where a
// device is present) on the GPU, against the CPU backend's, and the CPU's
// ExpertMatmul against its own per-expert Matmul calls.
//   MoeRoute: every router kind gives the CPU's entries, offsets and slots;
//     weights bitwise on the emulator (its expf is the host's), within
//     2e-6 relative on a GPU (expf within 2 ulp, then a sum over up to 64
//     experts and one or two divisions: about 16 ulp); every result is also checked for the structure the
//     params promise, whatever the CPU says.
//   ExpertMatmul: each expert's rows are the bits of a Matmul of their own
//     on the same backend, and nothing else is written.
//   MoeCombine: the bits of ScatterAddRows issued expert by expert.

#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/kernel_status.h"
#include "kernels/moe_params.h"

namespace hybridserve::kernels {
namespace {

using cpu::testing::BitsEqual;
using cpu::testing::RandomVector;
using cuda_testing::CudaTargetName;
using cuda_testing::CudaTestTargets;

constexpr float kSentinel = 7.25f;

// What MoeRoute wrote, on the host.
struct Route {
  std::vector<int32_t> rows, offsets, slots;
  std::vector<float> weights;
};

Route RouteOnCpu(MoeRouteParams p) {
  const int64_t entries = p.n_rows * p.top_k + (p.shared_gate ? p.n_rows : 0);
  Route r;
  r.rows.assign(entries, -1);
  r.weights.assign(entries, kSentinel);
  r.offsets.assign(p.experts + 1, -1);
  r.slots.assign(p.n_rows * p.top_k, -1);
  p.rows = r.rows.data();
  p.weights = r.weights.data();
  p.offsets = r.offsets.data();
  p.slots = r.slots.data();
  EXPECT_EQ(cpu::MoeRoute(p, nullptr), kKernelOk);
  return r;
}

// The structure every backend's routing must have: offsets from 0 to n * k,
// rows ascending within each expert, each row k times with distinct experts,
// slots ascending and pointing at the row's entries, the shared gate's
// entries after the routed ones.
::testing::AssertionResult WellFormed(const MoeRouteParams& p, const Route& r) {
  const int64_t k = p.top_k;
  const int64_t routed = p.n_rows * k;
  if (r.offsets[0] != 0 || r.offsets[p.experts] != routed) return ::testing::AssertionFailure() << "offsets' ends";
  std::vector<int32_t> expert_of(routed, -1);
  for (int64_t e = 0; e < p.experts; ++e) {
    if (r.offsets[e + 1] < r.offsets[e]) return ::testing::AssertionFailure() << "offsets decrease at " << e;
    for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
      expert_of[i] = static_cast<int32_t>(e);
      if (r.rows[i] < 0 || r.rows[i] >= p.n_rows) return ::testing::AssertionFailure() << "row out of range at " << i;
      if (i > r.offsets[e] && r.rows[i] <= r.rows[i - 1]) {
        return ::testing::AssertionFailure() << "rows not ascending in expert " << e;
      }
      if (!std::isfinite(r.weights[i])) return ::testing::AssertionFailure() << "weight " << i << " not finite";
    }
  }
  for (int64_t row = 0; row < p.n_rows; ++row) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t s = r.slots[row * k + j];
      if (s < 0 || s >= routed || r.rows[s] != row) return ::testing::AssertionFailure() << "slot of row " << row;
      if (j > 0 && s <= r.slots[row * k + j - 1]) return ::testing::AssertionFailure() << "slots of row " << row;
    }
  }
  if (p.shared_gate) {
    for (int64_t row = 0; row < p.n_rows; ++row) {
      if (r.rows[routed + row] != row) return ::testing::AssertionFailure() << "shared gate row " << row;
    }
  }
  return ::testing::AssertionSuccess();
}

struct RouterCase {
  std::string name;
  MoeRouterKind kind;
  int64_t experts, top_k, n_group, topk_group;
  bool norm, shared_gate, bias;
  float scale;
};

std::vector<RouterCase> RouterCases() {
  return {
      {"granite 8/2", MoeRouterKind::kTopKSoftmax, 8, 2, 1, 1, false, false, false, 1.0f},
      {"granite 64/8", MoeRouterKind::kTopKSoftmax, 64, 8, 1, 1, false, false, false, 1.0f},
      {"qwen 64/8 norm gate", MoeRouterKind::kSoftmaxTopK, 64, 8, 1, 1, true, true, false, 1.0f},
      {"qwen 10/3", MoeRouterKind::kSoftmaxTopK, 10, 3, 1, 1, false, false, false, 1.0f},
      {"nemotron 16/4 groups", MoeRouterKind::kSigmoidGroupTopK, 16, 4, 4, 2, true, false, true, 2.5f},
      {"nemotron 12/6 one group", MoeRouterKind::kSigmoidGroupTopK, 12, 6, 1, 1, false, false, true, 1.0f},
      {"nemotron 32/3 groups no bias", MoeRouterKind::kSigmoidGroupTopK, 32, 3, 8, 3, true, false, false, 1.0f},
  };
}

MoeRouteParams Params(const RouterCase& c, int64_t n) {
  MoeRouteParams p;
  p.n_rows = n;
  p.experts = c.experts;
  p.top_k = c.top_k;
  p.kind = c.kind;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.norm_topk_prob = c.norm;
  p.routed_scaling_factor = c.scale;
  p.shared_gate = c.shared_gate;
  return p;
}

class MoeTest : public cuda_testing::CudaKernelTest {
 protected:
  // Runs p (host logits and bias) on the test's backend.
  Route RunRoute(MoeRouteParams p, const std::vector<float>& logits, const std::vector<float>& bias) {
    const int64_t entries = p.n_rows * p.top_k + (p.shared_gate ? p.n_rows : 0);
    DeviceBuffer dl = Up(logits);
    DeviceBuffer db = bias.empty() ? DeviceBuffer() : Up(bias);
    DeviceBuffer rows = Up(std::vector<int32_t>(std::max<int64_t>(entries, 1), -1));
    DeviceBuffer weights = Up(std::vector<float>(std::max<int64_t>(entries, 1), kSentinel));
    DeviceBuffer offsets = Up(std::vector<int32_t>(p.experts + 1, -1));
    DeviceBuffer slots = Up(std::vector<int32_t>(std::max<int64_t>(p.n_rows * p.top_k, 1), -1));
    p.logits = dl.as<float>();
    p.bias = db.empty() ? nullptr : db.as<float>();
    p.rows = rows.as<int32_t>();
    p.weights = weights.as<float>();
    p.offsets = offsets.as<int32_t>();
    p.slots = slots.as<int32_t>();
    EXPECT_EQ(b().MoeRoute(p), kKernelOk);
    Route r;
    r.rows = cuda_testing::Download<int32_t>(b(), p.rows, entries);
    r.weights = cuda_testing::Download<float>(b(), p.weights, entries);
    r.offsets = cuda_testing::Download<int32_t>(b(), p.offsets, p.experts + 1);
    r.slots = cuda_testing::Download<int32_t>(b(), p.slots, p.n_rows * p.top_k);
    return r;
  }
};

TEST_P(MoeTest, RouteGivesTheCpusEntriesForEveryRouterKind) {
  std::mt19937 rng(41);
  int cases = 0;
  for (const RouterCase& c : RouterCases()) {
    for (int64_t n : {1, 3, 37, 300}) {  // 300: more rows than one block of either kernel has threads
      SCOPED_TRACE(c.name + ", " + std::to_string(n) + " rows");
      MoeRouteParams p = Params(c, n);
      const int64_t cols = c.experts + (c.shared_gate ? 1 : 0);
      p.logit_stride = cols + (n == 37 ? 3 : 0);  // a padded stride once
      const std::vector<float> logits = RandomVector(rng, n * p.logit_stride, -4.0f, 4.0f);
      const std::vector<float> bias = c.bias ? RandomVector(rng, c.experts, -0.3f, 0.3f) : std::vector<float>();
      MoeRouteParams host = p;
      host.logits = logits.data();
      host.bias = bias.empty() ? nullptr : bias.data();
      const Route want = RouteOnCpu(host);
      ASSERT_TRUE(WellFormed(p, want));
      const Route got = RunRoute(p, logits, bias);
      ASSERT_TRUE(WellFormed(p, got));
      EXPECT_EQ(got.offsets, want.offsets);
      EXPECT_EQ(got.rows, want.rows);
      EXPECT_EQ(got.slots, want.slots);
      if (emulated()) {
        EXPECT_TRUE(BitsEqual(got.weights, want.weights));
      } else {
        for (size_t i = 0; i < want.weights.size(); ++i) {
          EXPECT_NEAR(got.weights[i], want.weights[i], 2e-6f * std::fabs(want.weights[i]) + 1e-30f) << "entry " << i;
        }
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 28);
}

// Exact ties: top-k by logit (Granite) and by choice score (Nemotron-H) go to
// the lower expert id on every backend; among tied probabilities (Qwen) the
// CUDA backend also picks the lower ids (the CPU follows torch.topk there).
TEST_P(MoeTest, RouteBreaksExactTiesTowardTheLowerExpertId) {
  for (const RouterCase& c : RouterCases()) {
    SCOPED_TRACE(c.name);
    const int64_t n = 4;
    MoeRouteParams p = Params(c, n);
    const int64_t cols = c.experts + (c.shared_gate ? 1 : 0);
    std::vector<float> logits(n * cols, 0.5f);  // row 0: every expert tied
    for (int64_t e = 0; e < c.experts; ++e) {
      logits[1 * cols + e] = static_cast<float>(e % 3);  // row 1: ties within three levels
      logits[2 * cols + e] = -static_cast<float>(e);     // row 2: strictly falling
      logits[3 * cols + e] = static_cast<float>(e / 2);  // row 3: rising pairs
    }
    const std::vector<float> bias = c.bias ? std::vector<float>(c.experts, 0.125f) : std::vector<float>();
    const Route got = RunRoute(p, logits, bias);
    ASSERT_TRUE(WellFormed(p, got));
    // Row 0 and row 2 choose experts 0..k-1, when their groups are kept (all
    // groups tie in row 0, and the lower groups win; row 2's best are first).
    for (int64_t row : {0, 2}) {
      for (int64_t j = 0; j < c.top_k; ++j) {
        EXPECT_EQ(got.rows[got.slots[row * c.top_k + j]], row);
        const int32_t s = got.slots[row * c.top_k + j];
        const auto at = std::upper_bound(got.offsets.begin(), got.offsets.end(), s) - got.offsets.begin() - 1;
        EXPECT_EQ(at, j) << "row " << row << " pick " << j;
      }
    }
    if (c.kind != MoeRouterKind::kSoftmaxTopK) {
      // Where the CPU's rule is the same (not Qwen's torch.topk order), the
      // whole routing matches it.
      MoeRouteParams host = p;
      host.logits = logits.data();
      host.bias = bias.empty() ? nullptr : bias.data();
      const Route want = RouteOnCpu(host);
      EXPECT_EQ(got.offsets, want.offsets);
      EXPECT_EQ(got.rows, want.rows);
      EXPECT_EQ(got.slots, want.slots);
    }
  }
}

TEST_P(MoeTest, RouteRefusesBadParamsAndWritesOffsetsForNoRows) {
  MoeRouteParams p = Params(RouterCases()[4], 0);
  const Route none = RunRoute(p, std::vector<float>(1, 0.0f), std::vector<float>(16, 0.0f));
  EXPECT_EQ(none.offsets, std::vector<int32_t>(17, 0));

  DeviceBuffer logits = Up(std::vector<float>(64 * 17, 0.0f));
  DeviceBuffer rows = Up(std::vector<int32_t>(64 * 8, 0));
  DeviceBuffer weights = Up(std::vector<float>(64 * 8, 0.0f));
  DeviceBuffer offsets = Up(std::vector<int32_t>(17, -1));
  DeviceBuffer slots = Up(std::vector<int32_t>(64 * 8, 0));
  MoeRouteParams good = Params(RouterCases()[4], 64);
  good.logits = logits.as<float>();
  good.rows = rows.as<int32_t>();
  good.weights = weights.as<float>();
  good.offsets = offsets.as<int32_t>();
  good.slots = slots.as<int32_t>();
  std::vector<MoeRouteParams> bad(9, good);
  bad[0].top_k = 0;
  bad[1].top_k = 17;
  bad[2].n_group = 3;  // 16 experts do not split into 3 groups
  bad[3].topk_group = 5;
  bad[4].offsets = nullptr;
  bad[5].slots = nullptr;
  bad[6].logit_stride = 15;
  bad[7].routed_scaling_factor = NAN;
  bad[8].n_rows = kMaxMoeRouteEntries / 4 + 1;  // too many entries
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(b().MoeRoute(bad[i]), kKernelInvalidArgument) << "case " << i;
    EXPECT_EQ(cpu::MoeRoute(bad[i], nullptr), kKernelInvalidArgument) << "case " << i;
  }
  EXPECT_EQ(cuda_testing::Download<int32_t>(b(), offsets.data(), 17), std::vector<int32_t>(17, -1))
      << "a refused call wrote";
}

// Offsets with empty experts, an expert holding every row, and rows past
// offsets[experts] that must stay untouched.
std::vector<int32_t> SomeOffsets(int64_t experts, int64_t tokens, std::mt19937& rng) {
  std::vector<int32_t> counts(experts, 0);
  counts[1] = static_cast<int32_t>(tokens);  // an expert with every row
  for (int64_t e = 3; e < experts; ++e) counts[e] = std::uniform_int_distribution<int32_t>(0, tokens)(rng);
  counts[experts - 1] = 0;
  std::vector<int32_t> offsets(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + counts[e];
  return offsets;
}

TEST_P(MoeTest, ExpertMatmulGivesEachExpertTheBitsOfItsOwnMatmul) {
  std::mt19937 rng(43);
  int cases = 0;
  for (bool bf16 : {false, true}) {
    for (int64_t tokens : {1, 3, 9, 20}) {
      for (MatmulMode mode : {MatmulMode::kDeterministic, MatmulMode::kFast}) {
        SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + ", " + std::to_string(tokens) + " tokens, mode " +
                     std::to_string(static_cast<int>(mode)));
        const int64_t experts = 6, n = 24, k = 300, lda = k + 5, ldo = n + 3;
        const std::vector<int32_t> offsets = SomeOffsets(experts, tokens, rng);
        const int64_t used = offsets[experts];
        const int64_t rows = used + 2;  // two rows past the experts' that nothing may write
        const std::vector<float> a = RandomVector(rng, rows * lda);
        std::vector<float> w = RandomVector(rng, experts * n * k);
        std::vector<uint16_t> w16(w.size());
        for (size_t i = 0; i < w.size(); ++i) w16[i] = FloatToBf16(w[i]);
        const std::vector<float> shared_a = RandomVector(rng, tokens * k);
        const std::vector<float> shared_w = RandomVector(rng, 10 * k);
        const std::vector<float> shared_bias = RandomVector(rng, 10);
        const std::vector<float> out0(rows * ldo, kSentinel);

        DeviceBuffer da = Up(a), dw = Up(w), dw16 = Up(w16), doff = Up(offsets);
        DeviceBuffer dsa = Up(shared_a), dsw = Up(shared_w), dsb = Up(shared_bias);
        DeviceBuffer got = Up(out0), want = Up(out0);
        DeviceBuffer shared_got = Up(std::vector<float>(tokens * 10, kSentinel));
        DeviceBuffer shared_want = Up(std::vector<float>(tokens * 10, kSentinel));

        ExpertMatmulParams p;
        p.a = da.as<float>();
        p.offsets = doff.as<int32_t>();
        if (bf16) {
          p.w_bf16 = dw16.as<uint16_t>();
        } else {
          p.w = dw.as<float>();
        }
        p.out = got.as<float>();
        p.experts = experts;
        p.rows = rows;
        p.max_rows = tokens;
        p.n = n;
        p.k = k;
        p.lda = lda;
        p.ldo = ldo;
        MatmulParams shared;
        shared.a = dsa.as<float>();
        shared.w = dsw.as<float>();
        shared.bias = dsb.as<float>();
        shared.out = shared_got.as<float>();
        shared.m = tokens;
        shared.n = 10;
        shared.k = k;
        ASSERT_EQ(b().ExpertMatmul(p, &shared, 1, mode), kKernelOk);

        // The CUDA backend runs its deterministic kernel in both modes; the
        // shared item runs in the call's mode.
        const MatmulMode expert_mode = MatmulMode::kDeterministic;
        for (int64_t e = 0; e < experts; ++e) {
          const int64_t count = offsets[e + 1] - offsets[e];
          if (count == 0) continue;
          MatmulParams item;
          item.a = p.a + offsets[e] * lda;
          if (bf16) {
            item.w_bf16 = p.w_bf16 + e * n * k;
          } else {
            item.w = p.w + e * n * k;
          }
          item.out = want.as<float>() + offsets[e] * ldo;
          item.m = count;
          item.n = n;
          item.k = k;
          item.lda = lda;
          item.ldo = ldo;
          ASSERT_EQ(b().Matmul(item, expert_mode), kKernelOk);
        }
        MatmulParams shared_ref = shared;
        shared_ref.out = shared_want.as<float>();
        ASSERT_EQ(b().Matmul(shared_ref, mode), kKernelOk);
        EXPECT_TRUE(BitsEqual(Down(got), Down(want)));
        EXPECT_TRUE(BitsEqual(Down(shared_got), Down(shared_want)));
        const std::vector<float> out = Down(got);
        EXPECT_EQ(out[(rows - 1) * ldo], kSentinel) << "a row past offsets[experts] was written";
        EXPECT_EQ(out[0 * ldo + n], kSentinel) << "the padding past n was written";
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 16);
}

TEST_P(MoeTest, ExpertMatmulRefusesABadItemAndRunsNothing) {
  std::mt19937 rng(44);
  const std::vector<int32_t> offsets = {0, 2, 3};
  DeviceBuffer da = Up(RandomVector(rng, 3 * 8)), dw = Up(RandomVector(rng, 2 * 4 * 8)), doff = Up(offsets);
  DeviceBuffer out = Up(std::vector<float>(3 * 4, kSentinel));
  ExpertMatmulParams p;
  p.a = da.as<float>();
  p.offsets = doff.as<int32_t>();
  p.w = dw.as<float>();
  p.out = out.as<float>();
  p.experts = 2;
  p.rows = 3;
  p.max_rows = 2;
  p.n = 4;
  p.k = 8;
  MatmulParams bad;  // no a, no out
  bad.m = 1;
  bad.n = 1;
  bad.k = 1;
  EXPECT_EQ(b().ExpertMatmul(p, &bad, 1, MatmulMode::kDeterministic), kKernelInvalidArgument);
  EXPECT_EQ(b().ExpertMatmul(p, nullptr, 1, MatmulMode::kDeterministic), kKernelInvalidArgument);
  ExpertMatmulParams both = p;
  both.w_bf16 = reinterpret_cast<const uint16_t*>(p.w);
  EXPECT_EQ(b().ExpertMatmul(both, nullptr, 0, MatmulMode::kDeterministic), kKernelInvalidArgument);
  ExpertMatmulParams too_many = p;
  too_many.max_rows = 4;  // more than rows
  EXPECT_EQ(b().ExpertMatmul(too_many, nullptr, 0, MatmulMode::kDeterministic), kKernelInvalidArgument);
  EXPECT_TRUE(BitsEqual(Down(out), std::vector<float>(3 * 4, kSentinel)));
}

TEST_P(MoeTest, CombineGivesTheBitsOfScatterAddRowsExpertByExpert) {
  std::mt19937 rng(45);
  int cases = 0;
  for (const RouterCase& c : RouterCases()) {
    for (int64_t dim : {1, 7, 64, 1030}) {
      SCOPED_TRACE(c.name + ", dim " + std::to_string(dim));
      const int64_t n = 11;
      MoeRouteParams p = Params(c, n);
      const int64_t cols = c.experts + (c.shared_gate ? 1 : 0);
      const std::vector<float> logits = RandomVector(rng, n * cols, -4.0f, 4.0f);
      MoeRouteParams host = p;
      host.logits = logits.data();
      const std::vector<float> bias(c.experts, 0.0f);
      host.bias = bias.data();
      const Route r = RouteOnCpu(host);
      const int64_t routed = n * c.top_k;
      const int64_t xs = dim + (dim == 7 ? 2 : 0);
      const std::vector<float> x = RandomVector(rng, routed * xs, -3.0f, 3.0f);
      const std::vector<float> out0 = RandomVector(rng, n * dim);

      // The reference: the CPU's ScatterAddRows, expert by expert.
      std::vector<float> want = out0;
      for (int64_t e = 0; e < c.experts; ++e) {
        ScatterAddRowsParams add;
        add.x = x.data() + r.offsets[e] * xs;
        add.index = r.rows.data() + r.offsets[e];
        add.weight = r.weights.data() + r.offsets[e];
        add.out = want.data();
        add.n_rows = r.offsets[e + 1] - r.offsets[e];
        add.dim = dim;
        add.x_row_stride = xs;
        ASSERT_EQ(cpu::ScatterAddRows(add, nullptr), kKernelOk);
      }
      MoeCombineParams m;
      m.n_rows = n;
      m.per_row = c.top_k;
      m.dim = dim;
      m.x_row_stride = xs;
      std::vector<float> cpu_out = out0;
      m.x = x.data();
      m.slots = r.slots.data();
      m.weights = r.weights.data();
      m.out = cpu_out.data();
      ASSERT_EQ(cpu::MoeCombine(m, nullptr), kKernelOk);
      EXPECT_TRUE(BitsEqual(cpu_out, want));

      DeviceBuffer dx = Up(x), dslots = Up(r.slots), dw = Up(r.weights), dout = Up(out0);
      m.x = dx.as<float>();
      m.slots = dslots.as<int32_t>();
      m.weights = dw.as<float>();
      m.out = dout.as<float>();
      ASSERT_EQ(b().MoeCombine(m), kKernelOk);
      EXPECT_TRUE(BitsEqual(Down(dout), want));
      EXPECT_FALSE(BitsEqual(want, out0));
      ++cases;
    }
  }
  EXPECT_EQ(cases, 28);
}

INSTANTIATE_TEST_SUITE_P(Cuda, MoeTest, CudaTestTargets(), CudaTargetName);

// The CPU backend's ExpertMatmul: each expert's rows are the bits of its own
// Matmul in the call's mode (it issues them, and `also`, as one MatmulBatch),
// and it refuses offsets that break the params' promise before writing.
TEST(CpuExpertMatmulTest, EachExpertGetsTheBitsOfItsOwnMatmulInEitherMode) {
  std::mt19937 rng(46);
  cpu::CpuBackend backend(2);
  for (bool bf16 : {false, true}) {
    for (MatmulMode mode : {MatmulMode::kDeterministic, MatmulMode::kFast}) {
      for (int64_t tokens : {1, 4, 40}) {  // 40: rows past MatmulBatch's shared-region limit
        SCOPED_TRACE(std::to_string(tokens) + " tokens");
        const int64_t experts = 5, n = 40, k = 96;
        const std::vector<int32_t> offsets = SomeOffsets(experts, tokens, rng);
        const int64_t rows = offsets[experts] + 1;
        const std::vector<float> a = RandomVector(rng, rows * k);
        const std::vector<float> w = RandomVector(rng, experts * n * k);
        std::vector<uint16_t> w16(w.size());
        for (size_t i = 0; i < w.size(); ++i) w16[i] = FloatToBf16(w[i]);
        std::vector<float> got(rows * n, kSentinel), want(rows * n, kSentinel);
        ExpertMatmulParams p;
        p.a = a.data();
        p.offsets = offsets.data();
        if (bf16) {
          p.w_bf16 = w16.data();
        } else {
          p.w = w.data();
        }
        p.out = got.data();
        p.experts = experts;
        p.rows = rows;
        p.max_rows = tokens;
        p.n = n;
        p.k = k;
        ASSERT_EQ(backend.ExpertMatmul(p, nullptr, 0, mode), kKernelOk);
        for (int64_t e = 0; e < experts; ++e) {
          if (offsets[e + 1] == offsets[e]) continue;
          MatmulParams item;
          item.a = a.data() + offsets[e] * k;
          if (bf16) {
            item.w_bf16 = w16.data() + e * n * k;
          } else {
            item.w = w.data() + e * n * k;
          }
          item.out = want.data() + offsets[e] * n;
          item.m = offsets[e + 1] - offsets[e];
          item.n = n;
          item.k = k;
          ASSERT_EQ(backend.Matmul(item, mode), kKernelOk);
        }
        EXPECT_TRUE(BitsEqual(got, want));
        EXPECT_EQ(got[(rows - 1) * n], kSentinel);

        for (const std::vector<int32_t>& bad :
             {std::vector<int32_t>{1, 1, 1, 1, 1, 1}, std::vector<int32_t>{0, 2, 1, 1, 1, 1},
              std::vector<int32_t>{0, static_cast<int32_t>(tokens) + 1, static_cast<int32_t>(tokens) + 1,
                                   static_cast<int32_t>(tokens) + 1, static_cast<int32_t>(tokens) + 1,
                                   static_cast<int32_t>(tokens) + 1},
              std::vector<int32_t>{0, 0, 0, 0, 0, static_cast<int32_t>(rows) + 1}}) {
          std::vector<float> untouched(rows * n, kSentinel);
          ExpertMatmulParams q = p;
          q.offsets = bad.data();
          q.out = untouched.data();
          EXPECT_EQ(backend.ExpertMatmul(q, nullptr, 0, mode), kKernelInvalidArgument);
          EXPECT_TRUE(BitsEqual(untouched, std::vector<float>(rows * n, kSentinel)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace hybridserve::kernels
