// GPU data plane bandwidth, each against a baseline measured in the same run:
//
//   cuda_ipc  one message of N bytes from a sender process's device memory
//             into this process's device memory over the CUDA IPC channel
//             (transport/ipc_communicator.h: rendezvous on the host, then a
//             device-to-device copy) / a device-to-device cudaMemcpy of the
//             same N bytes inside this process. Goal >= 0.9.
//   nccl      the same message over the NCCL channel (transport/
//             nccl_communicator.h: ncclSend/ncclRecv in 4 MiB chunks, device
//             memory in place) between two GPUs / the device copy. The issue's
//             baseline is NCCL's own send/recv test of the same bytes; without
//             nccl-tests here, the raw copy is the bound printed.
//
// The sender is this binary re-executed (--child): both processes on GPU 0
// for cuda_ipc (NCCL refuses two ranks on one device), GPU 0 and 1 for nccl.
// Every figure is the best of --reps messages.
//
//   bazel build -c opt //bench/transport:gpu_transfer_bench
//   bazel-bin/bench/transport/gpu_transfer_bench --plane=cuda_ipc      # on a GPU machine
//   bazel-bin/bench/transport/gpu_transfer_bench --plane=cuda_ipc --emulated --sizes=1048576
//       (both ranks as threads on the CUDA emulator: checks the code path; times mean nothing)

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "transport/communicator.h"
#include "transport/ipc_communicator.h"
#include "transport/nccl_communicator.h"

ABSL_FLAG(std::string, plane, "cuda_ipc", "cuda_ipc (two processes, one GPU) or nccl (two GPUs)");
ABSL_FLAG(std::string, sizes, "1048576,16777216,268435456", "message sizes in bytes");
ABSL_FLAG(int32_t, reps, 10, "messages per size (best reported)");
ABSL_FLAG(bool, emulated, false, "both ranks as threads on the CUDA emulator (cuda_ipc only; times mean nothing)");
ABSL_FLAG(bool, child, false, "internal: run as the sending rank");
ABSL_FLAG(std::string, channel, "", "internal: the channel id, hex");

namespace hybridserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> Sizes() {
  std::vector<int64_t> out;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(s, &v) && v > 0) out.push_back(v);
  }
  return out;
}

std::unique_ptr<kernels::Backend> Gpu(int device) {
  std::string error;
  kernels::CudaBackendOptions o;
  o.device_index = device;
  std::unique_ptr<kernels::Backend> b = absl::GetFlag(FLAGS_emulated) ? kernels::cuda_emu::CreateCudaBackend(o, &error)
                                                                      : kernels::cuda::CreateCudaBackend(o, &error);
  if (b == nullptr) std::fprintf(stderr, "GPU %d: %s\n", device, error.c_str());
  return b;
}

