// Reads by shared memory (shm_protocol.h version 2, shm_server.h,
// shm_reader.h, direct_read_cache_client.h) over real Unix sockets and the store's
// real memfd slabs; a child process plays the reader that dies mid-read.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include "cachestore/client/direct_read_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/client/shm_reader.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/server/server.h"
#include "cachestore/server/shm_server.h"
#include "cachestore/wire/shm_protocol.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/wait_for.h"
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

CacheIndexOptions SharedOptions() {
  CacheIndexOptions o;
  o.blob_storage = BlobStorage::kSharedMemory;
  return o;
}

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  return fd;
}

// One request as a reader sends it, and the answer with its descriptors,
// which the caller owns (the tests look at what a reader could do with them).
absl::StatusOr<ShmResponse> RawRead(const std::string& path, const std::string& frame, std::vector<int>* fds) {
  const int sock = Connect(path);
  EXPECT_EQ(write(sock, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  absl::StatusOr<ShmResponse> response = ReadShmResponse(sock, fds);
  close(sock);
  return response;
}

absl::StatusOr<ShmResponse> RawRead(const std::string& path, uint64_t lease, absl::Span<const Hash128> keys,
                                    std::vector<int>* fds) {
  return RawRead(path, EncodeShmRequest(ShmRequest{lease, std::vector<Hash128>(keys.begin(), keys.end())}), fds);
}

// hybridserve_cache_shm_reads_total{outcome="ok"}: requests served.
double ShmReadsOk(prometheus::Registry& registry) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != "hybridserve_cache_shm_reads_total") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "outcome" && l.value == "ok") return m.counter.value;
      }
    }
  }
  return -1;
}

void CloseAll(std::vector<int>& fds) {
  for (int fd : fds) close(fd);
  fds.clear();
}

std::string PreadSpan(const std::vector<int>& fds, const ShmEntrySpan& e) {
  std::string s(e.size, '\0');
  EXPECT_EQ(pread(fds.at(e.fd_index), s.data(), s.size(), static_cast<off_t>(e.offset)), static_cast<ssize_t>(e.size));
  return s;
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
    shm_ = std::make_unique<DirectReadCacheClient>(*grpc_,
                                                   std::make_unique<ShmReader>(ShmReaderOptions{o.shm.socket_path}));
  }

  common::FakeClock clock_;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::unique_ptr<GrpcCacheClient> grpc_;
  std::unique_ptr<DirectReadCacheClient> shm_;
  const ClientNamespace ns_{"fingerprint", "", "", kPageSize, "tenant"};
};

TEST_F(ShmServerTest, ShmReadsEqualTheGrpcPathsBytesAndAreCountedAsShm) {
  EXPECT_EQ(server_->store().options().blob_storage, BlobStorage::kSharedMemory);
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
  const DirectReadCounts counts = shm_->counts();
  EXPECT_EQ(counts.reads, 2);
  EXPECT_EQ(counts.bytes, 40 * (64 << 10) + 3000);
  EXPECT_TRUE(counts.fallbacks.empty());
  EXPECT_TRUE(shm_->Release(lookup->lease_id).ok());
  // A released lease reads nothing: NOT_FOUND, answered by shm.
  EXPECT_EQ(shm_->GetInto(lookup->lease_id, p.page_keys[0], &state).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shm_->counts().verdicts, 1);
}

