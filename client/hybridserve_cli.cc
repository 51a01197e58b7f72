// hybridserve command-line client of the Generation service
// (proto/generation.proto).
//
//   hybridserve_cli generate --target=HOST:PORT --prompt_ids=1,2,3 --max_tokens=16 [sampling flags]
//       one request in token-id mode: streams the ids as they arrive, then the
//       finish reason and usage.
//   hybridserve_cli chat --target=HOST:PORT [--turns="first|second|third"]
//       a text chat with the byte-level default model (ids 0..255 are bytes,
//       257 <bos>, 258 <eos>): each turn's prompt is the whole conversation
//       so far plus the new line (framed "Q: <line>\nA:"), so the worker resumes it from the state the
//       previous turn left in the cache. Prints, per turn, the reply, the time
//       to first token, tokens/s, cached tokens and how the prompt was resumed.
//       Without --turns it reads lines from stdin.
//   hybridserve_cli info --target=HOST:PORT
//
// TLS: --tls_ca verifies the decode worker's certificate (and turns TLS on);
// --tls_cert/--tls_key present a client certificate (the tenant, where the
// worker takes tenants from certificates); --tls_server_name checks the
// certificate for that name instead of the target's host. --tenant_header
// sends x-hybridserve-tenant (a front proxy's assertion: only accepted from a
// connection whose certificate the worker trusts as a proxy's).
//
// Exit status: 0 when every request finished (stop or length), 1 otherwise.

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_runtime.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "proto/generation.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50050", "decode worker address (host:port)");
ABSL_FLAG(std::string, prompt_ids, "", "generate: comma-separated prompt token ids");
ABSL_FLAG(std::string, turns, "", "chat: the user's lines separated by '|'; empty: read lines from stdin");
ABSL_FLAG(int32_t, max_tokens, 64, "tokens to generate at most per request");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature (0: greedy)");
ABSL_FLAG(double, top_p, 1.0, "nucleus mass in (0, 1]");
ABSL_FLAG(int32_t, top_k, 0, "keep the k most likely tokens (0: all)");
ABSL_FLAG(int64_t, seed, -1, "sampling seed (-1: derived from the request id)");
ABSL_FLAG(std::string, cache_salt, "", "tenant salt: requests with different salts share no cache entries");
ABSL_FLAG(std::string, request_id, "", "generate: request id (default: cli-<time>)");
ABSL_FLAG(bool, logprobs, false, "generate: print each token's logprob");
ABSL_FLAG(int32_t, timeout_s, 120, "per-request deadline in seconds");
ABSL_FLAG(std::string, tls_ca, "", "CA bundle (PEM) verifying the decode worker's certificate; empty: plaintext");
ABSL_FLAG(std::string, tls_cert, "", "client certificate chain (PEM) for mutual TLS");
ABSL_FLAG(std::string, tls_key, "", "private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_server_name, "", "the name the worker's certificate must hold (default: the target's host)");
ABSL_FLAG(std::string, tenant_header, "",
          "send x-hybridserve-tenant with this value (a trusted front proxy's assertion)");

namespace hybridserve {
namespace {

constexpr int kBos = 257;
constexpr int kEos = 258;

const char* ResumeName(v1::ResumeKind k) {
  switch (k) {
    case v1::RESUME_KIND_COLD:
      return "cold";
    case v1::RESUME_KIND_GRID_CHECKPOINT:
      return "grid checkpoint";
    case v1::RESUME_KIND_EXACT_PREFIX:
      return "exact prefix";
    default:
      return "unspecified";
  }
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  v1::GenerateComplete complete;
  bool completed = false;
  double ttft_s = 0;
  double total_s = 0;
  grpc::Status status;
};

class Cli {
 public:
  explicit Cli(std::shared_ptr<grpc::Channel> channel) : stub_(v1::Generation::NewStub(std::move(channel))) {}

  // One Generate call; `on_tokens` sees each chunk as it arrives.
  template <typename OnTokens>
  Result Generate(const std::string& id, const std::vector<int32_t>& prompt, OnTokens on_tokens) {
    v1::GenerateRequest request;
    request.set_request_id(id);
    request.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
    request.mutable_stop()->set_max_tokens(static_cast<uint32_t>(absl::GetFlag(FLAGS_max_tokens)));
    v1::SamplingParams* s = request.mutable_sampling();
    s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
    s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
    s->set_top_k(absl::GetFlag(FLAGS_top_k));
    if (absl::GetFlag(FLAGS_seed) >= 0) s->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
    request.set_cache_salt(absl::GetFlag(FLAGS_cache_salt));
    request.set_return_logprobs(absl::GetFlag(FLAGS_logprobs));

    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s)));
    if (!absl::GetFlag(FLAGS_tenant_header).empty()) {
      context.AddMetadata("x-hybridserve-tenant", absl::GetFlag(FLAGS_tenant_header));
    }
    Result r;
    const absl::Time start = absl::Now();
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub_->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (response.has_chunk()) {
        if (r.tokens.empty()) r.ttft_s = absl::ToDoubleSeconds(absl::Now() - start);
        const v1::TokenChunk& c = response.chunk();
        r.tokens.insert(r.tokens.end(), c.token_ids().begin(), c.token_ids().end());
        r.logprobs.insert(r.logprobs.end(), c.logprobs().begin(), c.logprobs().end());
        on_tokens(c);
      } else if (response.has_complete()) {
        r.complete = response.complete();
        r.completed = true;
      }
    }
    r.status = reader->Finish();
    r.total_s = absl::ToDoubleSeconds(absl::Now() - start);
    return r;
  }

  grpc::Status Info(v1::ModelInfo* info) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->GetModelInfo(&context, v1::GetModelInfoRequest(), info);
  }

 private:
  std::unique_ptr<v1::Generation::Stub> stub_;
};

