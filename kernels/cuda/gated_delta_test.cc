// CUDA Gated DeltaNet kernels (kernels/cuda/gated_delta.cu) against the CPU
// kernels (kernels/cpu/gated_delta.cc), on the emulated backend and (where
// present) a GPU: the gates, the chunked prefill and the decode step, plus the
// bitwise contracts of kernels/gated_delta_params.h (the absolute chunk grid,
// a row alone or in a batch).

#include "kernels/cpu/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/gated_delta_params.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cuda_testing {
namespace {

using cpu::testing::BitsEqual;
using cpu::testing::MaxAbsDiff;
using cpu::testing::RandomVector;

// CUDA prefill vs the CPU sequential oracle (and the CPU chunked rule): the
// CUDA kernel folds W S into the right-hand side of the UT solve, sums with
// fmaf chains (the CPU without fused multiply-adds), takes the l2 norm's sum
// as a warp butterfly, and a GPU's expf is within 2 ulp of glibc's. With
// |q| = |k| = 1, beta in (0, 1), decays in [exp(-1), 1], |v| <= 1 and chunks
// up to 64, every element is O(1); the CPU chunked rule's own bound against
// the oracle is 4e-6 (kernels/cpu/gated_delta_test.cc), and the emulated build
// measures at most 4.8e-7 over the shapes below. 1e-5 leaves 20x for the
// GPU's expf; an algebraic mistake moves elements by >= 1e-3.
constexpr float kPrefillTol = 1e-5f;
// Decode vs the CPU step: the same per-element operations except fmaf chains
// and the norm's butterfly, over dk <= 64 terms: a few ulps at O(1) (the
// emulated build measures at most 9e-8); 2e-6 leaves 20x for the GPU's expf
// of the decay (2 ulp of every state element) and nvcc's contractions.
constexpr float kDecodeTol = 2e-6f;
// Gates: a GPU's expf is within 2 ulp of glibc's and its log1pf within 1:
// softplus(x) = log1p(exp(x)) carries up to ~3 ulp, g = -exp(a_log) * softplus
// another 2.5, beta = 1 / (1 + exp(-b)) ~3. A relative bound of 1e-6 (8 ulp
// at worst, 2^-20) covers them; the emulated build is bit-exact.
constexpr float kGateRelTol = 1e-6f;
// What a kernel must not overwrite (padding rows).
constexpr float kUntouched = -12345.0f;

struct Inputs {
  std::vector<float> q, k, v, g, beta, s0;
};

// q and k of `qk_stride` floats per token (>= hk * dk; the packed row of the
// engine's conv output), v of `v_stride`.
Inputs MakeInputs(std::mt19937& rng, int64_t n, int64_t hk, int64_t hv, int64_t dk, int64_t dv, int64_t qk_stride,
                  int64_t v_stride) {
  Inputs in;
  in.q = RandomVector(rng, n * qk_stride);
  in.k = RandomVector(rng, n * qk_stride);
  in.v = RandomVector(rng, n * v_stride);
  in.g = RandomVector(rng, n * hv, -1.0f, 0.0f);
  in.beta = RandomVector(rng, n * hv, 0.0f, 1.0f);
  in.s0 = RandomVector(rng, hv * dk * dv, -0.5f, 0.5f);
  return in;
}

struct Shape {
  int64_t n, hk, hv, dk, dv, cs, start;
  int64_t pad = 0;  // extra floats per token row of q, k, v (0: packed, strides 0)
};

GatedDeltaParams MakeParams(const Shape& s) {
  GatedDeltaParams p;
  p.seqlen = s.n;
  p.n_k_heads = s.hk;
  p.n_v_heads = s.hv;
  p.dk = s.dk;
  p.dv = s.dv;
  p.chunk_size = s.cs;
  p.start_pos = s.start;
  if (s.pad != 0) {
    p.q_token_stride = s.hk * s.dk + s.pad;
    p.k_token_stride = s.hk * s.dk + s.pad;
    p.v_token_stride = s.hv * s.dv + s.pad;
  }
  return p;
}

struct PrefillOut {
  std::vector<float> o, state, chunk_states;
};

// The CPU oracle (sequential) or chunked rule on host memory.
PrefillOut RunCpu(const Shape& s, const Inputs& in, bool chunked) {
  PrefillOut out;
  const int64_t se = s.hv * s.dk * s.dv;
  out.o.assign(s.n * s.hv * s.dv, 0.0f);
  out.state.assign(se, 0.0f);
  out.chunk_states.assign(GatedDeltaNumChunkStates(s.start, s.n, s.cs) * se, 0.0f);
  GatedDeltaParams p = MakeParams(s);
  p.q = in.q.data();
  p.k = in.k.data();
  p.v = in.v.data();
  p.g = in.g.data();
  p.beta = in.beta.data();
  p.initial_state = in.s0.data();
  p.o = out.o.data();
  p.final_state = out.state.data();
  p.chunk_states = out.chunk_states.empty() ? nullptr : out.chunk_states.data();
  const KernelStatus st = chunked ? cpu::GatedDeltaChunked(p) : cpu::GatedDeltaSequential(p);
  EXPECT_EQ(st, kKernelOk);
  return out;
}

PrefillOut RunBackend(Backend& be, const Shape& s, const Inputs& in) {
  const int64_t se = s.hv * s.dk * s.dv;
  const int64_t rows = GatedDeltaNumChunkStates(s.start, s.n, s.cs);
  DeviceBuffer q = Upload(be, in.q), k = Upload(be, in.k), v = Upload(be, in.v), g = Upload(be, in.g),
               beta = Upload(be, in.beta), s0 = Upload(be, in.s0);
  DeviceBuffer o = Zeros(be, std::max<int64_t>(1, s.n * s.hv * s.dv) * 4), fs = Zeros(be, se * 4),
               cst = Zeros(be, std::max<int64_t>(1, rows * se) * 4);
  GatedDeltaParams p = MakeParams(s);
  p.q = q.as<float>();
  p.k = k.as<float>();
  p.v = v.as<float>();
  p.g = g.as<float>();
  p.beta = beta.as<float>();
  p.initial_state = s0.as<float>();
  p.o = o.as<float>();
  p.final_state = fs.as<float>();
  p.chunk_states = rows > 0 ? cst.as<float>() : nullptr;
  EXPECT_EQ(be.GatedDeltaPrefill(p), kKernelOk);
  PrefillOut out;
  out.o = Download<float>(be, o.data(), s.n * s.hv * s.dv);
  out.state = Download<float>(be, fs.data(), se);
  out.chunk_states = Download<float>(be, cst.data(), rows * se);
  EXPECT_EQ(be.Synchronize(), kKernelOk);
  return out;
}

Inputs InputsFor(std::mt19937& rng, const Shape& s) {
  return MakeInputs(rng, s.n, s.hk, s.hv, s.dk, s.dv, s.hk * s.dk + s.pad, s.hv * s.dv + s.pad);
}

class GatedDeltaPrefillTest : public CudaKernelTest {};

// The shapes of the committed transformers fixture (chunk_case.json: 1 key
// head, 2 value heads, dk = dv = 16, chunk 64, 130 tokens) and odd ones: dk !=
// dv, n_v = 2 n_k, partial first and last chunks, start mid-chunk, one token,
// q/k/v as slices of a wider conv row, dv above one column slice (33), chunks
// above the 64-token block (128, 256: chunk_states spaced by the chunk).
TEST_P(GatedDeltaPrefillTest, MatchesCpuOracleAndChunkedRule) {
  const Shape shapes[] = {
      {130, 1, 2, 16, 16, 64, 0},    {100, 2, 4, 32, 16, 64, 40}, {37, 2, 4, 8, 16, 8, 5},
      {1, 1, 2, 4, 4, 4, 3},         {9, 3, 3, 4, 6, 4, 2},       {16, 2, 4, 8, 4, 16, 15},
      {70, 2, 4, 16, 33, 32, 7, 24}, {1, 2, 2, 8, 8, 64, 63, 5},  {300, 1, 2, 16, 16, 128, 50},
      {530, 2, 2, 8, 12, 256, 3},
  };
  std::mt19937 rng(50);
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " hk=" << s.hk << " hv=" << s.hv << " dk=" << s.dk
                                      << " dv=" << s.dv << " C=" << s.cs << " start=" << s.start << " pad=" << s.pad);
    const Inputs in = InputsFor(rng, s);
    const PrefillOut oracle = RunCpu(s, in, false);
    const PrefillOut chunked = RunCpu(s, in, true);
    const PrefillOut got = RunBackend(b(), s, in);
    const float d_o = MaxAbsDiff(got.o, oracle.o), d_s = MaxAbsDiff(got.state, oracle.state),
                d_c = MaxAbsDiff(got.chunk_states, oracle.chunk_states);
    std::printf(
        "n=%lld C=%lld start=%lld: max |cuda - oracle| o %.3g state %.3g chunk states %.3g; "
        "|cuda - cpu chunked| o %.3g\n",
        static_cast<long long>(s.n), static_cast<long long>(s.cs), static_cast<long long>(s.start), d_o, d_s, d_c,
        MaxAbsDiff(got.o, chunked.o));
    EXPECT_LE(d_o, kPrefillTol);
    EXPECT_LE(d_s, kPrefillTol);
    EXPECT_LE(d_c, kPrefillTol);
    EXPECT_LE(MaxAbsDiff(got.o, chunked.o), kPrefillTol);
    EXPECT_LE(MaxAbsDiff(got.state, chunked.state), kPrefillTol);
    float omax = 0.0f;
    for (float x : oracle.o) omax = std::max(omax, std::fabs(x));
    EXPECT_GT(omax, 0.05f) << "outputs too small for the tolerance to mean anything";
  }
}

