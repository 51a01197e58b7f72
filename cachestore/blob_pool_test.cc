#include "cachestore/blob_pool.h"

#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

TEST(BlobPoolTest, ReusesBuffersOfTheSameSizeOnly) {
  auto pool = BlobPool::Create(1 << 20);
  uint8_t* first = nullptr;
  {
    std::shared_ptr<Blob> b = pool->Acquire(1000);
    first = b->data.get();
  }
  EXPECT_EQ(pool->free_bytes(), 1000);
  EXPECT_NE(pool->Acquire(999)->data.get(), first);  // another size: fresh
  std::shared_ptr<Blob> again = pool->Acquire(1000);
  EXPECT_EQ(again->data.get(), first);
  EXPECT_EQ(again->size, 1000u);
}

TEST(BlobPoolTest, HoldsAtMostItsBoundAndFreesTheRest) {
  auto pool = BlobPool::Create(1500);
  {
    auto a = pool->Acquire(1000);
    auto b = pool->Acquire(1000);
  }
  EXPECT_EQ(pool->free_bytes(), 1000);
}

// A buffer holds its pool weakly: the pool goes when its owner drops it, even
// while buffers are out, and a buffer outliving it keeps its bytes and is then
// freed by its deleter instead of returned (a use of the dead pool there is
// what ASan, run over this target, reports).
TEST(BlobPoolTest, BuffersMayOutliveThePool) {
  auto pool = BlobPool::Create(1 << 20);
  std::weak_ptr<BlobPool> watch = pool;
  std::shared_ptr<Blob> b = pool->Acquire(64);
  std::shared_ptr<Blob> returned = pool->Acquire(32);
  returned.reset();
  ASSERT_EQ(pool->free_bytes(), 32);  // while the pool lives, buffers return to it
  for (size_t i = 0; i < b->size; ++i) b->data[i] = static_cast<uint8_t>(i * 3);
  pool.reset();
  EXPECT_TRUE(watch.expired()) << "an outstanding buffer kept its pool alive";
  ASSERT_EQ(b->size, 64u);
  for (size_t i = 0; i < b->size; ++i) ASSERT_EQ(b->data[i], static_cast<uint8_t>(i * 3)) << "byte " << i;
  b.reset();
}

}  // namespace
}  // namespace hybridserve::cachestore
