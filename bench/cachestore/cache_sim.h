#ifndef HYBRIDSERVE_BENCH_CACHESTORE_CACHE_SIM_H_
#define HYBRIDSERVE_BENCH_CACHESTORE_CACHE_SIM_H_

// A trace-driven simulator over the real cachestore::CacheIndex: no engine,
// no sockets, one thread. Each turn of the trace, at its arrival time:
//
//   1. Lookup of the prompt, as prefill does: the hit is the resume point
//      (the deepest state at p with pages covering [0, p)).
//   2. What prefill publishes (prefill/prefill_worker.cc, Prepare): the
//      prompt's full pages from min(kv_match, hit) / page_size on, the grid
//      checkpoints at every multiple q of the checkpoint interval with
//      hit < q <= n (no logits), and the prompt-end state at n (logits).
//   3. What decode publishes at the turn end (decode/decode_loop.cc,
//      Prepare): the fed tokens are the prompt and every reply token but the
//      last (m = n + reply - 1), so the pages [n / page_size, m / page_size)
//      and the turn-end state at m (logits).
//
// Puts go in that order, one Reserve + Commit each. Like the publisher, a
// failed page put drops the rest of that chain (no parent) and the states are
// still tried. Every conversation is in one namespace (one tenant, one salt),
// so conversations share what they have in common (a system prompt).
//
// Shards (issue 49): with `shards` = N > 1 the simulator runs N independent
// CacheIndex instances named "shard-0" .. "shard-{N-1}", each with the
// budgets of `index` (per-shard budgets: N shards of B hold N * B in all),
// and sends each turn's lookup and every put of that turn to the one shard a
// worker would (cachestore/client/shard_placement.h): by default
// ShardPlacement::Owner(ns, ChainKey(ns, page keys)). Prefill's lookup and
// puts are placed by the prompt's page keys, decode's turn-end puts by the fed
// tokens' (prompt and reply): the same shard unless the prompt had no full
// page and the reply completes one, and then decode publishes the chain from
// page 0 there (the prompt-end state stays on the (ns, ns) shard, where no
// later turn looks). N = 1 runs one index and gives the same results as
// before shards existed.
//
// Eviction is whatever the index does: CacheIndexOptions::eviction (LRU, or
// utility with its cost model and blend), named in `policy` for the output. Not thread-safe (RunCacheSim is a pure
// function of its inputs).
//
// The disk tier (issue 49): with `disk_budget_bytes` > 0 each shard also has
// a simulated disk, what cachestore/index/disk_tier.h keeps, without the
// bytes: one file per entry (its bytes, kSimDiskFileOverheadBytes and 4 bytes
// per token it carries: a page's tokens, a state's tail), LRU over spills and
// reads under that byte budget (an entry larger than the budget is not
// written). Every committed entry the shard's index evicts, and every state
// dropped with an evicted page (CacheIndexOptions::spill_evictions, drained after every reserve), is spilled
// there unless already present (a spill rewrites nothing and is not a use).
// A lookup that finds a deeper resume point on disk than in memory, a state
// at position q > p (the memory hit) whose node is at most the depth that
// the prompt's pages reach in memory and then on disk, with the deepest such
// q taken as the index takes it, reads the pages past the memory match and
// the state (each read a use), puts them into memory (Reserve + Commit, as
// any put: they may evict, and so spill), and looks up again: that lookup's
// resume point is the turn's hit. The turn's hit tokens and FLOPs saved are
// split by tier: memory p, disk what the disk added (the hit less p). With
// no disk budget nothing of this runs and the results are as before.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/cachestore/model_cost.h"
#include "bench/cachestore/simulated_disk.h"
#include "bench/cachestore/trace.h"
#include "cachestore/index/cache_index.h"

