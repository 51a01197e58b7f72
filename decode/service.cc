#include "decode/service.h"

#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "decode/generation_proto.h"

namespace hybridserve::decode {
namespace {

// How often a stream waiting for tokens checks whether its client went away.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);

// Hands the loop's tokens to the stream's thread. OnToken/OnComplete run on
// the loop thread and never block on the network.
class StreamSink final : public GenerationSink {
 public:
  explicit StreamSink(absl::Time arrival, DecodeMetrics* metrics) : arrival_(arrival), metrics_(metrics) {}

  void OnToken(const engine::SampledToken& token) override {
    const absl::Time now = absl::Now();
    if (metrics_ != nullptr) {
      if (last_token_ == absl::InfinitePast()) {
        metrics_->RecordFirstToken(absl::ToDoubleSeconds(now - arrival_));
      } else {
        metrics_->RecordInterToken(absl::ToDoubleSeconds(now - last_token_));
      }
    }
    last_token_ = now;
    absl::MutexLock lock(&mu_);
    tokens_.push_back(token);
  }
  void OnComplete(const Completion& completion) override {
    absl::MutexLock lock(&mu_);
    done_ = completion;
  }

  // Waits up to `timeout` for tokens or the completion; moves what arrived out.
  void Take(absl::Duration timeout, std::vector<engine::SampledToken>* tokens, std::optional<Completion>* done) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !tokens_.empty() || done_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    tokens->assign(std::make_move_iterator(tokens_.begin()), std::make_move_iterator(tokens_.end()));
    tokens_.clear();
    // The completion is taken only once every token before it was.
    if (done_.has_value()) *done = done_;
  }

 private:
  const absl::Time arrival_;
  DecodeMetrics* const metrics_;
  absl::Time last_token_ = absl::InfinitePast();  // loop thread only
  absl::Mutex mu_;
  std::deque<engine::SampledToken> tokens_ ABSL_GUARDED_BY(mu_);
  std::optional<Completion> done_ ABSL_GUARDED_BY(mu_);
};

void AppendTokens(const std::vector<engine::SampledToken>& tokens, bool logprobs, bool top, v1::TokenChunk* chunk) {
  for (const engine::SampledToken& t : tokens) {
    chunk->add_token_ids(t.token);
    if (logprobs) chunk->add_logprobs(t.logprob);
    if (top) {
      v1::TopLogprobs* entries = chunk->add_top_logprobs();
      for (const engine::TokenLogprob& e : t.top_logprobs) {
        v1::TopLogprob* p = entries->add_entries();
        p->set_token_id(e.token);
        p->set_logprob(e.logprob);
      }
    }
  }
}

}  // namespace

grpc::Status GenerationService::Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const absl::Time arrival = absl::Now();
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  if (!tenant.ok()) {
    if (metrics_ != nullptr) metrics_->RecordRefused();
    return common::ToGrpcStatus(tenant.status());
  }
  absl::StatusOr<GenerateRequest> parsed = FromProto(*request);
  if (!parsed.ok()) {
    if (metrics_ != nullptr) metrics_->RecordRefused();
    return common::ToGrpcStatus(parsed.status());
  }
  // The request keeps the client's id (validated, and named in what the
  // client is told); the loop knows it by its id within the tenant.
  parsed->tenant = *tenant;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    parsed->deadline = absl::FromChrono(context->deadline());
  }
  const std::string id = parsed->request_id;
  const bool logprobs = request->return_logprobs() || request->top_logprobs() > 0;
  const bool top = request->top_logprobs() > 0;
  StreamSink sink(arrival, metrics_);
  absl::Status submitted = loop_.Submit(*std::move(parsed), &sink);
  if (!submitted.ok()) {
    if (metrics_ != nullptr) metrics_->RecordRefused();
    return common::ToGrpcStatus(submitted);
  }
  // From here the sink must outlive the request: leave only after OnComplete.
  bool aborted = false;
  bool writable = true;
  while (true) {
    std::vector<engine::SampledToken> tokens;
    std::optional<Completion> done;
    sink.Take(kCancelPoll, &tokens, &done);
    if (!tokens.empty() && writable) {
      v1::GenerateResponse response;
      AppendTokens(tokens, logprobs, top, response.mutable_chunk());
      writable = writer->Write(response);
    }
    if (done.has_value()) {
      if (metrics_ != nullptr) metrics_->RecordFinish(*done, absl::ToDoubleSeconds(absl::Now() - arrival));
      if (writable) {
        v1::GenerateResponse response;
        v1::GenerateComplete* complete = response.mutable_complete();
        complete->set_finish_reason(ToProto(done->reason));
        ToProto(done->usage, complete->mutable_usage());
        complete->set_stop_token_id(done->reason == FinishReason::kStop ? done->stop_token_id : -1);
        if (!done->error.ok()) complete->set_error_message(std::string(done->error.message()));
        writer->Write(response);
      }
      return grpc::Status::OK;
    }
    if (!aborted && (!writable || context->IsCancelled())) {
      loop_.Abort(*tenant, id);
      aborted = true;
    }
  }
}

grpc::Status GenerationService::Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                                      v1::AbortResponse* response) {
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  if (!tenant.ok()) return common::ToGrpcStatus(tenant.status());
  for (const std::string& id : request->request_ids()) {
    if (loop_.Abort(*tenant, id)) response->add_aborted_request_ids(id);
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::string> GenerationService::TenantOf(const grpc::ServerContext& context) const {
  CallIdentity call;
  if (std::shared_ptr<const grpc::AuthContext> auth = context.auth_context(); auth != nullptr) {
    call.peer_identities = common::PeerIdentities(*auth);
  }
  const auto [first, last] = context.client_metadata().equal_range(kTenantHeader);
  for (auto it = first; it != last; ++it) call.tenant_headers.emplace_back(it->second.data(), it->second.size());
  return tenants_.Resolve(call);
}

grpc::Status GenerationService::GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                                             v1::ModelInfo* info) {
  info->set_model_name(model_.name);
  info->set_vocab_size(static_cast<uint32_t>(model_.vocab_size));
  info->set_max_context_tokens(static_cast<uint32_t>(model_.max_context));
  for (TokenId eos : model_.eos_token_ids) info->add_eos_token_ids(eos);
  info->set_chunk_size(static_cast<uint32_t>(model_.chunk_size));
  info->set_page_size(static_cast<uint32_t>(model_.page_size));
  info->set_checkpoint_interval(static_cast<uint32_t>(model_.checkpoint_interval));
  info->set_fingerprint(model_.fingerprint_hex);
  for (const engine::SpecialToken& token : model_.end_of_turn_tokens) {
    v1::SpecialToken* out = info->add_end_of_turn_tokens();
    out->set_id(static_cast<int32_t>(token.id));
    out->set_text(token.text);
  }
  return grpc::Status::OK;
}

}  // namespace hybridserve::decode
