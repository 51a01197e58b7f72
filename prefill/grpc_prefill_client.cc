#include "prefill/grpc_prefill_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/socket_io.h"
#include "prefill/prefill_proto.h"

namespace hybridserve::prefill {

struct GrpcPrefillClient::Worker {
  std::string address;
  std::unique_ptr<v1::Prefill::Stub> stub;
  int64_t outstanding = 0;                       // guarded by the client's mu_
  absl::Time skip_until = absl::InfinitePast();  // guarded by the client's mu_
  bool resolved = true;                          // still in the latest resolution
};

namespace {

bool Retriable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kResourceExhausted;
}

bool WorkerFault(absl::StatusCode code) { return Retriable(code) || code == absl::StatusCode::kDeadlineExceeded; }

std::chrono::system_clock::time_point ToChrono(absl::Time t) { return absl::ToChronoTime(t); }

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcPrefillClient>> GrpcPrefillClient::Create(const PrefillPoolOptions& options) {
  if (options.targets.empty()) return absl::InvalidArgumentError("no prefill worker given");
  for (const std::string& t : options.targets) {
    std::string host, port;
    absl::Status split = common::SplitHostPort(t, &host, &port);
    if (!split.ok()) return absl::InvalidArgumentError(absl::StrCat("prefill target \"", t, "\": ", split.message()));
  }
  if (options.resolve_interval <= absl::ZeroDuration() || options.failure_backoff < absl::ZeroDuration() ||
      options.max_attempts < 1 || options.unavailable_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "prefill pool: resolve_interval > 0, failure_backoff >= 0, max_attempts >= 1, unavailable_wait >= 0");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = common::NewChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<GrpcPrefillClient> client(new GrpcPrefillClient(options, *std::move(credentials)));
  client->Resolve();
  client->resolver_ = std::thread([p = client.get()] { p->ResolveLoop(); });
  return client;
}

GrpcPrefillClient::GrpcPrefillClient(const PrefillPoolOptions& options,
                                     std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(options), credentials_(std::move(credentials)) {}

GrpcPrefillClient::~GrpcPrefillClient() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (resolver_.joinable()) resolver_.join();
}

void GrpcPrefillClient::ResolveLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.resolve_interval);
      if (stop_) return;
    }
    Resolve();
  }
}

