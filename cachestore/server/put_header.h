#ifndef HYBRIDSERVE_CACHESTORE_SERVER_PUT_HEADER_H_
#define HYBRIDSERVE_CACHESTORE_SERVER_PUT_HEADER_H_

// A put's header and answer on the wire, shared by Put and PutMany
// (proto/cachestore.proto): PutHeader to the store's PutSpec, and the
// PutResponse of a put the store accepted.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cachestore/index/cache_store.h"
#include "common/prefill_cost.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::cachestore {

// The key of a namespace on the wire, as a lookup and a put check it: its
// model cost (CheckModelCost), then its key fields (ValidatedNamespaceKey,
// with the key version it declares); INVALID_ARGUMENT naming the field
// otherwise. Registers nothing. cache_client.h NamespaceOf is the same check
// of a ClientNamespace.
absl::StatusOr<Hash128> NamespaceOf(const v1::CacheNamespace& ns);

// INVALID_ARGUMENT naming the header's field: a bad namespace, class, state
// kind, parent key, token count, position, size or ttl. What the store checks
// itself (token count against the page size, position against the tail, the
// budgets) is left to BeginPut.
absl::StatusOr<PutSpec> SpecOf(const v1::PutHeader& header);

// The answer to a put whose header `session` accepted: its key, the retention
// granted, and already_present.
v1::PutResponse AnswerOf(const PutSession& session);

// ---- Puts by a direct path (the shm socket, the bulk port) ----
// Each entry follows PutMany: its header (a serialized v1::PutHeader) is
// checked as PutMany checks it, the put begun, its bytes written, the entry
// committed against its checksum, and it gets PutMany's answer.

// The put of an entry of `size` bytes whose header is `header_bytes`:
// INVALID_ARGUMENT for a header that does not parse, fails SpecOf, or whose
// size_bytes is not `size`; BeginPut's refusals.
absl::StatusOr<std::unique_ptr<PutSession>> BeginDirectPut(CacheStore& store, absl::string_view header_bytes,
                                                           uint64_t size);

// Entry `index`'s answer, a serialized v1::PutManyResponse: `status`'s code
// and message (cut to `max_message_bytes`), or when OK the answer of
// `session` (the put it accepted).
std::string DirectPutAnswer(uint32_t index, const absl::Status& status, const PutSession* session,
                            size_t max_message_bytes);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVER_PUT_HEADER_H_
