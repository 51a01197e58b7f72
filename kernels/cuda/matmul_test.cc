// The CUDA matmul (kernels/cuda/matmul.cu) through the CUDA backend, on the
// emulated target and (where a device is present) the GPU, against the CPU
// deterministic matmul and against its own documented reduction chain.

#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/kernel_status.h"
#include "kernels/matmul_params.h"

namespace hybridserve::kernels {
namespace {

using cpu::testing::BitsEqual;
using cuda_testing::CudaTarget;
using cuda_testing::Download;
using cuda_testing::MakeCudaTestBackendOrSkip;
using cuda_testing::Upload;

constexpr double kUnitRoundoff = 5.9604644775390625e-8;  // 2^-24

struct Shape {
  int64_t m, n, k;
  int64_t lda = 0, ldw = 0, ldo = 0;  // 0: dense
  bool bias = false;
  bool accumulate = false;
};

std::string Describe(const Shape& s, bool bf16) {
  return "m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " lda " +
         std::to_string(s.lda) + " ldw " + std::to_string(s.ldw) + " ldo " + std::to_string(s.ldo) + " bias " +
         std::to_string(s.bias) + " accumulate " + std::to_string(s.accumulate) + (bf16 ? " bf16" : " fp32");
}

// Host tensors of one call. The weights are bf16-representable, so the fp32
// and bf16 runs multiply the same values.
struct Problem {
  Shape s;
  int64_t lda, ldw, ldo;
  std::vector<float> a;       // [m, lda]
  std::vector<float> w;       // [n, ldw]
  std::vector<uint16_t> w16;  // [n, ldw], the bits of w
  std::vector<float> bias;    // [n]
  std::vector<float> out0;    // [m, ldo]: the output buffer before the call (the residual)

  Problem(const Shape& shape, uint32_t seed)
      : s(shape),
        lda(shape.lda ? shape.lda : shape.k),
        ldw(shape.ldw ? shape.ldw : shape.k),
        ldo(shape.ldo ? shape.ldo : shape.n) {
    std::mt19937 rng(seed);
    a = cpu::testing::RandomVector(rng, s.m * lda);
    w = cpu::testing::RandomVector(rng, s.n * ldw, -0.1f, 0.1f);
    w16.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = FloatToBf16(w[i]);
      w[i] = Bf16ToFloat(w16[i]);
    }
    bias = cpu::testing::RandomVector(rng, s.n);
    out0 = cpu::testing::RandomVector(rng, s.m * ldo);
  }

  MatmulParams Params(const float* a_ptr, const float* w_ptr, const uint16_t* w16_ptr, const float* bias_ptr,
                      float* out_ptr) const {
    MatmulParams p;
    p.a = a_ptr;
    p.w = w_ptr;
    p.w_bf16 = w16_ptr;
    p.bias = s.bias ? bias_ptr : nullptr;
    p.out = out_ptr;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.lda = s.lda;
    p.ldw = s.ldw;
    p.ldo = s.ldo;
    p.accumulate = s.accumulate;
    return p;
  }

