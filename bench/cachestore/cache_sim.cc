#include "bench/cachestore/cache_sim.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "bench/cachestore/simulated_disk.h"
#include "cachestore/client/shard_placement.h"
#include "cachestore/index/spill_record.h"
#include "cachestore/keys.h"
#include "common/logging.h"

namespace hybridserve::bench {
namespace {

using cachestore::CacheIndex;
using cachestore::EntryClass;
using cachestore::Hash128;
using cachestore::PutSpec;
using cachestore::ShardPlacement;
using cachestore::SpilledEntry;
using cachestore::StateKind;

class Publisher {
 public:
  Publisher(const ModelCost& model, const Hash128& ns, bool log_routing, CacheSimResult& result)
      : model_(model), ns_(ns), log_routing_(log_routing), result_(result) {}

  // Where the next puts go: shard `shard`'s index, for the turn at `turn`.
  void Route(CacheIndex* index, int shard, int64_t turn, bool turn_end) {
    index_ = index;
    shard_ = shard;
    turn_ = turn;
    turn_end_ = turn_end;
  }

  // With `promoting`, the next puts are a disk tier's promotions: counted in
  // CacheSimDisk, not as writes or put failures.
  void SetPromoting(bool promoting) { promoting_ = promoting; }

  // With a disk tier (CacheIndexOptions::spill_evictions): after every
  // reserve, what it evicted, for shard `shard`'s disk.
  void SpillTo(std::function<void(int shard, std::vector<SpilledEntry> entries)> spill) { spill_ = std::move(spill); }

  // Pages [first, last) of `tokens`, in order, up to the first that fails (the
  // pages after it would have no parent).
  void Pages(const std::vector<TokenId>& tokens, const std::vector<Hash128>& keys, int64_t first, int64_t last,
             absl::Time now) {
    const int64_t ps = model_.page_size();
    for (int64_t i = first; i < last; ++i) {
      PutSpec spec = Spec(EntryClass::kPage, keys, i);
      spec.tokens.assign(tokens.begin() + i * ps, tokens.begin() + (i + 1) * ps);
      spec.size_bytes = model_.page_bytes();
      if (!Put(spec, now, &result_.page_bytes_written, &result_.pages_written)) return;
    }
  }

  void State(const std::vector<TokenId>& tokens, const std::vector<Hash128>& keys, int64_t position, StateKind kind,
             absl::Time now) {
    const int64_t ps = model_.page_size();
    const int64_t n = position / ps;
    PutSpec spec = Spec(EntryClass::kState, keys, n);
    spec.tokens.assign(tokens.begin() + n * ps, tokens.begin() + position);
    spec.state_kind = kind;
    spec.position = position;
    spec.size_bytes = model_.StateBytes(position, /*with_logits=*/kind == StateKind::kExactPrefix);
    Put(spec, now, &result_.state_bytes_written, &result_.states_written);
  }

 private:
  // The entry below page `below` (its parent is page below - 1, or the root).
  PutSpec Spec(EntryClass c, const std::vector<Hash128>& keys, int64_t below) const {
    PutSpec spec;
    spec.ns = ns_;
    spec.page_size = model_.page_size();
    spec.entry_class = c;
    if (below > 0) spec.parent = keys[below - 1];
    return spec;
  }

  bool Put(const PutSpec& spec, absl::Time now, int64_t* bytes, int64_t* entries) {
    int64_t& failures = promoting_ ? result_.disk.promotion_failures : result_.put_failures;
    Log(CacheSimCall::Kind::kReserve);
    absl::StatusOr<cachestore::Reservation> r = index_->Reserve(spec, now);
    if (spill_) spill_(shard_, index_->TakeSpilled());  // a refused reserve may have evicted too
    if (!r.ok()) {
      ++failures;
      return false;
    }
    if (r->already_present) return true;
    Log(CacheSimCall::Kind::kCommit);
    if (!index_->Commit(r->id, /*checksum=*/0, now).ok()) {
      ++failures;
      return false;
    }
    if (promoting_) return true;
    *bytes += spec.size_bytes;
    ++*entries;
    return true;
  }

