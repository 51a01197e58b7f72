// The CUDA elementwise kernels (kernels/cuda/elementwise.cu: Embedding, RmsNorm,
// GatedRmsNorm, Activation, SwiGlu, DtSoftplus, Rope) against the CPU kernels,
// on the emulated build and (where a device is present) on the GPU.
//
// Tolerances, and why:
//   - Embedding: an exact copy (bf16 widening is exact): bitwise on every target.
//   - Activation kScale: one fp32 multiply: bitwise on every target.
//   - Activation, SwiGlu, DtSoftplus: the emulator calls the same libm expf,
//     log1pf and erff as the CPU with the same operations: bitwise. A GPU's
//     expf/log1pf are within 2 ulp, so SiLU/softplus within a few ulp: rtol 1e-6
//     (~16 ulp). GELU (and the GELU-gated SwiGlu): a GPU's erff is within 2 ulp
//     and the CPU's within 1, so s = 1 + erf(x / sqrt(2)) differs by < 2^-21
//     absolute and x * 0.5 * s by < |x| * 2^-22 (times |up| for the gated
//     form), plus the last roundings: rtol 1e-6 plus that absolute term, which
//     is the one that matters where 1 + erf cancels (x < 0).
//   - Norms: the sum of squares is reduced in a different (fixed) order than
//     the CPU's 8-lane order: relative error of the sum <= ~(n/S + log2 S) ulp
//     (< 100 ulp for these sizes), half of it in 1/rms, plus a few roundings
//     and the GPU's SiLU: rtol 1e-5 and atol 1e-6 on outputs of magnitude ~1.
//   - Rope: the same inverse frequencies (host std::pow), double angle and
//     unfused rotation as the CPU: bitwise on the emulator (same libm cos/sin);
//     a GPU's double cos/sin are within 2 ulp of double, which flips the fp32
//     rounding only in rare ties: rtol 1e-6, atol 1e-6 there.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels {
namespace {

using cpu::testing::BitsEqual;
using cpu::testing::RandomVector;
using cuda_testing::CudaTargetName;
using cuda_testing::CudaTestTargets;

constexpr double kNormAtol = 1e-6;
constexpr double kNormRtol = 1e-5;
constexpr double kGpuActivationRtol = 1e-6;
constexpr double kGpuActivationAtol = 1e-30;
constexpr double kGpuRopeTol = 1e-6;
constexpr float kSentinel = 7.25f;  // fills rows and padding a kernel must not write

class ElementwiseTest : public cuda_testing::CudaKernelTest {
 protected:
  // Elementwise activations: bitwise on the emulator, a few ulp on a GPU.
  ::testing::AssertionResult ActivationMatch(const std::vector<float>& got, const std::vector<float>& want) {
    if (emulated()) return BitsEqual(got, want);
    return cuda_testing::AllClose(got, want, kGpuActivationAtol, kGpuActivationRtol);
  }

  // GELU: bitwise on the emulator; on a GPU element i within
  // kGpuActivationRtol * |want[i]| + scale[i] * 2^-22, scale[i] = |x| (times
  // |up| for the gated form) of the element, 0 where nothing was written.
  ::testing::AssertionResult GeluMatch(const std::vector<float>& got, const std::vector<float>& want,
                                       const std::vector<float>& scale) {
    if (emulated()) return BitsEqual(got, want);
    if (got.size() != want.size() || scale.size() != want.size())
      return ::testing::AssertionFailure() << "sizes differ";
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
      const double tol = kGpuActivationRtol * std::fabs(want[i]) + scale[i] * 0x1p-22;
      if (!std::isfinite(got[i]) || !(err <= tol)) {
        return ::testing::AssertionFailure()
               << "element " << i << ": " << got[i] << " vs " << want[i] << " (error " << err << " > " << tol << ")";
      }
    }
    return ::testing::AssertionSuccess();
  }
};

// [rows, stride] filled with kSentinel, the first `dim` of each row random.
std::vector<float> RandomRows(std::mt19937& rng, int64_t rows, int64_t dim, int64_t stride, float lo = -2.0f,
                              float hi = 2.0f) {
  std::vector<float> v(rows * stride, kSentinel);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) v[r * stride + i] = dist(rng);
  }
  return v;
}

// ---------------------------------------------------------------- Norms

TEST_P(ElementwiseTest, RmsNormMatchesCpu) {
  std::mt19937 rng(11);
  int case_index = 0;
  for (int64_t dim : {1, 7, 33, 256, 257, 1000, 1024, 1025, 2000, 4100}) {
    for (int variant = 0; variant < 3; ++variant) {
      ++case_index;
      const int64_t rows = 3;
      const int64_t xs = variant == 1 ? dim + 3 : dim;
      const int64_t os = variant == 2 ? dim + 5 : dim;
      const bool with_weight = variant != 1;
      std::vector<float> x = RandomRows(rng, rows, dim, xs);
      std::vector<float> w = RandomVector(rng, dim, 0.5f, 1.5f);
      std::vector<float> want(rows * os, kSentinel);
      RmsNormParams p;
      p.n_rows = rows;
      p.dim = dim;
      p.eps = 1e-5f;
      p.x_row_stride = variant == 1 ? xs : 0;
      p.out_row_stride = variant == 2 ? os : 0;
      p.x = x.data();
      p.weight = with_weight ? w.data() : nullptr;
      p.out = want.data();
      ASSERT_EQ(cpu::RmsNorm(p, nullptr), kKernelOk);

      DeviceBuffer dx = Up(x), dw = Up(w), dout = Up(std::vector<float>(rows * os, kSentinel));
      p.x = dx.as<float>();
      p.weight = with_weight ? dw.as<float>() : nullptr;
      p.out = dout.as<float>();
      ASSERT_EQ(b().RmsNorm(p), kKernelOk);
      EXPECT_TRUE(cuda_testing::AllClose(Down(dout), want, kNormAtol, kNormRtol))
          << "dim " << dim << " variant " << variant;
    }
  }
  EXPECT_GT(case_index, 0);
}

