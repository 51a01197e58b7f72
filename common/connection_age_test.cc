// common/connection_age.h on a real server and channel over loopback: a
// connection past its age is told to go away (the channel leaves READY) and
// the next call reconnects; a call on it runs on through an unlimited grace
// and is cut when a short grace ends.

#include "common/connection_age.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/raw_grpc_call.h"
#include "common/wait_for.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(30);  // a hung component, never a timing expectation
// grpc.health.v1.HealthCheckResponse{status: SERVING} and {status: NOT_SERVING}.
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

struct TestServer {
  std::unique_ptr<grpc::Server> server;
  std::string target;
};

TestServer StartServer(absl::Duration max_age, absl::Duration grace) {
  ConnectionAge age;
  age.max_age = max_age;
  age.grace = grace;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ApplyConnectionAge(age, builder);
  TestServer s;
  s.server = builder.BuildAndStart();
  s.target = absl::StrCat("127.0.0.1:", port);
  return s;
}

// Waits until `channel`, READY now, leaves READY: the client saw the
// server's GOAWAY (or lost the connection).
bool LeavesReady(grpc::Channel& channel) {
  return WaitFor(
      [&] {
        if (channel.GetState(false) != GRPC_CHANNEL_READY) return true;
        channel.WaitForStateChange(GRPC_CHANNEL_READY,
                                   std::chrono::system_clock::now() + std::chrono::milliseconds(100));
        return channel.GetState(false) != GRPC_CHANNEL_READY;
      },
      kDeadline);
}

// A grpc.health.v1.Health/Watch of the whole server ("") kept open until it
// ends or the object goes.
class HealthWatch : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit HealthWatch(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {
    grpc::Slice empty("");  // HealthCheckRequest{service: ""}
    request_ = grpc::ByteBuffer(&empty, 1);
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
    stub_.PrepareBidiStreamingCall(&ctx_, "/grpc.health.v1.Health/Watch", grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }
  ~HealthWatch() override {
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (response_.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    {
      absl::MutexLock lock(&mu_);
      responses_.push_back(bytes);
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  // Waits (up to kDeadline) for a response equal to `want`; false if the
  // stream ends first.
  bool AwaitResponse(const std::string& want) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const std::string& r : responses_) {
        if (r == want) return true;
      }
      return done_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&seen), kDeadline);
    for (const std::string& r : responses_) {
      if (r == want) return true;
    }
    return false;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  // Waits for the end of the stream (its deadline bounds it).
  grpc::Status Finish() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  absl::Mutex mu_;
  std::vector<std::string> responses_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(ConnectionAgeTest, AConnectionPastItsAgeIsToldToGoAwayAndTheNextCallReconnects) {
  TestServer s = StartServer(absl::Milliseconds(200), absl::ZeroDuration());
  ASSERT_NE(s.server, nullptr);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(RawUnaryCall(channel, "/grpc.health.v1.Health/Check").status.ok());
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(LeavesReady(*channel)) << "no GOAWAY within " << kDeadline;
  const RawCallResult again = RawUnaryCall(channel, "/grpc.health.v1.Health/Check");
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.response, kServing);
  s.server->Shutdown();
}

TEST(ConnectionAgeTest, ACallOnAConnectionToldToGoAwayRunsOnThroughAnUnlimitedGrace) {
  TestServer s = StartServer(absl::Milliseconds(200), absl::ZeroDuration());
  ASSERT_NE(s.server, nullptr);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials());
  {
    HealthWatch watch(channel);
    ASSERT_TRUE(watch.AwaitResponse(kServing));
    ASSERT_TRUE(LeavesReady(*channel)) << "no GOAWAY within " << kDeadline;
    // A whole second connection's life (a new call opens it, its own GOAWAY
    // ends it) passes beside the first, which still carries the watch: it
    // sees the change.
    ASSERT_TRUE(RawUnaryCall(channel, "/grpc.health.v1.Health/Check").status.ok());
    ASSERT_TRUE(LeavesReady(*channel)) << "no second GOAWAY within " << kDeadline;
    s.server->GetHealthCheckService()->SetServingStatus(false);
    EXPECT_TRUE(watch.AwaitResponse(kNotServing));
    EXPECT_FALSE(watch.done());
  }
  s.server->Shutdown();
}

TEST(ConnectionAgeTest, ACallStillRunningWhenTheGraceEndsIsCut) {
  TestServer s = StartServer(absl::Milliseconds(200), absl::Milliseconds(200));
  ASSERT_NE(s.server, nullptr);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials());
  HealthWatch watch(channel);
  ASSERT_TRUE(watch.AwaitResponse(kServing));
  const grpc::Status status = watch.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  s.server->Shutdown();
}

}  // namespace
}  // namespace hybridserve::common
