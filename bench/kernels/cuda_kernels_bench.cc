// CUDA kernel benchmarks, each against a baseline measured in the same run:
//
//   copy       device-to-device copy of 1 GiB through the backend: the HBM
//              bandwidth a raw memcpy reaches (bytes read + written / time).
//   ssu B      SelectiveStateUpdate at batch B (1..256) at granite-4.0-h-small's
//              Mamba dimensions (128 heads x 64 x d_state 128, 1 group, with D
//              and the z gate): bytes moved per call (the state read and
//              written once, x, z, dt, B, C read, y written) / time, as a share
//              of the copy bandwidth and of --hbm_peak_gbs (the GPU's nominal
//              peak; 3350 GB/s is an H100 SXM's). Goal >= 88 % of peak.
//   ssd L      SsdChunkScan prefill of L tokens at the same dimensions (chunk
//              256), tokens/s; the published anchor on an H100 is 1.1-2.4e7
//              tokens/s (vLLM's mamba_chunk_scan), printed beside it.
//   matmul     Matmul decode (m = 1, 8, 64) at 4096 x 4096 with bf16 and fp32
//              weights, deterministic and fast: weight bytes / time as a share
//              of the copy bandwidth.
//
// Every figure is the best of --reps timed batches of --calls calls, each
// batch ended by Backend::Synchronize (host clock).
//
//   bazel build -c opt //bench/kernels:cuda_kernels_bench
//   bazel-bin/bench/kernels/cuda_kernels_bench            # on a machine with a GPU
//   bazel-bin/bench/kernels/cuda_kernels_bench --emulated --small   # the code path, on the CPU emulator
//
// Prints one line per figure, then `JSON {...}`.

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
#include "bench/kernels/device_bench_util.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

ABSL_FLAG(bool, emulated, false,
          "run on the CPU emulator of the CUDA backend (checks the code path; times mean nothing)");
ABSL_FLAG(bool, small, false, "small shapes (for --emulated)");
ABSL_FLAG(double, hbm_peak_gbs, 3350.0, "the GPU's nominal HBM bandwidth in GB/s (H100 SXM 3350, H200 4800)");
ABSL_FLAG(int32_t, reps, 5, "timed batches per figure (best reported)");
ABSL_FLAG(int32_t, calls, 20, "calls per timed batch");

namespace hybridserve::bench {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;
using nlohmann::json;

struct MambaDims {
  int64_t n_heads, head_dim, d_state, n_groups, chunk;
};

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool emulated = absl::GetFlag(FLAGS_emulated), small = absl::GetFlag(FLAGS_small);
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
  const double peak = absl::GetFlag(FLAGS_hbm_peak_gbs) * 1e9;
  std::printf("device: %s%s\n", b.variant(), emulated ? " (times are the emulator's and mean nothing)" : "");
  json out{{"device", b.variant()}, {"emulated", emulated}, {"hbm_peak_gbs", peak / 1e9}};

