// main() for tests that run gRPC in their own process: GoogleTest's main
// with gRPC shut down completely after the last test (common/grpc_runtime.h),
// so that no gRPC thread that did TLS work outlives OpenSSL's cleanup at exit.

#include "common/grpc_runtime.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  hybridserve::common::GrpcRuntime grpc;
  return RUN_ALL_TESTS();
}
