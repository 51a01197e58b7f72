// The prefill worker binary: one engine behind the Prefill gRPC service, a
// cachestore client, and the TCP data plane's sender. Flags are read here only.

#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cachestore/client.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "engine/backend_registry.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prefill/metrics.h"
#include "prefill/prefill_worker.h"
#include "prefill/service.h"
#include "transport/ipc_communicator.h"
#include "transport/nccl_communicator.h"
#include "transport/channel_sender.h"
#include "transport/routing_sender.h"
#include "transport/tcp_transport.h"

ABSL_FLAG(std::string, model_dir, "models/default", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, address, "0.0.0.0:50061", "gRPC listen address (host:port; port 0 picks one)");
ABSL_FLAG(std::string, metrics_address, "", "Prometheus /metrics address (host:port); empty disables");
ABSL_FLAG(std::string, cachestore, "", "cachestore gRPC address (host:port); empty: no cache");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, data_planes, "tcp",
          "data planes served, comma-separated: tcp, nccl (NCCL send/recv to decode workers on other GPUs), "
          "cuda_ipc (decode workers on this GPU; needs --device=cuda); each ticket names its own");
ABSL_FLAG(int32_t, device_index, 0, "the CUDA device of the engine and of NCCL channels");
ABSL_FLAG(int32_t, threads, 2, "kernel threads (CPU backend)");
ABSL_FLAG(int64_t, page_size, 0, "KV page size in tokens; 0: min(16, chunk_size)");
ABSL_FLAG(int64_t, max_pages, 4096, "KV pages of the engine");
ABSL_FLAG(int64_t, max_queue, 16, "requests waiting for the engine; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, cache_timeout, absl::Seconds(2), "per-call deadline of cachestore calls");
ABSL_FLAG(int64_t, cache_fetch_parallelism, 3,
          "cachestore calls in flight while resuming a prompt: the state's Get and N-1 GetMany streams of its pages "
          "(>= 1)");
ABSL_FLAG(absl::Duration, cache_failure_backoff, absl::Seconds(1),
          "after a cache call times out (a hung cachestore), lookups and publications skip it for this long");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10), "time in-flight requests get on SIGTERM");