  // sum_k |a[i, k] w[j, k]| + |bias[j]| + |out0[i, j]| (the terms that are added).
  double Magnitude(int64_t i, int64_t j) const {
    double sum = 0.0;
    for (int64_t kk = 0; kk < s.k; ++kk) sum += std::fabs(static_cast<double>(a[i * lda + kk]) * w[j * ldw + kk]);
    if (s.bias) sum += std::fabs(bias[j]);
    if (s.accumulate) sum += std::fabs(out0[i * ldo + j]);
    return sum;
  }
};

// `host` on the device, one zero element when empty (so that empty tensors
// still have a non-null address, as the kernels require).
template <typename T>
DeviceBuffer UploadNonEmpty(Backend& backend, std::vector<T> host) {
  if (host.empty()) host.push_back(T{});
  return Upload(backend, host);
}

// The whole [m, ldo] output buffer after the call on `backend`.
std::vector<float> RunDevice(Backend& backend, const Problem& pr, MatmulMode mode, bool bf16) {
  DeviceBuffer a = UploadNonEmpty(backend, pr.a);
  DeviceBuffer w = bf16 ? UploadNonEmpty(backend, pr.w16) : UploadNonEmpty(backend, pr.w);
  DeviceBuffer bias = UploadNonEmpty(backend, pr.bias);
  DeviceBuffer out = UploadNonEmpty(backend, pr.out0);
  const MatmulParams p = pr.Params(a.as<float>(), bf16 ? nullptr : w.as<float>(), bf16 ? w.as<uint16_t>() : nullptr,
                                   bias.as<float>(), out.as<float>());
  EXPECT_EQ(backend.Matmul(p, mode), kKernelOk) << Describe(pr.s, bf16);
  return Download<float>(backend, out.data(), static_cast<int64_t>(pr.out0.size()));
}

// The CPU deterministic matmul on its avx2 path, which widens bf16 weights
// exactly (the avx512_bf16 path would round a to bf16 instead).
std::vector<float> RunCpu(const Problem& pr, bool bf16) {
  std::vector<float> out = pr.out0;
  const MatmulParams p =
      pr.Params(pr.a.data(), bf16 ? nullptr : pr.w.data(), bf16 ? pr.w16.data() : nullptr, pr.bias.data(), out.data());
  EXPECT_EQ(cpu::MatmulDeterministicOnPath(p, cpu::KernelPath::kAvx2, nullptr), kKernelOk);
  return out;
}

// out[i, j] by the chain documented in kernels/cuda/matmul.cu: lane l sums
// k = 256t + 8l + e (e = 0..7, t ascending) with fma, zero past k; then the
// xor butterfly over the 32 lanes; then + bias; then out + r.
float DocumentedChain(const Problem& pr, int64_t i, int64_t j) {
  float lanes[32] = {};
  for (int64_t t = 0; t * 256 < pr.s.k; ++t) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 8; ++e) {
        const int64_t kk = 256 * t + 8 * l + e;
        const float av = kk < pr.s.k ? pr.a[i * pr.lda + kk] : 0.0f;
        const float wv = kk < pr.s.k ? pr.w[j * pr.ldw + kk] : 0.0f;
        lanes[l] = std::fma(av, wv, lanes[l]);
      }
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ offset];
    std::memcpy(lanes, next, sizeof(lanes));
  }
  float r = lanes[0];
  if (pr.s.bias) r = r + pr.bias[j];
  if (pr.s.accumulate) r = pr.out0[i * pr.ldo + j] + r;
  return r;
}

// Every out[i, j] (j < n) within tol_units * 2^-24 * Magnitude(i, j) of
// `expected`, and every padding element (j >= n) of the output rows unchanged.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& expected, const Problem& pr, double tol_units,
                 const std::string& what) {
  for (int64_t i = 0; i < pr.s.m; ++i) {
    for (int64_t j = 0; j < pr.ldo; ++j) {
      const int64_t idx = i * pr.ldo + j;
      if (j >= pr.s.n) {
        ASSERT_EQ(std::memcmp(&got[idx], &pr.out0[idx], sizeof(float)), 0)
            << what << ": padding column " << j << " of row " << i << " written";
        continue;
      }
      ASSERT_TRUE(std::isfinite(got[idx])) << what << ": row " << i << " col " << j;
      const double bound = tol_units * kUnitRoundoff * pr.Magnitude(i, j);
      ASSERT_LE(std::fabs(static_cast<double>(got[idx]) - expected[idx]), bound)
          << what << ": row " << i << " col " << j << " got " << got[idx] << " expected " << expected[idx];
    }
  }
}

// Ragged shapes: n and k multiples of nothing, k = 1, k below and above one
// 256-element step and above one staged block of a (512 elements at 16 rows per
// tile, 8192 at 1), m on both sides of each row-tile size, strides past k and n.
std::vector<Shape> RaggedShapes() {
  return {
      {1, 37, 1},
      {1, 45, 300, 0, 0, 0, true, false},
      {2, 19, 67, 70, 0, 0, false, true},
      {3, 33, 257, 0, 260, 35, true, true},
      {7, 17, 129, 131, 0, 20, true, false},
      {17, 41, 100, 0, 0, 0, false, false},
      {64, 23, 613, 620, 0, 29, true, true},
      {65, 18, 1100, 0, 1107, 0, true, false},
      {5, 3, 1, 4, 3, 7, true, true},
      {1, 3, 8200, 0, 0, 5, true, true},  // over one staged block of a at 1 row per tile (8192)
  };
}

