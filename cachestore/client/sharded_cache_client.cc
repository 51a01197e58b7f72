#include "cachestore/client/sharded_cache_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/keys.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {

struct ShardedCacheClient::Shard {
  std::string name;
  std::string target;
  std::shared_ptr<CacheClient> client;
  std::shared_ptr<CacheClient> probe;  // never null
  uint16_t slot = 0;
  std::atomic<bool> up{true};
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> failures{0};
  std::atomic<int64_t> refused{0};
};

// One membership, immutable once published.
struct ShardedCacheClient::Members {
  explicit Members(std::optional<ShardPlacement> p) : placement(std::move(p)) {}
  std::optional<ShardPlacement> placement;  // nullopt: no shard
  absl::flat_hash_map<std::string, std::shared_ptr<Shard>> by_name;
  absl::flat_hash_map<uint16_t, std::shared_ptr<Shard>> by_slot;
};

namespace {

bool IsTransportFailure(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded;
}

absl::Status CheckShards(const std::vector<CacheShard>& shards) {
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].name.empty()) return absl::InvalidArgumentError(absl::StrCat("shards[", i, "]: the name is empty"));
    if (shards[i].client == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("shards[", i, "] (", shards[i].name, "): no client"));
    }
  }
  return absl::OkStatus();
}

// The chain an entry with no parent belongs to; INVALID_ARGUMENT for one with
// a parent (its chain is not in the entry).
absl::StatusOr<Hash128> ChainOfPut(const Hash128& ns_key, const ClientPut& put) {
  if (put.parent.has_value()) {
    return absl::InvalidArgumentError(
        "placement: an entry with a parent needs the namespace's placement (the chain it belongs to) over shards");
  }
  return put.entry_class == EntryClass::kPage ? PageKey(ns_key, put.tokens) : ns_key;
}

void AddClass(const ClassStats& s, ClassStats& sum) {
  sum.entries += s.entries;
  sum.resident_bytes += s.resident_bytes;
  sum.reserved_bytes += s.reserved_bytes;
  sum.metadata_bytes += s.metadata_bytes;
  sum.budget_bytes += s.budget_bytes;
  sum.evicted_lru += s.evicted_lru;
  sum.evicted_ttl += s.evicted_ttl;
  sum.dropped_with_pages += s.dropped_with_pages;
}

void AddStats(const IndexStats& s, IndexStats& sum) {
  AddClass(s.pages, sum.pages);
  AddClass(s.states, sum.states);
  sum.namespaces += s.namespaces;
  sum.namespaces_with_model_cost += s.namespaces_with_model_cost;
  sum.active_leases += s.active_leases;
  sum.active_puts += s.active_puts;
  sum.lookups += s.lookups;
  sum.lookup_hits += s.lookup_hits;
  sum.hits_grid_checkpoint += s.hits_grid_checkpoint;
  sum.hits_exact_prefix += s.hits_exact_prefix;
  sum.checksum_failures += s.checksum_failures;
  sum.expired_leases += s.expired_leases;
  sum.expired_puts += s.expired_puts;
  sum.pinned_states += s.pinned_states;
  sum.pinned_bytes += s.pinned_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedCacheClient>> ShardedCacheClient::Create(
    std::vector<CacheShard> shards, const ShardedCacheClientOptions& options) {
  if (options.probe_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe_interval: ", absl::FormatDuration(options.probe_interval), " is not positive"));
  }
  std::unique_ptr<ShardedCacheClient> client(new ShardedCacheClient(options));
  RETURN_IF_ERROR(client->SetShards(std::move(shards)));
  client->prober_ = std::thread([c = client.get()] { c->ProbeLoop(); });
  return client;
}

ShardedCacheClient::~ShardedCacheClient() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (prober_.joinable()) prober_.join();
}

absl::Status ShardedCacheClient::SetShards(std::vector<CacheShard> shards) {
  RETURN_IF_ERROR(CheckShards(shards));
  std::vector<std::string> names;
  names.reserve(shards.size());
  for (const CacheShard& s : shards) names.push_back(s.name);
  std::optional<ShardPlacement> placement;
  if (!names.empty()) {
    ASSIGN_OR_RETURN(placement, ShardPlacement::Create(std::move(names)));
  }
  auto next = std::make_shared<Members>(std::move(placement));
  absl::MutexLock lock(&mu_);
  for (CacheShard& s : shards) {
    std::shared_ptr<Shard> old;
    if (members_ != nullptr) {
      auto it = members_->by_name.find(s.name);
      if (it != members_->by_name.end()) old = it->second;
    }
    std::shared_ptr<Shard> shard;
    if (old != nullptr && old->target == s.target) {
      shard = old;
    } else {
      uint16_t slot = 0;
      if (auto it = slot_of_name_.find(s.name); it != slot_of_name_.end()) {
        slot = it->second;
      } else {
        if (next_slot_ > 0xffff) {
          return absl::ResourceExhaustedError(
              absl::StrCat("shards: no lease slot left for \"", s.name, "\" (65535 names have had one)"));
        }
        slot = static_cast<uint16_t>(next_slot_++);
        slot_of_name_[s.name] = slot;
      }
      shard = std::make_shared<Shard>();
      shard->name = s.name;
      shard->target = s.target;
      shard->probe = s.probe != nullptr ? std::move(s.probe) : s.client;
      shard->client = std::move(s.client);
      shard->slot = slot;
      if (old != nullptr) {
        shard->calls = old->calls.load();
        shard->failures = old->failures.load();
        shard->refused = old->refused.load();
      }
    }
    next->by_slot[shard->slot] = shard;
    next->by_name[shard->name] = std::move(shard);
  }
  members_ = std::move(next);
  return absl::OkStatus();
}

