// common/grpc_runtime.h: gRPC is down (its threads joined) when a runtime
// goes, even right after a call, when gRPC's own subchannel and transport
// still hold it up and drop it on its threads. Linked with GoogleTest's
// plain main: nothing else holds gRPC up here.

#include "common/grpc_runtime.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/raw_grpc_call.h"
#include "grpc/grpc.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

TEST(GrpcRuntimeTest, GrpcIsDownWhenTheRuntimeGoesRightAfterACall) {
  ASSERT_EQ(grpc_is_initialized(), 0);
  grpc::EnableDefaultHealthCheckService(true);
  // Several rounds: each ends with the channel's subchannel and both
  // transports still being torn down on gRPC's threads.
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    {
      GrpcRuntime runtime;
      ASSERT_NE(grpc_is_initialized(), 0);
      int port = 0;
      grpc::ServerBuilder builder;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
      ASSERT_NE(server, nullptr);
      std::shared_ptr<grpc::Channel> channel =
          grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
      ASSERT_TRUE(RawUnaryCall(channel, "/grpc.health.v1.Health/Check").status.ok());
      channel.reset();
      server->Shutdown();
    }
    EXPECT_EQ(grpc_is_initialized(), 0);
  }
}

}  // namespace
}  // namespace hybridserve::common
