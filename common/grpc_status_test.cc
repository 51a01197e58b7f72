#include "common/grpc_status.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

// Every canonical code, written out by name on both sides: the mapping must
// pair namesakes, not merely agree with a cast of the numeric values.
const std::vector<std::pair<absl::StatusCode, grpc::StatusCode>>& AllCodes() {
  static const auto* codes = new std::vector<std::pair<absl::StatusCode, grpc::StatusCode>>{
      {absl::StatusCode::kOk, grpc::StatusCode::OK},
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  return *codes;
}

TEST(GrpcStatusTest, TableCoversSeventeenDistinctCodes) {
  ASSERT_EQ(AllCodes().size(), 17u);
  for (size_t i = 0; i < AllCodes().size(); ++i) {
    for (size_t j = i + 1; j < AllCodes().size(); ++j) {
      EXPECT_NE(AllCodes()[i].first, AllCodes()[j].first);
      EXPECT_NE(AllCodes()[i].second, AllCodes()[j].second);
    }
  }
}

TEST(GrpcStatusTest, EveryAbslCodeMapsToItsGrpcNamesake) {
  for (const auto& [absl_code, grpc_code] : AllCodes()) {
    EXPECT_EQ(ToGrpcStatusCode(absl_code), grpc_code) << absl::StatusCodeToString(absl_code);
  }
}

TEST(GrpcStatusTest, EveryGrpcCodeMapsToItsAbslNamesake) {
  for (const auto& [absl_code, grpc_code] : AllCodes()) {
    EXPECT_EQ(FromGrpcStatusCode(grpc_code), absl_code) << absl::StatusCodeToString(absl_code);
  }
}

TEST(GrpcStatusTest, ErrorStatusKeepsCodeAndMessageToGrpc) {
  for (const auto& [absl_code, grpc_code] : AllCodes()) {
    if (absl_code == absl::StatusCode::kOk) continue;
    const std::string message = "entry 0x2a: " + absl::StatusCodeToString(absl_code);
    const grpc::Status g = ToGrpcStatus(absl::Status(absl_code, message));
    EXPECT_EQ(g.error_code(), grpc_code);
    EXPECT_EQ(g.error_message(), message);
  }
}

TEST(GrpcStatusTest, ErrorStatusKeepsCodeAndMessageFromGrpc) {
  for (const auto& [absl_code, grpc_code] : AllCodes()) {
    if (grpc_code == grpc::StatusCode::OK) continue;
    const std::string message = "peer said: " + absl::StatusCodeToString(absl_code);
    const absl::Status a = FromGrpcStatus(grpc::Status(grpc_code, message));
    EXPECT_EQ(a.code(), absl_code);
    EXPECT_EQ(a.message(), message);
  }
}

TEST(GrpcStatusTest, RoundTripsAreIdentityForEveryErrorCode) {
  // Bytes a message may hold: embedded NUL, non-ASCII, newline.
  constexpr char kMessage[] = "checksum \0 mismatch \xc3\xa9\n";
  const std::string message(kMessage, sizeof(kMessage) - 1);
  for (const auto& [absl_code, grpc_code] : AllCodes()) {
    if (absl_code == absl::StatusCode::kOk) continue;
    const absl::Status original(absl_code, message);
    EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(original)), original);
    const grpc::Status wire(grpc_code, message);
    const grpc::Status back = ToGrpcStatus(FromGrpcStatus(wire));
    EXPECT_EQ(back.error_code(), grpc_code);
    EXPECT_EQ(back.error_message(), message);
  }
}

TEST(GrpcStatusTest, OkMapsToOkBothWays) {
  const grpc::Status g = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(g.ok());
  EXPECT_EQ(g.error_message(), "");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  // gRPC lets an OK status carry a message; absl has no such status.
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::OK, "ignored")), absl::OkStatus());
}

// grpc::StatusCode has no fixed underlying type: its enumerators (-1..16) make
// exactly the values in [-32, 31] valid, so a stray code is tested with 20;
// absl::StatusCode is backed by int, so 42 is valid there.
TEST(GrpcStatusTest, CodesOutsideTheCanonicalSetBecomeUnknown) {
  EXPECT_EQ(FromGrpcStatusCode(grpc::StatusCode::DO_NOT_USE), absl::StatusCode::kUnknown);
  EXPECT_EQ(FromGrpcStatusCode(static_cast<grpc::StatusCode>(20)), absl::StatusCode::kUnknown);
  EXPECT_EQ(ToGrpcStatusCode(static_cast<absl::StatusCode>(42)), grpc::StatusCode::UNKNOWN);
  const absl::Status a = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd peer"));
  EXPECT_EQ(a.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(a.message(), "odd peer");
}

}  // namespace
}  // namespace hybridserve::common
