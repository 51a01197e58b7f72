#include "cachestore/index/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

Hash128 Key(uint64_t i) { return Hash128{i * 0x9e3779b97f4a7c15ULL + 1, i}; }

// A fresh directory under TEST_TMPDIR, named for the running test.
std::string FreshDir(absl::string_view suffix = "") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", info->test_suite_name(), ".", info->name(), suffix);
  std::string cmd = absl::StrCat("rm -rf '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

std::set<std::string> ListDir(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.insert(name);
  }
  closedir(d);
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string PathOf(const DiskTier& tier, const Hash128& key) {
  return absl::StrCat(tier.directory(), "/", key.ToHex());
}

std::unique_ptr<DiskTier> OpenOrDie(const std::string& dir, uint64_t budget) {
  absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(dir, budget);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? std::move(*tier) : nullptr;
}

// The set of keys (by index in [0, n)) the tier holds.
std::set<uint64_t> Held(const DiskTier& tier, uint64_t n) {
  std::set<uint64_t> held;
  for (uint64_t i = 0; i < n; ++i) {
    if (tier.Contains(Key(i))) held.insert(i);
  }
  return held;
}

TEST(DiskTierTest, RoundTrip) {
  const std::string dir = FreshDir();
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir + "/nested/deeper", 1 << 20);
  ASSERT_NE(tier, nullptr);
  std::string payload(5000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(tier->Put(Key(1), "meta-one", payload).ok());
  ASSERT_TRUE(tier->Put(Key(2), "", "").ok());

  absl::StatusOr<DiskTierEntry> one = tier->Get(Key(1));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->metadata, "meta-one");
  EXPECT_EQ(one->payload, payload);
  absl::StatusOr<DiskTierEntry> two = tier->Get(Key(2));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->metadata, "");
  EXPECT_EQ(two->payload, "");
  EXPECT_EQ(tier->Get(Key(3)).status().code(), absl::StatusCode::kNotFound);

  EXPECT_TRUE(tier->Contains(Key(1)));
  EXPECT_FALSE(tier->Contains(Key(3)));
  const DiskTierStats stats = tier->Stats();
  EXPECT_EQ(stats.entries, 2);
  EXPECT_EQ(stats.bytes, 64 + 8 + 5000 + 64);
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.corrupt_files, 0);
  // The entry files, the lock, and no temp file left behind.
  EXPECT_EQ(ListDir(dir + "/nested/deeper"), (std::set<std::string>{"LOCK", Key(1).ToHex(), Key(2).ToHex()}));
  EXPECT_EQ(ReadFile(PathOf(*tier, Key(1))).size(), 64u + 8 + 5000);

  EXPECT_TRUE(tier->Erase(Key(1)));
  EXPECT_FALSE(tier->Erase(Key(1)));
  EXPECT_EQ(tier->Get(Key(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tier->Stats().bytes, 64);
  EXPECT_EQ(ListDir(dir + "/nested/deeper"), (std::set<std::string>{"LOCK", Key(2).ToHex()}));
}

TEST(DiskTierTest, PutReplacesTheEntry) {
  const std::string dir = FreshDir();
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 1 << 20);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(tier->Put(Key(1), "old", std::string(1000, 'o')).ok());
  ASSERT_TRUE(tier->Put(Key(1), "new!", std::string(10, 'n')).ok());
  absl::StatusOr<DiskTierEntry> got = tier->Get(Key(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->metadata, "new!");
  EXPECT_EQ(got->payload, std::string(10, 'n'));
  EXPECT_EQ(tier->Stats().entries, 1);
  EXPECT_EQ(tier->Stats().bytes, 64 + 4 + 10);
  EXPECT_EQ(tier->Stats().evictions, 0);
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", Key(1).ToHex()}));
}

// Each entry below is a 100-byte file (64 header + 6 metadata + 30 payload).
constexpr uint64_t kEntryBytes = 100;
absl::Status PutSmall(DiskTier& tier, uint64_t i) {
  return tier.Put(Key(i), absl::StrCat("meta", i % 10, i / 10 % 10), std::string(30, static_cast<char>('a' + i)));
}

TEST(DiskTierTest, EvictsLeastRecentlyUsedFirst) {
  const std::string dir = FreshDir();
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 3 * kEntryBytes);
  ASSERT_NE(tier, nullptr);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(PutSmall(*tier, i).ok());
  EXPECT_EQ(tier->Stats().bytes, 300);
  ASSERT_TRUE(tier->Get(Key(0)).ok());  // 0 is now the most recent: 1 is the oldest.
  ASSERT_TRUE(PutSmall(*tier, 3).ok());
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{0, 2, 3}));
  ASSERT_TRUE(PutSmall(*tier, 2).ok());  // A re-put is a use: 0 is the oldest now.
  ASSERT_TRUE(PutSmall(*tier, 4).ok());
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{2, 3, 4}));
  // Contains is not a use: 3 stays the oldest.
  EXPECT_TRUE(tier->Contains(Key(3)));
  ASSERT_TRUE(PutSmall(*tier, 5).ok());
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{2, 4, 5}));
  const DiskTierStats stats = tier->Stats();
  EXPECT_EQ(stats.evictions, 3);
  EXPECT_EQ(stats.entries, 3);
  EXPECT_EQ(stats.bytes, 300);
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", Key(2).ToHex(), Key(4).ToHex(), Key(5).ToHex()}));
  // A bigger entry makes room for itself: two of 100 go for one of 164.
  ASSERT_TRUE(tier->Put(Key(6), "", std::string(100, 'x')).ok());
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{5, 6}));
  EXPECT_EQ(tier->Stats().bytes, 264);
}