  void Log(CacheSimCall::Kind kind) {
    if (log_routing_) result_.routing.push_back(CacheSimCall{turn_, shard_, kind, turn_end_});
  }

  CacheIndex* index_ = nullptr;
  bool promoting_ = false;
  std::function<void(int, std::vector<SpilledEntry>)> spill_;  // empty without a disk tier
  int shard_ = 0;
  int64_t turn_ = 0;
  bool turn_end_ = false;
  const ModelCost& model_;
  const Hash128 ns_;
  const bool log_routing_;
  CacheSimResult& result_;
};

// The deepest resume point on `disk` past `memory_hit` for a prompt of
// `tokens` (page keys `keys`) whose pages are in memory through
// `kv_match_tokens`: the state key and position, or nullopt. A state at
// node d needs pages [0, d) in memory or on disk.
std::optional<std::pair<Hash128, int64_t>> DeeperOnDisk(const SimulatedDisk& disk, const Hash128& ns,
                                                        absl::Span<const TokenId> tokens,
                                                        const std::vector<Hash128>& keys, int64_t page_size,
                                                        int64_t kv_match_tokens, int64_t memory_hit) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  int64_t depth = kv_match_tokens / page_size;
  while (depth < static_cast<int64_t>(keys.size()) && disk.Find(keys[depth]) != nullptr) ++depth;
  // Deepest node first, then the longest tail, as CacheIndex::Lookup; a
  // node's states lie in [d * page_size, (d + 1) * page_size).
  for (int64_t d = depth; d >= 0 && (d + 1) * page_size - 1 > memory_hit; --d) {
    const Hash128& node = d == 0 ? ns : keys[d - 1];
    const std::map<int64_t, int>* lengths = disk.TailLengths(node);
    if (lengths == nullptr) continue;
    for (auto it = lengths->rbegin(); it != lengths->rend(); ++it) {
      const int64_t q = d * page_size + it->first;
      if (q > n || q <= memory_hit) continue;
      const Hash128 key = cachestore::StateKey(node, tokens.subspan(d * page_size, it->first));
      const SimulatedDisk::File* f = disk.Find(key);
      if (f != nullptr && f->entry_class == EntryClass::kState) return std::make_pair(key, q);
    }
  }
  return std::nullopt;
}

void AddClass(const cachestore::ClassStats& a, cachestore::ClassStats* sum) {
  sum->entries += a.entries;
  sum->resident_bytes += a.resident_bytes;
  sum->reserved_bytes += a.reserved_bytes;
  sum->metadata_bytes += a.metadata_bytes;
  sum->budget_bytes += a.budget_bytes;
  sum->evicted_lru += a.evicted_lru;
  sum->evicted_ttl += a.evicted_ttl;
  sum->dropped_with_pages += a.dropped_with_pages;
}

// The branch-point state's position, 0 when none: past the hit, short of the
// prompt end (which has its own state).
int64_t BranchPoint(CacheSimOptions::BranchPoints rule, const ModelCost& model, int64_t kv_match, int64_t hit,
                    int64_t n) {
  int64_t b = 0;
  switch (rule) {
    case CacheSimOptions::BranchPoints::kOff:
      return 0;
    case CacheSimOptions::BranchPoints::kGrid:
      b = kv_match / model.checkpoint_interval() * model.checkpoint_interval();
      break;
    case CacheSimOptions::BranchPoints::kExact:
      b = kv_match;
      break;
  }
  return b > hit && b <= n ? b : 0;
}

}  // namespace

