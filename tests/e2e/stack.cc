#include "tests/e2e/stack.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/runfiles.h"
#include "common/wait_for.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace hybridserve::e2e {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const std::string& binary, const std::vector<std::string>& args,
                            const std::string& log_path) {
  const std::string path = Runfile(binary);
  std::vector<std::string> argv_storage = {path};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", log_path));
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::string& name, const std::string& binary,
                                                        const std::vector<std::string>& args,
                                                        const std::string& ready_word, absl::Duration timeout) {
  static int counter = 0;
  const std::string log_path = absl::StrCat(TmpDir(), "/", name, "-", getpid(), "-", ++counter, ".log");
  absl::StatusOr<pid_t> spawned = Spawn(binary, args, log_path);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  std::unique_ptr<Process> p(new Process(name, pid, log_path));
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    const std::string log = ReadFile(log_path);
    for (absl::string_view line : absl::StrSplit(log, '\n')) {
      if (!absl::StartsWith(line, ready_word)) continue;
      for (absl::string_view kv : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        std::pair<std::string, std::string> f = absl::StrSplit(kv, absl::MaxSplits('=', 1));
        if (!f.second.empty()) p->fields_[f.first] = f.second;
      }
      return p;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p->reaped_ = true;
      return absl::InternalError(absl::StrCat(name, " exited before it was ready; log:\n", log));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(name, " not ready in time; log:\n", ReadFile(log_path)));
}

Process::~Process() {
  // Stopped as an operator stops it: SIGTERM, and it must exit 0 (a drain
  // that hangs, a crash on the way out, LeakSanitizer's exit code all fail).
  // A sanitizer report in its log fails the test whatever ended the process.
  std::vector<std::string> problems;
  if (!reaped_) {
    const int status = Terminate();
    if (status != 0) {
      problems.push_back(status == -1 ? "did not exit within 30 s of SIGTERM (SIGKILLed)"
                                      : absl::StrCat("exited with status ", status, " on SIGTERM"));
    }
  }
  const std::string log = this->log();
  if (const size_t at = log.find("Sanitizer"); at != std::string::npos) {
    const size_t from = log.rfind('\n', at);
    problems.push_back(
        absl::StrCat("a sanitizer report in its log:\n", log.substr(from == std::string::npos ? 0 : from + 1, 6000)));
  }
  if (problems.empty()) return;
  const std::string message =
      absl::StrCat(name_, " (pid ", pid_, ", log ", log_path_, "): ", absl::StrJoin(problems, "; "));
  if (::testing::UnitTest::GetInstance()->current_test_info() != nullptr ||
      ::testing::UnitTest::GetInstance()->current_test_suite() != nullptr) {
    ADD_FAILURE() << message;
  } else {
    std::cerr << "e2e::Process: " << message << std::endl;
  }
}

std::string Process::field(const std::string& key) const {
  auto it = fields_.find(key);
  return it == fields_.end() ? "" : it->second;
}

int Process::Terminate(absl::Duration timeout) {
  if (reaped_) return -1;
  kill(pid_, SIGTERM);
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  Kill();
  return -1;
}

void Process::Kill() {
  if (reaped_) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
}

std::string Process::log() const { return ReadFile(log_path_); }

