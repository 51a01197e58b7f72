#ifndef HYBRIDSERVE_TESTS_E2E_STACK_H_
#define HYBRIDSERVE_TESTS_E2E_STACK_H_

// End-to-end test harness: the real cachestore, prefill and decode binaries
// as child processes on loopback ports (each picks its own port and prints a
// READY line), a gRPC client of the Generation service, and a scraper of the
// Prometheus endpoints.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/runfiles.h"
#include "grpcpp/grpcpp.h"
#include "proto/generation.grpc.pb.h"

namespace hybridserve::e2e {

// The path of a runfile of this test (common/runfiles.h).
using common::Runfile;

// Starts `binary` (a runfile path) with `args`, its stdout and stderr written
// to `log_path`; the child's pid.
absl::StatusOr<pid_t> Spawn(const std::string& binary, const std::vector<std::string>& args,
                            const std::string& log_path);

// A child process whose stdout+stderr go to a log file.
class Process {
 public:
  // Starts `binary` (a runfile path) with `args`; waits up to `timeout` for a
  // line starting with `ready_word` and parses its key=value fields.
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::string& name, const std::string& binary,
                                                        const std::vector<std::string>& args,
                                                        const std::string& ready_word,
                                                        absl::Duration timeout = absl::Seconds(60));
  // Still running: SIGTERM, and a failure of the running test unless it
  // exits 0 within 30 s. A "Sanitizer" report in its log fails the test
  // whatever ended it (outside a test: printed to stderr).
  ~Process();

  // The READY line's field (e.g. "port"), or "".
  std::string field(const std::string& key) const;
  int port() const { return std::stoi(field("port")); }
  pid_t pid() const { return pid_; }
  // SIGTERM, then waits up to `timeout`; the exit status (-1: had to SIGKILL).
  int Terminate(absl::Duration timeout = absl::Seconds(30));
  void Kill();  // SIGKILL and reap
  std::string log() const;

 private:
  Process(std::string name, pid_t pid, std::string log_path)
      : name_(std::move(name)), pid_(pid), log_path_(std::move(log_path)) {}
  std::string name_;
  pid_t pid_;
  std::string log_path_;
  std::map<std::string, std::string> fields_;
  bool reaped_ = false;
};

// A model the end-to-end suite runs, with the page size its workers use.
// Every shape the engine supports appears: the embedded default model (a
// Nemotron-H hybrid, page 16 dividing chunk 64), a hybrid whose first layer
// is attention with a page dividing its chunk (8 of 32) and one that does not
// (64 of 32), and a pure Mamba2 model (no attention layer) with page = chunk
// (16) and a page that does not divide the chunk (32 of 16). Shapes of new
// families join this list.
struct ModelShape {
  std::string name;       // a gtest parameter name
  std::string model_dir;  // runfile path
  int page_size = 0;      // --page_size of both workers
  int chunk_size = 0;     // the model's, as config.json states it
  int vocab_size = 0;
  bool attention = true;  // has attention layers (KV pages with bytes)
  // GetModelInfo's max_context_tokens: config.json's max_position_embeddings
  // (8192 in the generated e2e models), unbounded without one.
  uint32_t max_context = 8192;
};
const std::vector<ModelShape>& ModelShapes();
// gtest prints a shape by its name.
void PrintTo(const ModelShape& shape, std::ostream* os);
// The default model's shape (ModelShapes()[0]).
const ModelShape& DefaultShape();

// What the tests start.
struct StackOptions {
  ModelShape shape = DefaultShape();
  bool cachestore = true;
  bool aggregated = false;  // decode runs prefill in process
  int64_t max_batch = 8;
  int64_t max_waiting = 32;
  std::vector<std::string> decode_args;   // extra flags
  std::vector<std::string> prefill_args;  // extra flags
  std::vector<std::string> cachestore_args = {"--page_budget_mib=256", "--state_budget_mib=256"};
  // Reads by shared memory: the cachestore gets --shm_socket (in a private
  // directory of the stack's), prefill and decode --cachestore_shm_socket
  // (so decode reads prompts' cached pages itself: --read_history_pages).
  bool shm = false;
  // Reads over the bulk port: the cachestore gets --bulk_address, prefill and
  // decode --cachestore_bulk_address.
  bool bulk = false;
};

