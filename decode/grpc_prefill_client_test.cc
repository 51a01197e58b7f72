// The prefill pool over real gRPC servers on loopback (fakes of the Prefill
// service): least-outstanding choice, refused calls tried elsewhere, failed
// workers skipped, names resolved, bad targets refused.

#include "decode/grpc_prefill_client.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/prefill.grpc.pb.h"

namespace hybridserve::decode {
namespace {

class FakePrefill final : public v1::Prefill::Service {
 public:
  explicit FakePrefill(int32_t first_token) : first_token_(first_token) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakePrefill() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  grpc::Status Prefill(grpc::ServerContext*, const v1::PrefillRequest* request, v1::PrefillResponse* r) override {
    calls_.fetch_add(1);
    last_request_id_ = request->request().request_id();
    if (refuse_.load()) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "full");
    if (block_.load()) {
      entered_.Notify();
      release_.WaitForNotificationWithTimeout(absl::Seconds(10));
    }
    r->set_first_token(first_token_);
    r->mutable_usage()->set_cached_tokens(7);
    r->mutable_usage()->set_resume_kind(v1::RESUME_KIND_EXACT_PREFIX);
    return grpc::Status::OK;
  }

  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  std::atomic<int> calls_{0};
  std::atomic<bool> refuse_{false};
  std::atomic<bool> block_{false};
  absl::Notification entered_, release_;
  std::string last_request_id_;

 private:
  const int32_t first_token_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

PrefillCall Call(const std::string& id) {
  PrefillCall c;
  c.request_id = id;
  c.prompt = {1, 2, 3};
  c.ticket.transfer_id = 1;
  c.ticket.endpoint = "127.0.0.1:1";
  c.ticket.n_tokens = 3;
  c.ticket.max_state_bytes = 1024;
  c.deadline = absl::Now() + absl::Seconds(10);
  return c;
}

TEST(GrpcPrefillClientTest, ConvertsTheReply) {
  FakePrefill a(42);
  auto client = GrpcPrefillClient::Create({.targets = {a.target()}});
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<PrefillReply> r = (*client)->Prefill(Call("x"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first.token, 42);
  EXPECT_EQ(r->cached_tokens, 7);
  EXPECT_EQ(r->resume_kind, ResumeKind::kExactPrefix);
  EXPECT_EQ(a.last_request_id_, "x");
}

TEST(GrpcPrefillClientTest, ARefusedCallIsTriedOnAnotherWorkerAndTheRefuserSkipped) {
  FakePrefill a(1), b(2);
  a.refuse_ = true;
  auto client = GrpcPrefillClient::Create({.targets = {a.target(), b.target()}});
  ASSERT_TRUE(client.ok());
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<PrefillReply> r = (*client)->Prefill(Call(absl::StrCat("r", i)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->first.token, 2);
  }
  // After its refusal, a was skipped: at most one call reached it.
  EXPECT_EQ(a.calls_.load(), 1);
  EXPECT_EQ(b.calls_.load(), 4);
  bool a_skipped = false;
  for (const auto& w : (*client)->workers()) {
    if (w.address == "ipv4:" + a.target()) a_skipped = w.skipped;
  }
  EXPECT_TRUE(a_skipped);
}

TEST(GrpcPrefillClientTest, PicksTheWorkerWithFewestOutstandingCalls) {
  FakePrefill a(1), b(2);
  a.block_ = true;
  b.block_ = true;
  auto client = GrpcPrefillClient::Create({.targets = {a.target(), b.target()}});
  ASSERT_TRUE(client.ok());
  std::thread first([&] { EXPECT_TRUE((*client)->Prefill(Call("first")).ok()); });
  // Whichever worker took the first call holds it; the second goes to the other.
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (a.calls_.load() + b.calls_.load() < 1 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  FakePrefill& busy = a.calls_.load() == 1 ? a : b;
  FakePrefill& idle = a.calls_.load() == 1 ? b : a;
  idle.block_ = false;
  absl::StatusOr<PrefillReply> second = (*client)->Prefill(Call("second"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(idle.calls_.load(), 1);
  EXPECT_EQ(busy.calls_.load(), 1);
  busy.release_.Notify();
  first.join();
}

TEST(GrpcPrefillClientTest, ResolvesNamesAndFailsClearlyWhenNothingResolves) {
  FakePrefill a(5);
  const std::string port = a.target().substr(a.target().rfind(':') + 1);
  auto named = GrpcPrefillClient::Create({.targets = {"localhost:" + port}});
  ASSERT_TRUE(named.ok());
  EXPECT_FALSE((*named)->workers().empty());
  absl::StatusOr<PrefillReply> r = (*named)->Prefill(Call("named"));
  ASSERT_TRUE(r.ok()) << r.status();  // ::1 (if listed) refuses; 127.0.0.1 answers
  EXPECT_EQ(r->first.token, 5);

  auto nowhere = GrpcPrefillClient::Create({.targets = {"no-such-host.invalid:1"}});
  ASSERT_TRUE(nowhere.ok());
  absl::StatusOr<PrefillReply> none = (*nowhere)->Prefill(Call("none"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no prefill worker"), std::string::npos) << none.status();
}

TEST(GrpcPrefillClientTest, RefusesBadOptions) {
  EXPECT_EQ(GrpcPrefillClient::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GrpcPrefillClient::Create({.targets = {"no-port"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GrpcPrefillClient::Create({.targets = {"h:1"}, .max_attempts = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::decode