absl::StatusOr<CacheSimResult> RunCacheSim(const Trace& trace, const ModelCost& model, const CacheSimOptions& options) {
  if (options.tokens.units_per_token <= 0 || options.tokens.vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("token rule: units_per_token ", options.tokens.units_per_token,
                                                   ", vocab ", options.tokens.vocab, " must be > 0"));
  }
  if (options.shards < 1) return absl::InvalidArgumentError(absl::StrCat("shards ", options.shards, " must be >= 1"));
  if (options.disk_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("disk_budget_bytes ", options.disk_budget_bytes, " must be >= 0"));
  }
  const int32_t ps = model.page_size();
  CacheSimResult result;
  // With a disk tier: each shard's disk.
  std::vector<std::unique_ptr<SimulatedDisk>> disks;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<CacheIndex>> indexes;
  for (int i = 0; i < options.shards; ++i) {
    names.push_back(absl::StrCat("shard-", i));
    if (options.disk_budget_bytes == 0) {
      indexes.push_back(std::make_unique<CacheIndex>(options.index));
      continue;
    }
    disks.push_back(std::make_unique<SimulatedDisk>(options.disk_budget_bytes, ps, result.disk));
    cachestore::CacheIndexOptions index_options = options.index;
    index_options.spill_evictions = true;
    indexes.push_back(std::make_unique<CacheIndex>(index_options));
  }
  absl::StatusOr<ShardPlacement> placement = ShardPlacement::Create(names);
  if (!placement.ok()) return placement.status();
  absl::flat_hash_map<std::string, int> shard_of_name;
  for (int i = 0; i < options.shards; ++i) shard_of_name[names[i]] = i;
  const Hash128 ns = cachestore::NamespaceKey("cache_sim", "", "tenant", "", ps);
  result.shards.resize(options.shards);
  for (int i = 0; i < options.shards; ++i) result.shards[i].name = names[i];
  Publisher publisher(model, ns, options.log_routing, result);
  if (!disks.empty()) {
    publisher.SpillTo([&disks, ps](int shard, std::vector<SpilledEntry> entries) {
      for (const SpilledEntry& e : entries) {
        const cachestore::SpillRecord& r = e.record;
        SimulatedDisk::File file;
        file.entry_class = r.entry_class;
        file.position = r.position;
        file.state_kind = r.state_kind;
        int64_t tokens = ps;
        if (r.entry_class == EntryClass::kState) {
          file.node = r.parent.value_or(r.ns);  // the page it hangs from, or the root
          tokens = r.position % ps;
        }
        file.bytes = r.size_bytes + kSimDiskFileOverheadBytes + 4 * tokens;
        disks[shard]->Spill(r.key, file);
      }
    });
  }
  absl::flat_hash_map<int64_t, int64_t> shared_tokens;  // each conversation's shared prefix, in tokens
  // The shard that owns a chain of conversation `conv` with page keys `keys`.
  const auto owner = [&](int64_t conv, const std::vector<Hash128>& keys) {
    if (options.shards == 1) return 0;
    Hash128 chain_key = ShardPlacement::ChainKey(ns, keys);
    if (options.placement == CacheSimOptions::Placement::kFirstOwnPage) {
      const auto it = shared_tokens.find(conv);
      const size_t own = it == shared_tokens.end() ? 0 : static_cast<size_t>(it->second / ps);
      if (own < keys.size()) chain_key = keys[own];
    }
    return shard_of_name.at(placement->Owner(ns, chain_key));
  };
  // Each conversation's context: every token so far (its last prompt and reply).
  absl::flat_hash_map<int64_t, std::vector<TokenId>> context;
  const absl::Time start = absl::UnixEpoch();
  absl::flat_hash_map<int64_t, int64_t> last_turn;
  for (const TraceTurn& turn : trace.turns) last_turn[turn.conv] = std::max(last_turn[turn.conv], turn.turn);

  for (const TraceTurn& turn : trace.turns) {
    const absl::Time now = start + absl::Seconds(turn.arrival_s);
    std::vector<TokenId>& tokens = context[turn.conv];
    if (turn.turn == 0 && turn.shared >= 0) {
      options.tokens.Append(turn.shared, 0, /*segment=*/0, turn.shared_units, &tokens);
      shared_tokens[turn.conv] = static_cast<int64_t>(tokens.size());
    }
    options.tokens.Append(turn.conv, turn.turn, /*segment=*/1, turn.user_units, &tokens);
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) continue;  // nothing to look up or prefill

    // 1. The lookup, on the shard that owns the prompt's chain.
    const std::vector<Hash128> prompt_keys = cachestore::PageKeys(ns, tokens, ps);
    const int shard = owner(turn.conv, prompt_keys);
    CacheIndex& index = *indexes[shard];
    const int64_t turn_index = result.turns;
    publisher.Route(&index, shard, turn_index, /*turn_end=*/false);
    if (options.log_routing) result.routing.push_back(CacheSimCall{turn_index, shard, CacheSimCall::Kind::kLookup});
    absl::StatusOr<cachestore::LookupResult> hit = index.Lookup(ns, ps, prompt_keys, tokens, /*lease=*/false, now);
    if (!hit.ok()) return absl::InternalError(absl::StrCat("lookup: ", hit.status().message()));
    int64_t p = std::min(hit->resume_position, n);
    const int64_t memory_hit = p;
    if (!disks.empty()) {
      // The disk tier: promote a deeper resume point, then look up again.
      SimulatedDisk& disk = *disks[shard];
      const int64_t kv_pages = hit->kv_match_tokens / ps;
      if (const auto deeper = DeeperOnDisk(disk, ns, tokens, prompt_keys, ps, hit->kv_match_tokens, p)) {
        const auto& [state_key, q] = *deeper;
        for (int64_t i = kv_pages; i < q / ps; ++i) disk.Read(prompt_keys[i]);
        const SimulatedDisk::File state = disk.Read(state_key);
        publisher.SetPromoting(true);
        publisher.Pages(tokens, prompt_keys, kv_pages, q / ps, now);
        publisher.State(tokens, prompt_keys, q, state.state_kind, now);
        publisher.SetPromoting(false);
        if (options.log_routing) {
          result.routing.push_back(CacheSimCall{turn_index, shard, CacheSimCall::Kind::kLookup});
        }
        hit = index.Lookup(ns, ps, prompt_keys, tokens, /*lease=*/false, now);
        if (!hit.ok()) return absl::InternalError(absl::StrCat("lookup: ", hit.status().message()));
        p = std::min(hit->resume_position, n);
        if (p > memory_hit) {
          ++result.disk.hits;
          result.disk.hit_tokens += p - memory_hit;
          result.disk.saved_flops += model.PrefixFlops(p) - model.PrefixFlops(memory_hit);
        }
      }
    }
    ++result.turns;
    result.prompt_tokens += n;
    result.hit_tokens += p;
    result.hits.push_back(p);
    result.memory_hits.push_back(memory_hit);
    result.turn_shard.push_back(shard);
    result.prompt_flops += model.PrefixFlops(n);
    result.saved_flops += model.PrefixFlops(p);
    CacheSimShard& share = result.shards[shard];
    ++share.turns;
    share.prompt_tokens += n;
    share.hit_tokens += p;
    share.saved_flops += model.PrefixFlops(p);

    if (options.oracle_skip_last_turn && turn.turn == last_turn[turn.conv]) continue;

    // 2. Prefill's publication.
    publisher.Pages(tokens, prompt_keys, std::min(hit->kv_match_tokens, p) / ps, n / ps, now);
    const int64_t interval =
        options.checkpoint_interval == 0 ? model.checkpoint_interval() : options.checkpoint_interval;
    for (int64_t q = (p / interval + 1) * interval; interval > 0 && q <= n; q += interval) {
      publisher.State(tokens, prompt_keys, q, StateKind::kGridCheckpoint, now);
    }
    if (const int64_t b = BranchPoint(options.branch_points, model, hit->kv_match_tokens, p, n);
        b > 0 && (interval <= 0 || b % interval != 0)) {
      publisher.State(tokens, prompt_keys, b, StateKind::kGridCheckpoint, now);
    }
    publisher.State(tokens, prompt_keys, n, StateKind::kExactPrefix, now);

    // 3. Decode's publication of the turn end.
    const int64_t prompt_pages = n / ps;
    options.tokens.Append(turn.conv, turn.turn, /*segment=*/2, turn.reply_units, &tokens);
    const int64_t m = static_cast<int64_t>(tokens.size()) - 1;  // the last reply token is not fed
    if (m < n) continue;                                        // no reply
    const std::vector<Hash128> fed_keys =
        cachestore::PageKeys(ns, absl::MakeConstSpan(tokens).subspan(0, static_cast<size_t>(m)), ps);
    // Decode places its puts by the fed tokens' chain: the prompt's shard,
    // unless the prompt had no full page (no first page key) and the reply
    // completes one. That shard has none of the chain, so decode publishes
    // it from page 0.
    const int turn_end_shard = owner(turn.conv, fed_keys);
    publisher.Route(indexes[turn_end_shard].get(), turn_end_shard, turn_index, /*turn_end=*/true);
    publisher.Pages(tokens, fed_keys, turn_end_shard == shard ? prompt_pages : 0, m / ps, now);
    publisher.State(tokens, fed_keys, m, StateKind::kExactPrefix, now);
  }
  for (int i = 0; i < options.shards; ++i) result.shards[i].end = indexes[i]->Stats();
  result.end = result.shards[0].end;
  for (int i = 1; i < options.shards; ++i) {
    const cachestore::IndexStats& s = result.shards[i].end;
    AddClass(s.pages, &result.end.pages);
    AddClass(s.states, &result.end.states);
    result.end.lookups += s.lookups;
    result.end.lookup_hits += s.lookup_hits;
  }
  result.disk.budget_bytes = options.disk_budget_bytes * static_cast<int64_t>(disks.size());
  for (const auto& disk : disks) {
    result.disk.files += disk->files();
    result.disk.bytes += disk->bytes();
  }
  return result;
}

