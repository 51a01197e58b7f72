#include "kernels/cpu/matmul.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::BitsEqual;

constexpr double kUnitRoundoff = 5.9604644775390625e-8;  // 2^-24

struct Problem {
  int64_t m, n, k;
  std::vector<float> a, w, bias;
  Problem(int64_t m_in, int64_t n_in, int64_t k_in, uint32_t seed) : m(m_in), n(n_in), k(k_in) {
    std::mt19937 rng(seed);
    a = testing::RandomVector(rng, m * k);
    w = testing::RandomVector(rng, n * k, -0.1f, 0.1f);
    bias = testing::RandomVector(rng, n);
  }
};

// Rows [0, m) of a times pr's weights (fp32, or w_bf16 when set) through `run`,
// into a NaN-filled output.
template <typename Run>
std::vector<float> RunWith(Run run, const float* a, int64_t m, const Problem& pr, const float* bias,
                           const uint16_t* w_bf16) {
  std::vector<float> out(m * pr.n, NAN);
  MatmulParams p;
  p.a = a;
  p.w = w_bf16 ? nullptr : pr.w.data();
  p.w_bf16 = w_bf16;
  p.bias = bias;
  p.out = out.data();
  p.m = m;
  p.n = pr.n;
  p.k = pr.k;
  EXPECT_EQ(run(p), kKernelOk);
  return out;
}

std::vector<float> RunMatmul(MatmulMode mode, const float* a, int64_t m, const Problem& pr, ThreadPool* pool,
                             const float* bias = nullptr, const uint16_t* w_bf16 = nullptr) {
  return RunWith([&](const MatmulParams& p) { return Matmul(p, mode, pool); }, a, m, pr, bias, w_bf16);
}

std::vector<float> RunOnPath(KernelPath path, const float* a, int64_t m, const Problem& pr, ThreadPool* pool,
                             const float* bias, const uint16_t* w_bf16 = nullptr) {
  return RunWith([&](const MatmulParams& p) { return MatmulDeterministicOnPath(p, path, pool); }, a, m, pr, bias,
                 w_bf16);
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

// Error bound of one output element: first-order bound of the summation
// (each of the 8 lanes adds ceil(k/8) fma-exact products, then a 3-level tree
// and the bias add) times sum |a w| + |bias|, for `terms_in_chain` sequential adds.
void ExpectWithinSummationBound(const std::vector<float>& got, const Problem& pr, bool with_bias,
                                double terms_in_chain) {
  for (int64_t i = 0; i < pr.m; ++i) {
    for (int64_t j = 0; j < pr.n; ++j) {
      double exact = with_bias ? pr.bias[j] : 0.0;
      double magnitude = with_bias ? std::fabs(pr.bias[j]) : 0.0;
      for (int64_t kk = 0; kk < pr.k; ++kk) {
        const double prod = static_cast<double>(pr.a[i * pr.k + kk]) * pr.w[j * pr.k + kk];
        exact += prod;
        magnitude += std::fabs(prod);
      }
      const double bound = terms_in_chain * kUnitRoundoff * magnitude;
      ASSERT_LE(std::fabs(got[i * pr.n + j] - exact), bound)
          << "row " << i << " col " << j << " got " << got[i * pr.n + j] << " exact " << exact;
    }
  }
}

// The contract: a row's bits do not depend on m, on the other rows or on threads.
TEST(MatmulDeterministicTest, RowsAreBitIdenticalForAnyBatchAndThreadCount) {
  // k not a multiple of 8 and above the k block (1024); n not a multiple of any tile width.
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{515, 1000}, {70, 2500}, {1024, 1024}}) {
    const Problem pr(300, n, k, 42);
    ThreadPool pool2(2);
    const std::vector<float> full = RunMatmul(MatmulMode::kDeterministic, pr.a.data(), 300, pr, &pool2, pr.bias.data());
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
      for (int64_t m : {1, 2, 7, 64, 300}) {
        // Rows [off, off + m) of a, computed as their own call.
        const int64_t off = (300 - m) / 2;
        const std::vector<float> part =
            RunMatmul(MatmulMode::kDeterministic, pr.a.data() + off * k, m, pr, pool, pr.bias.data());
        EXPECT_TRUE(BitsEqual(part.data(), full.data() + off * n, m * n))
            << "n " << n << " k " << k << " m " << m << " pool " << (pool != nullptr);
      }
    }
    // One row batched with entirely different neighbours.
    std::mt19937 rng(7);
    std::vector<float> mixed = testing::RandomVector(rng, 5 * k);
    std::copy_n(pr.a.begin() + 123 * k, k, mixed.begin() + 3 * k);
    const std::vector<float> got = RunMatmul(MatmulMode::kDeterministic, mixed.data(), 5, pr, &pool2, pr.bias.data());
    EXPECT_TRUE(BitsEqual(got.data() + 3 * n, full.data() + 123 * n, n));
  }
}

