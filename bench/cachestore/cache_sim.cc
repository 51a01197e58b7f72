#include "bench/cachestore/cache_sim.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cachestore/keys.h"

namespace hybridserve::bench {
namespace {

using cachestore::CacheIndex;
using cachestore::EntryClass;
using cachestore::Hash128;
using cachestore::PutSpec;
using cachestore::StateKind;

class Publisher {
 public:
  Publisher(CacheIndex& index, const ModelCost& model, const Hash128& ns, CacheSimResult& result)
      : index_(index), model_(model), ns_(ns), result_(result) {}

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
    absl::StatusOr<cachestore::Reservation> r = index_.Reserve(spec, now);
    if (!r.ok()) {
      ++result_.put_failures;
      return false;
    }
    if (r->already_present) return true;
    if (!index_.Commit(r->id, /*checksum=*/0, now).ok()) {
      ++result_.put_failures;
      return false;
    }
    *bytes += spec.size_bytes;
    ++*entries;
    return true;
  }

  CacheIndex& index_;
  const ModelCost& model_;
  const Hash128 ns_;
  CacheSimResult& result_;
};

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
  CacheIndex index(options.index);
  const int32_t ps = model.page_size();
  const Hash128 ns = cachestore::NamespaceKey("cache_sim", "", "tenant", "", ps);
  CacheSimResult result;
  Publisher publisher(index, model, ns, result);
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
    }
    options.tokens.Append(turn.conv, turn.turn, /*segment=*/1, turn.user_units, &tokens);
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) continue;  // nothing to look up or prefill

    // 1. The lookup.
    const std::vector<Hash128> prompt_keys = cachestore::PageKeys(ns, tokens, ps);
    absl::StatusOr<cachestore::LookupResult> hit = index.Lookup(ns, ps, prompt_keys, tokens, /*lease=*/false, now);
    if (!hit.ok()) return absl::InternalError(absl::StrCat("lookup: ", hit.status().message()));
    const int64_t p = std::min(hit->resume_position, n);
    ++result.turns;
    result.prompt_tokens += n;
    result.hit_tokens += p;
    result.hits.push_back(p);
    result.prompt_flops += model.PrefixFlops(n);
    result.saved_flops += model.PrefixFlops(p);

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
    publisher.Pages(tokens, fed_keys, prompt_pages, m / ps, now);
    publisher.State(tokens, fed_keys, m, StateKind::kExactPrefix, now);
  }
  result.end = index.Stats();
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
