#include "common/health_server.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/health.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"

namespace hybridserve::common {
namespace {

// Drops the builder's plugins: gRPC adds every globally registered plugin to
// every server, and the workers register server reflection
// (worker::GrpcServer), which would otherwise answer here too and hand the
// services' schemas to anyone who reaches this unauthenticated port.
class NoPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override { plugins->clear(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<HealthServer> out(new HealthServer());
  builder.SetOption(std::make_unique<NoPlugins>());
  // gRPC builds no server without a service of its own to poll for (the
  // default health service is added after that check): this one answers
  // every other method UNIMPLEMENTED, as no service would.
  out->unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
  builder.RegisterCallbackGenericService(out->unimplemented_.get());
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &out->port_);
  out->server_ = builder.BuildAndStart();
  if (out->server_ == nullptr || out->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --health_address=", address, " (port in use?)"));
  }
  out->SetServing("", true);
  out->SetServing(kLivenessHealthService, true);
  return out;
}

HealthServer::~HealthServer() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

void HealthServer::SetServing(const std::string& service, bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(service, serving);
}

}  // namespace hybridserve::common