TEST(MatmulDeterministicTest, WithinSummationErrorBoundOfExactResult) {
  const Problem pr(9, 37, 1029, 3);
  ThreadPool pool(2);
  const std::vector<float> got = RunMatmul(MatmulMode::kDeterministic, pr.a.data(), pr.m, pr, &pool, pr.bias.data());
  ExpectWithinSummationBound(got, pr, true, std::ceil(pr.k / 8.0) + 3 + 1);
  const std::vector<float> no_bias = RunMatmul(MatmulMode::kDeterministic, pr.a.data(), pr.m, pr, &pool);
  ExpectWithinSummationBound(no_bias, pr, false, std::ceil(pr.k / 8.0) + 3);
}

// OpenBLAS's summation order is unknown: hold it to the worst-case bound of a
// plain sequential sum of k + 1 terms.
TEST(MatmulFastTest, WithinSequentialSummationBound) {
  for (int64_t m : {1, 6}) {
    Problem pr(m, 45, 700, 5);
    const std::vector<float> got = RunMatmul(MatmulMode::kFast, pr.a.data(), m, pr, nullptr, pr.bias.data());
    ExpectWithinSummationBound(got, pr, true, static_cast<double>(pr.k + 1));
  }
}

// Fast mode's MatmulBatch runs the items one by one through OpenBLAS: each
// gets the bits of its own MatmulFast call; deterministic mode's, those of
// its own deterministic call.
TEST(MatmulTest, BatchInEitherModeGivesEachItemItsOwnCallsBits) {
  const Problem pr(9, 3 * 70, 150, 51);
  const std::vector<uint16_t> w16 = ToBf16(pr.w);
  ThreadPool pool(2);
  for (MatmulMode mode : {MatmulMode::kFast, MatmulMode::kDeterministic}) {
    std::vector<float> expected(9 * 70 * 3, 1.0f), got = expected;
    auto params = [&](std::vector<float>& out) {
      std::vector<MatmulParams> ps(3);
      for (int64_t e = 0; e < 3; ++e) {
        MatmulParams& p = ps[static_cast<size_t>(e)];
        p.a = pr.a.data() + e * 2 * pr.k;
        p.w = e == 1 ? nullptr : pr.w.data() + e * 70 * pr.k;
        p.w_bf16 = e == 1 ? w16.data() + e * 70 * pr.k : nullptr;
        p.bias = e == 2 ? pr.bias.data() : nullptr;
        p.out = out.data() + e * 3 * 70;
        p.m = 3;
        p.n = 70;
        p.k = pr.k;
        p.accumulate = e == 0;
      }
      return ps;
    };
    for (const MatmulParams& p : params(expected)) ASSERT_EQ(Matmul(p, mode, &pool), kKernelOk);
    const std::vector<MatmulParams> batch = params(got);
    ASSERT_EQ(MatmulBatch(batch.data(), 3, mode, &pool), kKernelOk);
    EXPECT_TRUE(BitsEqual(got.data(), expected.data(), static_cast<int64_t>(got.size())))
        << (mode == MatmulMode::kFast ? "fast" : "deterministic");
    std::vector<MatmulParams> bad = params(got);
    bad[2].k = -1;
    EXPECT_EQ(MatmulBatch(bad.data(), 3, mode, &pool), kKernelInvalidArgument);
  }
}