const std::vector<ModelShape>& ModelShapes() {
  static const std::vector<ModelShape>* shapes = new std::vector<ModelShape>{
      {"Default", "models/default", 16, 64, 259, true},
      {"AttentionFirstPage8", "tests/fixtures/models/nemotron_h_e2e", 8, 32, 259, true},
      {"AttentionFirstPage64", "tests/fixtures/models/nemotron_h_e2e", 64, 32, 259, true},
      {"Mamba2Page16", "tests/fixtures/models/mamba2_e2e", 16, 16, 259, false, 2147483647u},
      {"Mamba2Page32", "tests/fixtures/models/mamba2_e2e", 32, 16, 259, false, 2147483647u},
      // Bamba: RoPE attention, gated MLPs; Granite: mixture-of-experts blocks, μP multipliers.
      {"BambaPage16", "tests/fixtures/models/bamba_e2e", 16, 32, 259, true},
      {"GraniteMoePage8", "tests/fixtures/models/granite_e2e", 8, 16, 259, true},
      // Falcon-H1: every layer keeps SSM state and KV pages (parallel Mamba2 + attention).
      {"FalconH1Page16", "tests/fixtures/models/falcon_h1_e2e", 16, 32, 259, true},
      // Nemotron-H with MoE blocks (group-limited sigmoid routing).
      {"NemotronMoePage16", "tests/fixtures/models/nemotron_h_moe_e2e", 16, 32, 259, true},
      // The same with MoE latent projections (moe_latent_size 24 at hidden 64), page 8.
      {"NemotronLatentMoePage8", "tests/fixtures/models/nemotron_h_latent_e2e", 8, 32, 259, true},
      // Zamba2: a shared attention block used by two hybrid layers, each with its own KV.
      {"Zamba2Page16", "tests/fixtures/models/zamba2_e2e", 16, 32, 259, true},
      // Bamba-9B's published config.json scaled down (tools/scale_config.py
      // --byte_vocab): the publisher's fields as written, "M*M", chunk 16; like
      // the published file, no max_position_embeddings.
      {"PublicBamba9bPage16", "tests/fixtures/models/public_bamba_9b_e2e", 16, 16, 259, true, 2147483647u},
      // Qwen3.5 (issue 50): Gated DeltaNet layers (delta-rule and conv states)
      // with gated attention every third layer, chunk 64; the dense text-only
      // form at page 16, the MoE image-text form (vision tower ignored) at page 32.
      {"Qwen35Page16", "tests/fixtures/models/qwen3_5_e2e", 16, 64, 259, true},
      {"Qwen35MoePage32", "tests/fixtures/models/qwen3_5_moe_e2e", 32, 64, 259, true},
  };
  return *shapes;
}

const ModelShape& DefaultShape() { return ModelShapes()[0]; }

void PrintTo(const ModelShape& shape, std::ostream* os) {
  *os << shape.name << " (" << shape.model_dir << ", page " << shape.page_size << ", chunk " << shape.chunk_size << ")";
}

absl::StatusOr<std::unique_ptr<Stack>> Stack::Start(const StackOptions& options) {
  std::unique_ptr<Stack> s(new Stack());
  s->options_ = options;
  if (options.shm) {
    // A directory only this user can enter, under /tmp: a socket path has at
    // most 107 bytes, and the test's own temporary directory is longer.
    char dir[] = "/tmp/hs-stack-shm-XXXXXX";
    if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp for the shm socket failed");
    s->shm_socket_ = absl::StrCat(dir, "/cachestore.sock");
  }
  if (options.cachestore) {
    absl::Status st = s->RestartCachestore();
    if (!st.ok()) return st;
  }
  if (!options.aggregated) {
    absl::Status st = s->RestartPrefill();
    if (!st.ok()) return st;
  }
  std::vector<std::string> args = {
      "--model_dir=" + Runfile(options.shape.model_dir),
      absl::StrCat("--page_size=", options.shape.page_size),
      "--address=127.0.0.1:0",
      "--metrics_address=127.0.0.1:0",
      "--threads=1",
      absl::StrCat("--max_batch=", options.max_batch),
      absl::StrCat("--max_waiting=", options.max_waiting),
      "--shutdown_grace=5s",
      options.aggregated ? std::string("--prefill=in_process") : absl::StrCat("--prefill=127.0.0.1:", s->prefill_port_),
  };
  if (options.cachestore) args.push_back(absl::StrCat("--cachestore=127.0.0.1:", s->cachestore_port_));
  if (options.cachestore && options.shm) args.push_back("--cachestore_shm_socket=" + s->shm_socket_);
  if (options.cachestore && options.bulk)
    args.push_back(absl::StrCat("--cachestore_bulk_address=127.0.0.1:", s->bulk_port_));
  args.insert(args.end(), options.decode_args.begin(), options.decode_args.end());
  auto d = Process::Start("decode", "decode/decode", args, "DECODE_READY");
  if (!d.ok()) return d.status();
  s->decode_ = *std::move(d);
  return s;
}