class MatmulCudaTest : public ::testing::TestWithParam<CudaTarget> {};

INSTANTIATE_TEST_SUITE_P(Cuda, MatmulCudaTest, cuda_testing::CudaTestTargets(), cuda_testing::CudaTargetName);

// The reduction orders differ (the CPU's avx2 chain: two chains of 8 lanes of
// ceil(k/16) fmas each, added, a 3-level tree, within the bound of one chain
// of ceil(k/8); ours: 32 lanes of 8 * ceil(k/256) fmas, a 5-level
// butterfly; each then + bias, + out). Each chain is within (its length) * u *
// Magnitude of the exact value (first-order bound, u = 2^-24), so the two are
// within the sum of the lengths. fmaf and fp32 adds are IEEE on the GPU as on
// the emulator (no fast math in the kernel), so the bound holds on both.
double DeterministicToleranceUnits(int64_t k) {
  const double cpu_chain = std::ceil(k / 8.0) + 3 + 2;
  const double gpu_chain = 8 * std::ceil(k / 256.0) + 5 + 2;
  return cpu_chain + gpu_chain;
}

TEST_P(MatmulCudaTest, DeterministicMatchesCpuOnRaggedShapesWithinSummationBound) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  uint32_t seed = 100;
  for (const Shape& s : RaggedShapes()) {
    const Problem pr(s, ++seed);
    for (bool bf16 : {false, true}) {
      const std::vector<float> got = RunDevice(*gpu, pr, MatmulMode::kDeterministic, bf16);
      const std::vector<float> want = RunCpu(pr, bf16);
      ExpectClose(got, want, pr, DeterministicToleranceUnits(s.k), Describe(s, bf16));
    }
  }
}

// Stronger than the bound: the result is exactly the chain the source documents.
TEST_P(MatmulCudaTest, DeterministicFollowsTheDocumentedChainBitForBit) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  uint32_t seed = 200;
  for (const Shape& s : RaggedShapes()) {
    const Problem pr(s, ++seed);
    std::vector<float> want = pr.out0;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) want[i * pr.ldo + j] = DocumentedChain(pr, i, j);
    }
    for (bool bf16 : {false, true}) {
      const std::vector<float> got = RunDevice(*gpu, pr, MatmulMode::kDeterministic, bf16);
      EXPECT_TRUE(BitsEqual(got, want)) << Describe(s, bf16);
    }
  }
}

// The contract of MatmulMode::kDeterministic: every row of an m = 37 call has
// the bits of the same row computed alone (m = 1: one row per tile) and inside
// an m = 64 call with other rows (at another position of another row tile).
TEST_P(MatmulCudaTest, RowsAreBitIdenticalAloneAndInsideAnyBatch) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const int64_t n = 21, k = 700;  // k over one staged block at 16 rows per tile, not at 1
  const Problem batch({37, n, k, 0, 0, 0, true, false}, 301);
  const Problem big({64, n, k, 0, 0, 0, true, false}, 302);
  for (bool bf16 : {false, true}) {
    const std::vector<float> full = RunDevice(*gpu, batch, MatmulMode::kDeterministic, bf16);
    // Row r of the m = 37 call alone, and as row (r + 11) % 64 among the m = 64 rows of `big`.
    Problem one({1, n, k, 0, 0, 0, true, false}, 303);
    one.w = batch.w;
    one.w16 = batch.w16;
    one.bias = batch.bias;
    Problem mixed = big;
    mixed.w = batch.w;
    mixed.w16 = batch.w16;
    mixed.bias = batch.bias;
    for (int64_t r = 0; r < 37; ++r) {
      std::copy_n(batch.a.begin() + r * k, k, one.a.begin());
      const std::vector<float> alone = RunDevice(*gpu, one, MatmulMode::kDeterministic, bf16);
      ASSERT_TRUE(BitsEqual(alone.data(), full.data() + r * n, n)) << "row " << r << " alone, bf16 " << bf16;
    }
    for (int64_t r = 0; r < 37; ++r) std::copy_n(batch.a.begin() + r * k, k, mixed.a.begin() + ((r + 11) % 64) * k);
    const std::vector<float> in_big = RunDevice(*gpu, mixed, MatmulMode::kDeterministic, bf16);
    for (int64_t r = 0; r < 37; ++r) {
      EXPECT_TRUE(BitsEqual(in_big.data() + ((r + 11) % 64) * n, full.data() + r * n, n))
          << "row " << r << " inside m = 64, bf16 " << bf16;
    }
  }
}

