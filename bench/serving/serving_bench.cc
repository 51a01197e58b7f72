// The serving figures of docs/ARCHITECTURE.md section 6 through the real binaries:
// cachestore, prefill and decode as child processes on loopback (the e2e
// harness, tests/e2e/stack.h), driven by a gRPC client here. Every figure is
// a ratio to a baseline measured in the same run:
//   resume  turn-2 TTFT warm (resumed from turn 1's state) / cold (another
//           cache salt: a miss) with 1K, 4K and 16K tokens of history; and
//           warm / the compute of its new tokens (the compute floor)
//   disagg  TTFT disaggregated over loopback / aggregated (one process) at
//           1K and 8K prompts (and 32K on a GPU), no cache; and the push's
//           share of the disaggregated TTFT (the prefill worker's
//           hybridserve_transfer_seconds)
//   tcp     the TCP data plane's bandwidth / a raw loopback socket moving the
//           same bytes in the same page-sized writes
//   cache   unique-prompt throughput with the cache on / off (the cost of
//           publication)
//   tls     disaggregated TTFT (cache on, unique prompts: a lookup that
//           misses, the prefill call, the push, the publication) with mutual
//           TLS on every gRPC port / the same stack in plaintext, at 1K and 8K
//           (certificates made by tools/make_test_certs.py). The data plane
//           is not encrypted (its bytes cross the TCP plane in the clear,
//           authenticated by the ticket's secret): its figure is the tcp row's
//   sweep   1 to 64 concurrent streams on the default model: requests/s,
//           p50/p99 TTFT and inter-token latency, errors (a table; with
//           --sweep_csv a CSV that bench/serving/plot_sweep.py draws)
//
//   bazel run -c opt //bench/serving:serving_bench -- \
//       --model_dir=/tmp/hs-bench/nemotron_h [--only=resume,disagg,tcp,cache,sweep]
//   on a GPU machine: --device=cuda [--data_plane=nccl] (disagg then compares the
//   NCCL plane's TTFT with the aggregated GPU run; needs --prefill of one worker,
//   which the harness gives)
// (the bench model: tools/gen_model.py --preset bench --seed 0 --out ...).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "proto/generation.grpc.pb.h"
#include "tests/e2e/stack.h"
#include "transport/tcp_transport.h"
#include "transport/transfer.h"

ABSL_FLAG(std::string, model_dir, "", "the bench model's directory (absolute); resume, disagg and cache need it");
ABSL_FLAG(std::string, only, "resume,disagg,tcp,cache,tls,sweep", "comma-separated subset to run");
ABSL_FLAG(int32_t, threads, 2, "kernel threads of each prefill and decode process");
ABSL_FLAG(int32_t, reps, 3, "repetitions per figure (medians are reported)");
ABSL_FLAG(bool, shm, false,
          "resume, disagg, cache: the cachestore's --shm_socket on and prefill reading by shared memory");
ABSL_FLAG(std::string, histories, "1024,4096,16384", "resume: tokens of history");
ABSL_FLAG(std::string, prefill_flags, "",
          "comma-separated extra flags for every prefill worker (e.g. --checkpoint_publish_interval=4096: what "
          "prefill publishes changes what the next requests share the cores with)");
ABSL_FLAG(std::string, decode_flags, "",
          "extra flags for the decode worker, comma-separated (e.g. --read_history_pages=false)");
ABSL_FLAG(std::string, llamacpp_gguf, "",
          "resume: the bench model's GGUF (bench/llamacpp/convert.sh); when set, each row also gets llama.cpp's "
          "in-process anchor (bench/llamacpp/resume_anchor.py: load_state of the same history, then eval of the same "
          "new tokens), run before the stack starts; needs llama-cpp-python on PYTHONPATH");
ABSL_FLAG(std::string, sweep_streams, "1,2,4,8,16,32,64", "sweep: concurrent streams");
ABSL_FLAG(int32_t, sweep_requests_per_stream, 4, "sweep: requests each stream sends in turn");
ABSL_FLAG(std::string, sweep_csv, "", "sweep: write the table as CSV here (for plot_sweep.py)");
ABSL_FLAG(std::string, device, "cpu", "where prefill and decode run: cpu or cuda (a GPU machine)");
ABSL_FLAG(std::string, data_plane, "tcp",
          "disaggregated runs' data plane: tcp, or nccl (GPUs; prefill serves both, decode uses this one)");

