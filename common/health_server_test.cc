// The plaintext health port (health_server.h): it answers the health service
// by name, follows SetServing, and serves nothing else, server reflection
// included even when the process registered it for its other servers (as
// worker::GrpcServer does).

#include "common/health_server.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/health.h"
#include "common/raw_grpc_call.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

// One unary call by method name with a raw request; the status and the raw
// response.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& request, std::string* response) {
  RawCallResult r = RawUnaryCall(channel, method, request, absl::Seconds(5));
  if (response != nullptr) *response = std::move(r.response);
  return r.status;
}

// grpc.health.v1.HealthCheckRequest{service} and the response SERVING /
// NOT_SERVING, as bytes.
std::string HealthRequest(const std::string& service) {
  return service.empty() ? "" : absl::StrCat("\x0a", std::string(1, static_cast<char>(service.size())), service);
}
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

TEST(HealthServerTest, AnswersHealthByNameAndNothingElseReflectionIncluded) {
  // What the workers do before they start this server: reflection for every
  // server the process builds from here on.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  absl::StatusOr<std::unique_ptr<HealthServer>> server = HealthServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials());
  const std::string check = "/grpc.health.v1.Health/Check";

  std::string response;
  ASSERT_TRUE(RawCall(channel, check, HealthRequest(""), &response).ok());
  EXPECT_EQ(response, kServing);
  ASSERT_TRUE(RawCall(channel, check, HealthRequest(kLivenessHealthService), &response).ok());
  EXPECT_EQ(response, kServing);
  EXPECT_EQ(RawCall(channel, check, HealthRequest("hybridserve.v1.Generation"), &response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // Draining: not ready, still alive.
  (*server)->SetServing("", false);
  ASSERT_TRUE(RawCall(channel, check, HealthRequest(""), &response).ok());
  EXPECT_EQ(response, kNotServing);
  ASSERT_TRUE(RawCall(channel, check, HealthRequest(kLivenessHealthService), &response).ok());
  EXPECT_EQ(response, kServing);

  // Nothing else: the services of the main port, and server reflection
  // (ServerReflectionInfo is a stream; a unary call reaches the method all
  // the same, and an unregistered one is UNIMPLEMENTED either way).
  for (const std::string method : {"/hybridserve.v1.Generation/Generate", "/hybridserve.v1.CacheStore/Lookup",
                                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"}) {
    EXPECT_EQ(RawCall(channel, method, "", nullptr).error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
  }
}

}  // namespace
}  // namespace hybridserve::common