// A row's bits depend only on the row: not on the batch around it, its index,
// its alignment (vectorized or scalar loads), nor on being written in place.
TEST_P(ElementwiseTest, RmsNormRowBitsIndependentOfBatchAlignmentAndAliasing) {
  std::mt19937 rng(12);
  for (int64_t dim : {4, 33, 1000, 1028, 2048}) {
    const int64_t rows = 5;
    std::vector<float> x = RandomRows(rng, rows, dim, dim);
    std::vector<float> w = RandomVector(rng, dim, 0.5f, 1.5f);
    DeviceBuffer dx = Up(x), dw = Up(w), dout = Up(std::vector<float>(rows * dim, kSentinel));
    RmsNormParams p;
    p.x = dx.as<float>();
    p.weight = dw.as<float>();
    p.out = dout.as<float>();
    p.n_rows = rows;
    p.dim = dim;
    ASSERT_EQ(b().RmsNorm(p), kKernelOk);
    const std::vector<float> batch = Down(dout);

    // Each row alone, one float past a 16-byte boundary (scalar path), in place.
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> one(dim + 1, kSentinel);
      std::memcpy(one.data() + 1, x.data() + r * dim, dim * sizeof(float));
      DeviceBuffer d1 = Up(one), dw1 = Up(std::vector<float>(dim + 1));
      ASSERT_EQ(b().CopyToDevice(dw1.as<float>() + 1, w.data(), dim * sizeof(float)), kKernelOk);
      RmsNormParams q = p;
      q.x = d1.as<float>() + 1;
      q.out = d1.as<float>() + 1;
      q.weight = dw1.as<float>() + 1;
      q.n_rows = 1;
      ASSERT_EQ(b().RmsNorm(q), kKernelOk);
      const std::vector<float> alone = Down(d1);
      EXPECT_TRUE(BitsEqual(alone.data() + 1, batch.data() + r * dim, dim)) << "dim " << dim << " row " << r;
      EXPECT_EQ(alone[0], kSentinel);
    }
  }
}

struct GatedCase {
  int64_t dim, group_size;
};

TEST_P(ElementwiseTest, GatedRmsNormMatchesCpu) {
  std::mt19937 rng(13);
  std::vector<GatedCase> cases = {{1, 0}, {7, 7}, {12, 4}, {33, 11}, {256, 64}, {1000, 250}, {2080, 1040}, {2048, 0}};
  for (int i = 0; i < 6; ++i) {  // seeded random ragged groups, both sides of the warp/block switch at 256
    const int64_t gs = std::uniform_int_distribution<int64_t>(1, 1600)(rng);
    cases.push_back({gs * std::uniform_int_distribution<int64_t>(1, 3)(rng), gs});
  }
  for (const GatedCase& gc : cases) {
    for (int variant = 0; variant < 6; ++variant) {
      const bool gate = variant % 3 != 0;
      const bool before = variant % 3 == 2;
      const bool strided = variant >= 3;
      const bool with_weight = variant != 4;
      const int64_t rows = 3;
      const int64_t xs = strided ? gc.dim + 2 : gc.dim;
      const int64_t zs = strided ? 2 * gc.dim + 1 : gc.dim;
      const int64_t os = strided ? gc.dim + 3 : gc.dim;
      std::vector<float> x = RandomRows(rng, rows, gc.dim, xs);
      std::vector<float> z = RandomRows(rng, rows, gc.dim, zs, -4.0f, 4.0f);
      std::vector<float> w = RandomVector(rng, gc.dim, 0.5f, 1.5f);
      std::vector<float> want(rows * os, kSentinel);
      GatedRmsNormParams p;
      p.n_rows = rows;
      p.dim = gc.dim;
      p.group_size = gc.group_size;
      p.eps = 1e-6f;
      p.norm_before_gate = before;
      p.x_row_stride = strided ? xs : 0;
      p.z_row_stride = strided ? zs : 0;
      p.out_row_stride = strided ? os : 0;
      p.x = x.data();
      p.z = gate ? z.data() : nullptr;
      p.weight = with_weight ? w.data() : nullptr;
      p.out = want.data();
      ASSERT_EQ(cpu::GatedRmsNorm(p, nullptr), kKernelOk);

      DeviceBuffer dx = Up(x), dz = Up(z), dw = Up(w), dout = Up(std::vector<float>(rows * os, kSentinel));
      p.x = dx.as<float>();
      p.z = gate ? dz.as<float>() : nullptr;
      p.weight = with_weight ? dw.as<float>() : nullptr;
      p.out = dout.as<float>();
      ASSERT_EQ(b().GatedRmsNorm(p), kKernelOk);
      EXPECT_TRUE(cuda_testing::AllClose(Down(dout), want, kNormAtol, kNormRtol))
          << "dim " << gc.dim << " group " << gc.group_size << " variant " << variant;

      // In place (out aliases x exactly, same stride): the same bits as out of place.
      const std::vector<float> out_of_place = Down(dout);
      if (!strided) {
        p.out = dx.as<float>();
        ASSERT_EQ(b().GatedRmsNorm(p), kKernelOk);
        EXPECT_TRUE(BitsEqual(Down(dx), out_of_place)) << "in place, dim " << gc.dim << " variant " << variant;
      }
    }
  }
}

