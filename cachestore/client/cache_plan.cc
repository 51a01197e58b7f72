#include "cachestore/client/cache_plan.h"

namespace hybridserve::cachestore {

CachePlan::CachePlan(const ClientNamespace& ns, absl::Span<const TokenId> tokens)
    : ns_(ns), root_(ns.Key()), tokens_(tokens), page_keys_(PageKeys(root_, tokens, ns.page_size)) {}

std::optional<common::Hash128> CachePlan::StateParent(int64_t p) const {
  const int64_t n = p / page_size();
  if (n == 0) return std::nullopt;
  return page_keys_[static_cast<size_t>(n - 1)];
}

absl::Span<const TokenId> CachePlan::StateTail(int64_t p) const {
  const int64_t start = p / page_size() * page_size();
  return tokens_.subspan(static_cast<size_t>(start), static_cast<size_t>(p - start));
}

common::Hash128 CachePlan::StateKeyAt(int64_t p) const {
  return StateKey(StateParent(p).value_or(root_), StateTail(p));
}

ClientPut CachePlan::StatePut(int64_t p, StateKind kind) const {
  ClientPut put;
  put.entry_class = EntryClass::kState;
  put.parent = StateParent(p);
  const absl::Span<const TokenId> tail = StateTail(p);
  put.tokens.assign(tail.begin(), tail.end());
  put.state_kind = kind;
  put.position = p;
  return put;
}

ClientPut CachePlan::PagePut(int64_t i) const {
  ClientPut put;
  put.entry_class = EntryClass::kPage;
  if (i > 0) put.parent = page_keys_[static_cast<size_t>(i - 1)];
  const absl::Span<const TokenId> page =
      tokens_.subspan(static_cast<size_t>(i * page_size()), static_cast<size_t>(page_size()));
  put.tokens.assign(page.begin(), page.end());
  return put;
}

}  // namespace hybridserve::cachestore
