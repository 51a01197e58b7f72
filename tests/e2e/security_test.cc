// Tenants and trust through the three real binaries on loopback, every port
// with TLS (issue 25; docs/ARCHITECTURE.md "Trust"): certificates made at
// test time (tools/make_test_certs.py), mutual TLS between the workers and to
// the cachestore with allowed identities, decode taking tenants from client
// certificates (and, in a second decode process, from a trusted proxy's
// header).
//
//   TenantsNeverShareACacheWhateverTheSalt   A's chat cached; B with A's prompt
//                                            and salt: 0 cached; A resumes
//   AbortIsScopedToTheTenant                 B's Abort of A's streaming id
//                                            ends nothing; A's own ends it
//   RequestIdLimitIsTheClientsWithATenant    a 256-byte id is served (by
//                                            certificate and by proxy header),
//                                            257 refused naming 257; a duplicate
//                                            live id refused naming the client's
//                                            id, not its tenant-scoped form
//   ProxyHeaderNamesTheTenantOnlyFromTheProxy  the same by proxy header; a
//                                            forged header refused
//   EveryPortRefusesWhoItShouldNot           decode, prefill, cachestore, the
//                                            health ports, the data plane
//   CertificatesRenewedOnDiskWithoutARestart new connections see the new
//                                            certificates, a stream in flight
//                                            finishes, the pid stays
//   AnotherTenantsPrefixTimesAsCold          200 trials: the TTFT of B with A's
//                                            salt is not told apart from a cold
//                                            prompt's (p > 1e-3), A's own hit is
//                                            (p < 1e-3)

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cachestore/client/grpc_cache_client.h"
#include "common/raw_grpc_call.h"
#include "common/sanitizers.h"
#include "common/tls.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

using ::testing::HasSubstr;

constexpr char kDomain[] = "spiffe://hybridserve.test/";

std::string CertDir() { return absl::StrCat(std::getenv("TEST_TMPDIR"), "/certs"); }
std::string Cert(const std::string& name, const std::string& suffix = ".pem") {
  return absl::StrCat(CertDir(), "/", name, suffix);
}

// The flags that give a process `identity`'s certificate and the CA.
std::vector<std::string> TlsArgs(const std::string& identity) {
  return {"--tls_cert=" + Cert(identity), "--tls_key=" + Cert(identity, ".key"), "--tls_ca=" + Cert("ca"),
          "--tls_refresh=1s", "--health_address=127.0.0.1:0"};
}

// A channel to `target` as `client` ("" for no certificate), trusting `ca`.
std::shared_ptr<grpc::Channel> Channel(int port, const std::string& client, const std::string& ca = "ca") {
  common::ChannelTlsOptions o;
  o.ca_file = Cert(ca);
  if (!client.empty()) {
    o.cert_file = Cert(client);
    o.key_file = Cert(client, ".key");
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = common::NewChannel(absl::StrCat("127.0.0.1:", port), o);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? *channel : nullptr;
}

// A unary call by name with raw request bytes over `channel`; its status, and
// the server certificate it saw when `server_pem` is given.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes = "", std::string* server_pem = nullptr) {
  common::RawCallResult r = common::RawUnaryCall(channel, method, bytes);
  if (server_pem != nullptr) *server_pem = std::move(r.server_pem);
  return r.status;
}
constexpr char kHealthCheck[] = "/grpc.health.v1.Health/Check";

