// The cachestore's bounds on calls and threads, over real gRPC on loopback
// (port 0): stalled clients hold no server thread, a client beyond
// --max_streams_per_peer is refused at once with RESOURCE_EXHAUSTED while
// other clients are served, and stalled calls give everything back when their
// clients go away.

#include <dirent.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kPageSize = 16;

// Every RPC in these tests carries this deadline: far above any plausible
// load, so a hung server fails the test instead of hanging it.
constexpr absl::Duration kRpcDeadline = absl::Seconds(60);

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(kRpcDeadline));
}

using common::WaitFor;

// Threads of this process (client and server together): entries of
// /proc/self/task.
int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// A channel with a connection of its own (not shared with other channels to
// the same target through gRPC's global subchannel pool), so the server sees
// it as a distinct peer.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Keep each stream's flow-control window at its initial 64 KiB (no BDP
  // probing to grow it), so a reader that stops reading stalls the writer.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// The header of a 1 KiB state at position 1 whose one-token tail is `token`:
// distinct tokens make distinct entries, so stalled puts never meet each other
// (ABORTED, same entry in flight).
v1::PutRequest StateHeader(int32_t token) {
  v1::PutRequest m;
  v1::PutHeader* h = m.mutable_header();
  h->mutable_namespace_()->set_model_fingerprint("fingerprint");
  h->mutable_namespace_()->set_page_size(kPageSize);
  h->set_entry_class(v1::ENTRY_CLASS_STATE);
  h->set_state_kind(v1::STATE_KIND_EXACT_PREFIX);
  h->add_token_ids(token);
  h->set_position(1);
  h->set_size_bytes(1024);
  return m;
}

// A put that sends its header and then nothing more, until cancelled.
class StalledPut final : public grpc::ClientWriteReactor<v1::PutRequest> {
 public:
  StalledPut(v1::CacheStore::Stub& stub, int32_t token) : header_(StateHeader(token)) {
    SetDeadline(&ctx_);
    stub.async()->Put(&ctx_, &response_, this);
    StartWrite(&header_);
    StartCall();
  }

  // A call must end before its reactor goes away (a failed assertion returns
  // early): cancel it and wait for OnDone.
  ~StalledPut() override {
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_, absl::Condition(&done_));
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

  void Cancel() { ctx_.TryCancel(); }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  grpc::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  grpc::ClientContext ctx_;
  v1::PutRequest header_;
  v1::PutResponse response_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// A Get that reads the entry's first message and then stops reading: the
// server's writes stall on flow control once the stream's window is full.
class StalledGet final : public grpc::ClientReadReactor<v1::GetResponse> {
 public:
  StalledGet(v1::CacheStore::Stub& stub, uint64_t lease_id, const Hash128& key) {
    SetDeadline(&ctx_);
    request_.set_lease_id(lease_id);
    request_.set_key(key.ToBytes());
    request_.set_chunk_bytes(4096);
    stub.async()->Get(&ctx_, &request_, this);
    StartRead(&first_);
    StartCall();
  }

  // A call must end before its reactor goes away (a failed assertion returns
  // early): cancel it and wait for OnDone.
  ~StalledGet() override {
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_, absl::Condition(&done_));
  }
  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    first_read_ = ok;
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

  void Cancel() { ctx_.TryCancel(); }
  bool first_read() const {
    absl::MutexLock lock(&mu_);
    return first_read_;
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }

 private:
  grpc::ClientContext ctx_;
  v1::GetRequest request_;
  v1::GetResponse first_;
  mutable absl::Mutex mu_;
  bool first_read_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// A call to the reflection service (synchronous in gRPC 1.51: a thread per
// open call) over a generic stub: with `list_services`, one
// ServerReflectionRequest{list_services: ""} (field 7, the bytes 0x3a 0x00)
// and its answer; without, a stream that is opened and then left silent.
class ReflectionCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ReflectionCall(grpc::GenericStub& stub, bool list_services) {
    SetDeadline(&ctx_);
    stub.PrepareBidiStreamingCall(&ctx_, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                  grpc::StubOptions(), this);
    if (list_services) {
      grpc::Slice slice(std::string("\x3a\x00", 2));
      request_ = grpc::ByteBuffer(&slice, 1);
      StartWriteLast(&request_, grpc::WriteOptions());
      StartRead(&response_);
    }
    StartCall();
  }

