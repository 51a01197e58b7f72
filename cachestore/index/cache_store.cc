#include "cachestore/index/cache_store.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {

absl::StatusOr<std::unique_ptr<CacheStore>> CacheStore::Create(const CacheIndexOptions& options,
                                                               const common::Clock& clock,
                                                               const DiskTierCacheOptions& disk) {
  // Each refusal names the option and the value it got.
  auto bytes_at_least = [](absl::string_view name, int64_t value, int64_t min) -> absl::Status {
    if (value >= min) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, " must be >= ", min, ", got ", value));
  };
  auto positive_duration = [](absl::string_view name, absl::Duration value) -> absl::Status {
    if (value > absl::ZeroDuration()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, " must be > 0, got ", absl::FormatDuration(value)));
  };
  RETURN_IF_ERROR(bytes_at_least("page_budget_bytes", options.page_budget_bytes, 1));
  RETURN_IF_ERROR(bytes_at_least("state_budget_bytes", options.state_budget_bytes, 1));
  RETURN_IF_ERROR(positive_duration("page_ttl", options.page_ttl));
  RETURN_IF_ERROR(positive_duration("state_ttl", options.state_ttl));
  RETURN_IF_ERROR(positive_duration("lease_ttl", options.lease_ttl));
  RETURN_IF_ERROR(positive_duration("put_timeout", options.put_timeout));
  RETURN_IF_ERROR(positive_duration("max_session_ttl", options.max_session_ttl));
  RETURN_IF_ERROR(bytes_at_least("max_tokens", options.max_tokens, 1));
  RETURN_IF_ERROR(bytes_at_least("blob_pool_bytes", options.blob_pool_bytes, 0));
  RETURN_IF_ERROR(bytes_at_least("pin_quota_bytes", options.pin_quota_bytes, 0));
  RETURN_IF_ERROR(bytes_at_least("pin_budget_bytes", options.pin_budget_bytes, -1));  // -1: half the state budget
  RETURN_IF_ERROR(bytes_at_least("entry_overhead_bytes", options.entry_overhead_bytes, 0));
  RETURN_IF_ERROR(bytes_at_least("max_namespaces", options.max_namespaces, 1));
  RETURN_IF_ERROR(bytes_at_least("max_leases", options.max_leases, 1));
  if (options.blob_storage == BlobStorage::kSharedMemory) RETURN_IF_ERROR(ShmSlabAllocator::PrepareProcess());
  std::unique_ptr<DiskTierCache> disk_tier;
  CacheIndexOptions index_options = options;
  if (!disk.directory.empty()) {
    ASSIGN_OR_RETURN(disk_tier, DiskTierCache::Open(disk));
    index_options.spill_evictions = true;
  }
  return std::unique_ptr<CacheStore>(new CacheStore(index_options, clock, std::move(disk_tier)));
}

CacheStore::CacheStore(const CacheIndexOptions& options, const common::Clock& clock,
                       std::unique_ptr<DiskTierCache> disk)
    : options_(options), clock_(clock), index_(options), disk_(std::move(disk)) {}

absl::StatusOr<LookupResult> CacheStore::Lookup(const Hash128& ns, int32_t page_size, absl::Span<const TokenId> tokens,
                                                bool lease) {
  if (static_cast<int64_t>(tokens.size()) > options().max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(tokens.size(), " tokens exceed max_tokens=", options().max_tokens));
  }
  // OR-reduce first (vectorizes); look for the culprit only on failure.
  TokenId any = 0;
  for (TokenId t : tokens) any |= t;
  if (any < 0) {
    for (TokenId t : tokens) {
      if (t < 0) return absl::InvalidArgumentError(absl::StrCat("negative token id ", t));
    }
  }
  if (page_size <= 0) return absl::InvalidArgumentError(absl::StrCat("page_size ", page_size, " <= 0"));
  // Hash the page chain before taking the lock: it is the bulk of the work.
  std::vector<Hash128> keys = PageKeys(ns, tokens, page_size);
  if (disk_ == nullptr) {
    absl::MutexLock lock(&mu_);
    return index_.Lookup(ns, page_size, keys, tokens, lease, clock_.Now());
  }
  // Counted once: here when memory answers, or by the lookup after a promotion.
  absl::StatusOr<LookupResult> memory;
  {
    absl::MutexLock lock(&mu_);
    memory = index_.Lookup(ns, page_size, keys, tokens, lease, clock_.Now(), /*count=*/false);
  }
  if (!memory.ok()) return memory;
  const std::optional<Promotion> plan = PlanPromotion(ns, page_size, keys, tokens, *memory);
  if (!plan.has_value()) {
    absl::MutexLock lock(&mu_);
    index_.CountLookup(*memory);
    return memory;
  }
  if (memory->lease_id != 0) (void)Release(memory->lease_id);
  const auto [pages_in, state_in] = Promote(*plan, ns, page_size, keys, tokens);
  absl::StatusOr<LookupResult> result;
  {
    absl::MutexLock lock(&mu_);
    result = index_.Lookup(ns, page_size, keys, tokens, lease, clock_.Now());
  }
  if (!result.ok()) return result;
  // The pages read back are those below the memory's chain; the answer lists
  // them when its resume point is at or past them.
  const int64_t listed = static_cast<int64_t>(result->pages.size());
  result->pages_from_disk = std::max<int64_t>(
      0, std::min(listed, plan->first_page_depth + pages_in) - std::min(listed, plan->first_page_depth));
  result->state_from_disk = state_in && result->state.has_value() && result->state->key == plan->state_key;
  return result;
}

