#include "kernels/counting_backend.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/gated_delta_params.h"

namespace hybridserve::kernels {
namespace {

// The Gated DeltaNet operations are forwarded (their results are the inner
// backend's), counted by name, and every pointer they receive is checked
// against the live buffers.
TEST(CountingBackendTest, GatedDeltaOperationsAreForwardedCountedAndChecked) {
  cpu::CpuBackend inner(1);
  CountingBackend be(inner);
  DeviceBuffer buf;
  ASSERT_EQ(be.Allocate(4096 * 4, &buf), kKernelOk);
  float* d = buf.as<float>();
  for (int i = 0; i < 4096; ++i) d[i] = 0.001f * static_cast<float>(i % 97) - 0.04f;

  GatedDeltaGatesParams gates;
  gates.a = d;
  gates.b = d + 8;
  gates.dt_bias = d + 16;
  gates.a_log = d + 20;
  gates.g = d + 100;
  gates.beta = d + 110;
  gates.n_tokens = 2;
  gates.n_heads = 4;
  ASSERT_EQ(be.GatedDeltaGates(gates), kKernelOk);
  EXPECT_LT(d[100], 0.0f) << "the inner backend wrote g";

  GatedDeltaParams pre;
  pre.q = d + 200;
  pre.k = d + 300;
  pre.v = d + 400;
  pre.g = d + 100;
  pre.beta = d + 110;
  pre.initial_state = d + 1000;
  pre.o = d + 2000;
  pre.final_state = d + 1000;  // in place, as a state-pool row
  pre.seqlen = 2;
  pre.n_k_heads = 1;
  pre.n_v_heads = 4;
  pre.dk = 4;
  pre.dv = 4;
  pre.chunk_size = 2;
  pre.chunk_states = d + 3000;
  ASSERT_EQ(be.GatedDeltaPrefill(pre), kKernelOk);

  GatedDeltaDecodeParams dec;
  dec.state = d + 1000;
  dec.q = d + 200;
  dec.k = d + 300;
  dec.v = d + 400;
  dec.g = d + 100;
  dec.beta = d + 110;
  dec.o = d + 2500;
  dec.batch = 1;
  dec.num_slots = 1;
  dec.n_k_heads = 1;
  dec.n_v_heads = 4;
  dec.dk = 4;
  dec.dv = 4;
  ASSERT_EQ(be.GatedDeltaDecode(dec), kKernelOk);
  EXPECT_EQ(be.calls("GatedDeltaGates"), 1);
  EXPECT_EQ(be.calls("GatedDeltaPrefill"), 1);
  EXPECT_EQ(be.calls("GatedDeltaDecode"), 1);
  EXPECT_EQ(be.kernel_calls(), 3);
  EXPECT_TRUE(be.foreign_pointers().empty());

  // Host pointers outside every buffer are named, op.field; a bad argument
  // still reaches the inner backend, which refuses it.
  std::vector<float> host(64);
  int32_t slot = 0;
  pre.v = host.data();
  ASSERT_EQ(be.GatedDeltaPrefill(pre), kKernelOk);
  dec.state_slots = &slot;
  gates.a_log = host.data();
  gates.n_heads = 0;
  EXPECT_EQ(be.GatedDeltaDecode(dec), kKernelOk);
  EXPECT_EQ(be.GatedDeltaGates(gates), kKernelInvalidArgument);
  EXPECT_EQ(be.foreign_pointers(),
            (std::vector<std::string>{"GatedDeltaPrefill.v", "GatedDeltaDecode.state_slots", "GatedDeltaGates.a_log"}));
  EXPECT_EQ(be.kernel_calls(), 6);
}

}  // namespace
}  // namespace hybridserve::kernels
