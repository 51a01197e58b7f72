#include "cachestore/blob_pool.h"

#include <cstring>

#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

std::shared_ptr<Blob> Get(BlobPool& pool, size_t size) {
  absl::StatusOr<std::shared_ptr<Blob>> b = pool.Acquire(size);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

TEST(BlobPoolTest, ReusesBuffersOfTheSameSizeOnly) {
  auto pool = BlobPool::Create(1 << 20);
  uint8_t* first = nullptr;
  {
    std::shared_ptr<Blob> b = Get(*pool, 1000);
    first = b->data.get();
  }
  EXPECT_EQ(pool->free_bytes(), 1000);
  EXPECT_NE(Get(*pool, 999)->data.get(), first);  // another size: fresh
  std::shared_ptr<Blob> again = Get(*pool, 1000);
  EXPECT_EQ(again->data.get(), first);
  EXPECT_EQ(again->size, 1000u);
  EXPECT_EQ(pool->free_bytes(), 999);  // the 999-byte buffer came back
}

TEST(BlobPoolTest, HoldsAtMostItsBoundAndFreesTheRest) {
  auto pool = BlobPool::Create(1500);
  {
    auto a = Get(*pool, 1000);
    auto b = Get(*pool, 1000);
  }
  EXPECT_EQ(pool->free_bytes(), 1000);
  Get(*pool, 2000);  // larger than the bound: freed on return, the pool unchanged
  EXPECT_EQ(pool->free_bytes(), 1000);
}

// A mixed workload frees buffers of many sizes; sizes that stop coming must
// not hold the pool forever: past the bound the least recently freed go first.
TEST(BlobPoolTest, LeastRecentlyFreedBuffersGoFirstWhateverTheirSize) {
  auto pool = BlobPool::Create(3000);
  uint8_t* newest_700 = nullptr;
  {
    auto a = Get(*pool, 1000);
    auto b = Get(*pool, 1100);
    auto c = Get(*pool, 700);
    newest_700 = c->data.get();
    a.reset();  // freed first: 1000
    b.reset();  // 2100
    c.reset();  // 2800
  }
  EXPECT_EQ(pool->free_bytes(), 2800);
  { auto d = Get(*pool, 900); }  // 3700 > 3000: the 1000 goes, then 2700
  EXPECT_EQ(pool->free_bytes(), 2700);
  // The 1000-byte buffer was dropped: a new one is fresh; the 700 is kept.
  auto again = Get(*pool, 700);
  EXPECT_EQ(again->data.get(), newest_700);
  EXPECT_EQ(pool->free_bytes(), 2000);
}

// Buffers from the mapping path hold their bytes like the heap ones, and are
// recycled the same way.
TEST(BlobPoolTest, LargeBuffersAreMappedAndRecycled) {
  const size_t size = kBlobMapThresholdBytes * 3 + 5;
  auto pool = BlobPool::Create(int64_t{16} << 20);
  uint8_t* first = nullptr;
  {
    std::shared_ptr<Blob> b = Get(*pool, size);
    ASSERT_EQ(b->size, size);
    std::memset(b->data.get(), 0xab, size);
    EXPECT_EQ(b->data[size - 1], 0xab);
    first = b->data.get();
  }
  EXPECT_EQ(pool->free_bytes(), static_cast<int64_t>(size));
  EXPECT_EQ(Get(*pool, size)->data.get(), first);
}

// A size no machine has is refused with RESOURCE_EXHAUSTED naming it, not an
// exception (which gRPC would turn into UNKNOWN).
TEST(BlobPoolTest, ASizeTheSystemCannotProvideIsResourceExhausted) {
  auto pool = BlobPool::Create(1 << 20);
  const size_t huge = size_t{1} << 60;
  absl::StatusOr<std::shared_ptr<Blob>> b = pool->Acquire(huge);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_NE(b.status().message().find("1152921504606846976 bytes"), absl::string_view::npos) << b.status();
  EXPECT_EQ(pool->free_bytes(), 0);
}

// A buffer holds its pool weakly: the pool goes when its owner drops it, even
// while buffers are out, and a buffer outliving it keeps its bytes and is then
// freed by its deleter instead of returned (a use of the dead pool there is
// what ASan, run over this target, reports).
TEST(BlobPoolTest, BuffersMayOutliveThePool) {
  auto pool = BlobPool::Create(1 << 20);
  std::weak_ptr<BlobPool> watch = pool;
  std::shared_ptr<Blob> b = Get(*pool, 64);
  std::shared_ptr<Blob> returned = Get(*pool, 32);
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
