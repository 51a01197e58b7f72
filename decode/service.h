#ifndef HYBRIDSERVE_DECODE_SERVICE_H_
#define HYBRIDSERVE_DECODE_SERVICE_H_

// The decode worker's gRPC edge (proto/generation.proto): Generate converts
// the request, submits it to the DecodeLoop, and streams the tokens as the
// loop samples them (one chunk per wake-up, carrying every token sampled
// since the last), ending with exactly one `complete`. A client that cancels
// the stream, or whose deadline passes, ends its request within one decode
// step (the loop frees every reservation). Abort ends live requests by id,
// the caller's own only (ids are scoped by tenant: decode/tenant.h);
// GetModelInfo describes the model.
//
// Every Generate and Abort call's tenant comes from its connection
// (TenantResolver): UNAUTHENTICATED or PERMISSION_DENIED when it cannot be
// derived, before anything else.
//
// Statuses before generation starts: INVALID_ARGUMENT naming the field
// (decode/generation.h ValidateRequest), RESOURCE_EXHAUSTED when the worker is
// full, UNAVAILABLE while draining. After it starts, failures arrive as
// FINISH_REASON_ERROR with a message.
//
// Thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "decode/decode_loop.h"
#include "decode/metrics.h"
#include "decode/tenant.h"
#include "engine/model_config.h"
#include "engine/model_metadata.h"
#include "grpcpp/grpcpp.h"
#include "proto/generation.grpc.pb.h"

namespace hybridserve::decode {

struct ModelDescription {
  std::string name;  // engine::ModelMetadata's: never a full path
  std::vector<engine::SpecialToken> end_of_turn_tokens;
  std::string fingerprint_hex;
  int64_t vocab_size = 0;
  int64_t max_context = 0;
  std::vector<TokenId> eos_token_ids;
  int64_t chunk_size = 0;
  int64_t page_size = 0;
  int64_t checkpoint_interval = 0;
};

class GenerationService final : public v1::Generation::Service {
 public:
  // `loop` and `metrics` (null: none) must outlive the service.
  GenerationService(DecodeLoop& loop, const ModelDescription& model, TenantResolver tenants, DecodeMetrics* metrics)
      : loop_(loop), model_(model), tenants_(std::move(tenants)), metrics_(metrics) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* response) override;

 private:
  absl::StatusOr<std::string> TenantOf(const grpc::ServerContext& context) const;

  DecodeLoop& loop_;
  const ModelDescription model_;
  const TenantResolver tenants_;
  DecodeMetrics* const metrics_;
};

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_SERVICE_H_
