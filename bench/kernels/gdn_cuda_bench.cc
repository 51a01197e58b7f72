// Our CUDA GatedDeltaPrefill (the chunked gated delta rule) timed on the shapes
// bench/kernels/gdn_fla_anchor.py gives flash-linear-attention's
// chunk_gated_delta_rule, so that script can print ours / fla from one run.
//
// Per --seqlens L: one sequence of L tokens from position 0, chunk 64
// (transformers' and fla's), q/k/v packed fp32, l2norm of q and k in the kernel
// (Qwen3-Next calls the rule with use_qk_l2norm_in_kernel), zero initial state,
// the final state written, no chunk states. Inputs are seeded uniform values
// (q, k, v in [-1, 1], g in [-0.1, 0], beta in [0, 1]); the time does not
// depend on them. Every figure is the best of --reps timed batches of --calls
// calls, each batch ended by Backend::Synchronize (host clock), as
// cuda_kernels_bench.
//
//   bazel build -c opt //bench/kernels:gdn_cuda_bench
//   bazel-bin/bench/kernels/gdn_cuda_bench                      # Qwen3-Next-80B's GDN, 2K and 8K tokens
//   bazel-bin/bench/kernels/gdn_cuda_bench --emulated --seqlens=96 --n_k_heads=2 --n_v_heads=4 --dk=16 --dv=16
//                                                               # the code path on the CPU emulator
//
// Prints one line per length, then `JSON {...}` (the anchor script reads it).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/kernels/device_bench_util.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/gated_delta_params.h"

ABSL_FLAG(bool, emulated, false,
          "run on the CPU emulator of the CUDA backend (checks the code path; times mean nothing)");
ABSL_FLAG(std::string, seqlens, "2048,8192", "prefill lengths, comma separated");
// Qwen3-Next-80B-A3B's Gated DeltaNet (linear_num_key_heads 16, linear_num_value_heads 32, 128 x 128).
ABSL_FLAG(int64_t, n_k_heads, 16, "key heads");
ABSL_FLAG(int64_t, n_v_heads, 32, "value heads (a multiple of n_k_heads)");
ABSL_FLAG(int64_t, dk, 128, "key head dim");
ABSL_FLAG(int64_t, dv, 128, "value head dim");
ABSL_FLAG(int64_t, chunk_size, 64, "chunk of the rule (a power of two)");
ABSL_FLAG(int32_t, reps, 5, "timed batches per figure (best reported)");
ABSL_FLAG(int32_t, calls, 10, "calls per timed batch");

namespace hybridserve::bench {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;
using nlohmann::json;

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool emulated = absl::GetFlag(FLAGS_emulated);
  std::vector<int64_t> seqlens;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_seqlens), ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n <= 0) {
      std::fprintf(stderr, "--seqlens: '%s' is not a positive integer\n", std::string(s).c_str());
      return 2;
    }
    seqlens.push_back(n);
  }
  kernels::GatedDeltaParams shape;
  shape.n_k_heads = absl::GetFlag(FLAGS_n_k_heads);
  shape.n_v_heads = absl::GetFlag(FLAGS_n_v_heads);
  shape.dk = absl::GetFlag(FLAGS_dk);
  shape.dv = absl::GetFlag(FLAGS_dv);
  shape.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  const char* bad = nullptr;
  if (kernels::CheckGatedDeltaParams(shape, &bad) != kernels::kKernelOk) {
    std::fprintf(stderr, "invalid shape: %s\n", bad);
    return 2;
  }

  std::string error;
  kernels::CudaBackendOptions options;
  options.workspace_bytes = int64_t{256} << 20;
  std::unique_ptr<Backend> backend = emulated ? kernels::cuda_emu::CreateCudaBackend(options, &error)
                                              : kernels::cuda::CreateCudaBackend(options, &error);
  if (backend == nullptr) {
    std::fprintf(stderr, "no CUDA backend: %s\n", error.c_str());
    return 1;
  }
  Backend& b = *backend;
  std::printf("device: %s%s\n", b.variant(), emulated ? " (times are the emulator's and mean nothing)" : "");
  json out{{"device", b.variant()},          {"emulated", emulated},    {"n_k_heads", shape.n_k_heads},
           {"n_v_heads", shape.n_v_heads},   {"dk", shape.dk},          {"dv", shape.dv},
           {"chunk_size", shape.chunk_size}, {"prefill", json::array()}};

  const int64_t hk = shape.n_k_heads * shape.dk, hv = shape.n_v_heads * shape.dv;
  const int64_t state_floats = shape.n_v_heads * shape.dk * shape.dv;
  for (int64_t seqlen : seqlens) {
    DeviceBuffer q = Random(b, seqlen * hk, -1, 1, 1), k = Random(b, seqlen * hk, -1, 1, 2);
    DeviceBuffer v = Random(b, seqlen * hv, -1, 1, 3);
    DeviceBuffer g = Random(b, seqlen * shape.n_v_heads, -0.1f, 0, 4);
    DeviceBuffer beta = Random(b, seqlen * shape.n_v_heads, 0, 1, 5);
    DeviceBuffer o, final_state;
    Check(b.Allocate(seqlen * hv * 4, &o), "Allocate");
    Check(b.Allocate(state_floats * 4, &final_state), "Allocate");
    kernels::GatedDeltaParams p = shape;
    p.q = q.as<float>();
    p.k = k.as<float>();
    p.v = v.as<float>();
    p.g = g.as<float>();
    p.beta = beta.as<float>();
    p.o = o.as<float>();
    p.final_state = final_state.as<float>();
    p.seqlen = seqlen;
    const double s = SecondsPerCall(b, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_calls),
                                    [&] { Check(b.GatedDeltaPrefill(p), "GatedDeltaPrefill"); });
    std::printf("gated delta prefill %6lld tokens: %9.3f ms, %.3g tokens/s\n", static_cast<long long>(seqlen), s * 1e3,
                seqlen / s);
    out["prefill"].push_back({{"seqlen", seqlen}, {"ms", s * 1e3}, {"tok_s", seqlen / s}});
  }
  std::printf("JSON %s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace hybridserve::bench

int main(int argc, char** argv) { return hybridserve::bench::Main(argc, argv); }