TEST(MatmulTest, Bf16WeightsGiveBitsOfWidenedFp32Weights) {
  Problem pr(5, 50, 333, 8);
  std::vector<uint16_t> w16(pr.w.size());
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = FloatToBf16(pr.w[i]);
  Problem widened = pr;
  for (size_t i = 0; i < w16.size(); ++i) widened.w[i] = Bf16ToFloat(w16[i]);
  ThreadPool pool(2);
  // On the avx2 path (every CPU has it; avx512 is checked by MatmulAvx512Test,
  // and avx512_bf16 rounds a instead).
  const std::vector<float> from_bf16 =
      RunOnPath(KernelPath::kAvx2, pr.a.data(), pr.m, pr, &pool, pr.bias.data(), w16.data());
  const std::vector<float> from_fp32 = RunOnPath(KernelPath::kAvx2, pr.a.data(), pr.m, widened, &pool, pr.bias.data());
  EXPECT_TRUE(BitsEqual(from_bf16, from_fp32));
  // The fast path's bf16 widening agrees with its fp32 path within its bound.
  const std::vector<float> fast =
      RunMatmul(MatmulMode::kFast, pr.a.data(), pr.m, pr, nullptr, pr.bias.data(), w16.data());
  ExpectWithinSummationBound(fast, widened, true, static_cast<double>(pr.k + 1));
}

// Small calls widen bf16 at each use, large ones once per column block: the
// rows must not notice.
TEST(MatmulDeterministicTest, Bf16RowsAreBitIdenticalAcrossWideningPaths) {
  Problem pr(40, 77, 1100, 12);
  std::vector<uint16_t> w16(pr.w.size());
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = FloatToBf16(pr.w[i]);
  ThreadPool pool(2);
  const std::vector<float> full =
      RunMatmul(MatmulMode::kDeterministic, pr.a.data(), 40, pr, &pool, pr.bias.data(), w16.data());
  for (int64_t m : {1, 3, 7, 8, 13}) {
    const std::vector<float> part =
        RunMatmul(MatmulMode::kDeterministic, pr.a.data() + 20 * pr.k, m, pr, nullptr, pr.bias.data(), w16.data());
    EXPECT_TRUE(BitsEqual(part.data(), full.data() + 20 * pr.n, m * pr.n)) << "m " << m;
  }
}

TEST(MatmulTest, AccumulateAddsOntoOutputWithStrides) {
  // a rows and out rows live inside wider buffers (lda, ldo > k, n).
  const int64_t m = 4, n = 10, k = 20, lda = 32, ldo = 16;
  std::mt19937 rng(9);
  const std::vector<float> a = testing::RandomVector(rng, m * lda);
  const std::vector<float> w = testing::RandomVector(rng, n * k);
  const std::vector<float> bias = testing::RandomVector(rng, n);
  const std::vector<float> residual = testing::RandomVector(rng, m * ldo);
  for (MatmulMode mode : {MatmulMode::kDeterministic, MatmulMode::kFast}) {
    std::vector<float> out = residual;
    MatmulParams p;
    p.a = a.data();
    p.w = w.data();
    p.bias = bias.data();
    p.out = out.data();
    p.m = m;
    p.n = n;
    p.k = k;
    p.lda = lda;
    p.ldo = ldo;
    p.accumulate = true;
    ASSERT_EQ(Matmul(p, mode, nullptr), kKernelOk);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldo; ++j) {
        if (j >= n) {
          EXPECT_EQ(out[i * ldo + j], residual[i * ldo + j]) << "padding column written";
          continue;
        }
        double want = residual[i * ldo + j] + bias[j];
        for (int64_t kk = 0; kk < k; ++kk) want += static_cast<double>(a[i * lda + kk]) * w[j * k + kk];
        EXPECT_NEAR(out[i * ldo + j], want, 1e-5) << static_cast<int>(mode);
      }
    }
  }
}

TEST(MatmulTest, RejectsBothOrNeitherWeightPointer) {
  std::vector<float> a(4), w(4), out(1);
  std::vector<uint16_t> w16(4);
  MatmulParams p;
  p.a = a.data();
  p.out = out.data();
  p.m = 1;
  p.n = 1;
  p.k = 4;
  EXPECT_EQ(MatmulDeterministic(p, nullptr), kKernelInvalidArgument);
  p.w = w.data();
  p.w_bf16 = w16.data();
  EXPECT_EQ(MatmulDeterministic(p, nullptr), kKernelInvalidArgument);
  EXPECT_EQ(MatmulFast(p, nullptr), kKernelInvalidArgument);
}