  // A call must end before its reactor goes away (a failed assertion returns
  // early): cancel it and wait for OnDone.
  ~ReflectionCall() override {
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_, absl::Condition(&done_));
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    std::vector<grpc::Slice> slices;
    if (!response_.Dump(&slices).ok()) return;
    absl::MutexLock lock(&mu_);
    for (const grpc::Slice& s : slices) answer_.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

  void Cancel() { ctx_.TryCancel(); }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  grpc::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  std::string answer() const {
    absl::MutexLock lock(&mu_);
    return answer_;
  }

 private:
  grpc::ClientContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::string answer_ ABSL_GUARDED_BY(mu_);
};

// grpc.health.v1.Health/Check for the server as a whole.
grpc::Status HealthCheck(const std::string& target) {
  grpc::GenericStub stub(OwnChannel(target));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

class StreamsTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options) {
    options.address = "127.0.0.1:0";
    options.reap_interval = absl::Hours(1);  // nothing is reclaimed behind the test's back
    auto s = CacheStoreServer::Start(options, clock_, registry_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
    auto c = GrpcCacheClient::Create(target_);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }

  // The value of an unlabelled counter in the server's metrics; -1 if absent.
  double CounterValue(const std::string& name) {
    for (const prometheus::MetricFamily& f : registry_.Collect()) {
      if (f.name == name && f.metric.size() == 1) return f.metric[0].counter.value;
    }
    return -1;
  }

  // active_puts as a client sees it (the Stats RPC), -1 when the call fails.
  int64_t ActivePuts() {
    auto s = client_->Stats();
    return s.ok() ? s->active_puts : -1;
  }

  common::FakeClock clock_;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::string target_;
  std::unique_ptr<GrpcCacheClient> client_;  // a connection of its own
  ClientNamespace ns_{"fingerprint", "", "", kPageSize};
};

