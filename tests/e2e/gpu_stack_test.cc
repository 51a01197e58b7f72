// The stack on GPUs: prefill and decode processes with --device=cuda, over
// the TCP data plane and the CUDA IPC plane (one GPU is enough) and over the
// NCCL plane (two GPUs: NCCL refuses two ranks on one device). A three-turn chat through the
// disaggregated processes gives the tokens of the aggregated GPU run, and
// kill -9 of either side while a transfer is in flight ends every request
// exactly once and leaves the other serving with every reservation back.
// Every test skips, saying so, where the GPUs are missing, and fails instead
// where HS_REQUIRE_GPUS declares them.

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/wait_for.h"
#include "engine/model_config.h"
#include "engine/state_layout.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gpu_requirement.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

// Whether the machine has `needed` GPUs; when not, the test skips, or fails
// on a broken CUDA setup or where HS_REQUIRE_GPUS declares them
// (kernels/cuda/gpu_requirement.h). The caller returns on false.
bool HaveGpus(int needed) {
  return kernels::cuda_testing::HaveGpusOrSkip(needed, kernels::cuda::CudaDeviceCount(),
                                               needed > 1 ? "NCCL needs a GPU per rank" : nullptr);
}

// Prefill on GPU 0 and decode on GPU `decode_gpu`, over `plane`.
StackOptions GpuStack(bool aggregated, const std::string& plane, int decode_gpu) {
  StackOptions o;
  o.aggregated = aggregated;
  o.prefill_args = {"--device=cuda", "--device_index=0", "--data_planes=tcp," + plane};
  o.decode_args = {"--device=cuda", absl::StrCat("--device_index=", decode_gpu)};
  if (!aggregated && plane != "tcp") o.decode_args.push_back("--data_planes=" + plane);
  return o;
}

// The second decode the NCCL decode-kill case starts on GPU 1 against the
// stack's prefill and cachestore ports.
std::vector<std::string> SecondNcclDecodeArgs(int prefill_port, int cachestore_port) {
  return {"--model_dir=" + Runfile("models/default"),
          "--address=127.0.0.1:0",
          "--device=cuda",
          "--device_index=1",
          "--data_planes=nccl",
          absl::StrCat("--prefill=127.0.0.1:", prefill_port),
          absl::StrCat("--cachestore=127.0.0.1:", cachestore_port)};
}

// What `binary --helpfull ARGS...` prints (stdout and stderr): the usage, or
// absl's "ERROR: Unknown command line flag" for a flag the binary lacks.
std::string HelpOutput(const std::string& binary, const std::vector<std::string>& args) {
  std::string command = "'" + Runfile(binary) + "' --helpfull";
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  absl::StrAppend(&command, " 2>&1");
  std::string out;
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return "popen failed";
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), f)) > 0;) out.append(buffer, n);
  pclose(f);
  return out;
}

// Three turns, each feeding the last turn's tokens back: the tokens of each turn.
std::vector<std::vector<int32_t>> ThreeTurns(const std::string& target, const std::string& tag) {
  std::vector<std::vector<int32_t>> turns;
  std::vector<int32_t> conversation = TextPrompt(200, 7);
  for (int turn = 1; turn <= 3; ++turn) {
    v1::GenerateRequest r = Request(absl::StrCat(tag, "-", turn), conversation, 24);
    r.set_cache_salt(tag);
    Generation g = Generate(target, r);
    EXPECT_TRUE(g.status.ok()) << tag << " turn " << turn << ": " << g.status.error_message();
    turns.push_back(g.tokens);
    conversation.insert(conversation.end(), g.tokens.begin(), g.tokens.end());
    conversation.push_back('\n');
  }
  return turns;
}