namespace hybridserve::bench {
namespace {

using e2e::Stack;
using e2e::StackOptions;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The q-quantile (0..1) by nearest rank.
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(q * static_cast<double>(v.size()) + 0.999999);
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

// `n` pseudo-random byte tokens (valid in every model here: vocab > 256),
// distinct for distinct seeds from the first token on.
std::vector<int32_t> UniquePrompt(int n, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % 256);
  return out;
}

// One streamed request as the client saw it.
struct Timed {
  grpc::Status status;
  bool completed = false;
  v1::GenerateComplete complete;
  std::vector<int32_t> tokens;
  double ttft_s = 0;           // send to the first token
  std::vector<double> gaps_s;  // between successive token chunks
  double total_s = 0;
};

class Client {
 public:
  explicit Client(const std::string& target)
      : stub_(v1::Generation::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}
  explicit Client(std::shared_ptr<grpc::Channel> channel) : stub_(v1::Generation::NewStub(std::move(channel))) {}

  Timed Run(const v1::GenerateRequest& request, absl::Duration deadline = absl::Minutes(5)) const {
    Timed t;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    const absl::Time start = absl::Now();
    absl::Time last = start;
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      const absl::Time now = absl::Now();
      if (response.has_chunk() && response.chunk().token_ids_size() > 0) {
        if (t.tokens.empty()) {
          t.ttft_s = absl::ToDoubleSeconds(now - start);
        } else {
          t.gaps_s.push_back(absl::ToDoubleSeconds(now - last) / response.chunk().token_ids_size());
        }
        last = now;
        t.tokens.insert(t.tokens.end(), response.chunk().token_ids().begin(), response.chunk().token_ids().end());
      } else if (response.has_complete()) {
        t.completed = true;
        t.complete = response.complete();
      }
    }
    t.status = reader->Finish();
    t.total_s = absl::ToDoubleSeconds(absl::Now() - start);
    return t;
  }

 private:
  std::unique_ptr<v1::Generation::Stub> stub_;
};

v1::GenerateRequest Request(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens,
                            const std::string& salt) {
  v1::GenerateRequest r = e2e::Request(id, prompt, max_tokens);
  r.set_cache_salt(salt);
  return r;
}

bool Ok(const Timed& t, const std::string& what) {
  if (t.status.ok() && t.completed && t.complete.finish_reason() == v1::FINISH_REASON_LENGTH) return true;
  std::fprintf(stderr, "%s failed: %d %s %s\n", what.c_str(), static_cast<int>(t.status.error_code()),
               t.status.error_message().c_str(), t.complete.error_message().c_str());
  return false;
}

std::vector<int> Ints(const std::string& csv) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(csv, ',', absl::SkipEmpty())) out.push_back(std::stoi(std::string(s)));
  return out;
}

// The bench model on every process, `threads` kernel threads each.
StackOptions BenchStack(bool cachestore, bool aggregated) {
  const std::string model = "--model_dir=" + absl::GetFlag(FLAGS_model_dir);
  const std::string threads = absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads));
  StackOptions o;
  o.cachestore = cachestore;
  o.aggregated = aggregated;
  o.max_batch = 8;
  const std::string device = "--device=" + absl::GetFlag(FLAGS_device);
  o.decode_args = {model, threads, device, "--max_pages=8192", "--transfer_timeout=300s"};
  o.prefill_args = {model, threads, device, "--max_pages=8192"};
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_prefill_flags), ',', absl::SkipEmpty())) {
    o.prefill_args.emplace_back(f);
  }
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_decode_flags), ',', absl::SkipEmpty())) {
    o.decode_args.emplace_back(f);
  }
  if (!aggregated && absl::GetFlag(FLAGS_data_plane) != "tcp") {
    o.decode_args.push_back("--data_planes=" + absl::GetFlag(FLAGS_data_plane));
    o.prefill_args.push_back("--data_planes=tcp," + absl::GetFlag(FLAGS_data_plane));
  }
  o.cachestore_args = {"--page_budget_mib=4096", "--state_budget_mib=2048"};
  o.shm = cachestore && absl::GetFlag(FLAGS_shm);
  return o;
}

// ---- resume: turn 2 warm / cold ----

// The cumulative seconds of the prefills' three phases (cache resume,
// compute, push) from the Prometheus endpoints: the prefill worker's, and
// decode's local prefills (a continuation prefilled in decode's engine: no
// push).
struct PrefillPhases {
  double resume = 0, compute = 0, push = 0;
};

PrefillPhases ScrapePhases(e2e::Process& prefill, e2e::Process& decode) {
  PrefillPhases p;
  auto m = e2e::ScrapeMetrics(std::stoi(prefill.field("metrics_port")));
  if (m.ok()) {
    p.resume = (*m)["hybridserve_prefill_resume_seconds_sum"];
    p.compute = (*m)["hybridserve_prefill_compute_seconds_sum"];
    p.push = (*m)["hybridserve_transfer_seconds_sum"];
  }
  auto d = e2e::ScrapeMetrics(std::stoi(decode.field("metrics_port")));
  if (d.ok()) {
    p.resume += (*d)["hybridserve_decode_local_prefill_resume_seconds_total"];
    p.compute += (*d)["hybridserve_decode_local_prefill_compute_seconds_total"];
  }
  return p;
}

