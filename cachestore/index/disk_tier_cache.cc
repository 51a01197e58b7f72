#include "cachestore/index/disk_tier_cache.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/logging.h"

namespace hybridserve::cachestore {

absl::StatusOr<std::unique_ptr<DiskTierCache>> DiskTierCache::Open(const DiskTierCacheOptions& options) {
  if (options.directory.empty()) return absl::InvalidArgumentError("disk tier directory is empty");
  if (options.budget_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("disk budget_bytes must be > 0, got ", options.budget_bytes));
  }
  if (options.write_queue_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk write_queue_bytes must be >= 0, got ", options.write_queue_bytes));
  }
  if (options.read_parallelism < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk read_parallelism must be >= 1, got ", options.read_parallelism));
  }
  if (options.shutdown_spill_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("shutdown_spill_timeout must be >= 0, got ",
                                                   absl::FormatDuration(options.shutdown_spill_timeout)));
  }
  std::unique_ptr<DiskTierCache> cache(new DiskTierCache(options));
  std::vector<SpillRecord> records;
  std::vector<Hash128> undecodable;
  absl::StatusOr<std::unique_ptr<DiskTier>> tier =
      DiskTier::Open(options.directory, static_cast<uint64_t>(options.budget_bytes),
                     [&](const Hash128& key, absl::string_view metadata) {
                       absl::StatusOr<SpillRecord> r = DecodeSpillRecord(key, metadata);
                       if (r.ok()) {
                         records.push_back(*std::move(r));
                       } else {
                         LOG(WARNING) << "disk tier erases an entry it cannot use: " << r.status().message();
                         undecodable.push_back(key);
                       }
                     });
  if (!tier.ok()) return tier.status();
  cache->tier_ = *std::move(tier);
  for (const Hash128& key : undecodable) cache->tier_->Erase(key);
  {
    absl::MutexLock lock(&cache->mu_);
    for (const SpillRecord& r : records) {
      if (r.entry_class == EntryClass::kState) cache->AddStateLocked(r);
    }
    cache->counters_.read_failures += static_cast<int64_t>(undecodable.size());
  }
  const DiskTierStats stats = cache->tier_->Stats();
  LOG(INFO) << "disk tier " << options.directory << ": " << stats.entries << " entries, " << stats.bytes
            << " bytes of a budget of " << options.budget_bytes << " (" << records.size() << " usable, "
            << stats.corrupt_files + static_cast<int64_t>(undecodable.size()) << " removed as unusable, "
            << stats.evictions << " evicted to fit the budget)";
  DiskTierCache* self = cache.get();
  cache->writer_ = std::thread([self] { self->WriterLoop(); });
  return cache;
}

DiskTierCache::DiskTierCache(const DiskTierCacheOptions& options) : options_(options) {}

DiskTierCache::~DiskTierCache() {
  StopWriter();
  if (writer_.joinable()) writer_.join();
}

uint64_t DiskTierCache::FileBytes(const SpilledEntry& e) {
  // The record's size: the fixed part, the tenant and the tail.
  return kDiskTierHeaderBytes + 100 + e.record.tenant.size() + e.record.tail.size() * sizeof(TokenId) +
         static_cast<uint64_t>(e.record.size_bytes);
}

void DiskTierCache::Enqueue(std::vector<SpilledEntry> entries) {
  if (entries.empty()) return;
  absl::MutexLock lock(&mu_);
  for (SpilledEntry& e : entries) {
    if (pending_.contains(e.record.key) || tier_->Contains(e.record.key)) continue;
    if (stopped_ || queued_bytes_ + e.record.size_bytes > options_.write_queue_bytes) {
      ++counters_.write_drops;
      continue;
    }
    queued_bytes_ += e.record.size_bytes;
    pending_[e.record.key]++;
    queue_.push_back(std::move(e));
  }
}

void DiskTierCache::WriterLoop() {
  while (true) {
    SpilledEntry entry;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DiskTierCache* self)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return self->stopped_ || !self->queue_.empty(); },
          this));
      if (stopped_) return;
      entry = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    Write(entry);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queued_bytes_ -= entry.record.size_bytes;
    if (--pending_[entry.record.key] == 0) pending_.erase(entry.record.key);
  }
}

bool DiskTierCache::Write(const SpilledEntry& e) {
  if (tier_->Contains(e.record.key)) return false;
  const std::string record = EncodeSpillRecord(e.record);
  std::vector<Hash128> evicted;
  const absl::Status status =
      tier_->Put(e.record.key, record,
                 absl::string_view(reinterpret_cast<const char*>(e.blob->data.get()), e.blob->size), &evicted);
  absl::MutexLock lock(&mu_);
  for (const Hash128& key : evicted) ForgetLocked(key);
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    ++counters_.write_drops;
    return false;
  }
  if (!status.ok()) {
    LOG_EVERY_N(WARNING, 100) << "disk tier write failed: " << status;
    ++counters_.write_failures;
    return false;
  }
  ++counters_.writes;
  if (e.record.entry_class == EntryClass::kState) AddStateLocked(e.record);
  return true;
}

void DiskTierCache::AddStateLocked(const SpillRecord& record) {
  auto [it, inserted] =
      states_.try_emplace(record.key, StateLocation{record.parent_or_root(), static_cast<int64_t>(record.tail.size())});
  if (inserted) tail_lengths_[it->second.parent][it->second.tail_length]++;
}

