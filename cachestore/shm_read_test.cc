// Reads by shared memory (shm_protocol.h, shm_read_server.h, shm_reader.h,
// shm_cache_client.h) over real Unix sockets and real memfds; a child process
// plays the reader that dies mid-read.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/cache_client.h"
#include "cachestore/cache_store.h"
#include "cachestore/grpc_cache_client.h"
#include "cachestore/in_process_cache_client.h"
#include "cachestore/server.h"
#include "cachestore/shm_cache_client.h"
#include "cachestore/shm_protocol.h"
#include "cachestore/shm_read_server.h"
#include "cachestore/shm_reader.h"
#include "common/clock.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::cachestore {
namespace {

constexpr int32_t kPageSize = 16;

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng() & 0xff);
  return s;
}

std::vector<TokenId> Tokens(int n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), 1);
  return v;
}

// A socket path in a private directory of this process (0700, made by
// mkdtemp under /tmp: TEST_TMPDIR is longer than a socket path may be).
std::string SocketPath(absl::string_view name) {
  static const std::string* dir = [] {
    char templ[] = "/tmp/hs-shm-test-XXXXXX";
    const char* made = mkdtemp(templ);
    return new std::string(made != nullptr ? made : "/tmp");
  }();
  return absl::StrCat(*dir, "/", name, ".sock");
}

// The page keys of `pages` pages of `page_bytes` each and a state at the end,
// put through `client`; `bytes` gets each entry's bytes (pages, then state).
struct Prefix {
  std::vector<Hash128> page_keys;
  std::vector<std::string> page_bytes;
  std::string state_bytes;
  std::vector<TokenId> tokens;
};

Prefix PutPrefix(CacheClient& client, const ClientNamespace& ns, int pages, size_t page_bytes, uint32_t seed) {
  Prefix p;
  p.tokens = Tokens(pages * kPageSize + 3);
  p.page_keys = PageKeys(ns.Key(), p.tokens, kPageSize);
  p.page_keys.resize(static_cast<size_t>(pages));
  for (int i = 0; i < pages; ++i) {
    ClientPut put;
    if (i > 0) put.parent = p.page_keys[static_cast<size_t>(i) - 1];
    put.tokens.assign(p.tokens.begin() + i * kPageSize, p.tokens.begin() + (i + 1) * kPageSize);
    p.page_bytes.push_back(Bytes(page_bytes, seed + static_cast<uint32_t>(i)));
    absl::StatusOr<PutResult> r = client.Put(ns, put, p.page_bytes.back());
    EXPECT_TRUE(r.ok()) << r.status();
  }
  ClientPut state;
  state.entry_class = EntryClass::kState;
  if (pages > 0) state.parent = p.page_keys.back();
  state.tokens.assign(p.tokens.begin() + pages * kPageSize, p.tokens.end());
  state.position = static_cast<int64_t>(p.tokens.size());
  p.state_bytes = Bytes(3000, seed + 1000);
  absl::StatusOr<PutResult> r = client.Put(ns, state, p.state_bytes);
  EXPECT_TRUE(r.ok()) << r.status();
  return p;
}

// ---- the real server: gRPC and shm reads of the same cache ----

class ShmServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.index.page_budget_bytes = int64_t{64} << 20;
    o.index.state_budget_bytes = int64_t{8} << 20;
    o.shm.socket_path = SocketPath("server");
    auto server = CacheStoreServer::Start(o, clock_, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", server_->port()));
    ASSERT_TRUE(client.ok()) << client.status();
    grpc_ = *std::move(client);
    shm_ = std::make_unique<ShmCacheClient>(*grpc_, ShmReaderOptions{o.shm.socket_path});
  }

  common::FakeClock clock_;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::unique_ptr<GrpcCacheClient> grpc_;
  std::unique_ptr<ShmCacheClient> shm_;
  const ClientNamespace ns_{"fingerprint", "", "", kPageSize, "tenant"};
};

