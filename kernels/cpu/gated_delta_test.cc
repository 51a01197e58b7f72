#include "kernels/cpu/gated_delta.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::FirstBitMismatch;
using testing::JsonArray;
using testing::MaxAbsDiff;
using testing::RandomVector;

// Chunked vs oracle: the two differ only in the order of fp32 operations (the
// triangular solve and the factored decays exp(gc_i - gc_j) against the
// oracle's repeated multiplications). With |q| = |k| = 1 (l2norm), beta in
// (0, 1), decays in [exp(-1), 1], |v| <= 1 and chunks up to 64, every output
// and state element is O(1); the worst difference measured over the shapes
// below is 4.0e-7 (a few ulps at 1.0). 4e-6 leaves 10x headroom and still
// catches any algebraic mistake (which moves elements by >= 1e-3).
constexpr float kChunkTol = 4e-6f;

struct Inputs {
  std::vector<float> q, k, v, g, beta, s0;
};

Inputs MakeInputs(std::mt19937& rng, int64_t n, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  Inputs in;
  in.q = RandomVector(rng, n * hk * dk);
  in.k = RandomVector(rng, n * hk * dk);
  in.v = RandomVector(rng, n * hv * dv);
  in.g = RandomVector(rng, n * hv, -1.0f, 0.0f);
  in.beta = RandomVector(rng, n * hv, 0.0f, 1.0f);
  in.s0 = RandomVector(rng, hv * dk * dv, -0.5f, 0.5f);
  return in;
}

GatedDeltaParams MakeParams(const Inputs& in, int64_t n, int64_t hk, int64_t hv, int64_t dk, int64_t dv, int64_t cs,
                            int64_t start) {
  GatedDeltaParams p;
  p.q = in.q.data();
  p.k = in.k.data();
  p.v = in.v.data();
  p.g = in.g.data();
  p.beta = in.beta.data();
  p.initial_state = in.s0.data();
  p.seqlen = n;
  p.n_k_heads = hk;
  p.n_v_heads = hv;
  p.dk = dk;
  p.dv = dv;
  p.chunk_size = cs;
  p.start_pos = start;
  return p;
}
struct Shape {
  int64_t n, hk, hv, dk, dv, cs, start;
};

TEST(GatedDeltaTest, ChunkedMatchesOracle) {
  const Shape shapes[] = {
      {64, 1, 1, 8, 8, 16, 0},    {50, 2, 2, 16, 8, 16, 0},    {37, 2, 4, 8, 16, 8, 5}, {1, 1, 2, 4, 4, 4, 3},
      {130, 1, 2, 16, 16, 64, 0}, {100, 2, 4, 32, 16, 64, 40}, {9, 3, 3, 4, 6, 4, 2},   {16, 2, 4, 8, 4, 16, 15},
  };
  std::mt19937 rng(50);
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << sh.n << " hk=" << sh.hk << " hv=" << sh.hv << " dk=" << sh.dk
                                      << " dv=" << sh.dv << " C=" << sh.cs << " start=" << sh.start);
    const Inputs in = MakeInputs(rng, sh.n, sh.hk, sh.hv, sh.dk, sh.dv);
    const int64_t se = sh.hv * sh.dk * sh.dv;
    const int64_t rows = GatedDeltaNumChunkStates(sh.start, sh.n, sh.cs);
    std::vector<float> o_ref(sh.n * sh.hv * sh.dv), s_ref(se), cs_ref(rows * se);
    std::vector<float> o(o_ref.size()), s(se), cst(cs_ref.size());
    GatedDeltaParams p = MakeParams(in, sh.n, sh.hk, sh.hv, sh.dk, sh.dv, sh.cs, sh.start);
    p.o = o_ref.data();
    p.final_state = s_ref.data();
    p.chunk_states = cs_ref.data();
    ASSERT_EQ(GatedDeltaSequential(p), kKernelOk);
    p.o = o.data();
    p.final_state = s.data();
    p.chunk_states = cst.data();
    ASSERT_EQ(GatedDeltaChunked(p), kKernelOk);
    const float d_o = MaxAbsDiff(o, o_ref), d_s = MaxAbsDiff(s, s_ref), d_c = MaxAbsDiff(cst, cs_ref);
    std::printf("n=%lld C=%lld start=%lld: max |chunked - oracle| o %.3g state %.3g chunk states %.3g\n",
                static_cast<long long>(sh.n), static_cast<long long>(sh.cs), static_cast<long long>(sh.start), d_o, d_s,
                d_c);
    EXPECT_LE(d_o, kChunkTol);
    EXPECT_LE(d_s, kChunkTol);
    EXPECT_LE(d_c, kChunkTol);
    // The outputs are not trivially small (the tolerance is meaningful).
    float omax = 0.0f;
    for (float x : o_ref) omax = std::max(omax, std::fabs(x));
    EXPECT_GT(omax, 0.05f);
  }
}