// The prefill worker publishes behind its answers (pages, then every grid
// checkpoint and the prompt end: at 16K tokens of the bench model, 64 MiB
// and 33 states of 7.7 MB): waits until none is left
// (hybridserve_prefill_publications_in_flight), so that the next request's
// phases are its own, not shared with the one before's publication. False
// after a minute.
bool AwaitPublications(e2e::Process& prefill) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (absl::Now() < deadline) {
    auto m = e2e::ScrapeMetrics(std::stoi(prefill.field("metrics_port")));
    if (m.ok() && m->count("hybridserve_prefill_publications_in_flight") == 1 &&
        (*m)["hybridserve_prefill_publications_in_flight"] == 0) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::fprintf(stderr, "prefill still had publications in flight after a minute\n");
  return false;
}

// The goal for the warm / cold ratio, chosen by the history length itself
// (not by its place in --histories): 0.10 at 1K tokens, 0.03 at 4K, 0.01 at
// 16K; none for any other history.
std::optional<double> ResumeGoal(int history) {
  switch (history) {
    case 1024:
      return 0.10;
    case 4096:
      return 0.03;
    case 16384:
      return 0.01;
    default:
      return std::nullopt;
  }
}

// llama.cpp's in-process resume of `history` tokens plus `fresh` new ones
// (resume_anchor.py's total_ms), by history; empty without --llamacpp_gguf
// or when the script fails (said on stderr).
std::map<int, double> LlamaCppAnchor(const std::vector<int>& histories, int fresh) {
  std::map<int, double> out;
  const std::string gguf = absl::GetFlag(FLAGS_llamacpp_gguf);
  if (gguf.empty()) return out;
  const std::string cmd = absl::StrCat("python3 ", e2e::Runfile("bench/llamacpp/resume_anchor.py"), " --gguf ", gguf,
                                       " --new ", fresh, " --threads ", absl::GetFlag(FLAGS_threads), " --histories ",
                                       absl::StrJoin(histories, ","), " 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string text;
  char buf[4096];
  while (pipe != nullptr && fgets(buf, sizeof(buf), pipe) != nullptr) text += buf;
  if (pipe == nullptr || pclose(pipe) != 0) {
    std::fprintf(stderr, "llama.cpp anchor: %s failed:\n%s\n", cmd.c_str(), text.c_str());
    return out;
  }
  // The last line is {"anchor": [{"history": H, ..., "total_ms": T, ...}, ...]}.
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  const nlohmann::json j =
      nlohmann::json::parse(lines.empty() ? "" : lines.back(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("anchor")) {
    std::fprintf(stderr, "llama.cpp anchor: no JSON line in:\n%s\n", text.c_str());
    return out;
  }
  for (const nlohmann::json& row : j["anchor"]) out[row["history"].get<int>()] = row["total_ms"].get<double>();
  return out;
}

bool RunResume() {
  // Turn 2 resumes at turn 1's end (history + 15 of its 16 generated tokens)
  // and computes the 16th and 64 new ones: the anchor gets the same counts,
  // before the stack starts (nothing else on the cores).
  std::vector<int> anchor_histories;
  for (int history : Ints(absl::GetFlag(FLAGS_histories))) anchor_histories.push_back(history + 15);
  const std::map<int, double> anchor = LlamaCppAnchor(anchor_histories, 65);
  auto stack = Stack::Start(BenchStack(/*cachestore=*/true, /*aggregated=*/false));
  if (!stack.ok()) {
    std::fprintf(stderr, "stack: %s\n", stack.status().ToString().c_str());
    return false;
  }
  Client client((*stack)->decode_target());
  std::printf("\n== resume: turn-2 TTFT, warm (resumed from turn 1) / cold (a miss), bench model, %d threads%s\n",
              absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_shm) ? ", reads by shared memory" : "");
  // floor: warm TTFT / the prefill worker's compute of the new tokens in the
  // same request (issue 28's goal: <= 1.15, the rest being resume, push and RPCs).
  // llama_ms: llama.cpp's in-process load_state + eval of the same counts
  // (--llamacpp_gguf); vs_llama: warm / that (issue 28's goal: <= 0.70).
  std::printf("%8s %10s %10s %8s %8s %8s %18s %8s %9s %8s  %s\n", "history", "warm_ms", "cold_ms", "ratio", "goal",
              "cached", "resume/comp/push", "floor", "llama_ms", "vs_llama", "resume kind");
  for (int history : Ints(absl::GetFlag(FLAGS_histories))) {
    const int reps = history >= 16384 ? 1 : absl::GetFlag(FLAGS_reps);
    std::vector<double> warm, cold, resume_ms, compute_ms, push_ms;
    uint32_t cached = 0;
    int kind = 0;
    for (int r = 0; r < reps; ++r) {
      const std::string salt = absl::StrCat("resume-", history, "-", r);
      const std::vector<int32_t> turn1 = UniquePrompt(history, 1000 + history + r);
      Timed t1 = client.Run(Request(absl::StrCat(salt, "-t1"), turn1, 16, salt));
      if (!Ok(t1, "turn 1")) return false;
      std::vector<int32_t> turn2 = turn1;
      turn2.insert(turn2.end(), t1.tokens.begin(), t1.tokens.end());
      const std::vector<int32_t> user = UniquePrompt(64, 77 + r);
      turn2.insert(turn2.end(), user.begin(), user.end());
      // Cold first: a different salt is another namespace, so nothing of turn 1 is found.
      Timed c = client.Run(Request(absl::StrCat(salt, "-cold"), turn2, 1, salt + "-other"));
      // The warm turn starts on idle cores, as its compute floor assumes.
      if (!AwaitPublications(*(*stack)->prefill())) return false;
      const PrefillPhases before = ScrapePhases(*(*stack)->prefill(), *(*stack)->decode());
      Timed w = client.Run(Request(absl::StrCat(salt, "-t2"), turn2, 1, salt));
      const PrefillPhases after = ScrapePhases(*(*stack)->prefill(), *(*stack)->decode());
      resume_ms.push_back(1e3 * (after.resume - before.resume));
      compute_ms.push_back(1e3 * (after.compute - before.compute));
      push_ms.push_back(1e3 * (after.push - before.push));
      if (!Ok(c, "cold turn 2") || !Ok(w, "warm turn 2")) return false;
      if (c.complete.usage().cached_tokens() != 0) {
        std::fprintf(stderr, "cold turn 2 found %u cached tokens\n", c.complete.usage().cached_tokens());
        return false;
      }
      cold.push_back(c.ttft_s);
      warm.push_back(w.ttft_s);
      cached = w.complete.usage().cached_tokens();
      kind = w.complete.usage().resume_kind();
    }
    const double ratio = Median(warm) / Median(cold);
    const std::string phases =
        absl::StrFormat("%.0f/%.0f/%.0f", Median(resume_ms), Median(compute_ms), Median(push_ms));
    const std::optional<double> goal = ResumeGoal(history);
    const double floor = Median(compute_ms) > 0 ? 1e3 * Median(warm) / Median(compute_ms) : 0;
    const auto llama = anchor.find(history + 15);
    const std::string llama_ms = llama == anchor.end() ? "-" : absl::StrFormat("%.1f", llama->second);
    const std::string vs_llama =
        llama == anchor.end() ? "-" : absl::StrFormat("%.2f", 1e3 * Median(warm) / llama->second);
    std::printf("%8d %10.1f %10.1f %8.4f %8s %8u %18s %8.2f %9s %8s  %s\n", history, 1e3 * Median(warm),
                1e3 * Median(cold), ratio, goal.has_value() ? absl::StrFormat("%.2f", *goal).c_str() : "-", cached,
                phases.c_str(), floor, llama_ms.c_str(), vs_llama.c_str(),
                v1::ResumeKind_Name(static_cast<v1::ResumeKind>(kind)).c_str());
    std::fflush(stdout);
  }
  return true;
}

// ---- disagg: disaggregated / aggregated TTFT ----

bool RunDisagg() {
  auto disagg = Stack::Start(BenchStack(/*cachestore=*/false, /*aggregated=*/false));
  auto agg = Stack::Start(BenchStack(/*cachestore=*/false, /*aggregated=*/true));
  if (!disagg.ok() || !agg.ok()) {
    std::fprintf(stderr, "stack: %s %s\n", disagg.status().ToString().c_str(), agg.status().ToString().c_str());
    return false;
  }
  Client d((*disagg)->decode_target());
  Client a((*agg)->decode_target());
  std::printf(
      "\n== disagg: TTFT disaggregated over loopback (3 processes, %s data plane, %s) / aggregated (1 process)\n",
      absl::GetFlag(FLAGS_data_plane).c_str(), absl::GetFlag(FLAGS_device).c_str());
  std::printf("%8s %10s %10s %8s %8s %10s %8s\n", "prompt", "disagg_ms", "agg_ms", "ratio", "goal", "transfer", "goal");
  // The prefill worker's push time per request, from its metrics: the data
  // plane's share of the disaggregated TTFT.
  const int prefill_metrics = std::stoi((*disagg)->prefill()->field("metrics_port"));
  auto transfer_seconds = [&] {
    auto m = e2e::ScrapeMetrics(prefill_metrics);
    if (!m.ok()) return -1.0;
    auto it = m->find("hybridserve_transfer_seconds_sum");
    return it == m->end() ? -1.0 : it->second;
  };
  std::vector<int> prompts = {1024, 8192};
  // The 32K figure, on a GPU: the bench model's whole context (32768) less the 2 tokens generated.
  if (absl::GetFlag(FLAGS_device) == "cuda") prompts.push_back(32768 - 2);
  for (int n : prompts) {
    std::vector<double> dt, at, shares;
    // Interleaved, so drift on the machine hits both sides alike; a warm-up first.
    for (int r = -1; r < absl::GetFlag(FLAGS_reps); ++r) {
      const std::vector<int32_t> prompt = UniquePrompt(n, 5000 + n + r);
      const double before = transfer_seconds();
      Timed x = d.Run(Request(absl::StrCat("d", n, "-", r), prompt, 2, ""));
      const double pushed = transfer_seconds() - before;
      Timed y = a.Run(Request(absl::StrCat("a", n, "-", r), prompt, 2, ""));
      if (!Ok(x, "disaggregated") || !Ok(y, "aggregated")) return false;
      if (x.tokens != y.tokens) {
        std::fprintf(stderr, "disaggregated and aggregated tokens differ at %d\n", n);
        return false;
      }
      if (r < 0) continue;
      dt.push_back(x.ttft_s);
      at.push_back(y.ttft_s);
      if (before >= 0) shares.push_back(pushed / x.ttft_s);
    }
    std::printf("%8d %10.1f %10.1f %8.3f %8s %9.2f%% %8s\n", n, 1e3 * Median(dt), 1e3 * Median(at),
                Median(dt) / Median(at), absl::GetFlag(FLAGS_device) == "cuda" ? "<=1.05" : "<=1.10",
                shares.empty() ? -1.0 : 100 * Median(shares), "<=2%");
  }
  return true;
}

// ---- tls: disaggregated TTFT with mutual TLS / plaintext ----

bool RunTls() {
  const char* tmp = std::getenv("TMPDIR");
  const std::string certs = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/hybridserve-bench-certs-", getpid());
  const std::string make =
      absl::StrCat("/usr/bin/python3 ", e2e::Runfile("tools/make_test_certs.py"), " --out ", certs);
  if (std::system(make.c_str()) != 0) {
    std::fprintf(stderr, "tls: %s failed\n", make.c_str());
    return false;
  }
  auto file = [&](const std::string& name) { return absl::StrCat(certs, "/", name); };
  auto identity = [&](const std::string& name) {
    return std::vector<std::string>{"--tls_cert=" + file(name + ".pem"), "--tls_key=" + file(name + ".key"),
                                    "--tls_ca=" + file("ca.pem")};
  };
  StackOptions secure = BenchStack(/*cachestore=*/true, /*aggregated=*/false);
  for (const std::string& f : identity("decode")) secure.decode_args.push_back(f);
  for (const std::string& f : identity("prefill")) secure.prefill_args.push_back(f);
  secure.prefill_args.push_back("--tls_allowed_peers=spiffe://hybridserve.test/decode");
  for (const std::string& f : identity("cachestore")) secure.cachestore_args.push_back(f);
  secure.cachestore_args.push_back(
      "--tls_allowed_peers=spiffe://hybridserve.test/decode,spiffe://hybridserve.test/prefill");
  auto tls = Stack::Start(secure);
  auto plain = Stack::Start(BenchStack(/*cachestore=*/true, /*aggregated=*/false));
  if (!tls.ok() || !plain.ok()) {
    std::fprintf(stderr, "stack: %s %s\n", tls.status().ToString().c_str(), plain.status().ToString().c_str());
    return false;
  }
  common::ChannelTlsOptions co;
  co.ca_file = file("ca.pem");
  co.cert_file = file("tenant_a.pem");
  co.key_file = file("tenant_a.key");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = common::NewChannel((*tls)->decode_target(), co);
  if (!channel.ok()) return false;
  Client t(*channel);
  Client p((*plain)->decode_target());
  std::printf("\n== tls: disaggregated TTFT, mutual TLS on every gRPC port / plaintext (cache on, unique prompts)\n");
  std::printf("%8s %10s %10s %8s %8s\n", "prompt", "tls_ms", "plain_ms", "ratio", "goal");
  for (int n : {1024, 8192}) {
    std::vector<double> tt, pt;
    for (int r = -1; r < absl::GetFlag(FLAGS_reps); ++r) {
      // Interleaved, a warm-up first; each side its own unique prompt (the
      // cache would otherwise answer the second).
      Timed x = t.Run(Request(absl::StrCat("t", n, "-", r), UniquePrompt(n, 9000 + n + r), 2, ""));
      Timed y = p.Run(Request(absl::StrCat("p", n, "-", r), UniquePrompt(n, 19000 + n + r), 2, ""));
      if (!Ok(x, "tls") || !Ok(y, "plaintext")) return false;
      if (x.complete.usage().cached_tokens() != 0 || y.complete.usage().cached_tokens() != 0) {
        std::fprintf(stderr, "tls: a unique prompt was found in the cache\n");
        return false;
      }
      if (r < 0) continue;
      tt.push_back(x.ttft_s);
      pt.push_back(y.ttft_s);
    }
    std::printf("%8d %10.1f %10.1f %8.3f %8s\n", n, 1e3 * Median(tt), 1e3 * Median(pt), Median(tt) / Median(pt),
                "<=1.05");
  }
  if (std::system(absl::StrCat("rm -rf ", certs).c_str()) != 0)
    std::fprintf(stderr, "tls: %s left behind\n", certs.c_str());
  return true;
}

// ---- tcp: the data plane / a raw loopback socket ----

// A sequence's state as the sender reads it: `pages` pages of `page_bytes`.
class SyntheticSource final : public transport::StateSource {
 public:
  SyntheticSource(int64_t pages, int64_t page_bytes, const std::string* data)
      : pages_(pages), page_bytes_(page_bytes), data_(data), state_(4096, 's') {}
  int64_t num_pages() const override { return pages_; }
  int64_t page_bytes() const override { return page_bytes_; }
  absl::Status ReadPage(int64_t index, absl::Span<char> out) const override {
    std::memcpy(out.data(), data_->data() + index * page_bytes_, static_cast<size_t>(page_bytes_));
    return absl::OkStatus();
  }
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return 1; }
  float first_logprob() const override { return -0.5f; }

 private:
  int64_t pages_, page_bytes_;
  const std::string* data_;
  std::string state_;
};

