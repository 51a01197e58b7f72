#ifndef HYBRIDSERVE_CACHESTORE_MODEL_NAMESPACE_H_
#define HYBRIDSERVE_CACHESTORE_MODEL_NAMESPACE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "cachestore/cache_client.h"
#include "common/prefill_cost.h"

namespace hybridserve::cachestore {

// The part of every namespace that is the worker's: its model's weights,
// adapter, page size and prefill cost. A request adds its tenant, cache salt
// and placement (For). Value type.
struct ModelNamespace {
  std::string model_fingerprint;  // hex (common::Hash128::ToHex of the weights' fingerprint)
  std::string adapter;            // "" for the base model
  int32_t page_size = 0;
  // engine::ModelPrefillCost of the model: registered with every namespace
  // this worker puts into (ClientNamespace::model_cost).
  std::optional<PrefillCost> model_cost;
  // The namespace of a request, placed (ClientNamespace::placement) by the
  // chain of `chain_tokens`: the tokens whose prefix the entries put in it
  // extend and the next lookup names (prefill: the prompt; decode's turn end:
  // the tokens fed, whose first page may complete only in the reply).
  ClientNamespace For(const std::string& tenant, const std::string& cache_salt,
                      absl::Span<const TokenId> chain_tokens) const;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_MODEL_NAMESPACE_H_
