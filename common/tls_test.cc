// common/tls.h against real certificates made at test time
// (tools/make_test_certs.py) and a real gRPC server on loopback serving the
// standard health service: who gets in, with which status, and rotation of
// the server's certificate on disk without a restart.

#include "common/tls.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/raw_grpc_call.h"
#include "common/runfiles.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

using ::testing::HasSubstr;

// grpc.health.v1.Health/Check of the whole server over `channel`; the server
// certificate the call saw goes to `server_pem` when given.
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel, std::string* server_pem = nullptr) {
  RawCallResult r = RawUnaryCall(channel, "/grpc.health.v1.Health/Check", "", absl::Seconds(5));
  if (server_pem != nullptr) *server_pem = std::move(r.server_pem);
  return r.status;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(std::getenv("TEST_TMPDIR"), "/certs"));
    const std::string command =
        absl::StrCat("/usr/bin/python3 ", Runfile("tools/make_test_certs.py"), " --out ", *dir_);
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static std::string File(const std::string& name) { return absl::StrCat(*dir_, "/", name); }

  // A server with the health service, over `options`.
  void Serve(const ServerTlsOptions& options) {
    grpc::EnableDefaultHealthCheckService(true);
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = NewServerCredentials(options);
    ASSERT_TRUE(creds.ok()) << creds.status();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    server_->GetHealthCheckService()->SetServingStatus(true);
  }

  ServerTlsOptions Mutual(std::vector<std::string> allowed, ClientAuth auth = ClientAuth::kRequire) {
    ServerTlsOptions o;
    o.cert_file = File("prefill.pem");
    o.key_file = File("prefill.key");
    o.client_ca_file = File("ca.pem");
    o.client_auth = auth;
    o.allowed_peers = std::move(allowed);
    o.refresh = absl::Seconds(1);
    return o;
  }

  // A health Check over a new channel as `client` ("" for no certificate),
  // trusting `ca`; the status, and the server certificate the call saw.
  grpc::Status Check(const std::string& client, const std::string& ca = "ca.pem", std::string* server_pem = nullptr) {
    ChannelTlsOptions o;
    o.ca_file = File(ca);
    if (!client.empty()) {
      o.cert_file = File(client + ".pem");
      o.key_file = File(client + ".key");
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = NewChannel(absl::StrCat("127.0.0.1:", port_), o);
    if (!channel.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, std::string(channel.status().message()));
    return HealthCheck(*channel, server_pem);
  }

  static std::string* dir_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};
