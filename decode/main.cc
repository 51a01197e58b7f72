// The decode worker binary: the client-facing Generation service over one
// engine, the data plane's receiver (TCP, NCCL or CUDA IPC), a pool of prefill workers (or, with
// --prefill=in_process, a prefill worker in this process: aggregated mode),
// a cachestore client, Prometheus metrics. Flags are read here only.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cachestore/client.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "decode/decode_loop.h"
#include "decode/grpc_prefill_client.h"
#include "decode/in_process_prefill.h"
#include "decode/metrics.h"
#include "decode/service.h"
#include "engine/backend_registry.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prefill/prefill_worker.h"
#include "transport/in_process_transport.h"
#include "transport/ipc_communicator.h"
#include "transport/nccl_communicator.h"
#include "transport/channel_receiver.h"
#include "transport/socket_io.h"
#include "transport/tcp_transport.h"

ABSL_FLAG(std::string, model_dir, "models/default", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, address, "0.0.0.0:50050", "gRPC listen address of the Generation service (port 0 picks one)");
ABSL_FLAG(std::string, metrics_address, "", "Prometheus /metrics address (host:port); empty disables");
ABSL_FLAG(std::string, prefill, "",
          "prefill workers: comma-separated host:port (a name is re-resolved to all its addresses), or in_process "
          "for aggregated mode (a prefill engine in this process, no data plane sockets)");
ABSL_FLAG(std::string, data_address, "127.0.0.1:0", "TCP data plane listen address (port 0 picks one)");
ABSL_FLAG(std::string, advertise_host, "",
          "host that prefill workers connect to for the data plane; empty: the data_address host (127.0.0.1 for "
          "0.0.0.0)");
ABSL_FLAG(std::string, cachestore, "", "cachestore gRPC address (host:port); empty: no cache");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, data_plane, "tcp",
          "how prefill workers send state: tcp, nccl (GPUs: one NCCL channel to the one --prefill worker), or "
          "cuda_ipc (the --prefill worker on this GPU: device-to-device copies; needs --device=cuda)");
ABSL_FLAG(int32_t, device_index, 0, "the CUDA device of the engine and of NCCL channels");
ABSL_FLAG(int32_t, threads, 2, "kernel threads (CPU backend)");
ABSL_FLAG(int64_t, page_size, 0, "KV page size in tokens; 0: min(16, chunk_size); must match the prefill workers'");
ABSL_FLAG(int64_t, max_pages, 4096, "KV pages of the engine (reserved per request for prompt + max_tokens)");
ABSL_FLAG(int64_t, max_batch, 8, "requests running at once (prefilling or decoding)");
ABSL_FLAG(int64_t, max_waiting, 32, "requests waiting for room; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, transfer_timeout, absl::Seconds(60), "longest prefill call + state transfer");
ABSL_FLAG(absl::Duration, prefill_resolve_interval, absl::Seconds(10), "how often prefill names are re-resolved");
ABSL_FLAG(absl::Duration, prefill_failure_backoff, absl::Seconds(5), "how long a failed prefill worker is skipped");
ABSL_FLAG(absl::Duration, prefill_unavailable_wait, absl::Seconds(3),
          "how long a prefill call keeps trying while every prefill worker is unreachable (a restart)");
ABSL_FLAG(absl::Duration, cache_timeout, absl::Seconds(2), "per-call deadline of cachestore calls");
ABSL_FLAG(bool, publish, true, "publish turn-end states and generated pages to the cachestore");
ABSL_FLAG(absl::Duration, publish_parent_wait, absl::Seconds(2),
          "how long a turn-end publication waits for prefill to have put the prompt's last page, its parent");
ABSL_FLAG(absl::Duration, cache_failure_backoff, absl::Seconds(1),
          "after a publication's cache call times out (a hung cachestore), publications skip it for this long");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10), "time in-flight requests get on SIGTERM");