TEST_P(ElementwiseTest, NormsRejectInvalidArguments) {
  DeviceBuffer buf = Up(std::vector<float>(64, 1.0f));
  float* d = buf.as<float>();
  RmsNormParams r;
  r.x = d;
  r.out = d;
  r.n_rows = 2;
  r.dim = 8;
  EXPECT_EQ(b().RmsNorm(r), kKernelOk);
  RmsNormParams bad = r;
  bad.x = nullptr;
  EXPECT_EQ(b().RmsNorm(bad), kKernelInvalidArgument);
  bad = r;
  bad.out = nullptr;
  EXPECT_EQ(b().RmsNorm(bad), kKernelInvalidArgument);
  bad = r;
  bad.n_rows = -1;
  EXPECT_EQ(b().RmsNorm(bad), kKernelInvalidArgument);
  bad = r;
  bad.dim = 0;
  EXPECT_EQ(b().RmsNorm(bad), kKernelInvalidArgument);
  bad = r;
  bad.eps = -1.0f;
  EXPECT_EQ(b().RmsNorm(bad), kKernelInvalidArgument);
  bad = r;
  bad.eps = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(b().RmsNorm(bad), kKernelInvalidArgument);
  bad = r;
  bad.n_rows = 0;  // nothing to do
  EXPECT_EQ(b().RmsNorm(bad), kKernelOk);

  GatedRmsNormParams g;
  g.x = d;
  g.z = d + 32;
  g.out = d;
  g.n_rows = 2;
  g.dim = 8;
  g.group_size = 4;
  EXPECT_EQ(b().GatedRmsNorm(g), kKernelOk);
  GatedRmsNormParams gb = g;
  gb.group_size = 3;  // does not divide dim
  EXPECT_EQ(b().GatedRmsNorm(gb), kKernelInvalidArgument);
  gb = g;
  gb.group_size = -4;
  EXPECT_EQ(b().GatedRmsNorm(gb), kKernelInvalidArgument);
  gb = g;
  gb.x = nullptr;
  EXPECT_EQ(b().GatedRmsNorm(gb), kKernelInvalidArgument);
  gb = g;
  gb.dim = -8;
  EXPECT_EQ(b().GatedRmsNorm(gb), kKernelInvalidArgument);
  gb = g;
  gb.eps = -1e-5f;
  EXPECT_EQ(b().GatedRmsNorm(gb), kKernelInvalidArgument);
  EXPECT_EQ(b().Synchronize(), kKernelOk);
}

// ---------------------------------------------------------------- Activations

TEST_P(ElementwiseTest, ActivationMatchesCpu) {
  std::mt19937 rng(21);
  for (ActivationKind kind :
       {ActivationKind::kSilu, ActivationKind::kReluSquared, ActivationKind::kSoftplus, ActivationKind::kSigmoid}) {
    for (int64_t dim : {1, 7, 33, 257, 1000, 1030}) {
      for (int variant = 0; variant < 3; ++variant) {
        const int64_t rows = variant == 0 ? 70 : 3;  // 70: several blocks of packed narrow rows
        const int64_t xs = variant == 1 ? dim + 1 : dim;
        const int64_t os = variant == 1 ? dim + 4 : dim;
        // Wide range: softplus's threshold at 20 and saturating SiLU.
        std::vector<float> x = RandomRows(rng, rows, dim, xs, -30.0f, 30.0f);
        std::vector<float> want(rows * os, kSentinel);
        ActivationParams p;
        p.n_rows = rows;
        p.dim = dim;
        p.kind = kind;
        p.x_row_stride = variant == 1 ? xs : 0;
        p.out_row_stride = variant == 1 ? os : 0;
        p.x = x.data();
        p.out = want.data();
        ASSERT_EQ(cpu::Activation(p, nullptr), kKernelOk);

        DeviceBuffer dx = Up(x), dout = Up(std::vector<float>(rows * os, kSentinel));
        p.x = dx.as<float>();
        p.out = variant == 2 ? dx.as<float>() : dout.as<float>();  // variant 2: in place
        ASSERT_EQ(b().Activation(p), kKernelOk);
        EXPECT_TRUE(ActivationMatch(Down(variant == 2 ? dx : dout), want))
            << "kind " << static_cast<int>(kind) << " dim " << dim << " variant " << variant;
      }
    }
  }
}

