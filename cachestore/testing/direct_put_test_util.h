#ifndef HYBRIDSERVE_CACHESTORE_TESTING_DIRECT_PUT_TEST_UTIL_H_
#define HYBRIDSERVE_CACHESTORE_TESTING_DIRECT_PUT_TEST_UTIL_H_

// What the direct-put tests (shm_put_test.cc, bulk_put_test.cc) share: a
// prompt's chain of entries to put, reading it back, a counter, the
// per-entry answers. Test-only.

#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "cachestore/cache_client.h"
#include "cachestore/keys.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::cachestore::put_test {

inline constexpr int32_t kPageSize = 16;
inline const ClientNamespace kNs{"fingerprint", "", "", kPageSize, ""};

inline std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng() & 0xff);
  return s;
}

inline std::vector<TokenId> Tokens(int n, TokenId first) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A prompt's chain: `pages` pages of `page_bytes` each (0: a model without
// attention) and a state of `state_bytes` at the end, as PutMany entries.
// Chains of different seeds share no prefix.
struct Chain {
  std::vector<TokenId> tokens;
  std::vector<ClientPut> puts;
  std::vector<std::string> bytes;
  std::vector<PutManyEntry> entries;
};

inline Chain MakeChain(int pages, size_t page_bytes, size_t state_bytes, uint32_t seed) {
  Chain c;
  c.tokens = Tokens(pages * kPageSize + 5, static_cast<TokenId>(seed) * 1000);
  const std::vector<Hash128> keys = PageKeys(kNs.Key(), c.tokens, kPageSize);
  for (int i = 0; i < pages; ++i) {
    ClientPut put;
    if (i > 0) put.parent = keys[i - 1];
    put.tokens.assign(c.tokens.begin() + i * kPageSize, c.tokens.begin() + (i + 1) * kPageSize);
    c.puts.push_back(put);
    c.bytes.push_back(Bytes(page_bytes, seed + static_cast<uint32_t>(i)));
  }
  ClientPut state;
  state.entry_class = EntryClass::kState;
  if (pages > 0) state.parent = keys[static_cast<size_t>(pages) - 1];
  state.tokens.assign(c.tokens.begin() + pages * kPageSize, c.tokens.end());
  state.position = static_cast<int64_t>(c.tokens.size());
  c.puts.push_back(state);
  c.bytes.push_back(Bytes(state_bytes, seed + 1000));
  for (size_t i = 0; i < c.puts.size(); ++i) c.entries.push_back(PutManyEntry{&c.puts[i], c.bytes[i], std::nullopt});
  return c;
}

// Reads back every entry of `c` through `client` (a leased lookup of its
// tokens); the bytes in the chain's order.
inline std::vector<std::string> ReadBack(CacheClient& client, const Chain& c) {
  absl::StatusOr<LookupResult> lookup = client.Lookup(kNs, c.tokens, LookupMode::kLease);
  EXPECT_TRUE(lookup.ok()) << lookup.status();
  if (!lookup.ok() || !lookup->state.has_value()) return {};
  std::vector<std::string> out;
  for (const EntryInfo& page : lookup->pages) {
    absl::StatusOr<std::string> b = client.Get(lookup->lease_id, page.key);
    EXPECT_TRUE(b.ok()) << b.status();
    out.push_back(b.ok() ? *b : "");
  }
  absl::StatusOr<std::string> state = client.Get(lookup->lease_id, lookup->state->key);
  EXPECT_TRUE(state.ok()) << state.status();
  out.push_back(state.ok() ? *state : "");
  EXPECT_TRUE(client.Release(lookup->lease_id).ok());
  return out;
}

inline double Counter(prometheus::Registry& registry, absl::string_view name, absl::string_view outcome) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      if (outcome.empty()) return m.counter.value;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "outcome" && l.value == outcome) return m.counter.value;
      }
    }
  }
  return -1;
}

// A serialized v1::PutManyResponse, parsed.
inline v1::PutManyResponse Answer(const std::string& raw) {
  v1::PutManyResponse a;
  EXPECT_TRUE(a.ParseFromString(raw));
  return a;
}

// Answer i of `answers` has index i, the code of expected[i] and a message
// holding its text.
inline void ExpectAnswers(const std::vector<std::string>& answers,
                          const std::vector<std::pair<absl::StatusCode, const char*>>& expected) {
  ASSERT_EQ(answers.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const v1::PutManyResponse a = Answer(answers[i]);
    EXPECT_EQ(a.index(), i);
    EXPECT_EQ(a.code(), static_cast<int>(expected[i].first)) << i << ": " << a.message();
    EXPECT_TRUE(absl::StrContains(a.message(), expected[i].second)) << i << ": " << a.message();
  }
}

}  // namespace hybridserve::cachestore::put_test

#endif  // HYBRIDSERVE_CACHESTORE_TESTING_DIRECT_PUT_TEST_UTIL_H_
