// Engine throughput under the comparison rules of bench/engine/compare_llamacpp.py
// (the same on the llama.cpp side, bench/llamacpp/run_llamacpp_bench.py):
//
//   prefill L   a fresh sequence, Model::Prefill of the prompt's first L tokens,
//               logits of the last token only; tok/s = L / median seconds; the
//               peak RSS of the process during the reps.
//   decode B    B sequences prefilled with their decode_context prompt tokens
//               (untimed, once; each rep decodes forks of them), then
//               decode_steps timed Model::DecodeStep calls; the greedy argmax
//               that picks the next tokens is outside the timed region (step 0
//               feeds the argmax of the prompt's last logits).
//   clean rule  a rep is clean when the CPU time used by other processes during
//               it (/proc/stat busy time less this process's) is at most
//               max_other_cpu x its wall time; reps are retried until `reps`
//               clean ones or `max_tries`; else the cleanest are used and the
//               figure is listed under "contended".
//   bandwidth   (--bandwidth) streaming-read probe with all threads, best of 5
//               passes over each of: a buffer the size of one decode step's
//               bytes (the cache behaviour decode itself sees) and 2 GiB (main
//               memory), each read as 1 and as 8 prefetched streams a thread;
//               the bound is the fastest. The share of decode B is
//               bytes per step / step time / that bandwidth.
//
//   --device=cuda runs the model on the GPU (engine/backend_registry.h); its
//               bandwidth bound is then the best of 5 device-to-device copies
//               of 1 GiB through the backend (bytes read + written / time), the
//               HBM figure a raw memcpy reaches on that GPU in the same run.
//
//   bazel build -c opt //bench/engine:throughput_bench
//   bazel-bin/bench/engine/throughput_bench --model=/tmp/hs-bench/nemotron_h [--tokens=FILE] [--bandwidth]
//
// Prints a line per figure with every rep's time, then one line `JSON {...}`.

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/proc_status.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "kernels/matmul_params.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json + safetensors)");
ABSL_FLAG(int32_t, threads, 2, "kernel threads (the calling thread included)");
ABSL_FLAG(std::string, mode, "deterministic", "matmul mode: deterministic or fast");
ABSL_FLAG(std::string, tokens, "",
          "JSON {\"prompt\": [...], \"decode_prompts\": [[...], ...]}; empty: seeded random ids");
ABSL_FLAG(std::string, prefill, "512,2048,8192", "prompt lengths (empty: none)");
ABSL_FLAG(int64_t, decode_context, 128, "prompt tokens of each decoded sequence");
ABSL_FLAG(int64_t, decode_steps, 64, "timed decode steps");
ABSL_FLAG(std::string, batches, "1,8", "decode batch sizes (empty: none)");
ABSL_FLAG(int32_t, reps, 3, "clean repetitions per figure (median reported)");
ABSL_FLAG(int32_t, max_tries, 12, "attempts per figure");
ABSL_FLAG(double, max_other_cpu, 0.10, "clean rule: other processes' CPU seconds per wall second");
ABSL_FLAG(bool, bandwidth, false, "run the read-bandwidth probe and report decode's share of the bound");
ABSL_FLAG(std::string, device, "cpu", "where the model runs: cpu or cuda");

namespace hybridserve::engine {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

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

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      std::fprintf(stderr, "bad list element \"%s\"\n", std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

// ---- Machine readings ----

// Busy CPU seconds of the whole machine (every core) since boot.
double MachineBusySeconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return static_cast<double>(user + nice + system + irq + softirq + steal) / sysconf(_SC_CLK_TCK);
}

// CPU seconds of this process (every thread) in the same clock-tick units.
double ProcessCpuSeconds() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  // Fields after the command name (which may hold spaces) start after ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    rest >> field;
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// This process's peak resident memory in MiB (VmHWM, common/proc_status),
// or -1 with a message when /proc cannot say: a figure that is not there is
// never printed as a small one.
double PeakRssMib() {
  absl::StatusOr<int64_t> peak = common::PeakResidentBytes(getpid());
  if (!peak.ok()) {
    std::fprintf(stderr, "peak RSS unreadable: %s\n", std::string(peak.status().message()).c_str());
    return -1;
  }
  return static_cast<double>(*peak) / (1 << 20);
}

// Starts a new peak (VmHWM reset to the current RSS), so a later reading is
// the peak since now.
void ResetPeakRss() {
  if (absl::Status s = common::ResetPeakResident(getpid()); !s.ok()) {
    std::fprintf(stderr, "peak RSS not reset (the reading counts from the start): %s\n",
                 std::string(s.message()).c_str());
  }
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::vector<std::string> SimdFlags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::vector<std::string> out;
    std::istringstream in(line.substr(line.find(':') + 1));
    std::string flag;
    while (in >> flag) {
      for (const char* want : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"}) {
        if (flag == want) out.push_back(flag);
      }
    }
    return out;
  }
  return {};
}