namespace hybridserve {
namespace {

absl::StatusOr<std::unique_ptr<engine::Model>> NewEngine(const engine::ModelWeights& weights, int64_t sequences) {
  auto device = engine::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return device.status();
  engine::ModelOptions mo;
  mo.device = *device;
  mo.device_index = absl::GetFlag(FLAGS_device_index);
  mo.num_threads = absl::GetFlag(FLAGS_threads);
  mo.page_size = absl::GetFlag(FLAGS_page_size);
  mo.max_pages = absl::GetFlag(FLAGS_max_pages);
  mo.max_sequences = sequences;
  return engine::Model::Create(weights.config(), weights, mo);
}

// Peers may start later than this worker (requests fail, or miss the cache,
// until they are up), so an unreachable one is a warning, not a fatal error.
void WarnAboutUnreachablePeers(cachestore::CacheStoreClient* cache, const std::string& prefill) {
  if (cache != nullptr) {
    absl::StatusOr<cachestore::IndexStats> stats = cache->Stats();
    if (!stats.ok()) {
      LOG(WARNING) << "the cachestore " << absl::GetFlag(FLAGS_cachestore) << " is unreachable (" << stats.status()
                   << "): requests run as cache misses until it is up";
    }
  }
  for (absl::string_view target : absl::StrSplit(prefill, ',', absl::SkipWhitespace())) {
    auto channel = grpc::CreateChannel(std::string(target), grpc::InsecureChannelCredentials());
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(2))) {
      LOG(WARNING) << "the prefill worker " << target << " is unreachable: requests sent to it fail until it is up";
    }
  }
}