// kScale is one fp32 multiply: the CPU's bits on every target, the GPU included.
TEST_P(ElementwiseTest, ActivationScaleMatchesCpuBitwise) {
  std::mt19937 rng(24);
  const float alpha = 12.0f * 0.7071f;  // not a power of two: every product rounds
  for (int64_t dim : {1, 7, 64, 257, 1030}) {
    for (int variant = 0; variant < 3; ++variant) {
      const int64_t rows = variant == 0 ? 70 : 3;
      const int64_t xs = variant == 1 ? dim + 1 : dim;
      const int64_t os = variant == 1 ? dim + 4 : dim;
      std::vector<float> x = RandomRows(rng, rows, dim, xs, -1e3f, 1e3f);
      std::vector<float> want(rows * os, kSentinel);
      ActivationParams p;
      p.n_rows = rows;
      p.dim = dim;
      p.kind = ActivationKind::kScale;
      p.alpha = alpha;
      p.x_row_stride = variant == 1 ? xs : 0;
      p.out_row_stride = variant == 1 ? os : 0;
      p.x = x.data();
      p.out = want.data();
      ASSERT_EQ(cpu::Activation(p, nullptr), kKernelOk);

      DeviceBuffer dx = Up(x), dout = Up(std::vector<float>(rows * os, kSentinel));
      p.x = dx.as<float>();
      p.out = variant == 2 ? dx.as<float>() : dout.as<float>();  // variant 2: in place
      ASSERT_EQ(b().Activation(p), kKernelOk);
      EXPECT_TRUE(BitsEqual(Down(variant == 2 ? dx : dout), want)) << "dim " << dim << " variant " << variant;
    }
  }
}

// GELU: the CPU's bits on the emulator (same erff, same operation order), a
// few ulp (of 1, times |x| / 2, where 1 + erf cancels) on a GPU.
TEST_P(ElementwiseTest, ActivationGeluMatchesCpu) {
  std::mt19937 rng(25);
  for (int64_t dim : {1, 7, 33, 257, 1000, 1030}) {
    for (int variant = 0; variant < 3; ++variant) {
      const int64_t rows = variant == 0 ? 70 : 3;  // 70: several blocks of packed narrow rows
      const int64_t xs = variant == 1 ? dim + 1 : dim;
      const int64_t os = variant == 1 ? dim + 4 : dim;
      // Through the transition and into both saturated tails (erf = +-1 in fp32 past |x| ~ 5.5).
      std::vector<float> x = RandomRows(rng, rows, dim, xs, -10.0f, 10.0f);
      std::vector<float> want(rows * os, kSentinel);
      std::vector<float> scale(rows * os, 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < dim; ++i) scale[r * os + i] = std::fabs(x[r * xs + i]);
      }
      ActivationParams p;
      p.n_rows = rows;
      p.dim = dim;
      p.kind = ActivationKind::kGelu;
      p.x_row_stride = variant == 1 ? xs : 0;
      p.out_row_stride = variant == 1 ? os : 0;
      p.x = x.data();
      p.out = want.data();
      ASSERT_EQ(cpu::Activation(p, nullptr), kKernelOk);

      DeviceBuffer dx = Up(x), dout = Up(std::vector<float>(rows * os, kSentinel));
      p.x = dx.as<float>();
      p.out = variant == 2 ? dx.as<float>() : dout.as<float>();  // variant 2: in place
      ASSERT_EQ(b().Activation(p), kKernelOk);
      EXPECT_TRUE(GeluMatch(Down(variant == 2 ? dx : dout), want, scale)) << "dim " << dim << " variant " << variant;
    }
  }
}

// gate_activation = kGelu (Zamba2's MLP): out = gelu(gate) * up, and kSigmoid
// (Qwen3-Next's attention output gate): out = sigmoid(gate) * up, on the same
// layouts as SiLU's: separate buffers, fused halves, out aliasing either half.
TEST_P(ElementwiseTest, SwiGluGeluAndSigmoidGatesMatchCpuFusedHalvesAndAliases) {
  std::mt19937 rng(26);
  for (ActivationKind act : {ActivationKind::kGelu, ActivationKind::kSigmoid})
    for (int64_t dim : {1, 7, 64, 257, 1030}) {
      for (int variant = 0; variant < 4; ++variant) {
        const int64_t rows = 3;
        const bool fused = variant > 0;
        const bool in_place = variant >= 2;
        const int64_t gs = fused ? 2 * dim : dim;
        std::vector<float> gate = RandomRows(rng, rows, gs, gs, -8.0f, 8.0f);
        std::vector<float> up = RandomRows(rng, rows, dim, dim);
        SwiGluParams p;
        p.n_rows = rows;
        p.dim = dim;
        p.gate_activation = act;
        if (fused) {
          p.gate_row_stride = 2 * dim;
          p.up_row_stride = 2 * dim;
        }
        if (in_place) p.out_row_stride = 2 * dim;
        const int64_t out_offset = variant == 3 ? dim : 0;
        const int64_t os = in_place ? 2 * dim : dim;

        // |gate| * |up| of each output element, in the output's layout.
        std::vector<float> scale(in_place ? gate.size() : rows * dim, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < dim; ++i) {
            const float u = fused ? gate[r * gs + dim + i] : up[r * dim + i];
            scale[r * os + out_offset + i] = std::fabs(gate[r * gs + i]) * std::fabs(u);
          }
        }

        // CPU: in place on a copy of the fused buffer, else into `want`.
        std::vector<float> want = in_place ? gate : std::vector<float>(rows * dim, kSentinel);
        p.gate = in_place ? want.data() : gate.data();
        p.up = fused ? p.gate + dim : up.data();
        p.out = want.data() + out_offset;
        ASSERT_EQ(cpu::SwiGlu(p, nullptr), kKernelOk);

        DeviceBuffer dg = Up(gate), du = Up(up), dout = Up(std::vector<float>(rows * dim, kSentinel));
        p.gate = dg.as<float>();
        p.up = fused ? dg.as<float>() + dim : du.as<float>();
        p.out = in_place ? dg.as<float>() + out_offset : dout.as<float>();
        ASSERT_EQ(b().SwiGlu(p), kKernelOk);
        EXPECT_TRUE(GeluMatch(Down(in_place ? dg : dout), want, scale))
            << "act " << static_cast<int>(act) << " dim " << dim << " variant " << variant;
      }
    }
}