// ---- The clean-repetition rule ----

struct Rep {
  double seconds = 0;    // the timed region
  double other_cpu = 0;  // other processes' CPU seconds during the whole rep
  double value = 0;      // what the rep measured (tokens/s)
};

struct Figure {
  std::vector<Rep> attempts;
  std::vector<Rep> used;  // the clean reps, or the cleanest when too few
  bool clean = true;
};

// Runs `rep` (which returns its timed seconds and tokens/s) under the rule.
template <typename Fn>
Figure Measure(Fn rep) {
  const int reps = absl::GetFlag(FLAGS_reps);
  const double limit = absl::GetFlag(FLAGS_max_other_cpu);
  Figure f;
  int clean = 0;
  for (int attempt = 0; attempt < absl::GetFlag(FLAGS_max_tries) && clean < reps; ++attempt) {
    const double busy0 = MachineBusySeconds(), self0 = ProcessCpuSeconds();
    const auto start = Clock::now();
    Rep r = rep();
    const double wall = Seconds(start);
    r.other_cpu = std::max(0.0, (MachineBusySeconds() - busy0) - (ProcessCpuSeconds() - self0));
    if (r.other_cpu <= limit * wall) ++clean;
    f.attempts.push_back(r);
  }
  // The clean reps first (in order), then the cleanest others.
  std::vector<Rep> sorted = f.attempts;
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Rep& a, const Rep& b) {
    return a.other_cpu / std::max(a.seconds, 1e-9) < b.other_cpu / std::max(b.seconds, 1e-9);
  });
  f.clean = clean >= reps;
  for (const Rep& r : sorted) {
    if (static_cast<int>(f.used.size()) == reps) break;
    f.used.push_back(r);
  }
  return f;
}

json FigureJson(const Figure& f) {
  std::vector<double> values, s_all, other_all;
  for (const Rep& r : f.used) values.push_back(r.value);
  for (const Rep& r : f.attempts) {
    s_all.push_back(r.seconds);
    other_all.push_back(r.other_cpu);
  }
  return json{{"tok_s", Median(values)},
              {"tok_s_best", *std::max_element(values.begin(), values.end())},
              {"s_all", s_all},
              {"other_cpu_s_all", other_all},
              {"clean", f.clean}};
}

void PrintFigure(const std::string& name, const Figure& f) {
  std::vector<double> values;
  for (const Rep& r : f.used) values.push_back(r.value);
  std::printf("%-16s %10.1f tok/s (best %.1f)%s  reps:", name.c_str(), Median(values),
              *std::max_element(values.begin(), values.end()), f.clean ? "" : " CONTENDED");
  for (const Rep& r : f.attempts) std::printf(" %.4fs/other %.2fs", r.seconds, r.other_cpu);
  std::printf("\n");
  std::fflush(stdout);
}

// ---- Read bandwidth ----

// Device memory bandwidth: bytes moved (read + written) per second by the
// fastest of 5 device-to-device copies of `bytes` through `backend`.
double DeviceCopyBandwidth(kernels::Backend& backend, int64_t bytes) {
  kernels::DeviceBuffer src, dst;
  if (backend.Allocate(bytes, &src) != 0 || backend.Allocate(bytes, &dst) != 0) {
    std::fprintf(stderr, "cannot allocate 2 x %lld bytes for the bandwidth probe\n", static_cast<long long>(bytes));
    return 0;
  }
  double best = 1e30;
  for (int pass = 0; pass < 6; ++pass) {
    backend.Synchronize();
    const auto start = Clock::now();
    backend.CopyOnDevice(dst.data(), src.data(), bytes);
    backend.Synchronize();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (pass > 0) best = std::min(best, s);  // pass 0 warms up
  }
  return 2.0 * static_cast<double>(bytes) / best;
}