// Restore at a grid checkpoint is bit-identical to cold: [0, n) in one call
// equals [0, b) then [b, n) from the state at boundary b, for every boundary
// (and the one call's chunk_states row for b equals the first call's final state).
TEST(GatedDeltaTest, GridRestoreIsBitExact) {
  const int64_t n = 45, hk = 2, hv = 4, dk = 8, dv = 8, cs = 8;
  for (int64_t start : {0, 3}) {
    std::mt19937 rng(7 + start);
    const Inputs in = MakeInputs(rng, n, hk, hv, dk, dv);
    const int64_t se = hv * dk * dv;
    std::vector<float> o_full(n * hv * dv), s_full(se), states(GatedDeltaNumChunkStates(start, n, cs) * se);
    GatedDeltaParams p = MakeParams(in, n, hk, hv, dk, dv, cs, start);
    p.o = o_full.data();
    p.final_state = s_full.data();
    p.chunk_states = states.data();
    ASSERT_EQ(GatedDeltaChunked(p), kKernelOk);
    for (int64_t b = (start / cs + 1) * cs; b < start + n; b += cs) {
      SCOPED_TRACE(::testing::Message() << "start=" << start << " boundary=" << b);
      const int64_t m = b - start;  // tokens in the first call
      std::vector<float> o(n * hv * dv), s_mid(se), s_end(se);
      GatedDeltaParams a = MakeParams(in, m, hk, hv, dk, dv, cs, start);
      a.o = o.data();
      a.final_state = s_mid.data();
      ASSERT_EQ(GatedDeltaChunked(a), kKernelOk);
      const int64_t row = b / cs - start / cs - 1;
      EXPECT_EQ(FirstBitMismatch(s_mid.data(), states.data() + row * se, se), -1);
      GatedDeltaParams c = MakeParams(in, n - m, hk, hv, dk, dv, cs, b);
      c.q += m * hk * dk;
      c.k += m * hk * dk;
      c.v += m * hv * dv;
      c.g += m * hv;
      c.beta += m * hv;
      c.initial_state = states.data() + row * se;
      c.o = o.data() + m * hv * dv;
      c.final_state = s_end.data();
      ASSERT_EQ(GatedDeltaChunked(c), kKernelOk);
      EXPECT_EQ(FirstBitMismatch(o.data(), o_full.data(), n * hv * dv), -1);
      EXPECT_EQ(FirstBitMismatch(s_end.data(), s_full.data(), se), -1);
    }
  }
}

// An empty call hands the initial state through unchanged; final_state may
// alias initial_state (the in-place use a state slot makes of it).
TEST(GatedDeltaTest, EmptyCallAndInPlaceState) {
  const int64_t n = 21, hk = 1, hv = 2, dk = 8, dv = 4, cs = 8;
  std::mt19937 rng(5);
  const Inputs in = MakeInputs(rng, n, hk, hv, dk, dv);
  const int64_t se = hv * dk * dv;
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "sequential" : "chunked");
    auto run = [&](const GatedDeltaParams& p) { return which == 0 ? GatedDeltaSequential(p) : GatedDeltaChunked(p); };
    std::vector<float> s(se, 9.0f);
    GatedDeltaParams e = MakeParams(in, 0, hk, hv, dk, dv, cs, 5);
    e.q = e.k = e.v = e.g = e.beta = nullptr;
    e.final_state = s.data();
    ASSERT_EQ(run(e), kKernelOk);
    EXPECT_EQ(FirstBitMismatch(s.data(), in.s0.data(), se), -1);

    std::vector<float> o_ref(n * hv * dv), s_ref(se), o(n * hv * dv);
    GatedDeltaParams p = MakeParams(in, n, hk, hv, dk, dv, cs, 3);
    p.o = o_ref.data();
    p.final_state = s_ref.data();
    ASSERT_EQ(run(p), kKernelOk);
    std::vector<float> inplace = in.s0;
    p.initial_state = inplace.data();
    p.final_state = inplace.data();
    p.o = o.data();
    ASSERT_EQ(run(p), kKernelOk);
    EXPECT_EQ(FirstBitMismatch(o.data(), o_ref.data(), n * hv * dv), -1);
    EXPECT_EQ(FirstBitMismatch(inplace.data(), s_ref.data(), se), -1);
  }
}