void GrpcPrefillClient::Resolve() {
  std::vector<std::string> addresses;
  std::vector<std::string> hosts;  // hosts[i]: the target host addresses[i] was resolved from
  bool complete = true;
  for (const std::string& t : options_.targets) {
    std::string host, port;
    if (!common::SplitHostPort(t, &host, &port).ok()) continue;
    std::vector<std::string> found = common::ResolveHost(host, port);
    if (found.empty()) {
      complete = false;
      LOG(WARNING) << "prefill target " << t << " does not resolve; keeping its previous addresses";
    }
    for (std::string& a : found) {
      if (std::find(addresses.begin(), addresses.end(), a) == addresses.end()) {
        addresses.push_back(std::move(a));
        hosts.push_back(host);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < addresses.size(); ++i) {
    const std::string& a = addresses[i];
    auto it = std::find_if(workers_.begin(), workers_.end(), [&](const auto& w) { return w->address == a; });
    if (it != workers_.end()) {
      (*it)->resolved = true;
      continue;
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    auto w = std::make_shared<Worker>();
    w->address = a;
    // The server certificate is verified against the target's host (the
    // Service name), not the address dialled (a pod IP).
    common::ChannelTlsOptions tls = options_.tls;
    if (tls.enabled() && tls.server_name.empty()) tls.server_name = hosts[i];
    common::AddChannelArguments(tls, &args);
    w->stub = v1::Prefill::NewStub(grpc::CreateCustomChannel(a, credentials_, args));
    workers_.push_back(std::move(w));
    LOG(INFO) << "prefill worker " << a << " joins the pool";
  }
  // A name that failed to resolve keeps what it had; otherwise workers that
  // left the resolution leave the pool (calls in flight keep theirs alive).
  if (!complete) return;
  workers_.erase(std::remove_if(workers_.begin(), workers_.end(),
                                [&](const auto& w) {
                                  const bool gone =
                                      std::find(addresses.begin(), addresses.end(), w->address) == addresses.end();
                                  if (gone) LOG(INFO) << "prefill worker " << w->address << " leaves the pool";
                                  return gone;
                                }),
                 workers_.end());
}

std::shared_ptr<GrpcPrefillClient::Worker> GrpcPrefillClient::Pick(const std::vector<std::shared_ptr<Worker>>& tried,
                                                                   bool count) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  std::shared_ptr<Worker> best;
  bool best_skipped = true;
  const size_t n = workers_.size();
  for (size_t k = 0; k < n; ++k) {
    const std::shared_ptr<Worker>& w = workers_[(turn_ + k) % n];
    if (std::find(tried.begin(), tried.end(), w) != tried.end()) continue;
    const bool skipped = w->skip_until > now;
    const bool better =
        best == nullptr || (best_skipped && !skipped) ||
        (skipped == best_skipped && (skipped ? w->skip_until < best->skip_until : w->outstanding < best->outstanding));
    if (better) {
      best = w;
      best_skipped = skipped;
    }
  }
  if (!count) return best;
  ++turn_;
  if (best != nullptr) ++best->outstanding;
  return best;
}

absl::StatusOr<PrefillOutcome> GrpcPrefillClient::Prefill(const PrefillRequest& call) {
  v1::PrefillRequest request;
  RequestToProto(call, &request);
  const absl::Time deadline = call.ticket.deadline;

  common::Cancellation* const cancellation = call.cancellation.get();
  auto cancelled = [cancellation] { return cancellation != nullptr && cancellation->cancelled(); };
  const absl::Status kCancelled = absl::CancelledError("the request ended before its prefill");
  std::vector<std::shared_ptr<Worker>> tried;
  absl::Status last = absl::UnavailableError("no prefill worker is known (none of the targets resolved)");
  absl::Duration busy_backoff = absl::Milliseconds(5);
  absl::Time unavailable_since = absl::InfiniteFuture();
  int attempt = 0;
  while (absl::Now() < deadline) {
    if (cancelled()) return kCancelled;
    if (attempt == options_.max_attempts || (attempt > 0 && Pick(tried, /*count=*/false) == nullptr)) {
      // Every worker tried so far answered. RESOURCE_EXHAUSTED: they are busy,
      // which is no fault of this admitted request; it waits for room (its
      // deadline, or its cancellation, ends the wait) and tries again.
      // UNAVAILABLE: unreachable, perhaps restarting; the same, for at most
      // unavailable_wait.
      if (last.code() == absl::StatusCode::kUnavailable) {
        if (unavailable_since == absl::InfiniteFuture()) unavailable_since = absl::Now();
        if (call.skip_unavailable_wait || absl::Now() - unavailable_since >= options_.unavailable_wait) break;
      } else if (last.code() != absl::StatusCode::kResourceExhausted) {
        break;
      }
      const absl::Duration pause = std::min(busy_backoff, deadline - absl::Now());
      if (cancellation != nullptr ? cancellation->WaitFor(pause) : (absl::SleepFor(pause), false)) return kCancelled;
      busy_backoff = std::min(2 * busy_backoff, absl::Milliseconds(100));
      tried.clear();
      attempt = 0;
      continue;
    }
    std::shared_ptr<Worker> w = Pick(tried, /*count=*/true);
    if (w == nullptr) break;
    ++attempt;
    tried.push_back(w);
    grpc::ClientContext context;
    if (deadline != absl::InfiniteFuture()) context.set_deadline(ToChrono(deadline));
    if (cancellation != nullptr) cancellation->OnCancel([&context] { context.TryCancel(); });
    v1::PrefillResponse response;
    const grpc::Status status = w->stub->Prefill(&context, request, &response);
    if (cancellation != nullptr) cancellation->OnCancel(nullptr);
    {
      absl::MutexLock lock(&mu_);
      --w->outstanding;
      if (!status.ok() && WorkerFault(common::FromGrpcStatusCode(status.error_code()))) {
        w->skip_until = absl::Now() + options_.failure_backoff;
      }
    }
    if (status.ok()) {
      return OutcomeFromProto(response);
    }
    if (cancelled()) return kCancelled;
    last = common::FromGrpcStatus(status);
    last = absl::Status(last.code(), absl::StrCat("prefill worker ", w->address, ": ", last.message()));
    if (!Retriable(last.code())) break;
  }
  return last;
}

std::vector<GrpcPrefillClient::WorkerState> GrpcPrefillClient::workers() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  std::vector<WorkerState> out;
  for (const auto& w : workers_) out.push_back(WorkerState{w->address, w->outstanding, w->skip_until > now});
  return out;
}

}  // namespace hybridserve::prefill
