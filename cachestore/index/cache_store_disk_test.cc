// CacheStore with a disk tier (docs/ARCHITECTURE.md section 4, "The disk
// tier"): entries evicted from a small memory come back by lookup, bit-exact;
// a corrupt file is a miss; the disk budget evicts LRU; a new store on the
// same directory serves what was spilled; the shutdown spill; the write
// queue's bound; and no disk tier gives today's results.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/index/disk_tier.h"
#include "common/clock.h"
#include "common/hash.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

constexpr int32_t kPageSize = 4;
constexpr int64_t kPageBytes = 1000;
constexpr int64_t kStateBytes = 3000;
constexpr int64_t kPages = 3;  // a conversation's pages
constexpr int64_t kTail = 2;   // its state's tail
constexpr int64_t kPosition = kPages * kPageSize + kTail;
// Files on disk: header 64, record 100 (+ 4 a tail token), bytes.
constexpr int64_t kPageFile = 64 + 100 + kPageBytes;
constexpr int64_t kStateFile = 64 + 100 + 4 * kTail + kStateBytes;
constexpr int64_t kConversationFiles = kPages * kPageFile + kStateFile;

std::string Bytes(int64_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(static_cast<size_t>(size), '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// A conversation: its tokens, and the bytes of its pages and its state.
struct Conversation {
  std::vector<TokenId> tokens;
  std::vector<std::string> pages;
  std::string state;
};

Conversation MakeConversation(uint32_t seed) {
  Conversation c;
  for (int64_t i = 0; i < kPosition; ++i) c.tokens.push_back(static_cast<TokenId>(seed * 100 + i));
  for (int64_t p = 0; p < kPages; ++p) c.pages.push_back(Bytes(kPageBytes, seed * 10 + p));
  c.state = Bytes(kStateBytes, seed * 10 + 9);
  return c;
}

class CacheStoreDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/disk_", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                        "_", getpid());
    // Memory for one conversation: three pages and one state.
    options_.page_budget_bytes = kPages * (kPageBytes + CacheIndexOptions::kDefaultEntryOverheadBytes);
    options_.state_budget_bytes = kStateBytes + CacheIndexOptions::kDefaultEntryOverheadBytes + 4 * kTail;
    disk_.directory = dir_;
    disk_.budget_bytes = 4 * kConversationFiles;
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }

  std::unique_ptr<CacheStore> Open(const DiskTierCacheOptions& disk) {
    auto s = CacheStore::Create(options_, clock_, disk);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  std::unique_ptr<CacheStore> Open() { return Open(disk_); }

  static void Put(CacheStore& store, const PutSpec& spec, const std::string& bytes) {
    auto put = store.BeginPut(spec);
    ASSERT_TRUE(put.ok()) << put.status();
    if ((*put)->already_present()) return;
    ASSERT_TRUE((*put)->Write(0, bytes).ok());
    ASSERT_TRUE((*put)->Commit(common::Checksum64(bytes.data(), bytes.size())).ok());
  }
  void PutConversation(CacheStore& store, const Conversation& c) {
    std::optional<Hash128> parent;
    std::vector<Hash128> keys = PageKeys(ns_, c.tokens, kPageSize);
    for (int64_t p = 0; p < kPages; ++p) {
      PutSpec spec;
      spec.ns = ns_;
      spec.page_size = kPageSize;
      spec.entry_class = EntryClass::kPage;
      spec.parent = parent;
      spec.tokens.assign(c.tokens.begin() + p * kPageSize, c.tokens.begin() + (p + 1) * kPageSize);
      spec.size_bytes = kPageBytes;
      Put(store, spec, c.pages[p]);
      parent = keys[p];
    }
    PutSpec spec;
    spec.ns = ns_;
    spec.page_size = kPageSize;
    spec.entry_class = EntryClass::kState;
    spec.parent = parent;
    spec.tokens.assign(c.tokens.begin() + kPages * kPageSize, c.tokens.end());
    spec.position = kPosition;
    spec.size_bytes = kStateBytes;
    Put(store, spec, c.state);
  }
  // Looks `c` up with a lease and checks every byte it serves against `c`.
  LookupResult LookupAndVerify(CacheStore& store, const Conversation& c) {
    absl::StatusOr<LookupResult> r = store.Lookup(ns_, kPageSize, c.tokens, /*lease=*/true);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    for (size_t i = 0; i < r->pages.size(); ++i) {
      auto h = store.OpenVerified(r->lease_id, r->pages[i].key);
      EXPECT_TRUE(h.ok()) << h.status();
      if (h.ok()) {
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(h->blob->data.get()), h->blob->size), c.pages[i])
            << "page " << i;
      }
    }
    if (r->state.has_value()) {
      auto h = store.OpenVerified(r->lease_id, r->state->key);
      EXPECT_TRUE(h.ok()) << h.status();
      if (h.ok()) EXPECT_EQ(std::string(reinterpret_cast<const char*>(h->blob->data.get()), h->blob->size), c.state);
    }
    if (r->lease_id != 0) EXPECT_TRUE(store.Release(r->lease_id).ok());
    return *r;
  }
  std::string FileOf(const Hash128& key) const { return absl::StrCat(dir_, "/", key.ToHex()); }
  Hash128 StateKeyOf(const Conversation& c) const {
    return StateKey(PageKeys(ns_, c.tokens, kPageSize).back(),
                    absl::MakeConstSpan(c.tokens).subspan(kPages * kPageSize));
  }

  std::string dir_;
  CacheIndexOptions options_;
  DiskTierCacheOptions disk_;
  common::FakeClock clock_;
  Hash128 ns_ = NamespaceKey("fp", "", "", "", kPageSize);
  const Conversation a_ = MakeConversation(1);
  const Conversation b_ = MakeConversation(2);
  const Conversation c_ = MakeConversation(3);
};

