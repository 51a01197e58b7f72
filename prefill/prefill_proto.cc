#include "prefill/prefill_proto.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cachestore/keys.h"
#include "google/protobuf/util/time_util.h"

namespace hybridserve::prefill {

using ::google::protobuf::util::TimeUtil;

void RequestToProto(const PrefillRequest& r, v1::PrefillRequest* out) {
  out->set_protocol(v1::PREFILL_PROTOCOL_V2);
  out->set_request_id(r.request_id);
  out->mutable_prompt_token_ids()->Assign(r.prompt.begin(), r.prompt.end());
  out->set_cache_salt(r.cache_salt);
  out->set_tenant(r.tenant);
  v1::PrefillSampling* s = out->mutable_sampling();
  s->set_temperature(r.sampling.temperature);
  s->set_top_p(r.sampling.top_p);
  s->set_top_k(r.sampling.top_k);
  s->set_seed(r.sampling.seed);
  s->set_logprobs(r.sampling.logprobs);
  s->set_top_logprobs(static_cast<uint32_t>(r.sampling.top_logprobs));
  TicketToProto(r.ticket, out->mutable_ticket());
}

absl::StatusOr<PrefillRequest> RequestFromProto(const v1::PrefillRequest& p) {
  if (p.protocol() != v1::PREFILL_PROTOCOL_V2) {
    return absl::FailedPreconditionError(
        absl::StrCat("prefill protocol ", p.protocol() == v1::PREFILL_PROTOCOL_UNSPECIFIED ? 1 : p.protocol(),
                     " is not spoken here: this prefill worker speaks protocol 2 (proto/prefill.proto); "
                     "run decode and prefill workers of the same release"));
  }
  // The client's id (at most 256 bytes; the tenant is its own field). Up to
  // 768 taken: decode workers of earlier releases sent the id within the
  // tenant (decode/tenant.h ScopedRequestId: the client's 256 bytes, the
  // tenant's 256 and a length prefix).
  constexpr size_t kMaxRequestIdBytes = 768;
  if (p.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id has ", p.request_id().size(), " bytes, at most ", kMaxRequestIdBytes));
  }
  if (p.tenant().size() > cachestore::kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant has ", p.tenant().size(), " bytes, at most ", cachestore::kMaxTenantBytes));
  }
  const v1::PrefillSampling& s = p.sampling();
  if (s.top_logprobs() > static_cast<uint32_t>(engine::kMaxTopLogprobs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_logprobs ", s.top_logprobs(), " is above the limit of ", engine::kMaxTopLogprobs));
  }
  PrefillRequest r;
  absl::StatusOr<transport::Ticket> ticket = TicketFromProto(p.ticket());
  if (!ticket.ok()) return ticket.status();
  r.request_id = p.request_id();
  r.prompt.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  r.cache_salt = p.cache_salt();
  r.tenant = p.tenant();
  r.sampling.temperature = s.temperature();
  r.sampling.top_p = s.top_p();
  r.sampling.top_k = s.top_k();
  r.sampling.seed = s.seed();
  r.sampling.logprobs = s.logprobs() || s.top_logprobs() > 0;
  r.sampling.top_logprobs = static_cast<int32_t>(s.top_logprobs());
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
    *out->mutable_deadline() = TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t.deadline));
  }
  out->set_page_format(t.page_format.ToBytes());
  out->set_n_tokens(static_cast<uint64_t>(t.n_tokens));
  out->set_num_pages(static_cast<uint64_t>(t.num_pages));
  out->set_page_bytes(static_cast<uint64_t>(t.page_bytes));
  out->set_max_state_bytes(static_cast<uint64_t>(t.max_state_bytes));
  out->set_transfer_secret(t.secret);
  out->set_held_pages(static_cast<uint64_t>(t.held_pages));
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
  if (p.held_pages() > p.num_pages() || (p.held_pages() != 0 && p.transport() != v1::TRANSPORT_KIND_TCP)) {
    return absl::InvalidArgumentError(absl::StrCat("ticket.held_pages ", p.held_pages(), " of ", p.num_pages(),
                                                   " pages: at most num_pages, and only on a TCP ticket"));
  }
  if (p.transfer_secret().size() != transport::kTransferSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ticket.transfer_secret must be ", transport::kTransferSecretBytes,
                                                   " bytes, got ", p.transfer_secret().size()));
  }
  t.endpoint = p.endpoint();
  t.transfer_id = p.transfer_id();
  t.n_tokens = static_cast<int64_t>(p.n_tokens());
  t.num_pages = static_cast<int64_t>(p.num_pages());
  t.page_bytes = static_cast<int64_t>(p.page_bytes());
  t.max_state_bytes = static_cast<int64_t>(p.max_state_bytes());
  t.secret = p.transfer_secret();
  t.held_pages = static_cast<int64_t>(p.held_pages());
  for (uint32_t slot : p.kv_page_slots()) t.page_slots.push_back(static_cast<int32_t>(slot));
  t.state_slot = static_cast<int32_t>(p.state_slot());
  if (p.has_deadline()) {
    t.deadline = absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(p.deadline()));
  }
  return t;
}

v1::ResumeKind ResumeKindToProto(ResumeKind kind) {
  switch (kind) {
    case ResumeKind::kCold:
      return v1::RESUME_KIND_COLD;
    case ResumeKind::kGridCheckpoint:
      return v1::RESUME_KIND_GRID_CHECKPOINT;
    case ResumeKind::kExactPrefix:
      return v1::RESUME_KIND_EXACT_PREFIX;
  }
  return v1::RESUME_KIND_UNSPECIFIED;
}

ResumeKind ResumeKindFromProto(v1::ResumeKind kind) {
  switch (kind) {
    case v1::RESUME_KIND_GRID_CHECKPOINT:
      return ResumeKind::kGridCheckpoint;
    case v1::RESUME_KIND_EXACT_PREFIX:
      return ResumeKind::kExactPrefix;
    default:
      return ResumeKind::kCold;
  }
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
  u->set_resume_kind(ResumeKindToProto(o.usage.resume_kind));
  out->mutable_transfer()->set_bytes(static_cast<uint64_t>(o.transfer_bytes));
  out->set_publishes_prompt(o.publishes_prompt);
  *out->mutable_transfer()->mutable_duration() =
      TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(o.transfer_time));
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
  o.usage.resume_kind = ResumeKindFromProto(p.usage().resume_kind());
  o.transfer_bytes = static_cast<int64_t>(p.transfer().bytes());
  o.publishes_prompt = p.publishes_prompt();
  o.transfer_time = absl::Nanoseconds(TimeUtil::DurationToNanoseconds(p.transfer().duration()));
  return o;
}

}  // namespace hybridserve::prefill
