// The CUDA IPC channel on this machine: both ranks in one process, over a
// real loopback control connection, with the CUDA backend on its emulator
// (whose IPC handles open in the process that made them) or the CPU backend
// (no shared memory: every message over the connection). Then the channel
// protocol of nccl_transport.h over it.

#include "transport/ipc_communicator.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "transport/nccl_transport.h"
#include "transport/socket_io.h"

namespace hybridserve::transport {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<kernels::Backend> EmulatedGpu() {
  std::string error;
  std::unique_ptr<kernels::Backend> b = kernels::cuda_emu::CreateCudaBackend(kernels::CudaBackendOptions(), &error);
  EXPECT_NE(b, nullptr) << error;
  return b;
}

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

struct Pair {
  std::unique_ptr<Communicator> rank0, rank1;
};

Pair MakePair(IpcCommunicatorFactory& factory) {
  Pair p;
  auto id = factory.NewUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  auto a = factory.Join(*id, 0);
  auto b = factory.Join(*id, 1);
  EXPECT_TRUE(a.ok() && b.ok());
  p.rank0 = *std::move(a);
  p.rank1 = *std::move(b);
  return p;
}

TEST(IpcCommunicatorTest, DeviceToDeviceMessagesMoveByIpcAndHandlesAreOpenedOnce) {
  auto gpu = EmulatedGpu();
  ASSERT_NE(gpu, nullptr);
  IpcCommunicatorFactory factory(*gpu);
  Pair p = MakePair(factory);
  kernels::DeviceBuffer src, dst;
  ASSERT_EQ(gpu->Allocate(1 << 16, &src), 0);
  ASSERT_EQ(gpu->Allocate(1 << 16, &dst), 0);
  const std::string payload = Bytes(1 << 16, 1);
  ASSERT_EQ(gpu->CopyToDevice(src.data(), payload.data(), 1 << 16), 0);
  // Three messages into three places of one allocation.
  for (int i = 0; i < 3; ++i) {
    const size_t n = 1000 + 2000 * i;
    char* from = src.as<char>() + 7 * i;
    char* to = dst.as<char>() + 20000 * i;
    absl::Status sent;
    std::thread t([&] { sent = p.rank1->Send(from, n, Soon()); });
    const absl::Status got = p.rank0->Recv(to, n, Soon());
    t.join();
    ASSERT_TRUE(sent.ok()) << sent;
    ASSERT_TRUE(got.ok()) << got;
    std::string back(n, '\0');
    ASSERT_EQ(gpu->CopyToHost(back.data(), to, static_cast<int64_t>(n)), 0);
    EXPECT_EQ(back, payload.substr(7 * i, n));
  }
  const IpcChannelStats s = StatsOf(*p.rank1);
  EXPECT_EQ(s.bytes_by_ipc, 1000 + 3000 + 5000);
  EXPECT_EQ(s.bytes_by_socket, 0);
  EXPECT_EQ(s.handles_opened, 1);
}

TEST(IpcCommunicatorTest, HostBuffersOnEitherSideGoOverTheConnection) {
  auto gpu = EmulatedGpu();
  ASSERT_NE(gpu, nullptr);
  IpcCommunicatorFactory factory(*gpu);
  Pair p = MakePair(factory);
  kernels::DeviceBuffer device;
  ASSERT_EQ(gpu->Allocate(4096, &device), 0);
  const std::string host_payload = Bytes(3000, 2);
  // Host source into device memory: copied by IPC from the host buffer.
  absl::Status sent;
  std::thread t([&] { sent = p.rank1->Send(host_payload.data(), 3000, Soon()); });
  ASSERT_TRUE(p.rank0->Recv(device.data(), 3000, Soon()).ok());
  t.join();
  ASSERT_TRUE(sent.ok()) << sent;
  // Device source into host memory: over the connection, staged by the sender.
  std::string host_back(3000, '\0');
  std::thread u([&] { sent = p.rank1->Send(device.data(), 3000, Soon()); });
  ASSERT_TRUE(p.rank0->Recv(host_back.data(), 3000, Soon()).ok());
  u.join();
  ASSERT_TRUE(sent.ok()) << sent;
  EXPECT_EQ(host_back, host_payload);
  // Rank 0 sends too: host to host.
  std::string reply(10, '\0');
  std::thread v([&] { sent = p.rank0->Send("0123456789", 10, Soon()); });
  ASSERT_TRUE(p.rank1->Recv(reply.data(), 10, Soon()).ok());
  v.join();
  EXPECT_EQ(reply, "0123456789");
  EXPECT_EQ(StatsOf(*p.rank1).bytes_by_ipc, 3000);
  EXPECT_EQ(StatsOf(*p.rank1).bytes_by_socket, 3000);
  EXPECT_EQ(StatsOf(*p.rank0).bytes_by_socket, 10);
}

TEST(IpcCommunicatorTest, ABackendWithoutSharedMemorySendsEverythingOverTheConnection) {
  kernels::cpu::CpuBackend cpu(1);
  IpcCommunicatorFactory factory(cpu);
  Pair p = MakePair(factory);
  const std::string payload = Bytes(100000, 3);
  std::string got(payload.size(), '\0');
  absl::Status sent;
  std::thread t([&] { sent = p.rank1->Send(payload.data(), payload.size(), Soon()); });
  ASSERT_TRUE(p.rank0->Recv(got.data(), got.size(), Soon()).ok());
  t.join();
  ASSERT_TRUE(sent.ok());
  EXPECT_EQ(got, payload);
  EXPECT_EQ(StatsOf(*p.rank1).bytes_by_socket, 100000);
}

TEST(IpcCommunicatorTest, ASizeMismatchIsDataLossAndBreaksTheChannel) {
  auto gpu = EmulatedGpu();
  ASSERT_NE(gpu, nullptr);
  IpcCommunicatorFactory factory(*gpu);
  Pair p = MakePair(factory);
  std::string buffer(64, '\0');
  absl::Status received;
  std::thread t([&] { received = p.rank0->Recv(buffer.data(), 64, Soon()); });
  const absl::Status sent = p.rank1->Send("abc", 3, Soon());
  t.join();
  EXPECT_EQ(sent.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(sent.message()), HasSubstr("receives 64 bytes where 3 are sent"));
  EXPECT_EQ(received.code(), absl::StatusCode::kUnavailable) << received;  // the sender broke the channel
  EXPECT_EQ(p.rank1->Send("abc", 3, Soon()).code(), absl::StatusCode::kUnavailable);
}

TEST(IpcCommunicatorTest, DeadlinesAbortAndAPeerThatGoesAwayEndBlockedCalls) {
  kernels::cpu::CpuBackend cpu(1);
  IpcCommunicatorFactory factory(cpu);
  {
    Pair p = MakePair(factory);
    char c = 0;
    ASSERT_TRUE(p.rank1->WaitReady(Soon()).ok());
    EXPECT_EQ(p.rank0->Recv(&c, 1, absl::Now() + absl::Milliseconds(200)).code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  {
    Pair p = MakePair(factory);
    ASSERT_TRUE(p.rank1->WaitReady(Soon()).ok());
    char c = 0;
    absl::Status received;
    std::thread t([&] { received = p.rank0->Recv(&c, 1, Soon()); });
    absl::SleepFor(absl::Milliseconds(100));
    const absl::Time start = absl::Now();
    p.rank1.reset();  // the peer's process ends: its connection closes
    t.join();
    EXPECT_EQ(received.code(), absl::StatusCode::kUnavailable) << received;
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  }
  {
    Pair p = MakePair(factory);
    char c = 0;
    absl::Status waited;
    std::thread t([&] { waited = p.rank0->Recv(&c, 1, Soon()); });  // still waiting for the peer to join
    absl::SleepFor(absl::Milliseconds(100));
    p.rank0->Abort();
    t.join();
    EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  }
}

TEST(IpcCommunicatorTest, OnlyTheTokenHolderJoinsAndIdsAreChecked) {
  kernels::cpu::CpuBackend cpu(1);
  IpcCommunicatorFactory factory(cpu);
  auto id = factory.NewUniqueId();
  ASSERT_TRUE(id.ok());
  auto rank0 = factory.Join(*id, 0);
  ASSERT_TRUE(rank0.ok());
  EXPECT_EQ(factory.Join(*id, 0).status().code(), absl::StatusCode::kInvalidArgument);  // joined already
  EXPECT_EQ(factory.Join("nonsense", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(factory.Join(*id, 2).status().code(), absl::StatusCode::kInvalidArgument);
  // A stranger connects and presents a wrong token: dropped, rank 0 keeps waiting.
  const std::string endpoint = id->substr(0, id->rfind('/'));
  auto stranger = Connect(endpoint, Soon());
  ASSERT_TRUE(stranger.ok());
  ASSERT_TRUE(stranger->WriteFull(std::string(32, 'x'), Soon()).ok());
  EXPECT_EQ((*rank0)->WaitReady(absl::Now() + absl::Milliseconds(300)).code(), absl::StatusCode::kDeadlineExceeded);
  auto rank1 = factory.Join(*id, 1);
  ASSERT_TRUE(rank1.ok());
  std::thread t([&] { EXPECT_TRUE((*rank1)->WaitReady(Soon()).ok()); });
  EXPECT_TRUE((*rank0)->WaitReady(Soon()).ok());
  t.join();
}

// The channel protocol (nccl_transport.h) over CUDA IPC channels.
class BytesSource final : public StateSource {
 public:
  BytesSource() : pages_{Bytes(4096, 11), Bytes(4096, 12), Bytes(4096, 13)}, state_(Bytes(999, 14)) {}
  int64_t num_pages() const override { return 3; }
  int64_t page_bytes() const override { return 4096; }
  absl::Status ReadPage(int64_t index, absl::Span<char> out) const override {
    std::memcpy(out.data(), pages_[static_cast<size_t>(index)].data(), out.size());
    return absl::OkStatus();
  }
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return 7; }
  float first_logprob() const override { return -1.5f; }
  std::vector<std::string> pages_;
  std::string state_;
};

TEST(IpcCommunicatorTest, TheChannelProtocolRunsOverIt) {
  auto gpu = EmulatedGpu();
  ASSERT_NE(gpu, nullptr);
  IpcCommunicatorFactory factory(*gpu);
  NcclReceiverOptions ro;
  ro.default_peer = "prefill-0";
  ro.kind = TransportKind::kCudaIpc;
  auto receiver = NcclStateReceiver::Create(factory, ro);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  NcclStateSender sender(factory);
  const BytesSource source;
  for (uint64_t id = 1; id <= 2; ++id) {  // the second transfer reuses the channel
    Ticket t;
    t.transfer_id = id;
    t.endpoint = "decode-0";
    t.n_tokens = 3 * 16 + 5;
    t.page_format = common::Hash128{1, 2};
    t.num_pages = 3;
    t.page_bytes = 4096;
    t.max_state_bytes = 2000;
    t.deadline = absl::Now() + absl::Seconds(30);
    const absl::Status expected = (*receiver)->ExpectTicket(&t);
    ASSERT_TRUE(expected.ok()) << expected;
    EXPECT_EQ(t.kind, TransportKind::kCudaIpc);
    absl::Status sent;
    std::thread s([&] { sent = sender.Send(t, source); });
    auto got = (*receiver)->Await(id);
    s.join();
    ASSERT_TRUE(sent.ok()) << sent;
    ASSERT_TRUE(got.ok()) << got.status();
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(got->pages[i], source.pages_[static_cast<size_t>(i)]);
    EXPECT_EQ(got->state, source.state_);
    EXPECT_EQ(got->first_token, 7);
  }
  EXPECT_EQ(sender.channels(), 1);
}

}  // namespace
}  // namespace hybridserve::transport