absl::StatusOr<std::vector<ReuseInterval>> ReuseIntervals(const Trace& trace, const ModelCost& model,
                                                          const TokenRule& tokens, int64_t entry_overhead_bytes) {
  struct Open {
    double arrival_s = 0;
    int64_t context = 0;  // tokens so far: prompt and reply
    int64_t fed = -1;     // m, when the last turn had a reply
  };
  absl::flat_hash_map<int64_t, Open> open;
  std::vector<ReuseInterval> out;
  const int64_t ps = model.page_size();
  for (const TraceTurn& turn : trace.turns) {
    if (turn.shared >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("conversation ", turn.conv, " shares prefix ", turn.shared,
                                                     ": shared prefixes are not modelled"));
    }
    Open& o = open[turn.conv];
    if (o.fed > 0) {
      ReuseInterval r;
      r.conv = turn.conv;
      r.turn = turn.turn;
      r.start_s = o.arrival_s;
      r.end_s = turn.arrival_s;
      r.tokens = o.fed;
      r.page_charge = (o.fed / ps) * (model.page_bytes() + entry_overhead_bytes);
      r.state_charge = model.StateBytes(o.fed, /*with_logits=*/true) + entry_overhead_bytes +
                       (o.fed % ps) * static_cast<int64_t>(sizeof(TokenId));
      r.flops = model.PrefixFlops(o.fed);
      out.push_back(r);
    }
    o.arrival_s = turn.arrival_s;
    o.context += tokens.Tokens(turn.user_units);
    const int64_t n = o.context;
    const int64_t reply = tokens.Tokens(turn.reply_units);
    o.context += reply;
    // Without a reply the prompt-end state at n is the deepest resume point.
    o.fed = reply > 0 ? o.context - 1 : n;
  }
  return out;
}

}  // namespace hybridserve::bench