// Bytes/s of the fastest of 5 streaming reads of `bytes` with `threads`
// persistent threads (AVX2 loads). Each thread reads its share as `streams`
// interleaved sequential streams, each fetched 1 KiB ahead in software when
// streams > 1 (as the decode matmul reads its weight rows): one stream per
// core is bound by the hardware prefetcher's reach and reads less than a
// decode step does.
double ReadBandwidth(int64_t bytes, int threads, int streams) {
  const size_t n = static_cast<size_t>(bytes) / sizeof(float) / 32 * 32;
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  std::memset(buf, 0, n * sizeof(float));
  std::atomic<int> round{0}, finished{0};
  std::vector<float> sink(threads);
  auto part = [&](int t) {
    const size_t begin = n * t / threads / 32 * 32, end = n * (t + 1) / threads / 32 * 32;
    const size_t per = (end - begin) / streams / 32 * 32;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < per; i += 32) {
      for (int st = 0; st < streams; ++st) {
        const float* q = buf + begin + st * per + i;
        if (streams > 1) _mm_prefetch(reinterpret_cast<const char*>(q) + 1024, _MM_HINT_T0);
        a0 = _mm256_add_ps(a0, _mm256_load_ps(q));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(q + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(q + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(q + 24));
      }
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    sink[t] = s[0];
  };
  constexpr int kPasses = 5;
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int r = 1; r <= kPasses; ++r) {
        while (round.load(std::memory_order_acquire) < r) _mm_pause();
        part(t);
        finished.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  }
  double best = 1e30;
  for (int r = 1; r <= kPasses; ++r) {
    finished.store(0);
    const auto start = Clock::now();
    round.store(r, std::memory_order_release);
    part(0);
    while (finished.load(std::memory_order_acquire) < threads - 1) _mm_pause();
    best = std::min(best, Seconds(start));
  }
  for (std::thread& t : pool) t.join();
  std::free(buf);
  if (sink[0] == 1.5f) std::printf(" ");
  // What the threads read: each share rounded down to whole streams of 32 floats.
  size_t read_floats = 0;
  for (int t = 0; t < threads; ++t) {
    const size_t begin = n * t / threads / 32 * 32, end = n * (t + 1) / threads / 32 * 32;
    read_floats += (end - begin) / streams / 32 * 32 * streams;
  }
  return static_cast<double>(read_floats * sizeof(float)) / best;
}

// ---- The figures ----

struct Tokens {
  std::vector<TokenId> prompt;
  std::vector<std::vector<TokenId>> decode_prompts;
};

Tokens LoadTokens(const std::string& path, int64_t vocab, int64_t prompt_len, int64_t batches, int64_t ctx) {
  Tokens t;
  if (!path.empty()) {
    std::ifstream f(path);
    if (!f) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      std::exit(2);
    }
    const json j = json::parse(f);
    t.prompt = j.at("prompt").get<std::vector<TokenId>>();
    t.decode_prompts = j.at("decode_prompts").get<std::vector<std::vector<TokenId>>>();
  } else {
    std::mt19937_64 rng(1);
    auto ids = [&](int64_t n) {
      std::vector<TokenId> v(static_cast<size_t>(n));
      for (TokenId& x : v) x = static_cast<TokenId>(3 + rng() % static_cast<uint64_t>(vocab - 3));
      return v;
    };
    t.prompt = ids(prompt_len);
    for (int64_t b = 0; b < batches; ++b) t.decode_prompts.push_back(ids(ctx));
  }
  if (static_cast<int64_t>(t.prompt.size()) < prompt_len || static_cast<int64_t>(t.decode_prompts.size()) < batches) {
    std::fprintf(stderr, "token file too short: prompt %zu < %lld or %zu decode prompts < %lld\n", t.prompt.size(),
                 static_cast<long long>(prompt_len), t.decode_prompts.size(), static_cast<long long>(batches));
    std::exit(2);
  }
  for (int64_t b = 0; b < batches; ++b) {
    if (static_cast<int64_t>(t.decode_prompts[b].size()) < ctx) {
      std::fprintf(stderr, "decode prompt %lld has %zu tokens < decode_context %lld\n", static_cast<long long>(b),
                   t.decode_prompts[b].size(), static_cast<long long>(ctx));
      std::exit(2);
    }
  }
  return t;
}

