#ifndef HYBRIDSERVE_CACHESTORE_TESTING_CACHE_INDEX_TEST_FIXTURE_H_
#define HYBRIDSERVE_CACHESTORE_TESTING_CACHE_INDEX_TEST_FIXTURE_H_

// The fixture cache_index_test.cc and cache_index_utility_test.cc share: an
// index on a fake time, specs of pages and states of one namespace, and the
// invariants checked after every test. Testonly.

#include <memory>
#include <numeric>
#include <vector>

#include "cachestore/index/cache_index.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {

inline constexpr int32_t kPageSize = 4;
inline const absl::Time kT0 = absl::FromUnixSeconds(1000);

inline std::vector<TokenId> Tokens(int n, int first = 100) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Options whose budgets count entry bytes only (no per-entry index memory), so
// that the eviction tests below can state their byte arithmetic exactly. The
// overhead's own accounting is tested by name below and by the random test.
inline CacheIndexOptions PayloadOnly() {
  CacheIndexOptions o;
  o.entry_overhead_bytes = 0;
  return o;
}

class CacheIndexTest : public ::testing::Test {
 protected:
  CacheIndexTest() : ns_(NamespaceKey("model", "", "", "", kPageSize)) {}

  void Make(CacheIndexOptions options) { index_ = std::make_unique<CacheIndex>(options); }

  PutSpec PageSpec(absl::Span<const TokenId> tokens, int page, int64_t size, Hash128 ns) {
    PutSpec s;
    s.ns = ns;
    s.page_size = kPageSize;
    s.entry_class = EntryClass::kPage;
    if (page > 0) s.parent = PageKeys(ns, tokens.subspan(0, page * kPageSize), kPageSize).back();
    s.tokens.assign(tokens.begin() + page * kPageSize, tokens.begin() + (page + 1) * kPageSize);
    s.size_bytes = size;
    return s;
  }
  PutSpec PageSpec(absl::Span<const TokenId> tokens, int page, int64_t size = 100) {
    return PageSpec(tokens, page, size, ns_);
  }

  PutSpec StateSpec(absl::Span<const TokenId> tokens, int64_t p, int64_t size = 1000,
                    StateKind kind = StateKind::kExactPrefix) {
    PutSpec s;
    s.ns = ns_;
    s.page_size = kPageSize;
    s.entry_class = EntryClass::kState;
    const int64_t n = p / kPageSize;
    if (n > 0) s.parent = PageKeys(ns_, tokens.subspan(0, n * kPageSize), kPageSize).back();
    s.tokens.assign(tokens.begin() + n * kPageSize, tokens.begin() + p);
    s.state_kind = kind;
    s.position = p;
    s.size_bytes = size;
    return s;
  }

  // Reserves and commits; returns the key.
  Hash128 PutCommitted(const PutSpec& spec) {
    auto r = index_->Reserve(spec, now_);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    if (!r->already_present) EXPECT_TRUE(index_->Commit(r->id, 7, now_).ok());
    return r->key;
  }

  void PutPages(absl::Span<const TokenId> tokens, int n_pages, int64_t size = 100) {
    for (int i = 0; i < n_pages; ++i) PutCommitted(PageSpec(tokens, i, size));
  }

  LookupResult Lookup(absl::Span<const TokenId> tokens, bool lease = false) {
    auto r = index_->Lookup(ns_, kPageSize, PageKeys(ns_, tokens, kPageSize), tokens, lease, now_);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : LookupResult{};
  }

  void TearDown() override {
    if (index_ != nullptr) EXPECT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }

  Hash128 ns_;
  absl::Time now_ = kT0;
  std::unique_ptr<CacheIndex> index_ = std::make_unique<CacheIndex>(CacheIndexOptions{});
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_TESTING_CACHE_INDEX_TEST_FIXTURE_H_