// Wide calls get blocks of 8 warps (m = 17: 2 row tiles x 138 column blocks)
// or 4 (m = 1), narrow ones 2 (the other tests): the same documented chain.
TEST_P(MatmulCudaTest, EveryBlockSizeFollowsTheDocumentedChain) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const int64_t n = 2200, k = 40;
  const Problem pr({17, n, k, 0, 0, 0, true, false}, 351);
  for (bool bf16 : {false, true}) {
    const std::vector<float> full = RunDevice(*gpu, pr, MatmulMode::kDeterministic, bf16);
    std::vector<float> want(full.size());
    for (int64_t i = 0; i < 17; ++i) {
      for (int64_t j = 0; j < n; ++j) want[i * n + j] = DocumentedChain(pr, i, j);
    }
    EXPECT_TRUE(BitsEqual(full, want)) << "m 17, bf16 " << bf16;
    Problem one = pr;
    one.s.m = 1;
    one.a.assign(pr.a.begin() + 16 * k, pr.a.begin() + 17 * k);
    one.out0.assign(pr.out0.begin() + 16 * n, pr.out0.begin() + 17 * n);
    const std::vector<float> alone = RunDevice(*gpu, one, MatmulMode::kDeterministic, bf16);
    EXPECT_TRUE(BitsEqual(alone.data(), want.data() + 16 * n, n)) << "m 1, bf16 " << bf16;
  }
}

// bf16 weights are widened exactly: the bits of fp32 weights holding the widened values.
TEST_P(MatmulCudaTest, Bf16WeightsGiveBitsOfWidenedFp32Weights) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  for (const Shape& s : {Shape{6, 29, 555, 0, 0, 0, true, true}, Shape{1, 40, 1024}}) {
    const Problem pr(s, 401);
    EXPECT_TRUE(BitsEqual(RunDevice(*gpu, pr, MatmulMode::kDeterministic, true),
                          RunDevice(*gpu, pr, MatmulMode::kDeterministic, false)))
        << Describe(s, true);
  }
}

// Weight rows 16-byte aligned (ldw a multiple of 8: vector loads) and not
// (ldw = k odd: element loads) fetch the same elements in the same order.
TEST_P(MatmulCudaTest, AlignedAndUnalignedWeightRowsGiveTheSameBits) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const int64_t m = 3, n = 20, k = 301;
  const Problem unaligned({m, n, k, 0, k, 0, true, false}, 501);
  Problem aligned({m, n, k, 0, 304, 0, true, false}, 502);
  aligned.a = unaligned.a;
  aligned.bias = unaligned.bias;
  aligned.out0 = unaligned.out0;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) {
      aligned.w[j * 304 + kk] = unaligned.w[j * k + kk];
      aligned.w16[j * 304 + kk] = unaligned.w16[j * k + kk];
    }
  }
  for (bool bf16 : {false, true}) {
    EXPECT_TRUE(BitsEqual(RunDevice(*gpu, aligned, MatmulMode::kDeterministic, bf16),
                          RunDevice(*gpu, unaligned, MatmulMode::kDeterministic, bf16)))
        << "bf16 " << bf16;
  }
}

// kFast on the GPU is cuBLAS, whose summation order is unknown: the bound of a
// sequential sum of k + 2 terms, and for bf16 weights a rounded to bf16 first
// (nearest even: up to 2^-9 relative per product, 2^15 units of 2^-24). On the
// emulated target kFast is the deterministic kernel (no cuBLAS), well inside.
TEST_P(MatmulCudaTest, FastMatchesCpuWithinBf16Tolerance) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  uint32_t seed = 600;
  for (const Shape& s : RaggedShapes()) {
    const Problem pr(s, ++seed);
    for (bool bf16 : {false, true}) {
      const std::vector<float> got = RunDevice(*gpu, pr, MatmulMode::kFast, bf16);
      const std::vector<float> want = RunCpu(pr, bf16);
      const double units = (bf16 ? 32768.0 : 0.0) + (s.k + 2) + std::ceil(s.k / 8.0) + 5;
      ExpectClose(got, want, pr, units, Describe(s, bf16) + " fast");
    }
  }
}

