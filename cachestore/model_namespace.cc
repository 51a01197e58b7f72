#include "cachestore/model_namespace.h"

namespace hybridserve::cachestore {

ClientNamespace ModelNamespace::For(const std::string& tenant, const std::string& cache_salt,
                                    absl::Span<const TokenId> chain_tokens) const {
  ClientNamespace ns;
  ns.model_fingerprint = model_fingerprint;
  ns.adapter = adapter;
  ns.tenant = tenant;
  ns.cache_salt = cache_salt;
  ns.page_size = page_size;
  ns.model_cost = model_cost;
  ns.placement = ChainKeyOf(ns, chain_tokens);
  return ns;
}

}  // namespace hybridserve::cachestore