// Seconds to move pages * page_bytes through TcpStateSender -> TcpStateReceiver
// (frames, checksums, verdict) until Await hands back the pages.
absl::StatusOr<double> TimeDataPlane(transport::TcpStateReceiver& receiver, int64_t pages, int64_t page_bytes,
                                     const std::string& data, uint64_t id) {
  transport::Ticket ticket;
  ticket.transfer_id = id;
  ticket.endpoint = receiver.endpoint();
  ticket.n_tokens = pages;
  ticket.page_format = common::Hash128{7, 9};
  ticket.num_pages = pages;
  ticket.page_bytes = page_bytes;
  ticket.max_state_bytes = 1 << 20;
  ticket.deadline = absl::Now() + absl::Minutes(2);
  absl::Status expect = receiver.ExpectTicket(&ticket);  // its kind and secret
  if (!expect.ok()) return expect;
  SyntheticSource source(pages, page_bytes, &data);
  transport::TcpStateSender sender;
  const absl::Time start = absl::Now();
  absl::Status sent;
  std::thread send([&] { sent = sender.Send(ticket, source); });
  absl::StatusOr<transport::ReceivedState> got = receiver.Await(id);
  send.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!sent.ok()) return sent;
  if (!got.ok()) return got.status();
  if (static_cast<int64_t>(got->pages.size()) != pages ||
      got->pages[pages - 1] != absl::string_view(data).substr(static_cast<size_t>((pages - 1) * page_bytes))) {
    return absl::DataLossError("pages came back different");
  }
  return seconds;
}

