// Replays multi-turn traces through the real CacheIndex (cache_sim.h) at
// budgets that are fractions of each trace's working set, and writes one CSV
// row per trace x model x policy x budget:
//
//   python3 bench/cachestore/build_traces.py --out_dir=/tmp/hs-traces
//   bazel run -c opt //bench/cachestore:cache_sim -- \
//       --traces=/tmp/hs-traces/sharegpt.jsonl,/tmp/hs-traces/agents.jsonl,/tmp/hs-traces/long_chats.jsonl \
//       --out=$PWD/bench/cachestore/results/cache_sim_lru.csv
//   python3 bench/cachestore/plot_cache_sim.py bench/cachestore/results/cache_sim_lru.csv
//   bazel run -c opt //bench/cachestore:cache_sim -- --policy=utility --blends=0,0.5,0.9 \
//       --traces=... --out=$PWD/bench/cachestore/results/cache_sim_utility.csv
//
// The working set of a trace (per model) is what an unlimited cache holds at
// the end, pages and states apart (bytes and index memory); a budget fraction
// f gives each class f times its own working set. Each model is
// name:config.json:units_per_token (the trace's bytes per token: 1 for the
// byte-level default model, 4 for a BPE vocabulary such as the bench
// Nemotron-H's).
//
// Shards (issue 49; cache_sim.h): --shards=N replays each budget on N shards
// that each get the budget (the CSV's budget columns are per shard; policy
// label _shards<N>), and --shards_out writes one row per shard (its turns,
// hit tokens, FLOPs saved, bytes held). --compare_shards=N instead runs, for
// each budget fraction f (B = f times the working set), one shard of N * B
// against N shards of B each and writes one comparison row per trace x model
// x f to --out (the goal: hit tokens within 2 %):
//
//   bazel run -c opt //bench/cachestore:cache_sim -- --compare_shards=4 \
//       --fractions=0.015625,0.0625,0.125 --placements=first_page,first_own_page \
//       --traces=/tmp/hs-traces/sharegpt.jsonl,/tmp/hs-traces/agents.jsonl,/tmp/hs-traces/long_chats.jsonl \
//       --out=$PWD/bench/cachestore/results/cache_sim_shards.csv \
//       --shards_out=$PWD/bench/cachestore/results/cache_sim_shards_per_shard.csv
//
// The disk tier (issue 49; cache_sim.h): --disk_budget=d1,d2,... replays each
// memory budget once per disk budget, each shard with a simulated disk of d
// (a fraction of the working set, pages and states together, as the memory
// budgets are, or bytes with a suffix: 512MiB, 4GiB; 0: no disk). The rows
// gain the disk columns: hit tokens and FLOPs saved by tier, and both per GiB
// of memory (the memory tier's share over all shards' memory budgets) and per
// GiB of disk (what the disk added over all shards' disk budgets). Without
// the flag the output is as before, byte for byte.
//
//   bazel run -c opt //bench/cachestore:cache_sim -- --disk_budget=0,0.125,0.5 \
//       --traces=/tmp/hs-traces/sharegpt.jsonl,/tmp/hs-traces/agents.jsonl \
//       --out=$PWD/bench/cachestore/results/cache_sim_disk.csv

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/cachestore/cache_sim.h"
#include "engine/model_config.h"

ABSL_FLAG(std::string, traces, "", "comma-separated trace files (build_traces.py)");
ABSL_FLAG(std::string, models,
          "default:models/default/config.json:1,nemotron_h_bench:bench/cachestore/nemotron_h_bench_config.json:4",
          "comma-separated name:config.json:units_per_token (paths relative to the workspace)");
ABSL_FLAG(std::string, fractions, "0.015625,0.03125,0.0625,0.125,0.25,0.5", "budgets as fractions of the working set");
ABSL_FLAG(int64_t, page_size, 0, "tokens per page; 0: the engine's default, min(16, chunk_size)");
ABSL_FLAG(int64_t, checkpoint_interval, 0, "grid checkpoint spacing; 0: the engine's default, 4 * chunk_size");
ABSL_FLAG(std::string, policy, "lru",
          "eviction: lru, or utility (GreedyDual-Size by FLOPs saved per byte, the cost model from each model's "
          "layer mix; cachestore/index/eviction_utility.h)");