int Run() {
  for (const auto& [name, value] :
       {std::pair<const char*, absl::Duration>{"cache_failure_backoff", absl::GetFlag(FLAGS_cache_failure_backoff)},
        {"prefill_unavailable_wait", absl::GetFlag(FLAGS_prefill_unavailable_wait)},
        {"publish_parent_wait", absl::GetFlag(FLAGS_publish_parent_wait)}}) {
    if (value < absl::ZeroDuration()) {
      LOG(ERROR) << "--" << name << " must be >= 0, got " << value;
      return 1;
    }
  }
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  auto weights = engine::ModelWeights::LoadDirectory(model_dir);
  if (!weights.ok()) {
    LOG(ERROR) << "cannot load the model from " << model_dir << ": " << weights.status();
    return 1;
  }
  const std::string prefill_flag = absl::GetFlag(FLAGS_prefill);
  if (prefill_flag.empty()) {
    LOG(ERROR) << "--prefill is required: host:port of prefill workers, or in_process";
    return 1;
  }
  const bool aggregated = prefill_flag == "in_process";
  auto model = NewEngine(**weights, absl::GetFlag(FLAGS_max_batch));
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

  // The data plane and the prefill side.
  std::unique_ptr<transport::TcpStateReceiver> tcp;
  std::unique_ptr<transport::NcclCommunicatorFactory> nccl_factory;
  std::unique_ptr<transport::ChannelStateReceiver> nccl;
  std::unique_ptr<transport::IpcCommunicatorFactory> ipc_factory;
  std::unique_ptr<transport::InProcessTransport> local;
  std::unique_ptr<engine::Model> prefill_model;
  std::unique_ptr<prefill::PrefillWorker> prefill_worker;
  std::unique_ptr<decode::PrefillClient> prefill;
  transport::StateReceiver* receiver = nullptr;
  std::string endpoint;
  if (aggregated) {
    local = std::make_unique<transport::InProcessTransport>();
    auto pm = NewEngine(**weights, 1);
    if (!pm.ok()) {
      LOG(ERROR) << "cannot start the prefill engine: " << pm.status();
      return 1;
    }
    prefill_model = *std::move(pm);
    prefill::PrefillWorkerOptions wo;
    wo.async_publication = true;  // as the prefill binary: the answer does not wait for the cache
    prefill_worker =
        std::make_unique<prefill::PrefillWorker>(*prefill_model, (*weights)->fingerprint(), cache.get(), *local, wo);
    prefill = std::make_unique<decode::InProcessPrefillClient>(*prefill_worker);
    receiver = local.get();
    endpoint = "in_process";
  } else if (absl::GetFlag(FLAGS_data_plane) == "nccl" || absl::GetFlag(FLAGS_data_plane) == "cuda_ipc") {
    const bool ipc = absl::GetFlag(FLAGS_data_plane) == "cuda_ipc";
    // One channel per prefill/decode pair: the ticket's unique id is the
    // channel to the one prefill worker, made here and joined there.
    const std::vector<std::string> targets = absl::StrSplit(prefill_flag, ',', absl::SkipWhitespace());
    if (targets.size() != 1) {
      LOG(ERROR) << "--data_plane=" << absl::GetFlag(FLAGS_data_plane)
                 << " pairs this worker with one prefill worker; --prefill names " << targets.size();
      return 1;
    }
    transport::CommunicatorFactory* factory = nullptr;
    if (ipc) {
      if ((*model)->options().device != engine::Device::kCuda) {
        LOG(ERROR) << "--data_plane=cuda_ipc shares the engine's GPU memory: it needs --device=cuda";
        return 1;
      }
      ipc_factory = std::make_unique<transport::IpcCommunicatorFactory>((*model)->backend());
      factory = ipc_factory.get();
    } else {
      transport::NcclCommunicatorOptions no;
      no.device = absl::GetFlag(FLAGS_device_index);
      auto f = transport::NcclCommunicatorFactory::Create(no);
      if (!f.ok()) {
        LOG(ERROR) << "--data_plane=nccl: " << f.status();
        return 1;
      }
      nccl_factory = *std::move(f);
      factory = nccl_factory.get();
    }
    transport::ChannelReceiverOptions ro;
    ro.default_peer = targets[0];
    ro.kind = ipc ? transport::TransportKind::kCudaIpc : transport::TransportKind::kNccl;
    auto r = transport::ChannelStateReceiver::Create(*factory, ro);
    if (!r.ok()) {
      LOG(ERROR) << "--data_plane: " << r.status();
      return 1;
    }
    nccl = *std::move(r);
    receiver = nccl.get();
    // Names this worker to the prefill side, which keeps one channel per
    // receiver endpoint: unique per process (--address may be 0.0.0.0:port on
    // every decode host, and two workers sharing a name would take each
    // other's channel).
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    endpoint = absl::StrCat(absl::GetFlag(FLAGS_data_plane), "/", host, "/", getpid(), "/",
                            absl::Hex(std::random_device()() ^ (uint64_t{std::random_device()()} << 32)));
    decode::PrefillPoolOptions po;
    po.targets = targets;
    po.resolve_interval = absl::GetFlag(FLAGS_prefill_resolve_interval);
    po.failure_backoff = absl::GetFlag(FLAGS_prefill_failure_backoff);
    po.unavailable_wait = absl::GetFlag(FLAGS_prefill_unavailable_wait);
    auto p = decode::GrpcPrefillClient::Create(po);
    if (!p.ok()) {
      LOG(ERROR) << "--prefill: " << p.status();
      return 1;
    }
    prefill = *std::move(p);
  } else if (absl::GetFlag(FLAGS_data_plane) != "tcp") {
    LOG(ERROR) << "--data_plane must be tcp, nccl or cuda_ipc, got \"" << absl::GetFlag(FLAGS_data_plane) << "\"";
    return 1;
  } else {
    transport::TcpReceiverOptions ro;
    ro.address = absl::GetFlag(FLAGS_data_address);
    auto r = transport::TcpStateReceiver::Create(ro);
    if (!r.ok()) {
      LOG(ERROR) << "data plane: cannot listen on " << ro.address << ": " << r.status();
      return 1;
    }
    tcp = *std::move(r);
    receiver = tcp.get();
    std::string host, port;
    if (!transport::SplitHostPort(tcp->endpoint(), &host, &port).ok()) {
      LOG(ERROR) << "data plane: bad endpoint " << tcp->endpoint();
      return 1;
    }
    std::string advertised = absl::GetFlag(FLAGS_advertise_host);
    if (advertised.empty()) advertised = (host == "0.0.0.0" || host == "::") ? "127.0.0.1" : host;
    endpoint = absl::StrCat(advertised, ":", port);
    decode::PrefillPoolOptions po;
    po.targets = absl::StrSplit(prefill_flag, ',', absl::SkipWhitespace());
    po.resolve_interval = absl::GetFlag(FLAGS_prefill_resolve_interval);
    po.failure_backoff = absl::GetFlag(FLAGS_prefill_failure_backoff);
    po.unavailable_wait = absl::GetFlag(FLAGS_prefill_unavailable_wait);
    auto p = decode::GrpcPrefillClient::Create(po);
    if (!p.ok()) {
      LOG(ERROR) << "--prefill: " << p.status();
      return 1;
    }
    prefill = *std::move(p);
  }

  decode::DecodeLoopOptions lo;
  lo.max_batch = absl::GetFlag(FLAGS_max_batch);
  lo.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  lo.endpoint = endpoint;
  lo.transfer_timeout = absl::GetFlag(FLAGS_transfer_timeout);
  lo.eos_token_ids.assign((*weights)->config().eos_token_ids.begin(), (*weights)->config().eos_token_ids.end());
  lo.publish = absl::GetFlag(FLAGS_publish);
  lo.publish_parent_wait = absl::GetFlag(FLAGS_publish_parent_wait);
  lo.cache_failure_backoff = absl::GetFlag(FLAGS_cache_failure_backoff);
  auto loop = decode::DecodeLoop::Create(**model, (*weights)->fingerprint(), *prefill, *receiver, cache.get(), lo);
  if (!loop.ok()) {
    LOG(ERROR) << loop.status();
    return 1;
  }

  auto registry = std::make_shared<prometheus::Registry>();
  decode::DecodeMetrics metrics(*registry);
  std::unique_ptr<common::MetricsExposer> exposer;
  if (!absl::GetFlag(FLAGS_metrics_address).empty()) {
    auto e = common::MetricsExposer::Create(absl::GetFlag(FLAGS_metrics_address), registry);
    if (!e.ok()) {
      LOG(ERROR) << "metrics: " << e.status();
      return 1;
    }
    exposer = *std::move(e);
  }

  decode::ModelDescription description;
  description.name = model_dir;
  description.fingerprint_hex = (*weights)->fingerprint().ToHex();
  description.vocab_size = (*weights)->config().vocab_size;
  description.max_context = (*loop)->max_context();
  description.eos_token_ids = lo.eos_token_ids;
  description.chunk_size = (*weights)->config().mamba.chunk_size;
  description.page_size = (*model)->page_size();
  description.checkpoint_interval = (*model)->options().checkpoint_interval;
  decode::GenerationService service(**loop, description, &metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would
  // share it silently instead of failing with "port in use".
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_address), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  // One server thread per open stream: bound them (beyond the batch and the
  // wait queue, calls are refused anyway).
  grpc::ResourceQuota quota("decode");
  quota.SetMaxThreads(static_cast<int>(2 * (lo.max_batch + lo.max_waiting) + 16));
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << absl::GetFlag(FLAGS_address) << " (port in use?)";
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  WarnAboutUnreachablePeers(cache.get(), aggregated ? "" : prefill_flag);

  // Queue gauges, refreshed while serving.
  std::atomic<bool> stop_gauges{false};
  std::thread gauges([&] {
    while (!stop_gauges.load()) {
      const decode::DecodeLoop::Counts c = (*loop)->counts();
      metrics.SetQueue(c.waiting, c.prefilling + c.decoding);
      metrics.SetFree(c.free_pages, c.free_slots);
      metrics.SetBatchPeak(c.batch_peak);
      metrics.SetOrphanedCalls(c.orphaned_calls);
      absl::SleepFor(absl::Milliseconds(250));
    }
  });

  LOG(INFO) << "decode serving " << (*weights)->config().LayerPattern() << " on port " << port << ", "
            << (aggregated ? std::string("aggregated (prefill in process)")
                           : absl::StrCat("data plane ", endpoint, ", prefill ", prefill_flag))
            << (cache ? absl::StrCat(", cachestore ", absl::GetFlag(FLAGS_cachestore)) : ", no cache")
            << (exposer ? absl::StrCat(", metrics on port ", exposer->port()) : std::string());
  std::cout << "DECODE_READY port=" << port << (tcp ? absl::StrCat(" data_port=", tcp->endpoint()) : "")
            << (exposer ? absl::StrCat(" metrics_port=", exposer->port()) : "") << std::endl;

  const int sig = common::WaitForTerminationSignal();
  LOG(INFO) << "signal " << sig << ": draining";
  server->GetHealthCheckService()->SetServingStatus(false);
  (*loop)->Drain();
  const absl::Time grace_end = absl::Now() + absl::GetFlag(FLAGS_shutdown_grace);
  while (!(*loop)->Idle() && absl::Now() < grace_end) absl::SleepFor(absl::Milliseconds(20));
  if (!(*loop)->Idle()) LOG(WARNING) << "grace period over: aborting the requests still running";
  server->Shutdown(absl::ToChronoTime(grace_end));
  loop->reset();  // aborts what still runs; every stream gets its final message
  server->Wait();
  stop_gauges = true;
  gauges.join();
  LOG(INFO) << "decode stopped";
  return 0;
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "hybridserve decode worker: serves Generate to clients, has prefill workers prefill each prompt (resuming "
      "from the cachestore) and push the state here, decodes in continuous batches, publishes turn-end states");
  absl::ParseCommandLine(argc, argv);
  hybridserve::common::InitLogging(argv[0]);
  hybridserve::common::TuneProcessForServing();
  hybridserve::common::InstallTerminationHandler();
  return hybridserve::Run();
}