absl::Status Stack::RestartCachestore() {
  if (cachestore_ != nullptr) cachestore_->Kill();
  std::vector<std::string> args = {absl::StrCat("--address=127.0.0.1:", cachestore_port_),
                                   "--metrics_address=127.0.0.1:0", "--shutdown_grace=2s"};
  if (options_.shm) args.push_back("--shm_socket=" + shm_socket_);
  if (options_.bulk) args.push_back(absl::StrCat("--bulk_address=127.0.0.1:", bulk_port_));
  args.insert(args.end(), options_.cachestore_args.begin(), options_.cachestore_args.end());
  auto c = Process::Start("cachestore", "cachestore/server/cachestore", args, "CACHESTORE_READY");
  if (!c.ok()) return c.status();
  cachestore_ = *std::move(c);
  cachestore_port_ = cachestore_->port();
  if (options_.bulk) bulk_port_ = std::stoi(cachestore_->field("bulk_port"));
  return absl::OkStatus();
}

absl::Status Stack::RestartPrefill() {
  if (prefill_ != nullptr) prefill_->Kill();
  std::vector<std::string> args = {
      "--model_dir=" + Runfile(options_.shape.model_dir),
      absl::StrCat("--page_size=", options_.shape.page_size),
      absl::StrCat("--address=127.0.0.1:", prefill_port_),
      "--metrics_address=127.0.0.1:0",
      "--threads=1",
      "--shutdown_grace=5s",
  };
  if (options_.cachestore) args.push_back(absl::StrCat("--cachestore=127.0.0.1:", cachestore_port_));
  if (options_.cachestore && options_.shm) args.push_back("--cachestore_shm_socket=" + shm_socket_);
  if (options_.cachestore && options_.bulk)
    args.push_back(absl::StrCat("--cachestore_bulk_address=127.0.0.1:", bulk_port_));
  args.insert(args.end(), options_.prefill_args.begin(), options_.prefill_args.end());
  auto p = Process::Start("prefill", "prefill/prefill", args, "PREFILL_READY");
  if (!p.ok()) return p.status();
  prefill_ = *std::move(p);
  prefill_port_ = prefill_->port();
  return absl::OkStatus();
}

std::string Stack::decode_target() const { return absl::StrCat("127.0.0.1:", decode_->port()); }

v1::GenerateRequest Request(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest r;
  r.set_request_id(id);
  r.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  r.mutable_stop()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  r.mutable_stop()->set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

Generation Generate(const std::string& target, const v1::GenerateRequest& request, absl::Duration deadline) {
  static std::map<std::string, std::shared_ptr<grpc::Channel>>* channels =
      new std::map<std::string, std::shared_ptr<grpc::Channel>>();
  static absl::Mutex* mu = new absl::Mutex();
  std::shared_ptr<grpc::Channel> channel;
  {
    absl::MutexLock lock(mu);
    auto& c = (*channels)[target];
    if (c == nullptr) c = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    channel = c;
  }
  return Generate(channel, request, deadline);
}

Generation Generate(const std::shared_ptr<grpc::Channel>& channel, const v1::GenerateRequest& request,
                    absl::Duration deadline, const std::vector<std::pair<std::string, std::string>>& metadata) {
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
  Generation g;
  const absl::Time start = absl::Now();
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      if (g.chunks == 0) g.ttft = absl::Now() - start;
      ++g.chunks;
      g.tokens.insert(g.tokens.end(), response.chunk().token_ids().begin(), response.chunk().token_ids().end());
      g.logprobs.insert(g.logprobs.end(), response.chunk().logprobs().begin(), response.chunk().logprobs().end());
    } else if (response.has_complete()) {
      g.completed = true;
      g.complete = response.complete();
    }
  }
  g.status = reader->Finish();
  return g;
}

