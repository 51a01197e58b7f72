#include "transport/page_block.h"

#include <cstring>
#include <memory>

#include "gtest/gtest.h"

namespace hybridserve::transport {
namespace {

TEST(PageBlockTest, PagesAreDisjointSlicesOfOneBlock) {
  PageBlock block(3, 8);
  ASSERT_EQ(block.size(), 3);
  for (int64_t i = 0; i < 3; ++i) std::memset(block.mutable_page(i).data(), 'a' + static_cast<int>(i), 8);
  EXPECT_EQ(block[0], "aaaaaaaa");
  EXPECT_EQ(block[1], "bbbbbbbb");
  EXPECT_EQ(block[2], "cccccccc");
  EXPECT_EQ(block[1].data(), block[0].data() + 8);
}

TEST(PageBlockRecyclerTest, ADestroyedBlocksMemoryServesTheNextBlockOfItsSize) {
  auto recycler = PageBlockRecycler::Create(1 << 20);
  const char* first = nullptr;
  {
    PageBlock a = recycler->Take(4, 1024);
    first = a[0].data();
  }
  EXPECT_EQ(recycler->idle_bytes(), 4096);
  PageBlock other_size = recycler->Take(2, 1024);  // another size: a fresh allocation
  EXPECT_NE(other_size[0].data(), first);
  EXPECT_EQ(recycler->idle_bytes(), 4096);
  PageBlock b = recycler->Take(1, 4096);  // the same bytes in another shape: reused
  EXPECT_EQ(b[0].data(), first);
  EXPECT_EQ(recycler->idle_bytes(), 0);
}

TEST(PageBlockRecyclerTest, IdleMemoryStaysWithinItsBound) {
  auto recycler = PageBlockRecycler::Create(10000);
  {
    PageBlock a = recycler->Take(1, 6000);
    PageBlock b = recycler->Take(1, 6000);
  }
  EXPECT_EQ(recycler->idle_bytes(), 6000);  // the second did not fit: freed
  auto none = PageBlockRecycler::Create(0);
  { PageBlock c = none->Take(2, 100); }
  EXPECT_EQ(none->idle_bytes(), 0);
}

TEST(PageBlockRecyclerTest, BlocksMayOutliveTheirRecycler) {
  auto recycler = PageBlockRecycler::Create(1 << 20);
  PageBlock a = recycler->Take(2, 64);
  std::memset(a.mutable_page(1).data(), 'z', 64);
  recycler.reset();
  EXPECT_EQ(a[1], std::string(64, 'z'));  // still readable; freed (not recycled) when `a` goes (ASan checks)
}

}  // namespace
}  // namespace hybridserve::transport