TEST_F(ShmServerTest, ShmReadsEqualTheGrpcPathsBytesAndAreCountedAsShm) {
  const Prefix p = PutPrefix(*grpc_, ns_, 40, 64 << 10, 1);
  absl::StatusOr<LookupResult> lookup = shm_->Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  ASSERT_EQ(lookup->pages.size(), 40u);
  std::vector<std::string> by_shm(40), by_grpc(40);
  ASSERT_TRUE(shm_->GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(by_shm)).ok());
  ASSERT_TRUE(grpc_->GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(by_grpc)).ok());
  EXPECT_EQ(by_shm, by_grpc);
  EXPECT_EQ(by_shm, p.page_bytes);
  std::string state;
  ASSERT_TRUE(shm_->GetInto(lookup->lease_id, lookup->state->key, &state).ok());
  EXPECT_EQ(state, p.state_bytes);
  const ShmReadCounts counts = shm_->counts();
  EXPECT_EQ(counts.reads, 2);
  EXPECT_EQ(counts.bytes, 40 * (64 << 10) + 3000);
  EXPECT_TRUE(counts.fallbacks.empty());
  EXPECT_TRUE(shm_->Release(lookup->lease_id).ok());
}

TEST_F(ShmServerTest, AReadWithoutTheLeaseIsRefusedAsOverGrpc) {
  const Prefix p = PutPrefix(*grpc_, ns_, 2, 4096, 2);
  const ShmReader reader(ShmReaderOptions{SocketPath("server")});
  // No lease at all.
  bool verdict = false;
  absl::StatusOr<ShmEntries> none = reader.Read(0, p.page_keys, &verdict);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_TRUE(verdict);
  // A lease on another prefix does not reach these entries.
  const ClientNamespace other_ns{"fingerprint", "", "salt", kPageSize, "tenant"};
  const Prefix theirs = PutPrefix(*grpc_, other_ns, 1, 4096, 4);
  absl::StatusOr<LookupResult> their_lease = grpc_->Lookup(other_ns, theirs.tokens, LookupMode::kLease);
  ASSERT_TRUE(their_lease.ok() && their_lease->lease_id != 0);
  absl::StatusOr<ShmEntries> outside = reader.Read(their_lease->lease_id, p.page_keys, &verdict);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kNotFound) << outside.status();
  EXPECT_NE(outside.status().message().find("keys[0]"), absl::string_view::npos) << outside.status();
  // Through the client: the same NOT_FOUND as gRPC's, answered by shm (no fallback).
  std::string out;
  EXPECT_EQ(shm_->GetInto(their_lease->lease_id, p.page_keys[0], &out).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(grpc_->GetInto(their_lease->lease_id, p.page_keys[0], &out).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shm_->counts().verdicts, 1);
  EXPECT_TRUE(shm_->counts().fallbacks.empty());
}

TEST_F(ShmServerTest, NoSocketFallsBackToGrpcAndCountsIt) {
  const Prefix p = PutPrefix(*grpc_, ns_, 3, 8192, 5);
  ShmCacheClient nowhere(*grpc_, ShmReaderOptions{SocketPath("nobody-listens")});
  absl::StatusOr<LookupResult> lookup = nowhere.Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  std::vector<std::string> out(3);
  ASSERT_TRUE(nowhere.GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, p.page_bytes);
  const ShmReadCounts counts = nowhere.counts();
  EXPECT_EQ(counts.reads, 0);
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "unavailable");
  EXPECT_EQ(counts.fallbacks.begin()->second, 1);
}

// ---- the credentials check ----

TEST(ShmPeerTest, OnlyAllowedUidsPass) {
  const std::vector<uid_t> allowed = {1000, 1001};
  EXPECT_TRUE(CheckShmPeer(1000, 42, allowed).ok());
  EXPECT_TRUE(CheckShmPeer(1001, 42, allowed).ok());
  const absl::Status s = CheckShmPeer(0, 42, allowed);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("uid 0"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("pid 42"), absl::string_view::npos) << s;
}

