// Engine throughput for the figures, with the baselines measured in
// the same run: prefill tokens/s (prompts of 512, 2K, 8K), decode tokens/s at
// batch 1 and 8, and decode at batch 1 as a share of its memory-bandwidth
// bound (bytes of weights and state read per token over a read bandwidth
// measured here). Prints a table and one JSON line (for compare_llamacpp.py).
//
//   bazel run -c opt //bench/engine:throughput_bench -- MODEL_DIR [THREADS] [fast|deterministic]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "kernels/matmul_params.h"

namespace hybridserve::engine {
namespace {

constexpr int kRepetitions = 3;
constexpr int kDecodeSteps = 32;
constexpr int64_t kDecodeContext = 128;

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

std::vector<TokenId> Tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = static_cast<TokenId>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// Read bandwidth in bytes/s with `threads` threads over a buffer much larger
// than the caches: the ceiling for streaming weights in a decode step.
double ReadBandwidth(int threads) {
  const size_t words = size_t{1} << 27;  // 1 GiB of uint64
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i;
  std::vector<double> times;
  std::vector<uint64_t> sink(threads);
  for (int r = 0; r < 5; ++r) {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t begin = words * t / threads, end = words * (t + 1) / threads;
        uint64_t acc[8] = {};
        for (size_t i = begin; i + 8 <= end; i += 8) {
          for (int j = 0; j < 8; ++j) acc[j] ^= buf[i + j];  // vectorizes: XOR is associative
        }
        uint64_t x = 0;
        for (uint64_t a : acc) x ^= a;
        sink[t] = x;
      });
    }
    for (auto& th : pool) th.join();
    times.push_back(Seconds(start));
  }
  if (std::all_of(sink.begin(), sink.end(), [](uint64_t v) { return v == 42; })) std::printf(" ");
  return static_cast<double>(words * sizeof(uint64_t)) / *std::min_element(times.begin(), times.end());
}

// Seconds to prefill `n` tokens onto a sequence that already holds `history`
// (a chat's turn 2 after a resume), median of kRepetitions.
double ContinuationSeconds(Model& model, int64_t history, int64_t n) {
  const std::vector<TokenId> first = Tokens(history, model.config().vocab_size, 2);
  const std::vector<TokenId> next = Tokens(n, model.config().vocab_size, 3);
  std::vector<double> times;
  for (int r = 0; r < kRepetitions; ++r) {
    auto id = model.NewSequence();
    Check(id.status());
    if (history > 0) Check(model.Prefill(*id, first).status());
    const auto start = Clock::now();
    Check(model.Prefill(*id, next).status());
    times.push_back(Seconds(start));
    Check(model.ReleaseSequence(*id));
  }
  return Median(times);
}

double PrefillRate(Model& model, int64_t n) {
  const std::vector<TokenId> prompt = Tokens(n, model.config().vocab_size, 1);
  std::vector<double> times;
  for (int r = 0; r < kRepetitions; ++r) {
    auto id = model.NewSequence();
    Check(id.status());
    const auto start = Clock::now();
    Check(model.Prefill(*id, prompt).status());
    times.push_back(Seconds(start));
    Check(model.ReleaseSequence(*id));
  }
  return static_cast<double>(n) / Median(times);
}

double DecodeRate(Model& model, int batch) {
  std::vector<double> times;
  for (int r = 0; r < kRepetitions; ++r) {
    std::vector<SequenceId> ids;
    for (int b = 0; b < batch; ++b) {
      auto id = model.NewSequence();
      Check(id.status());
      Check(model.Prefill(*id, Tokens(kDecodeContext, model.config().vocab_size, 10 + b)).status());
      ids.push_back(*id);
    }
    const std::vector<TokenId> tokens(static_cast<size_t>(batch), 1);
    const auto start = Clock::now();
    for (int s = 0; s < kDecodeSteps; ++s) Check(model.DecodeStep(ids, tokens).status());
    times.push_back(Seconds(start));
    for (SequenceId id : ids) Check(model.ReleaseSequence(id));
  }
  return static_cast<double>(batch) * kDecodeSteps / Median(times);
}

