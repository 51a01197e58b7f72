#ifndef HYBRIDSERVE_CACHESTORE_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CACHE_CLIENT_H_

// CacheClient: how services (prefill, decode) talk to the cache, in domain
// types only (docs/ARCHITECTURE.md section 1). Implementations:
//   GrpcCacheClient           cachestore/client/grpc_cache_client.h           over gRPC
//   InProcessCacheClient      cachestore/client/in_process_cache_client.h     over a CacheStore in this process
//   FaultInjectingCacheClient cachestore/client/fault_injecting_cache_client.h wraps either, for fault tests
// Every implementation gives the same results and status codes for the same
// calls on the same cache contents (cache_client_contract_test.cc runs one
// suite against both); the codes are those of proto/cachestore.proto.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore {

// A namespace as a client names it; the cache hashes it into the root key
// (keys.h). A cache accepts it when model_fingerprint is not empty and
// page_size is a valid page size (common/tokens.h).
struct ClientNamespace {
  std::string model_fingerprint;
  std::string adapter;
  std::string cache_salt;
  int32_t page_size = 0;
  // Whose entries (decode/tenant.h); "" in a single-tenant deployment. Last
  // so that {fingerprint, adapter, salt, page_size} still reads as before.
  std::string tenant;
  // The model's prefill cost (engine/model_flops.h), registered with the
  // namespace by every put (proto CacheNamespace.model_cost); not part of
  // the key. nullopt: the cache's fallback. A cache refuses a value that is
  // not finite or outside [0, kMaxPrefillFlops] (INVALID_ARGUMENT).
  std::optional<PrefillCost> model_cost;
  // The chain a call's entries belong to: K_0 of the tokens the caller will
  // look them up by, or the namespace key N when those are shorter than a
  // page (ChainKeyOf; cachestore/client/shard_placement.h). Not part of the
  // key: a single-store client ignores it; ShardedCacheClient places Put and
  // PutMany on the owner of (N, placement). nullopt: not given.
  std::optional<Hash128> placement;

  Hash128 Key() const { return NamespaceKey(model_fingerprint, adapter, tenant, cache_salt, page_size); }
};

// The key of `ns` as a cache checks it: its model cost (CheckModelCost), then
// its key fields (ValidatedNamespaceKey); INVALID_ARGUMENT naming the field
// otherwise. put_header.h NamespaceOf is the same check of a namespace on
// the wire.
absl::StatusOr<Hash128> NamespaceOf(const ClientNamespace& ns);

// The chain key of `tokens` in `ns` (ShardPlacement::ChainKey): the key of
// their first page, or ns.Key() when they have no full page (or ns has no
// valid page size).
Hash128 ChainKeyOf(const ClientNamespace& ns, absl::Span<const TokenId> tokens);

// What to put; the cache derives the key from parent and tokens (keys.h).
struct ClientPut {
  EntryClass entry_class = EntryClass::kPage;
  std::optional<Hash128> parent;                   // nullopt: the namespace root
  std::vector<TokenId> tokens;                     // a page's page_size tokens, or a state's tail
  StateKind state_kind = StateKind::kExactPrefix;  // states only
  int64_t position = 0;                            // states only: p
  // States only: session retention (proto/cachestore.proto PutHeader.ttl, pin).
  absl::Duration ttl = absl::ZeroDuration();
  bool pin = false;
};

// One entry of PutMany: what to put and its bytes, both borrowed (they must
// outlive the call).
struct PutManyEntry {
  const ClientPut* put = nullptr;
  absl::string_view bytes;
  // The XXH3-64 of `bytes` as the caller knows it (computed where the bytes
  // were made): the cache commits the entry only when what it stored hashes
  // to this (DATA_LOSS otherwise). nullopt: the client computes it from
  // `bytes`.
  std::optional<uint64_t> checksum;
};

struct PutResult {
  Hash128 key;
  // The entry was already committed; nothing was written.
  bool already_present = false;
  // States: the retention granted (zero ttl: the class's) and why a requested
  // pin was refused.
  absl::Duration ttl = absl::ZeroDuration();
  bool pinned = false;
  std::string pin_refused;
};

// Whether a lookup pins what it finds.
enum class LookupMode {
  kLease,      // pages and state are leased until Release or expiry
  kProbeOnly,  // only report the match (for planning what to publish)
};

