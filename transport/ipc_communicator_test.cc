// The CUDA IPC channel on this machine: both ranks in one process, over a
// real loopback control connection, with the CUDA backend on its emulator
// (whose IPC handles open in the process that made them) or the CPU backend
// (no shared memory: every message over the connection). Then the channel
// protocol of channel_protocol.h over it.

#include "transport/ipc_communicator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/socket_io.h"
#include "common/wait_for.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/counting_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/engine_import.h"
#include "transport/engine_pair_test_util.h"

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
  IpcCommunicatorFactory factory(gpu->peer_memory());
  Pair p = MakePair(factory);
  kernels::DeviceBuffer src, dst;
  ASSERT_EQ(gpu->Allocate(1 << 16, &src), 0);
  ASSERT_EQ(gpu->Allocate(1 << 16, &dst), 0);
  const std::string payload = Bytes(1 << 16, 1);
  ASSERT_EQ(gpu->CopyToDevice(src.data(), payload.data(), 1 << 16), 0);
  // The channel's copies run apart from the backend's stream (PeerMemory's
  // contract): the zero fills and the upload must be done before they read
  // or write these buffers.
  ASSERT_EQ(gpu->Synchronize(), 0);
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
  // Both ranks are the factory's: it counts each message sent and received.
  const IpcTraffic traffic = factory.traffic();
  EXPECT_EQ(traffic.sent_by_device_copy, 1000 + 3000 + 5000);
  EXPECT_EQ(traffic.received_by_device_copy, 1000 + 3000 + 5000);
  EXPECT_EQ(traffic.sent_by_socket, 0);
  EXPECT_EQ(traffic.received_by_socket, 0);
}

TEST(IpcCommunicatorTest, HostBuffersOnEitherSideGoOverTheConnection) {
  auto gpu = EmulatedGpu();
  ASSERT_NE(gpu, nullptr);
  IpcCommunicatorFactory factory(gpu->peer_memory());
  Pair p = MakePair(factory);
  kernels::DeviceBuffer device;
  ASSERT_EQ(gpu->Allocate(4096, &device), 0);
  ASSERT_EQ(gpu->Synchronize(), 0);  // the zero fill, before the channel writes the buffer
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
  const IpcTraffic traffic = TrafficOf(factory);
  EXPECT_EQ(traffic.sent_by_device_copy, 3000);
  EXPECT_EQ(traffic.received_by_device_copy, 3000);
  EXPECT_EQ(traffic.sent_by_socket, 3000 + 10);
  EXPECT_EQ(traffic.received_by_socket, 3000 + 10);
}

TEST(IpcCommunicatorTest, ABackendWithoutSharedMemorySendsEverythingOverTheConnection) {
  kernels::cpu::CpuBackend cpu(1);
  IpcCommunicatorFactory factory(cpu.peer_memory());
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
  EXPECT_EQ(factory.traffic().sent_by_device_copy, 0);
  EXPECT_EQ(factory.traffic().received_by_socket, 100000);
}

