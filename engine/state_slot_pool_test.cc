#include "engine/state_slot_pool.h"

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

// Pools live in device memory; on the CPU backend the host may read it directly.
kernels::Backend& Backend() {
  static kernels::Backend* backend = CreateBackend(BackendOptions()).value().release();
  return *backend;
}

using ::testing::HasSubstr;

StateSlotPoolOptions Options(int64_t num_slots) {
  StateSlotPoolOptions o;
  o.num_layers = 3;
  o.num_slots = num_slots;
  o.n_heads = 2;
  o.head_dim = 4;
  o.d_state = 5;
  o.conv_dim = 6;
  o.d_conv = 4;
  return o;
}

TEST(StateSlotPoolTest, AllocatesUntilExhaustedThenReusesFreedSlot) {
  auto pool = StateSlotPool::Create(Options(2), Backend());
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto a = (*pool)->Allocate();
  auto b = (*pool)->Allocate();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 0);
  EXPECT_EQ(*b, 1);
  auto c = (*pool)->Allocate();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("all 2 are in use"));
  ASSERT_TRUE((*pool)->Free(*a).ok());
  auto d = (*pool)->Allocate();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, 0);
}

TEST(StateSlotPoolTest, AllocatedSlotStartsZeroedInEveryLayer) {
  auto pool = StateSlotPool::Create(Options(2), Backend());
  ASSERT_TRUE(pool.ok());
  StateSlotPool& p = **pool;
  EXPECT_EQ(p.ssm_floats(), 40);
  EXPECT_EQ(p.conv_floats(), 18);
  auto a = p.Allocate();
  auto b = p.Allocate();
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t i = 0; i < p.ssm_floats(); ++i) p.ssm(l, *a)[i] = 1.0f + static_cast<float>(i);
    for (int64_t i = 0; i < p.conv_floats(); ++i) p.conv(l, *a)[i] = 2.0f;
  }
  EXPECT_EQ(p.ssm(2, *b)[0], 0.0f);  // rows are separate
  EXPECT_EQ(p.ssm(1, *a), p.ssm_pool(1) + *a * 40);
  ASSERT_TRUE(p.Free(*a).ok());
  auto again = p.Allocate();
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(*again, *a);
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t i = 0; i < p.ssm_floats(); ++i) ASSERT_EQ(p.ssm(l, *again)[i], 0.0f);
    for (int64_t i = 0; i < p.conv_floats(); ++i) ASSERT_EQ(p.conv(l, *again)[i], 0.0f);
  }
}

TEST(StateSlotPoolTest, FreeOfUnallocatedSlotIsAnError) {
  auto pool = StateSlotPool::Create(Options(2), Backend());
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->Free(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pool)->Free(5).code(), absl::StatusCode::kInvalidArgument);
  auto a = (*pool)->Allocate();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*pool)->Free(*a).ok());
  EXPECT_EQ((*pool)->Free(*a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pool)->num_free(), 2);
}

TEST(StateSlotPoolTest, CreateRejectsBadSizes) {
  StateSlotPoolOptions o = Options(0);
  EXPECT_EQ(StateSlotPool::Create(o, Backend()).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(1);
  o.d_state = 0;
  EXPECT_EQ(StateSlotPool::Create(o, Backend()).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(1);
  o.num_layers = 0;  // a model without Mamba2 layers
  o.d_state = 0;
  EXPECT_TRUE(StateSlotPool::Create(o, Backend()).ok());
}

}  // namespace
}  // namespace hybridserve::engine