// Pages read straight into a caller's scattered segments, as prefill reads
// a resume into its KV pool: page i's segment j lands at (j * pages + i) of
// one arena, so no page is contiguous; page 0 is cut into 2048 segments, more
// than one preadv takes (IOV_MAX).
TEST_F(ShmServerTest, ScatteredReadsLandInTheCallersSegmentsAndACorruptOneFallsBack) {
  constexpr size_t kPages = 40, kBytes = 64 << 10, kCut = 8 << 10;
  const Prefix p = PutPrefix(*grpc_, ns_, kPages, kBytes, 21);
  absl::StatusOr<LookupResult> lookup = grpc_->Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  std::string arena(kPages * kBytes, '\0');
  std::vector<EntrySegments> destinations(kPages);
  for (size_t i = 0; i < kPages; ++i) {
    for (size_t j = 0; j < kBytes / kCut; ++j) {
      char* at = arena.data() + (j * kPages + i) * kCut;
      if (i == 0) {
        for (size_t k = 0; k < kCut; k += 32) destinations[i].segments.push_back(absl::MakeSpan(at + k, 32));
      } else {
        destinations[i].segments.push_back(absl::MakeSpan(at, kCut));
      }
    }
  }
  ASSERT_EQ(destinations[0].segments.size(), 2048u);
  ASSERT_TRUE(shm_->GetManyScattered(lookup->lease_id, p.page_keys, destinations).ok());
  for (size_t i = 0; i < kPages; ++i) {
    std::string page;
    for (const absl::Span<char>& s : destinations[i].segments) page.append(s.data(), s.size());
    ASSERT_EQ(page, p.page_bytes[i]) << "page " << i;
  }
  DirectReadCounts counts = shm_->counts();
  EXPECT_EQ(counts.reads, 1);
  EXPECT_EQ(counts.bytes, static_cast<int64_t>(kPages * kBytes));
  EXPECT_TRUE(counts.fallbacks.empty());

  {
    absl::StatusOr<ReadHandle> h = server_->store().Open(lookup->lease_id, p.page_keys[5]);
    ASSERT_TRUE(h.ok()) << h.status();
    h->blob->data.get()[kBytes - 1] ^= 0x01;  // the last byte of page 5's last segment
  }
  const absl::Status read = shm_->GetManyScattered(lookup->lease_id, p.page_keys, destinations);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  counts = shm_->counts();
  EXPECT_EQ(counts.reads, 1);
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "data_loss");
}

// 600 pages of 4 KiB: 512 to a slab, so two slabs; a read of them is three
// requests on one connection, and each answer names each slab once.
TEST_F(ShmServerTest, AReadOfMoreKeysThanARequestTakesIsSplitAndEachSlabIsSentOnce) {
  const Prefix p = PutPrefix(*grpc_, ns_, 600, 4096, 3);
  absl::StatusOr<LookupResult> lookup = grpc_->Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  std::vector<std::string> out(600);
  ASSERT_TRUE(shm_->GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, p.page_bytes);
  EXPECT_EQ(shm_->counts().reads, 1);
  // The server counts a read once its answer is sent: the last may trail.
  common::WaitFor([&] { return ShmReadsOk(registry_) >= 3; });
  EXPECT_EQ(ShmReadsOk(registry_), 3) << "one request per " << kShmMaxKeys << " keys";
  std::vector<int> fds;
  absl::StatusOr<ShmResponse> first =
      RawRead(SocketPath("server"), lookup->lease_id, absl::MakeConstSpan(p.page_keys).subspan(0, 250), &fds);
  ASSERT_TRUE(first.ok() && first->status.ok()) << first.status();
  EXPECT_EQ(fds.size(), 1u) << "250 pages of one slab";
  CloseAll(fds);
  absl::StatusOr<ShmResponse> last =
      RawRead(SocketPath("server"), lookup->lease_id, absl::MakeConstSpan(p.page_keys).subspan(500), &fds);
  ASSERT_TRUE(last.ok() && last->status.ok()) << last.status();
  EXPECT_EQ(fds.size(), 2u) << "pages 500..511 and 512..599 lie in two slabs";
  for (size_t i = 0; i < last->entries.size(); ++i) ASSERT_EQ(PreadSpan(fds, last->entries[i]), p.page_bytes[500 + i]);
  CloseAll(fds);
  // More keys than a request takes, sent anyway: refused.
  absl::StatusOr<ShmResponse> too_many =
      RawRead(SocketPath("server"), lookup->lease_id, absl::MakeConstSpan(p.page_keys).subspan(0, 251), &fds);
  ASSERT_TRUE(too_many.ok()) << too_many.status();
  EXPECT_EQ(too_many->status.code(), absl::StatusCode::kInvalidArgument) << too_many->status;
  EXPECT_TRUE(fds.empty());
}

TEST_F(ShmServerTest, AVersion1RequestIsInvalidArgumentAndTheClientFallsBack) {
  const Prefix p = PutPrefix(*grpc_, ns_, 2, 4096, 12);
  absl::StatusOr<LookupResult> lookup = grpc_->Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok());
  std::string frame = EncodeShmRequest(ShmRequest{lookup->lease_id, p.page_keys});
  const uint32_t v1 = kShmMagicV1;
  for (int i = 0; i < 4; ++i) frame[static_cast<size_t>(i)] = static_cast<char>((v1 >> (8 * i)) & 0xff);
  std::vector<int> fds;
  absl::StatusOr<ShmResponse> answer = RawRead(SocketPath("server"), frame, &fds);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(answer->status.message().find("version 1"), absl::string_view::npos) << answer->status;
  EXPECT_TRUE(fds.empty());
}