TEST(IpcCommunicatorTest, ASizeMismatchIsDataLossAndBreaksTheChannel) {
  auto gpu = EmulatedGpu();
  ASSERT_NE(gpu, nullptr);
  IpcCommunicatorFactory factory(gpu->peer_memory());
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
  IpcCommunicatorFactory factory(cpu.peer_memory());
  {
    Pair p = MakePair(factory);
    char c = 0;
    ASSERT_TRUE(p.rank1->WaitReady(Soon()).ok());
    EXPECT_EQ(p.rank0->Recv(&c, 1, absl::Now() + absl::Milliseconds(200)).code(), absl::StatusCode::kDeadlineExceeded);
  }
  {
    // Rank 1 played by hand over the control connection, so the test sees
    // rank 0 post its receive before the peer goes away.
    auto id = factory.NewUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    auto rank0 = factory.Join(*id, 0);
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    auto peer = common::Connect(id->substr(0, id->rfind('/')), Soon());
    ASSERT_TRUE(peer.ok()) << peer.status();
    ASSERT_TRUE(peer->WriteFull(id->substr(id->rfind('/') + 1), Soon()).ok());
    char c = 0;
    absl::Status received;
    std::thread t([&] { received = (*rank0)->Recv(&c, 1, Soon()); });
    char posted = 0;  // the first byte of rank 0's "ready": its Recv is waiting for the reply
    const absl::Status ready = peer->ReadFull(&posted, 1, Soon());
    *peer = common::Socket();  // the peer's process ends: its connection closes
    t.join();
    ASSERT_TRUE(ready.ok()) << "rank 0 never posted its receive: " << ready;
    // Noticed the close at once: a missed close would run into Soon()'s deadline.
    EXPECT_EQ(received.code(), absl::StatusCode::kUnavailable) << received;
  }
  {
    auto id = factory.NewUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    auto rank0 = factory.Join(*id, 0);
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    char c = 0;
    absl::Status waited;
    std::thread t([&] { waited = (*rank0)->Recv(&c, 1, Soon()); });  // waits for the peer to join
    // Rank 0's Recv is in its join wait once it has dropped a stranger that
    // presented a wrong token: the stranger then sees its connection closed.
    absl::Status dropped = absl::UnknownError("the stranger could not connect");
    if (auto stranger = common::Connect(id->substr(0, id->rfind('/')), Soon()); stranger.ok()) {
      dropped = stranger->WriteFull(std::string(32, 'x'), Soon());
      char byte = 0;
      if (dropped.ok()) dropped = stranger->ReadFull(&byte, 1, Soon());
    }
    (*rank0)->Abort();
    t.join();
    EXPECT_EQ(dropped.code(), absl::StatusCode::kUnavailable) << "rank 0 was not waiting for its peer: " << dropped;
    EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  }
}