TokenId Argmax(const float* logits, int64_t vocab) {
  return static_cast<TokenId>(std::max_element(logits, logits + vocab) - logits);
}

Figure PrefillFigure(Model& model, const std::vector<TokenId>& prompt, int64_t n, double* peak_rss_mib) {
  ResetPeakRss();
  const absl::Span<const TokenId> tokens(prompt.data(), static_cast<size_t>(n));
  Figure f = Measure([&] {
    auto id = model.sequences().New();
    Check(id.status());
    const auto start = Clock::now();
    Check(model.Prefill(*id, tokens).status());
    Rep r;
    r.seconds = Seconds(start);
    r.value = static_cast<double>(n) / r.seconds;
    Check(model.sequences().Release(*id));
    return r;
  });
  *peak_rss_mib = PeakRssMib();
  return f;
}

Figure DecodeFigure(Model& model, const Tokens& tokens, int64_t batch, int64_t ctx, int64_t steps) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<SequenceId> base;
  std::vector<TokenId> first;
  for (int64_t b = 0; b < batch; ++b) {
    auto id = model.sequences().New();
    Check(id.status());
    const auto& p = tokens.decode_prompts[static_cast<size_t>(b)];
    auto result = model.Prefill(*id, absl::Span<const TokenId>(p.data(), static_cast<size_t>(ctx)));
    Check(result.status());
    first.push_back(Argmax(result->logits.data(), vocab));
    base.push_back(*id);
  }
  {
    // Warm-up, untimed, as llama.cpp's side does (run_llamacpp_bench.py:
    // two greedy steps for this batch shape): the workspace grown to this
    // batch, the forks' first pages touched.
    std::vector<SequenceId> ids;
    for (SequenceId id : base) {
      auto fork = model.sequences().Fork(id);
      Check(fork.status());
      ids.push_back(*fork);
    }
    for (int s = 0; s < 2; ++s) Check(model.DecodeStep(ids, first).status());
    for (SequenceId id : ids) Check(model.sequences().Release(id));
  }
  Figure f = Measure([&] {
    std::vector<SequenceId> ids;
    for (SequenceId id : base) {
      auto fork = model.sequences().Fork(id);
      Check(fork.status());
      ids.push_back(*fork);
    }
    std::vector<TokenId> next = first;
    double timed = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const auto start = Clock::now();
      auto logits = model.DecodeStep(ids, next);
      timed += Seconds(start);
      Check(logits.status());
      for (int64_t b = 0; b < batch; ++b) next[static_cast<size_t>(b)] = Argmax(logits->data() + b * vocab, vocab);
    }
    for (SequenceId id : ids) Check(model.sequences().Release(id));
    Rep r;
    r.seconds = timed;
    r.value = static_cast<double>(batch * steps) / timed;
    return r;
  });
  for (SequenceId id : base) Check(model.sequences().Release(id));
  return f;
}

// Experts a decode step of `batch` sequences reads in one mixture-of-experts
// block: top_k for one sequence; for more, the expected number of distinct
// experts when every sequence picks its top_k independently and uniformly,
// num_experts * (1 - (1 - top_k / num_experts)^batch). Real routing is not
// uniform, so above b = 1 this is an estimate.
double ExpectedExpertsRead(const MoeParams& moe, int64_t batch) {
  const double e = static_cast<double>(moe.num_experts);
  if (batch <= 1) return static_cast<double>(moe.top_k);
  return e * (1.0 - std::pow(1.0 - static_cast<double>(moe.top_k) / e, static_cast<double>(batch)));
}

