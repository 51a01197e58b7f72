// Puts by shared memory (shm_protocol.h "HSP1", shm_server.h,
// shm_writer.h, direct_put_cache_client.h) over real Unix sockets, real memfds and the
// store's real slabs: what lands is what Get returns, hostile requests are
// refused by name without a byte stored, and a failed path sends the puts to
// the fallback.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/client_messages.h"
#include "cachestore/client/direct_put_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/client/shm_writer.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/server/server.h"
#include "cachestore/server/shm_server.h"
#include "cachestore/testing/direct_put_test_util.h"
#include "cachestore/wire/shm_protocol.h"
#include "common/clock.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::cachestore {
namespace {

using put_test::Answer;
using put_test::Bytes;
using put_test::Chain;
using put_test::Counter;
using put_test::ExpectAnswers;
using put_test::kNs;
using put_test::kPageSize;
using put_test::MakeChain;
using put_test::ReadBack;

// A socket path in a private directory (TEST_TMPDIR is longer than a socket
// path may be).
std::string SocketPath(absl::string_view name) {
  static const std::string* dir = [] {
    char templ[] = "/tmp/hs-shm-put-test-XXXXXX";
    const char* made = mkdtemp(templ);
    return new std::string(made != nullptr ? made : "/tmp");
  }();
  return absl::StrCat(*dir, "/", name, ".sock");
}

// ---- the real server ----

TEST(ShmPutServerTest, PutsBySharedMemoryStoreWhatGetReturnsInRequestsOfBoundedSize) {
  common::FakeClock clock;
  prometheus::Registry registry;
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.index.page_budget_bytes = int64_t{64} << 20;
  o.index.state_budget_bytes = int64_t{16} << 20;
  o.shm.socket_path = SocketPath("server");
  auto server = CacheStoreServer::Start(o, clock, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  auto grpc = GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", (*server)->port()));
  ASSERT_TRUE(grpc.ok());
  // Requests of at most 1 MiB: 40 pages of 64 KiB and a 3 MiB state take
  // four requests, the state alone in the last, larger than the limit.
  ShmWriterOptions wo{o.shm.socket_path};
  wo.request_bytes = int64_t{1} << 20;
  DirectPutCacheClient client(**grpc, std::make_unique<ShmWriter>(wo));
  const Chain c = MakeChain(40, 64 << 10, 3 << 20, 1);
  std::vector<absl::StatusOr<PutResult>> results = client.PutMany(kNs, c.entries);
  ASSERT_EQ(results.size(), c.entries.size());
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_FALSE(results[i]->already_present);
  }
  EXPECT_TRUE(ReadBack(**grpc, c) == c.bytes) << "the bytes read back differ";
  // Again: every entry is there already, and nothing is written.
  for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, c.entries)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->already_present);
  }
  const DirectPutCounts counts = client.counts();
  EXPECT_EQ(counts.calls, 2);
  EXPECT_EQ(counts.entries, 82);
  EXPECT_EQ(counts.bytes, 2 * (40 * (64 << 10) + (3 << 20)));
  EXPECT_TRUE(counts.fallbacks.empty());
  // The cachestore counted them as puts, and as the socket's.
  EXPECT_EQ(Counter(registry, "hybridserve_cache_shm_puts_total", "ok"), 82);
  EXPECT_EQ(Counter(registry, "hybridserve_cache_shm_put_bytes_total", ""), 40 * (64 << 10) + (3 << 20));
  EXPECT_EQ(Counter(registry, "hybridserve_cache_puts_total", "ok"), 82);
  EXPECT_TRUE((*server)->store().CheckInvariants().ok());
}

// ---- the shm server alone, over a store in this process ----

class ShmPutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CacheIndexOptions index;
    index.blob_storage = BlobStorage::kSharedMemory;
    index.page_budget_bytes = int64_t{16} << 20;
    index.state_budget_bytes = int64_t{4} << 20;
    auto store = CacheStore::Create(index, clock_);
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    in_process_ = std::make_unique<InProcessCacheClient>(*store_);
    ShmServerOptions so;
    so.socket_path = path_;
    auto server = ShmServer::Start(so, *store_, {}, [this](const ShmPutEvent& e) {
      absl::MutexLock lock(&mu_);
      events_.push_back(e);
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // What the store holds: committed and reserved bytes and entries of both
  // classes.
  std::string Holdings() const {
    const IndexStats s = store_->Stats();
    return absl::StrCat("pages ", s.pages.entries, "/", s.pages.resident_bytes, "/", s.pages.reserved_bytes, " states ",
                        s.states.entries, "/", s.states.resident_bytes, "/", s.states.reserved_bytes);
  }

  // One put request as a writer sends it, with `fds` attached to its first
  // byte; the answer.
  absl::StatusOr<ShmPutResponse> RawPut(const std::string& frame, std::vector<int> fds) {
    const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    iovec iov{const_cast<char*>(frame.data()), frame.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds.empty()) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    EXPECT_EQ(sendmsg(sock, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
    absl::StatusOr<ShmPutResponse> response = ReadShmPutResponse(sock);
    close(sock);
    return response;
  }

  // A memfd holding `bytes`.
  static int Memfd(const std::string& bytes) {
    const int fd = memfd_create("writer", MFD_CLOEXEC);
    EXPECT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    return fd;
  }

  // The put entry of `put` for `bytes` at `offset` of the descriptor.
  static ShmPutEntry Entry(const ClientPut& put, const std::string& bytes, uint64_t offset) {
    return ShmPutEntry{offset, bytes.size(), common::Checksum64(bytes.data(), bytes.size()),
                       PutHeaderMessage(NamespaceMessage(kNs), put, bytes.size()).SerializeAsString()};
  }

  // A good put through the client still works and went by the socket.
  void ExpectServing(uint32_t seed) {
    DirectPutCacheClient client(*in_process_, std::make_unique<ShmWriter>(ShmWriterOptions{path_}));
    const Chain c = MakeChain(2, 4096, 1000, seed);
    for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, c.entries)) EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(client.counts().fallbacks.empty());
    EXPECT_TRUE(ReadBack(*in_process_, c) == c.bytes) << "the bytes read back differ";
  }

  common::FakeClock clock_;
  const std::string path_ = SocketPath(::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> in_process_;
  std::unique_ptr<ShmServer> server_;
  absl::Mutex mu_;
  std::vector<ShmPutEvent> events_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ShmPutTest, EmptyPagesAndTheirStateGoBySharedMemoryAsAnyOther) {
  DirectPutCacheClient client(*in_process_, std::make_unique<ShmWriter>(ShmWriterOptions{path_}));
  const Chain c = MakeChain(3, 0, 5000, 7);  // a model without attention: 0-byte pages
  for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, c.entries)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ReadBack(*in_process_, c) == c.bytes) << "the bytes read back differ";
  EXPECT_EQ(client.counts().entries, 4);
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(events_.size(), 4u);
  EXPECT_EQ(events_[3].bytes, 5000);
}