// ---- Kernel paths (cpu_features.h): each path the CPU has is checked on its own ----

class MatmulPathTest : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    if (static_cast<int>(GetParam()) > static_cast<int>(DetectedKernelPath())) {
      GTEST_SKIP() << "this CPU has no " << KernelPathName(GetParam())
                   << " (best: " << KernelPathName(DetectedKernelPath()) << ")";
    }
  }
};

INSTANTIATE_TEST_SUITE_P(Paths, MatmulPathTest,
                         ::testing::Values(KernelPath::kAvx2, KernelPath::kAvx512, KernelPath::kAvx512Bf16),
                         [](const ::testing::TestParamInfo<KernelPath>& info) {
                           return std::string(KernelPathName(info.param));
                         });

TEST_P(MatmulPathTest, RowsAreBitIdenticalForAnyBatchAndThreadCountInFp32AndBf16) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{515, 1000}, {70, 2500}, {49, 1061}}) {
    const Problem pr(300, n, k, 43);
    const std::vector<uint16_t> w16 = ToBf16(pr.w);
    ThreadPool pool2(2);
    for (const uint16_t* w_bf16 : {static_cast<const uint16_t*>(nullptr), w16.data()}) {
      const std::vector<float> full = RunOnPath(GetParam(), pr.a.data(), 300, pr, &pool2, pr.bias.data(), w_bf16);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        for (int64_t m : {1, 2, 3, 4, 5, 64, 299}) {
          const int64_t off = (300 - m) / 2;
          const std::vector<float> part =
              RunOnPath(GetParam(), pr.a.data() + off * k, m, pr, pool, pr.bias.data(), w_bf16);
          EXPECT_TRUE(BitsEqual(part.data(), full.data() + off * n, m * n))
              << "n " << n << " k " << k << " m " << m << " pool " << (pool != nullptr) << " bf16 "
              << (w_bf16 != nullptr);
        }
      }
    }
  }
}

// A MatmulBatch of expert-like items (slices of one stacked weight, fp32 and
// bf16, bias or none, accumulating or not, row strides, an empty item, rows
// of a whole expert) gives each item the bits of its own call on the same
// path, with any pool, and writes nothing outside the items' outputs.
TEST_P(MatmulPathTest, BatchItemsGetTheBitsOfTheirOwnCalls) {
  const int64_t experts = 8, n = 131, k = 203, lda = k + 3, ldo = n + 5, rows = 40;
  const Problem pr(rows, experts * n, k, 47);
  const std::vector<uint16_t> w16 = ToBf16(pr.w);
  std::mt19937 rng(48);
  const std::vector<float> a = testing::RandomVector(rng, rows * lda);
  struct Item {
    int64_t row0, m, expert;
    bool bf16, bias, accumulate;
  };
  const std::vector<Item> items = {{0, 1, 3, true, false, false},  {1, 2, 0, false, true, false},
                                   {3, 0, 5, true, true, true},    {3, 7, 7, false, false, true},
                                   {10, 13, 1, true, true, false}, {23, 1, 2, false, false, false},
                                   {24, 16, 6, true, false, true}, {0, 40, 4, false, true, true}};
  int64_t out_rows = 0;
  for (const Item& it : items) out_rows += it.m;
  const std::vector<float> init = testing::RandomVector(rng, out_rows * ldo + 7);
  auto params = [&](std::vector<float>& out) {
    std::vector<MatmulParams> ps;
    int64_t at = 0;
    for (const Item& it : items) {
      MatmulParams p;
      p.a = a.data() + it.row0 * lda;
      p.lda = lda;
      p.w = it.bf16 ? nullptr : pr.w.data() + it.expert * n * k;
      p.w_bf16 = it.bf16 ? w16.data() + it.expert * n * k : nullptr;
      p.bias = it.bias ? pr.bias.data() : nullptr;
      p.out = out.data() + at * ldo;
      p.ldo = ldo;
      p.m = it.m;
      p.n = n;
      p.k = k;
      p.accumulate = it.accumulate;
      ps.push_back(p);
      at += it.m;
    }
    return ps;
  };
  ThreadPool pool2(2), pool3(3);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
    std::vector<float> expected = init, got = init;
    for (const MatmulParams& p : params(expected)) ASSERT_EQ(MatmulDeterministicOnPath(p, GetParam(), pool), kKernelOk);
    const std::vector<MatmulParams> batch = params(got);
    ASSERT_EQ(MatmulDeterministicBatchOnPath(batch.data(), static_cast<int64_t>(batch.size()), GetParam(), pool),
              kKernelOk);
    EXPECT_TRUE(BitsEqual(got.data(), expected.data(), static_cast<int64_t>(got.size())))
        << "threads " << (pool != nullptr ? pool->num_threads() : 1);
  }
  // A bad item anywhere: kKernelInvalidArgument, and no item runs.
  std::vector<float> got = init;
  std::vector<MatmulParams> batch = params(got);
  batch[5].out = nullptr;
  EXPECT_EQ(MatmulDeterministicBatchOnPath(batch.data(), static_cast<int64_t>(batch.size()), GetParam(), &pool2),
            kKernelInvalidArgument);
  EXPECT_TRUE(BitsEqual(got.data(), init.data(), static_cast<int64_t>(got.size())));
  EXPECT_EQ(MatmulDeterministicBatchOnPath(nullptr, 1, GetParam(), &pool2), kKernelInvalidArgument);
  EXPECT_EQ(MatmulDeterministicBatchOnPath(nullptr, 0, GetParam(), &pool2), kKernelOk);
}