// The decode update is bit-identical to the oracle, step by step (same op order),
// through a slot map with a padding row.
TEST(GatedDeltaTest, DecodeEqualsOracleStepBitExact) {
  const int64_t n = 12, hk = 2, hv = 4, dk = 8, dv = 4;
  std::mt19937 rng(11);
  const Inputs in = MakeInputs(rng, n, hk, hv, dk, dv);
  const int64_t se = hv * dk * dv;
  std::vector<float> o_ref(n * hv * dv), s_ref(se);
  GatedDeltaParams p = MakeParams(in, n, hk, hv, dk, dv, 4, 0);
  p.o = o_ref.data();
  p.final_state = s_ref.data();
  ASSERT_EQ(GatedDeltaSequential(p), kKernelOk);
  // Pool of 3 slots; the sequence lives in slot 2; row 1 of the batch is padding.
  std::vector<float> pool(3 * se, 0.0f);
  std::memcpy(pool.data() + 2 * se, in.s0.data(), sizeof(float) * se);
  const int32_t slots[2] = {2, -1};
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> q(2 * hk * dk), k(2 * hk * dk), v(2 * hv * dv), g(2 * hv), beta(2 * hv);
    std::memcpy(q.data(), in.q.data() + t * hk * dk, sizeof(float) * hk * dk);
    std::memcpy(k.data(), in.k.data() + t * hk * dk, sizeof(float) * hk * dk);
    std::memcpy(v.data(), in.v.data() + t * hv * dv, sizeof(float) * hv * dv);
    std::memcpy(g.data(), in.g.data() + t * hv, sizeof(float) * hv);
    std::memcpy(beta.data(), in.beta.data() + t * hv, sizeof(float) * hv);
    std::vector<float> o(2 * hv * dv, 123.0f);
    GatedDeltaDecodeParams d;
    d.state = pool.data();
    d.state_slots = slots;
    d.q = q.data();
    d.k = k.data();
    d.v = v.data();
    d.g = g.data();
    d.beta = beta.data();
    d.o = o.data();
    d.batch = 2;
    d.num_slots = 3;
    d.n_k_heads = hk;
    d.n_v_heads = hv;
    d.dk = dk;
    d.dv = dv;
    ASSERT_EQ(GatedDeltaDecode(d), kKernelOk);
    EXPECT_EQ(FirstBitMismatch(o.data(), o_ref.data() + t * hv * dv, hv * dv), -1) << "t=" << t;
    EXPECT_EQ(o[hv * dv], 123.0f);  // padding row untouched
  }
  EXPECT_EQ(FirstBitMismatch(pool.data() + 2 * se, s_ref.data(), se), -1);
  for (int64_t i = 0; i < 2 * se; ++i) ASSERT_EQ(pool[i], 0.0f);  // other slots untouched
}

// By hand, dk = dv = 2, one token, no l2norm: S0 = [[1, 2], [3, 4]], exp(g) = 0.5,
// beta = 0.5, k = (1, 0), v = (10, 20), q = (1, 1).
//   S = 0.5 S0 = [[0.5, 1], [1.5, 2]]; S^T k = (0.5, 1);
//   delta = ((10, 20) - (0.5, 1)) * 0.5 = (4.75, 9.5);
//   S = [[5.25, 10.5], [1.5, 2]]; o = S^T q / sqrt(2) = (6.75, 12.5) / sqrt(2).
// Tolerance 1e-6: exp(log(0.5f)) and 1/sqrt(2) are each within an ulp.
TEST(GatedDeltaTest, KnownAnswerOneToken) {
  const float q[2] = {1, 1}, k[2] = {1, 0}, v[2] = {10, 20}, g[1] = {std::log(0.5f)}, beta[1] = {0.5f};
  const float s0[4] = {1, 2, 3, 4};
  const float o_want[2] = {6.75f / std::sqrt(2.0f), 12.5f / std::sqrt(2.0f)};
  const float s_want[4] = {5.25f, 10.5f, 1.5f, 2.0f};
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which == 0 ? "sequential" : which == 1 ? "chunked" : "decode");
    float o[2] = {0, 0}, s[4] = {0, 0, 0, 0};
    if (which < 2) {
      GatedDeltaParams p;
      p.q = q;
      p.k = k;
      p.v = v;
      p.g = g;
      p.beta = beta;
      p.initial_state = s0;
      p.o = o;
      p.final_state = s;
      p.seqlen = 1;
      p.n_k_heads = p.n_v_heads = 1;
      p.dk = p.dv = 2;
      p.chunk_size = 4;
      p.l2norm_qk = false;
      ASSERT_EQ(which == 0 ? GatedDeltaSequential(p) : GatedDeltaChunked(p), kKernelOk);
    } else {
      std::memcpy(s, s0, sizeof(s));
      GatedDeltaDecodeParams d;
      d.state = s;
      d.q = q;
      d.k = k;
      d.v = v;
      d.g = g;
      d.beta = beta;
      d.o = o;
      d.batch = d.num_slots = 1;
      d.n_k_heads = d.n_v_heads = 1;
      d.dk = d.dv = 2;
      d.l2norm_qk = false;
      ASSERT_EQ(GatedDeltaDecode(d), kKernelOk);
    }
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(o[i], o_want[i], 1e-6f) << i;
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(s[i], s_want[i], 1e-6f) << i;
  }
}

