#ifndef HYBRIDSERVE_DECODE_WIRE_H_
#define HYBRIDSERVE_DECODE_WIRE_H_

// Conversions between proto/generation.proto (the client-facing contract)
// and the decode worker's domain types. Used by the decode service, by the
// prefill service for the request a PrefillRequest carries, and by clients.
// Thread-safe (pure functions).

#include "absl/status/statusor.h"
#include "decode/generation.h"
#include "proto/generation.pb.h"

namespace hybridserve::decode {

// The domain request, with the proto's defaults applied (temperature 1,
// top_p 1, top_k 0, seed from request_id when absent). Fields are validated
// later (ValidateRequest); only what cannot be represented is refused here
// (INVALID_ARGUMENT: max_tokens beyond int64, top_logprobs beyond 20).
absl::StatusOr<GenerateRequest> FromProto(const v1::GenerateRequest& request);

// The proto form of a domain request (clients, the prefill call).
void ToProto(const GenerateRequest& request, v1::GenerateRequest* out);

v1::FinishReason ToProto(FinishReason reason);
v1::ResumeKind ToProto(ResumeKind kind);
ResumeKind FromProto(v1::ResumeKind kind);
void ToProto(const Usage& usage, v1::Usage* out);

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_WIRE_H_