// Bytes a batch-1 decode step must read: every weight except the embedding
// table (one row), the LM head (the embedding table itself when tied), the
// SSM and conv states (read and written), and the KV of the context.
double DecodeBytesPerToken(const ModelWeights& w) {
  const ModelConfig& c = w.config();
  const double embed = static_cast<double>(c.vocab_size) * c.hidden_size;
  double params = static_cast<double>(w.num_parameters());
  // The embedding table is not streamed per token (one row is), unless it is also the head.
  if (&w.lm_head() != &w.embeddings()) params -= embed;
  const auto& m = c.mamba;
  const double ssm = static_cast<double>(m.num_heads) * m.head_dim * m.state_size + m.conv_dim() * (m.conv_kernel - 1);
  const double kv = 2.0 * (kDecodeContext + kDecodeSteps / 2) * c.attention.num_kv_heads * c.attention.head_dim;
  return 4.0 * (params + 2 * ssm * c.CountLayers(LayerKind::kMamba2) + kv * c.CountLayers(LayerKind::kAttention));
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: throughput_bench MODEL_DIR [THREADS] [fast|deterministic] [decode]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const bool fast = argc > 3 && std::strcmp(argv[3], "fast") == 0;
  // "decode": only the decode figures (for profiling).
  const bool decode_only = argc > 4 && std::strcmp(argv[4], "decode") == 0;
  auto weights = ModelWeights::LoadDirectory(dir);
  Check(weights.status());
  const ModelConfig& config = (*weights)->config();
  ModelOptions options;
  options.matmul_mode = fast ? kernels::MatmulMode::kFast : kernels::MatmulMode::kDeterministic;
  options.num_threads = threads;
  options.max_sequences = 8;
  options.max_pages = 8192 / 16 + 8 * 64;
  auto model = Model::Create(config, **weights, options);
  Check(model.status());

  const double bandwidth = ReadBandwidth(threads);
  std::printf("model %s: %s, %lld parameters, %s matmul, %d threads\n", dir.c_str(), config.LayerPattern().c_str(),
              static_cast<long long>((*weights)->num_parameters()), fast ? "fast" : "deterministic", threads);
  std::vector<std::string> json;
  for (int64_t n : {512, 2048, 8192}) {
    if (decode_only) break;
    const double rate = PrefillRate(**model, n);
    std::printf("prefill %5lld tokens: %10.1f tok/s\n", static_cast<long long>(n), rate);
    json.push_back(absl::StrCat("\"prefill_", n, "\": ", rate));
  }
  for (int64_t history : {int64_t{0}, int64_t{1039}, int64_t{4111}, int64_t{8192}}) {
    if (decode_only) break;
    const double seconds = ContinuationSeconds(**model, history, 65);
    std::printf("prefill 65 tokens after %4lld: %7.1f ms (%.1f tok/s)\n", static_cast<long long>(history),
                1e3 * seconds, 65 / seconds);
    json.push_back(absl::StrCat("\"turn2_65_after_", history, "_ms\": ", 1e3 * seconds));
  }
  const double d1 = DecodeRate(**model, 1);
  const double d8 = DecodeRate(**model, 8);
  const double bytes = DecodeBytesPerToken(**weights);
  const double bound = bandwidth / bytes;
  std::printf("decode batch 1:       %10.1f tok/s\n", d1);
  std::printf("decode batch 8:       %10.1f tok/s (all sequences)\n", d8);
  std::printf(
      "read bandwidth %.1f GB/s, %.1f MB read per batch-1 token: bound %.1f tok/s; decode b=1 at %.0f%% of it\n",
      bandwidth / 1e9, bytes / 1e6, bound, 100.0 * d1 / bound);
  json.push_back(absl::StrCat("\"decode_b1\": ", d1));
  json.push_back(absl::StrCat("\"decode_b8\": ", d8));
  json.push_back(absl::StrCat("\"bandwidth_gbs\": ", bandwidth / 1e9));
  json.push_back(absl::StrCat("\"decode_b1_bound\": ", bound));
  json.push_back(absl::StrCat("\"threads\": ", threads));
  json.push_back(absl::StrCat("\"mode\": \"", fast ? "fast" : "deterministic", "\""));
  std::printf("JSON {%s}\n", absl::StrJoin(json, ", ").c_str());
  return 0;
}

}  // namespace
}  // namespace hybridserve::engine

int main(int argc, char** argv) { return hybridserve::engine::Main(argc, argv); }
