#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_CLIENT_MESSAGES_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_CLIENT_MESSAGES_H_

// The client's side of the cachestore's messages (proto/cachestore.proto) that
// more than one transport sends: a namespace, a put's header, a put's answer.
// GrpcCacheClient sends them over gRPC, the direct writers (direct_writer.h)
// on the shm socket and the bulk port.

#include <cstddef>

#include "absl/status/statusor.h"
#include "cachestore/cache_client.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::cachestore {

v1::CacheNamespace NamespaceMessage(const ClientNamespace& ns);

// The header of a put of `size` bytes in namespace `ns` (a NamespaceMessage).
v1::PutHeader PutHeaderMessage(const v1::CacheNamespace& ns, const ClientPut& put, size_t size);

// A put's answer; INTERNAL for a malformed key.
absl::StatusOr<PutResult> PutResultOf(const v1::PutResponse& resp);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_CLIENT_MESSAGES_H_
