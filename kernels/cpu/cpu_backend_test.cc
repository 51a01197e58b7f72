#include "kernels/cpu/cpu_backend.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/test_util.h"

namespace hybridserve::kernels::cpu {
namespace {

TEST(CpuBackendTest, AllocateGivesZeroedAlignedMemoryOfEverySize) {
  CpuBackend backend(1);
  for (int64_t bytes : {int64_t{1}, int64_t{63}, int64_t{4096}, int64_t{3} << 20}) {
    DeviceBuffer b;
    ASSERT_EQ(backend.Allocate(bytes, &b), kKernelOk) << bytes;
    EXPECT_EQ(b.bytes(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << bytes;
    const auto* p = b.as<uint8_t>();
    for (int64_t i = 0; i < bytes; i += 997) EXPECT_EQ(p[i], 0) << "byte " << i << " of " << bytes;
    EXPECT_EQ(p[bytes - 1], 0);
    EXPECT_EQ(b.backend(), &backend);
  }
}

TEST(CpuBackendTest, CopiesAndFillMoveExactlyTheBytesAsked) {
  CpuBackend backend(1);
  DeviceBuffer a, b;
  ASSERT_EQ(backend.Allocate(16, &a), kKernelOk);
  ASSERT_EQ(backend.Allocate(16, &b), kKernelOk);
  const std::vector<uint8_t> host = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(backend.CopyToDevice(a.as<uint8_t>() + 4, host.data(), 8), kKernelOk);
  ASSERT_EQ(backend.Fill(b.data(), 0xAB, 16), kKernelOk);
  ASSERT_EQ(backend.CopyOnDevice(b.as<uint8_t>() + 2, a.data(), 12), kKernelOk);
  std::vector<uint8_t> out(16, 0xFF);
  ASSERT_EQ(backend.CopyToHost(out.data(), b.data(), 16), kKernelOk);
  EXPECT_EQ(out, (std::vector<uint8_t>{0xAB, 0xAB, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0xAB, 0xAB}));
  EXPECT_EQ(backend.HostAddress(b.data()), b.data());
  EXPECT_EQ(backend.Synchronize(), kKernelOk);
}

TEST(CpuBackendTest, UploadConstantAliasesTheHostBytesAndReleasingLeavesThem) {
  CpuBackend backend(1);
  std::vector<float> weights = {1.5f, -2.0f};
  {
    DeviceBuffer w;
    ASSERT_EQ(backend.UploadConstant(weights.data(), 8, &w), kKernelOk);
    EXPECT_EQ(w.data(), weights.data());
  }
  EXPECT_EQ(weights[1], -2.0f);
}

TEST(CpuBackendTest, BadArgumentsAreRejectedAndChangeNothing) {
  CpuBackend backend(1);
  DeviceBuffer b;
  EXPECT_EQ(backend.Allocate(0, &b), kKernelInvalidArgument);
  EXPECT_EQ(backend.Allocate(-5, &b), kKernelInvalidArgument);
  EXPECT_EQ(backend.Allocate(8, nullptr), kKernelInvalidArgument);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(backend.UploadConstant(nullptr, 8, &b), kKernelInvalidArgument);
  ASSERT_EQ(backend.Allocate(32, &b), kKernelOk);
  EXPECT_EQ(backend.CopyOnDevice(b.as<uint8_t>() + 4, b.data(), 8), kKernelInvalidArgument);  // overlap
  EXPECT_EQ(backend.CopyToHost(nullptr, b.data(), 4), kKernelInvalidArgument);
  EXPECT_EQ(backend.Fill(b.data(), 1, -1), kKernelInvalidArgument);
  EXPECT_EQ(backend.Allocate(int64_t{1} << 62, &b), kKernelOutOfMemory);
  EXPECT_EQ(b.bytes(), 32);  // the failed allocation left the old buffer alone
}

TEST(CpuBackendTest, MovedBufferReleasesOnce) {
  CpuBackend backend(1);
  DeviceBuffer a;
  ASSERT_EQ(backend.Allocate(int64_t{2} << 20, &a), kKernelOk);
  void* data = a.data();
  DeviceBuffer b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
  EXPECT_EQ(b.data(), data);
  b.Reset();
  EXPECT_TRUE(b.empty());
}

TEST(CpuBackendTest, EmbeddingGathersRowsAndRejectsOutOfRangeTokens) {
  CpuBackend backend(2);
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};  // [3, 2]
  DeviceBuffer t, tokens, out;
  ASSERT_EQ(backend.UploadConstant(table.data(), 24, &t), kKernelOk);
  ASSERT_EQ(backend.Allocate(16, &tokens), kKernelOk);
  ASSERT_EQ(backend.Allocate(32, &out), kKernelOk);
  const std::vector<int32_t> ids = {2, 0, 2, 1};
  ASSERT_EQ(backend.CopyToDevice(tokens.data(), ids.data(), 16), kKernelOk);
  EmbeddingParams p;
  p.table = t.as<float>();
  p.tokens = tokens.as<int32_t>();
  p.out = out.as<float>();
  p.n_tokens = 4;
  p.vocab = 3;
  p.dim = 2;
  ASSERT_EQ(backend.Embedding(p), kKernelOk);
  std::vector<float> got(8);
  ASSERT_EQ(backend.CopyToHost(got.data(), out.data(), 32), kKernelOk);
  EXPECT_EQ(got, (std::vector<float>{20, 21, 0, 1, 20, 21, 10, 11}));
  p.vocab = 2;  // token 2 is now out of range
  EXPECT_EQ(backend.Embedding(p), kKernelInvalidArgument);
}

// The Gated DeltaNet operations: the prefill is the chunked rule, the decode
// the kernels/cpu step, the gates kernels/cpu's, through device buffers; 1, 2
// and 4 threads give the same bits as the single-threaded kernels.
TEST(CpuBackendTest, GatedDeltaOperationsAreTheCpuKernelsAtEveryThreadCount) {
  const int64_t n = 40, hk = 2, hv = 4, dk = 16, dv = 8, cs = 16, start = 5;
  const int64_t se = hv * dk * dv;
  std::mt19937 rng(50);
  const std::vector<float> q = testing::RandomVector(rng, n * hk * dk), k = testing::RandomVector(rng, n * hk * dk),
                           v = testing::RandomVector(rng, n * hv * dv), a = testing::RandomVector(rng, n * hv, -5, 5),
                           b = testing::RandomVector(rng, n * hv, -5, 5), dt = testing::RandomVector(rng, hv),
                           alog = testing::RandomVector(rng, hv), s0 = testing::RandomVector(rng, se, -0.5f, 0.5f);
  // The references: the kernels/cpu launchers without a pool.
  std::vector<float> g_ref(n * hv), beta_ref(n * hv), o_ref(n * hv * dv), s_ref(se), cst_ref(2 * se);
  GatedDeltaGatesParams gp;
  gp.a = a.data();
  gp.b = b.data();
  gp.dt_bias = dt.data();
  gp.a_log = alog.data();
  gp.g = g_ref.data();
  gp.beta = beta_ref.data();
  gp.n_tokens = n;
  gp.n_heads = hv;
  ASSERT_EQ(GatedDeltaGates(gp), kKernelOk);
  GatedDeltaParams pp;
  pp.q = q.data();
  pp.k = k.data();
  pp.v = v.data();
  pp.g = g_ref.data();
  pp.beta = beta_ref.data();
  pp.initial_state = s0.data();
  pp.o = o_ref.data();
  pp.final_state = s_ref.data();
  pp.chunk_states = cst_ref.data();
  pp.seqlen = n;
  pp.n_k_heads = hk;
  pp.n_v_heads = hv;
  pp.dk = dk;
  pp.dv = dv;
  pp.chunk_size = cs;
  pp.start_pos = start;
  ASSERT_EQ(GatedDeltaNumChunkStates(start, n, cs), 2);
  ASSERT_EQ(GatedDeltaChunked(pp), kKernelOk);
  std::vector<float> pool_ref(2 * se, 0.25f), od_ref(2 * hv * dv, 3.0f);
  const int32_t slots[2] = {-1, 1};
  GatedDeltaDecodeParams dp;
  dp.state = pool_ref.data();
  dp.state_slots = slots;
  dp.q = q.data();
  dp.k = k.data();
  dp.v = v.data();
  dp.g = g_ref.data();
  dp.beta = beta_ref.data();
  dp.o = od_ref.data();
  dp.batch = 2;
  dp.num_slots = 2;
  dp.n_k_heads = hk;
  dp.n_v_heads = hv;
  dp.dk = dk;
  dp.dv = dv;
  ASSERT_EQ(GatedDeltaDecode(dp), kKernelOk);

  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(threads);
    CpuBackend be(threads);
    auto up = [&](const std::vector<float>& host) {
      DeviceBuffer buf;
      EXPECT_EQ(be.Allocate(static_cast<int64_t>(host.size() * 4), &buf), kKernelOk);
      EXPECT_EQ(be.CopyToDevice(buf.data(), host.data(), static_cast<int64_t>(host.size() * 4)), kKernelOk);
      return buf;
    };
    DeviceBuffer da = up(a), db = up(b), ddt = up(dt), dal = up(alog), dq = up(q), dk_ = up(k), dv_ = up(v),
                 ds0 = up(s0), dg = up(std::vector<float>(n * hv)), dbeta = up(std::vector<float>(n * hv)),
                 dout = up(std::vector<float>(n * hv * dv)), dst = up(std::vector<float>(se)),
                 dcst = up(std::vector<float>(2 * se)), dpool = up(std::vector<float>(2 * se, 0.25f)),
                 dod = up(std::vector<float>(2 * hv * dv, 3.0f));
    DeviceBuffer dslots;
    ASSERT_EQ(be.Allocate(8, &dslots), kKernelOk);
    ASSERT_EQ(be.CopyToDevice(dslots.data(), slots, 8), kKernelOk);
    GatedDeltaGatesParams g2 = gp;
    g2.a = da.as<float>();
    g2.b = db.as<float>();
    g2.dt_bias = ddt.as<float>();
    g2.a_log = dal.as<float>();
    g2.g = dg.as<float>();
    g2.beta = dbeta.as<float>();
    ASSERT_EQ(be.GatedDeltaGates(g2), kKernelOk);
    GatedDeltaParams p2 = pp;
    p2.q = dq.as<float>();
    p2.k = dk_.as<float>();
    p2.v = dv_.as<float>();
    p2.g = dg.as<float>();
    p2.beta = dbeta.as<float>();
    p2.initial_state = ds0.as<float>();
    p2.o = dout.as<float>();
    p2.final_state = dst.as<float>();
    p2.chunk_states = dcst.as<float>();
    ASSERT_EQ(be.GatedDeltaPrefill(p2), kKernelOk);
    GatedDeltaDecodeParams d2 = dp;
    d2.state = dpool.as<float>();
    d2.state_slots = dslots.as<int32_t>();
    d2.q = dq.as<float>();
    d2.k = dk_.as<float>();
    d2.v = dv_.as<float>();
    d2.g = dg.as<float>();
    d2.beta = dbeta.as<float>();
    d2.o = dod.as<float>();
    ASSERT_EQ(be.GatedDeltaDecode(d2), kKernelOk);
    EXPECT_EQ(testing::FirstBitMismatch(dg.as<float>(), g_ref.data(), n * hv), -1);
    EXPECT_EQ(testing::FirstBitMismatch(dbeta.as<float>(), beta_ref.data(), n * hv), -1);
    EXPECT_EQ(testing::FirstBitMismatch(dout.as<float>(), o_ref.data(), n * hv * dv), -1);
    EXPECT_EQ(testing::FirstBitMismatch(dst.as<float>(), s_ref.data(), se), -1);
    EXPECT_EQ(testing::FirstBitMismatch(dcst.as<float>(), cst_ref.data(), 2 * se), -1);
    EXPECT_EQ(testing::FirstBitMismatch(dpool.as<float>(), pool_ref.data(), 2 * se), -1);
    EXPECT_EQ(testing::FirstBitMismatch(dod.as<float>(), od_ref.data(), 2 * hv * dv), -1);
    // A bad argument is refused through the backend too.
    GatedDeltaParams bad = p2;
    bad.v_token_stride = 1;
    EXPECT_EQ(be.GatedDeltaPrefill(bad), kKernelInvalidArgument);
  }
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
