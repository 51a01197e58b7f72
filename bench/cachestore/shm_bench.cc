// A resume's reads on one host: 64 MiB of KV pages (1024 pages of 64 KiB, the
// bench model's 16K-token history) and one 7.7 MB state, read from an
// in-process CacheStoreServer by gRPC (GetMany / Get over loopback) and by
// shared memory (--shm_socket, protocol v2: the entries live in memfd slabs
// from their put on, the cachestore sends read-only slab descriptors, the
// reader preads every entry into its strings, or straight into the page
// slots of a KV pool as prefill's resume does, and verifies its checksum), on
// 1 and 2 streams as prefill fetches them (--cache_fetch_parallelism 3: the
// state plus 2 page streams), against a raw memcpy of the same bytes, and a
// memcpy plus XXH3 of them (the floor of what the shm reader does), in the
// same run. Prints medians and ratios; no goal is judged.
//   bazel run -c opt //bench/cachestore:shm_bench

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/cachestore/bench_timing.h"
#include "cachestore/client/direct_read_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/client/shm_reader.h"
#include "cachestore/keys.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/process.h"
#include "prometheus/registry.h"

namespace hybridserve::bench {
namespace {

constexpr int kPages = 1024;
constexpr size_t kPageBytes = size_t{64} << 10;
constexpr int kPageSize = 16;
constexpr size_t kStateBytes = 7'700'000;
constexpr int kReps = 7;

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Row {
  std::string name;
  std::function<void()> run;
  std::vector<double> seconds, cpu;
};

// One warm-up, then kReps timed runs of every row, interleaved.
void Measure(std::vector<Row>& rows) {
  for (int rep = 0; rep <= kReps; ++rep) {
    for (Row& r : rows) {
      const double cpu = CpuSeconds();
      const auto start = std::chrono::steady_clock::now();
      r.run();
      const double s = SecondsSince(start);
      if (rep > 0) {
        r.seconds.push_back(s);
        r.cpu.push_back(CpuSeconds() - cpu);
      }
    }
  }
}

// rows[0] is the group's memcpy, rows[grpc] the gRPC read the ratios compare with.
void PrintGroup(const std::string& title, const std::vector<Row>& rows, size_t grpc, size_t bytes) {
  const double memcpy_s = Median(rows[0].seconds);
  const double grpc_s = Median(rows[grpc].seconds);
  std::printf("\n== %s, median of %d\n", title.c_str(), kReps);
  std::printf("%-36s %9s %8s %10s %10s %10s\n", "read", "ms", "GB/s", "CPU ms", "/memcpy", "gRPC/x");
  for (const Row& r : rows) {
    const double s = Median(r.seconds);
    std::printf("%-36s %9.2f %8.2f %10.1f %9.2fx %9.2fx\n", r.name.c_str(), s * 1e3,
                static_cast<double>(bytes) / s / 1e9, Median(r.cpu) * 1e3, s / memcpy_s, grpc_s / s);
  }
}

void FillRandom(std::mt19937_64& rng, std::string& bytes) {
  for (size_t j = 0; j + 8 <= bytes.size(); j += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[j], &v, 8);
  }
}

void Run() {
  char dir[] = "/tmp/hs-shm-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) std::exit(1);
  prometheus::Registry registry;
  cachestore::ServerOptions options;
  options.address = "127.0.0.1:0";
  options.index.page_budget_bytes = int64_t{256} << 20;
  options.shm.socket_path = absl::StrCat(dir, "/cachestore.sock");
  auto server = cachestore::CacheStoreServer::Start(options, common::Clock::Real(), registry);
  Check(server.status(), "CacheStoreServer::Start");
  auto grpc = cachestore::GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", (*server)->port()));
  Check(grpc.status(), "GrpcCacheClient::Create");
  cachestore::DirectReadCacheClient shm(
      **grpc, std::make_unique<cachestore::ShmReader>(cachestore::ShmReaderOptions{options.shm.socket_path}));

  const cachestore::ClientNamespace ns{"bench-model", "", "shm", kPageSize};
  std::vector<cachestore::TokenId> tokens(kPages * kPageSize + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<cachestore::TokenId>(i + 1);
  const std::vector<cachestore::Hash128> all = cachestore::PageKeys(ns.Key(), tokens, kPageSize);
  const std::vector<cachestore::Hash128> keys(all.begin(), all.begin() + kPages);
  std::mt19937_64 rng(7);
  std::string bytes(kPageBytes, '\0');
  for (int i = 0; i < kPages; ++i) {
    FillRandom(rng, bytes);
    cachestore::ClientPut put;
    if (i > 0) put.parent = keys[static_cast<size_t>(i) - 1];
    put.tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + (i + 1) * kPageSize);
    Check((*grpc)->Put(ns, put, bytes).status(), "Put page");
  }
  cachestore::ClientPut state;
  state.entry_class = cachestore::EntryClass::kState;
  state.parent = keys.back();
  state.tokens = {tokens.back()};
  state.position = static_cast<int64_t>(tokens.size());
  std::string state_bytes(kStateBytes, '\0');
  FillRandom(rng, state_bytes);
  Check((*grpc)->Put(ns, state, state_bytes).status(), "Put state");
  auto lookup = (*grpc)->Lookup(ns, tokens, cachestore::LookupMode::kLease);
  Check(lookup.status(), "Lookup");
  const uint64_t lease = lookup->lease_id;
  const cachestore::Hash128 state_key = lookup->state->key;

  // The pages split into `streams` contiguous slices, read(begin, end) for
  // each on a thread of its own, as prefill's resume reads them.
  auto on_streams = [&](int streams, const std::function<void(int begin, int end)>& read) {
    std::vector<std::thread> threads;
    for (int s = 0; s < streams; ++s) {
      threads.emplace_back([&, s] { read(kPages * s / streams, kPages * (s + 1) / streams); });
    }
    for (std::thread& t : threads) t.join();
  };
  auto into_strings = [&](cachestore::CacheClient& client, int begin, int end, std::vector<std::string>& out) {
    Check(client.GetManyInto(lease, absl::MakeConstSpan(keys).subspan(begin, end - begin),
                             absl::MakeSpan(out).subspan(begin, end - begin)),
          "GetManyInto");
  };
  // Every reader keeps its strings across reps, as a worker would (the first
  // rep is a warm-up).
  std::vector<std::string> out(kPages);
  auto get_many = [&](cachestore::CacheClient& client, int streams) {
    on_streams(streams, [&](int begin, int end) { into_strings(client, begin, end, out); });
  };
  // A resume that fetched into strings made new ones each time: every
  // byte a first touch of fresh memory.
  auto get_many_new = [&](cachestore::CacheClient& client, int streams) {
    std::vector<std::string> fresh(kPages);
    on_streams(streams, [&](int begin, int end) { into_strings(client, begin, end, fresh); });
    KeepAlive(fresh[0].data());
  };
  // Prefill's resume now: each page straight into a KV pool's (warm) page
  // slots, K and V of each of the bench model's 2 attention layers, 16 KiB
  // each, layer-major as the pool lays them out.
  constexpr int kSegments = 4;
  constexpr size_t kSegmentBytes = kPageBytes / kSegments;
  std::vector<char> pool(kPages * kPageBytes, 'p');
  std::vector<cachestore::EntrySegments> slots(kPages);
  for (int i = 0; i < kPages; ++i) {
    for (int j = 0; j < kSegments; ++j) {
      slots[static_cast<size_t>(i)].segments.push_back(
          absl::MakeSpan(pool.data() + (static_cast<size_t>(j) * kPages + i) * kSegmentBytes, kSegmentBytes));
    }
  }
  auto get_many_scattered = [&](cachestore::CacheClient& client, int streams) {
    on_streams(streams, [&](int begin, int end) {
      Check(client.GetManyScattered(lease, absl::MakeConstSpan(keys).subspan(begin, end - begin),
                                    absl::MakeConstSpan(slots).subspan(begin, end - begin)),
            "GetManyScattered");
    });
  };
  std::vector<char> src(kPages * kPageBytes, 'x'), dst(kPages * kPageBytes);
  std::vector<Row> pages;
  pages.push_back({"memcpy 64 MiB (warm)", [&] {
                     std::memcpy(dst.data(), src.data(), dst.size());
                     KeepAlive(dst.data());
                   }});
  pages.push_back({"memcpy + XXH3 per 64 KiB page", [&] {
                     uint64_t sum = 0;
                     for (size_t off = 0; off < dst.size(); off += kPageBytes) {
                       std::memcpy(dst.data() + off, src.data() + off, kPageBytes);
                       sum += common::Checksum64(dst.data() + off, kPageBytes);
                     }
                     KeepAlive(sum);
                   }});
  pages.push_back({"gRPC GetMany, 1 stream", [&] { get_many(**grpc, 1); }});
  pages.push_back({"gRPC GetMany, 2 streams", [&] { get_many(**grpc, 2); }});
  pages.push_back({"gRPC GetMany, 2 streams, new strings", [&] { get_many_new(**grpc, 2); }});
  pages.push_back({"gRPC into pool slots, 2 streams", [&] { get_many_scattered(**grpc, 2); }});
  pages.push_back({"shm v2 GetMany, 1 read", [&] { get_many(shm, 1); }});
  pages.push_back({"shm v2 GetMany, 2 reads", [&] { get_many(shm, 2); }});
  pages.push_back({"shm v2 GetMany, 2 reads, new strings", [&] { get_many_new(shm, 2); }});
  pages.push_back({"shm v2 into pool slots, 1 read", [&] { get_many_scattered(shm, 1); }});
  pages.push_back({"shm v2 into pool slots, 2 reads", [&] { get_many_scattered(shm, 2); }});
  Measure(pages);

  std::string state_out;
  std::vector<Row> states;
  states.push_back({"memcpy 7.7 MB (warm)", [&] {
                      std::memcpy(dst.data(), src.data(), kStateBytes);
                      KeepAlive(dst.data());
                    }});
  states.push_back({"memcpy + XXH3", [&] {
                      std::memcpy(dst.data(), src.data(), kStateBytes);
                      KeepAlive(common::Checksum64(dst.data(), kStateBytes));
                    }});
  states.push_back({"gRPC Get", [&] { Check((*grpc)->GetInto(lease, state_key, &state_out), "GetInto"); }});
  states.push_back({"shm v2 Get", [&] { Check(shm.GetInto(lease, state_key, &state_out), "shm GetInto"); }});
  Measure(states);

  for (int i = 0; i < kPages; i += 97) {
    const std::string& page = out[static_cast<size_t>(i)];
    if (page.size() != kPageBytes) std::exit(1);
    for (int j = 0; j < kSegments; ++j) {
      const absl::Span<char> slot = slots[static_cast<size_t>(i)].segments[static_cast<size_t>(j)];
      if (std::memcmp(slot.data(), page.data() + j * kSegmentBytes, kSegmentBytes) != 0) std::exit(1);
    }
  }
  if (state_out != state_bytes) std::exit(1);
  const cachestore::DirectReadCounts counts = shm.counts();
  Check((*grpc)->Release(lease), "Release");
  (*server)->Shutdown(absl::Seconds(1));
  rmdir(dir);

  PrintGroup(absl::StrCat(kPages * (kPageBytes >> 10) >> 10, " MiB of pages (", kPages, " x ", kPageBytes >> 10,
                          " KiB) from a cachestore on this host"),
             pages, 2, kPages * kPageBytes);
  PrintGroup("one 7.7 MB state from a cachestore on this host", states, 2, kStateBytes);
  std::printf("(CPU ms: user + system of the whole process, both ends. shm reads: %lld, fallbacks: %zu)\n",
              static_cast<long long>(counts.reads), counts.fallbacks.size());
}

}  // namespace
}  // namespace hybridserve::bench

int main() {
  hybridserve::common::TuneProcessForServing();
  hybridserve::bench::Run();
  return 0;
}