TEST(IpcCommunicatorTest, IdsAreCheckedAndTokensAreRandom) {
  kernels::cpu::CpuBackend cpu(1);
  IpcCommunicatorFactory factory(cpu.peer_memory());
  auto id = factory.NewUniqueId();
  ASSERT_TRUE(id.ok());
  auto rank0 = factory.Join(*id, 0);
  ASSERT_TRUE(rank0.ok());
  EXPECT_EQ(factory.Join(*id, 0).status().code(), absl::StatusCode::kInvalidArgument);  // joined already
  EXPECT_EQ(factory.Join("nonsense", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(factory.Join(*id, 2).status().code(), absl::StatusCode::kInvalidArgument);
  // 32 hex digits, another for every channel.
  const std::string token = id->substr(id->rfind('/') + 1);
  EXPECT_EQ(token.size(), 32u);
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
  auto other = factory.NewUniqueId();
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->substr(other->rfind('/') + 1), token);
}

// Strangers reach the control port: one presents a token one digit off, one
// garbage, one stays silent. The first two are closed unanswered, the
// silent one delays no one, and only the holder of the token joins.
TEST(IpcCommunicatorTest, OnlyTheTokenHolderJoinsAndAWrongTokenIsRefused) {
  kernels::cpu::CpuBackend cpu(1);
  IpcCommunicatorOptions o;
  o.token_timeout = absl::Minutes(5);  // the silent stranger outlasts the test: it must not hold up the join
  IpcCommunicatorFactory factory(cpu.peer_memory(), o);
  auto id = factory.NewUniqueId();
  ASSERT_TRUE(id.ok());
  auto rank0 = factory.Join(*id, 0);
  ASSERT_TRUE(rank0.ok());
  const std::string endpoint = id->substr(0, id->rfind('/'));
  std::string near_miss = id->substr(id->rfind('/') + 1);
  near_miss.back() = near_miss.back() == '0' ? '1' : '0';

  auto silent = common::Connect(endpoint, Soon());
  ASSERT_TRUE(silent.ok());
  auto wrong = common::Connect(endpoint, Soon());
  ASSERT_TRUE(wrong.ok());
  ASSERT_TRUE(wrong->WriteFull(near_miss, Soon()).ok());
  auto garbage = common::Connect(endpoint, Soon());
  ASSERT_TRUE(garbage.ok());
  ASSERT_TRUE(garbage->WriteFull(std::string(32, 'x') + "and then some", Soon()).ok());

  absl::Status joined = absl::UnknownError("not yet");
  std::thread accepting([&] { joined = (*rank0)->WaitReady(Soon()); });
  // Rank 0 closes both without a byte: their reads see the connection end.
  char byte;
  EXPECT_EQ(wrong->ReadFull(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(garbage->ReadFull(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);

  auto rank1 = factory.Join(*id, 1);
  ASSERT_TRUE(rank1.ok());
  EXPECT_TRUE((*rank1)->WaitReady(Soon()).ok());
  accepting.join();
  ASSERT_TRUE(joined.ok()) << joined;
  // The joined connection is rank 1's: a message crosses it.
  std::string got(5, '\0');
  absl::Status sent;
  std::thread t([&] { sent = (*rank1)->Send("hello", 5, Soon()); });
  EXPECT_TRUE((*rank0)->Recv(got.data(), 5, Soon()).ok());
  t.join();
  EXPECT_TRUE(sent.ok()) << sent;
  EXPECT_EQ(got, "hello");
  // The silent stranger was closed when the peer joined, and no one else can
  // connect: the listener is gone.
  EXPECT_EQ(silent->ReadFull(&byte, 1, Soon()).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(common::Connect(endpoint, absl::Now() + absl::Seconds(2)).ok());
}

// The channel protocol (channel_protocol.h) over CUDA IPC channels.
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
  IpcCommunicatorFactory factory(gpu->peer_memory());
  ChannelReceiverOptions ro;
  ro.default_peer = "prefill-0";
  ro.kind = TransportKind::kCudaIpc;
  auto receiver = ChannelStateReceiver::Create(factory, ro);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  ChannelStateSender sender(factory);
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

// What the GPU path does, on the emulator: a prefill engine and a decode
// engine on two CUDA backends, a sequence sent over a CUDA IPC channel with
// its pages in place (each page's regions copied from the prefill pool
// straight into the decode pool's reserved slots), imported, and decoded on
// both engines: the same bits.
TEST(IpcCommunicatorTest, AnEngineSequenceMovesInPlaceBetweenTwoGpuEnginesAndContinuesBitIdentically) {
  auto weights = engine::ModelWeights::LoadDirectory(Runfile(kTinyModelDir));
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto prefill_gpu = EmulatedGpu();
  auto decode_gpu = EmulatedGpu();
  ASSERT_TRUE(prefill_gpu != nullptr && decode_gpu != nullptr);
  kernels::CountingBackend prefill_counted(*prefill_gpu);
  engine::ModelOptions o;
  o.page_size = 16;
  o.max_pages = 32;
  o.max_sequences = 2;
  o.backend = &prefill_counted;
  auto prefill = engine::Model::Create((*weights)->config(), **weights, o);
  ASSERT_TRUE(prefill.ok());
  const int64_t kTokens = 70;  // 4 full pages and a partial one
  const int64_t vocab = (*weights)->config().vocab_size;
  std::vector<engine::TokenId> tokens(kTokens);
  for (int64_t i = 0; i < kTokens; ++i)
    tokens[static_cast<size_t>(i)] = static_cast<engine::TokenId>((i * 13 + 3) % vocab);
  auto src = (*prefill)->sequences().New();
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE((*prefill)->Prefill(*src, tokens).ok());
  // The decode engine is made last, as in a decode process that has run
  // nothing yet: its pools' zero fills are still queued on its stream (the
  // emulator runs nothing unordered) when the pages are to land in place.
  o.backend = decode_gpu.get();
  auto decode = engine::Model::Create((*weights)->config(), **weights, o);
  ASSERT_TRUE(decode.ok());

  IpcCommunicatorFactory decode_side(decode_gpu->peer_memory());
  IpcCommunicatorFactory prefill_side(prefill_counted.peer_memory());
  ChannelReceiverOptions ro;
  ro.default_peer = "prefill-0";
  ro.kind = TransportKind::kCudaIpc;
  auto receiver = ChannelStateReceiver::Create(decode_side, ro);
  ASSERT_TRUE(receiver.ok());
  ChannelStateSender sender(prefill_side);
  engine::SequenceTable& table = (*decode)->sequences();
  auto reservation = table.ReserveImport(kTokens);
  ASSERT_TRUE(reservation.ok());
  auto ticket = TicketFor(table, *reservation, 1, "decode-0", absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(ExpectReservation(**receiver, &*ticket, table, *reservation).ok());
  auto source = SequenceStateSource::Create((*prefill)->sequences(), *src, *ticket, (*weights)->fingerprint(),
                                            common::Hash128{}, /*first_token=*/5, /*first_logprob=*/-0.5f);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::Status sent;
  std::thread sending([&] { sent = sender.Send(*ticket, *source); });
  auto received = (*receiver)->Await(1);
  sending.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_TRUE(received->pages_in_place);
  const absl::Status imported = ImportReceived(table, *reservation, *received);
  ASSERT_TRUE(imported.ok()) << imported;
  // Each of the 4 pages' 2 x attention-layers regions went device to device;
  // the host messages (headers, the state) over the connection.
  EXPECT_EQ(prefill_counted.calls("CopyToPeer"), 4 * 2 * (*prefill)->num_attention_layers());
  // The data-plane metrics' counters: exactly the pages by device copy, on
  // both sides; the state and the frames (a few hundred bytes of headers,
  // the region offer, the page sums, the acks) over the connection.
  const int64_t page_bytes = ticket->num_pages * ticket->page_bytes;
  ASSERT_EQ(ticket->num_pages, 4);
  // A side counts a message once its send returns, which may be after the
  // other side has read (and counted) it: wait for both ends to agree.
  IpcTraffic prefill_traffic, decode_traffic;
  EXPECT_TRUE(common::WaitFor(
      [&] {
        prefill_traffic = TrafficOf(prefill_side);
        decode_traffic = TrafficOf(decode_side);
        return decode_traffic.received_by_socket == prefill_traffic.sent_by_socket &&
               prefill_traffic.received_by_socket == decode_traffic.sent_by_socket;
      },
      absl::Seconds(30)));
  EXPECT_EQ(prefill_traffic.sent_by_device_copy, page_bytes);
  EXPECT_EQ(decode_traffic.received_by_device_copy, page_bytes);
  EXPECT_EQ(prefill_traffic.received_by_device_copy, 0);
  EXPECT_EQ(decode_traffic.sent_by_device_copy, 0);
  const int64_t state_bytes = static_cast<int64_t>(source->state().size());
  EXPECT_GE(prefill_traffic.sent_by_socket, state_bytes);
  EXPECT_LT(prefill_traffic.sent_by_socket - state_bytes, 1024) << "more than the frames went over the connection";
  EXPECT_EQ(decode_traffic.received_by_socket, prefill_traffic.sent_by_socket);
  EXPECT_GT(decode_traffic.sent_by_socket, 0);  // the verdict and the outcome
  EXPECT_LT(decode_traffic.sent_by_socket, 1024);
  EXPECT_EQ(prefill_traffic.received_by_socket, decode_traffic.sent_by_socket);
  for (int step = 0; step < 3; ++step) {
    auto a = (*decode)->DecodeStep({reservation->id}, {static_cast<engine::TokenId>(step + 1)});
    auto b = (*prefill)->DecodeStep({*src}, {static_cast<engine::TokenId>(step + 1)});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << "step " << step;
  }
}

}  // namespace
}  // namespace hybridserve::transport