std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, AllowedPeerGetsInOthersAreRefusedWithTheirReason) {
  Serve(Mutual({"spiffe://hybridserve.test/decode"}));
  EXPECT_TRUE(Check("decode").ok());
  // A certificate the CA signed, for an identity not allowed.
  grpc::Status stranger = Check("stranger");
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(stranger.error_message(), HasSubstr("spiffe://hybridserve.test/stranger"));
  // Certificates that do not verify fail the handshake: no call is made.
  EXPECT_EQ(Check("").error_code(), grpc::StatusCode::UNAVAILABLE);         // none (required)
  EXPECT_EQ(Check("foreign").error_code(), grpc::StatusCode::UNAVAILABLE);  // another CA
  EXPECT_EQ(Check("expired").error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client that does not trust the server's CA refuses the server.
  EXPECT_EQ(Check("decode", "foreign_ca.pem").error_code(), grpc::StatusCode::UNAVAILABLE);
  // Plaintext to a TLS port.
  EXPECT_EQ(HealthCheck(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, RequestedCertificateIsOptionalButAnAllowListNeedsOne) {
  Serve(Mutual({"spiffe://hybridserve.test/tenant_a"}, ClientAuth::kRequest));
  EXPECT_TRUE(Check("tenant_a").ok());
  grpc::Status none = Check("");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("presented none"));
  EXPECT_EQ(Check("foreign").error_code(), grpc::StatusCode::UNAVAILABLE);  // given, so verified
}

TEST_F(TlsTest, ServerOnlyTlsTakesAnyClient) {
  ServerTlsOptions o;
  o.cert_file = File("decode.pem");
  o.key_file = File("decode.key");
  o.client_auth = ClientAuth::kNone;
  Serve(o);
  EXPECT_TRUE(Check("").ok());
  EXPECT_TRUE(Check("tenant_b").ok());
}

TEST_F(TlsTest, OptionsThatCannotWorkAreRefusedByName) {
  ServerTlsOptions o = Mutual({});
  o.key_file = File("missing.key");
  EXPECT_THAT(std::string(NewServerCredentials(o).status().message()), HasSubstr("missing.key cannot be read"));
  o = Mutual({});
  o.key_file = File("ca.pem");
  EXPECT_THAT(std::string(NewServerCredentials(o).status().message()), HasSubstr("holds no PEM block"));
  o = Mutual({});
  o.client_ca_file = "";
  EXPECT_EQ(NewServerCredentials(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Mutual({"spiffe://x"}, ClientAuth::kNone);
  EXPECT_EQ(NewServerCredentials(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Mutual({"*"});
  EXPECT_EQ(NewServerCredentials(o).status().code(), absl::StatusCode::kInvalidArgument);
  ServerTlsOptions plain;
  plain.client_ca_file = File("ca.pem");
  EXPECT_EQ(NewServerCredentials(plain).status().code(), absl::StatusCode::kInvalidArgument);
  ChannelTlsOptions c;
  c.cert_file = File("decode.pem");
  EXPECT_EQ(NewChannelCredentials(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.ca_file = File("ca.pem");
  EXPECT_EQ(NewChannelCredentials(c).status().code(), absl::StatusCode::kInvalidArgument);  // cert without key
}

TEST(TlsIdentityTest, AnyAllowedMatchesExactly) {
  EXPECT_TRUE(AnyAllowed({"spiffe://t/a", "a.example"}, {"a.example"}));
  EXPECT_FALSE(AnyAllowed({"spiffe://t/a"}, {"spiffe://t/ab", "spiffe://t/"}));
  EXPECT_FALSE(AnyAllowed({}, {"x"}));
}

// The server's certificate renewed on disk (new key, new serial, same CA):
// connections made after the watcher's refresh see the new one, without a
// restart; a channel opened before keeps working.
TEST_F(TlsTest, RenewedCertificateIsServedWithoutARestart) {
  const std::string renew_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/renew");
  ASSERT_EQ(std::system(absl::StrCat("rm -rf ", renew_dir, " && cp -r ", *dir_, " ", renew_dir).c_str()), 0);
  ServerTlsOptions o = Mutual({"spiffe://hybridserve.test/decode"});
  o.cert_file = renew_dir + "/prefill.pem";
  o.key_file = renew_dir + "/prefill.key";
  Serve(o);
  std::string before;
  ASSERT_TRUE(Check("decode", "ca.pem", &before).ok());
  ASSERT_FALSE(before.empty());
  ChannelTlsOptions co;
  co.ca_file = File("ca.pem");
  co.cert_file = File("decode.pem");
  co.key_file = File("decode.key");
  std::shared_ptr<grpc::Channel> kept = *NewChannel(absl::StrCat("127.0.0.1:", port_), co);
  ASSERT_TRUE(kept->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(5))));

  ASSERT_EQ(std::system(absl::StrCat("/usr/bin/python3 ", Runfile("tools/make_test_certs.py"), " --out ", renew_dir,
                                     " --renew prefill")
                            .c_str()),
            0);
  std::string after;
  EXPECT_TRUE(WaitFor(
      [&] {
        after.clear();
        return Check("decode", "ca.pem", &after).ok() && !after.empty() && after != before;
      },
      absl::Seconds(20)))
      << "new connections still see the old certificate";
  EXPECT_TRUE(HealthCheck(kept).ok());
}

}  // namespace
}  // namespace hybridserve::common