TEST_F(CacheStoreDiskTest, EvictedEntriesComeBackByLookupBitExactWithTheTierReported) {
  auto store = Open();
  PutConversation(*store, a_);
  PutConversation(*store, b_);  // evicts all of a_ from memory, to disk
  store->FlushDiskWrites();
  IndexStats s = store->Stats();
  EXPECT_EQ(s.pages.evicted_lru, kPages);
  EXPECT_EQ(s.disk.writes, kPages + 1);
  EXPECT_EQ(s.disk.entries, kPages + 1);
  EXPECT_EQ(s.disk.bytes, kConversationFiles);

  const LookupResult r = LookupAndVerify(*store, a_);
  EXPECT_EQ(r.resume_position, kPosition);
  EXPECT_EQ(r.kv_match_tokens, kPages * kPageSize);
  EXPECT_EQ(r.pages.size(), static_cast<size_t>(kPages));
  EXPECT_EQ(r.pages_from_disk, kPages);
  EXPECT_TRUE(r.state_from_disk);
  s = store->Stats();
  EXPECT_EQ(s.lookups, 1);  // the promotion's second look is not a second lookup
  EXPECT_EQ(s.lookup_hits, 1);
  EXPECT_EQ(s.disk.promoted_entries, kPages + 1);
  EXPECT_EQ(s.disk.promoted_bytes, kPages * kPageBytes + kStateBytes);
  EXPECT_EQ(s.disk.read_hits, kPages + 1);

  // a_ came back and pushed b_ out; b_ is on disk, a_ is not written again.
  store->FlushDiskWrites();
  const LookupResult rb = LookupAndVerify(*store, b_);
  EXPECT_EQ(rb.resume_position, kPosition);
  EXPECT_TRUE(rb.state_from_disk);
  store->FlushDiskWrites();
  EXPECT_EQ(store->Stats().disk.writes, 2 * (kPages + 1));

  // Served from memory now: no tier reported.
  const LookupResult again = LookupAndVerify(*store, b_);
  EXPECT_EQ(again.resume_position, kPosition);
  EXPECT_EQ(again.pages_from_disk, 0);
  EXPECT_FALSE(again.state_from_disk);
  EXPECT_TRUE(store->CheckInvariants().ok());
}

