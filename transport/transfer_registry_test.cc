// The registry's claim on a transfer: only with its ticket's secret, and
// every refusal leaves the transfer as it was, counted on the right side.

#include "transport/transfer_registry.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "transport/transfer.h"
#include "transport/transfer_secret.h"

namespace hybridserve::transport {
namespace {

Ticket ATicket(uint64_t id) {
  Ticket t;
  t.transfer_id = id;
  t.n_tokens = 3;
  t.max_state_bytes = 10;
  t.deadline = absl::Now() + absl::Seconds(30);
  t.secret = *NewTransferSecret();
  return t;
}

TEST(TransferRegistryTest, ATicketWithoutASixteenByteSecretIsNotExpected) {
  TransferRegistry registry;
  Ticket t = ATicket(1);
  for (size_t bytes : {size_t{0}, size_t{15}, size_t{17}}) {
    t.secret = std::string(bytes, 's');
    EXPECT_EQ(registry.Expect(t).code(), absl::StatusCode::kInvalidArgument) << bytes;
  }
  EXPECT_EQ(registry.pending(), 0);
}

TEST(TransferRegistryTest, OnlyTheTicketsSecretBeginsATransferAndRefusalsTouchNothing) {
  TransferRegistry registry;
  const Ticket t = ATicket(1);
  ASSERT_TRUE(registry.Expect(t).ok());
  // Another secret, one bit off at each end, and none at all.
  for (size_t byte : {size_t{0}, kTransferSecretBytes - 1}) {
    std::string forged = t.secret;
    forged[byte] ^= 1;
    EXPECT_EQ(registry.Begin(1, forged).status().code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(registry.Begin(1, "").status().code(), absl::StatusCode::kUnauthenticated);
  // An id not expected, even with a real secret.
  EXPECT_EQ(registry.Begin(2, t.secret).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(registry.unauthenticated(), 4);
  EXPECT_EQ(registry.refused(), 0);
  // Untouched: the rightful sender begins it, once.
  absl::StatusOr<Ticket> begun = registry.Begin(1, t.secret);
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_EQ(begun->secret, t.secret);
  EXPECT_EQ(registry.Begin(1, t.secret).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.refused(), 1);
  ReceivedState state;
  state.transfer_id = 1;
  ASSERT_TRUE(registry.Complete(1, std::move(state)).ok());
  EXPECT_EQ(registry.Begin(1, t.secret).status().code(), absl::StatusCode::kNotFound);  // finished
  EXPECT_EQ(registry.refused(), 2);
  std::string forged = t.secret;
  forged[3] ^= 4;
  EXPECT_EQ(registry.Begin(1, forged).status().code(), absl::StatusCode::kUnauthenticated);  // not even that told
  EXPECT_TRUE(registry.Await(1).ok());
  // Forgotten: its secret with it, the late sender is a stranger.
  EXPECT_EQ(registry.Begin(1, t.secret).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(registry.unauthenticated(), 6);
  EXPECT_EQ(registry.refused(), 2);
  registry.CountUnauthenticated();
  registry.CountRefused();
  EXPECT_EQ(registry.unauthenticated(), 7);
  EXPECT_EQ(registry.refused(), 3);
}

}  // namespace
}  // namespace hybridserve::transport
