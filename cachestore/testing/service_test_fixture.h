#ifndef HYBRIDSERVE_CACHESTORE_TESTING_SERVICE_TEST_FIXTURE_H_
#define HYBRIDSERVE_CACHESTORE_TESTING_SERVICE_TEST_FIXTURE_H_

// The fixture of the cachestore service tests over real gRPC on loopback
// (service_test.cc, service_put_many_test.cc): a server on port 0, a client,
// a raw stub, and helpers to build put streams by hand. Test-only.

#include <chrono>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {

// The exact code, and a message that names the cause.
inline ::testing::AssertionResult HasStatus(const grpc::Status& s, grpc::StatusCode code, absl::string_view cause) {
  if (s.error_code() == code && absl::StrContains(s.error_message(), cause)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "status " << s.error_code() << " \"" << s.error_message() << "\", want "
                                       << code << " naming \"" << cause << "\"";
}
inline ::testing::AssertionResult HasStatus(const absl::Status& s, absl::StatusCode code, absl::string_view cause) {
  if (s.code() == code && absl::StrContains(s.message(), cause)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "status " << s << ", want " << absl::StatusCodeToString(code) << " naming \""
                                       << cause << "\"";
}

constexpr int32_t kPageSize = 16;

// Every raw RPC in these tests carries this deadline: far above any plausible
// load (the calls take milliseconds), so a hung server fails the test instead
// of hanging it.
constexpr absl::Duration kRpcDeadline = absl::Seconds(60);

inline void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(kRpcDeadline));
}

inline std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i + 4 <= n; i += 4) {
    uint32_t v = rng();
    std::memcpy(&s[i], &v, 4);
  }
  return s;
}

// A put chunk carrying bytes[off, off + n).
inline v1::PutRequest ChunkOf(const std::string& bytes, uint64_t off, size_t n) {
  v1::PutRequest m;
  m.mutable_chunk()->set_offset(off);
  m.mutable_chunk()->set_data(bytes.substr(off, n));
  return m;
}

inline std::vector<TokenId> Tokens(int n, int first = 1) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class ServiceTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {}) {
    options.address = "127.0.0.1:0";
    options.reap_interval = absl::Hours(1);  // tests reap explicitly
    auto s = CacheStoreServer::Start(options, clock_, registry_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
    auto c = GrpcCacheClient::Create(target_);
    ASSERT_TRUE(c.ok());
    client_ = *std::move(c);
    stub_ = v1::CacheStore::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  }

  void SetUp() override { Start(); }

  void TearDown() override {
    if (server_ != nullptr) EXPECT_TRUE(server_->store().CheckInvariants().ok());
  }

  // Puts the pages of `tokens` and a state at `p`; returns the state's bytes.
  std::string PutPrefix(const ClientNamespace& ns, const std::vector<TokenId>& tokens, int64_t p, size_t page_bytes,
                        size_t state_bytes, uint32_t seed) {
    std::vector<Hash128> keys = PageKeys(ns.Key(), tokens, ns.page_size);
    const int64_t n = p / ns.page_size;
    for (int64_t i = 0; i < n; ++i) {
      ClientPut page;
      if (i > 0) page.parent = keys[i - 1];
      page.tokens.assign(tokens.begin() + i * ns.page_size, tokens.begin() + (i + 1) * ns.page_size);
      auto r = client_->Put(ns, page, Bytes(page_bytes, seed + i));
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) EXPECT_EQ(r->key, keys[i]);
    }
    ClientPut state;
    state.entry_class = EntryClass::kState;
    if (n > 0) state.parent = keys[n - 1];
    state.tokens.assign(tokens.begin() + n * ns.page_size, tokens.begin() + p);
    state.position = p;
    std::string bytes = Bytes(state_bytes, seed + 1000);
    auto r = client_->Put(ns, state, bytes);
    EXPECT_TRUE(r.ok()) << r.status();
    return bytes;
  }

  v1::PutHeader Header(const ClientNamespace& ns, uint64_t size) {
    v1::PutHeader h;
    h.mutable_namespace_()->set_model_fingerprint(ns.model_fingerprint);
    h.mutable_namespace_()->set_page_size(ns.page_size);
    h.set_entry_class(v1::ENTRY_CLASS_STATE);
    h.set_state_kind(v1::STATE_KIND_EXACT_PREFIX);
    h.add_token_ids(5);
    h.set_position(1);
    h.set_size_bytes(size);
    return h;
  }

  // Sends `messages` on a raw Put stream and returns the final status.
  grpc::Status RawPut(const std::vector<v1::PutRequest>& messages) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::PutResponse resp;
    auto writer = stub_->Put(&ctx, &resp);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  common::FakeClock clock_;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::string target_;
  std::unique_ptr<GrpcCacheClient> client_;
  std::unique_ptr<v1::CacheStore::Stub> stub_;
  ClientNamespace ns_{"fingerprint", "", "", kPageSize};
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_TESTING_SERVICE_TEST_FIXTURE_H_
