// The prefill pool over real gRPC servers on loopback (fakes of the Prefill
// service): least-outstanding choice, refused calls tried elsewhere, failed
// workers skipped, names resolved (and, over TLS, verified by the name),
// bad targets refused.

#include "prefill/grpc_prefill_client.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/runfiles.h"
#include "common/tls.h"
#include "common/wait_for.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/prefill.grpc.pb.h"

namespace hybridserve::prefill {
namespace {

class FakePrefill final : public v1::Prefill::Service {
 public:
  explicit FakePrefill(int32_t first_token, int port = 0,
                       std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials())
      : first_token_(first_token) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), credentials, &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakePrefill() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* r) override {
    calls_.fetch_add(1);
    last_request_id_ = request->request_id();
    if (refuse_.load() || refusals_left_.fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "full");
    }
    if (block_.load()) {
      entered_.Notify();
      // Held until released, or until the caller cancels (what a prefill
      // worker sees between segments). The synchronous API has no
      // cancellation callback: the context is asked between waits for the
      // release.
      const absl::Time end = absl::Now() + absl::Seconds(10);
      while (!release_.WaitForNotificationWithTimeout(absl::Milliseconds(2)) && absl::Now() < end) {
        if (context->IsCancelled()) {
          cancelled_.fetch_add(1);
          return grpc::Status(grpc::StatusCode::CANCELLED, "the caller cancelled");
        }
      }
    }
    r->set_first_token(first_token_);
    r->mutable_usage()->set_cached_tokens(7);
    r->mutable_usage()->set_resume_kind(v1::RESUME_KIND_EXACT_PREFIX);
    return grpc::Status::OK;
  }

  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  void Shutdown() {
    if (!release_.HasBeenNotified()) release_.Notify();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  std::atomic<int> calls_{0};
  std::atomic<bool> refuse_{false};
  std::atomic<bool> block_{false};
  std::atomic<int> refusals_left_{0};  // answer RESOURCE_EXHAUSTED this many times
  std::atomic<int> cancelled_{0};
  absl::Notification entered_, release_;
  std::string last_request_id_;

 private:
  const int32_t first_token_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

PrefillRequest Call(const std::string& id) {
  PrefillRequest c;
  c.request_id = id;
  c.prompt = {1, 2, 3};
  c.ticket.transfer_id = 1;
  c.ticket.endpoint = "127.0.0.1:1";
  c.ticket.n_tokens = 3;
  c.ticket.max_state_bytes = 1024;
  c.ticket.deadline = absl::Now() + absl::Seconds(10);
  return c;
}

TEST(GrpcPrefillClientTest, ConvertsTheReply) {
  FakePrefill a(42);
  auto client = GrpcPrefillClient::Create({.targets = {a.target()}});
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<PrefillOutcome> r = (*client)->Prefill(Call("x"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first.token, 42);
  EXPECT_EQ(r->usage.cached_tokens, 7);
  EXPECT_EQ(r->usage.resume_kind, ResumeKind::kExactPrefix);
  EXPECT_EQ(a.last_request_id_, "x");
}

TEST(GrpcPrefillClientTest, ARefusedCallIsTriedOnAnotherWorkerAndTheRefuserSkipped) {
  FakePrefill a(1), b(2);
  a.refuse_ = true;
  auto client = GrpcPrefillClient::Create({.targets = {a.target(), b.target()}});
  ASSERT_TRUE(client.ok());
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<PrefillOutcome> r = (*client)->Prefill(Call(absl::StrCat("r", i)));
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
  ASSERT_TRUE(common::WaitFor([&] { return a.calls_.load() + b.calls_.load() == 1; }));
  FakePrefill& busy = a.calls_.load() == 1 ? a : b;
  FakePrefill& idle = a.calls_.load() == 1 ? b : a;
  idle.block_ = false;
  absl::StatusOr<PrefillOutcome> second = (*client)->Prefill(Call("second"));
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
  absl::StatusOr<PrefillOutcome> r = (*named)->Prefill(Call("named"));
  ASSERT_TRUE(r.ok()) << r.status();  // ::1 (if listed) refuses; 127.0.0.1 answers
  EXPECT_EQ(r->first.token, 5);

  auto nowhere = GrpcPrefillClient::Create({.targets = {"no-such-host.invalid:1"}});
  ASSERT_TRUE(nowhere.ok());
  absl::StatusOr<PrefillOutcome> none = (*nowhere)->Prefill(Call("none"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no prefill worker"), std::string::npos) << none.status();
}

// Over TLS a worker found through a name is verified by that name, not by the
// address dialled: a Kubernetes headless Service resolves to pod IPs, and its
// pods' certificates name the Service.
TEST(GrpcPrefillClientTest, AResolvedWorkerIsVerifiedByTheNameItWasResolvedFrom) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/certs");
  const std::string make =
      absl::StrCat("/usr/bin/python3 ", common::Runfile("tools/make_test_certs.py"), " --out ", dir);
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  // The worker's certificate names localhost alone: no IP address.
  ASSERT_EQ(std::system(absl::StrCat(make, " --issue named_prefill --dns localhost").c_str()), 0);
  common::ServerTlsOptions server;
  server.cert_file = dir + "/named_prefill.pem";
  server.key_file = dir + "/named_prefill.key";
  server.client_ca_file = dir + "/ca.pem";
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = common::NewServerCredentials(server);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  FakePrefill worker(5, 0, *credentials);
  const std::string port = worker.target().substr(worker.target().rfind(':') + 1);
  common::ChannelTlsOptions tls;
  tls.ca_file = dir + "/ca.pem";
  tls.cert_file = dir + "/decode.pem";
  tls.key_file = dir + "/decode.key";

  auto named = GrpcPrefillClient::Create({.targets = {"localhost:" + port}, .tls = tls});
  ASSERT_TRUE(named.ok()) << named.status();
  absl::StatusOr<PrefillOutcome> r = (*named)->Prefill(Call("named"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first.token, 5);
  EXPECT_EQ(worker.calls_.load(), 1);

  // The same worker by its address: the certificate does not name it, the
  // handshake fails and no call reaches the worker.
  auto by_address =
      GrpcPrefillClient::Create({.targets = {worker.target()}, .unavailable_wait = absl::ZeroDuration(), .tls = tls});
  ASSERT_TRUE(by_address.ok()) << by_address.status();
  EXPECT_EQ((*by_address)->Prefill(Call("by address")).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(worker.calls_.load(), 1);
}

// A pool that is full (RESOURCE_EXHAUSTED from every worker) is no error of
// an admitted request: the call waits for room and succeeds once there is.
TEST(GrpcPrefillClientTest, ABusyPoolIsWaitedForNotAnError) {
  FakePrefill a(9);
  a.refusals_left_ = 5;
  auto client = GrpcPrefillClient::Create({.targets = {a.target()}, .max_attempts = 2});
  ASSERT_TRUE(client.ok());
  absl::StatusOr<PrefillOutcome> r = (*client)->Prefill(Call("busy"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first.token, 9);
  EXPECT_EQ(a.calls_.load(), 6);  // five refusals, then the answer
}

// Still full at the deadline: the last refusal, named.
TEST(GrpcPrefillClientTest, ABusyPoolUntilTheDeadlineEndsWithItsRefusal) {
  FakePrefill a(9);
  a.refuse_ = true;
  auto client = GrpcPrefillClient::Create({.targets = {a.target()}});
  ASSERT_TRUE(client.ok());
  PrefillRequest call = Call("always-busy");
  call.ticket.deadline = absl::Now() + absl::Milliseconds(300);
  absl::StatusOr<PrefillOutcome> r = (*client)->Prefill(call);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find(a.target()), std::string::npos) << r.status();
  EXPECT_GE(a.calls_.load(), 2);  // it waited and tried again
}

// The call's cancellation cancels the gRPC call in flight (the worker sees
// it), and ends a wait for a busy pool.
TEST(GrpcPrefillClientTest, CancellationReachesTheWorkerAndEndsTheCall) {
  FakePrefill a(1);
  a.block_ = true;
  auto client = GrpcPrefillClient::Create({.targets = {a.target()}});
  ASSERT_TRUE(client.ok());
  PrefillRequest call = Call("cancel-me");
  call.cancellation = std::make_shared<common::Cancellation>();
  absl::StatusOr<PrefillOutcome> r;
  std::thread t([&] { r = (*client)->Prefill(call); });
  ASSERT_TRUE(a.entered_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  call.cancellation->Cancel();
  t.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_TRUE(common::WaitFor([&] { return a.cancelled_.load() == 1; })) << "the worker never saw the cancellation";

  FakePrefill full(2);
  full.refuse_ = true;
  auto busy = GrpcPrefillClient::Create({.targets = {full.target()}});
  ASSERT_TRUE(busy.ok());
  PrefillRequest waiting = Call("waiting");
  waiting.ticket.deadline = absl::Now() + absl::Seconds(60);
  waiting.cancellation = std::make_shared<common::Cancellation>();
  std::thread w([&] { r = (*busy)->Prefill(waiting); });
  ASSERT_TRUE(common::WaitFor([&] { return full.calls_.load() >= 2; })) << "the call never waited for room";
  waiting.cancellation->Cancel();
  w.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
}

// A worker that is down when the call starts and back within
// unavailable_wait (a restart): the call waits for it instead of failing.
// One that stays down fails the call with UNAVAILABLE once the wait is over.
TEST(GrpcPrefillClientTest, AWorkerBackWithinTheUnavailableWaitServesTheCall) {
  int port = 0;
  {
    FakePrefill gone(1);
    port = std::stoi(gone.target().substr(gone.target().rfind(':') + 1));
  }
  auto client =
      GrpcPrefillClient::Create({.targets = {absl::StrCat("127.0.0.1:", port)}, .unavailable_wait = absl::Seconds(30)});
  ASSERT_TRUE(client.ok());
  absl::StatusOr<PrefillOutcome> r;
  std::thread call([&] { r = (*client)->Prefill(Call("restart")); });
  // The first attempt is refused before the worker is back.
  ASSERT_TRUE(common::WaitFor([&] { return !(*client)->workers().empty() && (*client)->workers()[0].skipped; }))
      << "the call never found the worker down";
  FakePrefill back(7, port);
  call.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first.token, 7);
  EXPECT_EQ(back.calls_.load(), 1);

  FakePrefill stays(1);
  const std::string target = stays.target();
  auto gone_for_good = GrpcPrefillClient::Create({.targets = {target}, .unavailable_wait = absl::Milliseconds(200)});
  ASSERT_TRUE(gone_for_good.ok());
  stays.Shutdown();
  absl::StatusOr<PrefillOutcome> failed = (*gone_for_good)->Prefill(Call("gone"));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
}

// A call that skips the unavailable wait fails at once when every worker is
// down, however long the pool's wait (an hour here: a call that waited would
// still be running when the test gives up on it and cancels it).
TEST(GrpcPrefillClientTest, ACallThatSkipsTheUnavailableWaitFailsAtOnceWhenEveryWorkerIsDown) {
  FakePrefill stays(1);
  const std::string target = stays.target();
  auto client = GrpcPrefillClient::Create({.targets = {target}, .unavailable_wait = absl::Hours(1)});
  ASSERT_TRUE(client.ok());
  stays.Shutdown();
  PrefillRequest call = Call("skip");
  call.ticket.deadline = absl::Now() + absl::Hours(1);
  call.skip_unavailable_wait = true;
  call.cancellation = std::make_shared<common::Cancellation>();
  absl::StatusOr<PrefillOutcome> r;
  std::atomic<bool> done{false};
  std::thread t([&] {
    r = (*client)->Prefill(call);
    done = true;
  });
  const bool returned = common::WaitFor([&] { return done.load(); }, absl::Seconds(20));
  call.cancellation->Cancel();
  t.join();
  EXPECT_TRUE(returned) << "the call waited for the worker to come back";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

TEST(GrpcPrefillClientTest, RefusesBadOptions) {
  EXPECT_EQ(GrpcPrefillClient::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GrpcPrefillClient::Create({.targets = {"no-port"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GrpcPrefillClient::Create({.targets = {"h:1"}, .max_attempts = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::prefill
