// Command-line client of the cachestore: `stats` prints the store's counters;
// `demo` plays a synthetic two-turn conversation through the cache and shows
// that turn 2 resumes where turn 1 ended.

#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "cachestore/client/grpc_cache_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "cachestore address");
ABSL_FLAG(int, page_size, 16, "tokens per KV page (demo)");
ABSL_FLAG(int, state_kib, 512, "bytes of each synthetic SSM snapshot, KiB (demo)");

namespace hybridserve::cachestore {
namespace {

absl::Status PrintStats(GrpcCacheClient& client) {
  absl::StatusOr<IndexStats> s = client.Stats();
  if (!s.ok()) return s.status();
  std::printf("namespaces %lld  leases %lld  puts in flight %lld  lookups %lld  hits %lld  checksum failures %lld\n",
              (long long)s->namespaces, (long long)s->active_leases, (long long)s->active_puts, (long long)s->lookups,
              (long long)s->lookup_hits, (long long)s->checksum_failures);
  for (const auto& [name, c] : {std::pair{"pages", s->pages}, std::pair{"states", s->states}}) {
    std::printf("%-6s entries %lld  resident %lld B  reserved %lld B  budget %lld B  evicted lru %lld ttl %lld\n", name,
                (long long)c.entries, (long long)c.resident_bytes, (long long)c.reserved_bytes,
                (long long)c.budget_bytes, (long long)c.evicted_lru, (long long)c.evicted_ttl);
  }
  return absl::OkStatus();
}

// Publishes pages [from_page, floor(p/page_size)) and the state at p.
absl::Status Publish(GrpcCacheClient& client, const ClientNamespace& ns, const std::vector<TokenId>& tokens,
                     int64_t from_page, int64_t p) {
  std::vector<Hash128> keys = PageKeys(ns.Key(), tokens, ns.page_size);
  const int64_t n = p / ns.page_size;
  std::string page_bytes(4096, 'k');
  for (int64_t i = from_page; i < n; ++i) {
    ClientPut page;
    if (i > 0) page.parent = keys[i - 1];
    page.tokens.assign(tokens.begin() + i * ns.page_size, tokens.begin() + (i + 1) * ns.page_size);
    absl::StatusOr<PutResult> r = client.Put(ns, page, page_bytes);
    if (!r.ok()) return r.status();
  }
  ClientPut state;
  state.entry_class = EntryClass::kState;
  if (n > 0) state.parent = keys[n - 1];
  state.tokens.assign(tokens.begin() + n * ns.page_size, tokens.begin() + p);
  state.position = p;
  std::string bytes(static_cast<size_t>(absl::GetFlag(FLAGS_state_kib)) << 10, 's');
  absl::StatusOr<PutResult> r = client.Put(ns, state, bytes);
  return r.status();
}

absl::Status Demo(GrpcCacheClient& client) {
  ClientNamespace ns{"demo-model", "", "demo-tenant", absl::GetFlag(FLAGS_page_size)};
  std::vector<TokenId> conversation(300);
  std::iota(conversation.begin(), conversation.end(), 1);
  const std::vector<int64_t> turn_ends = {70, 150, 300};
  int64_t published_pages = 0;
  for (size_t turn = 0; turn < turn_ends.size(); ++turn) {
    std::vector<TokenId> prompt(conversation.begin(), conversation.begin() + turn_ends[turn]);
    absl::StatusOr<LookupResult> r = client.Lookup(ns, prompt, LookupMode::kLease);
    if (!r.ok()) return r.status();
    std::printf("turn %zu: prompt %lld tokens, resume at %lld (%s), kv match %lld, prefill %lld tokens\n", turn + 1,
                (long long)prompt.size(), (long long)r->resume_position,
                r->state.has_value() ? "exact-prefix snapshot" : "cold", (long long)r->kv_match_tokens,
                (long long)(prompt.size() - r->resume_position));
    for (const EntryInfo& e : r->pages) {
      absl::StatusOr<std::string> got = client.Get(r->lease_id, e.key);
      if (!got.ok()) return got.status();
    }
    if (r->state.has_value()) {
      absl::StatusOr<std::string> got = client.Get(r->lease_id, r->state->key);
      if (!got.ok()) return got.status();
    }
    if (r->lease_id != 0) {
      absl::Status s = client.Release(r->lease_id);
      if (!s.ok()) return s;
    }
    // The turn ends: publish its snapshot so the next turn resumes here.
    absl::Status s = Publish(client, ns, prompt, published_pages, static_cast<int64_t>(prompt.size()));
    if (!s.ok()) return s;
    published_pages = static_cast<int64_t>(prompt.size()) / ns.page_size;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace hybridserve::cachestore

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("cachestore_cli [--target=host:port] stats|demo");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: cachestore_cli [--target=host:port] stats|demo\n";
    return 2;
  }
  auto client = hybridserve::cachestore::GrpcCacheClient::Create(absl::GetFlag(FLAGS_target));
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  const std::string cmd = args[1];
  absl::Status s = cmd == "stats"  ? hybridserve::cachestore::PrintStats(**client)
                   : cmd == "demo" ? hybridserve::cachestore::Demo(**client)
                                   : absl::InvalidArgumentError("unknown command " + cmd);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
