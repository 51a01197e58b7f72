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
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

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
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