// [0, n) in one call equals [0, b) then [b, n) from the state at boundary b,
// bit for bit, for every boundary b of the grid (and the one call's
// chunk_states row equals the first call's final state).
TEST_P(GatedDeltaPrefillTest, SplitOnTheGridIsBitIdenticalToOneCall) {
  for (const Shape& full : {Shape{45, 2, 4, 8, 12, 8, 3}, Shape{300, 1, 2, 8, 8, 128, 70}}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << full.cs);
    std::mt19937 rng(7);
    const Inputs in = InputsFor(rng, full);
    const PrefillOut one = RunBackend(b(), full, in);
    const int64_t se = full.hv * full.dk * full.dv;
    for (int64_t bnd = (full.start / full.cs + 1) * full.cs; bnd < full.start + full.n; bnd += full.cs) {
      SCOPED_TRACE(::testing::Message() << "boundary " << bnd);
      const int64_t m = bnd - full.start;
      Shape first = full;
      first.n = m;
      const Inputs in1 = in;  // the first call reads only its m tokens
      const PrefillOut a = RunBackend(b(), first, in1);
      const int64_t row = bnd / full.cs - full.start / full.cs - 1;
      EXPECT_TRUE(BitsEqual(a.state.data(), one.chunk_states.data() + row * se, se));
      Shape second = full;
      second.n = full.n - m;
      second.start = bnd;
      Inputs in2;
      in2.q.assign(in.q.begin() + m * full.hk * full.dk, in.q.end());
      in2.k.assign(in.k.begin() + m * full.hk * full.dk, in.k.end());
      in2.v.assign(in.v.begin() + m * full.hv * full.dv, in.v.end());
      in2.g.assign(in.g.begin() + m * full.hv, in.g.end());
      in2.beta.assign(in.beta.begin() + m * full.hv, in.beta.end());
      in2.s0 = a.state;
      const PrefillOut c = RunBackend(b(), second, in2);
      EXPECT_TRUE(BitsEqual(a.o.data(), one.o.data(), m * full.hv * full.dv));
      EXPECT_TRUE(BitsEqual(c.o.data(), one.o.data() + m * full.hv * full.dv, (full.n - m) * full.hv * full.dv));
      EXPECT_TRUE(BitsEqual(c.state, one.state));
    }
  }
}

