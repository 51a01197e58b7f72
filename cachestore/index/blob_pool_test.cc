#include "cachestore/index/blob_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/proc_status.h"
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

// ---- BlobStorage::kSharedMemory: slots of memfd slabs ----

std::shared_ptr<BlobPool> SharedPool(int64_t max_free_bytes) {
  const absl::Status prepared = ShmSlabAllocator::PrepareProcess();
  EXPECT_TRUE(prepared.ok()) << prepared;
  return BlobPool::Create(max_free_bytes, BlobStorage::kSharedMemory);
}

int64_t FileBytes(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return static_cast<int64_t>(st.st_size);
}

int64_t AllocatedBytes(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return static_cast<int64_t>(st.st_blocks) * 512;
}

TEST(BlobPoolSharedMemoryTest, BlobsOfOneStrideShareASlabAndLargeOnesHaveTheirOwn) {
  auto pool = SharedPool(0);
  ASSERT_EQ(pool->storage(), BlobStorage::kSharedMemory);
  // 64 KiB: 32 slots of a 2 MiB slab.
  std::shared_ptr<Blob> a = Get(*pool, 64 << 10);
  std::shared_ptr<Blob> b = Get(*pool, 64 << 10);
  ASSERT_GE(a->shm_fd, 0);
  EXPECT_EQ(a->shm_fd, b->shm_fd);
  EXPECT_EQ(a->shm_offset, 0u);
  EXPECT_EQ(b->shm_offset, uint64_t{64} << 10);
  EXPECT_EQ(FileBytes(a->shm_fd), int64_t{2} << 20);
  // 4097 bytes: a stride of 8 KiB, 256 slots, another slab.
  std::shared_ptr<Blob> odd = Get(*pool, 4097);
  EXPECT_NE(odd->shm_fd, a->shm_fd);
  EXPECT_EQ(FileBytes(odd->shm_fd), int64_t{2} << 20);
  // 3 MiB + 1: a slab of its own, rounded up to 4 KiB.
  const size_t big = (size_t{3} << 20) + 1;
  std::shared_ptr<Blob> c = Get(*pool, big);
  EXPECT_EQ(c->shm_offset, 0u);
  EXPECT_EQ(FileBytes(c->shm_fd), static_cast<int64_t>((size_t{3} << 20) + 4096));
  EXPECT_EQ(pool->slab_counts().slabs, 3);
  EXPECT_EQ(pool->slab_counts().slots_in_use, 4);
  // What the cachestore writes is what a reader of the descriptor reads.
  std::memset(b->data.get(), 0x5a, b->size);
  std::vector<char> read(b->size);
  ASSERT_EQ(pread(b->shm_fd, read.data(), read.size(), static_cast<off_t>(b->shm_offset)),
            static_cast<ssize_t>(read.size()));
  EXPECT_EQ(read.front(), 0x5a);
  EXPECT_EQ(read.back(), 0x5a);
}

