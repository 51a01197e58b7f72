#ifndef HYBRIDSERVE_TRANSPORT_ENGINE_PAIR_TEST_UTIL_H_
#define HYBRIDSERVE_TRANSPORT_ENGINE_PAIR_TEST_UTIL_H_

// Test-only: the golden tiny model loaded into two engines, a prefill side
// and a decode side, for the data plane's end-to-end tests.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/runfiles.h"
#include "engine/model.h"
#include "engine/model_weights.h"

namespace hybridserve::transport {

inline constexpr char kTinyModelDir[] = "tests/fixtures/golden/nemotron_h_tiny";

using common::Runfile;

struct EnginePair {
  std::unique_ptr<engine::ModelWeights> weights;
  std::unique_ptr<engine::Model> prefill;
  std::unique_ptr<engine::Model> decode;
};

// kTinyModelDir's weights and two engines over them on the CPU backend (page
// size 16, 64 pages, 4 sequences). The loader's or the model's error.
absl::StatusOr<EnginePair> MakeEnginePair();

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_ENGINE_PAIR_TEST_UTIL_H_