// transformers 5.23's torch_chunk_gated_delta_rule (tools/gen_gated_delta_fixture.py):
// seqlen 7, chunk 4, 2 key heads for 4 value heads (key head h / 2 for value head h), dk 4, dv 3, initial state,
// use_qk_l2norm_in_kernel. Tolerance 1e-5: a different fp32 op order on O(1) values.
TEST(GatedDeltaTest, MatchesTransformersFixture) {
  std::ifstream f("tests/fixtures/gated_delta/chunk_case.json");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const std::vector<float> q = JsonArray(text, "q"), k = JsonArray(text, "k"), v = JsonArray(text, "v"),
                           g = JsonArray(text, "g"), beta = JsonArray(text, "beta"),
                           s0 = JsonArray(text, "initial_state"), o_want = JsonArray(text, "o"),
                           s_want = JsonArray(text, "final_state");
  ASSERT_EQ(q.size(), 7u * 2u * 4u);
  ASSERT_EQ(v.size(), 7u * 4u * 3u);
  ASSERT_EQ(k.size(), q.size());
  ASSERT_EQ(g.size(), 7u * 4u);
  ASSERT_EQ(beta.size(), 7u * 4u);
  ASSERT_EQ(s0.size(), 4u * 4u * 3u);
  ASSERT_EQ(o_want.size(), 7u * 4u * 3u);
  ASSERT_EQ(s_want.size(), 4u * 4u * 3u);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "sequential" : "chunked");
    std::vector<float> o(o_want.size()), s(s_want.size());
    GatedDeltaParams p;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.g = g.data();
    p.beta = beta.data();
    p.initial_state = s0.data();
    p.o = o.data();
    p.final_state = s.data();
    p.seqlen = 7;
    p.n_k_heads = 2;
    p.n_v_heads = 4;
    p.dk = 4;
    p.dv = 3;
    p.chunk_size = 4;
    ASSERT_EQ(which == 0 ? GatedDeltaSequential(p) : GatedDeltaChunked(p), kKernelOk);
    const float d_o = MaxAbsDiff(o, o_want), d_s = MaxAbsDiff(s, s_want);
    std::printf("%s vs transformers: max |diff| o %.3g state %.3g\n", which == 0 ? "sequential" : "chunked", d_o, d_s);
    EXPECT_LE(d_o, 1e-5f);
    EXPECT_LE(d_s, 1e-5f);
  }
}