TEST_F(StreamsTest, StreamsBeyondThePeerLimitAreRefusedAtOnceWhileOthersAreServed) {
  constexpr int kPerPeer = 64;
  constexpr int kExtra = 50;
  ServerOptions o;
  o.service.max_streams_per_peer = kPerPeer;
  Start(o);
  auto stub = v1::CacheStore::NewStub(OwnChannel(target_));
  std::vector<std::unique_ptr<StalledPut>> puts;
  for (int i = 0; i < kPerPeer + kExtra; ++i) puts.push_back(std::make_unique<StalledPut>(*stub, 1000 + i));

  // Each extra put ends with RESOURCE_EXHAUSTED well before its 60 s deadline
  // (a refusal, not DEADLINE_EXCEEDED); the admitted ones hold reservations.
  auto refused = [&] {
    int n = 0;
    for (const auto& p : puts) n += p->done();
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return refused() == kExtra && ActivePuts() == kPerPeer; }))
      << refused() << " refused, " << ActivePuts() << " active";
  for (const auto& p : puts) {
    if (!p->done()) continue;
    EXPECT_EQ(p->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << p->status().error_message();
    EXPECT_THAT(p->status().error_message(), HasSubstr("--max_streams_per_peer=64 calls in flight from this client"));
  }

  // Another client, on its own connection, is served: Put, Lookup, Get, Stats.
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.tokens = {7, 8, 9};
  state.position = 3;
  const std::string bytes(10000, 'x');
  auto put = client_->Put(ns_, state, bytes);
  ASSERT_TRUE(put.ok()) << put.status();
  auto lookup = client_->Lookup(ns_, {7, 8, 9}, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  EXPECT_EQ(lookup->resume_position, 3);
  auto got = client_->Get(lookup->lease_id, put->key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == bytes);
  EXPECT_TRUE(client_->Release(lookup->lease_id).ok());
  EXPECT_EQ(ActivePuts(), kPerPeer);

  // The stalled client goes away: every reservation and slot comes back, and
  // its connection is served again.
  for (auto& p : puts) p->Cancel();
  ASSERT_TRUE(WaitFor([&] { return refused() == kPerPeer + kExtra; }));
  ASSERT_TRUE(WaitFor([&] { return ActivePuts() == 0; })) << ActivePuts();
  // A cancelled call gives its slot back when gRPC is done with it, which can
  // be a moment after the store dropped its reservation: until then a new
  // call may still meet the limit (RESOURCE_EXHAUSTED), never anything else.
  grpc::Status last;
  EXPECT_TRUE(WaitFor([&] {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::StatsResponse stats;
    last = stub->Stats(&ctx, v1::StatsRequest(), &stats);
    EXPECT_TRUE(last.ok() || last.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) << last.error_message();
    return last.ok();
  })) << last.error_message();
}

// 1,000 stalled puts and 100 stalled gets over 8 connections (within the
// per-peer limit, under max_streams): the process's threads (client and
// server) stay under 100. Measured with this test: 15-16 threads with callback
// handlers; 115 with a synchronous Get (one thread per stalled get); 1,113 with
// synchronous Put and Get as well (one per stalled put, issue 10 item 8).
TEST_F(StreamsTest, StalledStreamsHoldNoThreads) {
  constexpr int kChannels = 8;
  constexpr int kPuts = 1000;
  constexpr int kGets = 100;
  constexpr int kThreadBound = 100;
  ServerOptions o;
  o.service.max_streams = 2000;
  Start(o);
  const int threads_before = ThreadCount();

  // The entry the gets read: 1 MiB, far more than a stream's flow-control
  // window, in 4 KiB chunks.
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.tokens = {3};
  state.position = 1;
  auto put = client_->Put(ns_, state, std::string(1 << 20, 'g'));
  ASSERT_TRUE(put.ok()) << put.status();
  auto lookup = client_->Lookup(ns_, {3}, LookupMode::kLease);
  ASSERT_TRUE(lookup.ok() && lookup->lease_id != 0) << lookup.status();

  std::vector<std::unique_ptr<v1::CacheStore::Stub>> stubs;
  for (int c = 0; c < kChannels; ++c) stubs.push_back(v1::CacheStore::NewStub(OwnChannel(target_)));
  std::vector<std::unique_ptr<StalledPut>> puts;
  for (int i = 0; i < kPuts; ++i) puts.push_back(std::make_unique<StalledPut>(*stubs[i % kChannels], 10000 + i));
  std::vector<std::unique_ptr<StalledGet>> gets;
  for (int i = 0; i < kGets; ++i) {
    gets.push_back(std::make_unique<StalledGet>(*stubs[i % kChannels], lookup->lease_id, put->key));
  }
  ASSERT_TRUE(WaitFor([&] { return ActivePuts() == kPuts; })) << ActivePuts();
  auto first_reads = [&] {
    int n = 0;
    for (const auto& g : gets) n += g->first_read();
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return first_reads() == kGets; })) << first_reads();
  int done = 0;
  for (const auto& p : puts) done += p->done();
  for (const auto& g : gets) done += g->done();
  EXPECT_EQ(done, 0) << "a stalled call ended on its own";

  const int threads_stalled = ThreadCount();
  std::cout << "threads: " << threads_before << " before, " << threads_stalled << " with " << kPuts
            << " stalled puts and " << kGets << " stalled gets" << std::endl;
  EXPECT_LT(threads_stalled, kThreadBound);

  // The clients give up: every put's reservation is given back.
  for (auto& p : puts) p->Cancel();
  for (auto& g : gets) g->Cancel();
  auto all_done = [&] {
    for (const auto& p : puts) {
      if (!p->done()) return false;
    }
    for (const auto& g : gets) {
      if (!g->done()) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitFor(all_done));
  ASSERT_TRUE(WaitFor([&] { return ActivePuts() == 0; })) << ActivePuts();
  EXPECT_EQ(server_->store().Stats().states.reserved_bytes, 0);
  EXPECT_TRUE(client_->Release(lookup->lease_id).ok());
}

