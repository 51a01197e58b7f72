#include "cachestore/index/cache_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

constexpr int32_t kPageSize = 4;

PutSpec StateAt1(const Hash128& ns, int64_t size, TokenId token = 7) {
  PutSpec s;
  s.ns = ns;
  s.page_size = kPageSize;
  s.entry_class = EntryClass::kState;
  s.tokens = {token};
  s.position = 1;
  s.size_bytes = size;
  return s;
}

class CacheStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = CacheStore::Create(CacheIndexOptions{}, clock_);
    ASSERT_TRUE(s.ok());
    store_ = *std::move(s);
  }
  common::FakeClock clock_;
  std::unique_ptr<CacheStore> store_;
  Hash128 ns_ = NamespaceKey("fp", "", "", "", kPageSize);
};

// Each bad option is refused as INVALID_ARGUMENT by a message that names it
// and the value it got.
TEST_F(CacheStoreTest, RejectsNonsenseOptionsNamingTheOption) {
  struct Case {
    std::function<void(CacheIndexOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](CacheIndexOptions& o) { o.page_budget_bytes = 0; }, "page_budget_bytes must be >= 1, got 0"},
      {[](CacheIndexOptions& o) { o.state_budget_bytes = -5; }, "state_budget_bytes must be >= 1, got -5"},
      {[](CacheIndexOptions& o) { o.page_ttl = absl::ZeroDuration(); }, "page_ttl must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.state_ttl = -absl::Seconds(1); }, "state_ttl must be > 0, got -1s"},
      {[](CacheIndexOptions& o) { o.lease_ttl = absl::ZeroDuration(); }, "lease_ttl must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.put_timeout = absl::ZeroDuration(); }, "put_timeout must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.max_session_ttl = absl::ZeroDuration(); }, "max_session_ttl must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.max_tokens = 0; }, "max_tokens must be >= 1, got 0"},
      {[](CacheIndexOptions& o) { o.blob_pool_bytes = -1; }, "blob_pool_bytes must be >= 0, got -1"},
      {[](CacheIndexOptions& o) { o.pin_quota_bytes = -1; }, "pin_quota_bytes must be >= 0, got -1"},
      {[](CacheIndexOptions& o) { o.pin_budget_bytes = -2; }, "pin_budget_bytes must be >= -1, got -2"},
  };
  for (const Case& c : cases) {
    CacheIndexOptions o;
    c.set(o);
    auto store = CacheStore::Create(o, clock_);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(store.status().message(), c.message);
  }
  // The boundary values are accepted.
  CacheIndexOptions edge;
  edge.page_budget_bytes = 1;
  edge.blob_pool_bytes = 0;
  edge.pin_quota_bytes = 0;
  edge.pin_budget_bytes = -1;
  EXPECT_TRUE(CacheStore::Create(edge, clock_).ok());
}

TEST_F(CacheStoreTest, CommitVerifiesTheStoredBytes) {
  std::string data = "0123456789";
  auto put = store_->BeginPut(StateAt1(ns_, data.size()));
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE((*put)->Write(0, data.substr(0, 4)).ok());
  EXPECT_EQ((*put)->Write(5, "x").code(), absl::StatusCode::kInvalidArgument);  // gap
  ASSERT_TRUE((*put)->Write(4, data.substr(4)).ok());
  EXPECT_EQ((*put)->Write(10, "x").code(), absl::StatusCode::kInvalidArgument);  // overrun
  EXPECT_EQ((*put)->Commit(common::Checksum64(data.data(), data.size()) + 1).code(), absl::StatusCode::kDataLoss);
  put->reset();  // the failed put is aborted
  EXPECT_EQ(store_->Stats().states.reserved_bytes, 0);
  EXPECT_EQ(store_->Stats().states.entries, 0);
}