TEST(GatedDeltaTest, ArgumentChecksNameTheField) {
  std::mt19937 rng(3);
  const Inputs in = MakeInputs(rng, 4, 1, 2, 4, 4);
  std::vector<float> o(4 * 2 * 4);
  const GatedDeltaParams good = [&] {
    GatedDeltaParams p = MakeParams(in, 4, 1, 2, 4, 4, 4, 0);
    p.o = o.data();
    return p;
  }();
  struct Case {
    const char* field;
    void (*mutate)(GatedDeltaParams&);
  };
  const Case cases[] = {
      {"seqlen", [](GatedDeltaParams& p) { p.seqlen = -1; }},
      {"n_k_heads", [](GatedDeltaParams& p) { p.n_k_heads = 0; }},
      {"n_v_heads", [](GatedDeltaParams& p) { p.n_v_heads = 3; }},
      {"dk", [](GatedDeltaParams& p) { p.dk = 0; }},
      {"dv", [](GatedDeltaParams& p) { p.dv = -2; }},
      {"chunk_size", [](GatedDeltaParams& p) { p.chunk_size = 6; }},
      {"chunk_size", [](GatedDeltaParams& p) { p.chunk_size = 0; }},
      {"start_pos", [](GatedDeltaParams& p) { p.start_pos = -1; }},
      {"q", [](GatedDeltaParams& p) { p.q = nullptr; }},
      {"k", [](GatedDeltaParams& p) { p.k = nullptr; }},
      {"v", [](GatedDeltaParams& p) { p.v = nullptr; }},
      {"g", [](GatedDeltaParams& p) { p.g = nullptr; }},
      {"beta", [](GatedDeltaParams& p) { p.beta = nullptr; }},
      {"o", [](GatedDeltaParams& p) { p.o = nullptr; }},
  };
  for (const Case& c : cases) {
    GatedDeltaParams p = good;
    c.mutate(p);
    if (std::string(c.field) == "n_v_heads") p.n_k_heads = 2;  // 3 value heads over 2 key heads
    for (int which = 0; which < 2; ++which) {
      const char* bad = nullptr;
      EXPECT_EQ(which == 0 ? GatedDeltaSequential(p, &bad) : GatedDeltaChunked(p, &bad), kKernelInvalidArgument)
          << c.field;
      ASSERT_NE(bad, nullptr) << c.field;
      EXPECT_STREQ(bad, c.field);
    }
  }
  const char* bad = nullptr;
  EXPECT_EQ(GatedDeltaChunked(good, &bad), kKernelOk);
  EXPECT_EQ(bad, nullptr);

  // Decode.
  std::vector<float> pool(2 * 2 * 4 * 4, 0.0f);
  const int32_t slots_bad[1] = {2};
  auto decode = [&](auto mutate) {
    GatedDeltaDecodeParams d;
    d.state = pool.data();
    d.q = in.q.data();
    d.k = in.k.data();
    d.v = in.v.data();
    d.g = in.g.data();
    d.beta = in.beta.data();
    d.o = o.data();
    d.batch = 1;
    d.num_slots = 2;
    d.n_k_heads = 1;
    d.n_v_heads = 2;
    d.dk = 4;
    d.dv = 4;
    mutate(d);
    const char* field = "";
    const KernelStatus st = GatedDeltaDecode(d, &field);
    return st == kKernelOk ? std::string("ok") : std::string(field);
  };
  EXPECT_EQ(decode([](GatedDeltaDecodeParams&) {}), "ok");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.batch = -1; }), "batch");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.num_slots = 0; }), "num_slots");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.batch = 3; }), "num_slots");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.n_v_heads = 0; }), "n_v_heads");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.dk = 0; }), "dk");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.state = nullptr; }), "state");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.beta = nullptr; }), "beta");
  EXPECT_EQ(decode([&](GatedDeltaDecodeParams& d) { d.state_slots = slots_bad; }), "state_slots");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.q_batch_stride = 3; }), "q_batch_stride");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.k_batch_stride = -1; }), "k_batch_stride");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.v_batch_stride = 7; }), "v_batch_stride");
  EXPECT_EQ(decode([](GatedDeltaDecodeParams& d) { d.v_batch_stride = 8; }), "ok");

  // Prefill strides: shorter than the packed row (or negative) is refused.
  for (auto [field, mutate] : std::vector<std::pair<const char*, void (*)(GatedDeltaParams&)>>{
           {"q_token_stride", [](GatedDeltaParams& p) { p.q_token_stride = 3; }},
           {"k_token_stride", [](GatedDeltaParams& p) { p.k_token_stride = -4; }},
           {"v_token_stride", [](GatedDeltaParams& p) { p.v_token_stride = 7; }}}) {
    GatedDeltaParams p = good;
    mutate(p);
    const char* why = nullptr;
    EXPECT_EQ(GatedDeltaChunked(p, &why), kKernelInvalidArgument) << field;
    EXPECT_STREQ(why, field);
  }
}