// A prompt of `n` byte tokens no other tag's prompt shares a page with: <bos>,
// the tag's bytes, then text.
std::vector<int32_t> UniquePrompt(int n, const std::string& tag) {
  std::vector<int32_t> out = {257};
  for (unsigned char c : tag) out.push_back(c);
  const std::vector<int32_t> text = TextPrompt(n, 0);
  for (size_t i = 1; static_cast<int>(out.size()) < n; ++i) out.push_back(text[i]);
  return out;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string command =
        absl::StrCat("/usr/bin/python3 ", Runfile("tools/make_test_certs.py"), " --out ", CertDir());
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    StackOptions o;
    // A pin quota a few states fill (EachTenantPinsWithinItsOwnQuota).
    o.cachestore_args.push_back("--pin_quota_mib=1");
    o.cachestore_args.push_back(absl::StrCat("--tls_allowed_peers=", kDomain, "decode,", kDomain, "prefill"));
    for (const std::string& a : TlsArgs("cachestore")) o.cachestore_args.push_back(a);
    o.prefill_args = TlsArgs("prefill");
    o.prefill_args.push_back(absl::StrCat("--tls_allowed_peers=", kDomain, "decode"));
    o.decode_args = TlsArgs("decode");
    o.decode_args.push_back("--tls_client_auth=request");  // --tenant_from: certificate, the default with TLS
    absl::StatusOr<std::unique_ptr<Stack>> s = Stack::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    stack_ = s->release();
    // A second decode worker, behind a front proxy: tenants by header.
    std::vector<std::string> args = {
        "--model_dir=" + Runfile(o.shape.model_dir),
        absl::StrCat("--page_size=", o.shape.page_size),
        "--address=127.0.0.1:0",
        "--metrics_address=127.0.0.1:0",
        "--threads=1",
        absl::StrCat("--prefill=127.0.0.1:", stack_->prefill()->port()),
        absl::StrCat("--cachestore=127.0.0.1:", stack_->cachestore()->port()),
        "--tenant_from=proxy_header",
        absl::StrCat("--trusted_proxies=", kDomain, "proxy"),
    };
    for (const std::string& a : TlsArgs("decode")) args.push_back(a);
    absl::StatusOr<std::unique_ptr<Process>> proxied =
        Process::Start("decode_proxied", "decode/decode", args, "DECODE_READY");
    ASSERT_TRUE(proxied.ok()) << proxied.status();
    proxied_ = proxied->release();
  }
  static void TearDownTestSuite() {
    delete proxied_;
    delete stack_;
  }

  // A three-turn chat as `client` over `channel` (with `metadata`), each
  // turn's cached tokens exactly what the previous turn's end left; the last
  // prompt.
  static std::vector<int32_t> ThreeTurns(const std::shared_ptr<grpc::Channel>& channel, const std::string& salt,
                                         const std::vector<std::pair<std::string, std::string>>& metadata, int seed) {
    std::vector<int32_t> conversation = TextPrompt(90, seed);
    int64_t expected_cached = 0;
    for (int turn = 1; turn <= 3; ++turn) {
      SCOPED_TRACE(absl::StrCat("turn ", turn));
      v1::GenerateRequest r = Request(absl::StrCat("chat-", seed, "-", turn), conversation, 12);
      r.set_cache_salt(salt);
      Generation g = Generate(channel, r, absl::Seconds(60), metadata);
      EXPECT_TRUE(g.status.ok()) << g.status.error_message();
      EXPECT_EQ(g.tokens.size(), 12u);
      EXPECT_EQ(g.complete.usage().cached_tokens(), expected_cached);
      expected_cached = static_cast<int64_t>(conversation.size() + g.tokens.size()) - 1;
      if (turn == 3) break;
      conversation.insert(conversation.end(), g.tokens.begin(), g.tokens.end());
      const std::vector<int32_t> more = TextPrompt(30, seed + turn);
      conversation.insert(conversation.end(), more.begin() + 1, more.end());  // without its <bos>
    }
    return conversation;
  }

  static Stack* stack_;
  static Process* proxied_;
};
Stack* SecurityTest::stack_ = nullptr;
Process* SecurityTest::proxied_ = nullptr;

TEST_F(SecurityTest, TenantsNeverShareACacheWhateverTheSalt) {
  const int port = stack_->decode()->port();
  const std::vector<int32_t> last = ThreeTurns(Channel(port, "tenant_a"), "shared-salt", {}, 1);
  // B sends A's exact last prompt with A's salt: nothing of A's is found.
  v1::GenerateRequest r = Request("b-copies-a", last, 4);
  r.set_cache_salt("shared-salt");
  Generation b = Generate(Channel(port, "tenant_b"), r);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.complete.usage().cached_tokens(), 0);
  EXPECT_EQ(b.complete.usage().resume_kind(), v1::RESUME_KIND_COLD);
  // A again: its own cache answers (the prompt's end was published).
  r.set_request_id("a-again");
  Generation a = Generate(Channel(port, "tenant_a"), r);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.complete.usage().cached_tokens(), static_cast<int64_t>(last.size()));
  // A client asserting a tenant by header on the certificate port is refused.
  Generation forged = Generate(Channel(port, "tenant_b"), r, absl::Seconds(30),
                               {{"x-hybridserve-tenant", absl::StrCat(kDomain, "tenant_a")}});
  EXPECT_EQ(forged.status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << forged.status.error_message();
}