// Seconds to move the same bytes over a plain loopback TCP connection: the
// sender writes page by page, the receiver reads into `sink`, a buffer that
// every run reuses (already faulted in: the best a raw socket can do).
absl::StatusOr<double> TimeRawSocket(int64_t pages, int64_t page_bytes, const std::string& data, std::string& sink) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return absl::InternalError("raw socket: cannot listen");
  }
  const int64_t total = pages * page_bytes;
  sink.front() = static_cast<char>(~data.front());  // so that a short transfer cannot pass the check
  sink.back() = static_cast<char>(~data.back());
  int64_t received = 0;
  const absl::Time start = absl::Now();
  std::thread reader([&] {
    const int fd = accept(listener, nullptr, nullptr);
    while (fd >= 0 && received < total) {
      const ssize_t n = recv(fd, sink.data() + received, static_cast<size_t>(total - received), 0);
      if (n <= 0) break;
      received += n;
    }
    if (fd >= 0) close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  for (int64_t p = 0; ok && p < pages; ++p) {
    int64_t off = 0;
    while (ok && off < page_bytes) {
      const ssize_t n = send(fd, data.data() + p * page_bytes + off, static_cast<size_t>(page_bytes - off), 0);
      ok = n > 0;
      off += n > 0 ? n : 0;
    }
  }
  close(fd);
  reader.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  close(listener);
  if (!ok || received != total || sink != data) {
    return absl::InternalError("raw socket: short transfer");
  }
  return seconds;
}

bool RunTcp() {
  auto receiver = transport::TcpStateReceiver::Create({});
  if (!receiver.ok()) {
    std::fprintf(stderr, "receiver: %s\n", receiver.status().ToString().c_str());
    return false;
  }
  std::printf(
      "\n== tcp: data plane bandwidth / raw loopback socket, 64 MiB per transfer (the bench model's 16K-token "
      "prompt)\n");
  std::printf("%10s %8s %12s %12s %8s %8s\n", "page", "pages", "plane_GB/s", "raw_GB/s", "ratio", "goal");
  const int64_t total = int64_t{64} << 20;
  std::string data(static_cast<size_t>(total), '\0');
  std::string sink(static_cast<size_t>(total), '\0');
  std::mt19937_64 rng(3);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(data.data() + i, &v, 8);
  }
  uint64_t id = 1;
  // 64 KiB: the bench model's 16-token page (2 attention layers, 2 KV heads of 128); 256 KiB and
  // 1 MiB: larger models' pages.
  for (int64_t page_bytes : {int64_t{64} << 10, int64_t{256} << 10, int64_t{1} << 20}) {
    const int64_t pages = total / page_bytes;
    std::vector<double> plane, raw;
    for (int r = -1; r < absl::GetFlag(FLAGS_reps); ++r) {
      auto p = TimeDataPlane(**receiver, pages, page_bytes, data, id++);
      auto s = TimeRawSocket(pages, page_bytes, data, sink);
      if (!p.ok() || !s.ok()) {
        std::fprintf(stderr, "tcp: %s %s\n", p.status().ToString().c_str(), s.status().ToString().c_str());
        return false;
      }
      if (r < 0) continue;
      plane.push_back(*p);
      raw.push_back(*s);
    }
    const double gb = static_cast<double>(total) / 1e9;
    std::printf("%9lldK %8lld %12.2f %12.2f %8.3f %8s\n", static_cast<long long>(page_bytes >> 10),
                static_cast<long long>(pages), gb / Median(plane), gb / Median(raw), Median(raw) / Median(plane),
                ">=0.80");
  }
  return true;
}