TEST(DiskTierTest, TouchIsAUseThatARestartKeeps) {
  const std::string dir = FreshDir();
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 3 * kEntryBytes);
    ASSERT_NE(tier, nullptr);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(PutSmall(*tier, i).ok());
    EXPECT_TRUE(tier->Touch(Key(0)));  // 0 is now the most recent: 1 is the oldest.
    EXPECT_FALSE(tier->Touch(Key(7)));
    EXPECT_EQ(tier->Stats().hits, 0);  // not a read
  }
  // The stamps order the reopened tier: 1, 2, 0 from the oldest.
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 3 * kEntryBytes);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(PutSmall(*tier, 3).ok());
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{0, 2, 3}));
  ASSERT_TRUE(PutSmall(*tier, 4).ok());
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{0, 3, 4}));
}

TEST(DiskTierTest, PutReportsTheKeysItEvicted) {
  const std::string dir = FreshDir();
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 3 * kEntryBytes);
  ASSERT_NE(tier, nullptr);
  std::vector<Hash128> evicted;
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_TRUE(tier->Put(Key(i), absl::StrCat("meta", i, 0), std::string(30, 'a'), &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  // A replaced key is not an eviction.
  ASSERT_TRUE(tier->Put(Key(0), "meta00", std::string(30, 'b'), &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  // Two of 100 go for one of 164, oldest first: 1 then 2.
  ASSERT_TRUE(tier->Put(Key(6), "", std::string(100, 'x'), &evicted).ok());
  EXPECT_EQ(evicted, (std::vector<Hash128>{Key(1), Key(2)}));
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{0, 6}));
}

TEST(DiskTierTest, OpenVisitsTheSurvivingEntriesOldestFirstWithTheirMetadata) {
  const std::string dir = FreshDir();
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 10 * kEntryBytes);
    ASSERT_NE(tier, nullptr);
    for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(PutSmall(*tier, i).ok());
    ASSERT_TRUE(tier->Get(Key(0)).ok());  // oldest first: 1, 2, 3, 0
  }
  std::vector<std::pair<Hash128, std::string>> visited;
  absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(
      dir, 3 * kEntryBytes,
      [&](const Hash128& key, absl::string_view metadata) { visited.emplace_back(key, std::string(metadata)); });
  ASSERT_TRUE(tier.ok()) << tier.status();
  // 1 went to fit the budget; the others are visited oldest first.
  EXPECT_EQ(visited,
            (std::vector<std::pair<Hash128, std::string>>{{Key(2), "meta20"}, {Key(3), "meta30"}, {Key(0), "meta00"}}));
}

