#include "worker/bootstrap.h"

#include <unistd.h>

#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/health.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/socket_io.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/ipc_communicator.h"
#include "transport/nccl_communicator.h"
#include "transport/tcp_transport.h"

namespace hybridserve::worker {
namespace {

const char* PlaneName(transport::TransportKind kind) {
  switch (kind) {
    case transport::TransportKind::kTcp:
      return "tcp";
    case transport::TransportKind::kNccl:
      return "nccl";
    case transport::TransportKind::kCudaIpc:
      return "cuda_ipc";
    case transport::TransportKind::kInProcess:
      return "in_process";
  }
  return "?";
}

// The factory of the channels a device plane (NCCL, CUDA IPC) runs over.
absl::StatusOr<std::unique_ptr<transport::CommunicatorFactory>> ChannelFactory(transport::TransportKind kind,
                                                                               engine::Model& model,
                                                                               const WorkerOptions& options) {
  if (kind == transport::TransportKind::kCudaIpc) {
    if (options.device != engine::Device::kCuda) {
      return absl::InvalidArgumentError(
          "--data_planes=cuda_ipc shares the engine's GPU memory: it needs --device=cuda");
    }
    return std::make_unique<transport::IpcCommunicatorFactory>(model.backend().peer_memory());
  }
  transport::NcclCommunicatorOptions no;
  no.device = options.device_index;
  absl::StatusOr<std::unique_ptr<transport::NcclCommunicatorFactory>> f =
      transport::NcclCommunicatorFactory::Create(no);
  if (!f.ok()) return absl::Status(f.status().code(), absl::StrCat("--data_planes=nccl: ", f.status().message()));
  return std::unique_ptr<transport::CommunicatorFactory>(*std::move(f));
}

}  // namespace

absl::StatusOr<std::unique_ptr<engine::ModelWeights>> LoadModel(const WorkerOptions& options) {
  absl::StatusOr<std::unique_ptr<engine::ModelWeights>> weights =
      engine::ModelWeights::LoadDirectory(options.model_dir);
  if (!weights.ok()) {
    return absl::Status(
        weights.status().code(),
        absl::StrCat("cannot load the model from --model_dir=", options.model_dir, ": ", weights.status().message()));
  }
  for (const std::string& what : (*weights)->config().ignored) LOG(INFO) << "model: not run: " << what;
  return weights;
}

absl::StatusOr<std::unique_ptr<engine::Model>> NewEngine(const engine::ModelWeights& weights,
                                                         const WorkerOptions& options, int64_t max_sequences) {
  engine::ModelOptions mo;
  mo.device = options.device;
  mo.device_index = options.device_index;
  mo.num_threads = options.threads;
  mo.page_size = options.page_size;
  mo.max_pages = options.max_pages;
  mo.max_sequences = max_sequences;
  absl::StatusOr<std::unique_ptr<engine::Model>> model = engine::Model::Create(weights.config(), weights, mo);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat("cannot start the engine: ", model.status().message()));
  }
  return model;
}

absl::StatusOr<std::unique_ptr<common::MetricsExposer>> StartMetrics(const WorkerOptions& options,
                                                                     std::shared_ptr<prometheus::Registry> registry,
                                                                     std::function<void()> before_scrape) {
  if (options.metrics_address.empty()) return std::unique_ptr<common::MetricsExposer>();
  absl::StatusOr<std::unique_ptr<common::MetricsExposer>> exposer =
      common::MetricsExposer::Create(options.metrics_address, std::move(registry), std::move(before_scrape));
  if (!exposer.ok()) {
    return absl::Status(exposer.status().code(), absl::StrCat("--metrics_address: ", exposer.status().message()));
  }
  return exposer;
}