// initial_state and final_state may be the same pool row; seqlen 0 leaves it.
TEST_P(GatedDeltaPrefillTest, InPlaceStateAndEmptyCall) {
  const Shape s{20, 1, 2, 8, 8, 8, 4};
  std::mt19937 rng(3);
  const Inputs in = InputsFor(rng, s);
  const PrefillOut want = RunBackend(b(), s, in);
  const int64_t se = s.hv * s.dk * s.dv;
  DeviceBuffer q = Up(in.q), k = Up(in.k), v = Up(in.v), g = Up(in.g), beta = Up(in.beta), st = Up(in.s0);
  DeviceBuffer o = Zeros(b(), s.n * s.hv * s.dv * 4);
  GatedDeltaParams p = MakeParams(s);
  p.q = q.as<float>();
  p.k = k.as<float>();
  p.v = v.as<float>();
  p.g = g.as<float>();
  p.beta = beta.as<float>();
  p.o = o.as<float>();
  p.initial_state = st.as<float>();
  p.final_state = st.as<float>();
  ASSERT_EQ(b().GatedDeltaPrefill(p), kKernelOk);
  EXPECT_TRUE(BitsEqual(Down(st), want.state));
  EXPECT_TRUE(BitsEqual(Download<float>(b(), o.data(), s.n * s.hv * s.dv), want.o));
  p.seqlen = 0;
  ASSERT_EQ(b().GatedDeltaPrefill(p), kKernelOk);
  EXPECT_TRUE(BitsEqual(Down(st), want.state));
  // seqlen 0 with distinct buffers copies the state through.
  DeviceBuffer other = Zeros(b(), se * 4);
  p.final_state = other.as<float>();
  ASSERT_EQ(b().GatedDeltaPrefill(p), kKernelOk);
  EXPECT_TRUE(BitsEqual(Down(other), want.state));
}

