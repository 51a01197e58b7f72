#include "kernels/cpu/activations.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

double SiluRef(double x) { return x / (1.0 + std::exp(-x)); }
double SoftplusRef(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// fp32 libm exp/log1p are within ~1 ulp; the fp32 divide and add add ~2 ulps:
// 1e-6 relative plus 1e-7 absolute for O(1)-O(10) inputs is ~10 ulps.
constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-7;

TEST(ActivationTest, MatchesDoubleReferences) {
  std::mt19937 rng(1);
  const int64_t rows = 7, dim = 333;
  const std::vector<float> x = testing::RandomVector(rng, rows * dim, -30.0f, 30.0f);
  ThreadPool pool(2);
  for (ActivationKind kind : {ActivationKind::kSilu, ActivationKind::kReluSquared, ActivationKind::kSoftplus}) {
    std::vector<float> out(x.size());
    ActivationParams p;
    p.x = x.data();
    p.out = out.data();
    p.n_rows = rows;
    p.dim = dim;
    p.kind = kind;
    ASSERT_EQ(Activation(p, &pool), kKernelOk);
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      want[i] = kind == ActivationKind::kSilu       ? SiluRef(v)
                : kind == ActivationKind::kSoftplus ? SoftplusRef(v)
                                                    : (v > 0 ? v * v : 0.0);
    }
    EXPECT_TRUE(testing::AllClose(out, want, kRtol, kAtol)) << static_cast<int>(kind);
  }
}

TEST(ActivationTest, ReluSquaredIsExact) {
  EXPECT_EQ(ReluSquared(-3.0f), 0.0f);
  EXPECT_EQ(ReluSquared(3.0f), 9.0f);
  EXPECT_EQ(ReluSquared(0.5f), 0.25f);
}

// out = alpha * x is one fp32 multiply: exact against the same product.
TEST(ActivationTest, ScaleIsOneFp32MultiplyInPlaceAndStrided) {
  std::mt19937 rng(4);
  const int64_t rows = 6, dim = 37, xs = 41;
  const float alpha = 0.0078125f * 1.37f;  // not a power of two: the product rounds
  std::vector<float> x = testing::RandomVector(rng, rows * xs, -100.0f, 100.0f);
  ThreadPool pool(2);
  std::vector<float> out(rows * dim, -1.0f);
  ActivationParams p;
  p.x = x.data();
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  p.kind = ActivationKind::kScale;
  p.alpha = alpha;
  p.x_row_stride = xs;
  ASSERT_EQ(Activation(p, &pool), kKernelOk);
  std::vector<float> want(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = alpha * x[r * xs + i];
  }
  EXPECT_TRUE(testing::BitsEqual(out, want));

  // In place (out aliases x exactly, strides equal): the same bits.
  p.out = x.data();
  p.out_row_stride = xs;
  ASSERT_EQ(Activation(p, nullptr), kKernelOk);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(testing::BitsEqual(x.data() + r * xs, want.data() + r * dim, dim)) << "row " << r;
  }
}

TEST(ActivationTest, RejectsNonFiniteAlpha) {
  float x = 1.0f, out = 0.0f;
  ActivationParams p;
  p.x = &x;
  p.out = &out;
  p.n_rows = 1;
  p.dim = 1;
  p.kind = ActivationKind::kScale;
  for (float alpha : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
    p.alpha = alpha;
    EXPECT_EQ(Activation(p, nullptr), kKernelInvalidArgument) << alpha;
    EXPECT_EQ(out, 0.0f);
  }
  p.alpha = -3.0f;
  ASSERT_EQ(Activation(p, nullptr), kKernelOk);
  EXPECT_EQ(out, -3.0f);
}

double GeluRef(double x) { return x * 0.5 * (1.0 + std::erf(x * M_SQRT1_2)); }

