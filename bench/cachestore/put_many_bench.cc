// A 16K-token conversation's pages put into the cachestore over loopback gRPC
// (an in-process CacheStoreServer on 127.0.0.1:0 and a GrpcCacheClient at its
// default options): one Put call per page (how CachePublisher put them before
// PutMany) against one PutMany call for the whole chain, in the same run,
// rounds alternating which goes first. Two shapes of the same 64 MiB:
// 1024 pages of 64 KiB (16 tokens a page) and 4096 pages of 16 KiB (4 tokens
// a page). Each round puts a fresh chain (its own cache salt), so no page is
// already present; the page budget holds every round's pages, so no put
// evicts. Prints the median seconds of each, the pages per second, and the
// ratio Put / PutMany (median of the in-round ratios).
//   bazel run -c opt //bench/cachestore:put_many_bench

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/cachestore/bench_timing.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/keys.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "prometheus/registry.h"

namespace hybridserve::bench {
namespace {

using cachestore::ClientNamespace;
using cachestore::ClientPut;
using cachestore::GrpcCacheClient;
using cachestore::PutManyEntry;
using cachestore::PutResult;

constexpr int kTokens = 16384;
constexpr int kRounds = 5;

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// The page chain of a conversation of kTokens tokens in `ns`.
std::vector<ClientPut> Chain(const ClientNamespace& ns) {
  std::vector<cachestore::TokenId> tokens(kTokens);
  for (int i = 0; i < kTokens; ++i) tokens[i] = 1 + (i * 7919) % 50000;
  const std::vector<cachestore::Hash128> keys = cachestore::PageKeys(ns.Key(), tokens, ns.page_size);
  std::vector<ClientPut> pages(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) pages[i].parent = keys[i - 1];
    pages[i].tokens.assign(tokens.begin() + i * ns.page_size, tokens.begin() + (i + 1) * ns.page_size);
  }
  return pages;
}

double PutEach(GrpcCacheClient& client, const ClientNamespace& ns, const std::vector<std::string>& bytes) {
  const std::vector<ClientPut> pages = Chain(ns);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < pages.size(); ++i) {
    absl::StatusOr<PutResult> r = client.Put(ns, pages[i], bytes[i]);
    Check(r.status(), "Put");
    if (r->already_present) Check(absl::InternalError("a page was already present"), "Put");
  }
  return SecondsSince(start);
}

double PutAllAtOnce(GrpcCacheClient& client, const ClientNamespace& ns, const std::vector<std::string>& bytes) {
  const std::vector<ClientPut> pages = Chain(ns);
  std::vector<PutManyEntry> entries;
  for (size_t i = 0; i < pages.size(); ++i) entries.push_back({&pages[i], bytes[i]});
  const auto start = std::chrono::steady_clock::now();
  std::vector<absl::StatusOr<PutResult>> r = client.PutMany(ns, entries);
  const double s = SecondsSince(start);
  for (const absl::StatusOr<PutResult>& e : r) {
    Check(e.status(), "PutMany");
    if (e->already_present) Check(absl::InternalError("a page was already present"), "PutMany");
  }
  return s;
}

void RunShape(GrpcCacheClient& client, int32_t page_size, size_t page_bytes) {
  const size_t n = kTokens / page_size;
  std::vector<std::string> bytes(n);
  std::mt19937_64 rng(page_size);
  for (std::string& b : bytes) {
    b.resize(page_bytes);
    for (size_t i = 0; i + 8 <= page_bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(&b[i], &v, 8);
    }
  }
  std::vector<double> each, many, ratios;
  for (int round = 0; round <= kRounds; ++round) {  // round 0 warms up, untimed
    const ClientNamespace ns_each{"bench-model", "", absl::StrCat("each-", page_size, "-", round), page_size};
    const ClientNamespace ns_many{"bench-model", "", absl::StrCat("many-", page_size, "-", round), page_size};
    double e, m;
    if (round % 2 == 0) {
      e = PutEach(client, ns_each, bytes);
      m = PutAllAtOnce(client, ns_many, bytes);
    } else {
      m = PutAllAtOnce(client, ns_many, bytes);
      e = PutEach(client, ns_each, bytes);
    }
    if (round == 0) continue;
    each.push_back(e);
    many.push_back(m);
    ratios.push_back(e / m);
  }
  const double me = Median(each), mm = Median(many);
  std::printf("| %zu x %zu KiB | %.1f ms (%.0f pages/s) | %.1f ms (%.0f pages/s) | %.2fx |\n", n, page_bytes >> 10,
              1e3 * me, n / me, 1e3 * mm, n / mm, Median(ratios));
}

int Main() {
  prometheus::Registry registry;
  cachestore::ServerOptions options;
  options.address = "127.0.0.1:0";
  // Every round's pages (2 shapes x 6 rounds x 2 ways x 64 MiB, with index
  // memory) fit: no put evicts.
  options.index.page_budget_bytes = int64_t{2} << 30;
  absl::StatusOr<std::unique_ptr<cachestore::CacheStoreServer>> server =
      cachestore::CacheStoreServer::Start(options, common::Clock::Real(), registry);
  Check(server.status(), "CacheStoreServer::Start");
  absl::StatusOr<std::unique_ptr<GrpcCacheClient>> client =
      GrpcCacheClient::Create("127.0.0.1:" + std::to_string((*server)->port()));
  Check(client.status(), "GrpcCacheClient::Create");
  std::printf("A %d-token conversation's pages over loopback gRPC, median of %d rounds\n", kTokens, kRounds);
  std::printf("| pages | one Put per page | one PutMany | Put / PutMany |\n| --- | --- | --- | --- |\n");
  RunShape(**client, 16, size_t{64} << 10);
  RunShape(**client, 4, size_t{16} << 10);
  return 0;
}

}  // namespace
}  // namespace hybridserve::bench

int main() { return hybridserve::bench::Main(); }