// What an allowed reader receives is a read-only view of whole slabs: it can
// read, but neither write nor map writable nor resize them.
TEST_F(ShmServerTest, TheReceivedDescriptorsCannotWriteMapWritableOrResize) {
  const Prefix p = PutPrefix(*grpc_, ns_, 3, 64 << 10, 13);
  absl::StatusOr<LookupResult> lookup = grpc_->Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok());
  std::vector<int> fds;
  absl::StatusOr<ShmResponse> answer = RawRead(SocketPath("server"), lookup->lease_id, p.page_keys, &fds);
  ASSERT_TRUE(answer.ok() && answer->status.ok()) << answer.status();
  ASSERT_EQ(fds.size(), 1u);
  const int fd = fds[0];
  EXPECT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  const std::string zeros(4096, '\0');
  EXPECT_EQ(pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(answer->entries[0].offset)), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_NE(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
  // A private writable mapping is the reader's own copy: the cache's bytes
  // do not change.
  void* mine =
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(answer->entries[0].offset));
  ASSERT_NE(mine, MAP_FAILED);
  std::memset(mine, 0, 4096);
  munmap(mine, 4096);
  CloseAll(fds);
  std::vector<std::string> out(3);
  ASSERT_TRUE(grpc_->GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, p.page_bytes);
}

// The shm server does not verify stored checksums; the reader does, falls
// back to gRPC, whose Get verifies, removes the entry and answers DATA_LOSS.
TEST_F(ShmServerTest, ACorruptedStoredEntryEndsAsDataLossThroughTheFallback) {
  const Prefix p = PutPrefix(*grpc_, ns_, 3, 8192, 14);
  absl::StatusOr<LookupResult> lookup = grpc_->Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok());
  {
    absl::StatusOr<ReadHandle> h = server_->store().Open(lookup->lease_id, p.page_keys[1]);
    ASSERT_TRUE(h.ok()) << h.status();
    h->blob->data.get()[77] ^= 0x10;  // the cachestore's own writable mapping
  }
  std::vector<std::string> out(3);
  const absl::Status read = shm_->GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out));
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  const DirectReadCounts counts = shm_->counts();
  EXPECT_EQ(counts.reads, 0);
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "data_loss");
  EXPECT_EQ(server_->store().Stats().checksum_failures, 1) << "gRPC's Get found it";
  absl::StatusOr<LookupResult> after = grpc_->Lookup(ns_, p.tokens, LookupMode::kProbeOnly);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->kv_match_tokens, kPageSize) << "the corrupt page and what hangs from it are gone";
}

