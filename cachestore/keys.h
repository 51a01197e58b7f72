#ifndef HYBRIDSERVE_CACHESTORE_KEYS_H_
#define HYBRIDSERVE_CACHESTORE_KEYS_H_

// Cache keys (docs/ARCHITECTURE.md section 4), version 3. Shared by the cachestore and
// its clients so both sides derive the same keys from the same tokens.
//
//   namespace  N   = H(L("hybridserve/ns/v3") || L(model_fingerprint) || L(adapter) ||
//                      L(tenant) || L(cache_salt) || page_size)
//                    L(x): x's byte length as a uint64 little-endian, then x;
//                    page_size: 4 bytes, int32 little-endian
//   page i     C_i = H(tokens of page i)               (its content)
//              K_i = H(K_{i-1} || C_i), K_{-1} = N      (its place in the chain)
//   state at p S_p = H(H(K_{n-1} || "hybridserve/state/v2") || tokens[n*page_size, p)),
//                    n = floor(p/page_size)
//
// Two levels (since version 2): the page contents are hashed independently of
// each other (no serial dependency through the tokens), and the chain links
// hash 32 bytes each. Version 3 added the tenant (the authenticated caller
// decode derived, decode/tenant.h) as a field of its own beside the client's
// salt: a client can narrow its sharing with a salt, never reach into another
// tenant's namespace. Version 1 chained the tokens themselves (K_i =
// H(K_{i-1} || tokens of page i)), version 2 had no tenant; both are refused
// by name (KeyVersionProblem).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "common/prefill_cost.h"
#include "common/tokens.h"

namespace hybridserve::cachestore {

using common::Hash128;
using ::hybridserve::TokenId;

// The key derivation this code implements, as CacheNamespace.key_version
// names it on the wire (0 there means this one).
inline constexpr uint32_t kKeyVersion = 3;

// Why a client's declared key version cannot be served; empty for 0 (the
// current) and kKeyVersion.
std::string KeyVersionProblem(uint32_t key_version);

// The root key of a namespace. Each string part is length-prefixed and
// page_size has a fixed width, so no two different tuples hash the same bytes.
Hash128 NamespaceKey(absl::string_view model_fingerprint, absl::string_view adapter, absl::string_view tenant,
                     absl::string_view cache_salt, int32_t page_size);

// The longest tenant name a namespace may carry, in bytes.
inline constexpr size_t kMaxTenantBytes = 256;

// NamespaceKey of a namespace a cache accepts: a non-empty model_fingerprint
// a tenant of at most kMaxTenantBytes and a valid page size (common/tokens.h);
// INVALID_ARGUMENT otherwise. The one check shared by the gRPC service and the
// in-process client.
absl::StatusOr<Hash128> ValidatedNamespaceKey(absl::string_view model_fingerprint, absl::string_view adapter,
                                              absl::string_view tenant, absl::string_view cache_salt, int64_t page_size,
                                              uint32_t key_version = kKeyVersion);

// OK for no model cost or one a cache accepts (both fields finite numbers in
// [0, kMaxPrefillFlops], common/prefill_cost.h); INVALID_ARGUMENT naming the
// field otherwise ("namespace.model_cost.flops_per_token -1 is not ...").
// The one check of a namespace's model cost: the namespace conversions
// (put_header.h, cache_client.h NamespaceOf) and the index's BeginPut make it.
absl::Status CheckModelCost(const std::optional<PrefillCost>& cost);

// K_i from K_{i-1} and the page's tokens.
Hash128 PageKey(const Hash128& parent, absl::Span<const TokenId> page_tokens);

// C_i: the content hash of one page's tokens.
Hash128 PageContentKey(absl::Span<const TokenId> page_tokens);

// Keys of the full pages of `tokens`: floor(tokens.size() / page_size) of them.
std::vector<Hash128> PageKeys(const Hash128& ns, absl::Span<const TokenId> tokens, int32_t page_size);

// S_p from K_{n-1} (or N) and tokens[n*page_size, p).
Hash128 StateKey(const Hash128& parent, absl::Span<const TokenId> tail_tokens);

// H(parent || "hybridserve/state/v2"): the link every state of `parent`
// chains its tail from (StateKey(parent, tail) = HashChain(StateParentKey(parent), tail)).
Hash128 StateParentKey(const Hash128& parent);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_KEYS_H_
