// The disk tier's read of a resume (issue 49's goal: a 16K-token history's
// state read from disk after the page cache is dropped costs <= 2x the
// shared-memory read of the same bytes, verified before use). The bytes: the
// bench Nemotron-H's 16K-token history, 1024 KV pages of 64 KiB and one
// 7,749,768-byte state (bench/cachestore/results/README.md), 71.9 MB.
//
// Rows, each timed in rounds interleaved with the others of its group:
//  - memcpy of the bytes (warm), and the shared-memory read of the same
//    entries from an in-process cachestore (--shm_socket, as shm_bench: into
//    the reader's strings, verified by XXH3), on 1 and 2 reads;
//  - DiskTier::Get of every entry (header, length and XXH3 checked), on 1,
//    2, 4 and 8 threads, each round after posix_fadvise(POSIX_FADV_DONTNEED)
//    on every file (the page cache dropped; /proc/sys/vm/drop_caches needs
//    root), and once with the page cache warm;
//  - the store's own path: CacheStore::Lookup on a store whose memory is
//    empty and whose disk holds the history (a warm restart): the lookup
//    reads the 1025 entries back, verifies them, and puts them into memory,
//    then answers; page cache dropped before each round.
// Prints medians and the ratios to the shm read; the disk's residency after
// the drop is measured (mincore) and printed, so a drop that did not happen
// shows.
//   bazel run -c opt //bench/cachestore:disk_bench -- [directory on the disk to measure; default /var/tmp]

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
#include "cachestore/index/cache_store.h"
#include "cachestore/index/disk_tier.h"
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
constexpr size_t kStateBytes = 7'749'768;
constexpr size_t kTotalBytes = kPages * kPageBytes + kStateBytes;
constexpr int kReps = 5;

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

std::vector<std::string> EntryFiles(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  while (const dirent* e = readdir(d)) {
    if (std::strlen(e->d_name) == 32) files.push_back(absl::StrCat(dir, "/", e->d_name));
  }
  closedir(d);
  return files;
}

// Drops the files' pages from the page cache (they are clean: fsynced).
void DropCache(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    const int fd = open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

// Fraction of the files' pages resident in the page cache.
double Resident(const std::vector<std::string>& files) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t resident = 0, total = 0;
  for (const std::string& f : files) {
    const int fd = open(f.c_str(), O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
      if (fd >= 0) close(fd);
      continue;
    }
    void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    const size_t pages = (static_cast<size_t>(st.st_size) + page - 1) / page;
    std::vector<unsigned char> vec(pages);
    if (m != MAP_FAILED && mincore(m, static_cast<size_t>(st.st_size), vec.data()) == 0) {
      for (unsigned char v : vec) resident += v & 1;
      total += pages;
    }
    if (m != MAP_FAILED) munmap(m, static_cast<size_t>(st.st_size));
    close(fd);
  }
  return total == 0 ? 0 : static_cast<double>(resident) / static_cast<double>(total);
}

struct Row {
  std::string name;
  std::function<void()> prepare;  // untimed, before each run
  std::function<void()> run;
  std::vector<double> seconds;
};

// One warm-up, then kReps timed runs of every row, interleaved.
void Measure(std::vector<Row>& rows) {
  for (int rep = 0; rep <= kReps; ++rep) {
    for (Row& r : rows) {
      if (r.prepare) r.prepare();
      const auto start = std::chrono::steady_clock::now();
      r.run();
      if (rep > 0) r.seconds.push_back(SecondsSince(start));
    }
  }
}

// Rows named "the state alone" compare with `shm_state_s`, the others with `shm_s`.
void Print(const std::vector<Row>& rows, double shm_s, double shm_state_s) {
  for (const Row& r : rows) {
    const double s = Median(r.seconds);
    const bool state = r.name.rfind("the state alone", 0) == 0;
    std::printf("%-52s %9.2f %8.2f %9.2fx\n", r.name.c_str(), s * 1e3,
                static_cast<double>(state ? kStateBytes : kTotalBytes) / s / 1e9, s / (state ? shm_state_s : shm_s));
  }
}

void FillRandom(std::mt19937_64& rng, std::string& bytes) {
  for (size_t j = 0; j + 8 <= bytes.size(); j += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[j], &v, 8);
  }
}

