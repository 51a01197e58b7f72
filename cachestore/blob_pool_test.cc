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

TEST(BlobPoolTest, BuffersMayOutliveThePool) {
  auto pool = BlobPool::Create(1 << 20);
  std::shared_ptr<Blob> b = pool->Acquire(64);
  pool.reset();
  b.reset();  // freed, not returned: ASan would catch a use of the dead pool
  SUCCEED();
}

}  // namespace
}  // namespace hybridserve::cachestore