// m = 0 or n = 0: nothing to do, nothing written. k = 0: out = 0 (+ bias) (+ out).
TEST_P(MatmulCudaTest, EmptyShapesWriteNothingAndZeroKGivesBias) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  for (MatmulMode mode : {MatmulMode::kDeterministic, MatmulMode::kFast}) {
    for (const Shape& s : {Shape{0, 5, 8, 0, 0, 5, true, false}, Shape{3, 0, 8, 0, 0, 4, true, false}}) {
      Problem pr(s, 701);
      pr.out0.assign(12, 3.0f);  // an output buffer exists; it must not change
      EXPECT_TRUE(BitsEqual(RunDevice(*gpu, pr, mode, false), pr.out0)) << Describe(s, false);
    }
    for (bool bias : {false, true}) {
      for (bool accumulate : {false, true}) {
        const Problem pr({2, 5, 0, 0, 0, 0, bias, accumulate}, 702);
        const std::vector<float> got = RunDevice(*gpu, pr, mode, false);
        for (int64_t i = 0; i < 2; ++i) {
          for (int64_t j = 0; j < 5; ++j) {
            float want = 0.0f;
            if (bias) want = want + pr.bias[j];
            if (accumulate) want = pr.out0[i * 5 + j] + want;
            EXPECT_EQ(got[i * 5 + j], want) << "bias " << bias << " accumulate " << accumulate;
          }
        }
      }
    }
  }
}

// The checks of the CPU kernels: kKernelInvalidArgument and the output untouched.
TEST_P(MatmulCudaTest, InvalidArgumentsAreRejectedAndWriteNothing) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const Problem pr({2, 3, 4}, 801);
  DeviceBuffer a = Upload(*gpu, pr.a);
  DeviceBuffer w = Upload(*gpu, pr.w);
  DeviceBuffer w16 = Upload(*gpu, pr.w16);
  DeviceBuffer out = Upload(*gpu, pr.out0);
  const MatmulParams good = pr.Params(a.as<float>(), w.as<float>(), nullptr, nullptr, out.as<float>());
  std::vector<std::pair<std::string, MatmulParams>> bad;
  auto add = [&](const std::string& name, auto mutate) {
    MatmulParams p = good;
    mutate(p);
    bad.emplace_back(name, p);
  };
  add("null a", [](MatmulParams& p) { p.a = nullptr; });
  add("null out", [](MatmulParams& p) { p.out = nullptr; });
  add("no weights", [](MatmulParams& p) { p.w = nullptr; });
  add("both weights", [&](MatmulParams& p) { p.w_bf16 = w16.as<uint16_t>(); });
  add("negative m", [](MatmulParams& p) { p.m = -1; });
  add("negative n", [](MatmulParams& p) { p.n = -1; });
  add("negative k", [](MatmulParams& p) { p.k = -1; });
  add("lda < k", [](MatmulParams& p) { p.lda = 3; });
  add("ldw < k", [](MatmulParams& p) { p.ldw = 3; });
  add("ldo < n", [](MatmulParams& p) { p.ldo = 2; });
  for (MatmulMode mode : {MatmulMode::kDeterministic, MatmulMode::kFast}) {
    for (const auto& [name, p] : bad) {
      EXPECT_EQ(gpu->Matmul(p, mode), kKernelInvalidArgument) << name << " mode " << static_cast<int>(mode);
      // The CPU kernels agree that it is invalid.
      EXPECT_EQ(cpu::Matmul(p, mode, nullptr), kKernelInvalidArgument) << name;
    }
    EXPECT_EQ(gpu->Matmul(good, static_cast<MatmulMode>(7)), kKernelInvalidArgument);
  }
  EXPECT_TRUE(BitsEqual(Download<float>(*gpu, out.data(), 6), pr.out0));
}

}  // namespace
}  // namespace hybridserve::kernels