absl::StatusOr<std::unique_ptr<PutSession>> CacheStore::BeginPut(const PutSpec& spec) {
  absl::StatusOr<Reservation> r;
  std::vector<SpilledEntry> spilled;
  {
    absl::MutexLock lock(&mu_);
    r = index_.Reserve(spec, clock_.Now());
    spilled = index_.TakeSpilled();
  }
  // Queued outside mu_: the disk tier has its own lock.
  if (disk_ != nullptr) disk_->Enqueue(std::move(spilled));
  if (!r.ok()) return r.status();
  if (r->model_cost_registered) LogModelCost(spec);
  return std::unique_ptr<PutSession>(new PutSession(this, *std::move(r), spec.size_bytes));
}

void CacheStore::LogModelCost(const PutSpec& spec) {
  const PrefillCost& c = *spec.model_cost;
  const std::string cost =
      absl::StrCat(c.flops_per_token, " FLOPs per token + ", c.flops_per_token_context, " per context token");
  int64_t held_back = 0;
  if (!model_cost_log_.Allow(cost, &held_back)) return;
  LOG(INFO) << "namespace " << spec.ns.ToHex() << " (tenant \"" << spec.tenant << "\", page_size " << spec.page_size
            << ") registers its model cost: " << cost
            << (options_.eviction == EvictionPolicy::kUtility ? "" : " (unused: --eviction=lru)")
            << common::HeldBack(held_back);
}

absl::StatusOr<ReadHandle> CacheStore::OpenVerified(uint64_t lease_id, const Hash128& key) {
  absl::StatusOr<ReadHandle> h;
  {
    absl::MutexLock lock(&mu_);
    h = index_.Open(lease_id, key, clock_.Now());
  }
  if (!h.ok()) return h.status();
  // The entry is leased, so its bytes stay put while we hash them unlocked.
  RETURN_IF_ERROR(CheckIntact(*h, common::Checksum64(h->blob->data.get(), h->blob->size)));
  return h;
}

absl::Status CacheStore::CheckIntact(const ReadHandle& h, uint64_t actual) {
  if (actual == h.info.checksum) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  index_.RemoveCorrupt(h.info.entry_class, h.info.key);
  return absl::DataLossError(absl::StrCat("entry ", h.info.key.ToHex(), " failed its checksum; removed"));
}

absl::StatusOr<ReadHandle> CacheStore::Open(uint64_t lease_id, const Hash128& key) {
  absl::MutexLock lock(&mu_);
  return index_.Open(lease_id, key, clock_.Now());
}

absl::Status CacheStore::Release(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  return index_.Release(lease_id);
}

std::vector<uint64_t> CacheStore::Expire() {
  absl::MutexLock lock(&mu_);
  return index_.Expire(clock_.Now());
}

IndexStats CacheStore::Stats() const {
  IndexStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats = index_.Stats();
  }
  if (disk_ != nullptr) stats.disk = disk_->Usage();
  return stats;
}

std::optional<PrefillCost> CacheStore::ModelCostOf(const Hash128& ns) const {
  absl::MutexLock lock(&mu_);
  return index_.ModelCostOf(ns);
}

