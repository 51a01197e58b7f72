#include "common/health_server.h"

#include "absl/strings/str_cat.h"
#include "common/health.h"

namespace hybridserve::common {

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<HealthServer> out(new HealthServer());
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