std::shared_ptr<const ShardedCacheClient::Members> ShardedCacheClient::members() const {
  absl::MutexLock lock(&mu_);
  return members_;
}

absl::StatusOr<std::shared_ptr<ShardedCacheClient::Shard>> ShardedCacheClient::Owner(const Hash128& ns_key,
                                                                                     const Hash128& chain) const {
  const std::shared_ptr<const Members> m = members();
  if (!m->placement.has_value()) return absl::UnavailableError("no cachestore shard is known (yet)");
  for (absl::string_view name : m->placement->Ranked(ns_key, chain)) {
    const std::shared_ptr<Shard>& shard = m->by_name.at(std::string(name));
    if (shard->up.load(std::memory_order_relaxed)) return shard;
  }
  return absl::UnavailableError(absl::StrCat("no cachestore shard is up (all ", m->by_name.size(), " down)"));
}

absl::StatusOr<std::string> ShardedCacheClient::OwnerOf(const Hash128& ns_key, const Hash128& chain) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, Owner(ns_key, chain));
  return shard->name;
}

absl::StatusOr<std::shared_ptr<ShardedCacheClient::Shard>> ShardedCacheClient::ShardOfLease(uint64_t lease_id) const {
  const uint16_t slot = static_cast<uint16_t>(lease_id >> kSlotShift);
  const std::shared_ptr<const Members> m = members();
  auto it = m->by_slot.find(slot);
  if (it == m->by_slot.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, ": its shard slot ", slot, " names no shard"));
  }
  Shard& shard = *it->second;
  if (!shard.up.load(std::memory_order_relaxed)) {
    shard.refused.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError(absl::StrCat("lease ", lease_id, ": cachestore shard ", shard.name, " is down"));
  }
  return it->second;
}

absl::Status ShardedCacheClient::Note(Shard& shard, const absl::Status& status) {
  shard.calls.fetch_add(1, std::memory_order_relaxed);
  if (!IsTransportFailure(status)) return status;
  shard.failures.fetch_add(1, std::memory_order_relaxed);
  if (shard.up.exchange(false)) {
    LOG(WARNING) << "cachestore shard " << shard.name << " (" << shard.target << ") is down (" << status
                 << "): its chains go to the next shard until it answers a probe";
  }
  if (status.code() != absl::StatusCode::kDeadlineExceeded) return status;
  return absl::UnavailableError(absl::StrCat("cachestore shard ", shard.name, " timed out (", status.message(),
                                             "): marked down, its chains go to the next shard"));
}

absl::StatusOr<LookupResult> ShardedCacheClient::Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                                        LookupMode mode) {
  ASSIGN_OR_RETURN(const Hash128 ns_key, NamespaceOf(ns));
  ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, Owner(ns_key, ChainKeyOf(ns, tokens)));
  absl::StatusOr<LookupResult> result = shard->client->Lookup(ns, tokens, mode);
  if (!result.ok()) return Note(*shard, result.status());
  (void)Note(*shard, absl::OkStatus());
  if (result->lease_id == 0) return result;
  if (result->lease_id > kShardLeaseMask) {
    (void)shard->client->Release(result->lease_id);
    return absl::InternalError(absl::StrCat("cachestore shard ", shard->name, " gave lease id ", result->lease_id,
                                            ", wider than the 48 bits a sharded lease id leaves it"));
  }
  result->lease_id |= uint64_t{shard->slot} << kSlotShift;
  return result;
}

absl::StatusOr<PutResult> ShardedCacheClient::Put(const ClientNamespace& ns, const ClientPut& put,
                                                  absl::string_view bytes) {
  ASSIGN_OR_RETURN(const Hash128 ns_key, NamespaceOf(ns));
  Hash128 chain;
  if (ns.placement.has_value()) {
    chain = *ns.placement;
  } else {
    ASSIGN_OR_RETURN(chain, ChainOfPut(ns_key, put));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, Owner(ns_key, chain));
  absl::StatusOr<PutResult> result = shard->client->Put(ns, put, bytes);
  if (!result.ok()) return Note(*shard, result.status());
  (void)Note(*shard, absl::OkStatus());
  return result;
}