namespace {

// The body of GET http://127.0.0.1:<port>/metrics.
absl::StatusOr<std::string> ScrapeText(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to metrics port ", port));
  }
  const std::string get = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, get.data(), get.size()) != static_cast<ssize_t>(get.size())) {
    close(fd);
    return absl::UnavailableError("metrics: write failed");
  }
  std::string body;
  char buf[65536];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    body.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return body;
}

}  // namespace

absl::StatusOr<std::map<std::string, double>> ScrapeMetrics(int port) {
  absl::StatusOr<std::string> body = ScrapeText(port);
  if (!body.ok()) return body.status();
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &v)) out[std::string(line.substr(0, space))] = v;
  }
  return out;
}

double Metric(int port, const std::string& name) {
  auto m = ScrapeMetrics(port);
  if (!m.ok()) return -1;
  auto it = m->find(name);
  return it == m->end() ? -1 : it->second;
}

std::string IpcPlaneBytes(const std::string& path, const std::string& direction) {
  // prometheus-cpp writes labels in name order.
  return absl::StrCat("hybridserve_data_plane_bytes_total{direction=\"", direction, "\",path=\"", path,
                      "\",plane=\"cuda_ipc\"}");
}

std::optional<double> MetricSum(int port, const std::string& family) {
  absl::StatusOr<std::string> body = ScrapeText(port);
  if (!body.ok()) return std::nullopt;
  bool declared = false;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
      if (words.size() >= 3 && words[2] == family) declared = true;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    const absl::string_view name = line.substr(0, space);
    double v = 0;
    if ((name == family || absl::StartsWith(name, family + "{")) && absl::SimpleAtod(line.substr(space + 1), &v)) {
      sum += v;
    }
  }
  if (!declared) return std::nullopt;
  return sum;
}

namespace {

// Polls `name` on `port` until `reached` holds of it (bounded by `timeout`);
// the last value seen.
double AwaitMetricUntil(int port, const std::string& name, const std::function<bool(double)>& reached,
                        absl::Duration timeout) {
  double v = -1;
  common::WaitFor(
      [&] {
        v = Metric(port, name);
        return reached(v);
      },
      timeout);
  return v;
}

}  // namespace

double AwaitMetricAtLeast(int port, const std::string& name, double value, absl::Duration timeout) {
  return AwaitMetricUntil(
      port, name, [value](double v) { return v >= value; }, timeout);
}

double AwaitMetric(int port, const std::string& name, double value, absl::Duration timeout) {
  return AwaitMetricUntil(
      port, name, [value](double v) { return v == value; }, timeout);
}

bool HealthServing(const std::string& target, const std::string& service) {
  // No generated health stubs here: the call by name, with raw bytes. A
  // HealthCheckRequest is field 1 (service) as a string, empty for the whole
  // server; the response is field 1 (status) as a varint: 1 SERVING, 2
  // NOT_SERVING.
  grpc::GenericStub stub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  std::string message;
  if (!service.empty()) message = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  grpc::Slice request_slice(message);
  grpc::ByteBuffer request(&request_slice, 1);  // a ByteBuffer with no slice is not a message
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (!status.ok()) return false;
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes == std::string("\x08\x01", 2);
}

std::vector<int32_t> TextPrompt(int n, int seed) {
  static const char kText[] =
      "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
      "All that glitters is not gold. Where there is a will there is a way. ";
  std::vector<int32_t> out = {257};
  const int len = static_cast<int>(sizeof(kText) - 1);
  for (int i = 0; static_cast<int>(out.size()) < n; ++i) {
    out.push_back(static_cast<unsigned char>(kText[(i + seed * 17) % len]));
  }
  return out;
}

}  // namespace hybridserve::e2e