TEST_P(GatedDeltaPrefillTest, RejectsInvalidParams) {
  DeviceBuffer buf = Zeros(b(), 4096 * 4);
  GatedDeltaParams p = MakeParams(Shape{4, 1, 1, 4, 4, 4, 0});
  p.q = p.k = p.v = p.g = p.beta = buf.as<float>();
  p.o = buf.as<float>() + 2048;
  GatedDeltaParams bad = p;
  bad.n_v_heads = 3;
  bad.n_k_heads = 2;
  EXPECT_EQ(b().GatedDeltaPrefill(bad), kKernelInvalidArgument);
  bad = p;
  bad.chunk_size = 12;
  EXPECT_EQ(b().GatedDeltaPrefill(bad), kKernelInvalidArgument);
  bad = p;
  bad.v_token_stride = 3;
  EXPECT_EQ(b().GatedDeltaPrefill(bad), kKernelInvalidArgument);
  bad = p;
  bad.q = nullptr;
  EXPECT_EQ(b().GatedDeltaPrefill(bad), kKernelInvalidArgument);
  EXPECT_EQ(b().Synchronize(), kKernelOk);
}

INSTANTIATE_TEST_SUITE_P(Cuda, GatedDeltaPrefillTest, CudaTestTargets(), CudaTargetName);

// ---------------------------------------------------------------- Decode

struct DecodeShape {
  int64_t batch, hk, hv, dk, dv, num_slots;
  int64_t pad = 0;
};

struct DecodeInputs {
  std::vector<float> q, k, v, g, beta, state;
  int64_t qs, vs;
};

DecodeInputs MakeDecodeInputs(std::mt19937& rng, const DecodeShape& s) {
  DecodeInputs in;
  in.qs = s.hk * s.dk + s.pad;
  in.vs = s.hv * s.dv + s.pad;
  in.q = RandomVector(rng, s.batch * in.qs);
  in.k = RandomVector(rng, s.batch * in.qs);
  in.v = RandomVector(rng, s.batch * in.vs);
  in.g = RandomVector(rng, s.batch * s.hv, -1.0f, 0.0f);
  in.beta = RandomVector(rng, s.batch * s.hv, 0.0f, 1.0f);
  in.state = RandomVector(rng, s.num_slots * s.hv * s.dk * s.dv, -0.5f, 0.5f);
  return in;
}

GatedDeltaDecodeParams MakeDecodeParams(const DecodeShape& s, const DecodeInputs& in) {
  GatedDeltaDecodeParams p;
  p.batch = s.batch;
  p.num_slots = s.num_slots;
  p.n_k_heads = s.hk;
  p.n_v_heads = s.hv;
  p.dk = s.dk;
  p.dv = s.dv;
  if (s.pad != 0) {
    p.q_batch_stride = p.k_batch_stride = in.qs;
    p.v_batch_stride = in.vs;
  }
  return p;
}

struct DecodeOut {
  std::vector<float> o, state;
  int sync = kKernelOk;
};

