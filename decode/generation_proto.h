#ifndef HYBRIDSERVE_DECODE_GENERATION_PROTO_H_
#define HYBRIDSERVE_DECODE_GENERATION_PROTO_H_

// Conversions between proto/generation.proto (the client-facing contract)
// and the decode worker's domain types (generation.h). Used by the decode
// service. Thread-safe (pure functions).

#include "absl/status/statusor.h"
#include "decode/generation.h"
#include "proto/generation.pb.h"

namespace hybridserve::decode {

// The domain request, with the proto's defaults applied (temperature 1,
// top_p 1, top_k 0, seed from request_id when absent): after this, the
// sampling is fully resolved, and the prefill call carries it as it is.
// Fields are validated later (ValidateRequest); only what cannot be
// represented is refused here (INVALID_ARGUMENT: top_logprobs beyond 20, a
// negative session.keep).
absl::StatusOr<GenerateRequest> FromProto(const v1::GenerateRequest& request);

v1::FinishReason ToProto(FinishReason reason);
void ToProto(const Usage& usage, v1::Usage* out);

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_GENERATION_PROTO_H_