TEST_P(MatmulPathTest, Fp32WithinSummationErrorBound) {
  const Problem pr(9, 37, 1029, 4);
  ThreadPool pool(2);
  const std::vector<float> got = RunOnPath(GetParam(), pr.a.data(), pr.m, pr, &pool, pr.bias.data());
  // At most ceil(k / 8) chained adds per lane, a 4-level tree, the bias.
  ExpectWithinSummationBound(got, pr, true, std::ceil(pr.k / 8.0) + 4 + 1);
}

// The avx2 path's chain, emulated in scalar fp32 (fma per term): 8 lanes, 8-element
// step s on chain s mod 2, the chains added, then the lanes in simd::Hsum's tree.
// One row (the decode kernel), several (the register tiles and their tails), k in
// one block and across blocks, k not a multiple of 8 or 16, fp32 and bf16 weights.
TEST(MatmulAvx2Test, MatchesTheDocumentedTwoChainEightLaneChainExactly) {
  for (const int64_t k : {1, 7, 8, 15, 17, 23, 203, 1061, 2085}) {
    for (const bool bf16 : {false, true}) {
      Problem pr(8, 11, k, 5 + static_cast<uint32_t>(k));
      const std::vector<uint16_t> w16 = ToBf16(pr.w);
      if (bf16) {
        for (size_t i = 0; i < w16.size(); ++i) pr.w[i] = Bf16ToFloat(w16[i]);
      }
      for (const int64_t m : {1, 2, 8}) {
        const std::vector<float> got =
            RunOnPath(KernelPath::kAvx2, pr.a.data(), m, pr, nullptr, pr.bias.data(), bf16 ? w16.data() : nullptr);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < pr.n; ++j) {
            float chains[2][8] = {};
            for (int64_t kk = 0; kk < pr.k; ++kk) {
              float& lane = chains[(kk / 8) % 2][kk % 8];
              lane = std::fma(pr.a[i * pr.k + kk], pr.w[j * pr.k + kk], lane);
            }
            float v[8];
            for (int l = 0; l < 8; ++l) v[l] = chains[0][l] + chains[1][l];
            const float r = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
            EXPECT_EQ(got[i * pr.n + j], r + pr.bias[j])
                << "k " << k << " bf16 " << bf16 << " m " << m << " " << i << "," << j;
          }
        }
      }
    }
  }
}

// The avx512 path's 16-lane chain, emulated in scalar fp32 (fma per term).
TEST(MatmulAvx512Test, Fp32MatchesTheDocumentedSixteenLaneChainExactly) {
  if (DetectedKernelPath() == KernelPath::kAvx2) GTEST_SKIP() << "this CPU has no avx512";
  const Problem pr(3, 11, 203, 5);
  const std::vector<float> got = RunOnPath(KernelPath::kAvx512, pr.a.data(), pr.m, pr, nullptr, pr.bias.data());
  for (int64_t i = 0; i < pr.m; ++i) {
    for (int64_t j = 0; j < pr.n; ++j) {
      float lanes[16] = {};
      for (int64_t kk = 0; kk < pr.k; ++kk) {
        lanes[kk % 16] = std::fma(pr.a[i * pr.k + kk], pr.w[j * pr.k + kk], lanes[kk % 16]);
      }
      float v[8];
      for (int l = 0; l < 8; ++l) v[l] = lanes[l] + lanes[l + 8];
      // simd::Hsum's tree.
      const float r = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
      EXPECT_EQ(got[i * pr.n + j], r + pr.bias[j]) << i << "," << j;
    }
  }
}