// The fp32 GELU's error against GeluRef: erff is within 1 ulp, rounding
// x * kAlpha moves erf by < 0.5 ulp of 1 and 1 + erf(...) rounds by <= 0.5 ulp
// of a value < 2, so s = 1 + erf(...) is within 2 ulp(1) = 2^-22 absolute;
// x * 0.5 is exact and the last multiply rounds by 0.5 ulp. Bound:
// |x| / 2 * 2^-22 + 1 ulp of the result. The absolute term is what matters
// for x < 0, where 1 + erf(...) cancels and the relative error is unbounded;
// for x > 0 the bound is a few ulp of the result.
double GeluErrorBound(float x, double ref) {
  const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref), 0x1p-126)) - 23);
  return std::fabs(static_cast<double>(x)) * 0.5 * 0x1p-22 + ulp;
}

// Every element within GeluErrorBound of GeluRef, the result finite.
::testing::AssertionResult GeluWithinBound(const float* x, const float* got, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double ref = GeluRef(x[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - ref);
    if (!std::isfinite(got[i]) || !(err <= GeluErrorBound(x[i], ref))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": gelu(" << x[i] << ") = " << got[i] << " vs " << ref << " (error " << err << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(ActivationTest, GeluWithinStatedUlpsOfDoubleReference) {
  std::mt19937 rng(5);
  const int64_t rows = 6, dim = 1000;
  // Most of the mass where erf is not saturated, plus the saturated tails.
  std::vector<float> x = testing::RandomVector(rng, rows * dim, -6.0f, 6.0f);
  const std::vector<float> wide = testing::RandomVector(rng, dim, -30.0f, 30.0f);
  std::copy(wide.begin(), wide.end(), x.begin());
  std::vector<float> out(x.size());
  ActivationParams p;
  p.x = x.data();
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  p.kind = ActivationKind::kGelu;
  ThreadPool pool(2);
  ASSERT_EQ(Activation(p, &pool), kKernelOk);
  EXPECT_TRUE(GeluWithinBound(x.data(), out.data(), rows * dim));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], Gelu(x[i])) << i;
}

// torch 2.15 float32 torch.nn.functional.gelu on one-element tensors (its scalar
// path, std::erf: the formula and order this kernel uses), bit for bit.
TEST(ActivationTest, GeluMatchesTorchScalarPathExactly) {
  struct Case {
    float x, want;
  };
  const Case cases[] = {
      {0.0f, 0.0f},           {0.10000000149011612f, 0x1.ba3a1ap-5f},
      {0.5f, 0x1.62075ep-2f}, {-0.5f, -0x1.3bf144p-3f},
      {1.0f, 0x1.aec4bcp-1f}, {-1.0f, -0x1.44ed0cp-3f},
      {2.0f, 0x1.f45a18p+0f}, {-2.0f, -0x1.74bdp-5f},
      {3.0f, 0x1.7f7b4cp+1f}, {-3.0f, -0x1.09668p-8f},
      {-5.5f, -0x1.6p-23f},   {10.0f, 10.0f},
      {-10.0f, -0.0f},  // erf saturates to -1: (x * 0.5) * 0 is -0
  };
  for (const Case& c : cases) {
    float out = 1.0f;
    ActivationParams p;
    p.x = &c.x;
    p.out = &out;
    p.n_rows = 1;
    p.dim = 1;
    p.kind = ActivationKind::kGelu;
    ASSERT_EQ(Activation(p, nullptr), kKernelOk);
    EXPECT_TRUE(testing::BitsEqual(&out, &c.want, 1)) << "gelu(" << c.x << ")";
    EXPECT_EQ(std::signbit(out), std::signbit(c.want)) << "gelu(" << c.x << ")";
  }
}

// gate_activation = kGelu: out = Gelu(gate) * up, bit for bit, on the halves of
// one fused projection; the double reference within the GELU bound times |up|
// plus the product's rounding.
TEST(SwiGluTest, GeluGateIsGeluTimesUpOnFusedHalves) {
  std::mt19937 rng(6);
  const int64_t rows = 5, dim = 100;
  const std::vector<float> fused = testing::RandomVector(rng, rows * 2 * dim, -8.0f, 8.0f);
  std::vector<float> out(rows * dim);
  SwiGluParams p;
  p.gate = fused.data();
  p.up = fused.data() + dim;
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  p.gate_activation = ActivationKind::kGelu;
  p.gate_row_stride = 2 * dim;
  p.up_row_stride = 2 * dim;
  ThreadPool pool(2);
  ASSERT_EQ(SwiGlu(p, &pool), kKernelOk);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      const float g = fused[r * 2 * dim + i], u = fused[r * 2 * dim + dim + i];
      const float got = out[r * dim + i];
      ASSERT_EQ(got, Gelu(g) * u) << r << "," << i;
      const double ref = GeluRef(g) * u;
      const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref), 0x1p-126)) - 23);
      const double bound = GeluErrorBound(g, GeluRef(g)) * std::fabs(u) + ulp;
      EXPECT_LE(std::fabs(got - ref), bound) << "gate " << g << " up " << u;
    }
  }
}