TEST_P(ElementwiseTest, SwiGluRejectsGateActivationsOtherThanSiluGeluAndSigmoid) {
  DeviceBuffer buf = Up(std::vector<float>(48, 1.0f));
  float* d = buf.as<float>();
  SwiGluParams s;
  s.gate = d;
  s.up = d + 16;
  s.out = d + 32;
  s.n_rows = 2;
  s.dim = 8;
  for (ActivationKind kind : {ActivationKind::kSilu, ActivationKind::kGelu, ActivationKind::kSigmoid}) {
    s.gate_activation = kind;
    EXPECT_EQ(b().SwiGlu(s), kKernelOk) << static_cast<int>(kind);
  }
  for (ActivationKind kind : {ActivationKind::kReluSquared, ActivationKind::kSoftplus, ActivationKind::kScale,
                              static_cast<ActivationKind>(7)}) {
    s.gate_activation = kind;
    EXPECT_EQ(b().SwiGlu(s), kKernelInvalidArgument) << static_cast<int>(kind);
  }
  EXPECT_EQ(b().Synchronize(), kKernelOk);
}

TEST_P(ElementwiseTest, SwiGluMatchesCpuFusedHalvesAndAliases) {
  std::mt19937 rng(22);
  for (int64_t dim : {1, 7, 64, 257, 1030}) {
    // 0: separate buffers; 1: the halves of one fused [rows, 2*dim] buffer;
    // 2: fused, out aliases gate exactly; 3: fused, out aliases up exactly.
    for (int variant = 0; variant < 4; ++variant) {
      const int64_t rows = 3;
      const bool fused = variant > 0;
      const bool in_place = variant >= 2;
      std::vector<float> gate = RandomRows(rng, rows, fused ? 2 * dim : dim, fused ? 2 * dim : dim, -8.0f, 8.0f);
      std::vector<float> up = RandomRows(rng, rows, dim, dim);
      SwiGluParams p;
      p.n_rows = rows;
      p.dim = dim;
      if (fused) {
        p.gate_row_stride = 2 * dim;
        p.up_row_stride = 2 * dim;
      }
      if (in_place) p.out_row_stride = 2 * dim;
      const int64_t out_offset = variant == 3 ? dim : 0;

      // CPU: in place on a copy of the fused buffer, else into `want`.
      std::vector<float> want = in_place ? gate : std::vector<float>(rows * dim, kSentinel);
      p.gate = in_place ? want.data() : gate.data();
      p.up = fused ? p.gate + dim : up.data();
      p.out = want.data() + out_offset;
      ASSERT_EQ(cpu::SwiGlu(p, nullptr), kKernelOk);

      DeviceBuffer dg = Up(gate), du = Up(up), dout = Up(std::vector<float>(rows * dim, kSentinel));
      p.gate = dg.as<float>();
      p.up = fused ? dg.as<float>() + dim : du.as<float>();
      p.out = in_place ? dg.as<float>() + out_offset : dout.as<float>();
      ASSERT_EQ(b().SwiGlu(p), kKernelOk);
      EXPECT_TRUE(ActivationMatch(Down(in_place ? dg : dout), want)) << "dim " << dim << " variant " << variant;
    }
  }
}