DecodeOut DecodeCpu(const DecodeShape& s, const DecodeInputs& in, const std::vector<int32_t>* slots) {
  DecodeOut out;
  out.o.assign(s.batch * s.hv * s.dv, kUntouched);
  out.state = in.state;
  GatedDeltaDecodeParams p = MakeDecodeParams(s, in);
  p.state = out.state.data();
  p.state_slots = slots != nullptr ? slots->data() : nullptr;
  p.q = in.q.data();
  p.k = in.k.data();
  p.v = in.v.data();
  p.g = in.g.data();
  p.beta = in.beta.data();
  p.o = out.o.data();
  EXPECT_EQ(cpu::GatedDeltaDecode(p), kKernelOk);
  return out;
}

DecodeOut DecodeBackend(Backend& be, const DecodeShape& s, const DecodeInputs& in, const std::vector<int32_t>* slots) {
  DeviceBuffer q = Upload(be, in.q), k = Upload(be, in.k), v = Upload(be, in.v), g = Upload(be, in.g),
               beta = Upload(be, in.beta), state = Upload(be, in.state);
  DeviceBuffer o = Upload(be, std::vector<float>(s.batch * s.hv * s.dv, kUntouched));
  DeviceBuffer sl;
  if (slots != nullptr) sl = Upload(be, *slots);
  GatedDeltaDecodeParams p = MakeDecodeParams(s, in);
  p.state = state.as<float>();
  p.state_slots = slots != nullptr ? sl.as<int32_t>() : nullptr;
  p.q = q.as<float>();
  p.k = k.as<float>();
  p.v = v.as<float>();
  p.g = g.as<float>();
  p.beta = beta.as<float>();
  p.o = o.as<float>();
  EXPECT_EQ(be.GatedDeltaDecode(p), kKernelOk);
  DecodeOut out;
  out.sync = be.Synchronize();
  out.o = Download<float>(be, o.data(), s.batch * s.hv * s.dv);
  out.state = Download<float>(be, state.data(), static_cast<int64_t>(in.state.size()));
  return out;
}

class GatedDeltaDecodeTest : public CudaKernelTest {};

// Padding rows (slot -1) leave their o rows and every state slot they do not
// own untouched; shapes with dk != dv, dv above one column slice (40), n_v = 2
// n_k, q/k/v as slices of a wider row.
TEST_P(GatedDeltaDecodeTest, MatchesCpuWithPaddingRows) {
  for (const DecodeShape& s :
       {DecodeShape{4, 1, 2, 16, 16, 6}, DecodeShape{3, 2, 4, 8, 40, 4, 9}, DecodeShape{5, 3, 3, 12, 6, 5}}) {
    SCOPED_TRACE(::testing::Message() << "dk=" << s.dk << " dv=" << s.dv << " pad=" << s.pad);
    std::mt19937 rng(11);
    const DecodeInputs in = MakeDecodeInputs(rng, s);
    std::vector<int32_t> slots(s.batch);
    for (int64_t i = 0; i < s.batch; ++i) slots[i] = static_cast<int32_t>((s.num_slots - 1 - i) % s.num_slots);
    slots[1] = -1;
    const DecodeOut want = DecodeCpu(s, in, &slots);
    const DecodeOut got = DecodeBackend(b(), s, in, &slots);
    EXPECT_EQ(got.sync, kKernelOk);
    const int64_t os = s.hv * s.dv;
    for (int64_t i = 0; i < os; ++i) ASSERT_EQ(got.o[1 * os + i], kUntouched) << "padding row written at " << i;
    std::printf("dk=%lld dv=%lld: max |cuda - cpu| o %.3g state %.3g\n", static_cast<long long>(s.dk),
                static_cast<long long>(s.dv), MaxAbsDiff(got.o, want.o), MaxAbsDiff(got.state, want.state));
    EXPECT_LE(MaxAbsDiff(got.o, want.o), kDecodeTol);
    EXPECT_LE(MaxAbsDiff(got.state, want.state), kDecodeTol);
    // Slots no row names keep their bits.
    const int64_t se = s.hv * s.dk * s.dv;
    for (int64_t slot = 0; slot < s.num_slots; ++slot) {
      bool used = false;
      for (int32_t x : slots) used |= x == slot;
      if (!used) EXPECT_TRUE(BitsEqual(got.state.data() + slot * se, in.state.data() + slot * se, se)) << slot;
    }
    // Without slots: row b is slot b.
    const DecodeOut want2 = DecodeCpu(s, in, nullptr);
    const DecodeOut got2 = DecodeBackend(b(), s, in, nullptr);
    EXPECT_LE(MaxAbsDiff(got2.o, want2.o), kDecodeTol);
    EXPECT_LE(MaxAbsDiff(got2.state, want2.state), kDecodeTol);
  }
}

