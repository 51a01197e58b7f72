// CacheIndexOptions::kDefaultEntryOverheadBytes against what the index really
// allocates per entry (its node or state record, map slots, LRU and utility
// set nodes, the tail tokens), measured by malloc's own count: every byte a
// client can make the index hold must be within the budgets.

#include <malloc.h>

#include <cstdint>
#include <vector>

#include "cachestore/cache_index.h"
#include "cachestore/cache_index_test_fixture.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

int64_t HeapInUse() { return static_cast<int64_t>(mallinfo2().uordblks); }

TEST(CacheIndexMemoryTest, TheEntryOverheadCoversWhatTheIndexAllocatesPerEntry) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's allocator is not malloc's";
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
    // kPages empty pages in one chain, then a state of one byte on each with a
    // tail of kPageSize - 1 tokens: what an entry costs beyond its bytes.
    const int64_t before_pages = HeapInUse();
    for (int i = 0; i < kPages; ++i) {
      PutSpec s;
      s.ns = ns;
      s.tenant = "tenant";
      s.page_size = kPageSize;
      s.entry_class = EntryClass::kPage;
      if (i > 0) s.parent = keys[i - 1];
      s.tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + (i + 1) * kPageSize);
      s.size_bytes = 0;
      put(s);
    }
    const int64_t before_states = HeapInUse();
    for (int i = 0; i < kPages; ++i) {
      PutSpec s;
      s.ns = ns;
      s.tenant = "tenant";
      s.page_size = kPageSize;
      s.entry_class = EntryClass::kState;
      if (i > 0) s.parent = keys[i - 1];
      s.tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + (i + 1) * kPageSize - 1);
      s.position = int64_t{i} * kPageSize + kPageSize - 1;
      s.size_bytes = 1;
      put(s);
    }
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