ABSL_FLAG(std::string, blends, "0",
          "--policy=utility: comma-separated recency blends in [0, 1], one run each (CSV policy utility_b<blend>)");
ABSL_FLAG(std::string, admission_intervals, "0",
          "comma-separated grid checkpoint spacings prefill publishes under the policy, one run each (0: the "
          "model's, as --checkpoint_interval; -1: none, prompt-end and turn-end states only); the working set, "
          "and so the budgets, stay the model's");
ABSL_FLAG(std::string, branch_points, "off",
          "admission's branch-point rule: off, grid (the engine grid checkpoint at or below the branch) or exact "
          "(a state at the branch itself); policy label _branch_<rule>");
ABSL_FLAG(bool, oracle_skip_last_turn, false,
          "for comparison only: publish nothing of a conversation's last turn (policy label _oracle_last)");
ABSL_FLAG(int, shards, 1, "shards, each with the budget (cache_sim.h); 1: one index, as before shards");
ABSL_FLAG(int, compare_shards, 0,
          "N > 1: for each fraction f (B = f x working set), one shard of N x B against N shards of B; one "
          "comparison row each instead of the budget rows");
ABSL_FLAG(std::string, placements, "first_page",
          "comma-separated placements for the shards: first_page (what the client does: ShardPlacement::ChainKey) "
          "and/or first_own_page (simulation only: the first page past a shared system prompt)");
ABSL_FLAG(std::string, shards_out, "", "CSV file of one row per shard of each sharded run");
ABSL_FLAG(std::string, disk_budget, "",
          "comma-separated disk tier budgets per shard, one run each (cache_sim.h): a fraction of the working set "
          "(pages and states together), or bytes with a suffix B, KiB, MiB or GiB; 0: no disk tier; empty: the "
          "output without the disk columns");
ABSL_FLAG(std::string, out, "", "CSV file to write (stdout too)");
ABSL_FLAG(std::string, intervals_out, "",
          "CSV file of each trace x model's reuse intervals (cache_sim.h ReuseIntervals) for oracle_bound.py; "
          "traces with a shared prefix are skipped");