// Implementations are thread-safe: any method may be called from any thread
// at any time.
class CacheClient {
 public:
  virtual ~CacheClient() = default;

  // The resume point of `tokens` in `ns` (LookupResult). With kLease and a
  // state found, lease_id names a lease on the returned pages and state, and
  // lease_expiry is when it lapses unless used: on the store's clock in
  // process, on this process's absl::Now() over gRPC (counted from before the
  // request was sent). A miss is not an error: resume_position 0, no lease.
  // The pages' keys and positions are always given; their sizes and
  // checksums may be 0 (over gRPC they come with the bytes, Get).
  // INVALID_ARGUMENT: bad namespace, a negative token id, more tokens than
  // the store's max_tokens.
  virtual absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                              LookupMode mode) = 0;

  // Stores `bytes` as a page or a state and makes it visible, or reports it
  // already_present. A page may have no bytes (a model without attention
  // layers: its pages only chain the prefix). INVALID_ARGUMENT: bad namespace,
  // a state of no bytes, wrong token count, position disagreeing with parent
  // and tail. FAILED_PRECONDITION: the
  // parent page is not in the cache. RESOURCE_EXHAUSTED: larger than its
  // class's budget, or the budget is held by pinned or in-flight entries.
  // ABORTED: the same entry is being put concurrently, or the put was
  // reclaimed after stalling.
  virtual absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes) = 0;

  // Put for each of `entries`, in order, in one call where the
  // implementation can (the gRPC client: one PutMany stream, so the call's
  // timeout covers them all). One result per entry, in order: what Put would
  // have returned for it, and DATA_LOSS when its bytes do not hash to its
  // checksum (nothing of it is stored). The cache takes the entries one at a
  // time, so an entry may hang from the one before it; a refused entry does
  // not stop the ones after it (one that hangs from it then fails
  // FAILED_PRECONDITION). When the call itself fails (the gRPC client: a
  // transport code, ABORTED when the stream stalled past the server's
  // put_timeout, UNIMPLEMENTED from a cachestore older than PutMany), the
  // entries it did not answer carry its status. No entries: no call, no
  // results. This default calls Put for each entry, and after one that fails
  // with UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED gives the entries left
  // that status without calling Put.
  virtual std::vector<absl::StatusOr<PutResult>> PutMany(const ClientNamespace& ns,
                                                         absl::Span<const PutManyEntry> entries);

  // The bytes of entry `key` held by lease `lease_id`, checksum-verified, into
  // `*out` (its previous contents replaced, its capacity reused). On error
  // `*out` holds no usable bytes. NOT_FOUND: unknown or expired lease, or the
  // lease does not hold `key`. DATA_LOSS: the bytes failed their checksum (a
  // stored entry that fails is removed).
  virtual absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out) = 0;

  // GetInto a new string.
  absl::StatusOr<std::string> Get(uint64_t lease_id, const Hash128& key);

  // GetInto for each of `keys` into the matching element of `out` (as many),
  // in one call where the implementation can (the gRPC client: one stream).
  // The first error, naming the key's index; `out` then holds no usable
  // bytes. INVALID_ARGUMENT: no keys, or out and keys of different sizes.
  // This default calls GetInto for each key.
  virtual absl::Status GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out);

  // GetManyInto straight into the caller's memory: entry i fills out[i]'s
  // segments in order, and must be exactly as long as they are together
  // (INVALID_ARGUMENT naming the key's index otherwise). Errors as
  // GetManyInto; on error the segments hold no usable bytes. This default
  // reads each entry into a string (GetManyInto) and copies it; a client that
  // can place the bytes itself (DirectReadCacheClient) skips that copy.
  virtual absl::Status GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                        absl::Span<const EntrySegments> out);

  // Ends a lease. NOT_FOUND: unknown, already released, or expired and
  // reclaimed by the store (a lapsed lease not yet reclaimed still releases).
  virtual absl::Status Release(uint64_t lease_id) = 0;

  virtual absl::StatusOr<IndexStats> Stats() = 0;
};

// OK when an entry of `entry_bytes` fills `destination` exactly; otherwise
// INVALID_ARGUMENT naming keys[index] and both sizes (GetManyScattered's check).
absl::Status CheckEntryFits(size_t index, size_t entry_bytes, const EntrySegments& destination);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CACHE_CLIENT_H_