// A start reads headers, not bodies: a body that went bad is found by its
// first Get, which removes it and misses.
TEST(DiskTierTest, OpenChecksHeadersAndTheFirstGetTheBody) {
  const std::string dir = FreshDir();
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 1 << 20);
    ASSERT_NE(tier, nullptr);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(PutSmall(*tier, i).ok());
  }
  const std::string p1 = absl::StrCat(dir, "/", Key(1).ToHex());
  std::string bytes = ReadFile(p1);
  bytes[kEntryBytes - 1] ^= 0x20;  // the payload's last byte
  WriteFile(p1, bytes);
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 1 << 20);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{0, 1, 2}));
  EXPECT_EQ(tier->Stats().corrupt_files, 0);
  EXPECT_EQ(tier->Get(Key(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{0, 2}));
  EXPECT_EQ(tier->Stats().corrupt_files, 1);
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", Key(0).ToHex(), Key(2).ToHex()}));
  EXPECT_TRUE(tier->Get(Key(0)).ok());
}

TEST(DiskTierTest, TheDirectoryAndItsFilesAreThisUsersOnly) {
  const std::string dir = FreshDir("/nested/tier");
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 10 * kEntryBytes);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(PutSmall(*tier, 1).ok());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(PathOf(*tier, Key(1)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(absl::StrCat(dir, "/LOCK").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(DiskTierTest, RefusesAnEntryLargerThanTheBudget) {
  const std::string dir = FreshDir();
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 100);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(tier->Put(Key(1), "", std::string(36, 'a')).ok());  // 100 bytes: exactly the budget.
  const absl::Status too_big = tier->Put(Key(2), "m", std::string(36, 'b'));
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted) << too_big;
  EXPECT_NE(too_big.message().find("byte_budget 100"), absl::string_view::npos) << too_big;
  // Refused before anything was written or evicted.
  EXPECT_TRUE(tier->Contains(Key(1)));
  EXPECT_EQ(tier->Stats().evictions, 0);
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", Key(1).ToHex()}));
}

TEST(DiskTierTest, WarmRestartKeepsEntriesBytesAndRecency) {
  const std::string dir = FreshDir();
  std::string big(100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 17);
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 3 * kEntryBytes + 100067);
    ASSERT_NE(tier, nullptr);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(PutSmall(*tier, i).ok());
    ASSERT_TRUE(tier->Put(Key(9), "big", big).ok());
    ASSERT_TRUE(tier->Get(Key(0)).ok());  // Recency now, oldest first: 1, 2, 9, 0.
  }
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 3 * kEntryBytes + 100067);
    ASSERT_NE(tier, nullptr);
    const DiskTierStats stats = tier->Stats();
    EXPECT_EQ(stats.entries, 4);
    EXPECT_EQ(stats.bytes, 3 * 100 + 64 + 3 + 100000);
    EXPECT_EQ(stats.evictions, 0);
    EXPECT_EQ(stats.corrupt_files, 0);
    absl::StatusOr<DiskTierEntry> got = tier->Get(Key(9));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->metadata, "big");
    EXPECT_EQ(got->payload, big);
    for (uint64_t i = 0; i < 3; ++i) {
      got = tier->Get(Key(i));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->metadata, absl::StrCat("meta", i, 0));
      EXPECT_EQ(got->payload, std::string(30, static_cast<char>('a' + i)));
    }
  }
  // The order survives too: oldest first 9, 0, 1, 2 after the gets above.
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 2 * kEntryBytes);
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{1, 2}));
    EXPECT_EQ(tier->Stats().evictions, 2);
    EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", Key(1).ToHex(), Key(2).ToHex()}));
  }
}