// Request ids are per tenant: while A's long request streams, B's Abort of
// A's id aborts nothing (answered empty, and A's request goes on streaming
// and is still live after it), then A's own Abort ends it.
TEST_F(SecurityTest, AbortIsScopedToTheTenant) {
  constexpr int kMaxTokens = 8000;  // far more than the test lets it reach
  constexpr int kTokensAfter = 32;  // streamed after B's Abort was answered
  const int port = stack_->decode()->port();
  auto stub_a = v1::Generation::NewStub(Channel(port, "tenant_a"));
  auto stub_b = v1::Generation::NewStub(Channel(port, "tenant_b"));
  grpc::ClientContext stream_context;
  stream_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto reader = stub_a->Generate(&stream_context, Request("a-long", TextPrompt(40, 5), kMaxTokens));
  std::atomic<int> received{0};
  std::atomic<bool> ended{false};
  v1::GenerateComplete complete;  // written by the reader, read after join
  grpc::Status stream_status;
  std::thread read([&] {
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (response.has_chunk()) received += response.chunk().token_ids_size();
      if (response.has_complete()) complete = response.complete();
    }
    stream_status = reader->Finish();
    ended = true;
  });
  auto abort_as = [](v1::Generation::Stub& stub) {
    grpc::ClientContext context;
    v1::AbortRequest abort;
    abort.add_request_ids("a-long");
    v1::AbortResponse aborted;
    const grpc::Status status = stub.Abort(&context, abort, &aborted);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return std::vector<std::string>(aborted.aborted_request_ids().begin(), aborted.aborted_request_ids().end());
  };
  ASSERT_TRUE(common::WaitFor([&] { return received > 0 || ended; }));
  ASSERT_FALSE(ended) << "A's request ended before B's Abort: " << stream_status.error_message();
  EXPECT_THAT(abort_as(*stub_b), ::testing::IsEmpty());
  const int at_b_answer = received;
  EXPECT_TRUE(common::WaitFor([&] { return received >= at_b_answer + kTokensAfter || ended; }));
  EXPECT_FALSE(ended) << "A's request ended after B's Abort, at " << received << " tokens, "
                      << v1::FinishReason_Name(complete.finish_reason());
  EXPECT_GE(received, at_b_answer + kTokensAfter);
  EXPECT_THAT(abort_as(*stub_a), ::testing::ElementsAre("a-long"));
  read.join();
  EXPECT_TRUE(stream_status.ok()) << stream_status.error_message();
  EXPECT_EQ(complete.finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_LT(received, kMaxTokens);
}