// A chunk_size above the 64-token block only spaces the chunk_states rows:
// o and the final state are the chunk_size-64 call's bits, and each row of the
// 256-chunk call is the 64-chunk call's row at the same absolute boundary.
// Both are within the oracle's tolerance.
TEST(GatedDeltaTest, LargeChunksRunInBlocksOfSixtyFour) {
  const int64_t n = 600, hk = 1, hv = 2, dk = 8, dv = 8, start = 30;
  std::mt19937 rng(64);
  const Inputs in = MakeInputs(rng, n, hk, hv, dk, dv);
  const int64_t se = hv * dk * dv;
  auto run = [&](int64_t cs, bool chunked, std::vector<float>* o, std::vector<float>* s, std::vector<float>* cst) {
    o->assign(n * hv * dv, 0.0f);
    s->assign(se, 0.0f);
    cst->assign(GatedDeltaNumChunkStates(start, n, cs) * se, 0.0f);
    GatedDeltaParams p = MakeParams(in, n, hk, hv, dk, dv, cs, start);
    p.o = o->data();
    p.final_state = s->data();
    p.chunk_states = cst->data();
    ASSERT_EQ(chunked ? GatedDeltaChunked(p) : GatedDeltaSequential(p), kKernelOk);
  };
  std::vector<float> o64, s64, c64, o256, s256, c256, o_ref, s_ref, c_ref;
  run(64, true, &o64, &s64, &c64);
  run(256, true, &o256, &s256, &c256);
  run(256, false, &o_ref, &s_ref, &c_ref);
  EXPECT_EQ(FirstBitMismatch(o256.data(), o64.data(), n * hv * dv), -1);
  EXPECT_EQ(FirstBitMismatch(s256.data(), s64.data(), se), -1);
  ASSERT_EQ(c256.size(), 2 * se);  // boundaries 256 and 512
  for (int64_t r = 0; r < 2; ++r) {
    const int64_t b = 256 * (r + 1);
    const int64_t row64 = b / 64 - start / 64 - 1;
    EXPECT_EQ(FirstBitMismatch(c256.data() + r * se, c64.data() + row64 * se, se), -1) << "boundary " << b;
  }
  EXPECT_LE(MaxAbsDiff(o256, o_ref), kChunkTol);
  EXPECT_LE(MaxAbsDiff(c256, c_ref), kChunkTol);
}

// ---------------------------------------------------------------- Strides and threads

// Copies rows of `width` floats into rows of `stride` floats (the rest filled
// with a value the kernels must never read into their results).
std::vector<float> Widen(const std::vector<float>& packed, int64_t rows, int64_t width, int64_t stride) {
  std::vector<float> out(rows * stride, 1e30f);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * stride, packed.data() + r * width, width * 4);
  return out;
}

// q, k, v as slices of one conv output row [q | k | v] (token stride conv_dim,
// the engine's layout) give the packed call's bits, on the prefill (both
// rules) and the decode step.
TEST(GatedDeltaTest, StridedQkvSlicesOfOneRowGiveThePackedBits) {
  const int64_t n = 29, hk = 2, hv = 4, dk = 8, dv = 6, cs = 8;
  const int64_t conv_dim = 2 * hk * dk + hv * dv;
  std::mt19937 rng(21);
  const Inputs in = MakeInputs(rng, n, hk, hv, dk, dv);
  std::vector<float> row(n * conv_dim);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(row.data() + t * conv_dim, in.q.data() + t * hk * dk, hk * dk * 4);
    std::memcpy(row.data() + t * conv_dim + hk * dk, in.k.data() + t * hk * dk, hk * dk * 4);
    std::memcpy(row.data() + t * conv_dim + 2 * hk * dk, in.v.data() + t * hv * dv, hv * dv * 4);
  }
  const int64_t se = hv * dk * dv;
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "sequential" : "chunked");
    auto run = [&](const GatedDeltaParams& p) { return which == 0 ? GatedDeltaSequential(p) : GatedDeltaChunked(p); };
    std::vector<float> o_ref(n * hv * dv), s_ref(se), o(n * hv * dv), s(se);
    GatedDeltaParams p = MakeParams(in, n, hk, hv, dk, dv, cs, 5);
    p.o = o_ref.data();
    p.final_state = s_ref.data();
    ASSERT_EQ(run(p), kKernelOk);
    p.q = row.data();
    p.k = row.data() + hk * dk;
    p.v = row.data() + 2 * hk * dk;
    p.q_token_stride = p.k_token_stride = p.v_token_stride = conv_dim;
    p.o = o.data();
    p.final_state = s.data();
    ASSERT_EQ(run(p), kKernelOk);
    EXPECT_EQ(FirstBitMismatch(o.data(), o_ref.data(), n * hv * dv), -1);
    EXPECT_EQ(FirstBitMismatch(s.data(), s_ref.data(), se), -1);
  }
  // Decode: n rows of the batch, each its own slot.
  std::vector<float> pool_ref(n * se), pool(n * se), o_ref(n * hv * dv), o(n * hv * dv);
  for (int64_t b = 0; b < n; ++b) std::memcpy(pool_ref.data() + b * se, in.s0.data(), se * 4);
  pool = pool_ref;
  GatedDeltaDecodeParams d;
  d.state = pool_ref.data();
  d.q = in.q.data();
  d.k = in.k.data();
  d.v = in.v.data();
  d.g = in.g.data();
  d.beta = in.beta.data();
  d.o = o_ref.data();
  d.batch = n;
  d.num_slots = n;
  d.n_k_heads = hk;
  d.n_v_heads = hv;
  d.dk = dk;
  d.dv = dv;
  ASSERT_EQ(GatedDeltaDecode(d), kKernelOk);
  d.state = pool.data();
  d.q = row.data();
  d.k = row.data() + hk * dk;
  d.v = row.data() + 2 * hk * dk;
  d.q_batch_stride = d.k_batch_stride = d.v_batch_stride = conv_dim;
  d.o = o.data();
  ASSERT_EQ(GatedDeltaDecode(d), kKernelOk);
  EXPECT_EQ(FirstBitMismatch(o.data(), o_ref.data(), n * hv * dv), -1);
  EXPECT_EQ(FirstBitMismatch(pool.data(), pool_ref.data(), n * se), -1);
}