// The default gate activation is SiLU, the same bits as before the field existed.
TEST(SwiGluTest, DefaultGateIsSiluBitwise) {
  std::mt19937 rng(7);
  const int64_t rows = 3, dim = 50;
  const std::vector<float> gate = testing::RandomVector(rng, rows * dim, -8.0f, 8.0f);
  const std::vector<float> up = testing::RandomVector(rng, rows * dim, -2.0f, 2.0f);
  std::vector<float> out(rows * dim);
  SwiGluParams p;
  ASSERT_EQ(p.gate_activation, ActivationKind::kSilu);
  p.gate = gate.data();
  p.up = up.data();
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  ASSERT_EQ(SwiGlu(p, nullptr), kKernelOk);
  std::vector<float> want(out.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = Silu(gate[i]) * up[i];
  EXPECT_TRUE(testing::BitsEqual(out, want));
}

TEST(SwiGluTest, RejectsGateActivationsOtherThanSiluGeluAndSigmoid) {
  const float gate = 1.0f, up = 2.0f;
  float out = -1.0f;
  SwiGluParams p;
  p.gate = &gate;
  p.up = &up;
  p.out = &out;
  p.n_rows = 1;
  p.dim = 1;
  for (ActivationKind kind : {ActivationKind::kReluSquared, ActivationKind::kSoftplus, ActivationKind::kScale,
                              static_cast<ActivationKind>(7)}) {
    p.gate_activation = kind;
    EXPECT_EQ(SwiGlu(p, nullptr), kKernelInvalidArgument) << static_cast<int>(kind);
    EXPECT_EQ(out, -1.0f);
  }
  p.gate_activation = ActivationKind::kGelu;
  ASSERT_EQ(SwiGlu(p, nullptr), kKernelOk);
  EXPECT_EQ(out, Gelu(1.0f) * 2.0f);
  p.gate_activation = ActivationKind::kSigmoid;
  ASSERT_EQ(SwiGlu(p, nullptr), kKernelOk);
  EXPECT_EQ(out, Sigmoid(1.0f) * 2.0f);
}

// torch.sigmoid (fp32, torch 2.x CPU) and up * torch.sigmoid(gate) on these
// inputs, as exact hex floats (computed in /work/venv-golden): saturation at
// both ends (-88: a subnormal; 40: exactly 1), zero, tiny and O(1) inputs.
constexpr float kSigmoidX[10] = {-0x1.6p+6f,     -0x1.4p+4f, -0x1.ap+1f, -0x1.a36e2ep-14f, 0x0p+0f,
                                 0x1.666666p-1f, 0x1.4p+1f,  0x1p+4f,    0x1.4p+5f,        -0x1p-1f};
constexpr float kSigmoidUp[10] = {0x1p+0f, -0x1p+1f,   0x1p-1f, 0x1.8p+1f, -0x1.8p+0f,
                                  0x1p-2f, -0x1.8p-1f, 0x1p+1f, 0x1.4p+0f, -0x1.8p+1f};
constexpr float kTorchSigmoid[10] = {0x1.07b71p-127f, 0x1.1b4866p-29f, 0x1.31c828p-5f, 0x1.fff97p-2f, 0x1p-1f,
                                     0x1.561cb4p-1f,  0x1.d9291ep-1f,  0x1.fffffcp-1f, 0x1p+0f,       0x1.829a06p-2f};
constexpr float kTorchSigmoidTimesUp[10] = {0x1.07b71p-127f, -0x1.1b4866p-28f, 0x1.31c828p-6f,  0x1.7ffb14p+0f,
                                            -0x1.8p-1f,      0x1.561cb4p-3f,   -0x1.62ded6p-1f, 0x1.fffffcp+0f,
                                            0x1.4p+0f,       -0x1.21f384p+0f};

TEST(ActivationTest, SigmoidMatchesTorchBitForBit) {
  std::vector<float> out(10, 9.0f);
  ActivationParams p;
  p.x = kSigmoidX;
  p.out = out.data();
  p.n_rows = 2;
  p.dim = 5;
  p.kind = ActivationKind::kSigmoid;
  ThreadPool pool(2);
  ASSERT_EQ(Activation(p, &pool), kKernelOk);
  EXPECT_EQ(testing::FirstBitMismatch(out.data(), kTorchSigmoid, 10), -1);
}

// gate_activation = kSigmoid: out = sigmoid(gate) * up (Qwen3-Next's gated
// attention: attn_output * torch.sigmoid(gate)), bit for bit against torch.
TEST(SwiGluTest, SigmoidGateMatchesTorchBitForBit) {
  std::vector<float> out(10, 9.0f);
  SwiGluParams p;
  p.gate = kSigmoidX;
  p.up = kSigmoidUp;
  p.out = out.data();
  p.n_rows = 2;
  p.dim = 5;
  p.gate_activation = ActivationKind::kSigmoid;
  ASSERT_EQ(SwiGlu(p, nullptr), kKernelOk);
  EXPECT_EQ(testing::FirstBitMismatch(out.data(), kTorchSigmoidTimesUp, 10), -1);
}

TEST(SwiGluTest, FusedHalvesMatchDoubleReference) {
  std::mt19937 rng(2);
  const int64_t rows = 5, dim = 100;
  // One fused projection output per row: [gate (dim) | up (dim)].
  const std::vector<float> fused = testing::RandomVector(rng, rows * 2 * dim, -8.0f, 8.0f);
  std::vector<float> out(rows * dim);
  SwiGluParams p;
  p.gate = fused.data();
  p.up = fused.data() + dim;
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  p.gate_row_stride = 2 * dim;
  p.up_row_stride = 2 * dim;
  ASSERT_EQ(SwiGlu(p, nullptr), kKernelOk);
  std::vector<double> want(out.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      want[r * dim + i] = SiluRef(fused[r * 2 * dim + i]) * fused[r * 2 * dim + dim + i];
    }
  }
  EXPECT_TRUE(testing::AllClose(out, want, 2 * kRtol, kAtol));
}