// The documented bound of a request id (256 bytes) is the client's, whatever
// its tenant's length, and what a client is told names its own id only: decode
// keys a request by the id within the tenant, which no message may reveal.
TEST_F(SecurityTest, RequestIdLimitIsTheClientsWithATenant) {
  const int port = stack_->decode()->port();
  const std::string longest(256, 'r');
  const std::string scoped_marker = absl::StrCat(kDomain, "tenant_a");
  Generation ok = Generate(Channel(port, "tenant_a"), Request(longest, TextPrompt(20, 31), 2));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 2u);
  Generation proxied = Generate(Channel(proxied_->port(), "proxy"), Request(longest, TextPrompt(20, 32), 2),
                                absl::Seconds(60), {{"x-hybridserve-tenant", "org_a"}});
  ASSERT_TRUE(proxied.status.ok()) << proxied.status.error_message();
  EXPECT_EQ(proxied.tokens.size(), 2u);

  Generation too_long = Generate(Channel(port, "tenant_a"), Request(longest + "r", TextPrompt(20, 31), 2));
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(too_long.status.error_message(), "request_id has 257 bytes, at most 256");

  // A's request with the longest id streams; A again with the same id is
  // refused, naming the id as A sent it; B may use the same id meanwhile.
  grpc::ClientContext stream_context;
  stream_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto stub_a = v1::Generation::NewStub(Channel(port, "tenant_a"));
  auto reader = stub_a->Generate(&stream_context, Request(longest, TextPrompt(40, 33), 8000));
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first)) << reader->Finish().error_message();
  Generation duplicate = Generate(Channel(port, "tenant_a"), Request(longest, TextPrompt(20, 34), 2));
  EXPECT_EQ(duplicate.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(duplicate.status.error_message(), absl::StrCat("request_id \"", longest, "\" is already live"));
  EXPECT_THAT(duplicate.status.error_message(), ::testing::Not(HasSubstr(scoped_marker)));
  Generation other = Generate(Channel(port, "tenant_b"), Request(longest, TextPrompt(20, 35), 2));
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.tokens.size(), 2u);

  grpc::ClientContext abort_context;
  v1::AbortRequest abort;
  abort.add_request_ids(longest);
  v1::AbortResponse aborted;
  const grpc::Status abort_status = stub_a->Abort(&abort_context, abort, &aborted);
  ASSERT_TRUE(abort_status.ok()) << abort_status.error_message();
  EXPECT_THAT(aborted.aborted_request_ids(), ::testing::ElementsAre(longest));
  v1::GenerateResponse response;
  v1::GenerateComplete complete;
  while (reader->Read(&response)) {
    if (response.has_complete()) complete = response.complete();
  }
  const grpc::Status stream_status = reader->Finish();
  EXPECT_TRUE(stream_status.ok()) << stream_status.error_message();
  EXPECT_EQ(complete.finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_THAT(complete.error_message(), ::testing::Not(HasSubstr(scoped_marker)));
}

