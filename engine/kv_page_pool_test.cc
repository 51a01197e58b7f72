#include "engine/kv_page_pool.h"

#include <cstdint>
#include <vector>

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

using ::testing::ElementsAre;
using ::testing::HasSubstr;

KvPagePoolOptions Options(int64_t num_pages) {
  KvPagePoolOptions o;
  o.num_layers = 2;
  o.num_pages = num_pages;
  o.page_size = 4;
  o.n_kv_heads = 2;
  o.head_dim = 3;
  return o;
}

TEST(KvPagePoolTest, AllocatesLowestIdsFirstUntilExhausted) {
  auto pool = KvPagePool::Create(Options(5), Backend());
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto a = (*pool)->Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(*a, ElementsAre(0, 1, 2));
  EXPECT_EQ((*pool)->num_free(), 2);
  auto b = (*pool)->Allocate(3);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("need 3, 2 free of 5"));
  EXPECT_EQ((*pool)->num_free(), 2);  // a failed allocation takes nothing
  auto c = (*pool)->Allocate(2);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(*c, ElementsAre(3, 4));
  EXPECT_EQ((*pool)->num_free(), 0);
  EXPECT_TRUE((*pool)->Allocate(0).ok());
}

TEST(KvPagePoolTest, FreedPagesAreReusedInTheirOrder) {
  auto pool = KvPagePool::Create(Options(4), Backend());
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Allocate(4);
  ASSERT_TRUE(a.ok());
  const std::vector<int32_t> freed = {2, 0};
  ASSERT_TRUE((*pool)->Free(freed).ok());
  EXPECT_FALSE((*pool)->IsAllocated(0));
  EXPECT_TRUE((*pool)->IsAllocated(1));
  auto b = (*pool)->Allocate(2);
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(*b, ElementsAre(2, 0));
}

TEST(KvPagePoolTest, FreeOfUnallocatedOrRepeatedPageFreesNothing) {
  auto pool = KvPagePool::Create(Options(4), Backend());
  ASSERT_TRUE(pool.ok());
  ASSERT_TRUE((*pool)->Allocate(2).ok());  // pages 0, 1
  const std::vector<int32_t> unallocated = {0, 3};
  absl::Status s = (*pool)->Free(unallocated);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("page 3 is not allocated"));
  const std::vector<int32_t> repeated = {1, 0, 1};
  s = (*pool)->Free(repeated);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("page 1 listed twice"));
  const std::vector<int32_t> out_of_range = {-1};
  EXPECT_EQ((*pool)->Free(out_of_range).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*pool)->IsAllocated(0));
  EXPECT_TRUE((*pool)->IsAllocated(1));
  EXPECT_EQ((*pool)->num_free(), 2);
}

TEST(KvPagePoolTest, LayersHaveSeparateStorageInTheKernelLayout) {
  auto pool = KvPagePool::Create(Options(3), Backend());
  ASSERT_TRUE(pool.ok());
  KvPagePool& p = **pool;
  EXPECT_EQ(p.token_floats(), 6);
  EXPECT_EQ(p.page_floats(), 24);
  const kernels::PagedKvCache c0 = p.cache(0);
  const kernels::PagedKvCache c1 = p.cache(1);
  EXPECT_EQ(c0.num_pages, 3);
  EXPECT_EQ(c0.page_size, 4);
  EXPECT_EQ(c0.n_kv_heads, 2);
  EXPECT_EQ(c0.head_dim, 3);
  EXPECT_EQ(p.k_page(0, 2), c0.k + 2 * 24);
  EXPECT_EQ(p.v_page(1, 1), c1.v + 24);
  p.k_page(0, 1)[5] = 7.0f;
  EXPECT_EQ(c1.k[24 + 5], 0.0f);
  EXPECT_EQ(p.v_page(0, 1)[5], 0.0f);
}

TEST(KvPagePoolTest, CreateRejectsBadSizes) {
  KvPagePoolOptions o = Options(0);
  EXPECT_EQ(KvPagePool::Create(o, Backend()).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(2);
  o.page_size = 0;
  EXPECT_EQ(KvPagePool::Create(o, Backend()).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(2);
  o.head_dim = 0;
  EXPECT_EQ(KvPagePool::Create(o, Backend()).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(int64_t{1} << 30);
  o.head_dim = 1 << 12;
  EXPECT_EQ(KvPagePool::Create(o, Backend()).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(2);
  o.num_layers = 0;  // a model without attention: ids only
  o.head_dim = 0;
  EXPECT_TRUE(KvPagePool::Create(o, Backend()).ok());
}

}  // namespace
}  // namespace hybridserve::engine