std::vector<absl::StatusOr<PutResult>> ShardedCacheClient::PutMany(const ClientNamespace& ns,
                                                                   absl::Span<const PutManyEntry> entries) {
  if (entries.empty()) return {};
  auto all = [&](const absl::Status& s) { return std::vector<absl::StatusOr<PutResult>>(entries.size(), s); };
  absl::StatusOr<Hash128> ns_key = NamespaceOf(ns);
  if (!ns_key.ok()) return all(ns_key.status());
  std::optional<Hash128> chain = ns.placement;
  if (!chain.has_value()) {
    for (const PutManyEntry& e : entries) {
      if (chain.has_value() && e.put->parent.has_value()) continue;  // hangs from an entry before it
      absl::StatusOr<Hash128> own = ChainOfPut(*ns_key, *e.put);
      if (!own.ok()) return all(own.status());
      if (chain.has_value() && *own != *chain) {
        return all(absl::InvalidArgumentError(
            "placement: the entries without a parent belong to different chains (give the namespace's placement, "
            "or one PutMany per chain)"));
      }
      chain = *own;
    }
  }
  absl::StatusOr<std::shared_ptr<Shard>> shard = Owner(*ns_key, *chain);
  if (!shard.ok()) return all(shard.status());
  std::vector<absl::StatusOr<PutResult>> results = (*shard)->client->PutMany(ns, entries);
  absl::Status call;
  for (const absl::StatusOr<PutResult>& r : results) {
    if (IsTransportFailure(r.status())) {
      call = r.status();
      break;
    }
  }
  const absl::Status answered = Note(**shard, call);
  if (answered.code() != call.code()) {  // the call timed out: answered as UNAVAILABLE (Note)
    for (absl::StatusOr<PutResult>& r : results) {
      if (r.status().code() == absl::StatusCode::kDeadlineExceeded) r = answered;
    }
  }
  return results;
}

absl::Status ShardedCacheClient::GetInto(uint64_t lease_id, const Hash128& key, std::string* out) {
  ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, ShardOfLease(lease_id));
  absl::Status s = shard->client->GetInto(lease_id & kShardLeaseMask, key, out);
  return Note(*shard, s);
}

absl::Status ShardedCacheClient::GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys,
                                             absl::Span<std::string> out) {
  ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, ShardOfLease(lease_id));
  absl::Status s = shard->client->GetManyInto(lease_id & kShardLeaseMask, keys, out);
  return Note(*shard, s);
}

absl::Status ShardedCacheClient::GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                                  absl::Span<const EntrySegments> out) {
  ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, ShardOfLease(lease_id));
  absl::Status s = shard->client->GetManyScattered(lease_id & kShardLeaseMask, keys, out);
  return Note(*shard, s);
}

absl::Status ShardedCacheClient::Release(uint64_t lease_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, ShardOfLease(lease_id));
  absl::Status s = shard->client->Release(lease_id & kShardLeaseMask);
  return Note(*shard, s);
}

absl::StatusOr<IndexStats> ShardedCacheClient::Stats() {
  const std::shared_ptr<const Members> m = members();
  if (!m->placement.has_value()) return absl::UnavailableError("no cachestore shard is known (yet)");
  IndexStats sum;
  for (const std::string& name : m->placement->shards()) {
    Shard& shard = *m->by_name.at(name);
    if (!shard.up.load(std::memory_order_relaxed)) {
      shard.refused.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(absl::StrCat("cachestore shard ", name, " is down"));
    }
    absl::StatusOr<IndexStats> s = shard.client->Stats();
    (void)Note(shard, s.status());
    if (!s.ok())
      return absl::Status(s.status().code(), absl::StrCat("cachestore shard ", name, ": ", s.status().message()));
    AddStats(*s, sum);
  }
  return sum;
}

std::vector<ShardCounts> ShardedCacheClient::counts() const {
  const std::shared_ptr<const Members> m = members();
  std::vector<ShardCounts> out;
  if (!m->placement.has_value()) return out;
  for (const std::string& name : m->placement->shards()) {
    const Shard& shard = *m->by_name.at(name);
    ShardCounts c;
    c.name = shard.name;
    c.target = shard.target;
    c.up = shard.up.load(std::memory_order_relaxed);
    c.calls = shard.calls.load(std::memory_order_relaxed);
    c.failures = shard.failures.load(std::memory_order_relaxed);
    c.refused = shard.refused.load(std::memory_order_relaxed);
    out.push_back(std::move(c));
  }
  return out;
}

void ShardedCacheClient::ProbeLoop() {
  while (true) {
    std::shared_ptr<const Members> m;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.probe_interval);
      if (stopping_) return;
      m = members_;
    }
    for (const auto& [name, shard] : m->by_name) {
      if (shard->up.load(std::memory_order_relaxed)) continue;
      if (absl::StatusOr<IndexStats> s = shard->probe->Stats(); s.ok()) {
        shard->up.store(true);
        LOG(INFO) << "cachestore shard " << name << " (" << shard->target << ") answers again: its chains return to it";
      }
    }
  }
}

}  // namespace hybridserve::cachestore