TEST_F(CacheStoreDiskTest, OnlyTheStateOnDiskIsReadWhenThePagesAreInMemory) {
  options_.page_budget_bytes *= 4;
  auto store = Open();
  PutConversation(*store, a_);
  PutConversation(*store, b_);  // a_'s state goes; its pages stay
  store->FlushDiskWrites();
  EXPECT_EQ(store->Stats().disk.entries, 1);
  const LookupResult r = LookupAndVerify(*store, a_);
  EXPECT_EQ(r.resume_position, kPosition);
  EXPECT_EQ(r.pages_from_disk, 0);
  EXPECT_TRUE(r.state_from_disk);
}

TEST_F(CacheStoreDiskTest, ACorruptFileIsAMissNeverWrongBytes) {
  auto store = Open();
  PutConversation(*store, a_);
  PutConversation(*store, b_);
  store->FlushDiskWrites();
  // One byte of a_'s state on disk flipped, in its payload.
  const std::string path = FileOf(StateKeyOf(a_));
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  char byte = 0;
  const off_t at = 64 + 100 + 4 * kTail + 17;
  ASSERT_EQ(pread(fd, &byte, 1, at), 1);
  byte = static_cast<char>(byte ^ 0x01);
  ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  close(fd);

  const LookupResult r = LookupAndVerify(*store, a_);
  EXPECT_EQ(r.resume_position, 0);
  EXPECT_FALSE(r.state.has_value());
  EXPECT_FALSE(r.state_from_disk);
  const IndexStats s = store->Stats();
  EXPECT_EQ(s.disk.read_failures, 1);
  EXPECT_EQ(s.lookup_hits, 0);
  EXPECT_EQ(access(path.c_str(), F_OK), -1) << "the corrupt file is removed";
  // And it stays a miss.
  EXPECT_EQ(LookupAndVerify(*store, a_).resume_position, 0);
}

TEST_F(CacheStoreDiskTest, AFileCorruptedWhileStoppedIsAMissAfterTheRestart) {
  {
    auto store = Open();
    PutConversation(*store, a_);
    PutConversation(*store, b_);
    store->FlushDiskWrites();
  }
  // One byte of a page of a_ flipped while no cachestore runs.
  const std::string path = FileOf(PageKeys(ns_, a_.tokens, kPageSize)[1]);
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, kPageFile - 1), 1);
  byte = static_cast<char>(byte ^ 0x80);
  ASSERT_EQ(pwrite(fd, &byte, 1, kPageFile - 1), 1);
  close(fd);
  auto store = Open();
  EXPECT_EQ(store->Stats().disk.entries, kPages + 1);  // a start reads headers only
  const LookupResult r = LookupAndVerify(*store, a_);
  EXPECT_EQ(r.resume_position, 0);
  EXPECT_FALSE(r.state_from_disk);
  EXPECT_EQ(store->Stats().disk.read_failures, 1);
}

TEST_F(CacheStoreDiskTest, TheDiskBudgetEvictsTheLeastRecentlyUsed) {
  disk_.budget_bytes = kConversationFiles + kPageFile - 1;  // one conversation, not one more entry
  auto store = Open();
  PutConversation(*store, a_);
  PutConversation(*store, b_);  // a_ to disk
  PutConversation(*store, c_);  // b_ to disk, a_ out of it
  store->FlushDiskWrites();
  IndexStats s = store->Stats();
  EXPECT_EQ(s.disk.entries, kPages + 1);
  EXPECT_EQ(s.disk.evictions, kPages + 1);
  EXPECT_LE(s.disk.bytes, disk_.budget_bytes);
  EXPECT_EQ(LookupAndVerify(*store, a_).resume_position, 0);
  const LookupResult rb = LookupAndVerify(*store, b_);
  EXPECT_EQ(rb.resume_position, kPosition);
  EXPECT_TRUE(rb.state_from_disk);
}

TEST_F(CacheStoreDiskTest, ANewStoreOnTheSameDirectoryServesWhatWasSpilled) {
  {
    auto store = Open();
    PutConversation(*store, a_);
    PutConversation(*store, b_);
    store->FlushDiskWrites();
  }  // b_ was in memory only: gone with the store (no shutdown spill here)
  auto store = Open();
  IndexStats s = store->Stats();
  EXPECT_EQ(s.disk.entries, kPages + 1);
  EXPECT_EQ(s.pages.entries, 0);
  const LookupResult r = LookupAndVerify(*store, a_);
  EXPECT_EQ(r.resume_position, kPosition);
  EXPECT_EQ(r.pages_from_disk, kPages);
  EXPECT_TRUE(r.state_from_disk);
  EXPECT_EQ(LookupAndVerify(*store, b_).resume_position, 0);
}