// ---- cache: unique-prompt throughput, cache on / off ----

bool RunCache() {
  auto on = Stack::Start(BenchStack(/*cachestore=*/true, /*aggregated=*/false));
  auto off = Stack::Start(BenchStack(/*cachestore=*/false, /*aggregated=*/false));
  if (!on.ok() || !off.ok()) {
    std::fprintf(stderr, "stack: %s %s\n", on.status().ToString().c_str(), off.status().ToString().c_str());
    return false;
  }
  Client con((*on)->decode_target());
  Client coff((*off)->decode_target());
  const int prompt_tokens = 1024, max_tokens = 16, requests = 6;
  std::printf("\n== cache: unique prompts (%d tokens, %d generated, one at a time), cache on / off\n", prompt_tokens,
              max_tokens);
  std::printf("%10s %10s %8s %8s %12s %12s\n", "on_req/s", "off_req/s", "ratio", "goal", "on_ttft_ms", "off_ttft_ms");
  std::vector<double> on_rate, off_rate, on_ttft, off_ttft;
  uint64_t seed = 90000;
  for (int r = -1; r < absl::GetFlag(FLAGS_reps); ++r) {
    double on_s = 0, off_s = 0;
    for (int i = 0; i < requests; ++i) {
      // The same unique prompt to both: the cache never hits, it only publishes.
      const std::vector<int32_t> prompt = UniquePrompt(prompt_tokens, seed++);
      Timed x = con.Run(Request(absl::StrCat("on-", seed), prompt, max_tokens, ""));
      Timed y = coff.Run(Request(absl::StrCat("off-", seed), prompt, max_tokens, ""));
      if (!Ok(x, "cache on") || !Ok(y, "cache off")) return false;
      if (x.complete.usage().cached_tokens() != 0) {
        std::fprintf(stderr, "a unique prompt hit the cache\n");
        return false;
      }
      on_s += x.total_s;
      off_s += y.total_s;
      if (r >= 0) {
        on_ttft.push_back(x.ttft_s);
        off_ttft.push_back(y.ttft_s);
      }
    }
    if (r < 0) continue;
    on_rate.push_back(requests / on_s);
    off_rate.push_back(requests / off_s);
  }
  std::printf("%10.2f %10.2f %8.3f %8s %12.1f %12.1f\n", Median(on_rate), Median(off_rate),
              Median(on_rate) / Median(off_rate), ">=0.97", 1e3 * Median(on_ttft), 1e3 * Median(off_ttft));
  // Where a request's time after its first token goes (means over every
  // request, the warm-up included): the decode steps, and with the cache
  // the turn-end publication's wait for prefill's last prompt page before
  // the final message.
  auto mean_ms = [](e2e::Process* decode, const std::string& histogram) {
    auto m = e2e::ScrapeMetrics(e2e::MetricsPort(decode));
    if (!m.ok() || (*m)[histogram + "_count"] == 0) return 0.0;
    return 1e3 * (*m)[histogram + "_sum"] / (*m)[histogram + "_count"];
  };
  std::printf("inter-token ms on / off: %.2f / %.2f; turn-end publication's wait for its parent page: %.1f ms\n",
              mean_ms((*on)->decode(), "hybridserve_inter_token_latency_seconds"),
              mean_ms((*off)->decode(), "hybridserve_inter_token_latency_seconds"),
              mean_ms((*on)->decode(), "hybridserve_decode_publish_wait_seconds"));
  return true;
}