absl::Status CacheStore::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  return index_.CheckInvariants();
}

absl::Status CacheStore::TouchPut(uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  return index_.Touch(reservation_id, clock_.Now());
}

absl::Status CacheStore::CommitPut(uint64_t reservation_id, uint64_t checksum) {
  absl::MutexLock lock(&mu_);
  return index_.Commit(reservation_id, checksum, clock_.Now());
}

void CacheStore::AbortPut(uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  index_.Abort(reservation_id);
}

PutSession::PutSession(CacheStore* store, Reservation reservation, int64_t size_bytes)
    : store_(store), reservation_(std::move(reservation)), size_bytes_(size_bytes) {
  finished_ = reservation_.already_present;
}

PutSession::~PutSession() {
  if (!finished_) store_->AbortPut(reservation_.id);
}

absl::Status PutSession::Write(int64_t offset, absl::string_view data) {
  return WriteWith(offset, static_cast<int64_t>(data.size()),
                   [&data](uint8_t* dst) { std::memcpy(dst, data.data(), data.size()); });
}

absl::Status PutSession::WriteWith(int64_t offset, int64_t size, absl::FunctionRef<void(uint8_t*)> fill) {
  return Append(offset, size, [&fill](uint8_t* dst) {
    fill(dst);
    return absl::OkStatus();
  });
}

absl::Status PutSession::WriteFromFile(int64_t offset, int64_t size, int src_fd, uint64_t src_offset) {
  const Blob& blob = *reservation_.blob;
  return Append(offset, size, [&](uint8_t* dst) -> absl::Status {
    auto ended = [&](int64_t at, ssize_t n) {
      return absl::InvalidArgumentError(absl::StrCat("the source file ended or failed at byte ",
                                                     src_offset + static_cast<uint64_t>(at), ": ",
                                                     n == 0 ? "end of file" : std::strerror(errno)));
    };
    int64_t done = 0;
    if (blob.fresh && blob.shm_write_fd >= 0) {
      off64_t from = static_cast<off64_t>(src_offset);
      off64_t to = static_cast<off64_t>(blob.shm_offset + static_cast<uint64_t>(offset));
      while (done < size) {
        const ssize_t n = copy_file_range(src_fd, &from, blob.shm_write_fd, &to, static_cast<size_t>(size - done), 0);
        if (n < 0 && errno == EINTR) continue;
        // A kernel or file without the file-to-file copy: the rest by pread.
        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) break;
        if (n <= 0) return ended(done, n);
        done += n;
      }
    }
    while (done < size) {
      const ssize_t n = pread(src_fd, dst + done, static_cast<size_t>(size - done),
                              static_cast<off_t>(src_offset + static_cast<uint64_t>(done)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ended(done, n);
      done += n;
    }
    return absl::OkStatus();
  });
}

absl::Status PutSession::Append(int64_t offset, int64_t size, absl::FunctionRef<absl::Status(uint8_t*)> fill) {
  if (finished_) return absl::FailedPreconditionError("put already finished");
  if (offset != written_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", offset, " out of order: expected offset ", written_));
  }
  if (size > size_bytes_ - written_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", size, " bytes at offset ", offset, " overruns the declared size ", size_bytes_));
  }
  // An empty chunk is no progress: it must not keep a stalled put alive.
  if (size == 0) return absl::OkStatus();
  // Refuse bytes for a put that was reclaimed before copying them; the bytes
  // are progress, so the put's deadline moves.
  absl::Status alive = store_->TouchPut(reservation_.id);
  if (!alive.ok()) return alive;
  uint8_t* dst = reservation_.blob->data.get() + written_;
  RETURN_IF_ERROR(fill(dst));
  // Checksum what was stored, not what was received.
  checksum_.Update(dst, static_cast<size_t>(size));
  written_ += size;
  return absl::OkStatus();
}

absl::Status PutSession::Commit(uint64_t checksum) {
  if (finished_) return absl::FailedPreconditionError("put already finished");
  if (written_ != size_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("put ended early: ", written_, " of ", size_bytes_, " bytes arrived"));
  }
  if (checksum_.Digest() != checksum) {
    return absl::DataLossError(
        absl::StrCat("checksum mismatch: received bytes hash to ", checksum_.Digest(), ", commit says ", checksum));
  }
  finished_ = true;
  return store_->CommitPut(reservation_.id, checksum);
}

}  // namespace hybridserve::cachestore