TEST(DtSoftplusTest, AddsBiasAppliesSoftplusAndClamps) {
  std::mt19937 rng(3);
  const int64_t tokens = 9, heads = 6;
  const std::vector<float> raw = testing::RandomVector(rng, tokens * heads, -10.0f, 25.0f);
  const std::vector<float> bias = testing::RandomVector(rng, heads, -2.0f, 2.0f);
  for (float dt_max : {std::numeric_limits<float>::infinity(), 0.5f}) {
    std::vector<float> dt(tokens * heads);
    DtSoftplusParams p;
    p.dt_raw = raw.data();
    p.dt_bias = bias.data();
    p.dt = dt.data();
    p.n_tokens = tokens;
    p.n_heads = heads;
    p.dt_min = 1e-3f;
    p.dt_max = dt_max;
    ASSERT_EQ(DtSoftplus(p, nullptr), kKernelOk);
    std::vector<double> want(dt.size());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const double v = SoftplusRef(static_cast<double>(raw[t * heads + h] + bias[h]));
        want[t * heads + h] = std::min<double>(std::max(v, 1e-3), dt_max);
      }
    }
    EXPECT_TRUE(testing::AllClose(dt, want, kRtol, kAtol));
  }
}

TEST(ActivationTest, RejectsNullPointers) {
  ActivationParams p;
  p.n_rows = 1;
  p.dim = 1;
  EXPECT_EQ(Activation(p, nullptr), kKernelInvalidArgument);
  SwiGluParams s;
  EXPECT_EQ(SwiGlu(s, nullptr), kKernelInvalidArgument);
  DtSoftplusParams d;
  EXPECT_EQ(DtSoftplus(d, nullptr), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
