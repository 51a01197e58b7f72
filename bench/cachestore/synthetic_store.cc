#include "bench/cachestore/synthetic_store.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace hybridserve::bench {
namespace {

using cachestore::EntryClass;
using cachestore::PutSpec;
using cachestore::StateKind;

// Filler bytes shared by every put; synthetic entries are at most 1 MiB.
constexpr int64_t kMaxFillerBytes = int64_t{1} << 20;
const std::string& Filler() {
  static const std::string* const filler = new std::string(kMaxFillerBytes, '\x5a');
  return *filler;
}

}  // namespace

PutEntryFn StorePutter(cachestore::CacheStore& store) {
  return [&store](const PutSpec& spec) -> absl::StatusOr<bool> {
    absl::StatusOr<std::unique_ptr<cachestore::PutSession>> session = store.BeginPut(spec);
    if (!session.ok()) return session.status();
    if ((*session)->already_present()) return false;
    if (spec.size_bytes > kMaxFillerBytes) {
      return absl::InvalidArgumentError(absl::StrCat("synthetic entries are at most ", kMaxFillerBytes, " bytes"));
    }
    const absl::string_view bytes(Filler().data(), static_cast<size_t>(spec.size_bytes));
    absl::Status s = (*session)->Write(0, bytes);
    if (!s.ok()) return s;
    s = (*session)->Commit(common::Checksum64(bytes.data(), bytes.size()));
    if (!s.ok()) return s;
    return true;
  };
}

PutEntryFn IndexPutter(cachestore::CacheIndex& index, absl::Time now) {
  return [&index, now](const PutSpec& spec) -> absl::StatusOr<bool> {
    absl::StatusOr<cachestore::Reservation> r = index.Reserve(spec, now);
    if (!r.ok()) return r.status();
    if (r->already_present) return false;
    std::memset(r->blob->data.get(), 0x5a, r->blob->size);
    absl::Status s = index.Commit(r->id, common::Checksum64(r->blob->data.get(), r->blob->size), now);
    if (!s.ok()) return s;
    return true;
  };
}

std::string TenantSalt(int tenant) { return absl::StrCat("tenant-", tenant); }

Hash128 TenantNamespace(int tenant, int32_t page_size) {
  return cachestore::NamespaceKey(kBenchModelFingerprint, "", "", TenantSalt(tenant), page_size);
}

absl::StatusOr<int64_t> PutConversation(const Conversation& c, const PutEntryFn& put) {
  const std::vector<Hash128> keys = cachestore::PageKeys(c.ns, c.tokens, c.page_size);
  int64_t added = 0;
  auto put_one = [&](const PutSpec& spec) -> absl::Status {
    absl::StatusOr<bool> fresh = put(spec);
    if (!fresh.ok()) return fresh.status();
    added += *fresh ? 1 : 0;
    return absl::OkStatus();
  };
  auto state_spec = [&](int64_t p, StateKind kind) {
    PutSpec s;
    s.ns = c.ns;
    s.page_size = c.page_size;
    s.entry_class = EntryClass::kState;
    const int64_t n = p / c.page_size;
    if (n > 0) s.parent = keys[n - 1];
    s.tokens.assign(c.tokens.begin() + n * c.page_size, c.tokens.begin() + p);
    s.state_kind = kind;
    s.position = p;
    s.size_bytes = c.entry_bytes;
    return s;
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    PutSpec page;
    page.ns = c.ns;
    page.page_size = c.page_size;
    page.entry_class = EntryClass::kPage;
    if (i > 0) page.parent = keys[i - 1];
    page.tokens.assign(c.tokens.begin() + i * c.page_size, c.tokens.begin() + (i + 1) * c.page_size);
    page.size_bytes = c.entry_bytes;
    absl::Status s = put_one(page);
    if (!s.ok()) return s;
    if (c.checkpoint_every_pages > 0 && (i + 1) % c.checkpoint_every_pages == 0) {
      s = put_one(state_spec(static_cast<int64_t>(i + 1) * c.page_size, StateKind::kGridCheckpoint));
      if (!s.ok()) return s;
    }
  }
  if (c.snapshot_position > 0) {
    if (c.snapshot_position > static_cast<int64_t>(c.tokens.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot at ", c.snapshot_position, " past ", c.tokens.size(), " tokens"));
    }
    absl::Status s = put_one(state_spec(c.snapshot_position, StateKind::kExactPrefix));
    if (!s.ok()) return s;
  }
  return added;
}

std::vector<TokenId> RandomTokens(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<TokenId> dist(0, kVocabSize - 1);
  std::vector<TokenId> v(static_cast<size_t>(n));
  for (TokenId& t : v) t = dist(rng);
  return v;
}

std::vector<TokenId> TenantPrompt(const SyntheticStoreOptions& options, int tenant, int64_t length, std::mt19937& rng) {
  std::mt19937 system_rng(options.seed * 7919u + static_cast<uint32_t>(tenant));
  std::vector<TokenId> tokens = RandomTokens(std::min(length, options.system_prompt_tokens), system_rng);
  const std::vector<TokenId> rest = RandomTokens(length - static_cast<int64_t>(tokens.size()), rng);
  tokens.insert(tokens.end(), rest.begin(), rest.end());
  return tokens;
}

absl::StatusOr<int64_t> FillConversations(const SyntheticStoreOptions& options, int64_t new_entries,
                                          const PutEntryFn& put) {
  std::mt19937 rng(options.seed);
  std::uniform_int_distribution<int64_t> length(options.min_conversation_tokens, options.max_conversation_tokens);
  int64_t added = 0;
  for (int64_t conversation = 0; added < new_entries; ++conversation) {
    const int tenant = static_cast<int>(conversation % options.tenants);
    const std::vector<TokenId> tokens = TenantPrompt(options, tenant, length(rng), rng);
    Conversation c;
    c.ns = TenantNamespace(tenant, options.page_size);
    c.page_size = options.page_size;
    c.tokens = tokens;
    c.checkpoint_every_pages = options.checkpoint_every_pages;
    c.snapshot_position = static_cast<int64_t>(tokens.size()) - 1;  // end of the turn
    c.entry_bytes = options.entry_bytes;
    absl::StatusOr<int64_t> n = PutConversation(c, put);
    if (!n.ok()) return n.status();
    added += *n;
  }
  return added;
}

}  // namespace hybridserve::bench
