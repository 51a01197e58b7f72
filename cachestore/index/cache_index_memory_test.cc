// CacheIndexOptions::kDefaultEntryOverheadBytes against what the index really
// allocates per entry (its node or state record, map slots, LRU and utility
// set nodes, the tail tokens), measured by malloc's own count: every byte a
// client can make the index hold must be within the budgets.

#include <malloc.h>

#include <cstdint>
#include <vector>

#include "cachestore/index/cache_index.h"
#include "cachestore/testing/cache_index_test_fixture.h"
#include "common/sanitizers.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

int64_t HeapInUse() { return static_cast<int64_t>(mallinfo2().uordblks); }

TEST(CacheIndexMemoryTest, TheEntryOverheadCoversWhatTheIndexAllocatesPerEntry) {
  if (common::kSanitized) GTEST_SKIP() << "a sanitizer's allocator is not malloc's";
  constexpr int kPages = 20000;
  const std::vector<TokenId> tokens = Tokens(kPages * kPageSize);
  const Hash128 ns = NamespaceKey("model", "", "tenant", "", kPageSize);
  const std::vector<Hash128> keys = PageKeys(ns, tokens, kPageSize);
  for (const EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kUtility}) {
    const char* name = policy == EvictionPolicy::kUtility ? "utility" : "lru";
    CacheIndexOptions o;
    o.eviction = policy;
    o.page_budget_bytes = int64_t{1} << 40;
    o.state_budget_bytes = int64_t{1} << 40;
    auto index = std::make_unique<CacheIndex>(o);
    const absl::Time now = kT0;
    auto put = [&](const PutSpec& spec) {
      absl::StatusOr<Reservation> r = index->Reserve(spec, now);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(index->Commit(r->id, 7, now).ok());
    };
    // kPages empty pages in one chain, then a state of one byte on each: what
    // an entry costs beyond its bytes.
    // Entry i of class c: page i of the chain, or a state on it with a tail
    // of kPageSize - 1 tokens.
    auto spec = [&](int i, EntryClass c) {
      PutSpec s;
      s.ns = ns;
      s.tenant = "tenant";
      s.page_size = kPageSize;
      s.entry_class = c;
      if (i > 0) s.parent = keys[i - 1];
      const int tail = c == EntryClass::kPage ? kPageSize : kPageSize - 1;
      s.tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + i * kPageSize + tail);
      s.position = c == EntryClass::kPage ? 0 : int64_t{i} * kPageSize + tail;
      s.size_bytes = c == EntryClass::kPage ? 0 : 1;
      return s;
    };
    const int64_t before_pages = HeapInUse();
    for (int i = 0; i < kPages; ++i) put(spec(i, EntryClass::kPage));
    const int64_t before_states = HeapInUse();
    for (int i = 0; i < kPages; ++i) put(spec(i, EntryClass::kState));
    const int64_t after = HeapInUse();
    const double per_page = static_cast<double>(before_states - before_pages) / kPages;
    const double per_state = static_cast<double>(after - before_states) / kPages;
    // A state is charged its tail too (4 bytes a token) and its byte.
    const double state_charge =
        static_cast<double>(CacheIndexOptions::kDefaultEntryOverheadBytes + (kPageSize - 1) * 4 + 1);
    EXPECT_LE(per_page, CacheIndexOptions::kDefaultEntryOverheadBytes) << name;
    EXPECT_LE(per_state, state_charge) << name;
    // Not a vacuous bound: the index does allocate per entry.
    EXPECT_GT(per_page, 64) << name;
    std::printf("%s: %.0f bytes of heap per page, %.0f per state (charged %lld and %.0f)\n", name, per_page, per_state,
                static_cast<long long>(CacheIndexOptions::kDefaultEntryOverheadBytes), state_charge);
    ASSERT_TRUE(index->CheckInvariants().ok());
  }
}

}  // namespace
}  // namespace hybridserve::cachestore