void ExpectDisaggregatedEqualsAggregated(const std::string& plane, int decode_gpu) {
  auto d = Stack::Start(GpuStack(/*aggregated=*/false, plane, decode_gpu));
  ASSERT_TRUE(d.ok()) << d.status();
  auto a = Stack::Start(GpuStack(/*aggregated=*/true, "tcp", 0));
  ASSERT_TRUE(a.ok()) << a.status();
  const auto disaggregated = ThreeTurns((*d)->decode_target(), "gpu-" + plane);
  const auto aggregated = ThreeTurns((*a)->decode_target(), "gpu-" + plane);
  ASSERT_EQ(disaggregated.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(disaggregated[t].size(), 24u);
    EXPECT_EQ(disaggregated[t], aggregated[t]) << "turn " << t + 1;
  }
}

// Runs with or without a GPU: every flag the GPU cases below pass is one the
// services know. These cases never run without a GPU, and a renamed flag
// (decode's --data_plane became --data_planes) once failed them only on the
// first lent GPU.
TEST(GpuStackTest, EveryFlagTheGpuCasesPassIsOneTheServicesKnow) {
  std::vector<std::pair<std::string, std::vector<std::string>>> runs;
  for (const std::string plane : {"tcp", "cuda_ipc", "nccl"}) {
    for (const bool aggregated : {false, true}) {
      const StackOptions o = GpuStack(aggregated, plane, 0);
      runs.push_back({"decode/decode", o.decode_args});
      runs.push_back({"prefill/prefill", o.prefill_args});
    }
  }
  runs.push_back({"decode/decode", SecondNcclDecodeArgs(50051, 50052)});
  for (const auto& [binary, args] : runs) {
    const std::string out = HelpOutput(binary, args);
    EXPECT_EQ(out.find("ERROR"), std::string::npos) << binary << " " << absl::StrJoin(args, " ") << ":\n" << out;
    EXPECT_NE(out.find("--device_index"), std::string::npos) << binary << " printed no usage:\n" << out;
  }
}

TEST(GpuStackTest, TcpPlaneBetweenGpuProcessesEqualsTheAggregatedGpuRunOverThreeTurns) {
  if (!HaveGpus(1)) return;
  ExpectDisaggregatedEqualsAggregated("tcp", 0);
}

TEST(GpuStackTest, CudaIpcPlaneBetweenTwoProcessesOnOneGpuEqualsTheAggregatedGpuRunOverThreeTurns) {
  if (!HaveGpus(1)) return;
  ExpectDisaggregatedEqualsAggregated("cuda_ipc", 0);
}