namespace hybridserve {
namespace {

int Run() {
  if (absl::GetFlag(FLAGS_cache_fetch_parallelism) < 1) {
    LOG(ERROR) << "--cache_fetch_parallelism must be at least 1, got " << absl::GetFlag(FLAGS_cache_fetch_parallelism);
    return 1;
  }
  if (absl::GetFlag(FLAGS_cache_failure_backoff) < absl::ZeroDuration()) {
    LOG(ERROR) << "--cache_failure_backoff must be >= 0, got " << absl::GetFlag(FLAGS_cache_failure_backoff);
    return 1;
  }
  auto weights = engine::ModelWeights::LoadDirectory(absl::GetFlag(FLAGS_model_dir));
  if (!weights.ok()) {
    LOG(ERROR) << "cannot load the model from " << absl::GetFlag(FLAGS_model_dir) << ": " << weights.status();
    return 1;
  }
  auto device = engine::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    LOG(ERROR) << device.status();
    return 1;
  }
  engine::ModelOptions mo;
  mo.device = *device;
  mo.device_index = absl::GetFlag(FLAGS_device_index);
  mo.num_threads = absl::GetFlag(FLAGS_threads);
  mo.page_size = absl::GetFlag(FLAGS_page_size);
  mo.max_pages = absl::GetFlag(FLAGS_max_pages);
  mo.max_sequences = 1;  // one request in the engine at a time
  auto model = engine::Model::Create((*weights)->config(), **weights, mo);
  if (!model.ok()) {
    LOG(ERROR) << "cannot start the engine: " << model.status();
    return 1;
  }
  std::unique_ptr<cachestore::CacheStoreClient> cache;
  if (!absl::GetFlag(FLAGS_cachestore).empty()) {
    cachestore::ClientOptions co;
    co.timeout = absl::GetFlag(FLAGS_cache_timeout);
    auto c = cachestore::CacheStoreClient::Create(absl::GetFlag(FLAGS_cachestore), co);
    if (!c.ok()) {
      LOG(ERROR) << c.status();
      return 1;
    }
    cache = *std::move(c);
  }
  // Data planes: each decode worker's ticket names its own (TransportKind).
  transport::RoutingStateSender sender;
  std::unique_ptr<transport::TcpStateSender> tcp;
  std::unique_ptr<transport::NcclCommunicatorFactory> nccl_factory;
  std::unique_ptr<transport::ChannelStateSender> nccl;
  std::unique_ptr<transport::IpcCommunicatorFactory> ipc_factory;
  std::unique_ptr<transport::ChannelStateSender> ipc;
  for (absl::string_view plane : absl::StrSplit(absl::GetFlag(FLAGS_data_planes), ',', absl::SkipWhitespace())) {
    if (plane == "tcp") {
      tcp = std::make_unique<transport::TcpStateSender>();
      sender.Route(transport::TransportKind::kTcp, tcp.get());
    } else if (plane == "nccl") {
      transport::NcclCommunicatorOptions no;
      no.device = absl::GetFlag(FLAGS_device_index);
      auto f = transport::NcclCommunicatorFactory::Create(no);
      if (!f.ok()) {
        LOG(ERROR) << "--data_planes=nccl: " << f.status();
        return 1;
      }
      nccl_factory = *std::move(f);
      nccl = std::make_unique<transport::ChannelStateSender>(*nccl_factory);
      sender.Route(transport::TransportKind::kNccl, nccl.get());
    } else if (plane == "cuda_ipc") {
      if (*device != engine::Device::kCuda) {
        LOG(ERROR) << "--data_planes=cuda_ipc shares the engine's GPU memory: it needs --device=cuda";
        return 1;
      }
      ipc_factory = std::make_unique<transport::IpcCommunicatorFactory>((*model)->backend());
      ipc = std::make_unique<transport::ChannelStateSender>(*ipc_factory);
      sender.Route(transport::TransportKind::kCudaIpc, ipc.get());
    } else {
      LOG(ERROR) << "--data_planes: unknown plane \"" << plane << "\" (expected tcp, nccl, cuda_ipc)";
      return 1;
    }
  }
  if (tcp == nullptr && nccl == nullptr && ipc == nullptr) {
    LOG(ERROR) << "--data_planes names no plane";
    return 1;
  }
  prefill::PrefillWorkerOptions wo;
  wo.async_publication = true;  // answer decode right after the push; publish behind it
  wo.fetch_parallelism = absl::GetFlag(FLAGS_cache_fetch_parallelism);
  wo.cache_failure_backoff = absl::GetFlag(FLAGS_cache_failure_backoff);
  prefill::PrefillWorker worker(**model, (*weights)->fingerprint(), cache.get(), sender, wo);
  auto registry = std::make_shared<prometheus::Registry>();
  prefill::PrefillMetrics metrics(*registry);
  metrics.SetFree(worker.free_pages(), worker.free_slots());
  std::unique_ptr<common::MetricsExposer> exposer;
  if (!absl::GetFlag(FLAGS_metrics_address).empty()) {
    // The worker's cache counters move behind the answers too (publications
    // run on its publisher thread): each scrape brings them up to date.
    auto e = common::MetricsExposer::Create(absl::GetFlag(FLAGS_metrics_address), registry,
                                            [&] { metrics.SyncCounters(worker.counters()); });
    if (!e.ok()) {
      LOG(ERROR) << "metrics: " << e.status();
      return 1;
    }
    exposer = *std::move(e);
  }
  prefill::PrefillService service(worker, absl::GetFlag(FLAGS_max_queue), &metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would
  // share it silently instead of failing with "port in use".
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_address), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << absl::GetFlag(FLAGS_address) << " (port in use?)";
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  if (cache != nullptr && !cache->Stats().ok()) {
    LOG(WARNING) << "the cachestore " << absl::GetFlag(FLAGS_cachestore)
                 << " is unreachable: prompts are prefilled in full until it is up";
  }
  LOG(INFO) << "prefill serving " << (*weights)->config().LayerPattern() << " on port " << port
            << (cache ? absl::StrCat(", cachestore ", absl::GetFlag(FLAGS_cachestore)) : ", no cache")
            << (exposer ? absl::StrCat(", metrics on port ", exposer->port()) : std::string());
  std::cout << "PREFILL_READY port=" << port << (exposer ? absl::StrCat(" metrics_port=", exposer->port()) : "")
            << std::endl;

  const int sig = common::WaitForTerminationSignal();
  LOG(INFO) << "signal " << sig << ": draining";
  server->GetHealthCheckService()->SetServingStatus(false);
  service.Drain();
  server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_shutdown_grace)));
  server->Wait();
  if (!worker.WaitForPublications(absl::GetFlag(FLAGS_shutdown_grace))) {
    LOG(WARNING) << "grace period over with cache publications still queued";
  }
  LOG(INFO) << "prefill stopped";
  return 0;
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "hybridserve prefill worker: resumes prompts from the cache, prefills the rest, "
      "pushes the state to a decode worker");
  absl::ParseCommandLine(argc, argv);
  hybridserve::common::InitLogging(argv[0]);
  hybridserve::common::TuneProcessForServing();
  hybridserve::common::InstallTerminationHandler();
  return hybridserve::Run();
}