// What a reader gets can never change a slab: the descriptor is read-only,
// and the slab's size is sealed.
TEST(BlobPoolSharedMemoryTest, TheDescriptorCannotWriteMapWritableOrResizeTheSlab) {
  auto pool = SharedPool(0);
  std::shared_ptr<Blob> blob = Get(*pool, 64 << 10);
  std::memset(blob->data.get(), 7, blob->size);
  const int fd = blob->shm_fd;
  EXPECT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_EQ(pwrite(fd, "x", 1, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_NE(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
  EXPECT_EQ(fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u) << "a writable mode lets another uid reopen it for writing";
  EXPECT_EQ(blob->data[0], 7);
}

TEST(BlobPoolSharedMemoryTest, SlotsAreRecycledByExactSize) {
  auto pool = SharedPool(1 << 20);
  uint8_t* first = nullptr;
  uint64_t offset = 0;
  {
    std::shared_ptr<Blob> b = Get(*pool, 64 << 10);
    first = b->data.get();
    offset = b->shm_offset;
    std::memset(first, 3, b->size);
  }
  EXPECT_EQ(pool->free_bytes(), 64 << 10);
  EXPECT_EQ(pool->slab_counts().slots_in_use, 1) << "a buffer the pool keeps keeps its slot";
  std::shared_ptr<Blob> other = Get(*pool, (64 << 10) - 1);  // another size: a fresh slot
  EXPECT_NE(other->data.get(), first);
  std::shared_ptr<Blob> again = Get(*pool, 64 << 10);
  EXPECT_EQ(again->data.get(), first);
  EXPECT_EQ(again->shm_offset, offset);
  EXPECT_EQ(again->data[100], 3) << "a recycled slot keeps its pages";
}

// The process's resident size follows the cache's contents in this mode too:
// a freed slot's memory goes back at once (hole punched), an empty slab is
// unmapped and closed. Margins of 8 MiB on 64 MiB, as in proc_status_test:
// the test's own allocations and the allocator's are far below them.
TEST(BlobPoolSharedMemoryTest, ResidentSizeFollowsTheContents) {
  auto pool = SharedPool(0);  // keeps nothing: every free is a real free
  constexpr size_t kBlob = size_t{64} << 10;
  constexpr int kBlobs = 1024;  // 64 MiB, 32 slabs
  constexpr int64_t kMargin = int64_t{8} << 20;
  absl::StatusOr<int64_t> before = common::ResidentBytes(getpid());
  ASSERT_TRUE(before.ok()) << before.status();
  std::vector<std::shared_ptr<Blob>> blobs;
  for (int i = 0; i < kBlobs; ++i) {
    blobs.push_back(Get(*pool, kBlob));
    std::memset(blobs.back()->data.get(), i & 0xff, kBlob);
  }
  EXPECT_EQ(pool->slab_counts().slabs, 32);
  const int fd = blobs[0]->shm_fd;
  EXPECT_EQ(AllocatedBytes(fd), int64_t{2} << 20);
  absl::StatusOr<int64_t> full = common::ResidentBytes(getpid());
  ASSERT_TRUE(full.ok());
  EXPECT_GE(*full - *before, (int64_t{64} << 20) - kMargin);
  // Every other blob goes: no slab empties, each gives back half its memory.
  for (int i = 0; i < kBlobs; i += 2) blobs[static_cast<size_t>(i)].reset();
  EXPECT_EQ(pool->slab_counts().slabs, 32);
  EXPECT_EQ(AllocatedBytes(fd), int64_t{1} << 20);
  absl::StatusOr<int64_t> half = common::ResidentBytes(getpid());
  ASSERT_TRUE(half.ok());
  EXPECT_LE(*half - *before, (int64_t{32} << 20) + kMargin);
  // The rest: every slab is gone.
  blobs.clear();
  EXPECT_EQ(pool->slab_counts().slabs, 0);
  EXPECT_EQ(pool->slab_counts().mapped_bytes, 0);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "an empty slab's descriptor is still open";
  absl::StatusOr<int64_t> empty = common::ResidentBytes(getpid());
  ASSERT_TRUE(empty.ok());
  EXPECT_LE(*empty - *before, kMargin);
}

TEST(BlobPoolSharedMemoryTest, BuffersMayOutliveThePool) {
  auto pool = SharedPool(1 << 20);
  std::weak_ptr<BlobPool> watch = pool;
  std::shared_ptr<Blob> b = Get(*pool, 64 << 10);
  for (size_t i = 0; i < b->size; ++i) b->data[i] = static_cast<uint8_t>(i * 3);
  pool.reset();
  EXPECT_TRUE(watch.expired()) << "an outstanding buffer kept its pool alive";
  for (size_t i = 0; i < b->size; ++i) ASSERT_EQ(b->data[i], static_cast<uint8_t>(i * 3)) << "byte " << i;
  EXPECT_EQ(fcntl(b->shm_fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  b.reset();
}

}  // namespace
}  // namespace hybridserve::cachestore
