// NcclCommunicator on real GPUs, and the NCCL data plane over it. NCCL does
// not put two ranks of one communicator on one GPU, so the channel tests need
// two devices and skip otherwise (fail where HS_REQUIRE_GPUS declares two);
// without any device the factory's refusal is what is tested.

#include "transport/nccl_communicator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_requirement.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/nccl_ops.h"

namespace hybridserve::transport {
namespace {

using ::testing::HasSubstr;

TEST(NcclCommunicatorFactoryTest, WithoutACudaDeviceCreateIsUnavailableAndSaysWhy) {
  if (nccl_ops::DeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  auto f = NcclCommunicatorFactory::Create({});
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(f.status().message(), HasSubstr("no CUDA device"));
}

// NCCL_COMM_ID would make every unique id carry NCCL's constant magic:
// refused with or without a device.
TEST(NcclCommunicatorFactoryTest, WithNcclCommIdSetCreateIsRefused) {
  ASSERT_EQ(setenv("NCCL_COMM_ID", "127.0.0.1:29500", /*overwrite=*/1), 0);
  auto f = NcclCommunicatorFactory::Create({});
  unsetenv("NCCL_COMM_ID");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(f.status().message(), HasSubstr("NCCL_COMM_ID is set"));
}

class TwoGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::cuda_testing::HaveGpusOrSkip(2, nccl_ops::DeviceCount(), "NCCL will not put both ranks on one GPU")) {
      return;
    }
    auto a = NcclCommunicatorFactory::Create({0});
    auto b = NcclCommunicatorFactory::Create({1});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    decode_gpu_ = *std::move(a);
    prefill_gpu_ = *std::move(b);
  }

  // Rank 0 on device 0, rank 1 on device 1, both joined.
  void Connect(std::unique_ptr<Communicator>* r0, std::unique_ptr<Communicator>* r1) {
    auto id = decode_gpu_->NewUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_EQ(id->size(), 128u);
    auto c0 = decode_gpu_->Join(*id, 0);
    auto c1 = prefill_gpu_->Join(*id, 1);
    ASSERT_TRUE(c0.ok() && c1.ok()) << c0.status() << c1.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    absl::Status ready1;
    std::thread t([&] { ready1 = (*c1)->WaitReady(deadline); });
    const absl::Status ready0 = (*c0)->WaitReady(deadline);
    t.join();
    ASSERT_TRUE(ready0.ok() && ready1.ok()) << ready0 << ready1;
    *r0 = *std::move(c0);
    *r1 = *std::move(c1);
  }

  std::unique_ptr<NcclCommunicatorFactory> decode_gpu_, prefill_gpu_;
};

TEST_F(TwoGpuTest, MessagesOfManyChunksArriveBitIdentical) {
  std::unique_ptr<Communicator> r0, r1;
  Connect(&r0, &r1);
  for (size_t bytes : {size_t{1}, size_t{48}, (size_t{4} << 20) * 2 + 12345}) {
    std::string sent(bytes, '\0');
    std::mt19937_64 rng(bytes);
    for (char& c : sent) c = static_cast<char>(rng());
    std::string got(bytes, '\0');
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::Status send;
    std::thread t([&] { send = r1->Send(sent.data(), sent.size(), deadline); });
    const absl::Status recv = r0->Recv(got.data(), got.size(), deadline);
    t.join();
    ASSERT_TRUE(send.ok() && recv.ok()) << send << recv;
    EXPECT_EQ(got, sent) << bytes;
  }
}

TEST_F(TwoGpuTest, ARecvWithNothingSentTimesOutAndThePeerSeesTheChannelGoneWithinItsDeadline) {
  std::unique_ptr<Communicator> r0, r1;
  Connect(&r0, &r1);
  char byte = 0;
  EXPECT_EQ(r0->Recv(&byte, 1, absl::Now() + absl::Milliseconds(200)).code(), absl::StatusCode::kDeadlineExceeded);
  r0.reset();  // aborted
  const absl::Time start = absl::Now();
  const absl::Status s = r1->Recv(&byte, 1, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

TEST_F(TwoGpuTest, AbortInterruptsABlockedRecv) {
  std::unique_ptr<Communicator> r0, r1;
  Connect(&r0, &r1);
  char byte = 0;
  absl::Status s;
  std::thread t([&] { s = r0->Recv(&byte, 1, absl::InfiniteFuture()); });
  r0->Abort();
  t.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

// A source of pseudo-random pages for the data plane over real NCCL.
class RandomSource final : public StateSource {
 public:
  RandomSource() : pages_(3, std::string(5000, '\0')), state_(999, '\0') {
    std::mt19937_64 rng(7);
    for (std::string& p : pages_) {
      for (char& c : p) c = static_cast<char>(rng());
    }
    for (char& c : state_) c = static_cast<char>(rng());
  }
  int64_t num_pages() const override { return 3; }
  int64_t page_bytes() const override { return 5000; }
  absl::Status ReadPage(int64_t index, absl::Span<char> out) const override {
    std::memcpy(out.data(), pages_[static_cast<size_t>(index)].data(), out.size());
    return absl::OkStatus();
  }
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return 3; }
  float first_logprob() const override { return -0.5f; }

  std::vector<std::string> pages_;
  std::string state_;
};

TEST_F(TwoGpuTest, TheDataPlaneMovesAStateBitIdenticallyAndReusesItsChannel) {
  auto receiver = ChannelStateReceiver::Create(*decode_gpu_, ChannelReceiverOptions{});
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  ChannelStateSender sender(*prefill_gpu_);
  const RandomSource source;
  for (uint64_t id : {uint64_t{1}, uint64_t{2}}) {
    Ticket t;
    t.transfer_id = id;
    t.endpoint = "decode-0";
    t.n_tokens = 50;
    t.num_pages = 3;
    t.page_bytes = 5000;
    t.max_state_bytes = 1000;
    t.deadline = absl::Now() + absl::Seconds(60);
    ASSERT_TRUE((*receiver)->ExpectFrom("prefill-0", &t).ok());
    absl::Status sent;
    std::thread s([&] { sent = sender.Send(t, source); });
    auto got = (*receiver)->Await(id);
    s.join();
    ASSERT_TRUE(sent.ok() && got.ok()) << sent << got.status();
    ASSERT_EQ(got->pages.size(), static_cast<int64_t>(source.pages_.size()));
    for (size_t i = 0; i < source.pages_.size(); ++i) EXPECT_EQ(got->pages[static_cast<int64_t>(i)], source.pages_[i]);
    EXPECT_EQ(got->state, source.state_);
  }
  EXPECT_EQ((*receiver)->channels(), 1);
  EXPECT_EQ(sender.channels(), 1);
}

}  // namespace
}  // namespace hybridserve::transport