// The test cannot change its uid: a server that allows only another uid
// refuses this process, which the reader sees and the client falls back from.
TEST(ShmPeerTest, AServerThatDoesNotAllowThisUidRefusesAndTheClientFallsBack) {
  common::FakeClock clock;
  auto store = CacheStore::Create(CacheIndexOptions{}, clock);
  ASSERT_TRUE(store.ok());
  InProcessCacheClient in_process(**store);
  ShmReadServerOptions o;
  o.socket_path = SocketPath("strict");
  o.allowed_uids = {geteuid() + 1};
  absl::Mutex mu;
  int refused = 0;
  auto server = ShmReadServer::Start(o, **store, [&](const ShmReadEvent& e) {
    absl::MutexLock lock(&mu);
    if (e.refused_peer) ++refused;
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const ClientNamespace ns{"fingerprint", "", "", kPageSize, ""};
  const Prefix p = PutPrefix(in_process, ns, 2, 4096, 6);
  absl::StatusOr<LookupResult> lookup = in_process.Lookup(ns, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(ShmReader(ShmReaderOptions{o.socket_path}).Read(lookup->lease_id, p.page_keys).status().code(),
            absl::StatusCode::kPermissionDenied);
  ShmCacheClient client(in_process, ShmReaderOptions{o.socket_path});
  std::vector<std::string> out(2);
  ASSERT_TRUE(client.GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, p.page_bytes);
  const ShmReadCounts counts = client.counts();
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "permission_denied");
  absl::MutexLock lock(&mu);
  EXPECT_EQ(refused, 2);
}

TEST(ShmSocketTest, TheSocketIsOnlyForItsOwnerAndNeverReplacesAFile) {
  common::FakeClock clock;
  auto store = CacheStore::Create(CacheIndexOptions{}, clock);
  ASSERT_TRUE(store.ok());
  ShmReadServerOptions o;
  o.socket_path = SocketPath("mode");
  auto server = ShmReadServer::Start(o, **store);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st {};
  ASSERT_EQ(stat(o.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  (*server)->Stop();
  EXPECT_NE(stat(o.socket_path.c_str(), &st), 0) << "the socket outlived Stop";
  // A regular file where the socket should go is left alone.
  const std::string file = SocketPath("a-file");
  const int fd = open(file.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  o.socket_path = file;
  EXPECT_EQ(ShmReadServer::Start(o, **store).status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---- a fake server: what a reader does with a bad answer ----

// Answers every request on `path` with the entries of `spans` in a memfd
// holding `content`, sealed or not.
class FakeShmServer {
 public:
  FakeShmServer(std::string path, std::string content, std::vector<ShmEntrySpan> spans, bool sealed)
      : path_(std::move(path)), content_(std::move(content)), spans_(std::move(spans)), sealed_(sealed) {
    unlink(path_.c_str());
    listen_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_, 4), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeShmServer() {
    shutdown(listen_, SHUT_RDWR);
    thread_.join();
    close(listen_);
    unlink(path_.c_str());
  }

 private:
  void Serve() {
    while (true) {
      const int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      absl::StatusOr<ShmRequest> request = ReadShmRequest(fd);
      if (request.ok()) {
        const int memfd = memfd_create("fake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        EXPECT_EQ(pwrite(memfd, content_.data(), content_.size(), 0), static_cast<ssize_t>(content_.size()));
        if (sealed_) EXPECT_EQ(fcntl(memfd, F_ADD_SEALS, ShmRequiredSeals()), 0);
        ShmResponse response;
        response.memfd_bytes = content_.size();
        response.entries = spans_;
        EXPECT_TRUE(WriteShmResponse(fd, response, memfd).ok());
        close(memfd);
      }
      close(fd);
    }
  }

  const std::string path_;
  const std::string content_;
  const std::vector<ShmEntrySpan> spans_;
  const bool sealed_;
  int listen_ = -1;
  std::thread thread_;
};

class ShmFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = CacheStore::Create(CacheIndexOptions{}, clock_);
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    in_process_ = std::make_unique<InProcessCacheClient>(*store_);
    p_ = PutPrefix(*in_process_, ns_, 1, 4096, 7);
    auto lookup = in_process_->Lookup(ns_, p_.tokens, LookupMode::kLease);
    ASSERT_TRUE(lookup.ok());
    lease_ = lookup->lease_id;
  }

  // Reads page 0 through a ShmCacheClient whose socket is `server`'s; the
  // bytes must be right whatever the fake sent, and the fallback counted.
  void ExpectFallback(const std::string& path, const std::string& reason) {
    ShmCacheClient client(*in_process_, ShmReaderOptions{path});
    std::string out;
    ASSERT_TRUE(client.GetInto(lease_, p_.page_keys[0], &out).ok());
    EXPECT_EQ(out, p_.page_bytes[0]);
    const ShmReadCounts counts = client.counts();
    EXPECT_EQ(counts.reads, 0);
    ASSERT_EQ(counts.fallbacks.size(), 1u);
    EXPECT_EQ(counts.fallbacks.begin()->first, reason);
  }

  common::FakeClock clock_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> in_process_;
  const ClientNamespace ns_{"fingerprint", "", "", kPageSize, ""};
  Prefix p_;
  uint64_t lease_ = 0;
};

TEST_F(ShmFallbackTest, CorruptedMemfdBytesFailTheirChecksumAndTheReadFallsBack) {
  std::string corrupted = p_.page_bytes[0];
  corrupted[1234] ^= 0x20;
  const uint64_t checksum = common::Checksum64(p_.page_bytes[0].data(), p_.page_bytes[0].size());
  const std::string path = SocketPath("corrupt");
  FakeShmServer fake(path, corrupted, {{0, corrupted.size(), checksum}}, /*sealed=*/true);
  EXPECT_EQ(ShmReader(ShmReaderOptions{path}).Read(lease_, {p_.page_keys[0]}).status().code(),
            absl::StatusCode::kDataLoss);
  ExpectFallback(path, "data_loss");
}

TEST_F(ShmFallbackTest, AnUnsealedMemfdIsABadDescriptorAndTheReadFallsBack) {
  const std::string& bytes = p_.page_bytes[0];
  const std::string path = SocketPath("unsealed");
  FakeShmServer fake(path, bytes, {{0, bytes.size(), common::Checksum64(bytes.data(), bytes.size())}},
                     /*sealed=*/false);
  ExpectFallback(path, "failed_precondition");
}

TEST_F(ShmFallbackTest, AnEntryOutsideTheMemfdIsABadDescriptorAndTheReadFallsBack) {
  const std::string& bytes = p_.page_bytes[0];
  const std::string path = SocketPath("outside");
  FakeShmServer fake(path, bytes, {{64, bytes.size(), common::Checksum64(bytes.data(), bytes.size())}},
                     /*sealed=*/true);
  ExpectFallback(path, "failed_precondition");
}

// ---- lifetimes: readers that die, entries that go ----

class ShmLifetimeTest : public ::testing::Test {
 protected:
  void Start(const CacheIndexOptions& options) {
    auto store = CacheStore::Create(options, clock_);
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    in_process_ = std::make_unique<InProcessCacheClient>(*store_);
    ShmReadServerOptions o;
    o.socket_path = SocketPath("lifetime");
    o.max_connections = 1;  // one thread: a reader that wedged it would stop the next read
    auto server = ShmReadServer::Start(o, *store_, [this](const ShmReadEvent& e) {
      absl::MutexLock lock(&mu_);
      events_.push_back(e);
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    reader_ = std::make_unique<ShmReader>(ShmReaderOptions{o.socket_path});
  }

  // The server's threads report into events_: they end before it goes.
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
  }

  // Waits for the server's `n`th event (no fixed sleep: the server reports).
  ShmReadEvent AwaitEvent(size_t n) {
    struct Wanted {
      const std::vector<ShmReadEvent>* events;
      size_t n;
    } wanted{nullptr, n};
    absl::MutexLock lock(&mu_);
    wanted.events = &events_;
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](Wanted* w) { return w->events->size() >= w->n; }, &wanted),
                         absl::Seconds(30));
    return events_.size() >= n ? events_[n - 1] : ShmReadEvent{absl::StatusCode::kUnknown, -1, false};
  }

  common::FakeClock clock_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> in_process_;
  std::unique_ptr<ShmReadServer> server_;
  std::unique_ptr<ShmReader> reader_;
  absl::Mutex mu_;
  std::vector<ShmReadEvent> events_ ABSL_GUARDED_BY(mu_);
  const ClientNamespace ns_{"fingerprint", "", "", kPageSize, ""};
};

TEST_F(ShmLifetimeTest, AReaderDyingMidReadFreesNothingAnotherReaderHolds) {
  Start(CacheIndexOptions{});
  const Prefix p = PutPrefix(*in_process_, ns_, 16, 256 << 10, 8);
  auto lookup = in_process_->Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok());
  // Reader A holds its entries mapped throughout.
  absl::StatusOr<ShmEntries> held = reader_->Read(lookup->lease_id, p.page_keys);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(AwaitEvent(1).code, absl::StatusCode::kOk);
  // Reader B, a child process, asks for the same entries under the same
  // lease, takes the first bytes of the answer (the memfd is in its socket
  // by then) and is killed before it reads the rest.
  ShmRequest request{lookup->lease_id, p.page_keys};
  const std::string frame = EncodeShmRequest(request);
  const std::string path = server_->socket_path();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(3);
    if (write(fd, frame.data(), frame.size()) != static_cast<ssize_t>(frame.size())) _exit(4);
    char first[8];
    if (read(fd, first, sizeof(first)) <= 0) _exit(5);
    raise(SIGKILL);
    _exit(6);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << "the child did not die mid-read: " << wstatus;
  // The fault struck a read in flight: the server answered it.
  EXPECT_EQ(AwaitEvent(2).code, absl::StatusCode::kOk);
  // A's entries are intact, the lease still serves, the server still reads.
  for (size_t i = 0; i < p.page_keys.size(); ++i) ASSERT_EQ(held->entry(i), p.page_bytes[i]) << i;
  absl::StatusOr<ShmEntries> again = reader_->Read(lookup->lease_id, p.page_keys);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->entry(15), p.page_bytes[15]);
  EXPECT_TRUE(in_process_->Release(lookup->lease_id).ok());
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

TEST_F(ShmLifetimeTest, AnEntryEvictedWhileMappedDoesNotChangeUnderTheReader) {
  CacheIndexOptions o;
  // Room for about two 256 KiB pages: a third put evicts the first.
  o.page_budget_bytes = (int64_t{256} << 10) * 2 + 4096;
  o.state_budget_bytes = int64_t{1} << 20;
  Start(o);
  const ClientNamespace a{"fingerprint", "", "a", kPageSize, ""};
  const Prefix p = PutPrefix(*in_process_, a, 1, 256 << 10, 9);
  auto lookup = in_process_->Lookup(a, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok() && lookup->lease_id != 0);
  absl::StatusOr<ShmEntries> held = reader_->Read(lookup->lease_id, p.page_keys);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(in_process_->Release(lookup->lease_id).ok());
  // Two more pages of the same size: the first is evicted, its buffer freed
  // (or recycled by size for the next put, blob_pool.h).
  const ClientNamespace b{"fingerprint", "", "b", kPageSize, ""};
  const ClientNamespace c{"fingerprint", "", "c", kPageSize, ""};
  PutPrefix(*in_process_, b, 1, 256 << 10, 10);
  PutPrefix(*in_process_, c, 1, 256 << 10, 11);
  const IndexStats stats = store_->Stats();
  ASSERT_GE(stats.pages.evicted_lru, 1) << "nothing was evicted: the test proves nothing";
  auto gone = in_process_->Lookup(a, p.tokens, LookupMode::kProbeOnly);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->kv_match_tokens, 0);
  EXPECT_EQ(held->entry(0), p.page_bytes[0]);
}

}  // namespace
}  // namespace hybridserve::cachestore