TEST(MatmulAvx512Test, WidenedBf16WeightsGiveTheBitsOfFp32Weights) {
  if (DetectedKernelPath() == KernelPath::kAvx2) GTEST_SKIP() << "this CPU has no avx512";
  Problem pr(7, 50, 333, 8);
  const std::vector<uint16_t> w16 = ToBf16(pr.w);
  Problem widened = pr;
  for (size_t i = 0; i < w16.size(); ++i) widened.w[i] = Bf16ToFloat(w16[i]);
  const std::vector<float> from_bf16 =
      RunOnPath(KernelPath::kAvx512, pr.a.data(), pr.m, pr, nullptr, pr.bias.data(), w16.data());
  const std::vector<float> from_fp32 =
      RunOnPath(KernelPath::kAvx512, pr.a.data(), pr.m, widened, nullptr, pr.bias.data());
  EXPECT_TRUE(BitsEqual(from_bf16, from_fp32));
}

// The avx512_bf16 path's vdpbf16ps chain, emulated in scalar: a rounded to
// bf16, per lane the odd product then the even one added (products of two
// bf16 are exact in fp32).
TEST(MatmulAvx512Bf16Test, Bf16WeightsMatchTheDocumentedDotProductChainExactly) {
  if (DetectedKernelPath() != KernelPath::kAvx512Bf16) GTEST_SKIP() << "this CPU has no avx512_bf16";
  const Problem pr(5, 13, 301, 6);  // k not a multiple of 32: a zero-padded last step
  const std::vector<uint16_t> w16 = ToBf16(pr.w);
  const std::vector<float> got =
      RunOnPath(KernelPath::kAvx512Bf16, pr.a.data(), pr.m, pr, nullptr, pr.bias.data(), w16.data());
  for (int64_t i = 0; i < pr.m; ++i) {
    for (int64_t j = 0; j < pr.n; ++j) {
      float lanes[16] = {};
      for (int64_t k0 = 0; k0 < pr.k; k0 += 32) {
        for (int l = 0; l < 16; ++l) {
          for (int64_t kk : {k0 + 2 * l + 1, k0 + 2 * l}) {
            if (kk >= pr.k) continue;  // zero padding adds +0
            const float prod = Bf16ToFloat(FloatToBf16(pr.a[i * pr.k + kk])) * Bf16ToFloat(w16[j * pr.k + kk]);
            lanes[l] = lanes[l] + prod;
          }
        }
      }
      float v[8];
      for (int l = 0; l < 8; ++l) v[l] = lanes[l] + lanes[l + 8];
      const float r = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
      EXPECT_EQ(got[i * pr.n + j], r + pr.bias[j]) << i << "," << j;
    }
  }
}

// Against the exact product of the unrounded inputs: the bf16 rounding of a
// (2^-9 relative per term) dominates the summation error.
TEST(MatmulAvx512Bf16Test, Bf16DotProductsWithinTheActivationRoundingBound) {
  if (DetectedKernelPath() != KernelPath::kAvx512Bf16) GTEST_SKIP() << "this CPU has no avx512_bf16";
  Problem pr(4, 40, 2048, 9);
  const std::vector<uint16_t> w16 = ToBf16(pr.w);
  for (size_t i = 0; i < w16.size(); ++i) pr.w[i] = Bf16ToFloat(w16[i]);
  const std::vector<float> got =
      RunOnPath(KernelPath::kAvx512Bf16, pr.a.data(), pr.m, pr, nullptr, pr.bias.data(), w16.data());
  // 2^-9 per product from a's rounding, plus the fp32 chain of k/16 adds.
  ExpectWithinSummationBound(got, pr, true, std::ldexp(1.0, 15) + std::ceil(pr.k / 16.0) + 5);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
