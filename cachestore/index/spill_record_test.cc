#include "cachestore/index/spill_record.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

SpillRecord AState() {
  SpillRecord r;
  r.entry_class = EntryClass::kState;
  r.key = Hash128{11, 12};
  r.ns = Hash128{0x0102030405060708ULL, 0x1112131415161718ULL};
  r.tenant = "org_1";
  r.page_size = 16;
  r.parent = Hash128{21, 22};
  r.tail = {5, 0, 2147483647};
  r.state_kind = StateKind::kGridCheckpoint;
  r.position = 35;
  r.checksum = 0xfedcba9876543210ULL;
  r.size_bytes = 7700000;
  r.ttl = absl::Minutes(30);
  r.model_cost = PrefillCost{1.5e9, 2048};
  return r;
}

void ExpectSame(const SpillRecord& a, const SpillRecord& b) {
  EXPECT_EQ(a.entry_class, b.entry_class);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.ns, b.ns);
  EXPECT_EQ(a.tenant, b.tenant);
  EXPECT_EQ(a.page_size, b.page_size);
  EXPECT_EQ(a.parent, b.parent);
  EXPECT_EQ(a.tail, b.tail);
  EXPECT_EQ(a.state_kind, b.state_kind);
  EXPECT_EQ(a.position, b.position);
  EXPECT_EQ(a.checksum, b.checksum);
  EXPECT_EQ(a.size_bytes, b.size_bytes);
  EXPECT_EQ(a.ttl, b.ttl);
  EXPECT_EQ(a.model_cost, b.model_cost);
}

TEST(SpillRecordTest, AStateAndAPageRoundTrip) {
  const SpillRecord state = AState();
  const std::string bytes = EncodeSpillRecord(state);
  EXPECT_EQ(bytes.size(), 100u + 5 + 3 * 4);
  absl::StatusOr<SpillRecord> back = DecodeSpillRecord(state.key, bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(*back, state);

  SpillRecord page;
  page.entry_class = EntryClass::kPage;
  page.key = Hash128{1, 2};
  page.ns = Hash128{3, 4};
  page.page_size = 64;
  page.position = 64;  // the first page: from the root
  page.checksum = 9;
  page.size_bytes = 0;  // a model without attention layers
  back = DecodeSpillRecord(page.key, EncodeSpillRecord(page));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(*back, page);
  EXPECT_FALSE(back->parent.has_value());
  EXPECT_EQ(back->parent_or_root(), page.ns);
}

// The layout is the one spill_record.h writes down: fields at their offsets.
TEST(SpillRecordTest, TheLayoutIsTheDocumentedOne) {
  const std::string b = EncodeSpillRecord(AState());
  EXPECT_EQ(b.substr(0, 4), std::string("\x01\0\0\0", 4));
  EXPECT_EQ(b[4], 1);  // a state
  EXPECT_EQ(b[5], 0);  // grid checkpoint
  EXPECT_EQ(b[6], 1);  // hangs from a page
  EXPECT_EQ(b[7], 1);  // a model cost follows
  EXPECT_EQ(b.substr(8, 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
  EXPECT_EQ(b[40], 16);  // page size
  EXPECT_EQ(b[44], 3);   // tail tokens
  EXPECT_EQ(b[48], 35);  // position
  EXPECT_EQ(b[96], 5);   // tenant length
  EXPECT_EQ(b.substr(100, 5), "org_1");
  EXPECT_EQ(b.substr(105 + 8, 4), std::string("\xff\xff\xff\x7f", 4));  // the last tail token
}

TEST(SpillRecordTest, RefusesWhatItCannotReadNamingTheCause) {
  const SpillRecord state = AState();
  const std::string good = EncodeSpillRecord(state);
  struct Case {
    std::string bytes;
    std::string cause;
  };
  std::string version = good;
  version[0] = 2;
  std::string flag = good;
  flag[6] = 7;
  std::string page_with_tail = good;
  page_with_tail[4] = 0;
  std::string position = good;
  for (int i = 48; i < 56; ++i) position[i] = 0;
  const Case cases[] = {
      {good.substr(0, 99), "99 bytes, shorter than 100"},
      {good + "x", "118 bytes, its lengths say 117"},
      {good.substr(0, good.size() - 1), "116 bytes, its lengths say 117"},
      {version, "version 2, this build reads 1"},
      {flag, "a flag byte is neither 0 nor 1"},
      {page_with_tail, "a page with tail tokens"},
      {position, "page size, size, position or ttl out of range"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SpillRecord> r = DecodeSpillRecord(state.key, c.bytes);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << c.cause;
    EXPECT_EQ(r.status().message(), absl::StrCat("spill record of ", state.key.ToHex(), ": ", c.cause));
  }
}

}  // namespace
}  // namespace hybridserve::cachestore