// A put by shared memory writes from the writer's file: in a fresh slab
// slot by a file-to-file copy, in a recycled buffer or on the heap by pread.
// Whichever, the entry holds the file's bytes, and a piece whose file ends
// early counts for nothing: the same piece again, whole, continues the put.
TEST(CacheStoreFileWriteTest, WritesFromAFileLandWhateverTheBufferAndAShortFileCountsNothing) {
  for (const BlobStorage storage : {BlobStorage::kHeap, BlobStorage::kSharedMemory}) {
    SCOPED_TRACE(storage == BlobStorage::kHeap ? "heap" : "shared memory");
    common::FakeClock clock;
    CacheIndexOptions o;
    o.blob_storage = storage;
    o.state_budget_bytes = 700 << 10;  // two entries of 300 KiB: the third recycles the first's buffer
    auto store = CacheStore::Create(o, clock);
    ASSERT_TRUE(store.ok()) << store.status();
    const Hash128 ns = NamespaceKey("fp", "", "", "", kPageSize);
    const size_t size = 300 << 10;
    for (TokenId token : {1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat("entry ", token));
      std::string data(size, '\0');
      for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>((i * 131 + static_cast<size_t>(token)) & 0xff);
      // The bytes lie 100 bytes into the file, which holds 10 bytes fewer
      // than the second piece asks for until it is rewritten whole.
      const int fd = memfd_create("writer", MFD_CLOEXEC);
      ASSERT_EQ(pwrite(fd, data.data(), size - 10, 100), static_cast<ssize_t>(size - 10));
      auto put = (*store)->BeginPut(StateAt1(ns, static_cast<int64_t>(size), token));
      ASSERT_TRUE(put.ok()) << put.status();
      const int64_t half = static_cast<int64_t>(size / 2);
      ASSERT_TRUE((*put)->WriteFromFile(0, half, fd, 100).ok());
      const absl::Status short_file = (*put)->WriteFromFile(half, half, fd, 100 + half);
      EXPECT_EQ(short_file.code(), absl::StatusCode::kInvalidArgument) << short_file;
      EXPECT_TRUE(absl::StrContains(short_file.message(), "end of file")) << short_file;
      EXPECT_EQ((*put)->bytes_written(), half);
      ASSERT_EQ(pwrite(fd, data.data(), size, 100), static_cast<ssize_t>(size));
      ASSERT_TRUE((*put)->WriteFromFile(half, half, fd, 100 + half).ok());
      close(fd);
      ASSERT_TRUE((*put)->Commit(common::Checksum64(data.data(), size)).ok());
      auto r = (*store)->Lookup(ns, kPageSize, {token, 9}, true);
      ASSERT_TRUE(r.ok() && r->state.has_value());
      auto h = (*store)->OpenVerified(r->lease_id, r->state->key);
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_TRUE(std::string(reinterpret_cast<const char*>(h->blob->data.get()), h->blob->size) == data);
      // Fresh slab slots for the first two, the first one's buffer recycled for the third.
      EXPECT_EQ(h->blob->fresh, storage == BlobStorage::kSharedMemory && token < 3);
      ASSERT_TRUE((*store)->Release(r->lease_id).ok());
    }
    EXPECT_TRUE((*store)->CheckInvariants().ok());
  }
}

TEST_F(CacheStoreTest, DroppedSessionAbortsAndCommittedOneServesVerifiedBytes) {
  std::string data(1000, 'a');
  {
    auto put = store_->BeginPut(StateAt1(ns_, data.size()));
    ASSERT_TRUE(put.ok());
    ASSERT_TRUE((*put)->Write(0, "aaa").ok());
  }
  EXPECT_EQ(store_->Stats().states.reserved_bytes, 0);
  auto put = store_->BeginPut(StateAt1(ns_, data.size()));
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE((*put)->Write(0, data).ok());
  ASSERT_TRUE((*put)->Commit(common::Checksum64(data.data(), data.size())).ok());
  auto r = store_->Lookup(ns_, kPageSize, {7, 8}, true);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->resume_position, 1);
  auto h = store_->OpenVerified(r->lease_id, r->state->key);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(h->blob->data.get()), h->blob->size), data);
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