std::unique_ptr<transport::CommunicatorFactory> Factory(kernels::Backend& backend, int device) {
  if (absl::GetFlag(FLAGS_plane) == "cuda_ipc") {
    return std::make_unique<transport::IpcCommunicatorFactory>(backend.peer_memory());
  }
  transport::NcclCommunicatorOptions o;
  o.device = device;
  auto f = transport::NcclCommunicatorFactory::Create(o);
  if (!f.ok()) {
    std::fprintf(stderr, "nccl: %s\n", f.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(f);
}

// The sending rank: every size, reps + 1 messages (the first warms up).
int Sender(transport::CommunicatorFactory& factory, kernels::Backend& gpu, const std::string& channel) {
  auto comm = factory.Join(channel, 1);
  if (!comm.ok()) {
    std::fprintf(stderr, "sender join: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const std::vector<int64_t> sizes = Sizes();
  kernels::DeviceBuffer src;
  if (gpu.Allocate(*std::max_element(sizes.begin(), sizes.end()), &src) != 0) return 1;
  // The channel's copies run apart from the backend's stream (kernels/peer_memory.h): the zero fill first.
  if (gpu.Synchronize() != 0) return 1;
  for (int64_t n : sizes) {
    for (int r = 0; r <= absl::GetFlag(FLAGS_reps); ++r) {
      const absl::Status s = (*comm)->Send(src.data(), static_cast<size_t>(n), absl::Now() + absl::Seconds(60));
      if (!s.ok()) {
        std::fprintf(stderr, "send: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool nccl = absl::GetFlag(FLAGS_plane) == "nccl";
  if (!nccl && absl::GetFlag(FLAGS_plane) != "cuda_ipc") {
    std::fprintf(stderr, "--plane must be cuda_ipc or nccl\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_child)) {
    auto gpu = Gpu(nccl ? 1 : 0);
    if (gpu == nullptr) return 1;
    auto factory = Factory(*gpu, nccl ? 1 : 0);
    std::string channel;
    if (factory == nullptr || !absl::Base64Unescape(absl::GetFlag(FLAGS_channel), &channel)) return 1;
    return Sender(*factory, *gpu, channel);
  }
  auto gpu = Gpu(0);
  if (gpu == nullptr) return 1;
  auto factory = Factory(*gpu, 0);
  if (factory == nullptr) return 1;
  auto channel = factory->NewUniqueId();
  if (!channel.ok()) return 1;
  auto comm = factory->Join(*channel, 0);
  if (!comm.ok()) return 1;

  std::thread emulated_sender;
  pid_t child = -1;
  if (absl::GetFlag(FLAGS_emulated)) {
    if (nccl) {
      std::fprintf(stderr, "--emulated runs cuda_ipc only\n");
      return 2;
    }
    emulated_sender = std::thread([&] { Sender(*factory, *gpu, *channel); });
  } else {
    std::vector<std::string> args = {argv[0],
                                     "--child",
                                     "--plane=" + absl::GetFlag(FLAGS_plane),
                                     "--sizes=" + absl::GetFlag(FLAGS_sizes),
                                     "--reps=" + std::to_string(absl::GetFlag(FLAGS_reps)),
                                     "--channel=" + absl::Base64Escape(*channel)};
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    if (posix_spawn(&child, argv[0], nullptr, nullptr, cargs.data(), environ) != 0) {
      std::fprintf(stderr, "cannot start the sender process\n");
      return 1;
    }
  }

  std::printf("plane %s, device %s%s\n", absl::GetFlag(FLAGS_plane).c_str(), gpu->variant(),
              absl::GetFlag(FLAGS_emulated) ? " (times mean nothing)" : "");
  std::printf("%12s %12s %12s %8s %8s\n", "bytes", "plane_GB/s", "copy_GB/s", "ratio", "goal");
  const std::vector<int64_t> sizes = Sizes();
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  kernels::DeviceBuffer dst, copy_src;
  if (gpu->Allocate(largest, &dst) != 0 || gpu->Allocate(largest, &copy_src) != 0) return 1;
  if (gpu->Synchronize() != 0) return 1;  // the zero fills, before the peer writes dst
  int status = 0;
  for (int64_t n : sizes) {
    double plane_best = 1e30, copy_best = 1e30;
    for (int r = 0; r <= absl::GetFlag(FLAGS_reps); ++r) {
      const auto start = Clock::now();
      const absl::Status s = (*comm)->Recv(dst.data(), static_cast<size_t>(n), absl::Now() + absl::Seconds(60));
      const double t = std::chrono::duration<double>(Clock::now() - start).count();
      if (!s.ok()) {
        std::fprintf(stderr, "recv: %s\n", s.ToString().c_str());
        status = 1;
        break;
      }
      if (r > 0) plane_best = std::min(plane_best, t);
      gpu->Synchronize();
      const auto c0 = Clock::now();
      gpu->CopyOnDevice(dst.data(), copy_src.data(), n);
      gpu->Synchronize();
      if (r > 0) copy_best = std::min(copy_best, std::chrono::duration<double>(Clock::now() - c0).count());
    }
    if (status != 0) break;
    // The copy's bandwidth as bytes moved once (the message's N), as the plane's.
    std::printf("%12lld %12.1f %12.1f %8.3f %8s\n", static_cast<long long>(n), n / plane_best / 1e9,
                n / copy_best / 1e9, copy_best / plane_best, ">=0.9");
  }
  if (emulated_sender.joinable()) emulated_sender.join();
  if (child > 0) {
    int wstatus = 0;
    waitpid(child, &wstatus, 0);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) status = 1;
  }
  return status;
}

}  // namespace
}  // namespace hybridserve::bench

int main(int argc, char** argv) { return hybridserve::bench::Main(argc, argv); }