// A row's output and state are the same bits alone as in a batch.
TEST_P(GatedDeltaDecodeTest, RowIsBitIdenticalAloneAndInABatch) {
  const DecodeShape s{6, 2, 4, 16, 8, 6};
  std::mt19937 rng(5);
  const DecodeInputs in = MakeDecodeInputs(rng, s);
  const DecodeOut batch = DecodeBackend(b(), s, in, nullptr);
  const int64_t os = s.hv * s.dv, se = s.hv * s.dk * s.dv;
  const int64_t row = 4;
  DecodeShape one = s;
  one.batch = 1;
  DecodeInputs in1 = in;
  in1.q.assign(in.q.begin() + row * in.qs, in.q.begin() + (row + 1) * in.qs);
  in1.k.assign(in.k.begin() + row * in.qs, in.k.begin() + (row + 1) * in.qs);
  in1.v.assign(in.v.begin() + row * in.vs, in.v.begin() + (row + 1) * in.vs);
  in1.g.assign(in.g.begin() + row * s.hv, in.g.begin() + (row + 1) * s.hv);
  in1.beta.assign(in.beta.begin() + row * s.hv, in.beta.begin() + (row + 1) * s.hv);
  const std::vector<int32_t> slot = {static_cast<int32_t>(row)};
  const DecodeOut alone = DecodeBackend(b(), one, in1, &slot);
  EXPECT_TRUE(BitsEqual(alone.o.data(), batch.o.data() + row * os, os));
  EXPECT_TRUE(BitsEqual(alone.state.data() + row * se, batch.state.data() + row * se, se));
}

// One decode step equals a one-token prefill of the same backend within the
// decode tolerance (both are the rule's one-token case; the prefill reaches it
// through the UT form).
TEST_P(GatedDeltaDecodeTest, OneStepMatchesOneTokenPrefill) {
  const DecodeShape s{1, 2, 4, 16, 12, 1};
  std::mt19937 rng(9);
  const DecodeInputs in = MakeDecodeInputs(rng, s);
  const DecodeOut dec = DecodeBackend(b(), s, in, nullptr);
  Inputs pin{in.q, in.k, in.v, in.g, in.beta, in.state};
  const PrefillOut pre = RunBackend(b(), Shape{1, s.hk, s.hv, s.dk, s.dv, 64, 17}, pin);
  EXPECT_LE(MaxAbsDiff(dec.o, pre.o), kDecodeTol);
  EXPECT_LE(MaxAbsDiff(dec.state, pre.state), kDecodeTol);
}

TEST_P(GatedDeltaDecodeTest, SlotOutOfRangeRaisesTheFlagAndSkipsTheRow) {
  const DecodeShape s{3, 1, 2, 8, 8, 2};
  std::mt19937 rng(2);
  const DecodeInputs in = MakeDecodeInputs(rng, s);
  const std::vector<int32_t> slots = {1, 2, 0};  // 2 >= num_slots
  const DecodeOut got = DecodeBackend(b(), s, in, &slots);
  EXPECT_EQ(got.sync, kKernelInvalidArgument);
  EXPECT_EQ(b().Synchronize(), kKernelOk) << "the flag is cleared once reported";
  const int64_t os = s.hv * s.dv;
  for (int64_t i = 0; i < os; ++i) ASSERT_EQ(got.o[1 * os + i], kUntouched) << i;
  const std::vector<int32_t> as_padding = {1, -1, 0};
  const DecodeOut want = DecodeCpu(s, in, &as_padding);
  EXPECT_LE(MaxAbsDiff(got.o, want.o), kDecodeTol);
  EXPECT_LE(MaxAbsDiff(got.state, want.state), kDecodeTol);
}