TEST_F(CacheStoreTest, ConcurrentPutsAndLookupsKeepTheInvariants) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const TokenId token = t * 1000 + i;
        std::string data(64 + i, static_cast<char>(i));
        auto put = store_->BeginPut(StateAt1(ns_, data.size(), token));
        if (!put.ok()) continue;
        if ((*put)->Write(0, data).ok()) (*put)->Commit(common::Checksum64(data.data(), data.size())).IgnoreError();
        auto r = store_->Lookup(ns_, kPageSize, {token}, true);
        if (r.ok() && r->lease_id != 0) {
          EXPECT_TRUE(store_->OpenVerified(r->lease_id, r->state->key).ok());
          EXPECT_TRUE(store_->Release(r->lease_id).ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(store_->CheckInvariants().ok());
  EXPECT_EQ(store_->Stats().states.entries, 800);
  EXPECT_EQ(store_->Stats().lookup_hits, 800);
}
// Item 4: put_timeout is enforced on progress. Empty chunks are accepted but
// are no progress: a put that sends only them is reclaimed after put_timeout,
// and its next write is ABORTED.
TEST_F(CacheStoreTest, EmptyChunksDoNotKeepAStalledPutAlive) {
  const absl::Duration timeout = store_->options().put_timeout;
  auto put = store_->BeginPut(StateAt1(ns_, 64, 7));
  ASSERT_TRUE(put.ok()) << put.status();
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(timeout / 3);
    ASSERT_TRUE((*put)->Write(0, "").ok());
    store_->Expire();
  }
  EXPECT_EQ(store_->Stats().active_puts, 0) << "empty chunks kept the put alive past put_timeout";
  EXPECT_EQ((*put)->Write(0, std::string(8, 'x')).code(), absl::StatusCode::kAborted);
  // Bytes are progress: a put that keeps sending them outlives put_timeout.
  auto live = store_->BeginPut(StateAt1(ns_, 64, 8));
  ASSERT_TRUE(live.ok());
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(timeout / 3);
    ASSERT_TRUE((*live)->Write(i * 8, std::string(8, 'y')).ok()) << "chunk " << i;
    store_->Expire();
  }
  EXPECT_TRUE((*live)->Commit(common::Checksum64(std::string(64, 'y').data(), 64)).ok());
}

