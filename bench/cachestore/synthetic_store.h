#ifndef HYBRIDSERVE_BENCH_CACHESTORE_SYNTHETIC_STORE_H_
#define HYBRIDSERVE_BENCH_CACHESTORE_SYNTHETIC_STORE_H_

// Synthetic cachestore contents for benchmarks: conversations (chains of pages
// that share a per-tenant system prompt) with grid checkpoints every few pages
// and an exact-prefix snapshot near their end, in a few namespaces.
//
// Puts go through a PutEntryFn so the same contents can fill a CacheStore
// (what the service runs) or a bare CacheIndex (to time the index alone).

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/index/cache_index.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"

namespace hybridserve::bench {

using cachestore::Hash128;
using cachestore::TokenId;

// Stores one entry with `spec.size_bytes` bytes of filler. Returns true when
// the entry is new, false when it was already present.
using PutEntryFn = std::function<absl::StatusOr<bool>(const cachestore::PutSpec& spec)>;

// Puts through CacheStore::BeginPut / Write / Commit. `store` must outlive the result.
PutEntryFn StorePutter(cachestore::CacheStore& store);

// Puts through CacheIndex::Reserve / Commit at time `now`. `index` must outlive the result.
PutEntryFn IndexPutter(cachestore::CacheIndex& index, absl::Time now);

// The namespaces the benchmarks use: tenant `i` of one model.
inline constexpr char kBenchModelFingerprint[] = "bench-model";
std::string TenantSalt(int tenant);
Hash128 TenantNamespace(int tenant, int32_t page_size);

// One conversation's entries: every full page of `tokens`, a grid checkpoint
// (empty tail) after every `checkpoint_every_pages` pages (0: none), and an
// exact-prefix snapshot at `snapshot_position` (0: none; <= tokens.size()).
struct Conversation {
  Hash128 ns;
  int32_t page_size = 16;
  absl::Span<const TokenId> tokens;
  int checkpoint_every_pages = 4;
  int64_t snapshot_position = 0;
  int64_t entry_bytes = 64;
};

// Puts the conversation's entries in order (parents first). Returns how many were new.
absl::StatusOr<int64_t> PutConversation(const Conversation& c, const PutEntryFn& put);

struct SyntheticStoreOptions {
  int32_t page_size = 16;
  int tenants = 4;
  // Tokens every conversation of a tenant starts with.
  int64_t system_prompt_tokens = 1024;
  // Conversation lengths (system prompt included), uniform in this range.
  int64_t min_conversation_tokens = 1536;
  int64_t max_conversation_tokens = 8192;
  int checkpoint_every_pages = 4;
  int64_t entry_bytes = 64;
  uint32_t seed = 1;
};

// Token ids below this bound (a Llama-3-sized vocabulary).
inline constexpr TokenId kVocabSize = 128256;

// `n` random token ids in [0, kVocabSize).
std::vector<TokenId> RandomTokens(int64_t n, std::mt19937& rng);

// Tenant `tenant`'s system prompt followed by random tokens, `length` in all.
std::vector<TokenId> TenantPrompt(const SyntheticStoreOptions& options, int tenant, int64_t length, std::mt19937& rng);

// Puts random conversations, round-robin over the tenants, until at least
// `new_entries` new entries are stored. Returns how many were stored.
absl::StatusOr<int64_t> FillConversations(const SyntheticStoreOptions& options, int64_t new_entries,
                                          const PutEntryFn& put);

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_CACHESTORE_SYNTHETIC_STORE_H_