TEST(DiskTierTest, OpenRemovesTornGarbageTempAndUnknownVersionFiles) {
  const std::string dir = FreshDir();
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 1 << 20);
    ASSERT_NE(tier, nullptr);
    for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(PutSmall(*tier, i).ok());
  }
  const std::string p0 = absl::StrCat(dir, "/", Key(0).ToHex());
  const std::string p1 = absl::StrCat(dir, "/", Key(1).ToHex());
  const std::string p2 = absl::StrCat(dir, "/", Key(2).ToHex());
  const std::string p3 = absl::StrCat(dir, "/", Key(3).ToHex());
  // Torn: one byte short.
  ASSERT_EQ(truncate(p0.c_str(), kEntryBytes - 1), 0);
  // Garbage of the right length.
  WriteFile(p1, std::string(kEntryBytes, 'g'));
  // A temp file a crash left: its key's committed entry (2) stays good.
  const std::string temp = absl::StrCat(p2, ".tmp-12345-0");
  WriteFile(temp, ReadFile(p2).substr(0, 70));
  // A later format version, header checksum valid for it.
  std::string v2 = ReadFile(p3);
  v2[8] = 2;
  const uint64_t sum = common::Checksum64(v2.data(), 56);
  for (int i = 0; i < 8; ++i) v2[56 + i] = static_cast<char>(sum >> (8 * i));
  WriteFile(p3, v2);
  // A file of another name is left alone.
  WriteFile(dir + "/README", "not an entry");

  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 1 << 20);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(Held(*tier, 10), (std::set<uint64_t>{2, 4}));
  const DiskTierStats stats = tier->Stats();
  EXPECT_EQ(stats.corrupt_files, 3);
  EXPECT_EQ(stats.temp_files_removed, 1);
  EXPECT_EQ(stats.ignored_files, 1);
  EXPECT_EQ(stats.bytes, 200);
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", "README", Key(2).ToHex(), Key(4).ToHex()}));
  for (uint64_t i : {0, 1, 3}) EXPECT_EQ(tier->Get(Key(i)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(tier->Get(Key(2)).ok());
}

// Total bytes of the files in `dir`.
uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const std::string& name : ListDir(dir)) {
    struct stat st;
    if (stat(absl::StrCat(dir, "/", name).c_str(), &st) == 0) total += st.st_size;
  }
  return total;
}

// A process killed while it replaces an entry: the next Open finds the old
// entry or the new one, whole, never a torn file (a miss).
TEST(DiskTierTest, AKillDuringAReplacingPutLeavesTheOldOrTheNewEntry) {
  const std::string dir = FreshDir();
  {
    std::unique_ptr<DiskTier> tier = OpenOrDie(dir, uint64_t{1} << 30);
    ASSERT_NE(tier, nullptr);
    ASSERT_TRUE(tier->Put(Key(0), "old", std::string(1000, 'o')).ok());
  }
  const uint64_t before = DirBytes(dir);
  constexpr size_t kBig = size_t{256} << 20;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(dir, uint64_t{1} << 30);
    if (!tier.ok()) _exit(2);
    const std::string big(kBig, 'n');
    _exit((*tier)->Put(Key(0), "new", big).ok() ? 0 : 3);
  }
  // Kill it once some megabytes of the new entry are on disk (or it is done).
  int wstatus = 0;
  bool exited = false;
  while (DirBytes(dir) < before + (uint64_t{8} << 20)) {
    if (waitpid(child, &wstatus, WNOHANG) == child) {
      exited = true;
      break;
    }
  }
  if (exited) {
    // It finished first: it must have succeeded (the new entry is checked below).
    ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  } else {
    kill(child, SIGKILL);
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  }
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, uint64_t{1} << 30);
  ASSERT_NE(tier, nullptr);
  absl::StatusOr<DiskTierEntry> got = tier->Get(Key(0));
  ASSERT_TRUE(got.ok()) << got.status() << " (child killed: " << !exited << ")";
  if (got->metadata == "old") {
    EXPECT_EQ(got->payload, std::string(1000, 'o'));
  } else {
    EXPECT_EQ(got->metadata, "new");
    EXPECT_EQ(got->payload.size(), kBig);
  }
  EXPECT_EQ(tier->Stats().corrupt_files, 0);
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", Key(0).ToHex()}));
}

