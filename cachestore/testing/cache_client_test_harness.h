#ifndef HYBRIDSERVE_CACHESTORE_TESTING_CACHE_CLIENT_TEST_HARNESS_H_
#define HYBRIDSERVE_CACHESTORE_TESTING_CACHE_CLIENT_TEST_HARNESS_H_

// A CacheStore behind each CacheClient implementation (gRPC, shared memory
// over gRPC, in process) and the helpers the client tests share
// (cache_client_contract_test.cc, cache_client_grpc_test.cc). Test-only.

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/bulk_reader.h"
#include "cachestore/client/bulk_writer.h"
#include "cachestore/client/direct_put_cache_client.h"
#include "cachestore/client/direct_read_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/client/shm_reader.h"
#include "cachestore/client/shm_writer.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/wait_for.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {

constexpr int32_t kPageSize = 16;
// The suite's namespace (salt "tenant", tenant "").
inline const ClientNamespace kNamespace{"fingerprint", "", "tenant", kPageSize};

inline std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng() & 0xff);
  return s;
}

inline std::vector<TokenId> Tokens(int n, int first = 1) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

inline CacheIndexOptions SmallOptions() {
  CacheIndexOptions o;
  o.page_budget_bytes = int64_t{8} << 20;
  o.state_budget_bytes = int64_t{1} << 20;
  o.lease_ttl = absl::Milliseconds(5500);  // not whole seconds: the wire carries nanos too
  o.max_tokens = 4096;
  return o;
}

// A CacheStore behind one CacheClient implementation.
class Harness {
 public:
  virtual ~Harness() = default;
  virtual absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) = 0;
  virtual CacheClient& client() = 0;
  virtual CacheStore& store() = 0;
  // The clock LookupResult::lease_expiry is on.
  virtual absl::Time LeaseClockNow() const = 0;
};

class GrpcHarness : public Harness {
 public:
  static constexpr char kName[] = "Grpc";

  absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) override {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.index = options;
    o.reap_interval = absl::Hours(1);  // nothing expires behind the test's back
    absl::StatusOr<std::unique_ptr<CacheStoreServer>> server = CacheStoreServer::Start(o, clock, registry_);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    // Small chunks, so entries of a few hundred KiB cross several messages.
    GrpcCacheClientOptions client_options;
    client_options.chunk_bytes = 64 << 10;
    absl::StatusOr<std::unique_ptr<GrpcCacheClient>> client =
        GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", server_->port()), client_options);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    return absl::OkStatus();
  }
  CacheClient& client() override { return *client_; }
  CacheStore& store() override { return server_->store(); }
  absl::Time LeaseClockNow() const override { return absl::Now(); }
  int port() const { return server_->port(); }

 private:
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::unique_ptr<GrpcCacheClient> client_;
};

// The gRPC harness's server with a direct read path on, read through a
// DirectReadCacheClient: its shm socket (kShm) or its bulk port (kBulk). A
// DirectPutCacheClient in front puts by the same path. Every read and put
// these tests make goes by that path, and none may need the gRPC fallback
// (checked at the end).
enum class DirectPath { kShm, kBulk };

template <DirectPath kPath>
class DirectHarness : public Harness {
 public:
  static constexpr const char* kName = kPath == DirectPath::kShm ? "Shm" : "Bulk";

  ~DirectHarness() override {
    if (direct_client_ == nullptr) return;
    const DirectReadCounts counts = direct_client_->counts();
    EXPECT_TRUE(counts.fallbacks.empty()) << "a read fell back to gRPC: " << counts.fallbacks.begin()->first;
    const DirectPutCounts puts = put_client_->counts();
    EXPECT_TRUE(puts.fallbacks.empty()) << "a put fell back to gRPC: " << puts.fallbacks.begin()->first;
  }

  absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) override {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.index = options;
    o.reap_interval = absl::Hours(1);
    if constexpr (kPath == DirectPath::kShm) {
      // A private directory under /tmp: TEST_TMPDIR is longer than a socket path may be.
      static const std::string* dir = [] {
        char templ[] = "/tmp/hs-contract-XXXXXX";
        const char* made = mkdtemp(templ);
        return new std::string(made != nullptr ? made : "/tmp");
      }();
      o.shm.socket_path = absl::StrCat(*dir, "/", ++sockets_, ".sock");
    } else {
      o.bulk.address = "127.0.0.1:0";
    }
    absl::StatusOr<std::unique_ptr<CacheStoreServer>> server = CacheStoreServer::Start(o, clock, registry_);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    absl::StatusOr<std::unique_ptr<GrpcCacheClient>> client =
        GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", server_->port()));
    if (!client.ok()) return client.status();
    grpc_client_ = *std::move(client);
    std::unique_ptr<DirectReader> reader;
    if constexpr (kPath == DirectPath::kShm) {
      reader = std::make_unique<ShmReader>(ShmReaderOptions{o.shm.socket_path});
    } else {
      reader = std::make_unique<BulkReader>(BulkReaderOptions{absl::StrCat("127.0.0.1:", server_->bulk_port())});
    }
    direct_client_ = std::make_unique<DirectReadCacheClient>(*grpc_client_, std::move(reader));
    // Puts go by the path too, as in the workers.
    std::unique_ptr<DirectWriter> writer;
    if constexpr (kPath == DirectPath::kShm) {
      writer = std::make_unique<ShmWriter>(ShmWriterOptions{o.shm.socket_path});
    } else {
      writer = std::make_unique<BulkWriter>(BulkWriterOptions{absl::StrCat("127.0.0.1:", server_->bulk_port())});
    }
    put_client_ = std::make_unique<DirectPutCacheClient>(*direct_client_, std::move(writer));
    return absl::OkStatus();
  }
  CacheClient& client() override {
    return put_client_ != nullptr ? static_cast<CacheClient&>(*put_client_) : *direct_client_;
  }
  CacheStore& store() override { return server_->store(); }
  absl::Time LeaseClockNow() const override { return absl::Now(); }

 private:
  static inline int sockets_ = 0;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::unique_ptr<GrpcCacheClient> grpc_client_;
  std::unique_ptr<DirectReadCacheClient> direct_client_;
  std::unique_ptr<DirectPutCacheClient> put_client_;
};
using ShmHarness = DirectHarness<DirectPath::kShm>;
using BulkHarness = DirectHarness<DirectPath::kBulk>;

class InProcessHarness : public Harness {
 public:
  static constexpr char kName[] = "InProcess";

  absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) override {
    absl::StatusOr<std::unique_ptr<CacheStore>> store = CacheStore::Create(options, clock);
    if (!store.ok()) return store.status();
    store_ = *std::move(store);
    client_ = std::make_unique<InProcessCacheClient>(*store_);
    clock_ = &clock;
    return absl::OkStatus();
  }
  CacheClient& client() override { return *client_; }
  CacheStore& store() override { return *store_; }
  absl::Time LeaseClockNow() const override { return clock_->Now(); }

 private:
  const common::Clock* clock_ = nullptr;  // outlives the harness
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> client_;
};

// Puts the full pages of tokens[0, p) and a state at p; returns the page keys.
inline std::vector<Hash128> PutPrefix(CacheClient& client, const ClientNamespace& ns,
                                      const std::vector<TokenId>& tokens, int64_t p, StateKind kind,
                                      const std::string& state_bytes) {
  std::vector<Hash128> keys = PageKeys(ns.Key(), tokens, ns.page_size);
  const int64_t n = p / ns.page_size;
  for (int64_t i = 0; i < n; ++i) {
    ClientPut page;
    if (i > 0) page.parent = keys[i - 1];
    page.tokens.assign(tokens.begin() + i * ns.page_size, tokens.begin() + (i + 1) * ns.page_size);
    absl::StatusOr<PutResult> r = client.Put(ns, page, Bytes(1000 + i, 100 + i));
    EXPECT_TRUE(r.ok()) << r.status();
  }
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.state_kind = kind;
  if (n > 0) state.parent = keys[n - 1];
  state.tokens.assign(tokens.begin() + n * ns.page_size, tokens.begin() + p);
  state.position = p;
  absl::StatusOr<PutResult> r = client.Put(ns, state, state_bytes);
  EXPECT_TRUE(r.ok()) << r.status();
  return keys;
}

// The pages of tokens[0, n * kPageSize) in the suite's namespace as puts,
// each hanging from the one before (the first from the root).
inline std::vector<ClientPut> PageChain(const std::vector<TokenId>& tokens, int n) {
  const std::vector<Hash128> keys = PageKeys(kNamespace.Key(), tokens, kPageSize);
  std::vector<ClientPut> pages(n);
  for (int i = 0; i < n; ++i) {
    if (i > 0) pages[i].parent = keys[i - 1];
    pages[i].tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + (i + 1) * kPageSize);
  }
  return pages;
}

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_TESTING_CACHE_CLIENT_TEST_HARNESS_H_