// Over the CUDA IPC plane a transfer's pages go by device copy, straight
// into decode's reserved slots: after one request, prefill's device-copy
// bytes sent and decode's received are both exactly the request's pages
// (num_pages = prompt tokens / page_size full pages, of page_bytes each:
// engine/state_layout.h), and only the state and the frames went over the
// control connection. hybridserve_transfer_bytes_total (prefill: pages +
// state) gives the state's size.
TEST(GpuStackTest, CudaIpcPlaneMovesThePagesByDeviceCopyAndOnlyTheStateAndFramesOverTheSocket) {
  if (!HaveGpus(1)) return;
  // 12 full pages of 16 tokens (the default shape's page size), a token
  // more or less (however the prompt's ends are counted).
  constexpr int kPromptTokens = 200;
  const StackOptions o = GpuStack(/*aggregated=*/false, "cuda_ipc", 0);
  auto s = Stack::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int prefill_metrics = std::stoi(stack.prefill()->field("metrics_port"));
  const int decode_metrics = std::stoi(stack.decode()->field("metrics_port"));
  const std::string sent_copy = IpcPlaneBytes("device_copy", "sent");
  const std::string received_copy = IpcPlaneBytes("device_copy", "received");
  const std::string sent_socket = IpcPlaneBytes("socket", "sent");
  const std::string received_socket = IpcPlaneBytes("socket", "received");
  ASSERT_EQ(Metric(prefill_metrics, sent_copy), 0);
  ASSERT_EQ(Metric(decode_metrics, received_copy), 0);

  Generation g = Generate(stack.decode_target(), Request("ipc-bytes", TextPrompt(kPromptTokens, 4), 4));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.tokens.size(), 4u);

  auto config = engine::LoadModelConfig(Runfile(o.shape.model_dir) + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const engine::StateLayout layout = engine::StateLayout::ForModel(*config, o.shape.page_size);
  const int64_t pages = layout.full_pages(kPromptTokens);
  ASSERT_EQ(pages, layout.full_pages(kPromptTokens - 1));
  ASSERT_EQ(pages, layout.full_pages(kPromptTokens + 1));
  const double page_bytes = static_cast<double>(pages * layout.page_bytes());
  ASSERT_GT(page_bytes, 0) << "the default model has attention layers";
  // Decode has every byte once the request is done; prefill counts a
  // message just after its send returns, and its transfer and call end
  // behind the answer: awaited.
  EXPECT_EQ(Metric(decode_metrics, received_copy), page_bytes);
  EXPECT_EQ(AwaitMetric(prefill_metrics, sent_copy, page_bytes, absl::Seconds(10)), page_bytes);
  EXPECT_EQ(Metric(prefill_metrics, received_copy), 0);
  EXPECT_EQ(Metric(decode_metrics, sent_copy), 0);
  const double socket_bytes = Metric(decode_metrics, received_socket);
  EXPECT_EQ(AwaitMetric(prefill_metrics, sent_socket, socket_bytes, absl::Seconds(10)), socket_bytes);
  const double state_bytes =
      AwaitMetricAtLeast(prefill_metrics, "hybridserve_transfer_bytes_total", page_bytes + 1, absl::Seconds(10)) -
      page_bytes;
  EXPECT_GT(state_bytes, 0);
  EXPECT_GE(socket_bytes, state_bytes) << "the state goes over the control connection";
  EXPECT_LT(socket_bytes - state_bytes, 4096) << "more than the frames went over the control connection";
}

TEST(GpuStackTest, NcclPlaneEqualsTheAggregatedGpuRunOverThreeTurns) {
  if (!HaveGpus(2)) return;
  ExpectDisaggregatedEqualsAggregated("nccl", 1);
}

// The default model's context (config.json, max_position_embeddings): decode
// refuses a request whose prompt and max_tokens exceed it, before prefill.
constexpr int kContextTokens = 8192;
constexpr int kKillMaxTokens = 8;
// A gauge on prefill's metrics port: pushes to decode workers begun and not
// yet finished. The kill waits for it, so that it strikes a transfer.
constexpr char kTransfersInFlight[] = "hybridserve_prefill_transfers_in_flight";

// Each request ends exactly once: a stream that ended OK with its final
// message (FINISH_REASON_ERROR saying what went wrong), or a failed call with
// a status that says why and no final message. Whether it failed.
bool ExpectFinishedOnce(const Generation& g, const std::string& what) {
  if (!g.status.ok()) {
    EXPECT_FALSE(g.completed) << what << ": a failed call carries no final message";
    EXPECT_FALSE(g.status.error_message().empty())
        << what << ": failed (code " << g.status.error_code() << ") without saying why";
    return true;
  }
  EXPECT_TRUE(g.completed) << what << ": a stream that ended OK must carry its final message";
  switch (g.complete.finish_reason()) {
    case v1::FINISH_REASON_LENGTH:
      EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kKillMaxTokens)) << what;
      return false;
    case v1::FINISH_REASON_STOP:
      EXPECT_LE(g.tokens.size(), static_cast<size_t>(kKillMaxTokens)) << what;
      return false;
    case v1::FINISH_REASON_ERROR:
      EXPECT_FALSE(g.complete.error_message().empty()) << what << ": an error without a message";
      return true;
    default:
      ADD_FAILURE() << what << ": finish reason " << v1::FinishReason_Name(g.complete.finish_reason());
      return true;
  }
}

