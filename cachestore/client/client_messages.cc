#include "cachestore/client/client_messages.h"

#include <cstdint>

#include "absl/time/time.h"
#include "cachestore/keys.h"

namespace hybridserve::cachestore {

v1::CacheNamespace NamespaceMessage(const ClientNamespace& ns) {
  v1::CacheNamespace out;
  out.set_model_fingerprint(ns.model_fingerprint);
  out.set_adapter(ns.adapter);
  out.set_tenant(ns.tenant);
  out.set_cache_salt(ns.cache_salt);
  out.set_page_size(static_cast<uint32_t>(ns.page_size));
  out.set_key_version(kKeyVersion);  // the derivation of the parent keys this client sends
  if (ns.model_cost.has_value()) {
    out.mutable_model_cost()->set_flops_per_token(ns.model_cost->flops_per_token);
    out.mutable_model_cost()->set_flops_per_token_context(ns.model_cost->flops_per_token_context);
  }
  return out;
}

v1::PutHeader PutHeaderMessage(const v1::CacheNamespace& ns, const ClientPut& put, size_t size) {
  v1::PutHeader h;
  *h.mutable_namespace_() = ns;
  h.set_entry_class(put.entry_class == EntryClass::kPage ? v1::ENTRY_CLASS_PAGE : v1::ENTRY_CLASS_STATE);
  if (put.parent.has_value()) h.set_parent_key(put.parent->ToBytes());
  h.mutable_token_ids()->Add(put.tokens.begin(), put.tokens.end());
  if (put.entry_class == EntryClass::kState) {
    h.set_state_kind(put.state_kind == StateKind::kGridCheckpoint ? v1::STATE_KIND_GRID_CHECKPOINT
                                                                  : v1::STATE_KIND_EXACT_PREFIX);
    h.set_position(static_cast<uint64_t>(put.position));
  }
  // States only: the server refuses retention on a page.
  if (put.ttl != absl::ZeroDuration()) {
    const int64_t nanos = absl::ToInt64Nanoseconds(put.ttl);
    h.mutable_ttl()->set_seconds(nanos / 1000000000);
    h.mutable_ttl()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
  }
  h.set_pin(put.pin);
  h.set_size_bytes(size);
  return h;
}

absl::StatusOr<PutResult> PutResultOf(const v1::PutResponse& resp) {
  PutResult r;
  if (!Hash128::FromBytes(resp.key(), &r.key)) return absl::InternalError("cachestore sent a malformed key");
  r.already_present = resp.already_present();
  if (resp.has_ttl()) r.ttl = absl::Seconds(resp.ttl().seconds()) + absl::Nanoseconds(resp.ttl().nanos());
  r.pinned = resp.pinned();
  r.pin_refused = resp.pin_refused_reason();
  return r;
}

}  // namespace hybridserve::cachestore