// ---- sweep: 1..64 concurrent streams on the default model ----

bool RunSweep() {
  StackOptions o;
  o.max_batch = 64;
  o.max_waiting = 256;
  const std::string threads = absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads));
  o.decode_args = {threads, "--max_pages=16384"};
  o.prefill_args = {threads, "--max_queue=256"};
  auto stack = Stack::Start(o);
  if (!stack.ok()) {
    std::fprintf(stderr, "stack: %s\n", stack.status().ToString().c_str());
    return false;
  }
  Client client((*stack)->decode_target());
  const int per_stream = absl::GetFlag(FLAGS_sweep_requests_per_stream);
  std::printf(
      "\n== sweep: default model, N streams each sending %d requests in turn (prompt 64-320 tokens, 32 "
      "generated)\n",
      per_stream);
  std::printf("%8s %9s %10s %10s %10s %10s %8s\n", "streams", "req/s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99",
              "errors");
  std::string csv = "streams,requests_per_s,ttft_p50_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,errors,requests\n";
  for (int streams : Ints(absl::GetFlag(FLAGS_sweep_streams))) {
    absl::Mutex mu;
    std::vector<double> ttft, itl;
    int errors = 0, done = 0;
    const absl::Time start = absl::Now();
    std::vector<std::thread> threads_;
    for (int s = 0; s < streams; ++s) {
      threads_.emplace_back([&, s] {
        for (int i = 0; i < per_stream; ++i) {
          const int n = 64 + 64 * ((s + i) % 5);
          std::vector<int32_t> prompt = e2e::TextPrompt(n, s * 31 + i);
          Timed t = client.Run(Request(absl::StrCat("sw", streams, "-", s, "-", i), prompt, 32, ""));
          absl::MutexLock lock(&mu);
          ++done;
          if (!t.status.ok() || !t.completed || t.tokens.size() != 32) {
            ++errors;
            continue;
          }
          ttft.push_back(t.ttft_s);
          itl.insert(itl.end(), t.gaps_s.begin(), t.gaps_s.end());
        }
      });
    }
    for (std::thread& t : threads_) t.join();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const double rate = (done - errors) / seconds;
    std::printf("%8d %9.2f %9.1fms %9.1fms %9.2fms %9.2fms %8d\n", streams, rate, 1e3 * Quantile(ttft, 0.5),
                1e3 * Quantile(ttft, 0.99), 1e3 * Quantile(itl, 0.5), 1e3 * Quantile(itl, 0.99), errors);
    std::fflush(stdout);
    absl::StrAppend(&csv, streams, ",", rate, ",", 1e3 * Quantile(ttft, 0.5), ",", 1e3 * Quantile(ttft, 0.99), ",",
                    1e3 * Quantile(itl, 0.5), ",", 1e3 * Quantile(itl, 0.99), ",", errors, ",", done, "\n");
  }
  const std::string path = absl::GetFlag(FLAGS_sweep_csv);
  if (!path.empty()) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return false;
    }
    std::fputs(csv.c_str(), f);
    std::fclose(f);
    std::printf("wrote %s (plot: python3 bench/serving/plot_sweep.py %s sweep.png)\n", path.c_str(), path.c_str());
  }
  return true;
}

}  // namespace
}  // namespace hybridserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As the services do (the data plane's receiver runs in this process).
  hybridserve::common::TuneProcessForServing();
  using namespace hybridserve::bench;  // NOLINT: main only
  const std::vector<std::string> only = absl::StrSplit(absl::GetFlag(FLAGS_only), ',', absl::SkipEmpty());
  auto wants = [&](const char* name) { return std::find(only.begin(), only.end(), name) != only.end(); };
  const bool needs_model = wants("resume") || wants("disagg") || wants("cache") || wants("tls");
  if (needs_model && (absl::GetFlag(FLAGS_model_dir).empty() || absl::GetFlag(FLAGS_model_dir)[0] != '/')) {
    std::fprintf(stderr, "--model_dir must be the bench model's absolute path (tools/gen_model.py --preset bench)\n");
    return 2;
  }
  bool ok = true;
  if (ok && wants("tcp")) ok = RunTcp();
  if (ok && wants("resume")) ok = RunResume();
  if (ok && wants("disagg")) ok = RunDisagg();
  if (ok && wants("cache")) ok = RunCache();
  if (ok && wants("tls")) ok = RunTls();
  if (ok && wants("sweep")) ok = RunSweep();
  std::fflush(stdout);
  return ok ? 0 : 1;
}
