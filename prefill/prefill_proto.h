#ifndef HYBRIDSERVE_PREFILL_PREFILL_PROTO_H_
#define HYBRIDSERVE_PREFILL_PREFILL_PROTO_H_

// Conversions between proto/prefill.proto (version 2) and the prefill
// contract's domain types (prefill_client.h): the request with its transfer
// ticket, and the outcome. Used by the prefill service (server side) and the
// gRPC prefill client. Thread-safe (pure functions).

#include "absl/status/statusor.h"
#include "engine/sampler.h"
#include "prefill/prefill_client.h"
#include "proto/prefill.pb.h"
#include "transport/transfer.h"

namespace hybridserve::prefill {

// The proto form of a request (its cancellation stays behind).
void RequestToProto(const PrefillRequest& request, v1::PrefillRequest* out);
// The request a PrefillRequest carries. FAILED_PRECONDITION for another
// protocol version (a version-1 caller), naming both; INVALID_ARGUMENT,
// naming the field, for a bad ticket, a request_id over 768 bytes (the
// client's 256, or an earlier decode's tenant-scoped form), a tenant over
// cachestore::kMaxTenantBytes or top_logprobs above engine::kMaxTopLogprobs. Sampling ranges and the
// prompt are the worker's to check.
absl::StatusOr<PrefillRequest> RequestFromProto(const v1::PrefillRequest& request);

void TicketToProto(const transport::Ticket& ticket, v1::TransferTicket* out);
// INVALID_ARGUMENT, naming the field, for a page format or a transfer
// secret that is not 16 bytes, sizes out of range, no endpoint for TCP, or an
// unknown transport.
absl::StatusOr<transport::Ticket> TicketFromProto(const v1::TransferTicket& ticket);

v1::ResumeKind ResumeKindToProto(ResumeKind kind);
ResumeKind ResumeKindFromProto(v1::ResumeKind kind);  // unknown values: kCold

void OutcomeToProto(const PrefillOutcome& outcome, v1::PrefillResponse* out);
// The first token, its logprobs, the usage and transfer a response carries.
PrefillOutcome OutcomeFromProto(const v1::PrefillResponse& response);

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_PREFILL_PROTO_H_
