#include "cachestore/server/put_header.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tokens.h"

namespace hybridserve::cachestore {
namespace {

// The model cost `ns` carries (nullopt when unset), unchecked.
std::optional<PrefillCost> ModelCostOf(const v1::CacheNamespace& ns) {
  if (!ns.has_model_cost()) return std::nullopt;
  return PrefillCost{ns.model_cost().flops_per_token(), ns.model_cost().flops_per_token_context()};
}

}  // namespace

absl::StatusOr<Hash128> NamespaceOf(const v1::CacheNamespace& ns) {
  RETURN_IF_ERROR(CheckModelCost(ModelCostOf(ns)));
  return ValidatedNamespaceKey(ns.model_fingerprint(), ns.adapter(), ns.tenant(), ns.cache_salt(), ns.page_size(),
                               ns.key_version());
}

absl::StatusOr<PutSpec> SpecOf(const v1::PutHeader& h) {
  PutSpec spec;
  ASSIGN_OR_RETURN(spec.ns, NamespaceOf(h.namespace_()));
  spec.model_cost = ModelCostOf(h.namespace_());
  spec.tenant = h.namespace_().tenant();
  spec.page_size = static_cast<int32_t>(h.namespace_().page_size());
  switch (h.entry_class()) {
    case v1::ENTRY_CLASS_PAGE:
      spec.entry_class = EntryClass::kPage;
      break;
    case v1::ENTRY_CLASS_STATE:
      spec.entry_class = EntryClass::kState;
      switch (h.state_kind()) {
        case v1::STATE_KIND_GRID_CHECKPOINT:
          spec.state_kind = StateKind::kGridCheckpoint;
          break;
        case v1::STATE_KIND_EXACT_PREFIX:
          spec.state_kind = StateKind::kExactPrefix;
          break;
        default:
          return absl::InvalidArgumentError("header.state_kind must be GRID_CHECKPOINT or EXACT_PREFIX");
      }
      break;
    default:
      return absl::InvalidArgumentError("header.entry_class must be PAGE or STATE");
  }
  if (!h.parent_key().empty()) {
    Hash128 parent;
    if (!Hash128::FromBytes(h.parent_key(), &parent)) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.parent_key must be 16 bytes, got ", h.parent_key().size()));
    }
    spec.parent = parent;
  }
  if (h.token_ids_size() > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("header carries ", h.token_ids_size(), " tokens"));
  }
  spec.tokens.assign(h.token_ids().begin(), h.token_ids().end());
  if (h.position() > static_cast<uint64_t>(INT64_MAX) || h.size_bytes() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError("header.position or header.size_bytes out of range");
  }
  spec.position = static_cast<int64_t>(h.position());
  spec.size_bytes = static_cast<int64_t>(h.size_bytes());
  if (h.has_ttl()) {
    if (h.ttl().seconds() < 0 || h.ttl().nanos() < 0 || h.ttl().nanos() >= 1000000000) {
      return absl::InvalidArgumentError("header.ttl must be a non-negative duration");
    }
    spec.ttl = absl::Seconds(h.ttl().seconds()) + absl::Nanoseconds(h.ttl().nanos());
  }
  spec.pin = h.pin();
  return spec;
}

v1::PutResponse AnswerOf(const PutSession& session) {
  v1::PutResponse answer;
  answer.set_key(session.key().ToBytes());
  const Reservation& granted = session.reservation();
  if (granted.ttl > absl::ZeroDuration()) {
    const int64_t seconds = absl::ToInt64Seconds(granted.ttl);
    answer.mutable_ttl()->set_seconds(seconds);
    answer.mutable_ttl()->set_nanos(
        static_cast<int32_t>(absl::ToInt64Nanoseconds(granted.ttl - absl::Seconds(seconds))));
  }
  answer.set_pinned(granted.pinned);
  answer.set_pin_refused_reason(granted.pin_refused);
  answer.set_already_present(session.already_present());
  return answer;
}

absl::StatusOr<std::unique_ptr<PutSession>> BeginDirectPut(CacheStore& store, absl::string_view header_bytes,
                                                           uint64_t size) {
  v1::PutHeader header;
  if (!header.ParseFromArray(header_bytes.data(), static_cast<int>(header_bytes.size()))) {
    return absl::InvalidArgumentError("malformed PutHeader");
  }
  ASSIGN_OR_RETURN(const PutSpec spec, SpecOf(header));
  if (header.size_bytes() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the header's size_bytes ", header.size_bytes(), " is not the entry's size ", size));
  }
  return store.BeginPut(spec);
}

std::string DirectPutAnswer(uint32_t index, const absl::Status& status, const PutSession* session,
                            size_t max_message_bytes) {
  v1::PutManyResponse answer;
  answer.set_index(index);
  if (!status.ok()) {
    answer.set_code(static_cast<int32_t>(status.code()));
    answer.set_message(std::string(status.message().substr(0, max_message_bytes)));
  } else if (session != nullptr) {
    *answer.mutable_result() = AnswerOf(*session);
  }
  return answer.SerializeAsString();
}

}  // namespace hybridserve::cachestore