// Small budgets, six writers racing: each thread puts conversations (page 0,
// page 1 on it, a state at position 9 on page 1), holds a lease now and then
// (which makes others' puts meet a budget they cannot evict), abandons some
// puts half way, and puts an entry larger than the budget. After every
// operation the budgets hold (resident + reserved <= budget); every refusal
// has the code the contract gives it; at the end every committed entry is
// either resident or counted as evicted or dropped, and the resident bytes are
// exactly those of the entries still found.
TEST(CacheStoreConcurrencyTest, SmallBudgetsHoldUnderConcurrentWriters) {
  constexpr int kThreads = 6;
  constexpr int kConversations = 150;
  constexpr int64_t kPageBudget = 24 << 10;
  constexpr int64_t kStateBudget = 12 << 10;
  common::FakeClock clock;
  CacheIndexOptions options;
  options.page_budget_bytes = kPageBudget;
  options.state_budget_bytes = kStateBudget;
  options.page_ttl = absl::Hours(1);
  options.state_ttl = absl::Hours(1);
  options.blob_pool_bytes = 0;
  // Entry bytes only: with the default index overhead (768 bytes an entry)
  // the leases of six threads would hold most of these small budgets. The
  // overhead's accounting has tests of its own (cache_index_test).
  options.entry_overhead_bytes = 0;
  auto created = CacheStore::Create(options, clock);
  ASSERT_TRUE(created.ok());
  CacheStore& store = **created;
  const Hash128 ns = NamespaceKey("fp", "", "", "", kPageSize);

  // Deterministic sizes: 1 to 8 KiB for pages, 1 to 6 KiB for states.
  auto page_size_of = [](int t, int c, int i) -> int64_t { return 1024 + (t * 7919 + c * 104729 + i * 31) % 7168; };
  auto state_size_of = [](int t, int c) -> int64_t { return 1024 + (t * 6007 + c * 7727) % 5120; };
  auto tokens_of = [](int t, int c) {
    std::vector<TokenId> v(9);
    for (int k = 0; k < 9; ++k) v[k] = t * 100000 + c * 10 + k;
    return v;
  };

  struct Outcome {
    int64_t committed_pages = 0;
    int64_t committed_states = 0;
    int64_t refused = 0;
    std::vector<std::string> failures;
  };
  std::vector<Outcome> outcomes(kThreads);
  auto check_budgets = [&](Outcome& out, const char* after) {
    const IndexStats s = store.Stats();
    if (s.pages.resident_bytes + s.pages.reserved_bytes > kPageBudget ||
        s.states.resident_bytes + s.states.reserved_bytes > kStateBudget) {
      out.failures.push_back(absl::StrCat("budget exceeded after ", after, ": pages ", s.pages.resident_bytes, "+",
                                          s.pages.reserved_bytes, ", states ", s.states.resident_bytes, "+",
                                          s.states.reserved_bytes));
    }
  };
  // One put; true when committed. A refusal must carry a code the contract
  // gives it: RESOURCE_EXHAUSTED (budget held by leased or in-flight entries),
  // FAILED_PRECONDITION (the parent was evicted), ABORTED (the parent went
  // while the put was in flight).
  auto put = [&](Outcome& out, const PutSpec& spec, bool abandon) -> bool {
    std::string data(static_cast<size_t>(spec.size_bytes), static_cast<char>(spec.tokens.empty() ? 0 : spec.tokens[0]));
    auto session = store.BeginPut(spec);
    check_budgets(out, "BeginPut");
    absl::Status st = session.status();
    if (st.ok()) {
      if ((*session)->already_present()) return false;
      st = (*session)->Write(0, absl::string_view(data).substr(0, data.size() / 2));
      check_budgets(out, "Write");
      if (st.ok() && abandon) {
        session->reset();
        check_budgets(out, "abandon");
        return false;
      }
      if (st.ok()) st = (*session)->Write(data.size() / 2, absl::string_view(data).substr(data.size() / 2));
      if (st.ok()) st = (*session)->Commit(common::Checksum64(data.data(), data.size()));
      session->reset();
      check_budgets(out, "Commit");
      if (st.ok()) return true;
    }
    ++out.refused;
    if (st.code() != absl::StatusCode::kResourceExhausted && st.code() != absl::StatusCode::kFailedPrecondition &&
        st.code() != absl::StatusCode::kAborted) {
      out.failures.push_back(absl::StrCat("unexpected refusal: ", st.ToString()));
    }
    return false;
  };

  // One conversation (t = kThreads) committed and leased for the whole run:
  // with it pinning ~11 KiB of the page budget, puts meet a budget they cannot
  // evict whatever the interleaving (refusals happen even serially).
  Outcome held_outcome;
  {
    const std::vector<TokenId> tokens = tokens_of(kThreads, 0);
    const std::vector<Hash128> keys = PageKeys(ns, tokens, kPageSize);
    PutSpec page0;
    page0.ns = ns;
    page0.page_size = kPageSize;
    page0.tokens.assign(tokens.begin(), tokens.begin() + 4);
    page0.size_bytes = page_size_of(kThreads, 0, 0);
    ASSERT_TRUE(put(held_outcome, page0, false));
    PutSpec page1 = page0;
    page1.parent = keys[0];
    page1.tokens.assign(tokens.begin() + 4, tokens.begin() + 8);
    page1.size_bytes = page_size_of(kThreads, 0, 1);
    ASSERT_TRUE(put(held_outcome, page1, false));
    PutSpec state;
    state.ns = ns;
    state.page_size = kPageSize;
    state.entry_class = EntryClass::kState;
    state.parent = keys[1];
    state.tokens = {tokens[8]};
    state.position = 9;
    state.size_bytes = state_size_of(kThreads, 0);
    ASSERT_TRUE(put(held_outcome, state, false));
  }
  auto held = store.Lookup(ns, kPageSize, tokens_of(kThreads, 0), true);
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(held->resume_position, 9);

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Outcome& out = outcomes[t];
      uint64_t lease = 0;
      for (int c = 0; c < kConversations; ++c) {
        const std::vector<TokenId> tokens = tokens_of(t, c);
        const std::vector<Hash128> keys = PageKeys(ns, tokens, kPageSize);
        const bool abandon = c % 11 == 5;
        PutSpec page0;
        page0.ns = ns;
        page0.page_size = kPageSize;
        page0.tokens.assign(tokens.begin(), tokens.begin() + 4);
        page0.size_bytes = page_size_of(t, c, 0);
        if (!put(out, page0, abandon)) continue;
        ++out.committed_pages;
        PutSpec page1 = page0;
        page1.parent = keys[0];
        page1.tokens.assign(tokens.begin() + 4, tokens.begin() + 8);
        page1.size_bytes = page_size_of(t, c, 1);
        if (!put(out, page1, false)) continue;
        ++out.committed_pages;
        PutSpec state;
        state.ns = ns;
        state.page_size = kPageSize;
        state.entry_class = EntryClass::kState;
        state.parent = keys[1];
        state.tokens = {tokens[8]};
        state.position = 9;
        state.size_bytes = state_size_of(t, c);
        if (put(out, state, false)) ++out.committed_states;
        if (c % 7 == 3) {
          // Too large for any budget: refused up front, whatever else runs.
          PutSpec huge = state;
          huge.size_bytes = kStateBudget + 1;
          auto r = store.BeginPut(huge);
          if (r.status().code() != absl::StatusCode::kResourceExhausted ||
              !absl::StrContains(r.status().message(), "exceeds the state budget")) {
            out.failures.push_back(absl::StrCat("oversized put: ", r.status().ToString()));
          }
        }
        // Hold a lease on this conversation until a later one replaces it.
        if (c % 2 == 0) {
          if (lease != 0 && !store.Release(lease).ok()) out.failures.push_back("release of a live lease failed");
          lease = 0;
          auto r = store.Lookup(ns, kPageSize, tokens, true);
          check_budgets(out, "Lookup");
          if (!r.ok()) {
            out.failures.push_back(absl::StrCat("lookup: ", r.status().ToString()));
          } else {
            lease = r->lease_id;
          }
        }
      }
      if (lease != 0 && !store.Release(lease).ok()) out.failures.push_back("final release failed");
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(store.Release(held->lease_id).ok());

  int64_t committed_pages = 2, committed_states = 1, refused = 0;  // the held conversation's
  for (int t = 0; t < kThreads; ++t) {
    const std::vector<std::string>& f = outcomes[t].failures;
    for (size_t i = 0; i < std::min<size_t>(f.size(), 5); ++i) ADD_FAILURE() << "thread " << t << ": " << f[i];
    EXPECT_EQ(f.size(), 0u) << "failures of thread " << t;
    committed_pages += outcomes[t].committed_pages;
    committed_states += outcomes[t].committed_states;
    refused += outcomes[t].refused;
  }
  // More was written than the budgets hold: eviction happened (asserted on
  // the eviction counters below; how much was committed depends on how the
  // threads interleave, since refusals skip the rest of a conversation).
  EXPECT_GT(committed_pages * 1024, kPageBudget);
  EXPECT_GT(committed_states * 1024, kStateBudget);
  EXPECT_GT(refused, 0);
  ASSERT_TRUE(store.CheckInvariants().ok()) << store.CheckInvariants();

  // Every committed entry is resident, or was evicted or dropped, exactly once.
  IndexStats s = store.Stats();
  EXPECT_EQ(s.active_leases, 0);
  EXPECT_EQ(s.active_puts, 0);
  EXPECT_EQ(s.pages.reserved_bytes, 0);
  EXPECT_EQ(s.states.reserved_bytes, 0);
  EXPECT_GT(s.pages.evicted_lru, 0);
  EXPECT_GT(s.states.evicted_lru + s.states.dropped_with_pages, 0);
  EXPECT_EQ(committed_pages, s.pages.entries + s.pages.evicted_lru + s.pages.evicted_ttl + s.pages.dropped_with_pages);
  EXPECT_EQ(committed_states,
            s.states.entries + s.states.evicted_lru + s.states.evicted_ttl + s.states.dropped_with_pages);
  // The resident bytes are those of the entries a lookup still finds.
  int64_t page_bytes = 0, state_bytes = 0, pages_found = 0, states_found = 0;
  for (int t = 0; t <= kThreads; ++t) {
    for (int c = 0; c < (t == kThreads ? 1 : kConversations); ++c) {
      auto r = store.Lookup(ns, kPageSize, tokens_of(t, c), false);
      ASSERT_TRUE(r.ok());
      if (r->kv_match_tokens >= 4) page_bytes += page_size_of(t, c, 0), ++pages_found;
      if (r->kv_match_tokens >= 8) page_bytes += page_size_of(t, c, 1), ++pages_found;
      if (r->resume_position == 9) state_bytes += state_size_of(t, c), ++states_found;
    }
  }
  EXPECT_EQ(s.pages.entries, pages_found);
  EXPECT_EQ(s.pages.resident_bytes, page_bytes);
  EXPECT_EQ(s.states.entries, states_found);
  EXPECT_EQ(s.states.resident_bytes, state_bytes);
  // Past the TTLs everything goes, and the accounting returns to zero.
  clock.Advance(absl::Hours(2));
  store.Expire();
  s = store.Stats();
  EXPECT_EQ(s.pages.entries + s.states.entries, 0);
  EXPECT_EQ(s.pages.resident_bytes + s.states.resident_bytes, 0);
  EXPECT_EQ(committed_pages, s.pages.evicted_lru + s.pages.evicted_ttl + s.pages.dropped_with_pages);
  EXPECT_EQ(committed_states, s.states.evicted_lru + s.states.evicted_ttl + s.states.dropped_with_pages);
  EXPECT_TRUE(store.CheckInvariants().ok());
}

}  // namespace
}  // namespace hybridserve::cachestore