void DiskTierCache::ForgetLocked(const Hash128& key) {
  auto it = states_.find(key);
  if (it == states_.end()) return;
  auto lengths = tail_lengths_.find(it->second.parent);
  if (--lengths->second[it->second.tail_length] == 0) lengths->second.erase(it->second.tail_length);
  if (lengths->second.empty()) tail_lengths_.erase(lengths);
  states_.erase(it);
}

bool DiskTierCache::Contains(const Hash128& key) const { return tier_->Contains(key); }

std::vector<std::pair<int64_t, Hash128>> DiskTierCache::StateCandidates(const Hash128& parent,
                                                                        absl::Span<const TokenId> rest) const {
  std::vector<int64_t> lengths;
  {
    absl::MutexLock lock(&mu_);
    auto it = tail_lengths_.find(parent);
    if (it == tail_lengths_.end()) return {};
    for (const auto& [length, count] : it->second) {
      if (length > static_cast<int64_t>(rest.size())) break;
      lengths.push_back(length);
    }
  }
  // One pass of the hash over the longest tail, a digest at each length.
  std::vector<std::pair<int64_t, Hash128>> out;
  common::ChainHasher hasher(StateParentKey(parent));
  int64_t hashed = 0;
  for (int64_t length : lengths) {
    hasher.Update(rest.data() + hashed, static_cast<size_t>(length - hashed) * sizeof(TokenId));
    hashed = length;
    out.emplace_back(length, hasher.Digest());
  }
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<DiskTierRead> DiskTierCache::Read(const Hash128& key) {
  {
    absl::MutexLock lock(&mu_);
    ++counters_.reads;
  }
  const bool held = tier_->Contains(key);
  absl::StatusOr<DiskTierEntry> entry = tier_->Get(key);
  absl::StatusOr<SpillRecord> record =
      entry.ok() ? DecodeSpillRecord(key, entry->metadata) : absl::StatusOr<SpillRecord>(entry.status());
  if (record.ok() && record->size_bytes != static_cast<int64_t>(entry->payload.size())) {
    record = absl::DataLossError(absl::StrCat("disk tier entry ", key.ToHex(), " holds ", entry->payload.size(),
                                              " bytes, its record says ", record->size_bytes));
  }
  if (!record.ok()) {
    // The entry failed DiskTier's verification (removed there) or ours.
    if (entry.ok()) tier_->Erase(key);
    absl::MutexLock lock(&mu_);
    ForgetLocked(key);
    if (held) ++counters_.read_failures;
    return absl::NotFoundError(record.status().message());
  }
  absl::MutexLock lock(&mu_);
  ++counters_.read_hits;
  return DiskTierRead{*std::move(record), std::move(entry->payload)};
}

std::vector<absl::StatusOr<DiskTierRead>> DiskTierCache::ReadMany(absl::Span<const Hash128> keys) {
  std::vector<absl::StatusOr<DiskTierRead>> out(keys.size(), absl::UnknownError("not read"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < keys.size(); i = next++) out[i] = Read(keys[i]);
  };
  const size_t helpers = std::min<size_t>(keys.size(), static_cast<size_t>(options_.read_parallelism)) - 1;
  std::vector<std::thread> threads;
  threads.reserve(helpers);
  for (size_t t = 0; t < helpers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  return out;
}

void DiskTierCache::EraseBad(const Hash128& key) {
  tier_->Erase(key);
  absl::MutexLock lock(&mu_);
  ForgetLocked(key);
  ++counters_.read_failures;
}

void DiskTierCache::CountPromotion(int64_t entries, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  counters_.promoted_entries += entries;
  counters_.promoted_bytes += bytes;
}

void DiskTierCache::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](DiskTierCache* self)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return self->queue_.empty() && !self->writing_; },
      this));
}

void DiskTierCache::StopWriter() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  stopped_ = true;
  counters_.write_drops += static_cast<int64_t>(queue_.size());
  for (const SpilledEntry& e : queue_) {
    queued_bytes_ -= e.record.size_bytes;
    if (--pending_[e.record.key] == 0) pending_.erase(e.record.key);
  }
  queue_.clear();
  // The write in flight finishes.
  mu_.Await(absl::Condition(
      +[](DiskTierCache* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return !self->writing_; }, this));
}

int64_t DiskTierCache::WriteAll(absl::Span<const SpilledEntry> mru_first, absl::FunctionRef<bool()> out_of_time) {
  StopWriter();
  int64_t written = 0;
  uint64_t considered = 0;
  size_t kept = 0;  // mru_first[0, kept) are on disk now, or were tried
  for (const SpilledEntry& e : mru_first) {
    considered += FileBytes(e);
    if (considered > static_cast<uint64_t>(options_.budget_bytes)) break;
    ++kept;
    if (tier_->Contains(e.record.key)) continue;
    if (out_of_time()) break;
    if (Write(e)) ++written;
  }
  // Written most recent first (so a timeout keeps the hottest), each got a
  // newer recency stamp than the one before: stamp them again, least recent
  // first, so that the disk's LRU order (and a restart's) is the memory's.
  for (size_t i = kept; i-- > 0;) tier_->Touch(mru_first[i].record.key);
  absl::MutexLock lock(&mu_);
  counters_.shutdown_spilled += written;
  return written;
}

DiskTierUsage DiskTierCache::Usage() const {
  const DiskTierStats tier = tier_->Stats();
  absl::MutexLock lock(&mu_);
  DiskTierUsage u = counters_;
  u.enabled = true;
  u.entries = tier.entries;
  u.bytes = tier.bytes;
  u.budget_bytes = options_.budget_bytes;
  u.queued_bytes = queued_bytes_;
  u.evictions = tier.evictions;
  return u;
}

}  // namespace hybridserve::cachestore
