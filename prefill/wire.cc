#include "prefill/wire.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace hybridserve::prefill {

absl::StatusOr<engine::SamplingParams> SamplingFromProto(const v1::GenerateRequest& p) {
  engine::SamplingParams out;
  const v1::SamplingParams& s = p.sampling();
  out.temperature = s.has_temperature() ? s.temperature() : 1.0f;
  out.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  out.top_k = s.has_top_k() ? s.top_k() : 0;
  out.seed = s.has_seed() ? s.seed() : engine::SeedFromRequestId(p.request_id());
  out.logprobs = p.return_logprobs() || p.top_logprobs() > 0;
  if (p.top_logprobs() > static_cast<uint32_t>(engine::kMaxTopLogprobs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs ", p.top_logprobs(), " is above the limit of ", engine::kMaxTopLogprobs));
  }
  out.top_logprobs = static_cast<int32_t>(p.top_logprobs());
  return out;
}

absl::StatusOr<PrefillRequest> PrefillRequestFromProto(const v1::PrefillRequest& p) {
  PrefillRequest r;
  absl::StatusOr<engine::SamplingParams> sampling = SamplingFromProto(p.request());
  if (!sampling.ok()) return sampling.status();
  absl::StatusOr<transport::Ticket> ticket = TicketFromProto(p.ticket());
  if (!ticket.ok()) return ticket.status();
  r.request_id = p.request().request_id();
  r.prompt.assign(p.request().prompt_token_ids().begin(), p.request().prompt_token_ids().end());
  r.cache_salt = p.request().cache_salt();
  r.sampling = *sampling;
  r.ticket = *std::move(ticket);
  return r;
}

void TicketToProto(const transport::Ticket& t, v1::TransferTicket* out) {
  switch (t.kind) {
    case transport::TransportKind::kInProcess:
      out->set_transport(v1::TRANSPORT_KIND_IN_PROCESS);
      break;
    case transport::TransportKind::kTcp:
      out->set_transport(v1::TRANSPORT_KIND_TCP);
      break;
    case transport::TransportKind::kNccl:
      out->set_transport(v1::TRANSPORT_KIND_NCCL);
      out->set_nccl_unique_id(t.channel_id);
      break;
    case transport::TransportKind::kCudaIpc:
      out->set_transport(v1::TRANSPORT_KIND_CUDA_IPC);
      out->set_cuda_ipc_channel(t.channel_id);
      break;
  }
  out->set_endpoint(t.endpoint);
  out->set_transfer_id(t.transfer_id);
  for (int32_t slot : t.page_slots) out->add_kv_page_slots(static_cast<uint32_t>(slot));
  out->set_state_slot(static_cast<uint32_t>(t.state_slot));
  if (t.deadline != absl::InfiniteFuture()) {
    const int64_t nanos = absl::ToUnixNanos(t.deadline);
    out->mutable_deadline()->set_seconds(nanos / 1000000000);
    out->mutable_deadline()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
  }
  out->set_page_format(t.page_format.ToBytes());
  out->set_n_tokens(static_cast<uint64_t>(t.n_tokens));
  out->set_num_pages(static_cast<uint64_t>(t.num_pages));
  out->set_page_bytes(static_cast<uint64_t>(t.page_bytes));
  out->set_max_state_bytes(static_cast<uint64_t>(t.max_state_bytes));
}

absl::StatusOr<transport::Ticket> TicketFromProto(const v1::TransferTicket& p) {
  transport::Ticket t;
  // Which planes this worker serves is the sender's to say (RoutingStateSender);
  // here only what each kind needs on the ticket. An in-process ticket never
  // crosses the wire.
  switch (p.transport()) {
    case v1::TRANSPORT_KIND_TCP:
      t.kind = transport::TransportKind::kTcp;
      if (!p.nccl_unique_id().empty() || !p.cuda_ipc_channel().empty()) {
        return absl::InvalidArgumentError("ticket.nccl_unique_id or cuda_ipc_channel is set on a TCP ticket");
      }
      break;
    case v1::TRANSPORT_KIND_NCCL:
      t.kind = transport::TransportKind::kNccl;
      if (p.nccl_unique_id().size() != transport::kNcclUniqueIdBytes) {
        return absl::InvalidArgumentError(absl::StrCat("ticket.nccl_unique_id must be ", transport::kNcclUniqueIdBytes,
                                                       " bytes on an NCCL ticket, got ", p.nccl_unique_id().size()));
      }
      t.channel_id = p.nccl_unique_id();
      break;
    case v1::TRANSPORT_KIND_CUDA_IPC:
      t.kind = transport::TransportKind::kCudaIpc;
      if (p.cuda_ipc_channel().empty() || p.cuda_ipc_channel().size() > 300 || !p.nccl_unique_id().empty()) {
        return absl::InvalidArgumentError(
            "ticket.cuda_ipc_channel must name the channel (host:port/token) on a CUDA IPC ticket, alone");
      }
      t.channel_id = p.cuda_ipc_channel();
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("ticket.transport ", v1::TransportKind_Name(p.transport()), " is not served by this worker"));
  }
  if (p.endpoint().empty()) return absl::InvalidArgumentError("ticket.endpoint is empty");
  if (!common::Hash128::FromBytes(p.page_format(), &t.page_format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ticket.page_format must be 16 bytes, got ", p.page_format().size()));
  }
  constexpr uint64_t kMax = uint64_t{1} << 40;
  if (p.n_tokens() == 0 || p.n_tokens() > kMax || p.num_pages() > kMax || p.page_bytes() > kMax ||
      p.max_state_bytes() == 0 || p.max_state_bytes() > kMax) {
    return absl::InvalidArgumentError("ticket sizes (n_tokens, num_pages, page_bytes, max_state_bytes) out of range");
  }
  t.endpoint = p.endpoint();
  t.transfer_id = p.transfer_id();
  t.n_tokens = static_cast<int64_t>(p.n_tokens());
  t.num_pages = static_cast<int64_t>(p.num_pages());
  t.page_bytes = static_cast<int64_t>(p.page_bytes());
  t.max_state_bytes = static_cast<int64_t>(p.max_state_bytes());
  for (uint32_t slot : p.kv_page_slots()) t.page_slots.push_back(static_cast<int32_t>(slot));
  t.state_slot = static_cast<int32_t>(p.state_slot());
  if (p.has_deadline()) {
    t.deadline = absl::FromUnixSeconds(p.deadline().seconds()) + absl::Nanoseconds(p.deadline().nanos());
  }
  return t;
}

void OutcomeToProto(const PrefillOutcome& o, v1::PrefillResponse* out) {
  out->set_first_token(o.first.token);
  out->set_first_logprob(o.first.logprob);
  for (const engine::TokenLogprob& t : o.first.top_logprobs) {
    v1::TopLogprob* e = out->mutable_first_top_logprobs()->add_entries();
    e->set_token_id(t.token);
    e->set_logprob(t.logprob);
  }
  v1::Usage* u = out->mutable_usage();
  u->set_prompt_tokens(static_cast<uint32_t>(o.usage.prompt_tokens));
  u->set_cached_tokens(static_cast<uint32_t>(o.usage.cached_tokens));
  u->set_recomputed_tokens(static_cast<uint32_t>(o.usage.recomputed_tokens));
  u->set_resume_kind(o.usage.resume_kind == ResumeKind::kGridCheckpoint ? v1::RESUME_KIND_GRID_CHECKPOINT
                     : o.usage.resume_kind == ResumeKind::kExactPrefix  ? v1::RESUME_KIND_EXACT_PREFIX
                                                                        : v1::RESUME_KIND_COLD);
  out->mutable_transfer()->set_bytes(static_cast<uint64_t>(o.transfer_bytes));
  out->set_publishes_prompt(o.publishes_prompt);
  const int64_t nanos = absl::ToInt64Nanoseconds(o.transfer_time);
  out->mutable_transfer()->mutable_duration()->set_seconds(nanos / 1000000000);
  out->mutable_transfer()->mutable_duration()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

PrefillOutcome OutcomeFromProto(const v1::PrefillResponse& p) {
  PrefillOutcome o;
  o.first.token = p.first_token();
  o.first.logprob = p.first_logprob();
  for (const v1::TopLogprob& e : p.first_top_logprobs().entries()) {
    o.first.top_logprobs.push_back(engine::TokenLogprob{e.token_id(), e.logprob()});
  }
  o.usage.prompt_tokens = p.usage().prompt_tokens();
  o.usage.cached_tokens = p.usage().cached_tokens();
  o.usage.recomputed_tokens = p.usage().recomputed_tokens();
  o.usage.resume_kind = p.usage().resume_kind() == v1::RESUME_KIND_GRID_CHECKPOINT ? ResumeKind::kGridCheckpoint
                        : p.usage().resume_kind() == v1::RESUME_KIND_EXACT_PREFIX  ? ResumeKind::kExactPrefix
                                                                                   : ResumeKind::kCold;
  o.transfer_bytes = static_cast<int64_t>(p.transfer().bytes());
  o.publishes_prompt = p.publishes_prompt();
  o.transfer_time =
      absl::Seconds(p.transfer().duration().seconds()) + absl::Nanoseconds(p.transfer().duration().nanos());
  return o;
}

}  // namespace hybridserve::prefill