TEST_F(CacheStoreDiskTest, TheShutdownSpillWritesMemoryMostRecentFirstWithinTheDiskBudget) {
  options_.page_budget_bytes *= 4;
  options_.state_budget_bytes *= 4;
  disk_.budget_bytes = kConversationFiles + kPageFile - 1;
  {
    auto store = Open();
    PutConversation(*store, a_);
    PutConversation(*store, b_);                // the most recently used
    EXPECT_EQ(store->Stats().disk.entries, 0);  // nothing evicted
    EXPECT_EQ(store->SpillToDisk(), kPages + 1);
    EXPECT_EQ(store->Stats().disk.shutdown_spilled, kPages + 1);
  }
  auto store = Open();
  EXPECT_EQ(LookupAndVerify(*store, a_).resume_position, 0);
  const LookupResult rb = LookupAndVerify(*store, b_);
  EXPECT_EQ(rb.resume_position, kPosition);
  EXPECT_TRUE(rb.state_from_disk);
  EXPECT_EQ(rb.pages_from_disk, kPages);
}

// Written most recent first, the spill still leaves the disk's recency in
// memory's order: a restart, whose disk evicts its oldest first, keeps the
// most recently used.
TEST_F(CacheStoreDiskTest, TheShutdownSpillLeavesTheDiskInMemorysRecencyOrder) {
  options_.page_budget_bytes *= 4;
  options_.state_budget_bytes *= 4;
  {
    auto store = Open();
    PutConversation(*store, a_);
    PutConversation(*store, b_);  // the most recently used
    EXPECT_EQ(store->SpillToDisk(), 2 * (kPages + 1));
  }
  std::vector<Hash128> oldest_first;
  {
    auto tier = DiskTier::Open(dir_, disk_.budget_bytes,
                               [&](const Hash128& key, absl::string_view) { oldest_first.push_back(key); });
    ASSERT_TRUE(tier.ok()) << tier.status();
  }
  ASSERT_EQ(oldest_first.size(), 2 * (kPages + 1));
  std::vector<Hash128> a_keys = PageKeys(ns_, a_.tokens, kPageSize);
  a_keys.push_back(StateKeyOf(a_));
  for (size_t i = 0; i < oldest_first.size(); ++i) {
    const bool of_a = std::find(a_keys.begin(), a_keys.end(), oldest_first[i]) != a_keys.end();
    EXPECT_EQ(of_a, i < a_keys.size()) << "entry " << i << " from the oldest";
  }
}

// Issue 49's warm restart: after a shutdown spill, every conversation's
// turn-end state that was written is a hit on the next turn.
TEST_F(CacheStoreDiskTest, AfterARestartEveryConversationSpilledAtShutdownIsAHit) {
  constexpr int kConversations = 40;
  options_.page_budget_bytes *= kConversations;
  options_.state_budget_bytes *= kConversations;
  disk_.budget_bytes = kConversations * kConversationFiles;
  std::vector<Conversation> all;
  for (int i = 0; i < kConversations; ++i) all.push_back(MakeConversation(100 + i));
  {
    auto store = Open();
    for (const Conversation& c : all) PutConversation(*store, c);
    EXPECT_EQ(store->SpillToDisk(), kConversations * (kPages + 1));
  }
  auto store = Open();
  int hits = 0;
  for (const Conversation& c : all) {
    const LookupResult r = LookupAndVerify(*store, c);
    hits += r.resume_position == kPosition && r.state_from_disk ? 1 : 0;
  }
  EXPECT_EQ(hits, kConversations);
}

