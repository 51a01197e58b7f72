// CallAdmission on its own: slots counted per peer and overall, refusals name
// the flag and the limit, slots come back when destroyed or moved over.

#include "cachestore/server/call_admission.h"

#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using ::testing::HasSubstr;

TEST(CallAdmissionTest, PeerLimitRefusesOnlyThatPeer) {
  CallAdmission admission(/*max_calls=*/10, /*max_calls_per_peer=*/2);
  std::vector<CallAdmission::Slot> held;
  for (int i = 0; i < 2; ++i) {
    auto slot = admission.Admit("ipv4:127.0.0.1:1000");
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  auto refused = admission.Admit("ipv4:127.0.0.1:1000");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max_streams_per_peer=2 calls in flight from this client"));
  EXPECT_TRUE(admission.Admit("ipv4:127.0.0.1:1001").ok());  // another connection
  EXPECT_EQ(admission.in_flight(), 2);                       // the 1001 slot was dropped at once
  held.pop_back();
  EXPECT_TRUE(admission.Admit("ipv4:127.0.0.1:1000").ok());
}

TEST(CallAdmissionTest, TotalLimitRefusesEveryPeer) {
  CallAdmission admission(/*max_calls=*/3, /*max_calls_per_peer=*/3);
  std::vector<CallAdmission::Slot> held;
  for (int i = 0; i < 3; ++i) held.push_back(*admission.Admit(std::to_string(i)));
  auto refused = admission.Admit("new peer");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max_streams=3 calls in flight over all clients"));
  EXPECT_EQ(admission.in_flight(), 3);
  held.clear();
  EXPECT_EQ(admission.in_flight(), 0);
}

TEST(CallAdmissionTest, MovedSlotIsGivenBackOnce) {
  CallAdmission admission(/*max_calls=*/2, /*max_calls_per_peer=*/2);
  std::optional<CallAdmission::Slot> a(*admission.Admit("p"));
  CallAdmission::Slot b = *admission.Admit("q");
  CallAdmission::Slot c(std::move(*a));
  a.reset();  // moved from: gives nothing back
  EXPECT_EQ(admission.in_flight(), 2);
  c = std::move(b);  // c's own slot ("p") is given back, b's moves in
  EXPECT_EQ(admission.in_flight(), 1);
  EXPECT_TRUE(admission.Admit("p").ok());
}

// The drain: once closed, every call is refused with UNAVAILABLE while those
// in flight go on; AwaitIdle returns when the last one ends.
TEST(CallAdmissionTest, ClosedRefusesNewCallsAndAwaitsThoseInFlight) {
  CallAdmission admission(/*max_calls=*/4, /*max_calls_per_peer=*/4);
  std::optional<CallAdmission::Slot> held(*admission.Admit("p"));
  admission.Close();
  absl::StatusOr<CallAdmission::Slot> refused = admission.Admit("q");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("draining"));
  EXPECT_FALSE(admission.AwaitIdle(absl::Now() + absl::Milliseconds(20)));
  std::thread ender([&] { held.reset(); });
  EXPECT_TRUE(admission.AwaitIdle(absl::Now() + absl::Seconds(30)));
  ender.join();
  EXPECT_EQ(admission.in_flight(), 0);
}

}  // namespace
}  // namespace hybridserve::cachestore