// The thread pool splits value heads (decode: rows x heads) only: 1, 2 and 3
// threads give the same bits.
TEST(GatedDeltaTest, ThreadCountDoesNotChangeAnyBit) {
  const int64_t n = 50, hk = 2, hv = 6, dk = 16, dv = 8, cs = 16;
  std::mt19937 rng(31);
  const Inputs in = MakeInputs(rng, n, hk, hv, dk, dv);
  const int64_t se = hv * dk * dv;
  const int64_t rows = GatedDeltaNumChunkStates(7, n, cs);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> o(n * hv * dv), s(se), cst(rows * se);
    GatedDeltaParams p = MakeParams(in, n, hk, hv, dk, dv, cs, 7);
    p.o = o.data();
    p.final_state = s.data();
    p.chunk_states = cst.data();
    ASSERT_EQ(GatedDeltaChunked(p, nullptr, &pool), kKernelOk);
    std::vector<float> state = Widen(in.s0, 1, se, se);
    state.resize(3 * se, 0.5f);
    const int32_t slots[3] = {2, -1, 0};
    std::vector<float> od(3 * hv * dv, 7.0f);
    GatedDeltaDecodeParams d;
    d.state = state.data();
    d.state_slots = slots;
    d.q = in.q.data();
    d.k = in.k.data();
    d.v = in.v.data();
    d.g = in.g.data();
    d.beta = in.beta.data();
    d.o = od.data();
    d.batch = 3;
    d.num_slots = 3;
    d.n_k_heads = hk;
    d.n_v_heads = hv;
    d.dk = dk;
    d.dv = dv;
    ASSERT_EQ(GatedDeltaDecode(d, nullptr, &pool), kKernelOk);
    std::vector<float> all = o;
    for (const auto* v : {&s, &cst, &state, &od}) all.insert(all.end(), v->begin(), v->end());
    outs.push_back(all);
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_EQ(FirstBitMismatch(outs[i].data(), outs[0].data(), static_cast<int64_t>(outs[0].size())), -1) << i;
  }
}

// ---------------------------------------------------------------- Gates

// torch 2.x fp32 on the same inputs (tools: /work/venv-golden, transformers
// 5.23's Qwen3NextGatedDeltaNet lines `beta = b.sigmoid()` and
// `g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)`),
// written as exact hex floats. Inputs cover softplus's threshold (a + dt_bias
// = 20.5, 19.25, 23: both branches), large negatives (tiny softplus), sigmoid's
// saturation (b = +-20, -30).
constexpr int64_t kGateTokens = 5, kGateHeads = 4;
constexpr float kGateA[kGateTokens * kGateHeads] = {
    -0x1.cp+1f, 0x1p-2f,        0x1.3p+4f,        0x1.9p+4f,       -0x1.ep+4f,     0x1.8p+0f,      -0x1.8p-1f,
    0x1.cp+2f,  0x0p+0f,        -0x1.0624dep-10f, 0x1.2e6666p+4f,  0x1.0cccccp+2f, -0x1p+3f,       0x1.9p+3f,
    -0x1.ep+3f, 0x1.333334p-1f, 0x1.19999ap+1f,   -0x1.19999ap+1f, 0x1.58p+4f,     -0x1.99999ap-4f};
constexpr float kGateB[kGateTokens * kGateHeads] = {
    -0x1p+2f,       0x1.333334p-2f,  0x1.4p+1f, -0x1.ccccccp-1f, 0x1.2p+3f,      -0x1.8p+3f,     0x0p+0f,
    0x1.19999ap+0f, -0x1.99999ap-3f, 0x1.6p+2f, -0x1.ep+4f,      0x1.8p-1f,      0x1.a66666p+1f, -0x1.b33334p+0f,
    0x1.99999ap-5f, -0x1.8p+2f,      0x1.4p+4f, -0x1.4p+4f,      0x1.ccccccp-1f, -0x1.ccccccp-2f};