class Stack {
 public:
  static absl::StatusOr<std::unique_ptr<Stack>> Start(const StackOptions& options);

  std::string decode_target() const;
  Process* cachestore() { return cachestore_.get(); }
  Process* prefill() { return prefill_.get(); }
  Process* decode() { return decode_.get(); }
  // Starts a (new) prefill process, e.g. after a kill; decode keeps its
  // target, so the new one must take the old port.
  absl::Status RestartPrefill();
  absl::Status RestartCachestore();

  std::unique_ptr<Process> cachestore_, prefill_, decode_;
  StackOptions options_;
  int cachestore_port_ = 0;
  int prefill_port_ = 0;
  int bulk_port_ = 0;       // with options_.bulk: the cachestore's bulk port (kept across restarts)
  std::string shm_socket_;  // with options_.shm: the socket's path
};

// One Generate call's outcome as a client sees it.
struct Generation {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool completed = false;
  v1::GenerateComplete complete;
  int chunks = 0;
  absl::Duration ttft = absl::ZeroDuration();  // from the call's start to its first chunk
};

v1::GenerateRequest Request(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens);
Generation Generate(const std::string& target, const v1::GenerateRequest& request,
                    absl::Duration deadline = absl::Seconds(60));
// The same over `channel` (e.g. a TLS one), with `metadata` on the call.
Generation Generate(const std::shared_ptr<grpc::Channel>& channel, const v1::GenerateRequest& request,
                    absl::Duration deadline = absl::Seconds(60),
                    const std::vector<std::pair<std::string, std::string>>& metadata = {});

// GET http://127.0.0.1:<port>/metrics; the value of each sample line
// ("name{labels}" -> value).
absl::StatusOr<std::map<std::string, double>> ScrapeMetrics(int port);
// The value of sample `name` on `port`, or -1 when it cannot be read.
double Metric(int port, const std::string& name);
// The sample name of hybridserve_data_plane_bytes_total (worker/data_plane_metrics.h)
// for the CUDA IPC plane's `path` ("device_copy", "socket") and `direction`
// ("sent", "received"), as Metric() takes it.
std::string IpcPlaneBytes(const std::string& path, const std::string& direction);
// The sum of every sample of `family` on `port` whatever its labels, or
// nullopt when the port cannot be read or the scrape does not declare the
// family (no "# TYPE <family>" line: a misspelt or renamed family, or a
// labelled one with no series yet). The services create their failure-reason
// series at 0 (common::DeclareFailureReasons), so EXPECT_EQ(MetricSum(...), 0)
// holds only of a family that exists and counted nothing.
std::optional<double> MetricSum(int port, const std::string& family);
// Polls until `name` on `port` equals `value` (bounded by `timeout`); the
// last value seen.
double AwaitMetric(int port, const std::string& name, double value, absl::Duration timeout = absl::Seconds(15));

// Polls until `name` on `port` is at least `value` (bounded by `timeout`);
// the last value seen.
double AwaitMetricAtLeast(int port, const std::string& name, double value, absl::Duration timeout = absl::Seconds(30));
// The metrics port a process's READY line names.
inline int MetricsPort(Process* p) { return std::stoi(p->field("metrics_port")); }

// grpc.health.v1.Health/Check of `target` (the whole server): true while it
// answers SERVING; false once it answers NOT_SERVING or cannot be reached.
bool HealthServing(const std::string& target, const std::string& service = "");

// A deterministic prompt of `n` byte tokens starting with <bos>.
std::vector<int32_t> TextPrompt(int n, int seed);

}  // namespace hybridserve::e2e

#endif  // HYBRIDSERVE_TESTS_E2E_STACK_H_