// The limits apply to every method of the CacheStore service, unary calls
// included, and are checked before the request is: with one call in flight
// from a connection, each method called again on it is refused with
// RESOURCE_EXHAUSTED naming --max_streams_per_peer; with max_streams calls in
// flight, a call from any connection is refused naming --max_streams.
TEST_F(StreamsTest, EveryMethodIsRefusedBeyondTheCallLimits) {
  ServerOptions o;
  o.service.max_streams_per_peer = 1;
  o.service.max_streams = 2;
  Start(o);
  auto stub = v1::CacheStore::NewStub(OwnChannel(target_));
  StalledPut held(*stub, 1);
  // Waits read the store in process: a call of the test's own would take a
  // slot (held until gRPC is done with the call, which can be just after the
  // client has its answer).
  ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().active_puts == 1; }));

  const std::string per_peer = "--max_streams_per_peer=1 calls in flight from this client";
  auto expect_refused = [](const grpc::Status& s, const std::string& cause) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(cause));
  };
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::LookupResponse r;
    expect_refused(stub->Lookup(&ctx, v1::LookupRequest(), &r), per_peer);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::ReleaseResponse r;
    expect_refused(stub->Release(&ctx, v1::ReleaseRequest(), &r), per_peer);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::StatsResponse r;
    expect_refused(stub->Stats(&ctx, v1::StatsRequest(), &r), per_peer);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto reader = stub->Get(&ctx, v1::GetRequest());
    v1::GetResponse m;
    EXPECT_FALSE(reader->Read(&m));
    expect_refused(reader->Finish(), per_peer);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto reader = stub->GetMany(&ctx, v1::GetManyRequest());
    v1::GetManyResponse m;
    EXPECT_FALSE(reader->Read(&m));
    expect_refused(reader->Finish(), per_peer);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::PutResponse r;
    auto writer = stub->Put(&ctx, &r);
    writer->Write(StateHeader(2));  // may fail: the server may have ended the call already
    writer->WritesDone();
    expect_refused(writer->Finish(), per_peer);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto stream = stub->PutMany(&ctx);
    stream->Write(StateHeader(2));  // may fail likewise
    stream->WritesDone();
    v1::PutManyResponse m;
    EXPECT_FALSE(stream->Read(&m));
    expect_refused(stream->Finish(), per_peer);
  }

  // A second connection's stalled put fills max_streams: now any new call is
  // refused, whichever connection it comes on.
  auto other = v1::CacheStore::NewStub(OwnChannel(target_));
  StalledPut second(*other, 3);
  ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().active_puts == 2; }));
  auto stats = client_->Stats();
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kResourceExhausted) << stats.status();
  EXPECT_THAT(stats.status().message(), HasSubstr("--max_streams=2 calls in flight over all clients"));
  EXPECT_EQ(CounterValue("hybridserve_cache_calls_refused_total"), 8);  // 7 per peer, 1 overall

  held.Cancel();
  second.Cancel();
  ASSERT_TRUE(WaitFor([&] { return held.done() && second.done(); }));
  ASSERT_TRUE(WaitFor([&] { return ActivePuts() == 0; })) << ActivePuts();
}

// --max_threads bounds the threads of the synchronous reflection service:
// gRPC keeps one of them polling and runs each open call on another, and a
// call that finds none left ends at once with RESOURCE_EXHAUSTED "Server
// Threadpool Exhausted" (gRPC's own message). The callback services (health,
// CacheStore) take no thread from the quota and are still answered; the
// threads come back when the stalled calls end.
TEST_F(StreamsTest, ReflectionBeyondMaxThreadsIsRefusedWhileOtherServicesAnswer) {
  constexpr int kMaxThreads = 4;
  constexpr int kCalls = 20;
  ServerOptions o;
  o.max_threads = kMaxThreads;
  Start(o);
  grpc::GenericStub stub(OwnChannel(target_));
  std::vector<std::unique_ptr<ReflectionCall>> calls;
  for (int i = 0; i < kCalls; ++i) calls.push_back(std::make_unique<ReflectionCall>(stub, false));
  auto ended = [&] {
    int n = 0;
    for (const auto& c : calls) n += c->done();
    return n;
  };
  // At most kMaxThreads - 1 calls hold a thread; the rest are refused.
  ASSERT_TRUE(WaitFor([&] { return ended() >= kCalls - (kMaxThreads - 1); })) << ended();
  for (const auto& c : calls) {
    if (!c->done()) continue;
    EXPECT_EQ(c->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << c->status().error_message();
    EXPECT_EQ(c->status().error_message(), "Server Threadpool Exhausted");
  }
  EXPECT_TRUE(HealthCheck(target_).ok());
  EXPECT_EQ(ActivePuts(), 0);  // the Stats call was answered

  for (auto& c : calls) c->Cancel();
  ASSERT_TRUE(WaitFor([&] { return ended() == kCalls; }));
  // A reflection call is served again once the threads are back (their
  // handlers return when the cancelled calls' reads fail).
  std::unique_ptr<ReflectionCall> list;
  ASSERT_TRUE(WaitFor([&] {
    list = std::make_unique<ReflectionCall>(stub, true);
    if (!WaitFor([&] { return list->done(); })) {
      list->Cancel();  // a hung server: end the call before dropping it
      WaitFor([&] { return list->done(); });
      return false;
    }
    return list->status().ok();
  })) << list->status().error_message();
  EXPECT_TRUE(absl::StrContains(list->answer(), "hybridserve.v1.CacheStore")) << list->answer();
}

}  // namespace
}  // namespace hybridserve::cachestore