TEST_F(ShmPutTest, HostileRequestsAreRefusedByNameStoreNothingAndTheServerServesOn) {
  const Chain c = MakeChain(1, 4096, 100, 3);
  ShmPutRequest one;
  one.entries.push_back(Entry(c.puts[0], c.bytes[0], 0));
  const std::string frame = EncodeShmPutRequest(one);
  const int memfd = Memfd(c.bytes[0]);
  // A file on a disk: its reads could block a serving thread.
  const std::string disk_path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/on-disk");
  const int disk = open(disk_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_EQ(pwrite(disk, c.bytes[0].data(), c.bytes[0].size(), 0), static_cast<ssize_t>(c.bytes[0].size()));
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const int write_only = open(absl::StrCat("/proc/self/fd/", memfd).c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(write_only, 0);
  std::string bad_sum = frame;  // the headers' lengths disagree with the request's
  bad_sum[8] = static_cast<char>(bad_sum[8] + 1);
  std::string no_entries = frame;
  std::memset(no_entries.data() + 4, 0, 4);
  struct Case {
    const char* name;
    std::string frame;
    std::vector<int> fds;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"no descriptor", frame, {}, "0 descriptors arrived"},
      {"two descriptors", frame, {memfd, memfd}, "2 descriptors arrived"},
      {"a pipe", frame, {pipe_fds[0]}, "not a readable shared-memory file"},
      {"a file on disk", frame, {disk}, "not a readable shared-memory file"},
      {"a write-only memfd", frame, {write_only}, "not a readable shared-memory file"},
      {"headers of another length", bad_sum, {memfd}, "headers add up to"},
      {"no entries", no_entries, {memfd}, "0 entries"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    absl::StatusOr<ShmPutResponse> r = RawPut(k.frame, k.fds);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status.code(), absl::StatusCode::kInvalidArgument) << r->status;
    EXPECT_TRUE(absl::StrContains(r->status.message(), k.says)) << r->status;
    EXPECT_TRUE(r->answers.empty());
    EXPECT_EQ(Holdings(), "pages 0/0/0 states 0/0/0");
  }
  // The same request, honest, is stored.
  absl::StatusOr<ShmPutResponse> r = RawPut(frame, {memfd});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->status.ok()) << r->status;
  ASSERT_EQ(r->answers.size(), 1u);
  EXPECT_EQ(Answer(r->answers[0]).code(), 0) << Answer(r->answers[0]).message();
  EXPECT_EQ(Holdings(), "pages 1/4096/0 states 0/0/0");
  for (int fd : {memfd, disk, pipe_fds[0], pipe_fds[1], write_only}) close(fd);
  ExpectServing(11);
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

TEST_F(ShmPutTest, EntriesTheRequestMisdescribesAreRefusedOneByOneAndTheRestAreStored) {
  const Chain c = MakeChain(1, 4096, 100, 5);
  const Chain d = MakeChain(1, 2048, 100, 6);  // another prompt's first page
  std::string content = c.bytes[0] + d.bytes[0];
  const int memfd = Memfd(content);
  ShmPutRequest request;
  // 0: lies past the descriptor's end.
  request.entries.push_back(Entry(c.puts[0], c.bytes[0], content.size() - 100));
  // 1: its header declares another size than the entry has.
  ShmPutEntry wrong_size = Entry(c.puts[0], c.bytes[0], 0);
  wrong_size.size = 4000;
  request.entries.push_back(wrong_size);
  // 2: a header that does not parse.
  ShmPutEntry garbled = Entry(c.puts[0], c.bytes[0], 0);
  garbled.header = "\xff\xff\xff";
  request.entries.push_back(garbled);
  // 3: its bytes do not hash to its checksum.
  ShmPutEntry bad_sum = Entry(c.puts[0], c.bytes[0], 0);
  bad_sum.checksum ^= 1;
  request.entries.push_back(bad_sum);
  // 4: a header the store refuses (a state of no bytes).
  ClientPut empty_state = c.puts[1];
  request.entries.push_back(Entry(empty_state, "", 0));
  // 5: the honest entry of the other prompt, after all of them.
  request.entries.push_back(Entry(d.puts[0], d.bytes[0], c.bytes[0].size()));
  absl::StatusOr<ShmPutResponse> r = RawPut(EncodeShmPutRequest(request), {memfd});
  close(memfd);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->status.ok()) << r->status;
  ASSERT_EQ(r->answers.size(), 6u);
  const std::vector<std::pair<absl::StatusCode, const char*>> expected = {
      {absl::StatusCode::kInvalidArgument, "outside its descriptor"},
      {absl::StatusCode::kInvalidArgument, "size_bytes 4096 is not the entry's size 4000"},
      {absl::StatusCode::kInvalidArgument, "malformed PutHeader"},
      {absl::StatusCode::kDataLoss, "checksum"},
      {absl::StatusCode::kInvalidArgument, ""},
      {absl::StatusCode::kOk, ""},
  };
  ExpectAnswers(r->answers, expected);
  // Only the honest entry, and no reservation left behind by the others.
  EXPECT_EQ(Holdings(), "pages 1/2048/0 states 0/0/0");
  {
    absl::MutexLock lock(&mu_);
    ASSERT_EQ(events_.size(), 6u);
    EXPECT_EQ(events_[3].code, absl::StatusCode::kDataLoss);
    EXPECT_EQ(events_[5].bytes, 2048);
  }
  ExpectServing(12);
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

TEST_F(ShmPutTest, NoSocketOrARefusedPeerSendsThePutsToTheFallbackAndCountsIt) {
  const Chain c = MakeChain(2, 4096, 1000, 9);
  DirectPutCacheClient nowhere(*in_process_, std::make_unique<ShmWriter>(ShmWriterOptions{SocketPath("absent")}));
  for (const absl::StatusOr<PutResult>& r : nowhere.PutMany(kNs, c.entries)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ReadBack(*in_process_, c) == c.bytes) << "the bytes read back differ";
  DirectPutCounts counts = nowhere.counts();
  EXPECT_EQ(counts.entries, 0);
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "unavailable");

  // A server that allows only another uid (the test cannot change its own).
  ShmServerOptions so;
  so.socket_path = SocketPath("strict");
  so.allowed_uids = {geteuid() + 1};
  auto strict = ShmServer::Start(so, *store_);
  ASSERT_TRUE(strict.ok()) << strict.status();
  DirectPutCacheClient refused(*in_process_, std::make_unique<ShmWriter>(ShmWriterOptions{so.socket_path}));
  const Chain d = MakeChain(2, 4096, 1000, 10);
  for (const absl::StatusOr<PutResult>& r : refused.PutMany(kNs, d.entries)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ReadBack(*in_process_, d) == d.bytes) << "the bytes read back differ";
  counts = refused.counts();
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "permission_denied");
}