// Four prompts as long as the context allows, and `victim` killed once
// prefill reports a transfer to decode in flight. Every request ends exactly
// once, and at least one fails: the kill struck work in flight.
void KillDuringTransfers(Stack& stack, Process* victim, const std::string& tag) {
  const int prefill_metrics = std::stoi(stack.prefill()->field("metrics_port"));
  std::vector<Generation> out(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const int prompt_tokens = kContextTokens - kKillMaxTokens - 97 * i;
      out[i] = Generate(stack.decode_target(),
                        Request(absl::StrCat(tag, "-", i), TextPrompt(prompt_tokens, i), kKillMaxTokens));
    });
  }
  // The bound only ends a stack that never pushes; the kill below then ends its requests.
  const bool transferring =
      common::WaitFor([&] { return Metric(prefill_metrics, kTransfersInFlight) > 0; }, absl::Seconds(60));
  victim->Kill();
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(transferring) << "prefill never reported a transfer in flight (" << kTransfersInFlight
                            << " > 0): the kill struck no transfer";
  int failed = 0;
  for (int i = 0; i < 4; ++i) failed += ExpectFinishedOnce(out[i], absl::StrCat(tag, " request ", i)) ? 1 : 0;
  EXPECT_GT(failed, 0) << "every request finished: the kill struck no work in flight";
}

void KillPrefillMidTransfer(const std::string& plane, int decode_gpu) {
  auto s = Stack::Start(GpuStack(/*aggregated=*/false, plane, decode_gpu));
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  KillDuringTransfers(stack, stack.prefill(), plane + "-killprefill");
  const int metrics = std::stoi(stack.decode()->field("metrics_port"));
  EXPECT_EQ(AwaitMetric(metrics, "hybridserve_num_requests_running", 0, absl::Seconds(30)), 0);
  EXPECT_EQ(AwaitMetric(metrics, "hybridserve_kv_pages_free", 4096, absl::Seconds(30)), 4096);
  EXPECT_EQ(AwaitMetric(metrics, "hybridserve_state_slots_free", 8, absl::Seconds(30)), 8);
  ASSERT_TRUE(stack.RestartPrefill().ok());  // decode makes a new channel for the new process
  Generation after = Generate(stack.decode_target(), Request(plane + "-after-kill", TextPrompt(50, 1), 6));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 6u);
}

TEST(GpuStackTest, KillingPrefillMidNcclTransferLeavesDecodeServingWithNothingReserved) {
  if (!HaveGpus(2)) return;
  KillPrefillMidTransfer("nccl", 1);
}

TEST(GpuStackTest, KillingPrefillMidCudaIpcTransferLeavesDecodeServingWithNothingReserved) {
  if (!HaveGpus(1)) return;
  KillPrefillMidTransfer("cuda_ipc", 0);
}

TEST(GpuStackTest, KillingDecodeMidNcclTransferLeavesPrefillServing) {
  if (!HaveGpus(2)) return;
  auto s = Stack::Start(GpuStack(/*aggregated=*/false, "nccl", 1));
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  KillDuringTransfers(stack, stack.decode(), "nccl-killdecode");
  const int prefill_metrics = std::stoi(stack.prefill()->field("metrics_port"));
  EXPECT_EQ(AwaitMetric(prefill_metrics, "hybridserve_prefill_queue_depth", 0, absl::Seconds(60)), 0);
  auto d = Process::Start("decode2", "decode/decode",
                          SecondNcclDecodeArgs(stack.prefill()->port(), stack.cachestore()->port()), "DECODE_READY");
  ASSERT_TRUE(d.ok()) << d.status();
  Generation after =
      Generate(absl::StrCat("127.0.0.1:", (*d)->port()), Request("nccl-after-decode-kill", TextPrompt(50, 2), 6));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 6u);
}

}  // namespace
}  // namespace hybridserve::e2e