absl::StatusOr<std::vector<transport::TransportKind>> ParseDataPlanes(absl::string_view flag) {
  std::vector<transport::TransportKind> planes;
  for (absl::string_view name : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    transport::TransportKind kind;
    if (name == "tcp") {
      kind = transport::TransportKind::kTcp;
    } else if (name == "nccl") {
      kind = transport::TransportKind::kNccl;
    } else if (name == "cuda_ipc") {
      kind = transport::TransportKind::kCudaIpc;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_planes: unknown plane \"", name, "\" (expected tcp, nccl, cuda_ipc)"));
    }
    if (std::find(planes.begin(), planes.end(), kind) == planes.end()) planes.push_back(kind);
  }
  if (planes.empty()) return absl::InvalidArgumentError("--data_planes names no plane");
  return planes;
}

SenderPlanes::SenderPlanes() : routing_(std::make_unique<transport::RoutingStateSender>()) {}
SenderPlanes::~SenderPlanes() = default;

absl::StatusOr<std::unique_ptr<SenderPlanes>> SenderPlanes::Open(const std::vector<transport::TransportKind>& planes,
                                                                 engine::Model& model, const WorkerOptions& options) {
  std::unique_ptr<SenderPlanes> out(new SenderPlanes());
  for (transport::TransportKind kind : planes) {
    std::unique_ptr<transport::StateSender> sender;
    if (kind == transport::TransportKind::kTcp) {
      sender = std::make_unique<transport::TcpStateSender>();
    } else {
      ASSIGN_OR_RETURN(std::unique_ptr<transport::CommunicatorFactory> factory, ChannelFactory(kind, model, options));
      sender = std::make_unique<transport::ChannelStateSender>(*factory);
      out->factories_.push_back(std::move(factory));
    }
    out->routing_->Route(kind, sender.get());
    out->senders_.push_back(std::move(sender));
  }
  return out;
}

transport::IpcTraffic SenderPlanes::ipc_traffic() const {
  transport::IpcTraffic sum;
  for (const auto& factory : factories_) {
    const transport::IpcTraffic t = transport::TrafficOf(*factory);
    sum.sent_by_device_copy += t.sent_by_device_copy;
    sum.sent_by_socket += t.sent_by_socket;
    sum.received_by_device_copy += t.received_by_device_copy;
    sum.received_by_socket += t.received_by_socket;
  }
  return sum;
}

transport::IpcTraffic ReceiverPlane::ipc_traffic() const {
  return factory_ != nullptr ? transport::TrafficOf(*factory_) : transport::IpcTraffic();
}

ReceiverPlane::~ReceiverPlane() {
  receiver_.reset();  // before the channels' factory
}