constexpr float kGateDtBias[kGateHeads] = {0x1p-1f, -0x1p-2f, 0x1.8p+0f, -0x1p+1f};
constexpr float kGateALog[kGateHeads] = {-0x1p+0f, 0x1.333334p-2f, 0x1.333334p+0f, -0x1.99999ap-5f};
constexpr float kTorchG[kGateTokens * kGateHeads] = {
    -0x1.24da32p-6f, -0x1.df0da2p-1f, -0x1.103fe6p+6f,  -0x1.5e0d6cp+4f, -0x1.ff3864p-45f,
    -0x1.038196p+1f, -0x1.e3244ap+1f, -0x1.30cd6p+2f,   -0x1.6ef172p-2f, -0x1.8dbec6p-1f,
    -0x1.0eebeap+6f, -0x1.18a93p+1f,  -0x1.aa960cp-13f, -0x1.08928cp+4f, -0x1.317654p-18f,
    -0x1.ad662ep-3f, -0x1.046766p+0f, -0x1.c9a544p-4f,  -0x1.317366p+6f, -0x1.c21762p-4f};
constexpr float kTorchBeta[kGateTokens * kGateHeads] = {
    0x1.26afa2p-6f, 0x1.261d54p-1f, 0x1.d9291ep-1f, 0x1.27fcdap-2f,  0x1.ffefd4p-1f, 0x1.9c541cp-18f, 0x1p-1f,
    0x1.802218p-1f, 0x1.ccf852p-2f, 0x1.fdea86p-1f, 0x1.a56e0ep-44f, 0x1.5bbd5p-1f,  0x1.edc99ep-1f,  0x1.3c5848p-3f,
    0x1.06660ep-1f, 0x1.441776p-9f, 0x1p+0f,        0x1.1b4866p-29f, 0x1.6c0192p-1f, 0x1.8eb496p-2f};

TEST(GatedDeltaTest, GatesMatchTorchBitForBit) {
  // a and b as slices of wider rows (the engine's projection output).
  const int64_t as = 7, bs = 5;
  const std::vector<float> a = Widen(std::vector<float>(kGateA, kGateA + 20), kGateTokens, kGateHeads, as);
  const std::vector<float> b = Widen(std::vector<float>(kGateB, kGateB + 20), kGateTokens, kGateHeads, bs);
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::vector<float> g(20, 5.0f), beta(20, 5.0f);
    GatedDeltaGatesParams p;
    p.a = a.data();
    p.b = b.data();
    p.dt_bias = kGateDtBias;
    p.a_log = kGateALog;
    p.g = g.data();
    p.beta = beta.data();
    p.n_tokens = kGateTokens;
    p.n_heads = kGateHeads;
    p.a_row_stride = as;
    p.b_row_stride = bs;
    ASSERT_EQ(GatedDeltaGates(p, nullptr, &pool), kKernelOk);
    EXPECT_EQ(FirstBitMismatch(g.data(), kTorchG, 20), -1) << "threads " << threads;
    EXPECT_EQ(FirstBitMismatch(beta.data(), kTorchBeta, 20), -1) << "threads " << threads;
  }
}

TEST(GatedDeltaTest, GatesArgumentChecksNameTheField) {
  float buf[64] = {};
  auto check = [&](auto mutate) {
    GatedDeltaGatesParams p;
    p.a = p.b = p.dt_bias = p.a_log = buf;
    p.g = buf + 16;
    p.beta = buf + 32;
    p.n_tokens = 2;
    p.n_heads = 4;
    mutate(p);
    const char* field = "";
    return GatedDeltaGates(p, &field) == kKernelOk ? std::string("ok") : std::string(field);
  };
  EXPECT_EQ(check([](GatedDeltaGatesParams&) {}), "ok");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.n_tokens = -1; }), "n_tokens");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.n_heads = 0; }), "n_heads");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.a_row_stride = 3; }), "a_row_stride");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.b_row_stride = -1; }), "b_row_stride");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.dt_bias = nullptr; }), "dt_bias");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.a_log = nullptr; }), "a_log");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.a = nullptr; }), "a");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.b = nullptr; }), "b");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.g = nullptr; }), "g");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) { p.beta = nullptr; }), "beta");
  EXPECT_EQ(check([](GatedDeltaGatesParams& p) {
              p.n_tokens = 0;
              p.a = nullptr;
            }),
            "ok");
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
