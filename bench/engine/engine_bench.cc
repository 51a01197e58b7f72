// Engine throughput on a real model directory: prefill tokens/s and decode
// tokens/s (batch 1 and 8) per matmul mode and thread count, medians of a few
// repetitions. A quick first look; a plain main, run with -c opt:
//   bazel run -c opt //bench/engine:engine_bench [-- MODEL_DIR [PROMPT_TOKENS]]
// MODEL_DIR defaults to models/default (the embedded model, a data dependency).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "kernels/matmul_params.h"

namespace hybridserve::engine {
namespace {

constexpr int kRepetitions = 3;
constexpr int kDecodeSteps = 64;
constexpr int64_t kDecodePrompt = 128;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<TokenId> Tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

// Prefill tokens/s of one sequence of `n` tokens.
double PrefillRate(Model& model, int64_t n) {
  const std::vector<TokenId> prompt = Tokens(n, model.config().vocab_size, 1);
  std::vector<double> times;
  for (int r = 0; r < kRepetitions; ++r) {
    auto id = model.sequences().New();
    Check(id.status());
    const auto start = std::chrono::steady_clock::now();
    Check(model.Prefill(*id, prompt).status());
    times.push_back(Seconds(start));
    Check(model.sequences().Release(*id));
  }
  return static_cast<double>(n) / Median(times);
}

// Decode tokens/s (all sequences together) for `batch` sequences of kDecodePrompt tokens.
double DecodeRate(Model& model, int batch) {
  std::vector<double> times;
  for (int r = 0; r < kRepetitions; ++r) {
    std::vector<SequenceId> ids;
    for (int b = 0; b < batch; ++b) {
      auto id = model.sequences().New();
      Check(id.status());
      Check(model.Prefill(*id, Tokens(kDecodePrompt, model.config().vocab_size, 10 + b)).status());
      ids.push_back(*id);
    }
    const std::vector<TokenId> tokens(static_cast<size_t>(batch), 1);
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < kDecodeSteps; ++s) Check(model.DecodeStep(ids, tokens).status());
    times.push_back(Seconds(start));
    for (SequenceId id : ids) Check(model.sequences().Release(id));
  }
  return static_cast<double>(batch) * kDecodeSteps / Median(times);
}

int Main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "models/default";
  const int64_t prompt_tokens = argc > 2 ? std::atoll(argv[2]) : 2048;
  auto weights = ModelWeights::LoadDirectory(dir);
  Check(weights.status());
  const ModelConfig& config = (*weights)->config();
  std::printf("model %s: %s, hidden %lld, vocab %lld, %lld parameters\n", dir.c_str(), config.LayerPattern().c_str(),
              static_cast<long long>(config.hidden_size), static_cast<long long>(config.vocab_size),
              static_cast<long long>((*weights)->num_parameters()));
  std::printf("%-14s %8s %16s %16s %16s\n", "mode", "threads", "prefill tok/s", "decode b=1 tok/s", "decode b=8 tok/s");
  for (kernels::MatmulMode mode : {kernels::MatmulMode::kDeterministic, kernels::MatmulMode::kFast}) {
    for (int threads : {1, 2}) {
      ModelOptions options;
      options.matmul_mode = mode;
      options.num_threads = threads;
      options.max_sequences = 8;
      options.max_pages = 4096;
      auto model = Model::Create(config, **weights, options);
      Check(model.status());
      const double prefill = PrefillRate(**model, prompt_tokens);
      const double decode1 = DecodeRate(**model, 1);
      const double decode8 = DecodeRate(**model, 8);
      std::printf("%-14s %8d %16.0f %16.0f %16.0f\n",
                  mode == kernels::MatmulMode::kDeterministic ? "deterministic" : "fast", threads, prefill, decode1,
                  decode8);
    }
  }
  std::printf("(fast mode uses OpenBLAS's own threads; the thread count applies to the other kernels)\n");
  return 0;
}

}  // namespace
}  // namespace hybridserve::engine

int main(int argc, char** argv) { return hybridserve::engine::Main(argc, argv); }