  // ---- copy baseline ----
  const int64_t copy_bytes = small ? (int64_t{1} << 20) : (int64_t{1} << 30);
  double copy_bw = 0;
  {
    DeviceBuffer src = Buffer(b, copy_bytes), dst = Buffer(b, copy_bytes);
    const double s = SecondsPerCall(b, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_calls),
                                    [&] { Check(b.CopyOnDevice(dst.data(), src.data(), copy_bytes), "copy"); });
    copy_bw = 2.0 * static_cast<double>(copy_bytes) / s;
    std::printf("copy %lld MiB: %.1f GB/s (read + write), %.1f%% of the nominal peak\n",
                static_cast<long long>(copy_bytes >> 20), copy_bw / 1e9, 100 * copy_bw / peak);
    out["copy_gbs"] = copy_bw / 1e9;
  }

  // granite-4.0-h-small's Mamba mixer; --small: a toy of the same shape.
  const MambaDims d = small ? MambaDims{4, 16, 16, 1, 32} : MambaDims{128, 64, 128, 1, 256};
  const int64_t hpn = d.n_heads * d.head_dim * d.d_state;

  // ---- selective state update ----
  out["ssu"] = json::array();
  const std::vector<int64_t> batches =
      small ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256};
  const int64_t max_batch = batches.back();
  {
    DeviceBuffer state = Random(b, max_batch * hpn, -1, 1, 1);
    DeviceBuffer x = Random(b, max_batch * d.n_heads * d.head_dim, -1, 1, 2);
    DeviceBuffer z = Random(b, max_batch * d.n_heads * d.head_dim, -1, 1, 3);
    DeviceBuffer dt = Random(b, max_batch * d.n_heads, 0.01f, 0.1f, 4);
    DeviceBuffer A = Random(b, d.n_heads, -2, -0.5f, 5);
    DeviceBuffer D = Random(b, d.n_heads, -1, 1, 6);
    DeviceBuffer B = Random(b, max_batch * d.n_groups * d.d_state, -1, 1, 7);
    DeviceBuffer C = Random(b, max_batch * d.n_groups * d.d_state, -1, 1, 8);
    DeviceBuffer y = Buffer(b, max_batch * d.n_heads * d.head_dim * 4);
    for (int64_t batch : batches) {
      kernels::SelectiveStateUpdateParams p;
      p.state = state.as<float>();
      p.x = x.as<float>();
      p.z = z.as<float>();
      p.dt = dt.as<float>();
      p.A = A.as<float>();
      p.D = D.as<float>();
      p.B = B.as<float>();
      p.C = C.as<float>();
      p.y = y.as<float>();
      p.batch = batch;
      p.num_slots = max_batch;
      p.n_heads = d.n_heads;
      p.head_dim = d.head_dim;
      p.d_state = d.d_state;
      p.n_groups = d.n_groups;
      const double s = SecondsPerCall(b, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_calls),
                                      [&] { Check(b.SelectiveStateUpdate(p), "SelectiveStateUpdate"); });
      const double bytes =
          4.0 * batch * (2.0 * hpn + 3.0 * d.n_heads * d.head_dim + d.n_heads + 2.0 * d.n_groups * d.d_state) +
          4.0 * 2 * d.n_heads;
      const double bw = bytes / s;
      std::printf("ssu batch %3lld: %8.1f us, %.1f MB, %7.1f GB/s = %5.1f%% of peak, %5.1f%% of copy\n",
                  static_cast<long long>(batch), s * 1e6, bytes / 1e6, bw / 1e9, 100 * bw / peak, 100 * bw / copy_bw);
      out["ssu"].push_back({{"batch", batch},
                            {"us", s * 1e6},
                            {"gbs", bw / 1e9},
                            {"share_of_peak", bw / peak},
                            {"share_of_copy", bw / copy_bw}});
    }
  }

  // ---- SSD chunk scan (prefill) ----
  out["ssd"] = json::array();
  for (int64_t seqlen : small ? std::vector<int64_t>{96} : std::vector<int64_t>{2048, 8192}) {
    DeviceBuffer x = Random(b, seqlen * d.n_heads * d.head_dim, -1, 1, 11);
    DeviceBuffer dt = Random(b, seqlen * d.n_heads, 0.01f, 0.1f, 12);
    DeviceBuffer A = Random(b, d.n_heads, -2, -0.5f, 13);
    DeviceBuffer D = Random(b, d.n_heads, -1, 1, 14);
    DeviceBuffer B = Random(b, seqlen * d.n_groups * d.d_state, -1, 1, 15);
    DeviceBuffer C = Random(b, seqlen * d.n_groups * d.d_state, -1, 1, 16);
    DeviceBuffer y = Buffer(b, seqlen * d.n_heads * d.head_dim * 4);
    DeviceBuffer final_state = Buffer(b, hpn * 4);
    DeviceBuffer chunk_states = Buffer(b, (seqlen / d.chunk + 1) * hpn * 4);
    kernels::SsdChunkScanParams p;
    p.x = x.as<float>();
    p.dt = dt.as<float>();
    p.A = A.as<float>();
    p.B = B.as<float>();
    p.C = C.as<float>();
    p.D = D.as<float>();
    p.y = y.as<float>();
    p.final_state = final_state.as<float>();
    p.chunk_states = chunk_states.as<float>();
    p.seqlen = seqlen;
    p.n_heads = d.n_heads;
    p.head_dim = d.head_dim;
    p.d_state = d.d_state;
    p.n_groups = d.n_groups;
    p.chunk_size = d.chunk;
    const double s = SecondsPerCall(b, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_calls),
                                    [&] { Check(b.SsdChunkScan(p), "SsdChunkScan"); });
    const double tok_s = seqlen / s;
    std::printf("ssd %5lld tokens: %8.3f ms, %.3g tokens/s (anchor 1.1e7-2.4e7 on an H100: %.2fx the upper end)\n",
                static_cast<long long>(seqlen), s * 1e3, tok_s, tok_s / 2.4e7);
    out["ssd"].push_back({{"seqlen", seqlen}, {"ms", s * 1e3}, {"tok_s", tok_s}});
  }

  // ---- matmul decode ----
  out["matmul"] = json::array();
  {
    const int64_t n = small ? 96 : 4096, k = small ? 80 : 4096;
    DeviceBuffer a = Random(b, 64 * k, -1, 1, 21);
    DeviceBuffer w = Random(b, n * k, -1, 1, 22);
    std::vector<uint16_t> w16(static_cast<size_t>(n * k));
    std::mt19937 rng(23);
    for (uint16_t& h : w16) h = static_cast<uint16_t>(0x3c00 + rng() % 0x200);  // bf16 in [0.0078, 0.03)
    DeviceBuffer wb = Buffer(b, n * k * 2);
    Check(b.CopyToDevice(wb.data(), w16.data(), n * k * 2), "CopyToDevice");
    DeviceBuffer o = Buffer(b, 64 * n * 4);
    for (bool bf16 : {true, false}) {
      for (kernels::MatmulMode mode : {kernels::MatmulMode::kDeterministic, kernels::MatmulMode::kFast}) {
        for (int64_t m : {1, 8, 64}) {
          kernels::MatmulParams p;
          p.a = a.as<float>();
          if (bf16)
            p.w_bf16 = wb.as<uint16_t>();
          else
            p.w = w.as<float>();
          p.out = o.as<float>();
          p.m = m;
          p.n = n;
          p.k = k;
          const double s = SecondsPerCall(b, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_calls),
                                          [&] { Check(b.Matmul(p, mode), "Matmul"); });
          const double bytes = static_cast<double>(n) * k * (bf16 ? 2 : 4) + 4.0 * m * (k + n);
          const char* mode_name = mode == kernels::MatmulMode::kFast ? "fast" : "deterministic";
          std::printf("matmul %s %-13s m %2lld: %8.1f us, %6.1f GB/s = %5.1f%% of copy\n", bf16 ? "bf16" : "f32 ",
                      mode_name, static_cast<long long>(m), s * 1e6, bytes / s / 1e9, 100 * bytes / s / copy_bw);
          out["matmul"].push_back({{"dtype", bf16 ? "bf16" : "f32"},
                                   {"mode", mode_name},
                                   {"m", m},
                                   {"us", s * 1e6},
                                   {"share_of_copy", bytes / s / copy_bw}});
        }
      }
    }
  }
  std::printf("JSON %s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace hybridserve::bench

int main(int argc, char** argv) { return hybridserve::bench::Main(argc, argv); }