TEST_F(SecurityTest, ProxyHeaderNamesTheTenantOnlyFromTheProxy) {
  const int port = proxied_->port();
  const std::vector<int32_t> last = ThreeTurns(Channel(port, "proxy"), "salt", {{"x-hybridserve-tenant", "org_a"}}, 2);
  v1::GenerateRequest r = Request("org-b-copies-org-a", last, 4);
  r.set_cache_salt("salt");
  Generation b = Generate(Channel(port, "proxy"), r, absl::Seconds(60), {{"x-hybridserve-tenant", "org_b"}});
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.complete.usage().cached_tokens(), 0);
  r.set_request_id("org-a-again");
  Generation a = Generate(Channel(port, "proxy"), r, absl::Seconds(60), {{"x-hybridserve-tenant", "org_a"}});
  EXPECT_EQ(a.complete.usage().cached_tokens(), static_cast<int64_t>(last.size()));
  // The header from anyone but the proxy: refused, and counted as refused.
  Generation forged = Generate(Channel(port, "tenant_b"), r, absl::Seconds(30), {{"x-hybridserve-tenant", "org_a"}});
  EXPECT_EQ(forged.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(forged.status.error_message(), HasSubstr("not one"));
  // (This worker requires client certificates: none fails the handshake.)
  Generation none = Generate(Channel(port, ""), r);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  Generation no_header = Generate(Channel(port, "proxy"), r);
  EXPECT_EQ(no_header.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(SecurityTest, EveryPortRefusesWhoItShouldNot) {
  // Decode: tenants are certificates; a call without one, and certificates
  // that do not verify.
  v1::GenerateRequest r = Request("refused", TextPrompt(20, 7), 2);
  const int decode = stack_->decode()->port();
  Generation none = Generate(Channel(decode, ""), r);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(Channel(decode, "foreign"), r).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Generate(Channel(decode, "expired"), r).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(
      Generate(grpc::CreateChannel(stack_->decode_target(), grpc::InsecureChannelCredentials()), r).status.error_code(),
      grpc::StatusCode::UNAVAILABLE);

  // Prefill: only decode's identity. A tenant's certificate (the right CA)
  // is PERMISSION_DENIED before the request is read; decode's gets in (and
  // its empty request is then refused by the service itself).
  const int prefill = stack_->prefill()->port();
  const std::string method = "/hybridserve.v1.Prefill/Prefill";
  grpc::Status stranger = RawCall(Channel(prefill, "tenant_a"), method);
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(stranger.error_message(), HasSubstr(absl::StrCat(kDomain, "tenant_a")));
  EXPECT_EQ(RawCall(Channel(prefill, ""), method).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(RawCall(Channel(prefill, "foreign"), method).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(RawCall(Channel(prefill, "expired"), method).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(RawCall(Channel(prefill, "decode"), method).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // Cachestore: only the workers. A stranger's put stores nothing, its
  // lookup reads nothing.
  const int cachestore = stack_->cachestore()->port();
  auto client_as = [&](const std::string& identity) {
    cachestore::GrpcCacheClientOptions o;
    o.tls.ca_file = Cert("ca");
    if (!identity.empty()) {
      o.tls.cert_file = Cert(identity);
      o.tls.key_file = Cert(identity, ".key");
    }
    return *cachestore::GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", cachestore), o);
  };
  const cachestore::ClientNamespace ns{"stranger-model", "", "", 16};
  std::vector<int32_t> page(16, 5);
  cachestore::ClientPut put;
  put.tokens = page;
  auto stranger_cache = client_as("tenant_b");
  absl::StatusOr<cachestore::PutResult> put_result = stranger_cache->Put(ns, put, std::string(64, 'x'));
  EXPECT_EQ(put_result.status().code(), absl::StatusCode::kPermissionDenied) << put_result.status();
  EXPECT_EQ(stranger_cache->Stats().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client_as("")->Stats().status().code(), absl::StatusCode::kUnavailable);
  auto worker_cache = client_as("prefill");
  absl::StatusOr<cachestore::LookupResult> found = worker_cache->Lookup(ns, page, cachestore::LookupMode::kProbeOnly);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->kv_match_tokens, 0);

  // The plaintext health ports answer the kubelet, and serve nothing else.
  for (Process* p : {stack_->decode(), stack_->prefill(), stack_->cachestore()}) {
    const std::string health = absl::StrCat("127.0.0.1:", p->field("health_port"));
    EXPECT_TRUE(HealthServing(health)) << p->field("health_port");
    EXPECT_EQ(RawCall(grpc::CreateChannel(health, grpc::InsecureChannelCredentials()), method).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }

  // The data plane: a stranger's connection carrying garbage is dropped
  // without an answer, and counted.
  const int decode_metrics = MetricsPort(stack_->decode());
  const std::string unauthenticated = "hybridserve_decode_data_plane_unauthenticated_total";
  const double strangers_before = Metric(decode_metrics, unauthenticated);
  ASSERT_GE(strangers_before, 0);
  const std::string data_address = stack_->decode()->field("data_port");  // "ip:port"
  const int data_port = std::stoi(data_address.substr(data_address.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(data_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string garbage(200, 'g');
  ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 30000), 1) << "the connection was neither answered nor dropped";
  char buf[256];
  EXPECT_LE(read(fd, buf, sizeof(buf)), 0) << "a stranger was answered";
  close(fd);
  EXPECT_EQ(AwaitMetricAtLeast(decode_metrics, unauthenticated, strangers_before + 1), strangers_before + 1);
}

TEST_F(SecurityTest, CertificatesRenewedOnDiskWithoutARestart) {
  const int port = stack_->decode()->port();
  const pid_t pid = stack_->decode()->pid();
  std::string before;
  ASSERT_TRUE(RawCall(Channel(port, "tenant_a"), kHealthCheck, "", &before).ok());
  // A long stream in flight across the renewal.
  Generation long_stream;
  std::thread streaming(
      [&] { long_stream = Generate(Channel(port, "tenant_a"), Request("long", TextPrompt(40, 11), 400)); });
  for (const char* identity : {"decode", "prefill", "cachestore"}) {
    ASSERT_EQ(std::system(absl::StrCat("/usr/bin/python3 ", Runfile("tools/make_test_certs.py"), " --out ", CertDir(),
                                       " --renew ", identity)
                              .c_str()),
              0);
  }
  std::string after;
  EXPECT_TRUE(common::WaitFor(
      [&] {
        after.clear();
        return RawCall(Channel(port, "tenant_a"), kHealthCheck, "", &after).ok() && !after.empty() && after != before;
      },
      absl::Seconds(30)))
      << "new connections still get the old certificate";
  streaming.join();
  EXPECT_TRUE(long_stream.status.ok()) << long_stream.status.error_message();
  EXPECT_EQ(long_stream.tokens.size(), 400u);
  // The whole path works on the renewed certificates; nothing restarted.
  Generation g = Generate(Channel(port, "tenant_b"), Request("after-renewal", TextPrompt(40, 12), 4));
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(stack_->decode()->pid(), pid);
  EXPECT_EQ(kill(pid, 0), 0);
}

// Quantiles and the Mann-Whitney U test (normal approximation, ties ranked
// by their mean) of two samples of milliseconds.
struct Comparison {
  double z = 0;
  double p = 1;
};
Comparison MannWhitney(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<std::pair<double, int>> all;
  for (double v : x) all.push_back({v, 0});
  for (double v : y) all.push_back({v, 1});
  std::sort(all.begin(), all.end());
  double rank_x = 0;
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].first == all[i].first) ++j;
    const double mean_rank = (i + 1 + j) / 2.0;
    for (size_t k = i; k < j; ++k) rank_x += all[k].second == 0 ? mean_rank : 0;
    i = j;
  }
  const double n1 = x.size(), n2 = y.size();
  const double u = rank_x - n1 * (n1 + 1) / 2;
  const double z = (u - n1 * n2 / 2) / std::sqrt(n1 * n2 * (n1 + n2 + 1) / 12);
  return {z, std::erfc(std::fabs(z) / std::sqrt(2.0))};
}
std::string Describe(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto q = [&](double f) { return v[static_cast<size_t>(f * (v.size() - 1))]; };
  return absl::StrCat("p10 ", q(0.1), " | median ", q(0.5), " | p90 ", q(0.9), " ms");
}

// The side channel itself: B's request for a prompt A has cached, with A's
// salt, answers as fast as a prompt nobody has seen, because it IS one for
// B. Asserted: B never gets a hit, and its TTFT is not told apart from a
// cold prompt's (two-sided Mann-Whitney, p > 1e-3) while A's own repeat, the
// positive control (a hit), is (p < 1e-3). Reported: the distributions and
// the test statistics.
// Pin quotas are the tenant's (--pin_quota_mib, 1 MiB here): tenant A pins
// turn ends until its quota refuses one (the reason names the quota; the
// request is still served); tenant B, with the same salt, still pins, from
// its own quota; A stays refused.
TEST_F(SecurityTest, EachTenantPinsWithinItsOwnQuota) {
  const int port = stack_->decode()->port();
  auto a = Channel(port, "tenant_a");
  auto b = Channel(port, "tenant_b");
  auto pin = [](const std::string& id, int seed) {
    v1::GenerateRequest r = Request(id, TextPrompt(60, seed), 4);
    r.set_cache_salt("pins");
    r.mutable_session()->set_pin(true);
    return r;
  };
  int a_pinned = 0;
  std::string refusal;
  for (int i = 0; i < 400 && refusal.empty(); ++i) {
    Generation g = Generate(a, pin(absl::StrCat("pin-a-", i), 7000 + i));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    ASSERT_EQ(g.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
    if (g.complete.usage().session().pinned()) {
      ++a_pinned;
    } else {
      refusal = g.complete.usage().session().pin_refused_reason();
    }
  }
  ASSERT_GT(a_pinned, 0);
  ASSERT_FALSE(refusal.empty()) << "A's pins never reached its quota";
  EXPECT_THAT(refusal, HasSubstr("quota")) << refusal;
  Generation b_pin = Generate(b, pin("pin-b-0", 8000));
  ASSERT_TRUE(b_pin.status.ok()) << b_pin.status.error_message();
  EXPECT_TRUE(b_pin.complete.usage().session().pinned())
      << "B's pin was refused by A's quota: " << b_pin.complete.usage().session().pin_refused_reason();
  Generation a_again = Generate(a, pin("pin-a-again", 8001));
  ASSERT_TRUE(a_again.status.ok()) << a_again.status.error_message();
  EXPECT_FALSE(a_again.complete.usage().session().pinned());
  EXPECT_THAT(a_again.complete.usage().session().pin_refused_reason(), HasSubstr("quota"));
}

TEST_F(SecurityTest, AnotherTenantsPrefixTimesAsCold) {
  if (common::kSanitized) {
    // 800 timed generations: past the target's timeout under ASan (300 s),
    // and a sanitizer's costs are not the timings this case compares.
    GTEST_SKIP() << "a timing comparison: not run under a sanitizer";
  }
  constexpr int kTrials = 200;
  constexpr int kPromptTokens = 384;
  const int port = stack_->decode()->port();
  auto a = Channel(port, "tenant_a");
  auto b = Channel(port, "tenant_b");
  std::vector<double> b_on_a_prefix, b_cold, a_hit;
  for (int i = 0; i < kTrials; ++i) {
    const std::vector<int32_t> secret = UniquePrompt(kPromptTokens, absl::StrCat("secret ", i, ": "));
    const std::vector<int32_t> fresh = UniquePrompt(kPromptTokens, absl::StrCat("fresh ", i, ": "));
    auto send = [&](const std::shared_ptr<grpc::Channel>& channel, const std::string& id,
                    const std::vector<int32_t>& prompt) {
      v1::GenerateRequest r = Request(absl::StrCat(id, "-", i), prompt, 1);
      r.set_cache_salt("victim-salt");
      Generation g = Generate(channel, r);
      EXPECT_TRUE(g.status.ok()) << g.status.error_message();
      return g;
    };
    ASSERT_EQ(send(a, "a-first", secret).complete.usage().cached_tokens(), 0);
    // In alternating order, so that drift over the run weighs on both.
    Generation on_prefix, cold;
    if (i % 2 == 0) {
      on_prefix = send(b, "b-prefix", secret);
      cold = send(b, "b-cold", fresh);
    } else {
      cold = send(b, "b-cold", fresh);
      on_prefix = send(b, "b-prefix", secret);
    }
    ASSERT_EQ(on_prefix.complete.usage().cached_tokens(), 0) << "trial " << i << ": B hit A's cache";
    ASSERT_EQ(cold.complete.usage().cached_tokens(), 0);
    Generation again = send(a, "a-again", secret);
    ASSERT_EQ(again.complete.usage().cached_tokens(), kPromptTokens);
    b_on_a_prefix.push_back(absl::ToDoubleMilliseconds(on_prefix.ttft));
    b_cold.push_back(absl::ToDoubleMilliseconds(cold.ttft));
    a_hit.push_back(absl::ToDoubleMilliseconds(again.ttft));
  }
  const Comparison leak = MannWhitney(b_on_a_prefix, b_cold);
  const Comparison control = MannWhitney(a_hit, b_cold);
  std::cout << "TTFT over " << kTrials << " trials of " << kPromptTokens << " prompt tokens:\n"
            << "  B, A's prompt and salt: " << Describe(b_on_a_prefix) << "\n"
            << "  B, a cold prompt:       " << Describe(b_cold) << "\n"
            << "  A, its own cached one:  " << Describe(a_hit) << "\n"
            << "  Mann-Whitney B-on-A vs cold: z = " << leak.z << ", two-sided p = " << leak.p << "\n"
            << "  Mann-Whitney A-hit vs cold (the control, a real hit): z = " << control.z << ", p = " << control.p
            << std::endl;
  // The measurement sees a hit: A's own is faster than cold, told apart.
  EXPECT_LT(control.z, 0) << "the control hit is not faster than cold";
  EXPECT_LT(control.p, 1e-3) << "the control hit is not told apart from cold: this measurement could not see a leak";
  // B on A's prefix is not told apart from cold at the same level (a false
  // alarm once in a thousand runs when the two are alike).
  EXPECT_GT(leak.p, 1e-3) << "B's requests for A's cached prompt time differently from cold ones";
}

}  // namespace
}  // namespace hybridserve::e2e
