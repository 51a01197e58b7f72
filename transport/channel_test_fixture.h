#ifndef HYBRIDSERVE_TRANSPORT_CHANNEL_TEST_FIXTURE_H_
#define HYBRIDSERVE_TRANSPORT_CHANNEL_TEST_FIXTURE_H_

// Test-only: what the channel data plane's tests share: pseudo-random
// sources, host buffers standing for reserved slots, and a sender and a
// receiver over the in-memory fake communicator with faults injected per
// message.
//
// Message indices on the fake link follow channel_protocol.h: the sender
// (rank 1) sends 0 begin header, 1 begin payload, then staged header 2 + 2i
// and payload 3 + 2i of page i, or in place region r of page i as message
// 2 + i * regions + r; the receiver (rank 0) sends 0 the verdict's header,
// 1 its payload, 2 and 3 the final ack. Pages in place are tested with host
// buffers standing for device memory (the fake copies whatever it is given).

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/fake_communicator.h"
#include "transport/transfer.h"

namespace hybridserve::transport {

inline constexpr int64_t kPages = 4;
inline constexpr int64_t kPageBytes = 1000;
inline constexpr int64_t kStateBytes = 777;
inline constexpr char kPeer[] = "prefill-0:9000";

// Pseudo-random pages and state from a seed. `on_read`, when set, runs before
// each ReadPage and may fail it.
class RandomSource final : public StateSource {
 public:
  explicit RandomSource(uint64_t seed, int64_t num_pages = kPages, int64_t page_bytes = kPageBytes) {
    std::mt19937_64 rng(seed);
    auto fill = [&rng](std::string& s) {
      for (char& c : s) c = static_cast<char>(rng());
    };
    pages_.assign(static_cast<size_t>(num_pages), std::string(static_cast<size_t>(page_bytes), '\0'));
    for (std::string& p : pages_) fill(p);
    state_.assign(kStateBytes, '\0');
    fill(state_);
    page_bytes_ = page_bytes;
  }

  int64_t num_pages() const override { return static_cast<int64_t>(pages_.size()); }
  int64_t page_bytes() const override { return page_bytes_; }
  absl::Status ReadPage(int64_t index, absl::Span<char> out) const override {
    if (on_read) {
      if (absl::Status s = on_read(index); !s.ok()) return s;
    }
    std::memcpy(out.data(), pages_[static_cast<size_t>(index)].data(), out.size());
    return absl::OkStatus();
  }
  // With `split` set, each page as regions of those sizes over its bytes.
  absl::StatusOr<std::vector<MemoryRegion>> PageRegions(int64_t index) const override {
    if (split.empty()) return StateSource::PageRegions(index);
    std::vector<MemoryRegion> regions;
    char* p = const_cast<char*>(pages_[static_cast<size_t>(index)].data());
    for (int64_t bytes : split) {
      regions.push_back(MemoryRegion{p, static_cast<size_t>(bytes)});
      p += bytes;
    }
    return regions;
  }
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return 4242; }
  float first_logprob() const override { return -0.625f; }

  const std::vector<std::string>& pages() const { return pages_; }

  std::function<absl::Status(int64_t)> on_read;
  std::vector<int64_t> split;

 private:
  std::vector<std::string> pages_;
  std::string state_;
  int64_t page_bytes_ = 0;
};

// Host buffers standing for reserved slots: page i of `storage`, split into
// regions of `split`. `storage` outlives the sink.
class HostSink final : public PageSink {
 public:
  HostSink(std::vector<std::string>* storage, const std::vector<int64_t>& split) {
    for (std::string& page : *storage) {
      std::vector<MemoryRegion> regions;
      char* p = page.data();
      for (int64_t bytes : split) {
        regions.push_back(MemoryRegion{p, static_cast<size_t>(bytes)});
        p += bytes;
      }
      pages_.push_back(std::move(regions));
    }
  }
  int64_t num_pages() const override { return static_cast<int64_t>(pages_.size()); }
  const std::vector<MemoryRegion>& PageRegions(int64_t index) const override {
    return pages_[static_cast<size_t>(index)];
  }

 private:
  std::vector<std::vector<MemoryRegion>> pages_;
};

inline std::vector<std::string> EmptySlots(int64_t pages = kPages, int64_t page_bytes = kPageBytes) {
  return std::vector<std::string>(static_cast<size_t>(pages), std::string(static_cast<size_t>(page_bytes), '\0'));
}

// A channel sender and receiver over the fake communicator (the receiver's
// io_timeout as MakeReceiver sets it, 10 s by default).
class ChannelTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeReceiver(absl::Seconds(10)); }

  void MakeReceiver(absl::Duration io_timeout) {
    receiver_.reset();
    ChannelReceiverOptions o;
    o.io_timeout = io_timeout;
    o.join_timeout = absl::Seconds(10);
    auto r = ChannelStateReceiver::Create(factory_, o);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
  }

  // A ticket for the RandomSource shapes, not yet expected.
  static Ticket RandomSourceTicket(uint64_t id, absl::Duration timeout = absl::Seconds(30)) {
    Ticket t;
    t.transfer_id = id;
    t.endpoint = "decode-0";
    t.n_tokens = kPages * 16 + 3;
    t.page_format = common::Hash128{7, 9};
    t.num_pages = kPages;
    t.page_bytes = kPageBytes;
    t.max_state_bytes = 1000;
    t.deadline = absl::Now() + timeout;
    return t;
  }

  // RandomSourceTicket(id, timeout), expected from kPeer (with `sink` for
  // pages in place).
  Ticket Expect(uint64_t id, absl::Duration timeout = absl::Seconds(30), std::unique_ptr<PageSink> sink = nullptr) {
    Ticket t = RandomSourceTicket(id, timeout);
    const absl::Status s = receiver_->ExpectFrom(kPeer, &t, std::move(sink));
    EXPECT_TRUE(s.ok()) << s;
    return t;
  }

  // Sends on another thread and awaits here: {Send's status, Await's result}.
  std::pair<absl::Status, absl::StatusOr<ReceivedState>> Transfer(const Ticket& ticket, const StateSource& source,
                                                                  uint64_t await_id = 0) {
    absl::Status sent;
    std::thread sender([&] { sent = sender_.Send(ticket, source); });
    absl::StatusOr<ReceivedState> received = receiver_->Await(await_id != 0 ? await_id : ticket.transfer_id);
    sender.join();
    return {sent, std::move(received)};
  }

  absl::Status Inject(const Ticket& ticket, FakeFault::Kind kind, int from_rank, int64_t message, size_t byte = 0,
                      size_t size = 0) {
    FakeFault f;
    f.kind = kind;
    f.from_rank = from_rank;
    f.message = message;
    f.byte = byte;
    f.size = size;
    return factory_.InjectFault(ticket.channel_id, f);
  }

  static void ExpectIdentical(const ReceivedState& got, const RandomSource& source) {
    ASSERT_EQ(got.pages.size(), static_cast<int64_t>(source.pages().size()));
    for (int64_t i = 0; i < got.pages.size(); ++i) EXPECT_EQ(got.pages[i], source.pages()[i]) << "page " << i;
    EXPECT_EQ(got.state, source.state());
    EXPECT_EQ(got.first_token, 4242);
    EXPECT_EQ(got.first_logprob, -0.625f);
  }

  FakeCommunicatorFactory factory_;
  ChannelStateSender sender_{factory_};
  std::unique_ptr<ChannelStateReceiver> receiver_;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_CHANNEL_TEST_FIXTURE_H_
