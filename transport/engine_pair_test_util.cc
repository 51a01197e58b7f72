#include "transport/engine_pair_test_util.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hybridserve::transport {

absl::StatusOr<EnginePair> MakeEnginePair() {
  EnginePair pair;
  ASSIGN_OR_RETURN(pair.weights, engine::ModelWeights::LoadDirectory(Runfile(kTinyModelDir)));
  engine::ModelOptions o;
  o.page_size = 16;
  o.max_pages = 64;
  o.max_sequences = 4;
  ASSIGN_OR_RETURN(pair.prefill, engine::Model::Create(pair.weights->config(), *pair.weights, o));
  ASSIGN_OR_RETURN(pair.decode, engine::Model::Create(pair.weights->config(), *pair.weights, o));
  return pair;
}

}  // namespace hybridserve::transport