TEST_F(CacheStoreDiskTest, TheShutdownSpillStopsAtItsTimeoutAndSkipsWhatIsOnDisk) {
  disk_.shutdown_spill_timeout = absl::ZeroDuration();
  auto store = Open();
  PutConversation(*store, a_);
  EXPECT_EQ(store->SpillToDisk(), 0);  // the fake clock: the deadline is now
  EXPECT_EQ(store->Stats().disk.entries, 0);

  disk_.shutdown_spill_timeout = absl::Seconds(20);
  store.reset();
  store = Open();
  PutConversation(*store, a_);
  PutConversation(*store, b_);  // a_ to disk
  store->FlushDiskWrites();
  EXPECT_EQ(store->SpillToDisk(), kPages + 1);  // b_ only
  EXPECT_EQ(store->Stats().disk.writes, 2 * (kPages + 1));
}

TEST_F(CacheStoreDiskTest, TheWriteQueueBoundDropsAndCounts) {
  disk_.write_queue_bytes = kStateBytes - 1;  // never holds a state
  auto store = Open();
  PutConversation(*store, a_);
  PutConversation(*store, b_);
  store->FlushDiskWrites();
  IndexStats s = store->Stats();
  EXPECT_GE(s.disk.write_drops, 1);  // a_'s state at least
  EXPECT_EQ(s.disk.writes + s.disk.write_drops, kPages + 1);
  EXPECT_EQ(s.disk.entries, s.disk.writes);
  EXPECT_EQ(s.disk.queued_bytes, 0);
  const LookupResult r = LookupAndVerify(*store, a_);
  EXPECT_EQ(r.resume_position, 0);  // its state was dropped

  disk_.write_queue_bytes = 0;
  store.reset();
  std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  store = Open();
  PutConversation(*store, a_);
  PutConversation(*store, b_);
  store->FlushDiskWrites();
  s = store->Stats();
  EXPECT_EQ(s.disk.write_drops, kPages + 1);
  EXPECT_EQ(s.disk.writes, 0);
}

TEST_F(CacheStoreDiskTest, WithoutADiskTierTheResultsAreTodays) {
  auto with = Open();
  auto without = Open(DiskTierCacheOptions{});
  ASSERT_FALSE(without->has_disk_tier());
  for (CacheStore* store : {with.get(), without.get()}) PutConversation(*store, a_);
  // Nothing evicted: both answer alike.
  for (const Conversation* c : {&a_, &b_}) {
    const LookupResult x = LookupAndVerify(*with, *c);
    const LookupResult y = LookupAndVerify(*without, *c);
    EXPECT_EQ(x.resume_position, y.resume_position);
    EXPECT_EQ(x.kv_match_tokens, y.kv_match_tokens);
    EXPECT_EQ(x.pages.size(), y.pages.size());
    EXPECT_EQ(x.pages_from_disk, 0);
    EXPECT_FALSE(x.state_from_disk);
  }
  EXPECT_EQ(with->Stats().lookups, without->Stats().lookups);
  EXPECT_EQ(with->Stats().lookup_hits, without->Stats().lookup_hits);
  // Evicted: gone without one.
  PutConversation(*without, b_);
  EXPECT_EQ(LookupAndVerify(*without, a_).resume_position, 0);
  const IndexStats s = without->Stats();
  EXPECT_FALSE(s.disk.enabled);
  EXPECT_EQ(s.disk.writes, 0);
  EXPECT_EQ(s.disk.entries, 0);
}

TEST_F(CacheStoreDiskTest, RefusesBadDiskOptionsNamingTheOption) {
  DiskTierCacheOptions bad = disk_;
  bad.budget_bytes = 0;
  auto s = CacheStore::Create(options_, clock_, bad);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "disk budget_bytes must be > 0, got 0");
  bad = disk_;
  bad.write_queue_bytes = -1;
  s = CacheStore::Create(options_, clock_, bad);
  EXPECT_EQ(s.status().message(), "disk write_queue_bytes must be >= 0, got -1");
  bad = disk_;
  bad.read_parallelism = 0;
  s = CacheStore::Create(options_, clock_, bad);
  EXPECT_EQ(s.status().message(), "disk read_parallelism must be >= 1, got 0");
  bad = disk_;
  bad.shutdown_spill_timeout = -absl::Seconds(1);
  s = CacheStore::Create(options_, clock_, bad);
  EXPECT_EQ(s.status().message(), "shutdown_spill_timeout must be >= 0, got -1s");
}

}  // namespace
}  // namespace hybridserve::cachestore