TEST_P(ElementwiseTest, DtSoftplusMatchesCpu) {
  std::mt19937 rng(23);
  for (int64_t heads : {1, 7, 8, 33, 80}) {
    for (int variant = 0; variant < 4; ++variant) {
      const int64_t tokens = variant == 0 ? 300 : 5;  // 300: several blocks of packed rows
      // Variant 1, 3: dt_raw is a slice of a wider projection output.
      const int64_t rs = variant % 2 == 1 ? 3 * heads + 4 : heads;
      const int64_t ds = variant == 3 ? heads + 1 : heads;
      std::vector<float> raw = RandomRows(rng, tokens, heads, rs, -25.0f, 25.0f);
      std::vector<float> bias = RandomVector(rng, heads, -3.0f, 3.0f);
      std::vector<float> want(tokens * ds, kSentinel);
      DtSoftplusParams p;
      p.n_tokens = tokens;
      p.n_heads = heads;
      p.dt_raw_row_stride = rs;
      p.dt_row_stride = ds;
      if (variant >= 2) {
        p.dt_min = 1e-3f;
        p.dt_max = 0.5f;
      }
      p.dt_raw = raw.data();
      p.dt_bias = variant == 0 ? nullptr : bias.data();
      p.dt = want.data();
      ASSERT_EQ(cpu::DtSoftplus(p, nullptr), kKernelOk);

      DeviceBuffer draw = Up(raw), dbias = Up(bias), ddt = Up(std::vector<float>(tokens * ds, kSentinel));
      p.dt_raw = draw.as<float>();
      p.dt_bias = variant == 0 ? nullptr : dbias.as<float>();
      p.dt = ddt.as<float>();
      ASSERT_EQ(b().DtSoftplus(p), kKernelOk);
      EXPECT_TRUE(ActivationMatch(Down(ddt), want)) << "heads " << heads << " variant " << variant;
    }
  }
}

TEST_P(ElementwiseTest, ActivationsRejectInvalidArguments) {
  DeviceBuffer buf = Up(std::vector<float>(64, 1.0f));
  float* d = buf.as<float>();
  ActivationParams a;
  a.x = d;
  a.out = d;
  a.n_rows = 2;
  a.dim = 8;
  EXPECT_EQ(b().Activation(a), kKernelOk);
  ActivationParams ab = a;
  ab.kind = static_cast<ActivationKind>(7);
  EXPECT_EQ(b().Activation(ab), kKernelInvalidArgument);
  ab = a;
  ab.x = nullptr;
  EXPECT_EQ(b().Activation(ab), kKernelInvalidArgument);
  ab = a;
  ab.dim = -1;
  EXPECT_EQ(b().Activation(ab), kKernelInvalidArgument);
  ab = a;
  ab.n_rows = -1;
  EXPECT_EQ(b().Activation(ab), kKernelInvalidArgument);
  ab = a;
  ab.kind = ActivationKind::kScale;
  ab.alpha = std::numeric_limits<float>::infinity();
  EXPECT_EQ(b().Activation(ab), kKernelInvalidArgument);
  ab.alpha = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(b().Activation(ab), kKernelInvalidArgument);
  ab = a;
  ab.dim = 0;  // empty rows: nothing to do
  EXPECT_EQ(b().Activation(ab), kKernelOk);

  SwiGluParams s;
  s.gate = d;
  s.up = d + 16;
  s.out = d + 32;
  s.n_rows = 2;
  s.dim = 8;
  EXPECT_EQ(b().SwiGlu(s), kKernelOk);
  SwiGluParams sb = s;
  sb.up = nullptr;
  EXPECT_EQ(b().SwiGlu(sb), kKernelInvalidArgument);
  sb = s;
  sb.n_rows = -2;
  EXPECT_EQ(b().SwiGlu(sb), kKernelInvalidArgument);

  DtSoftplusParams t;
  t.dt_raw = d;
  t.dt = d + 32;
  t.n_tokens = 2;
  t.n_heads = 8;
  EXPECT_EQ(b().DtSoftplus(t), kKernelOk);
  DtSoftplusParams tb = t;
  tb.dt_min = 1.0f;
  tb.dt_max = 0.5f;
  EXPECT_EQ(b().DtSoftplus(tb), kKernelInvalidArgument);
  tb = t;
  tb.dt_min = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(b().DtSoftplus(tb), kKernelInvalidArgument);
  tb = t;
  tb.dt = nullptr;
  EXPECT_EQ(b().DtSoftplus(tb), kKernelInvalidArgument);
  tb = t;
  tb.n_heads = -1;
  EXPECT_EQ(b().DtSoftplus(tb), kKernelInvalidArgument);
  EXPECT_EQ(b().Synchronize(), kKernelOk);
}

// ---------------------------------------------------------------- Embedding