void Run(const std::string& parent) {
  // The history: tokens, page keys and the bytes, the same for every reader.
  const cachestore::ClientNamespace ns{"bench-model", "", "disk", kPageSize};
  std::vector<cachestore::TokenId> tokens(kPages * kPageSize + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<cachestore::TokenId>(i + 1);
  const std::vector<cachestore::Hash128> all = cachestore::PageKeys(ns.Key(), tokens, kPageSize);
  const std::vector<cachestore::Hash128> keys(all.begin(), all.begin() + kPages);
  std::mt19937_64 rng(7);
  std::vector<std::string> pages(kPages, std::string(kPageBytes, '\0'));
  for (std::string& p : pages) FillRandom(rng, p);
  std::string state_bytes(kStateBytes, '\0');
  FillRandom(rng, state_bytes);

  // Puts the history into `client`; returns the state's key.
  auto put_history = [&](cachestore::CacheClient& client) {
    for (int i = 0; i < kPages; ++i) {
      cachestore::ClientPut put;
      if (i > 0) put.parent = keys[static_cast<size_t>(i) - 1];
      put.tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + (i + 1) * kPageSize);
      Check(client.Put(ns, put, pages[static_cast<size_t>(i)]).status(), "Put page");
    }
    cachestore::ClientPut state;
    state.entry_class = cachestore::EntryClass::kState;
    state.parent = keys.back();
    state.tokens = {tokens.back()};
    state.position = static_cast<int64_t>(tokens.size());
    auto put = client.Put(ns, state, state_bytes);
    Check(put.status(), "Put state");
    return put->key;
  };

  char tmpl[] = "/tmp/hs-disk-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) std::exit(1);
  const std::string sock_dir = tmpl;
  const std::string disk_dir = absl::StrCat(parent, "/hs-disk-bench-", getpid());
  prometheus::Registry registry;
  std::vector<Row> shm_rows, disk_rows, store_rows;

  // --- The shared-memory read, and the disk written by the shutdown spill.
  std::vector<std::string> out(kPages + 1);
  cachestore::ServerOptions options;
  options.address = "127.0.0.1:0";
  options.index.page_budget_bytes = int64_t{256} << 20;
  options.shm.socket_path = absl::StrCat(sock_dir, "/cachestore.sock");
  options.disk.directory = disk_dir;
  options.disk.budget_bytes = int64_t{1} << 30;
  auto server = cachestore::CacheStoreServer::Start(options, common::Clock::Real(), registry);
  Check(server.status(), "CacheStoreServer::Start");
  auto grpc = cachestore::GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", (*server)->port()));
  Check(grpc.status(), "GrpcCacheClient::Create");
  cachestore::DirectReadCacheClient shm(
      **grpc, std::make_unique<cachestore::ShmReader>(cachestore::ShmReaderOptions{options.shm.socket_path}));
  const cachestore::Hash128 state_key = put_history(**grpc);
  auto lookup = (*grpc)->Lookup(ns, tokens, cachestore::LookupMode::kLease);
  Check(lookup.status(), "Lookup");
  const uint64_t lease = lookup->lease_id;
  std::vector<cachestore::Hash128> entry_keys = keys;
  entry_keys.push_back(state_key);
  auto shm_read = [&](int reads) {
    std::vector<std::thread> threads;
    for (int r = 0; r < reads; ++r) {
      threads.emplace_back([&, r] {
        const size_t begin = entry_keys.size() * r / reads, end = entry_keys.size() * (r + 1) / reads;
        Check(shm.GetManyInto(lease, absl::MakeConstSpan(entry_keys).subspan(begin, end - begin),
                              absl::MakeSpan(out).subspan(begin, end - begin)),
              "shm GetManyInto");
      });
    }
    for (std::thread& t : threads) t.join();
  };
  std::string src(kTotalBytes, 'x'), dst(kTotalBytes, 'y');
  shm_rows.push_back({"memcpy 74.9 MB (warm)", nullptr, [&] {
                        std::memcpy(dst.data(), src.data(), dst.size());
                        KeepAlive(dst.data());
                      }});
  shm_rows.push_back({"shm v2 GetMany, 1 read", nullptr, [&] { shm_read(1); }});
  shm_rows.push_back({"shm v2 GetMany, 2 reads", nullptr, [&] { shm_read(2); }});
  std::string state_out;
  shm_rows.push_back(
      {"the state alone: shm v2 Get", nullptr, [&] { Check(shm.GetInto(lease, state_key, &state_out), "shm Get"); }});
  Measure(shm_rows);
  for (int i = 0; i < kPages; i += 97) {
    if (out[static_cast<size_t>(i)] != pages[static_cast<size_t>(i)]) std::exit(1);
  }
  if (out.back() != state_bytes) std::exit(1);
  Check((*grpc)->Release(lease), "Release");
  (*server)->Shutdown(absl::Seconds(1));  // writes the memory to disk_dir
  const int64_t spilled = (*server)->store().Stats().disk.shutdown_spilled;
  server->reset();
  unlink(options.shm.socket_path.c_str());
  rmdir(sock_dir.c_str());
  if (spilled != kPages + 1) {
    std::fprintf(stderr, "the shutdown spill wrote %lld entries, want %d\n", static_cast<long long>(spilled),
                 kPages + 1);
    std::exit(1);
  }
  const std::vector<std::string> files = EntryFiles(disk_dir);

  // --- DiskTier::Get, cold and warm.
  double resident_after_drop = -1;
  {
    auto tier = cachestore::DiskTier::Open(disk_dir, uint64_t{1} << 30);
    Check(tier.status(), "DiskTier::Open");
    auto get_all = [&](int threads) {
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          for (size_t i = t; i < entry_keys.size(); i += threads) {
            absl::StatusOr<cachestore::DiskTierEntry> e = (*tier)->Get(entry_keys[i]);
            Check(e.status(), "DiskTier::Get");
            out[i] = std::move(e->payload);
          }
        });
      }
      for (std::thread& w : workers) w.join();
    };
    auto drop = [&] {
      DropCache(files);
      if (resident_after_drop < 0) resident_after_drop = Resident(files);
    };
    for (int threads : {1, 2, 4, 8, 16, 32}) {
      disk_rows.push_back(
          {absl::StrCat("disk tier Get, page cache dropped, ", threads, " thread", threads > 1 ? "s" : ""), drop,
           [&, threads] { get_all(threads); }});
    }
    // Every file's readahead asked for at once (POSIX_FADV_WILLNEED), then read.
    auto prefetch = [&] {
      for (const std::string& f : files) {
        const int fd = open(f.c_str(), O_RDONLY);
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
      }
    };
    for (int threads : {1, 2, 8}) {
      disk_rows.push_back(
          {absl::StrCat("WILLNEED all, then Get, dropped, ", threads, " thread", threads > 1 ? "s" : ""), drop,
           [&, threads] {
             prefetch();
             get_all(threads);
           }});
    }
    disk_rows.push_back({"disk tier Get, page cache warm, 2 threads", nullptr, [&] { get_all(2); }});
    disk_rows.push_back({"the state alone: disk tier Get, dropped", drop, [&] {
                           absl::StatusOr<cachestore::DiskTierEntry> e = (*tier)->Get(state_key);
                           Check(e.status(), "DiskTier::Get state");
                           KeepAlive(e->payload.data());
                         }});
    Measure(disk_rows);
    for (int i = 0; i < kPages; i += 97) {
      if (out[static_cast<size_t>(i)] != pages[static_cast<size_t>(i)]) std::exit(1);
    }
    if (out.back() != state_bytes) std::exit(1);
  }

  // --- The store's path: a lookup on a restarted store reads the history back.
  {
    common::Clock& clock = common::Clock::Real();
    cachestore::CacheIndexOptions index;
    index.page_budget_bytes = int64_t{256} << 20;
    cachestore::DiskTierCacheOptions disk;
    disk.directory = disk_dir;
    disk.budget_bytes = int64_t{1} << 30;
    std::unique_ptr<cachestore::CacheStore> store;
    int64_t resume = 0, pages_from_disk = 0;
    store_rows.push_back({"store Lookup promoting from disk, dropped",
                          [&] {
                            store.reset();
                            auto s = cachestore::CacheStore::Create(index, clock, disk);
                            Check(s.status(), "CacheStore::Create");
                            store = *std::move(s);
                            DropCache(files);  // Open read every file
                          },
                          [&] {
                            auto r = store->Lookup(ns.Key(), kPageSize, tokens, /*lease=*/false);
                            Check(r.status(), "Lookup");
                            resume = r->resume_position;
                            pages_from_disk = r->pages_from_disk;
                          }});
    Measure(store_rows);
    if (resume != static_cast<int64_t>(tokens.size()) || pages_from_disk != kPages) {
      std::fprintf(stderr, "the promoting lookup answered %lld with %lld pages from disk\n",
                   static_cast<long long>(resume), static_cast<long long>(pages_from_disk));
      std::exit(1);
    }
  }
  (void)!std::system(absl::StrCat("rm -rf '", disk_dir, "'").c_str());

  const double shm_s = std::min(Median(shm_rows[1].seconds), Median(shm_rows[2].seconds));
  std::printf(
      "\n== a 16K-token history of the bench Nemotron-H: %d pages of %zu KiB + a %zu-byte state, %.1f MB; "
      "median of %d\n",
      kPages, kPageBytes >> 10, kStateBytes, static_cast<double>(kTotalBytes) / 1e6, kReps);
  std::printf("disk: %s; page cache resident after the drop: %.1f%%\n", parent.c_str(), 100 * resident_after_drop);
  std::printf("%-52s %9s %8s %10s\n", "read", "ms", "GB/s", "/shm");
  const double shm_state_s = Median(shm_rows[3].seconds);
  Print(shm_rows, shm_s, shm_state_s);
  Print(disk_rows, shm_s, shm_state_s);
  Print(store_rows, shm_s, shm_state_s);
}

}  // namespace
}  // namespace hybridserve::bench

int main(int argc, char** argv) {
  hybridserve::common::TuneProcessForServing();
  hybridserve::bench::Run(argc > 1 ? argv[1] : "/var/tmp");
  return 0;
}