absl::StatusOr<std::unique_ptr<ReceiverPlane>> ReceiverPlane::Open(const ReceiverPlaneOptions& plane,
                                                                   engine::Model& model, const WorkerOptions& options) {
  std::unique_ptr<ReceiverPlane> out(new ReceiverPlane());
  if (plane.kind == transport::TransportKind::kTcp) {
    transport::TcpReceiverOptions ro;
    ro.address = plane.data_address;
    absl::StatusOr<std::unique_ptr<transport::TcpStateReceiver>> tcp = transport::TcpStateReceiver::Create(ro);
    if (!tcp.ok()) {
      return absl::Status(tcp.status().code(),
                          absl::StrCat("data plane: cannot listen on ", ro.address, ": ", tcp.status().message()));
    }
    out->listening_ = (*tcp)->endpoint();
    std::string host, port;
    RETURN_IF_ERROR(common::SplitHostPort(out->listening_, &host, &port));
    std::string advertised = plane.advertise_host;
    if (advertised.empty()) advertised = (host == "0.0.0.0" || host == "::") ? "127.0.0.1" : host;
    out->endpoint_ = absl::StrCat(advertised, ":", port);
    out->receiver_ = *std::move(tcp);
    return out;
  }
  if (plane.kind != transport::TransportKind::kNccl && plane.kind != transport::TransportKind::kCudaIpc) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data_planes: a decode worker receives over tcp, nccl or cuda_ipc, not ", PlaneName(plane.kind)));
  }
  ASSIGN_OR_RETURN(out->factory_, ChannelFactory(plane.kind, model, options));
  // One channel per prefill/decode pair: the ticket's channel id names the
  // channel to the one prefill worker, made here and joined there.
  transport::ChannelReceiverOptions ro;
  ro.default_peer = plane.peer;
  ro.kind = plane.kind;
  absl::StatusOr<std::unique_ptr<transport::ChannelStateReceiver>> receiver =
      transport::ChannelStateReceiver::Create(*out->factory_, ro);
  if (!receiver.ok()) {
    return absl::Status(receiver.status().code(), absl::StrCat("--data_planes: ", receiver.status().message()));
  }
  out->receiver_ = *std::move(receiver);
  // Names this worker to the prefill side, which keeps one channel per
  // receiver endpoint: unique per process (--address may be 0.0.0.0:port on
  // every decode host, and two workers sharing a name would take each other's
  // channel).
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  out->endpoint_ = absl::StrCat(PlaneName(plane.kind), "/", host, "/", getpid(), "/",
                                absl::Hex(std::random_device()() ^ (uint64_t{std::random_device()()} << 32)));
  return out;
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const std::string& address,
                                                              const std::vector<grpc::Service*>& services,
                                                              const common::TlsFlags& tls,
                                                              const common::ConnectionAge& connection_age,
                                                              int max_threads) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = common::NewServerCredentials(tls.server);
  if (!credentials.ok()) {
    return absl::Status(credentials.status().code(), absl::StrCat("--tls_*: ", credentials.status().message()));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would
  // share it silently instead of failing with "port in use".
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  common::ApplyConnectionAge(connection_age, builder);
  std::unique_ptr<GrpcServer> out(new GrpcServer());
  builder.AddListeningPort(address, *credentials, &out->port_);
  for (grpc::Service* service : services) builder.RegisterService(service);
  grpc::ResourceQuota quota("worker");
  if (max_threads > 0) {
    quota.SetMaxThreads(max_threads);
    builder.SetResourceQuota(quota);
  }
  out->server_ = builder.BuildAndStart();
  if (out->server_ == nullptr || out->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --address=", address, " (port in use?)"));
  }
  out->server_->GetHealthCheckService()->SetServingStatus(true);
  out->server_->GetHealthCheckService()->SetServingStatus(common::kLivenessHealthService, true);
  if (!tls.health_address.empty()) {
    ASSIGN_OR_RETURN(out->health_, common::HealthServer::Start(tls.health_address));
  }
  if (!tls.server.enabled()) {
    LOG(WARNING) << "no TLS (--tls_cert): any process that reaches --address=" << address << " can call this server";
  } else if (tls.health_address.empty()) {
    LOG(INFO) << "TLS on --address; no --health_address: probes must present a client certificate";
  }
  return out;
}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) {
    server_->Shutdown();
    server_->Wait();
  }
}

void GrpcServer::SetReady(bool ready) {
  absl::MutexLock lock(&ready_mu_);
  if (draining_) return;
  server_->GetHealthCheckService()->SetServingStatus("", ready);
  if (health_ != nullptr) health_->SetServing("", ready);
}

void GrpcServer::ServeUntilSignal(absl::Duration grace, const DrainSteps& steps) {
  const int sig = common::WaitForTerminationSignal();
  LOG(INFO) << "signal " << sig << ": draining";
  // Not ready any more; still alive (common/health.h).
  {
    absl::MutexLock lock(&ready_mu_);
    draining_ = true;
    server_->GetHealthCheckService()->SetServingStatus("", false);
    if (health_ != nullptr) health_->SetServing("", false);
  }
  if (steps.refuse) steps.refuse();
  const absl::Time grace_end = absl::Now() + grace;
  if (steps.settle) steps.settle(grace_end);
  server_->Shutdown(absl::ToChronoTime(grace_end));
  if (steps.before_wait) steps.before_wait();
  server_->Wait();
  server_.reset();
  health_.reset();
}

}  // namespace hybridserve::worker