std::vector<uint16_t> RandomBf16(std::mt19937& rng, int64_t n) {
  std::vector<uint16_t> v(n);
  for (uint16_t& h : v) {
    const float f = std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    h = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

TEST_P(ElementwiseTest, EmbeddingMatchesCpuBitwise) {
  std::mt19937 rng(31);
  const int64_t vocab = 50;
  for (int64_t dim : {1, 7, 64, 257}) {
    for (bool bf16 : {false, true}) {
      const int64_t n_tokens = 9;
      std::vector<int32_t> tokens(n_tokens);
      for (int32_t& t : tokens) t = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
      tokens[0] = 0;
      tokens[1] = static_cast<int32_t>(vocab - 1);
      std::vector<float> table = RandomVector(rng, vocab * dim);
      std::vector<uint16_t> table_bf16 = RandomBf16(rng, vocab * dim);
      std::vector<float> want(n_tokens * dim, kSentinel);
      EmbeddingParams p;
      p.n_tokens = n_tokens;
      p.vocab = vocab;
      p.dim = dim;
      p.table = bf16 ? nullptr : table.data();
      p.table_bf16 = bf16 ? table_bf16.data() : nullptr;
      p.tokens = tokens.data();
      p.out = want.data();
      ASSERT_EQ(cpu::Embedding(p, nullptr), kKernelOk);

      DeviceBuffer dtab = Up(table), dtab16 = Up(table_bf16), dtok = Up(tokens);
      DeviceBuffer dout = Up(std::vector<float>(n_tokens * dim, kSentinel));
      p.table = bf16 ? nullptr : dtab.as<float>();
      p.table_bf16 = bf16 ? dtab16.as<uint16_t>() : nullptr;
      p.tokens = dtok.as<int32_t>();
      p.out = dout.as<float>();
      ASSERT_EQ(b().Embedding(p), kKernelOk);
      EXPECT_TRUE(BitsEqual(Down(dout), want)) << "dim " << dim << " bf16 " << bf16;
      EXPECT_EQ(b().Synchronize(), kKernelOk);
    }
  }
}

TEST_P(ElementwiseTest, EmbeddingBadTokenSkipsItsRowAndRaisesTheFlag) {
  std::mt19937 rng(32);
  const int64_t vocab = 10, dim = 12;
  for (bool bf16 : {false, true}) {
    const std::vector<int32_t> tokens = {3, -1, 9, 10, 0, 1 << 30};
    const int64_t n_tokens = static_cast<int64_t>(tokens.size());
    std::vector<float> table = RandomVector(rng, vocab * dim);
    std::vector<uint16_t> table_bf16 = RandomBf16(rng, vocab * dim);
    DeviceBuffer dtab = Up(table), dtab16 = Up(table_bf16), dtok = Up(tokens);
    DeviceBuffer dout = Up(std::vector<float>(n_tokens * dim, kSentinel));
    EmbeddingParams p;
    p.n_tokens = n_tokens;
    p.vocab = vocab;
    p.dim = dim;
    p.table = bf16 ? nullptr : dtab.as<float>();
    p.table_bf16 = bf16 ? dtab16.as<uint16_t>() : nullptr;
    p.tokens = dtok.as<int32_t>();
    p.out = dout.as<float>();
    ASSERT_EQ(b().Embedding(p), kKernelOk);  // the launcher cannot see device tokens
    EXPECT_EQ(b().Synchronize(), kKernelInvalidArgument);
    EXPECT_EQ(b().Synchronize(), kKernelOk);  // reported once
    const std::vector<float> got = Down(dout);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const bool valid = tokens[t] >= 0 && tokens[t] < vocab;
      for (int64_t i = 0; i < dim; ++i) {
        float want = kSentinel;
        if (valid && !bf16) want = table[tokens[t] * dim + i];
        if (valid && bf16) want = Bf16ToFloat(table_bf16[tokens[t] * dim + i]);
        ASSERT_EQ(got[t * dim + i], want) << "token row " << t << " element " << i << " bf16 " << bf16;
      }
    }
  }
}

TEST_P(ElementwiseTest, EmbeddingRejectsInvalidArguments) {
  DeviceBuffer tab = Up(std::vector<float>(40, 1.0f)), tab16 = Up(std::vector<uint16_t>(40, 0));
  DeviceBuffer tok = Up(std::vector<int32_t>{0, 1}), out = Up(std::vector<float>(8));
  EmbeddingParams p;
  p.table = tab.as<float>();
  p.tokens = tok.as<int32_t>();
  p.out = out.as<float>();
  p.n_tokens = 2;
  p.vocab = 10;
  p.dim = 4;
  EXPECT_EQ(b().Embedding(p), kKernelOk);
  EmbeddingParams bad = p;
  bad.table_bf16 = tab16.as<uint16_t>();  // both tables
  EXPECT_EQ(b().Embedding(bad), kKernelInvalidArgument);
  bad = p;
  bad.table = nullptr;  // neither
  EXPECT_EQ(b().Embedding(bad), kKernelInvalidArgument);
  bad = p;
  bad.tokens = nullptr;
  EXPECT_EQ(b().Embedding(bad), kKernelInvalidArgument);
  bad = p;
  bad.out = nullptr;
  EXPECT_EQ(b().Embedding(bad), kKernelInvalidArgument);
  bad = p;
  bad.n_tokens = 0;
  EXPECT_EQ(b().Embedding(bad), kKernelInvalidArgument);
  bad = p;
  bad.vocab = 0;
  EXPECT_EQ(b().Embedding(bad), kKernelInvalidArgument);
  bad = p;
  bad.dim = 0;
  EXPECT_EQ(b().Embedding(bad), kKernelInvalidArgument);
  EXPECT_EQ(b().Synchronize(), kKernelOk);
}

// ---------------------------------------------------------------- Rope

struct RopeCase {
  int64_t n_tokens, n_heads, head_dim, rotary_dim, extra_stride;
  bool positions;
};

TEST_P(ElementwiseTest, RopeMatchesCpu) {
  std::mt19937 rng(41);
  // The last two: rotary_dim / 2 = 300 is more than the inverse frequencies
  // passed by value (the device computes them), and 515 is more than one
  // shared-memory tile of cos/sin.
  const RopeCase cases[] = {{1, 1, 2, 0, 0, false},    {3, 2, 8, 0, 0, true},       {5, 3, 16, 8, 3, false},
                            {4, 2, 64, 0, 0, true},    {2, 4, 128, 64, 5, true},    {3, 2, 96, 0, 0, false},
                            {2, 1, 600, 600, 0, true}, {2, 1, 1030, 1030, 2, false}};
  for (const RopeCase& rc : cases) {
    const int64_t row = rc.n_heads * rc.head_dim;
    const int64_t xs = row + rc.extra_stride;
    std::vector<float> x = RandomRows(rng, rc.n_tokens, row, xs);
    std::vector<int64_t> positions(rc.n_tokens);
    for (int64_t& pos : positions) pos = std::uniform_int_distribution<int64_t>(0, 1000000)(rng);
    RopeParams p;
    p.n_tokens = rc.n_tokens;
    p.n_heads = rc.n_heads;
    p.head_dim = rc.head_dim;
    p.rotary_dim = rc.rotary_dim;
    p.start_pos = 12345;
    p.theta = rc.head_dim == 96 ? 1e6 : 10000.0;
    p.x_token_stride = rc.extra_stride ? xs : 0;
    std::vector<float> want = x;
    p.x = want.data();
    p.positions = rc.positions ? positions.data() : nullptr;
    ASSERT_EQ(cpu::Rope(p, nullptr), kKernelOk);

    DeviceBuffer dx = Up(x), dpos = Up(positions);
    p.x = dx.as<float>();
    p.positions = rc.positions ? dpos.as<int64_t>() : nullptr;
    ASSERT_EQ(b().Rope(p), kKernelOk);
    const std::vector<float> got = Down(dx);
    if (emulated()) {
      EXPECT_TRUE(BitsEqual(got, want)) << "head_dim " << rc.head_dim << " rotary " << rc.rotary_dim;
    } else {
      EXPECT_TRUE(cuda_testing::AllClose(got, want, kGpuRopeTol, kGpuRopeTol))
          << "head_dim " << rc.head_dim << " rotary " << rc.rotary_dim;
    }
  }
}

// A position's rotation has the same bits whether its token is rotated in a
// prefill batch or alone (decode), on any target.
TEST_P(ElementwiseTest, RopeTokenBitsIndependentOfBatch) {
  std::mt19937 rng(42);
  const int64_t n_tokens = 6, n_heads = 3, head_dim = 32;
  const int64_t row = n_heads * head_dim;
  std::vector<float> x = RandomVector(rng, n_tokens * row);
  DeviceBuffer dx = Up(x);
  RopeParams p;
  p.x = dx.as<float>();
  p.n_tokens = n_tokens;
  p.n_heads = n_heads;
  p.head_dim = head_dim;
  p.start_pos = 100;
  ASSERT_EQ(b().Rope(p), kKernelOk);
  const std::vector<float> batch = Down(dx);
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<float> one(x.begin() + t * row, x.begin() + (t + 1) * row);
    DeviceBuffer d1 = Up(one);
    RopeParams q = p;
    q.x = d1.as<float>();
    q.n_tokens = 1;
    q.start_pos = 100 + t;
    ASSERT_EQ(b().Rope(q), kKernelOk);
    EXPECT_TRUE(BitsEqual(Down(d1).data(), batch.data() + t * row, row)) << "token " << t;
  }
}

