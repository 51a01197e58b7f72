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

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  std::vector<std::string> rows = {
      "trace,model,policy,budget,page_budget_bytes,state_budget_bytes,turns,prompt_tokens,hit_tokens,"
      "token_hit_rate,prompt_flops,saved_flops,flops_saved_fraction,page_bytes_written,state_bytes_written,"
      "bytes_written,evictions,pages_evicted,states_evicted,states_dropped_with_pages,put_failures,"
      "end_charge_bytes"};
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
      rows.push_back(Row(trace->name, spec, options.policy, "unlimited", page_ws, state_ws, *unlimited));
      std::printf("%s\n", rows.back().c_str());
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
          for (double f : fractions) {
            options.index.page_budget_bytes = std::max<int64_t>(1, static_cast<int64_t>(f * page_ws));
            options.index.state_budget_bytes = std::max<int64_t>(1, static_cast<int64_t>(f * state_ws));
            absl::StatusOr<CacheSimResult> r = RunCacheSim(*trace, *model, options);
            if (!r.ok()) {
              std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
              return 1;
            }
            rows.push_back(Row(trace->name, spec, options.policy, absl::StrCat(f), options.index.page_budget_bytes,
                               options.index.state_budget_bytes, *r));
            std::printf("%s\n", rows.back().c_str());
          }
          options.policy = "lru";
        }
      }
      std::fprintf(stderr, "%s x %s: %.1f s\n", trace->name.c_str(), spec.name.c_str(),
                   absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  for (const auto& [out, lines] :
       {std::pair(absl::GetFlag(FLAGS_out), &rows), std::pair(absl::GetFlag(FLAGS_intervals_out), &interval_rows)}) {
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
