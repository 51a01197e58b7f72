#include "cachestore/keys.h"

#include "absl/strings/str_cat.h"

namespace hybridserve::cachestore {
namespace {

void AppendPart(std::string* out, absl::string_view part) {
  uint64_t n = part.size();
  out->append(reinterpret_cast<const char*>(&n), sizeof(n));
  out->append(part.data(), part.size());
}

}  // namespace

Hash128 NamespaceKey(absl::string_view model_fingerprint, absl::string_view adapter, absl::string_view tenant,
                     absl::string_view cache_salt, int32_t page_size) {
  std::string buf;
  AppendPart(&buf, "hybridserve/ns/v3");
  AppendPart(&buf, model_fingerprint);
  AppendPart(&buf, adapter);
  AppendPart(&buf, tenant);
  AppendPart(&buf, cache_salt);
  buf.append(reinterpret_cast<const char*>(&page_size), sizeof(page_size));
  return common::HashBytes(buf);
}

std::string KeyVersionProblem(uint32_t key_version) {
  if (key_version == 0 || key_version == kKeyVersion) return "";
  if (key_version == 1) {
    return absl::StrCat(
        "namespace key_version 1 (tokens chained page by page) is no longer served: this cachestore "
        "derives keys with version ",
        kKeyVersion, " (page contents hashed, then chained; see proto/cachestore.proto)");
  }
  if (key_version == 2) {
    return absl::StrCat(
        "namespace key_version 2 (no tenant in the namespace) is no longer served: this cachestore derives keys "
        "with version ",
        kKeyVersion, " (the tenant a field of the namespace; see proto/cachestore.proto): run workers of this release");
  }
  return absl::StrCat("namespace key_version ", key_version, " is unknown: this cachestore derives keys with version ",
                      kKeyVersion);
}

absl::Status CheckModelCost(const std::optional<PrefillCost>& cost) {
  if (!cost.has_value()) return absl::OkStatus();
  if (const std::string problem = PrefillCostProblem(*cost); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("namespace.model_cost.", problem));
  }
  return absl::OkStatus();
}

absl::StatusOr<Hash128> ValidatedNamespaceKey(absl::string_view model_fingerprint, absl::string_view adapter,
                                              absl::string_view tenant, absl::string_view cache_salt, int64_t page_size,
                                              uint32_t key_version) {
  if (const std::string problem = KeyVersionProblem(key_version); !problem.empty()) {
    return absl::InvalidArgumentError(problem);
  }
  if (model_fingerprint.empty()) return absl::InvalidArgumentError("namespace model_fingerprint is empty");
  if (tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace tenant has ", tenant.size(), " bytes, at most ", kMaxTenantBytes));
  }
  if (!IsValidPageSize(page_size)) return absl::InvalidArgumentError("namespace " + PageSizeProblem(page_size));
  return NamespaceKey(model_fingerprint, adapter, tenant, cache_salt, static_cast<int32_t>(page_size));
}

Hash128 PageContentKey(absl::Span<const TokenId> page_tokens) {
  return common::HashBytes(page_tokens.data(), page_tokens.size() * sizeof(TokenId));
}

namespace {

// K_i from K_{i-1} and C_i.
// HashChain(parent, C_i's 16 bytes), hashed from a 32-byte array.
Hash128 ChainLink(const Hash128& parent, const Hash128& content) {
  const uint64_t words[4] = {parent.lo, parent.hi, content.lo, content.hi};
  return common::HashBytes(words, sizeof(words));
}

}  // namespace

Hash128 PageKey(const Hash128& parent, absl::Span<const TokenId> page_tokens) {
  return ChainLink(parent, PageContentKey(page_tokens));
}

std::vector<Hash128> PageKeys(const Hash128& ns, absl::Span<const TokenId> tokens, int32_t page_size) {
  std::vector<Hash128> keys;
  if (page_size <= 0) return keys;
  const size_t n = tokens.size() / page_size;
  keys.resize(n);
  // The contents first: independent hashes the CPU overlaps; then the chain,
  // whose links are short.
  for (size_t i = 0; i < n; ++i) keys[i] = PageContentKey(tokens.subspan(i * page_size, page_size));
  Hash128 prev = ns;
  for (size_t i = 0; i < n; ++i) keys[i] = prev = ChainLink(prev, keys[i]);
  return keys;
}

Hash128 StateParentKey(const Hash128& parent) {
  // Domain separation: a state hangs from a key derived from its parent, so
  // StateKey(K, tail) equals a page key only if that derived key is itself a
  // page key (a 128-bit collision).
  static constexpr char kStateDomain[] = "hybridserve/state/v2";
  return common::HashChain(parent, kStateDomain, sizeof(kStateDomain) - 1);
}

Hash128 StateKey(const Hash128& parent, absl::Span<const TokenId> tail_tokens) {
  return common::HashChain(StateParentKey(parent), tail_tokens.data(), tail_tokens.size() * sizeof(TokenId));
}

}  // namespace hybridserve::cachestore