// Reads each put request on `path` and answers it with `answer` (raw bytes).
class FakePutServer {
 public:
  FakePutServer(std::string path, std::string answer) : path_(std::move(path)), answer_(std::move(answer)) {
    unlink(path_.c_str());
    listen_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_, 4), 0);
    thread_ = std::thread([this] {
      while (true) {
        const int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        absl::StatusOr<ShmMessage> m = ReadShmMessage(fd);
        if (m.ok() && m->put_fd >= 0) {
          // What a cachestore could do with the writer's descriptor.
          const int flags = fcntl(m->put_fd, F_GETFL);
          const char byte = 'x';
          const bool wrote = pwrite(m->put_fd, &byte, 1, 0) == 1;
          {
            absl::MutexLock lock(&mu_);
            access_modes_.push_back(flags & O_ACCMODE);
            writes_ += wrote ? 1 : 0;
          }
          close(m->put_fd);
        }
        EXPECT_EQ(write(fd, answer_.data(), answer_.size()), static_cast<ssize_t>(answer_.size()));
        close(fd);
      }
    });
  }
  ~FakePutServer() {
    shutdown(listen_, SHUT_RDWR);
    thread_.join();
    close(listen_);
    unlink(path_.c_str());
  }

  // The access mode of each put's descriptor, and how many of them took a
  // write.
  std::vector<int> access_modes() {
    absl::MutexLock lock(&mu_);
    return access_modes_;
  }
  int writes() {
    absl::MutexLock lock(&mu_);
    return writes_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int> access_modes_ ABSL_GUARDED_BY(mu_);
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  const std::string path_;
  const std::string answer_;
  int listen_ = -1;
  std::thread thread_;
};

TEST_F(ShmPutTest, ALyingServerIsAFailedPathAndGetsOnlyAReadOnlyViewOfTheBuffer) {
  const std::string path = SocketPath("liar");
  // An answer of OK for one entry whose answer claims 1 GiB, and an answer
  // cut short after its header: neither is believed.
  std::string lying;
  const uint32_t fields[] = {kShmPutMagic, 0, 1, 0, 1u << 30};
  for (uint32_t f : fields) lying.append(reinterpret_cast<const char*>(&f), 4);
  for (const std::string& answer : {lying, lying.substr(0, 12)}) {
    FakePutServer fake(path, answer);
    DirectPutCacheClient client(*in_process_, std::make_unique<ShmWriter>(ShmWriterOptions{path}));
    const Chain c = MakeChain(2, 4096, 1000, 20 + static_cast<uint32_t>(answer.size()));
    for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, c.entries)) ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(ReadBack(*in_process_, c) == c.bytes) << "the bytes read back differ";
    const DirectPutCounts counts = client.counts();
    EXPECT_EQ(counts.entries, 0);
    ASSERT_EQ(counts.fallbacks.size(), 1u);
    // The writer handed over a read-only view of its buffer: the cachestore
    // can read the bytes, not write into the worker's memory.
    EXPECT_EQ(fake.access_modes(), std::vector<int>{O_RDONLY});
    EXPECT_EQ(fake.writes(), 0);
  }
}

}  // namespace
}  // namespace hybridserve::cachestore