// Bytes one decode step of `batch` sequences must move: every weight except
// the embedding table (one row per sequence is read), unless it is also the
// head, and except the routed experts no sequence picks (a mixture-of-experts
// block reads its router, its shared expert and ExpectedExpertsRead experts);
// per sequence the SSM, Gated DeltaNet and conv states (read and written) and
// the KV of its context (on average ctx + steps / 2 tokens).
double DecodeBytesPerStep(const ModelWeights& w, int64_t batch, int64_t ctx, int64_t steps) {
  const ModelConfig& c = w.config();
  double bytes = static_cast<double>(w.resident_bytes());
  const double embed = static_cast<double>(w.embeddings().bytes());
  if (&w.lm_head() != &w.embeddings()) bytes -= embed;
  bytes += batch * embed / c.vocab_size;
  for (const LayerWeights& layer : w.layers()) {
    if (layer.kind != LayerKind::kMoe) continue;
    const MoeLayerWeights& moe = layer.moe();
    const double per_expert =
        static_cast<double>(moe.experts_up.bytes() + moe.experts_down.bytes()) / c.moe.num_experts;
    bytes -= (c.moe.num_experts - ExpectedExpertsRead(c.moe, batch)) * per_expert;
  }
  const auto& m = c.mamba;
  const double state = 4.0 * (static_cast<double>(m.num_heads) * m.head_dim * m.state_size +
                              static_cast<double>(m.conv_dim()) * (m.conv_kernel - 1));
  bytes += batch * 2.0 * state * c.CountLayers(LayerKind::kMamba2);
  const auto& g = c.gdn;
  const double gdn_state = 4.0 * (static_cast<double>(g.num_v_heads) * g.k_head_dim * g.v_head_dim +
                                  static_cast<double>(g.conv_dim()) * (g.conv_kernel - 1));
  bytes += batch * 2.0 * gdn_state * c.CountLayers(LayerKind::kGatedDeltaNet);
  const double kv = 4.0 * 2.0 * (ctx + steps / 2.0) * c.attention.num_kv_heads * c.attention.head_dim;
  bytes += batch * kv * c.CountLayers(LayerKind::kAttention);
  return bytes;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    std::fprintf(stderr, "--model is required\n");
    return 2;
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "deterministic" && mode != "fast") {
    std::fprintf(stderr, "--mode must be deterministic or fast\n");
    return 2;
  }
  const std::vector<int64_t> lengths = ParseList(absl::GetFlag(FLAGS_prefill));
  const std::vector<int64_t> batches = ParseList(absl::GetFlag(FLAGS_batches));
  const int64_t ctx = absl::GetFlag(FLAGS_decode_context);
  const int64_t steps = absl::GetFlag(FLAGS_decode_steps);
  const int64_t max_len = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  const int64_t max_batch = batches.empty() ? 0 : *std::max_element(batches.begin(), batches.end());

  auto weights = ModelWeights::LoadDirectory(dir);
  Check(weights.status());
  const ModelConfig& config = (*weights)->config();
  ModelOptions options;
  options.matmul_mode = mode == "fast" ? kernels::MatmulMode::kFast : kernels::MatmulMode::kDeterministic;
  options.num_threads = threads;
  auto device = ParseDevice(absl::GetFlag(FLAGS_device));
  Check(device.status());
  options.device = *device;
  options.max_sequences = std::max<int64_t>(8, 2 * max_batch);
  const int64_t page = std::min<int64_t>(16, config.chunk_size() > 0 ? config.chunk_size() : 16);
  // The longest prompt, plus two copies (base and fork) of every decoded sequence.
  options.max_pages = (max_len + page - 1) / page + 2 * max_batch * ((ctx + steps + page - 1) / page + 1) + 8;
  auto model = Model::Create(config, **weights, options);
  Check(model.status());
  const Tokens tokens = LoadTokens(absl::GetFlag(FLAGS_tokens), config.vocab_size, max_len, max_batch, ctx);

  const std::string dtype = (*weights)->has_bf16_matrices() ? "bf16" : "f32";
  const std::string path = (*model)->backend().variant();
  std::printf("model %s: %s, %lld parameters, %s weights (%.1f MB), %s matmul, %s kernels, %d threads\n", dir.c_str(),
              config.LayerPattern().c_str(), static_cast<long long>((*weights)->num_parameters()), dtype.c_str(),
              (*weights)->resident_bytes() / 1e6, mode.c_str(), path.c_str(), threads);
  json out{{"engine", "hybridserve"},
           {"model", dir},
           {"dtype", dtype},
           {"threads", threads},
           {"device", absl::GetFlag(FLAGS_device)},
           {"mode", mode},
           {"kernel_path", path},
           {"cpu", CpuModel()},
           {"cpu_flags", SimdFlags()},
           {"version", "unknown"},
           {"decode_context", ctx},
           {"decode_steps", steps},
           {"reps", absl::GetFlag(FLAGS_reps)},
           {"max_other_cpu", absl::GetFlag(FLAGS_max_other_cpu)},
           {"weight_bytes", (*weights)->resident_bytes()},
           {"prefill", json::object()},
           {"decode", json::object()},
           {"contended", json::array()}};

  double bandwidth = 0;
  double peak_rss = PeakRssMib();
  if (absl::GetFlag(FLAGS_bandwidth) && options.device == Device::kCuda) {
    bandwidth = DeviceCopyBandwidth((*model)->backend(), int64_t{1} << 30);
    std::printf("device copy bandwidth (read + write) over 1 GiB: %.1f GB/s\n", bandwidth / 1e9);
    out["bandwidth_gbs"] = bandwidth / 1e9;
  } else if (absl::GetFlag(FLAGS_bandwidth)) {
    const double step_bytes = DecodeBytesPerStep(**weights, 1, ctx, steps);
    double working_set = 0, main_memory = 0;
    for (int streams : {1, 8}) {
      working_set = std::max(working_set, ReadBandwidth(static_cast<int64_t>(step_bytes), threads, streams));
      main_memory = std::max(main_memory, ReadBandwidth(int64_t{2} << 30, threads, streams));
    }
    bandwidth = std::max(working_set, main_memory);
    std::printf(
        "read bandwidth, %d threads, best of 1 and 8 streams a thread: %.1f GB/s over %.0f MB (one decode step's "
        "bytes), %.1f GB/s over 2 GiB\n",
        threads, working_set / 1e9, step_bytes / 1e6, main_memory / 1e9);
    out["bandwidth_gbs"] = bandwidth / 1e9;
    out["bandwidth_working_set_gbs"] = working_set / 1e9;
    out["bandwidth_2gib_gbs"] = main_memory / 1e9;
  } else {
    out["bandwidth_gbs"] = nullptr;
  }

  for (int64_t n : lengths) {
    double peak = 0;
    const Figure f = PrefillFigure(**model, tokens.prompt, n, &peak);
    const std::string key = std::to_string(n);
    PrintFigure("prefill " + key, f);
    std::printf("%-16s peak RSS %.0f MiB\n", "", peak);
    out["prefill"][key] = FigureJson(f);
    out["prefill"][key]["peak_rss_mib"] = peak;
    peak_rss = std::max(peak_rss, peak);
    if (!f.clean) out["contended"].push_back("prefill_" + key);
  }
  for (int64_t b : batches) {
    const Figure f = DecodeFigure(**model, tokens, b, ctx, steps);
    const std::string key = std::to_string(b);
    PrintFigure("decode b=" + key, f);
    json j = FigureJson(f);
    const double bytes = DecodeBytesPerStep(**weights, b, ctx, steps);
    j["bytes_per_step"] = bytes;
    if (bandwidth > 0) {
      const double share = bytes * (j["tok_s"].get<double>() / static_cast<double>(b)) / bandwidth;
      j["bandwidth_share"] = share;
      std::printf("%-16s %.0f MB per step: %.0f%% of the read-bandwidth bound\n", "", bytes / 1e6, 100 * share);
    } else {
      j["bandwidth_share"] = nullptr;
    }
    out["decode"][key] = j;
    if (!f.clean) out["contended"].push_back("decode_" + key);
  }
  out["peak_rss_mib"] = std::max(peak_rss, PeakRssMib());
  std::printf("JSON %s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace hybridserve::engine

int main(int argc, char** argv) { return hybridserve::engine::Main(argc, argv); }