namespace hybridserve::bench {
namespace {

struct ModelSpec {
  std::string name;
  std::string config;
  double units_per_token = 1;
};

std::string Path(const std::string& p) {
  // Under bazel run the working directory is the runfiles tree; a relative
  // path means the workspace.
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return (p.empty() || p[0] == '/' || ws == nullptr) ? p : absl::StrCat(ws, "/", p);
}

std::string Row(const std::string& trace, const ModelSpec& model, const std::string& policy, const std::string& budget,
                int64_t page_budget, int64_t state_budget, const CacheSimResult& r) {
  return absl::StrFormat(
      "%s,%s,%s,%s,%d,%d,%d,%d,%d,%.6f,%.6e,%.6e,%.6f,%d,%d,%d,%d,%d,%d,%d,%d,%d", trace, model.name, policy, budget,
      page_budget, state_budget, r.turns, r.prompt_tokens, r.hit_tokens, r.hit_rate(), r.prompt_flops, r.saved_flops,
      r.prompt_flops > 0 ? r.saved_flops / r.prompt_flops : 0.0, r.page_bytes_written, r.state_bytes_written,
      r.page_bytes_written + r.state_bytes_written, r.evictions(), r.end.pages.evicted_lru, r.end.states.evicted_lru,
      r.end.states.dropped_with_pages, r.put_failures, r.page_charge() + r.state_charge());
}

constexpr char kShardHeader[] =
    "trace,model,policy,budget,shards,shard,page_budget_bytes,state_budget_bytes,turns,prompt_tokens,hit_tokens,"
    "saved_flops,page_charge_bytes,state_charge_bytes,evictions";

void ShardRows(const std::string& trace, const ModelSpec& model, const std::string& policy, const std::string& budget,
               const CacheSimOptions& options, const CacheSimResult& r, std::vector<std::string>* rows) {
  for (const CacheSimShard& s : r.shards) {
    rows->push_back(absl::StrFormat("%s,%s,%s,%s,%d,%s,%d,%d,%d,%d,%d,%.6e,%d,%d,%d", trace, model.name, policy, budget,
                                    options.shards, s.name, options.index.page_budget_bytes,
                                    options.index.state_budget_bytes, s.turns, s.prompt_tokens, s.hit_tokens,
                                    s.saved_flops, s.page_charge(), s.state_charge(),
                                    s.end.pages.evicted_lru + s.end.states.evicted_lru +
                                        s.end.pages.dropped_with_pages + s.end.states.dropped_with_pages));
  }
}

// A --disk_budget value: a fraction of the working set, or bytes with a unit.
struct DiskBudget {
  std::string label;  // as given
  double fraction = 0;
  int64_t bytes = -1;  // >= 0: bytes, not a fraction
  int64_t Bytes(int64_t working_set) const {
    return bytes >= 0 ? bytes : static_cast<int64_t>(fraction * static_cast<double>(working_set));
  }
};

absl::StatusOr<DiskBudget> ParseDiskBudget(absl::string_view v) {
  DiskBudget b;
  b.label = std::string(v);
  for (const auto& [suffix, unit] : {std::pair<absl::string_view, int64_t>{"GiB", int64_t{1} << 30},
                                     {"MiB", int64_t{1} << 20},
                                     {"KiB", int64_t{1} << 10},
                                     {"B", 1}}) {
    if (!absl::EndsWith(v, suffix)) continue;
    double n = 0;
    if (!absl::SimpleAtod(v.substr(0, v.size() - suffix.size()), &n) || !(n >= 0) || n * unit > 1e18) break;
    b.bytes = static_cast<int64_t>(n * static_cast<double>(unit));
    return b;
  }
  if (!absl::SimpleAtod(v, &b.fraction) || !(b.fraction >= 0) || b.fraction > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("--disk_budget: ", v, " is not a fraction >= 0 or bytes with B, KiB, MiB or GiB"));
  }
  return b;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The disk columns of a row (cache_sim.h CacheSimDisk): memory and disk are
// all shards' budgets together.
std::string DiskColumns(const std::string& disk_label, const CacheSimOptions& options, const CacheSimResult& r) {
  const double memory_gib =
      static_cast<double>(options.index.page_budget_bytes + options.index.state_budget_bytes) * options.shards / kGiB;
  const double disk_gib = static_cast<double>(r.disk.budget_bytes) / kGiB;
  const auto per = [](double v, double gib) { return gib > 0 ? v / gib : 0.0; };
  const double prompt_tokens = std::max<double>(1, static_cast<double>(r.prompt_tokens));
  const double prompt_flops = r.prompt_flops > 0 ? r.prompt_flops : 1;
  return absl::StrFormat("%s,%d,%d,%.6f,%.6f,%d,%.6f,%.6f,%.4f,%.4f,%.6e,%.6e,%.1f,%.1f,%d,%d,%d,%d,%d,%d,%d,%d,%d",
                         disk_label, r.disk.budget_bytes, r.memory_hit_tokens(), r.memory_hit_tokens() / prompt_tokens,
                         r.memory_saved_flops() / prompt_flops, r.disk.hit_tokens, r.disk.hit_tokens / prompt_tokens,
                         r.disk.saved_flops / prompt_flops, memory_gib, disk_gib,
                         per(r.memory_saved_flops(), memory_gib), per(r.disk.saved_flops, disk_gib),
                         per(static_cast<double>(r.memory_hit_tokens()), memory_gib),
                         per(static_cast<double>(r.disk.hit_tokens), disk_gib), r.disk.hits, r.disk.bytes_written,
                         r.disk.bytes_read, r.disk.evictions, r.disk.spills_present, r.disk.spills_refused,
                         r.disk.promotion_failures, r.disk.files, r.disk.bytes);
}

constexpr char kDiskHeader[] =
    ",disk_budget,disk_budget_bytes,memory_hit_tokens,memory_token_hit_rate,memory_flops_saved_fraction,"
    "disk_hit_tokens,disk_token_hit_rate,disk_flops_saved_fraction,memory_gib,disk_gib,memory_saved_flops_per_gib,"
    "disk_saved_flops_per_gib,memory_hit_tokens_per_gib,disk_hit_tokens_per_gib,disk_hits,disk_bytes_written,"
    "disk_bytes_read,disk_evictions,disk_spills_present,disk_spills_refused,disk_promotion_failures,disk_files_end,"
    "disk_bytes_end";

// a;b;c of each shard's value.
template <typename F>
std::string PerShard(const CacheSimResult& r, F f) {
  std::vector<std::string> v;
  for (const CacheSimShard& s : r.shards) v.push_back(absl::StrCat(f(s)));
  return absl::StrJoin(v, ";");
}

int Main() {
  std::vector<ModelSpec> models;
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(m, ':');
    ModelSpec spec;
    if (parts.size() != 3 || !absl::SimpleAtod(parts[2], &spec.units_per_token)) {
      std::fprintf(stderr, "--models: %s is not name:config.json:units_per_token\n", std::string(m).c_str());
      return 2;
    }
    spec.name = parts[0];
    spec.config = Path(parts[1]);
    models.push_back(spec);
  }
  std::vector<double> fractions;
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_fractions), ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(f, &v) || v <= 0) {
      std::fprintf(stderr, "--fractions: bad %s\n", std::string(f).c_str());
      return 2;
    }
    fractions.push_back(v);
  }
  const std::string policy = absl::GetFlag(FLAGS_policy);
  if (policy != "lru" && policy != "utility") {
    std::fprintf(stderr, "--policy: %s is not lru or utility\n", policy.c_str());
    return 2;
  }
  std::vector<double> blends;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_blends), ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(b, &v) || !(v >= 0 && v <= 1)) {
      std::fprintf(stderr, "--blends: bad %s\n", std::string(b).c_str());
      return 2;
    }
    blends.push_back(v);
  }
  if (policy == "lru") blends = {1};  // one run; the blend is unused
  CacheSimOptions::BranchPoints branch_points = CacheSimOptions::BranchPoints::kOff;
  if (const std::string b = absl::GetFlag(FLAGS_branch_points); b == "grid") {
    branch_points = CacheSimOptions::BranchPoints::kGrid;
  } else if (b == "exact") {
    branch_points = CacheSimOptions::BranchPoints::kExact;
  } else if (b != "off") {
    std::fprintf(stderr, "--branch_points: %s is not off, grid or exact\n", b.c_str());
    return 2;
  }
  std::vector<int64_t> admissions;
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_admission_intervals), ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(a, &v) || v < -1) {
      std::fprintf(stderr, "--admission_intervals: bad %s\n", std::string(a).c_str());
      return 2;
    }
    admissions.push_back(v);
  }
  const int shards = absl::GetFlag(FLAGS_shards);
  const int compare = absl::GetFlag(FLAGS_compare_shards);
  if (shards < 1 || compare < 0 || compare == 1 || (compare > 1 && shards != 1)) {
    std::fprintf(stderr, "--shards must be >= 1, --compare_shards 0 or >= 2, and not both\n");
    return 2;
  }
  std::vector<std::pair<std::string, CacheSimOptions::Placement>> placements;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_placements), ',', absl::SkipEmpty())) {
    if (p == "first_page") {
      placements.emplace_back(p, CacheSimOptions::Placement::kFirstPage);
    } else if (p == "first_own_page") {
      placements.emplace_back(p, CacheSimOptions::Placement::kFirstOwnPage);
    } else {
      std::fprintf(stderr, "--placements: %s is not first_page or first_own_page\n", std::string(p).c_str());
      return 2;
    }
  }
  if (placements.empty() || (shards == 1 && compare == 0 && placements.size() > 1)) {
    std::fprintf(stderr, "--placements: one or more, and more than one only with shards\n");
    return 2;
  }
  std::vector<DiskBudget> disk_budgets;
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_disk_budget), ',', absl::SkipEmpty())) {
    absl::StatusOr<DiskBudget> b = ParseDiskBudget(d);
    if (!b.ok()) {
      std::fprintf(stderr, "%s\n", std::string(b.status().message()).c_str());
      return 2;
    }
    disk_budgets.push_back(*b);
  }
  const bool disk = !disk_budgets.empty();
  if (disk && compare > 1) {
    std::fprintf(stderr, "--disk_budget: not with --compare_shards\n");
    return 2;
  }
  if (!disk) disk_budgets.push_back(DiskBudget{});  // one run, no disk tier, no disk columns
  std::vector<std::string> shard_rows = {kShardHeader};
  std::vector<std::string> rows = {
      "trace,model,policy,budget,page_budget_bytes,state_budget_bytes,turns,prompt_tokens,hit_tokens,"
      "token_hit_rate,prompt_flops,saved_flops,flops_saved_fraction,page_bytes_written,state_bytes_written,"
      "bytes_written,evictions,pages_evicted,states_evicted,states_dropped_with_pages,put_failures,"
      "end_charge_bytes"};
  if (disk) rows[0] += kDiskHeader;
  if (compare > 1) {
    rows = {
        absl::StrCat("trace,model,placement,budget,shards,page_budget_per_shard,state_budget_per_shard,prompt_tokens,"
                     "hit_tokens_1x",
                     compare, "B,hit_tokens_", compare, "xB,hit_ratio,saved_flops_fraction_1x", compare,
                     "B,saved_flops_fraction_", compare,
                     "xB,goal_within_2pct,shard_turns,shard_hit_tokens,shard_charge_bytes,max_over_mean_charge,"
                     "shard_working_set_bytes,max_over_mean_working_set")};
  }
  std::printf("%s\n", rows[0].c_str());
  std::vector<std::string> interval_rows = {
      "trace,model,conv,turn,start_s,end_s,tokens,page_charge,state_charge,flops"};
  for (absl::string_view path : absl::StrSplit(absl::GetFlag(FLAGS_traces), ',', absl::SkipEmpty())) {
    absl::StatusOr<Trace> trace = LoadTrace(Path(std::string(path)));
    if (!trace.ok()) {
      std::fprintf(stderr, "%s\n", trace.status().ToString().c_str());
      return 1;
    }
    for (const ModelSpec& spec : models) {
      absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(spec.config);
      absl::StatusOr<ModelCost> model = config.ok() ? ModelCost::Create(*config, absl::GetFlag(FLAGS_page_size),
                                                                        absl::GetFlag(FLAGS_checkpoint_interval))
                                                    : absl::StatusOr<ModelCost>(config.status());
      if (!model.ok()) {
        std::fprintf(stderr, "%s: %s\n", spec.name.c_str(), model.status().ToString().c_str());
        return 1;
      }
      std::fprintf(stderr,
                   "%s: page %d tokens, %ld bytes; grid checkpoint every %ld tokens; state %ld bytes + tail KV "
                   "(%ld with logits); %.4g FLOPs/token + %.4g per context token\n",
                   spec.name.c_str(), model->page_size(), static_cast<long>(model->page_bytes()),
                   static_cast<long>(model->checkpoint_interval()), static_cast<long>(model->StateBytes(0, false)),
                   static_cast<long>(model->StateBytes(0, true)), model->flops_per_token(),
                   model->attention_flops_per_context_token());
      CacheSimOptions options;
      options.tokens = TokenRule{spec.units_per_token, model->vocab()};
      options.index.blob_pool_bytes = 0;  // a freed buffer is unmapped at once
      options.index.page_budget_bytes = int64_t{1} << 60;
      options.index.state_budget_bytes = int64_t{1} << 60;
      const absl::Time start = absl::Now();
      absl::StatusOr<CacheSimResult> unlimited = RunCacheSim(*trace, *model, options);
      if (!unlimited.ok()) {
        std::fprintf(stderr, "%s\n", unlimited.status().ToString().c_str());
        return 1;
      }
      if (!absl::GetFlag(FLAGS_intervals_out).empty()) {
        absl::StatusOr<std::vector<ReuseInterval>> intervals =
            ReuseIntervals(*trace, *model, options.tokens, options.index.entry_overhead_bytes);
        if (!intervals.ok()) {
          std::fprintf(stderr, "%s: no reuse intervals: %s\n", trace->name.c_str(),
                       intervals.status().ToString().c_str());
        }
        for (const ReuseInterval& r : intervals.ok() ? *intervals : std::vector<ReuseInterval>{}) {
          interval_rows.push_back(absl::StrFormat("%s,%s,%d,%d,%.6f,%.6f,%d,%d,%d,%.6e", trace->name, spec.name, r.conv,
                                                  r.turn, r.start_s, r.end_s, r.tokens, r.page_charge, r.state_charge,
                                                  r.flops));
        }
      }
      const int64_t page_ws = unlimited->page_charge();
      const int64_t state_ws = unlimited->state_charge();
      if (compare == 0) {
        rows.push_back(Row(trace->name, spec, options.policy, "unlimited", page_ws, state_ws, *unlimited));
        if (disk) rows.back() += absl::StrCat(",", DiskColumns("0", options, *unlimited));
        std::printf("%s\n", rows.back().c_str());
      }
      if (compare > 1) {
        // Each placement's split of the working set: what each shard holds
        // with unlimited budgets (the demand a budget of B per shard meets).
        std::vector<std::string> ws_split;
        std::vector<double> ws_skew;
        for (const auto& [label, placement] : placements) {
          CacheSimOptions many = options;
          many.shards = compare;
          many.placement = placement;
          absl::StatusOr<CacheSimResult> rn = RunCacheSim(*trace, *model, many);
          if (!rn.ok()) {
            std::fprintf(stderr, "%s\n", rn.status().ToString().c_str());
            return 1;
          }
          ShardRows(trace->name, spec, absl::StrCat("lru_", label), "unlimited", many, *rn, &shard_rows);
          int64_t max_ws = 0;
          for (const CacheSimShard& s : rn->shards) max_ws = std::max(max_ws, s.page_charge() + s.state_charge());
          ws_split.push_back(PerShard(*rn, [](const CacheSimShard& s) { return s.page_charge() + s.state_charge(); }));
          const int64_t total = rn->page_charge() + rn->state_charge();
          ws_skew.push_back(total > 0 ? static_cast<double>(max_ws) * compare / total : 0.0);
        }
        for (double f : fractions) {
          const int64_t page_b = std::max<int64_t>(1, static_cast<int64_t>(f * page_ws));
          const int64_t state_b = std::max<int64_t>(1, static_cast<int64_t>(f * state_ws));
          CacheSimOptions one = options;
          one.index.page_budget_bytes = compare * page_b;
          one.index.state_budget_bytes = compare * state_b;
          absl::StatusOr<CacheSimResult> r1 = RunCacheSim(*trace, *model, one);
          if (!r1.ok()) {
            std::fprintf(stderr, "%s\n", r1.status().ToString().c_str());
            return 1;
          }
          ShardRows(trace->name, spec, "lru", absl::StrCat(f * compare), one, *r1, &shard_rows);
          for (size_t pi = 0; pi < placements.size(); ++pi) {
            const auto& [label, placement] = placements[pi];
            CacheSimOptions many = options;
            many.shards = compare;
            many.placement = placement;
            many.index.page_budget_bytes = page_b;
            many.index.state_budget_bytes = state_b;
            absl::StatusOr<CacheSimResult> rn = RunCacheSim(*trace, *model, many);
            if (!rn.ok()) {
              std::fprintf(stderr, "%s\n", rn.status().ToString().c_str());
              return 1;
            }
            ShardRows(trace->name, spec, absl::StrCat("lru_", label), absl::StrCat(f), many, *rn, &shard_rows);
            const double ratio = r1->hit_tokens > 0 ? static_cast<double>(rn->hit_tokens) / r1->hit_tokens : 1.0;
            int64_t max_charge = 0, total_charge = 0;
            for (const CacheSimShard& s : rn->shards) {
              max_charge = std::max(max_charge, s.page_charge() + s.state_charge());
              total_charge += s.page_charge() + s.state_charge();
            }
            rows.push_back(absl::StrFormat(
                "%s,%s,%s,%s,%d,%d,%d,%d,%d,%d,%.4f,%.6f,%.6f,%s,%s,%s,%s,%.3f,%s,%.3f", trace->name, spec.name, label,
                absl::StrCat(f), compare, page_b, state_b, r1->prompt_tokens, r1->hit_tokens, rn->hit_tokens, ratio,
                r1->saved_flops / r1->prompt_flops, rn->saved_flops / rn->prompt_flops,
                std::abs(ratio - 1) <= 0.02 ? "MET" : "MISSED",
                PerShard(*rn, [](const CacheSimShard& s) { return s.turns; }),
                PerShard(*rn, [](const CacheSimShard& s) { return s.hit_tokens; }),
                PerShard(*rn, [](const CacheSimShard& s) { return s.page_charge() + s.state_charge(); }),
                total_charge > 0 ? static_cast<double>(max_charge) * compare / total_charge : 0.0, ws_split[pi],
                ws_skew[pi]));
            std::printf("%s\n", rows.back().c_str());
          }
        }
        admissions.clear();  // no budget rows
      }
      for (int64_t admission : admissions) {
        options.checkpoint_interval = admission;
        for (double blend : blends) {
          if (policy == "utility") {
            // The index's cost model is the model's: a token at t costs C + A * (t + 1).
            options.index.eviction = cachestore::EvictionPolicy::kUtility;
            options.index.utility =
                cachestore::UtilityCost{model->flops_per_token(), model->attention_flops_per_context_token(), blend};
            options.policy = absl::StrCat("utility_b", blend);
          }
          options.branch_points = branch_points;
          if (branch_points != CacheSimOptions::BranchPoints::kOff) {
            absl::StrAppend(&options.policy, "_branch_", absl::GetFlag(FLAGS_branch_points));
          }
          options.oracle_skip_last_turn = absl::GetFlag(FLAGS_oracle_skip_last_turn);
          if (options.oracle_skip_last_turn) absl::StrAppend(&options.policy, "_oracle_last");
          if (admission != 0)
            absl::StrAppend(&options.policy, "_ckpt", admission < 0 ? "none" : absl::StrCat(admission));
          if (shards > 1) {
            options.shards = shards;
            options.placement = placements[0].second;
            absl::StrAppend(&options.policy, "_shards", shards,
                            placements[0].second == CacheSimOptions::Placement::kFirstPage ? "" : "_first_own_page");
          }
          for (double f : fractions) {
            options.index.page_budget_bytes = std::max<int64_t>(1, static_cast<int64_t>(f * page_ws));
            options.index.state_budget_bytes = std::max<int64_t>(1, static_cast<int64_t>(f * state_ws));
            for (const DiskBudget& d : disk_budgets) {
              options.disk_budget_bytes = d.Bytes(page_ws + state_ws);
              absl::StatusOr<CacheSimResult> r = RunCacheSim(*trace, *model, options);
              if (!r.ok()) {
                std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
                return 1;
              }
              rows.push_back(Row(trace->name, spec, options.policy, absl::StrCat(f), options.index.page_budget_bytes,
                                 options.index.state_budget_bytes, *r));
              if (disk) rows.back() += absl::StrCat(",", DiskColumns(d.label, options, *r));
              const std::string budget = disk ? absl::StrCat(f, "_disk", d.label) : absl::StrCat(f);
              if (shards > 1) ShardRows(trace->name, spec, options.policy, budget, options, *r, &shard_rows);
              std::printf("%s\n", rows.back().c_str());
            }
            options.disk_budget_bytes = 0;
          }
          options.policy = "lru";
          options.shards = 1;
        }
      }
      std::fprintf(stderr, "%s x %s: %.1f s\n", trace->name.c_str(), spec.name.c_str(),
                   absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  for (const auto& [out, lines] :
       {std::pair(absl::GetFlag(FLAGS_out), &rows), std::pair(absl::GetFlag(FLAGS_intervals_out), &interval_rows),
        std::pair(absl::GetFlag(FLAGS_shards_out), &shard_rows)}) {
    if (out.empty()) continue;
    std::ofstream f(Path(out));
    for (const std::string& row : *lines) f << row << "\n";
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace hybridserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hybridserve::bench::Main();
}