namespace hybridserve::bench {

struct CacheSimOptions {
  // Budgets (page_budget_bytes, state_budget_bytes) and the eviction settings.
  cachestore::CacheIndexOptions index;
  std::string policy = "lru";  // a label for the output
  TokenRule tokens;
  // Admission: prefill's grid checkpoint spacing; 0: the model's
  // (ModelCost::checkpoint_interval), -1: none (prompt-end and turn-end
  // states only).
  int64_t checkpoint_interval = 0;
  // Admission: the branch-point rule. When the lookup finds pages deeper than
  // its resume point (kv_match > hit: the prompt leaves a cached path there),
  // prefill also publishes a state at the branch: kGrid puts the engine grid
  // checkpoint at or below kv_match (ModelCost::checkpoint_interval: prefill
  // emits it anyway, so every contract holds), kExact one at kv_match itself.
  enum class BranchPoints { kOff, kGrid, kExact };
  BranchPoints branch_points = BranchPoints::kOff;
  // An oracle, for comparison only: nothing of a conversation's last turn is
  // published (no later turn can use it), as no online policy can know.
  bool oracle_skip_last_turn = false;
  // Shards, each with `index`'s budgets; >= 1.
  int shards = 1;
  // Which key places a turn on a shard. kFirstPage is what the client does
  // (ShardPlacement::ChainKey: the first page key). kFirstOwnPage is for
  // comparison only, NOT what any client does: the key of the first page that
  // holds the conversation's own tokens (past a shared system prompt, whose
  // length the simulator knows from the trace; a client would need a probing
  // lookup to find it); ChainKey when the prompt has no full page of its own
  // yet. Without a shared prefix both are the first page. Conversations sharing a
  // system prompt then spread over the shards, each shard keeping its own
  // copy of the prompt's pages.
  enum class Placement { kFirstPage, kFirstOwnPage };
  Placement placement = Placement::kFirstPage;
  // Records every index call's shard in CacheSimResult::routing (for tests).
  bool log_routing = false;
  // Each shard's simulated disk tier, in bytes of entry files; 0: none.
  int64_t disk_budget_bytes = 0;
};

// What a simulated disk file costs beside the entry's bytes and its tokens
// (4 bytes each): DiskTier's 64-byte header and a 64-byte record of the
// entry's fields (kind, parent, position, checksum, lengths).
inline constexpr int64_t kSimDiskFileOverheadBytes = 128;

// One shard's share of a run.
struct CacheSimShard {
  std::string name;   // "shard-<i>"
  int64_t turns = 0;  // lookups sent here
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;
  double saved_flops = 0;
  cachestore::IndexStats end;  // this shard's index at the end
  int64_t page_charge() const { return end.pages.resident_bytes + end.pages.metadata_bytes; }
  int64_t state_charge() const { return end.states.resident_bytes + end.states.metadata_bytes; }
};

// One index call of a run: the turn (its position in CacheSimResult::hits),
// the shard whose index was called, which call, and whether a put was
// decode's (the turn end) or prefill's.
struct CacheSimCall {
  enum class Kind { kLookup, kReserve, kCommit };
  int64_t turn = 0;
  int shard = 0;
  Kind kind = Kind::kLookup;
  bool turn_end = false;  // decode's publication of the turn end
};

struct CacheSimResult {
  int64_t turns = 0;
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;     // sum of resume positions
  std::vector<int64_t> hits;  // each turn's resume position, in trace order
  // Each turn's memory hit (before the disk tier; the same as `hits` without
  // one), in trace order.
  std::vector<int64_t> memory_hits;
  double prompt_flops = 0;
  double saved_flops = 0;          // the FLOPs of the hit prefixes
  int64_t page_bytes_written = 0;  // bytes of the entries created (not already present)
  int64_t state_bytes_written = 0;
  int64_t pages_written = 0;
  int64_t states_written = 0;
  int64_t put_failures = 0;  // refused puts (RESOURCE_EXHAUSTED, a parent evicted)
  // The index at the end: resident bytes, evictions. With shards, the sums
  // over the shards of the ClassStats fields (pages and states) and of
  // lookups and lookup_hits; the other fields are shard 0's.
  cachestore::IndexStats end;
  std::vector<CacheSimShard> shards;  // one per shard, by index
  std::vector<int> turn_shard;        // each turn's shard, in trace order
  std::vector<CacheSimCall> routing;  // with log_routing: every index call, in order
  CacheSimDisk disk;                  // zeros without a disk tier

  // The memory tier's share: hits less what the disk added.
  int64_t memory_hit_tokens() const { return hit_tokens - disk.hit_tokens; }
  double memory_saved_flops() const { return saved_flops - disk.saved_flops; }

  double hit_rate() const { return prompt_tokens > 0 ? static_cast<double>(hit_tokens) / prompt_tokens : 0; }
  // Bytes the cache holds at the end, index memory included: the working set
  // when the budgets are unlimited.
  int64_t page_charge() const { return end.pages.resident_bytes + end.pages.metadata_bytes; }
  int64_t state_charge() const { return end.states.resident_bytes + end.states.metadata_bytes; }
  int64_t evictions() const {
    return end.pages.evicted_lru + end.states.evicted_lru + end.pages.dropped_with_pages +
           end.states.dropped_with_pages;
  }
};

// INVALID_ARGUMENT when the trace and the model disagree (a token rule with
// units_per_token <= 0 or a vocabulary <= 0), shards < 1 or disk_budget_bytes < 0;
// INTERNAL when the index refuses a lookup.
absl::StatusOr<CacheSimResult> RunCacheSim(const Trace& trace, const ModelCost& model, const CacheSimOptions& options);

// What keeping one conversation's turn end until its next turn is worth, for
// an offline bound on every policy (oracle_bound.py). Turn k of a
// conversation ends at m fed tokens (its prompt and reply but the last reply
// token, as decode publishes it); turn k + 1 can resume at m only if the m / page_size pages and the
// turn-end state stay resident from turn k's arrival to turn k + 1's (nothing
// else writes them: token ids are the conversation's own), and then it saves
// PrefixFlops(m). Keeping a prefix instead saves no more than its share of
// that (PrefixFlops is convex), so a fractional choice over these intervals
// bounds any policy from above. A trace whose conversations share a prefix
// (a system prompt) is refused with INVALID_ARGUMENT: its sharing is not
// modelled. Charges include the index memory, as the budgets count it.
struct ReuseInterval {
  int64_t conv = 0;
  int64_t turn = 0;  // the turn that is resumed (k + 1)
  double start_s = 0;
  double end_s = 0;
  int64_t tokens = 0;  // m
  int64_t page_charge = 0;
  int64_t state_charge = 0;
  double flops = 0;
};
absl::StatusOr<std::vector<ReuseInterval>> ReuseIntervals(const Trace& trace, const ModelCost& model,
                                                          const TokenRule& tokens, int64_t entry_overhead_bytes);

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_CACHESTORE_CACHE_SIM_H_
