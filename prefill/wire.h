#ifndef HYBRIDSERVE_PREFILL_WIRE_H_
#define HYBRIDSERVE_PREFILL_WIRE_H_

// Conversions between proto/prefill.proto and the domain types of the
// prefill call: the transfer ticket both ends use, and the response. Used by
// the prefill service (server side) and decode's gRPC prefill client.
// Thread-safe (pure functions).

#include "absl/status/statusor.h"
#include "engine/sampler.h"
#include "prefill/prefill_worker.h"
#include "proto/prefill.pb.h"
#include "transport/transfer.h"

namespace hybridserve::prefill {

// The sampling a GenerateRequest asks for, with the proto's defaults applied
// (temperature 1, top_p 1, top_k 0, seed from request_id when absent).
// INVALID_ARGUMENT for top_logprobs above engine::kMaxTopLogprobs; ranges are
// checked later (engine::ValidateSamplingParams). Shared with decode's wire.
absl::StatusOr<engine::SamplingParams> SamplingFromProto(const v1::GenerateRequest& request);

// The prefill call a PrefillRequest carries. INVALID_ARGUMENT, naming the
// field, for a bad ticket or sampling; the worker checks the prompt.
absl::StatusOr<PrefillRequest> PrefillRequestFromProto(const v1::PrefillRequest& request);

void TicketToProto(const transport::Ticket& ticket, v1::TransferTicket* out);
// INVALID_ARGUMENT, naming the field, for a page format that is not 16
// bytes, sizes out of range, no endpoint for TCP, or an unknown transport.
absl::StatusOr<transport::Ticket> TicketFromProto(const v1::TransferTicket& ticket);

void OutcomeToProto(const PrefillOutcome& outcome, v1::PrefillResponse* out);
// The first token, its logprobs and the usage a response carries.
PrefillOutcome OutcomeFromProto(const v1::PrefillResponse& response);

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_WIRE_H_