TEST_F(ShmServerTest, AReadWithoutTheLeaseIsRefusedAsOverGrpc) {
  const Prefix p = PutPrefix(*grpc_, ns_, 2, 4096, 2);
  const ShmReader reader(ShmReaderOptions{SocketPath("server")});
  std::vector<std::string> out(2);
  // No lease at all.
  bool verdict = false;
  const absl::Status none = reader.ReadInto(0, p.page_keys, absl::MakeSpan(out), &verdict);
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << none;
  EXPECT_TRUE(verdict);
  // A lease on another prefix does not reach these entries.
  const ClientNamespace other_ns{"fingerprint", "", "salt", kPageSize, "tenant"};
  const Prefix theirs = PutPrefix(*grpc_, other_ns, 1, 4096, 4);
  absl::StatusOr<LookupResult> their_lease = grpc_->Lookup(other_ns, theirs.tokens, LookupMode::kLease);
  ASSERT_TRUE(their_lease.ok() && their_lease->lease_id != 0);
  const absl::Status outside = reader.ReadInto(their_lease->lease_id, p.page_keys, absl::MakeSpan(out), &verdict);
  EXPECT_EQ(outside.code(), absl::StatusCode::kNotFound) << outside;
  EXPECT_NE(outside.message().find("keys[0]"), absl::string_view::npos) << outside;
  // Through the client: the same NOT_FOUND as gRPC's, answered by shm (no fallback).
  std::string one;
  EXPECT_EQ(shm_->GetInto(their_lease->lease_id, p.page_keys[0], &one).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(grpc_->GetInto(their_lease->lease_id, p.page_keys[0], &one).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shm_->counts().verdicts, 1);
  EXPECT_TRUE(shm_->counts().fallbacks.empty());
}

TEST_F(ShmServerTest, NoSocketFallsBackToGrpcAndCountsIt) {
  const Prefix p = PutPrefix(*grpc_, ns_, 3, 8192, 5);
  DirectReadCacheClient nowhere(*grpc_, std::make_unique<ShmReader>(ShmReaderOptions{SocketPath("nobody-listens")}));
  absl::StatusOr<LookupResult> lookup = nowhere.Lookup(ns_, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  std::vector<std::string> out(3);
  ASSERT_TRUE(nowhere.GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, p.page_bytes);
  const DirectReadCounts counts = nowhere.counts();
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
  auto store = CacheStore::Create(SharedOptions(), clock);
  ASSERT_TRUE(store.ok());
  InProcessCacheClient in_process(**store);
  ShmServerOptions o;
  o.socket_path = SocketPath("strict");
  o.allowed_uids = {geteuid() + 1};
  absl::Mutex mu;
  int refused = 0;
  auto server = ShmServer::Start(o, **store, [&](const ShmReadEvent& e) {
    absl::MutexLock lock(&mu);
    if (e.refused_peer) ++refused;
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const ClientNamespace ns{"fingerprint", "", "", kPageSize, ""};
  const Prefix p = PutPrefix(in_process, ns, 2, 4096, 6);
  absl::StatusOr<LookupResult> lookup = in_process.Lookup(ns, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok());
  std::vector<std::string> out(2);
  EXPECT_EQ(
      ShmReader(ShmReaderOptions{o.socket_path}).ReadInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).code(),
      absl::StatusCode::kPermissionDenied);
  DirectReadCacheClient client(in_process, std::make_unique<ShmReader>(ShmReaderOptions{o.socket_path}));
  ASSERT_TRUE(client.GetManyInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, p.page_bytes);
  const DirectReadCounts counts = client.counts();
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "permission_denied");
  absl::MutexLock lock(&mu);
  EXPECT_EQ(refused, 2);
}

TEST(ShmSocketTest, TheSocketIsOnlyForItsOwnerAndNeverReplacesAFile) {
  common::FakeClock clock;
  auto store = CacheStore::Create(SharedOptions(), clock);
  ASSERT_TRUE(store.ok());
  ShmServerOptions o;
  o.socket_path = SocketPath("mode");
  auto server = ShmServer::Start(o, **store);
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
  EXPECT_EQ(ShmServer::Start(o, **store).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShmSocketTest, AStoreWhoseEntriesAreNotInSharedMemoryIsRefused) {
  common::FakeClock clock;
  auto store = CacheStore::Create(CacheIndexOptions{}, clock);
  ASSERT_TRUE(store.ok());
  ShmServerOptions o;
  o.socket_path = SocketPath("heap");
  const absl::Status s = ShmServer::Start(o, **store).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("blob_storage"), absl::string_view::npos) << s;
}

// ---- a fake server: what a reader does with a bad answer ----

// Answers every request on `path` with the entries of `spans` in one memfd
// holding `content`, sent read-only (reopened O_RDONLY) or writable.
class FakeShmServer {
 public:
  FakeShmServer(std::string path, std::string content, std::vector<ShmEntrySpan> spans, bool read_only)
      : path_(std::move(path)), content_(std::move(content)), spans_(std::move(spans)), read_only_(read_only) {
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
      absl::StatusOr<ShmMessage> request = ReadShmMessage(fd);
      if (request.ok() && request->read.has_value()) {
        const int memfd = memfd_create("fake", MFD_CLOEXEC);
        EXPECT_EQ(pwrite(memfd, content_.data(), content_.size(), 0), static_cast<ssize_t>(content_.size()));
        const int sent = read_only_ ? open(absl::StrCat("/proc/self/fd/", memfd).c_str(), O_RDONLY | O_CLOEXEC) : memfd;
        EXPECT_GE(sent, 0);
        ShmResponse response;
        response.entries = spans_;
        EXPECT_TRUE(WriteShmResponse(fd, response, {sent}).ok());
        if (sent != memfd) close(sent);
        close(memfd);
      }
      close(fd);
    }
  }

  const std::string path_;
  const std::string content_;
  const std::vector<ShmEntrySpan> spans_;
  const bool read_only_;
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
    checksum_ = common::Checksum64(p_.page_bytes[0].data(), p_.page_bytes[0].size());
  }

  // Reads page 0 through a DirectReadCacheClient whose socket is `path`'s; the
  // bytes must be right whatever the fake sent, and the fallback counted.
  void ExpectFallback(const std::string& path, const std::string& reason) {
    DirectReadCacheClient client(*in_process_, std::make_unique<ShmReader>(ShmReaderOptions{path}));
    std::string out;
    ASSERT_TRUE(client.GetInto(lease_, p_.page_keys[0], &out).ok());
    EXPECT_EQ(out, p_.page_bytes[0]);
    const DirectReadCounts counts = client.counts();
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
  uint64_t checksum_ = 0;
};

TEST_F(ShmFallbackTest, TheFakeServersHonestAnswerIsRead) {
  const std::string path = SocketPath("honest");
  FakeShmServer fake(path, "pad" + p_.page_bytes[0], {{0, 3, p_.page_bytes[0].size(), checksum_}}, /*read_only=*/true);
  DirectReadCacheClient client(*in_process_, std::make_unique<ShmReader>(ShmReaderOptions{path}));
  std::string out;
  ASSERT_TRUE(client.GetInto(lease_, p_.page_keys[0], &out).ok());
  EXPECT_EQ(out, p_.page_bytes[0]);
  EXPECT_EQ(client.counts().reads, 1) << "the fakes below fail for what they change, not for being fakes";
}

TEST_F(ShmFallbackTest, CorruptedBytesFailTheirChecksumAndTheReadFallsBack) {
  std::string corrupted = p_.page_bytes[0];
  corrupted[1234] ^= 0x20;
  const std::string path = SocketPath("corrupt");
  FakeShmServer fake(path, corrupted, {{0, 0, corrupted.size(), checksum_}}, /*read_only=*/true);
  std::string out;
  EXPECT_EQ(ShmReader(ShmReaderOptions{path}).ReadInto(lease_, {p_.page_keys[0]}, absl::MakeSpan(&out, 1)).code(),
            absl::StatusCode::kDataLoss);
  ExpectFallback(path, "data_loss");
}

TEST_F(ShmFallbackTest, AWritableDescriptorIsRefusedAndTheReadFallsBack) {
  const std::string& bytes = p_.page_bytes[0];
  const std::string path = SocketPath("writable");
  FakeShmServer fake(path, bytes, {{0, 0, bytes.size(), checksum_}}, /*read_only=*/false);
  ExpectFallback(path, "failed_precondition");
}

TEST_F(ShmFallbackTest, AnEntryOutsideItsDescriptorIsRefusedAndTheReadFallsBack) {
  const std::string& bytes = p_.page_bytes[0];
  const std::string path = SocketPath("outside");
  FakeShmServer fake(path, bytes, {{0, 64, bytes.size(), checksum_}}, /*read_only=*/true);
  ExpectFallback(path, "failed_precondition");
}

TEST_F(ShmFallbackTest, AnEntryNamingAMissingDescriptorIsRefusedAndTheReadFallsBack) {
  const std::string& bytes = p_.page_bytes[0];
  const std::string path = SocketPath("no-such-fd");
  FakeShmServer fake(path, bytes, {{1, 0, bytes.size(), checksum_}}, /*read_only=*/true);
  ExpectFallback(path, "invalid_argument");
}

// ---- lifetimes: readers that die, entries that go ----

class ShmLifetimeTest : public ::testing::Test {
 protected:
  void Start(CacheIndexOptions options) {
    options.blob_storage = BlobStorage::kSharedMemory;
    auto store = CacheStore::Create(options, clock_);
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    in_process_ = std::make_unique<InProcessCacheClient>(*store_);
    ShmServerOptions o;
    o.socket_path = SocketPath("lifetime");
    o.max_connections = 1;  // one thread: a reader that wedged it would stop the next read
    auto server = ShmServer::Start(o, *store_, [this](const ShmReadEvent& e) {
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
  std::unique_ptr<ShmServer> server_;
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
  // Reader A holds its descriptors throughout.
  std::vector<int> held;
  absl::StatusOr<ShmResponse> a = RawRead(server_->socket_path(), lookup->lease_id, p.page_keys, &held);
  ASSERT_TRUE(a.ok() && a->status.ok()) << a.status();
  ASSERT_EQ(AwaitEvent(1).code, absl::StatusCode::kOk);
  // Reader B, a child process, asks for the same entries under the same
  // lease, takes the first bytes of the answer (the descriptors are in its
  // socket by then) and is killed before it reads the rest.
  const std::string frame = EncodeShmRequest(ShmRequest{lookup->lease_id, p.page_keys});
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
  for (size_t i = 0; i < p.page_keys.size(); ++i) ASSERT_EQ(PreadSpan(held, a->entries[i]), p.page_bytes[i]) << i;
  CloseAll(held);
  std::vector<std::string> again(p.page_keys.size());
  ASSERT_TRUE(reader_->ReadInto(lookup->lease_id, p.page_keys, absl::MakeSpan(again)).ok());
  EXPECT_EQ(again, p.page_bytes);
  EXPECT_TRUE(in_process_->Release(lookup->lease_id).ok());
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

// Without the lease an entry is NOT_FOUND, never another entry's bytes: once
// the lease is released and the entry evicted, its slot holds the next put's
// bytes, which a reader that kept an old descriptor sees fail the checksum.
TEST_F(ShmLifetimeTest, AnEntryEvictedOrItsLeaseEndedIsNotFoundNeverAnotherEntrysBytes) {
  CacheIndexOptions o;
  // Room for about two 256 KiB pages: a third put evicts the first. The pool
  // keeps no buffer of 256 KiB (an eighth of the budgets is less): a freed
  // slot is the next put's.
  o.page_budget_bytes = (int64_t{256} << 10) * 2 + 4096;
  o.state_budget_bytes = int64_t{1} << 20;
  o.lease_ttl = absl::Seconds(5);
  Start(o);
  const ClientNamespace a{"fingerprint", "", "a", kPageSize, ""};
  const Prefix p = PutPrefix(*in_process_, a, 1, 256 << 10, 9);
  auto lookup = in_process_->Lookup(a, p.tokens, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok() && lookup->lease_id != 0);
  std::vector<int> kept;
  absl::StatusOr<ShmResponse> old = RawRead(server_->socket_path(), lookup->lease_id, p.page_keys, &kept);
  ASSERT_TRUE(old.ok() && old->status.ok()) << old.status();
  ASSERT_EQ(PreadSpan(kept, old->entries[0]), p.page_bytes[0]);
  // The lease expires (not released): NOT_FOUND, a verdict.
  clock_.Advance(absl::Seconds(6));
  store_->Expire();
  std::vector<std::string> out(1);
  bool verdict = false;
  absl::Status expired = reader_->ReadInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out), &verdict);
  EXPECT_EQ(expired.code(), absl::StatusCode::kNotFound) << expired;
  EXPECT_TRUE(verdict);
  // Two more pages of the same size: the first is evicted, its slot reused.
  const ClientNamespace b{"fingerprint", "", "b", kPageSize, ""};
  const ClientNamespace c{"fingerprint", "", "c", kPageSize, ""};
  const Prefix pb = PutPrefix(*in_process_, b, 1, 256 << 10, 10);
  const Prefix pc = PutPrefix(*in_process_, c, 1, 256 << 10, 11);
  ASSERT_GE(store_->Stats().pages.evicted_lru, 1) << "nothing was evicted: the test proves nothing";
  auto gone = in_process_->Lookup(a, p.tokens, LookupMode::kProbeOnly);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->kv_match_tokens, 0);
  // The old lease reads nothing; a client gets the verdict, not a fallback.
  EXPECT_EQ(reader_->ReadInto(lookup->lease_id, p.page_keys, absl::MakeSpan(out)).code(), absl::StatusCode::kNotFound);
  DirectReadCacheClient client(*in_process_, std::make_unique<ShmReader>(ShmReaderOptions{server_->socket_path()}));
  EXPECT_EQ(client.GetInto(lookup->lease_id, p.page_keys[0], &out[0]).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client.counts().fallbacks.empty());
  // The descriptor kept past the lease sees the slot's new contents, whose
  // checksum is not the old entry's: a reader that verifies never takes them.
  const std::string now = PreadSpan(kept, old->entries[0]);
  EXPECT_TRUE(now == pb.page_bytes[0] || now == pc.page_bytes[0]) << "the freed slot was not the next put's";
  EXPECT_NE(common::Checksum64(now.data(), now.size()), old->entries[0].checksum);
  CloseAll(kept);
}

}  // namespace
}  // namespace hybridserve::cachestore