// Damages key 0's committed file with `damage`; the next Get is a miss that
// removes the file, and a later Put of the key works again.
void ExpectGetRemovesDamagedFile(const std::function<void(const std::string&)>& damage) {
  const std::string dir = FreshDir();
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 1 << 20);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(PutSmall(*tier, 0).ok());
  ASSERT_TRUE(PutSmall(*tier, 1).ok());
  damage(PathOf(*tier, Key(0)));
  const absl::Status miss = tier->Get(Key(0)).status();
  EXPECT_EQ(miss.code(), absl::StatusCode::kNotFound) << miss;
  EXPECT_NE(miss.message().find("failed verification"), absl::string_view::npos) << miss;
  EXPECT_FALSE(tier->Contains(Key(0)));
  DiskTierStats stats = tier->Stats();
  EXPECT_EQ(stats.corrupt_files, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.hits, 0);
  EXPECT_EQ(stats.entries, 1);
  EXPECT_EQ(stats.bytes, 100);
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"LOCK", Key(1).ToHex()}));
  EXPECT_TRUE(tier->Get(Key(1)).ok());
  ASSERT_TRUE(PutSmall(*tier, 0).ok());
  EXPECT_TRUE(tier->Get(Key(0)).ok());
}

void FlipBit(const std::string& path, size_t offset, int bit) {
  std::string bytes = ReadFile(path);
  ASSERT_LT(offset, bytes.size());
  bytes[offset] = static_cast<char>(bytes[offset] ^ (1 << bit));
  WriteFile(path, bytes);
}

TEST(DiskTierTest, GetOfATruncatedFileIsAMissAndRemovesIt) {
  ExpectGetRemovesDamagedFile([](const std::string& path) { ASSERT_EQ(truncate(path.c_str(), kEntryBytes - 1), 0); });
}

TEST(DiskTierTest, GetOfAnExtendedFileIsAMissAndRemovesIt) {
  ExpectGetRemovesDamagedFile([](const std::string& path) { WriteFile(path, ReadFile(path) + "x"); });
}

TEST(DiskTierTest, GetOfGarbageIsAMissAndRemovesIt) {
  ExpectGetRemovesDamagedFile([](const std::string& path) { WriteFile(path, std::string(kEntryBytes, 'g')); });
}

TEST(DiskTierTest, BitFlipInPayloadIsDetected) {
  ExpectGetRemovesDamagedFile([](const std::string& path) { FlipBit(path, kEntryBytes - 1, 3); });
}

TEST(DiskTierTest, BitFlipInMetadataIsDetected) {
  ExpectGetRemovesDamagedFile([](const std::string& path) { FlipBit(path, 64, 0); });
}

TEST(DiskTierTest, BitFlipInHeaderLengthIsDetected) {
  // Metadata length 6 -> 7 and payload intact: the lengths still sum wrong,
  // and the header checksum catches it first.
  ExpectGetRemovesDamagedFile([](const std::string& path) { FlipBit(path, 32, 0); });
}

TEST(DiskTierTest, BitFlipInHeaderReservedFieldIsDetected) {
  // Only the header checksum covers the reserved bytes.
  ExpectGetRemovesDamagedFile([](const std::string& path) { FlipBit(path, 12, 5); });
}