TEST_P(ElementwiseTest, RopeRejectsInvalidArguments) {
  DeviceBuffer buf = Up(std::vector<float>(64, 1.0f));
  RopeParams p;
  p.x = buf.as<float>();
  p.n_tokens = 2;
  p.n_heads = 2;
  p.head_dim = 16;
  EXPECT_EQ(b().Rope(p), kKernelOk);
  RopeParams bad = p;
  bad.x = nullptr;
  EXPECT_EQ(b().Rope(bad), kKernelInvalidArgument);
  bad = p;
  bad.rotary_dim = 7;  // odd
  EXPECT_EQ(b().Rope(bad), kKernelInvalidArgument);
  bad = p;
  bad.rotary_dim = 18;  // > head_dim
  EXPECT_EQ(b().Rope(bad), kKernelInvalidArgument);
  bad = p;
  bad.head_dim = 0;
  EXPECT_EQ(b().Rope(bad), kKernelInvalidArgument);
  bad = p;
  bad.n_heads = 0;
  EXPECT_EQ(b().Rope(bad), kKernelInvalidArgument);
  bad = p;
  bad.n_tokens = -1;
  EXPECT_EQ(b().Rope(bad), kKernelInvalidArgument);
  bad = p;
  bad.theta = 0.0;
  EXPECT_EQ(b().Rope(bad), kKernelInvalidArgument);
  bad = p;
  bad.n_tokens = 0;
  EXPECT_EQ(b().Rope(bad), kKernelOk);
  EXPECT_EQ(b().Synchronize(), kKernelOk);
}

INSTANTIATE_TEST_SUITE_P(Cuda, ElementwiseTest, CudaTestTargets(), CudaTargetName);

}  // namespace
}  // namespace hybridserve::kernels