bool Finished(const Result& r) {
  if (!r.status.ok()) {
    std::cerr << "error: " << r.status.error_code() << " " << r.status.error_message() << "\n";
    return false;
  }
  if (!r.completed) {
    std::cerr << "error: the stream ended without a final message\n";
    return false;
  }
  const v1::FinishReason f = r.complete.finish_reason();
  if (f != v1::FINISH_REASON_STOP && f != v1::FINISH_REASON_LENGTH) {
    std::cerr << "request ended: " << v1::FinishReason_Name(f) << " " << r.complete.error_message() << "\n";
    return false;
  }
  return true;
}

std::string UsageLine(const Result& r) {
  const v1::Usage& u = r.complete.usage();
  const double decode_s = r.total_s - r.ttft_s;
  const double tps = r.tokens.size() > 1 && decode_s > 0 ? (r.tokens.size() - 1) / decode_s : 0.0;
  return absl::StrFormat(
      "ttft %.1f ms | %.1f tokens/s | prompt %u, cached %u, recomputed %u, generated %u | resume: %s | %s",
      r.ttft_s * 1e3, tps, u.prompt_tokens(), u.cached_tokens(), u.recomputed_tokens(), u.completion_tokens(),
      ResumeName(u.resume_kind()), v1::FinishReason_Name(r.complete.finish_reason()));
}

int GenerateCommand(Cli& cli) {
  std::vector<int32_t> prompt;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      std::cerr << "--prompt_ids: \"" << part << "\" is not a token id\n";
      return 2;
    }
    prompt.push_back(id);
  }
  std::string id = absl::GetFlag(FLAGS_request_id);
  if (id.empty()) id = absl::StrCat("cli-", absl::ToUnixMicros(absl::Now()));
  const bool logprobs = absl::GetFlag(FLAGS_logprobs);
  Result r = cli.Generate(id, prompt, [&](const v1::TokenChunk& c) {
    for (int i = 0; i < c.token_ids_size(); ++i) {
      std::cout << c.token_ids(i);
      if (logprobs && i < c.logprobs_size()) std::cout << absl::StrFormat("(%.4f)", c.logprobs(i));
      std::cout << " " << std::flush;
    }
  });
  std::cout << "\n";
  if (!Finished(r)) return 1;
  std::cout << UsageLine(r) << "\n";
  return 0;
}

std::string Printable(const v1::TokenChunk& c) {
  std::string s;
  for (int32_t t : c.token_ids()) {
    if (t >= 0 && t < 256) s.push_back(static_cast<char>(t));
  }
  return s;
}

int ChatCommand(Cli& cli) {
  std::vector<std::string> lines;
  if (!absl::GetFlag(FLAGS_turns).empty()) {
    lines = absl::StrSplit(absl::GetFlag(FLAGS_turns), '|');
  }
  const bool interactive = lines.empty();
  std::vector<int32_t> history = {kBos};
  const std::string session = absl::StrCat("chat-", absl::ToUnixMicros(absl::Now()));
  for (int turn = 1;; ++turn) {
    std::string line;
    if (interactive) {
      std::cout << "you> " << std::flush;
      if (!std::getline(std::cin, line)) break;
    } else {
      if (turn > static_cast<int>(lines.size())) break;
      line = lines[turn - 1];
      std::cout << "you> " << line << "\n";
    }
    // The model learned fortunes, among them "Q: ... A: ..." jokes: a turn is
    // framed as one.
    for (unsigned char ch : "Q: " + line + "\nA:") history.push_back(ch);
    std::cout << "model> " << std::flush;
    Result r = cli.Generate(absl::StrCat(session, "-", turn), history,
                            [](const v1::TokenChunk& c) { std::cout << Printable(c) << std::flush; });
    std::cout << "\n";
    if (!Finished(r)) return 1;
    std::cout << "  [turn " << turn << ": " << UsageLine(r) << "]\n";
    // The reply joins the conversation; a reply that ended with <eos> opens
    // the next exchange with <bos>, as the model was trained.
    history.insert(history.end(), r.tokens.begin(), r.tokens.end());
    if (!r.tokens.empty() && r.tokens.back() == kEos) history.push_back(kBos);
  }
  return 0;
}

int InfoCommand(Cli& cli) {
  v1::ModelInfo info;
  grpc::Status s = cli.Info(&info);
  if (!s.ok()) {
    std::cerr << "error: " << s.error_code() << " " << s.error_message() << "\n";
    return 1;
  }
  std::cout << info.DebugString();
  return 0;
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "hybridserve client.\n  hybridserve_cli generate --target=HOST:PORT --prompt_ids=1,2,3 [--max_tokens=N]\n"
      "  hybridserve_cli chat --target=HOST:PORT [--turns=\"a|b|c\"]\n  hybridserve_cli info --target=HOST:PORT");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string command = args[1];
  // Before the channel: gRPC is down, all its threads joined, when main returns.
  hybridserve::common::GrpcRuntime grpc;
  hybridserve::common::ChannelTlsOptions tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      hybridserve::common::NewChannel(absl::GetFlag(FLAGS_target), tls);
  if (!channel.ok()) {
    std::cerr << "--tls_*: " << channel.status().message() << "\n";
    return 2;
  }
  hybridserve::Cli cli(*std::move(channel));
  if (command == "generate") return hybridserve::GenerateCommand(cli);
  if (command == "chat") return hybridserve::ChatCommand(cli);
  if (command == "info") return hybridserve::InfoCommand(cli);
  std::cerr << "unknown command \"" << command << "\"\n" << absl::ProgramUsageMessage() << "\n";
  return 2;
}