TEST(DiskTierTest, OpenRefusesBadArguments) {
  const std::string dir = FreshDir();
  EXPECT_EQ(DiskTier::Open("", 100).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status zero = DiskTier::Open(dir, 0).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("byte_budget"), absl::string_view::npos) << zero;

  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string file = dir + "/plain_file";
  WriteFile(file, "x");
  absl::Status not_dir = DiskTier::Open(file, 100).status();
  EXPECT_EQ(not_dir.code(), absl::StatusCode::kInvalidArgument) << not_dir;
  EXPECT_NE(not_dir.message().find("is not a directory"), absl::string_view::npos) << not_dir;
  absl::Status under_file = DiskTier::Open(file + "/sub", 100).status();
  EXPECT_EQ(under_file.code(), absl::StatusCode::kFailedPrecondition) << under_file;

  // One DiskTier a directory.
  std::unique_ptr<DiskTier> first = OpenOrDie(dir + "/tier", 100);
  ASSERT_NE(first, nullptr);
  absl::Status second = DiskTier::Open(dir + "/tier", 100).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_NE(second.message().find("in use by another DiskTier"), absl::string_view::npos) << second;
  first.reset();
  EXPECT_TRUE(DiskTier::Open(dir + "/tier", 100).ok());

  if (geteuid() != 0) {  // Root writes anywhere.
    const std::string read_only = dir + "/read_only";
    ASSERT_EQ(mkdir(read_only.c_str(), 0555), 0);
    absl::Status denied = DiskTier::Open(read_only, 100).status();
    EXPECT_EQ(denied.code(), absl::StatusCode::kFailedPrecondition) << denied;
    EXPECT_NE(denied.message().find("not writable"), absl::string_view::npos) << denied;
  }
}

// Writers and readers of distinct and shared keys at once. Every entry's
// metadata names its writer and version and its payload is derived from them,
// so a read that mixes two writes, or a torn one, shows. The budget holds
// every shared key, so a shared key once written is always a hit.
TEST(DiskTierTest, ConcurrentPutsAndGetsNeverSeeATornEntry) {
  const std::string dir = FreshDir();
  constexpr int kThreads = 4;
  constexpr int kRounds = 150;
  constexpr uint64_t kShared = 3;
  auto payload_of = [](const std::string& metadata) {
    std::string payload(2000 + metadata.size() * 50, '\0');
    const uint64_t seed = common::Checksum64(metadata.data(), metadata.size());
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>((seed >> (i % 57)) + i);
    return payload;
  };
  // Shared keys: at most ~2.6 KB each; distinct keys cycle through a budget
  // that also has to evict them.
  std::unique_ptr<DiskTier> tier = OpenOrDie(dir, 64 * 1024);
  ASSERT_NE(tier, nullptr);
  for (uint64_t s = 0; s < kShared; ++s) {
    const std::string metadata = absl::StrCat("init/", s);
    ASSERT_TRUE(tier->Put(Key(1000 + s), metadata, payload_of(metadata)).ok());
  }
  std::atomic<int> bad{0};
  std::atomic<int> shared_misses{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t shared = 1000 + (r + t) % kShared;
        const uint64_t own = 10 * t + (r / 2) % 10;
        const std::string metadata = absl::StrCat(t, "/", r);
        if (!tier->Put(Key(r % 2 == 0 ? shared : own), metadata, payload_of(metadata)).ok()) ++bad;
        for (uint64_t key : {shared, own}) {
          absl::StatusOr<DiskTierEntry> got = tier->Get(Key(key));
          if (!got.ok()) {
            if (key == shared) ++shared_misses;
            continue;
          }
          if (got->payload != payload_of(got->metadata)) ++bad;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(shared_misses.load(), 0);
  const DiskTierStats stats = tier->Stats();
  EXPECT_EQ(stats.corrupt_files, 0);
  EXPECT_LE(stats.bytes, 64 * 1024);
  EXPECT_GT(stats.evictions, 0);
  // Index and directory agree, and no temp file is left.
  std::set<std::string> names = ListDir(dir);
  names.erase("LOCK");
  EXPECT_EQ(static_cast<int64_t>(names.size()), stats.entries);
  for (const std::string& name : names) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
  // And a reopen finds exactly what was indexed.
  const int64_t bytes = stats.bytes;
  tier.reset();
  tier = OpenOrDie(dir, 64 * 1024);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->Stats().bytes, bytes);
  EXPECT_EQ(tier->Stats().corrupt_files, 0);
}

}  // namespace
}  // namespace hybridserve::cachestore