TEST_P(GatedDeltaDecodeTest, RejectsInvalidParams) {
  DeviceBuffer buf = Zeros(b(), 4096 * 4);
  const DecodeShape s{2, 1, 2, 4, 4, 2};
  GatedDeltaDecodeParams p;
  p.batch = 2;
  p.num_slots = 2;
  p.n_k_heads = 1;
  p.n_v_heads = 2;
  p.dk = 4;
  p.dv = 4;
  p.state = p.o = buf.as<float>();
  p.q = p.k = p.v = p.g = p.beta = buf.as<float>() + 1024;
  GatedDeltaDecodeParams bad = p;
  bad.batch = 3;  // no slots: row b is slot b
  EXPECT_EQ(b().GatedDeltaDecode(bad), kKernelInvalidArgument);
  bad = p;
  bad.k_batch_stride = 2;
  EXPECT_EQ(b().GatedDeltaDecode(bad), kKernelInvalidArgument);
  bad = p;
  bad.state = nullptr;
  EXPECT_EQ(b().GatedDeltaDecode(bad), kKernelInvalidArgument);
  EXPECT_EQ(b().Synchronize(), kKernelOk);
  (void)s;
}

INSTANTIATE_TEST_SUITE_P(Cuda, GatedDeltaDecodeTest, CudaTestTargets(), CudaTargetName);

// ---------------------------------------------------------------- Gates

class GatedDeltaGatesTest : public CudaKernelTest {};

// Against the CPU gates (themselves bit-exact against torch, see
// kernels/cpu/gated_delta_test.cc), with a and b as slices of wider rows and
// arguments past softplus's threshold.
TEST_P(GatedDeltaGatesTest, MatchesCpu) {
  const int64_t n = 37, h = 6, as = 16, bs = 9;
  std::mt19937 rng(4);
  const std::vector<float> a = RandomVector(rng, n * as, -30.0f, 30.0f), bb = RandomVector(rng, n * bs, -25.0f, 25.0f),
                           dt = RandomVector(rng, h, -2.0f, 2.0f), alog = RandomVector(rng, h, -1.5f, 1.5f);
  std::vector<float> g_cpu(n * h), beta_cpu(n * h);
  GatedDeltaGatesParams p;
  p.n_tokens = n;
  p.n_heads = h;
  p.a_row_stride = as;
  p.b_row_stride = bs;
  p.a = a.data();
  p.b = bb.data();
  p.dt_bias = dt.data();
  p.a_log = alog.data();
  p.g = g_cpu.data();
  p.beta = beta_cpu.data();
  ASSERT_EQ(cpu::GatedDeltaGates(p), kKernelOk);
  DeviceBuffer da = Up(a), db = Up(bb), ddt = Up(dt), dal = Up(alog), dg = Zeros(b(), n * h * 4),
               dbeta = Zeros(b(), n * h * 4);
  p.a = da.as<float>();
  p.b = db.as<float>();
  p.dt_bias = ddt.as<float>();
  p.a_log = dal.as<float>();
  p.g = dg.as<float>();
  p.beta = dbeta.as<float>();
  ASSERT_EQ(b().GatedDeltaGates(p), kKernelOk);
  const std::vector<float> g = Down(dg), beta = Down(dbeta);
  if (emulated()) {  // glibc's expf and log1pf, the CPU's operations in its order
    EXPECT_TRUE(BitsEqual(g, g_cpu));
    EXPECT_TRUE(BitsEqual(beta, beta_cpu));
  }
  for (int64_t i = 0; i < n * h; ++i) {
    EXPECT_NEAR(g[i], g_cpu[i], kGateRelTol * std::fabs(g_cpu[i])) << i;
    EXPECT_NEAR(beta[i], beta_cpu[i], kGateRelTol * std::fabs(beta_cpu[i])) << i;
  }
  GatedDeltaGatesParams bad = p;
  bad.a_row_stride = 3;
  EXPECT_EQ(b().GatedDeltaGates(bad), kKernelInvalidArgument);
  bad = p;
  bad.a_log = nullptr;
  EXPECT_EQ(b().GatedDeltaGates(bad), kKernelInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Cuda, GatedDeltaGatesTest, CudaTestTargets(), CudaTargetName);

}  // namespace
}  // namespace hybridserve::kernels::cuda_testing
