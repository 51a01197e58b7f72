#ifndef HYBRIDSERVE_CACHESTORE_MODEL_NAMESPACE_H_
#define HYBRIDSERVE_CACHESTORE_MODEL_NAMESPACE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "cachestore/cache_client.h"
#include "common/prefill_cost.h"

namespace hybridserve::cachestore {

// The part of every namespace that is the worker's: its model's weights,
// adapter, page size and prefill cost. A request adds its tenant and cache
// salt (For). Value type.
struct ModelNamespace {
  std::string model_fingerprint;  // hex (common::Hash128::ToHex of the weights' fingerprint)
  std::string adapter;            // "" for the base model
  int32_t page_size = 0;
  // engine::ModelPrefillCost of the model: registered with every namespace
  // this worker puts into (ClientNamespace::model_cost).
  std::optional<PrefillCost> model_cost;
  ClientNamespace For(const std::string& tenant, const std::string& cache_salt) const;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_MODEL_NAMESPACE_H_
