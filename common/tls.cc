#include "common/tls.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace hybridserve::common {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

// The file's contents hold `marker` (a PEM block's "-----BEGIN ..." line, or
// part of it); INVALID_ARGUMENT naming `what` and the file otherwise.
absl::Status CheckPemFile(const std::string& path, absl::string_view marker, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " cannot be read"));
  std::stringstream contents;
  contents << in.rdbuf();
  if (!absl::StrContains(contents.str(), marker)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " holds no PEM block \"", marker, "\""));
  }
  return absl::OkStatus();
}

absl::Status CheckIdentity(const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("a TLS certificate and its private key go together: give both or neither");
  }
  if (cert_file.empty()) return absl::OkStatus();
  if (absl::Status s = CheckPemFile(cert_file, "-----BEGIN CERTIFICATE-----", "the certificate"); !s.ok()) return s;
  return CheckPemFile(key_file, "PRIVATE KEY-----", "the private key");
}

unsigned int RefreshSeconds(absl::Duration refresh) {
  return static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(refresh)));
}

// Takes a call only from a peer whose verified certificate names an allowed
// identity. Runs on the call's path (not blocking: a lookup in a short list).
class PeerAllowlist final : public grpc::AuthMetadataProcessor {
 public:
  explicit PeerAllowlist(std::vector<std::string> allowed) : allowed_(std::move(allowed)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& /*auth_metadata*/, grpc::AuthContext* context,
                       OutputMetadata* /*consumed_auth_metadata*/, OutputMetadata* /*response_metadata*/) override {
    const std::vector<std::string> identities = PeerIdentities(*context);
    if (identities.empty()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "this server takes calls only from peers with a verified client certificate naming one of "
                          "its allowed identities; this connection presented none");
    }
    if (!AnyAllowed(identities, allowed_)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("the client certificate names ", absl::StrJoin(identities, ", "),
                                       ": none of them is allowed to call this server"));
    }
    return grpc::Status::OK;
  }

 private:
  const std::vector<std::string> allowed_;
};

}  // namespace

absl::StatusOr<ClientAuth> ParseClientAuth(absl::string_view value, absl::string_view flag) {
  if (value == "none") return ClientAuth::kNone;
  if (value == "request") return ClientAuth::kRequest;
  if (value == "require") return ClientAuth::kRequire;
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": must be none, request or require"));
}

const char* ClientAuthName(ClientAuth auth) {
  switch (auth) {
    case ClientAuth::kNone:
      return "none";
    case ClientAuth::kRequest:
      return "request";
    case ClientAuth::kRequire:
      return "require";
  }
  return "unknown";
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NewServerCredentials(const ServerTlsOptions& options) {
  if (!options.enabled()) {
    if (!options.key_file.empty() || !options.client_ca_file.empty() || !options.allowed_peers.empty()) {
      return absl::InvalidArgumentError(
          "TLS is off (no certificate) but a key, a client CA or allowed peers are given: give the certificate too");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.key_file.empty()) return absl::InvalidArgumentError("a TLS certificate needs its private key");
  if (absl::Status s = CheckIdentity(options.cert_file, options.key_file); !s.ok()) return s;
  if (options.client_auth != ClientAuth::kNone) {
    if (options.client_ca_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("client certificates (", ClientAuthName(options.client_auth),
                                                     ") are verified against a CA: give its bundle"));
    }
    if (absl::Status s = CheckPemFile(options.client_ca_file, "-----BEGIN CERTIFICATE-----", "the client CA bundle");
        !s.ok()) {
      return s;
    }
  }
  if (!options.allowed_peers.empty() && options.client_auth == ClientAuth::kNone) {
    return absl::InvalidArgumentError(
        "allowed peers are named by client certificates: they need client_auth "
        "request or require");
  }
  for (const std::string& peer : options.allowed_peers) {
    if (peer.empty() || peer == "*") {
      return absl::InvalidArgumentError(
          absl::StrCat("allowed peer \"", peer, "\" names no identity (for any peer, give no list)"));
    }
  }
  auto provider = std::make_shared<FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.client_auth == ClientAuth::kNone ? "" : options.client_ca_file,
      RefreshSeconds(options.refresh));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  switch (options.client_auth) {
    case ClientAuth::kNone:
      tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
      break;
    case ClientAuth::kRequest:
      tls.watch_root_certs();
      tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
      break;
    case ClientAuth::kRequire:
      tls.watch_root_certs();
      tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      break;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::experimental::TlsServerCredentials(tls);
  if (creds == nullptr) return absl::InternalError("gRPC made no TLS server credentials");
  if (!options.allowed_peers.empty()) {
    creds->SetAuthMetadataProcessor(std::make_shared<PeerAllowlist>(options.allowed_peers));
  }
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewChannelCredentials(const ChannelTlsOptions& options) {
  if (!options.enabled()) {
    if (!options.cert_file.empty() || !options.key_file.empty() || !options.server_name.empty()) {
      return absl::InvalidArgumentError(
          "TLS is off (no CA to verify the server with) but a client certificate or a server name is given: give "
          "the CA too");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (absl::Status s = CheckPemFile(options.ca_file, "-----BEGIN CERTIFICATE-----", "the CA bundle"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckIdentity(options.cert_file, options.key_file); !s.ok()) return s;
  auto provider = std::make_shared<FileWatcherCertificateProvider>(options.key_file, options.cert_file, options.ca_file,
                                                                   RefreshSeconds(options.refresh));
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (!options.cert_file.empty()) tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  // The chain is verified against the CA; this checks the name on it.
  tls.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::experimental::TlsCredentials(tls);
  if (creds == nullptr) return absl::InternalError("gRPC made no TLS channel credentials");
  return creds;
}

void AddChannelArguments(const ChannelTlsOptions& options, grpc::ChannelArguments* args) {
  if (options.enabled() && !options.server_name.empty()) {
    args->SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, options.server_name);
  }
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& target, const ChannelTlsOptions& options,
                                                          grpc::ChannelArguments args) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = NewChannelCredentials(options);
  if (!creds.ok()) return creds.status();
  AddChannelArguments(options, &args);
  return grpc::CreateCustomChannel(target, *creds, args);
}

std::vector<std::string> PeerIdentities(const grpc::AuthContext& context) {
  std::vector<std::string> out;
  if (!context.IsPeerAuthenticated()) return out;
  for (const char* property : {GRPC_PEER_SPIFFE_ID_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : context.FindPropertyValues(property)) {
      out.emplace_back(value.data(), value.size());
    }
  }
  return out;
}

bool AnyAllowed(const std::vector<std::string>& identities, const std::vector<std::string>& allowed) {
  for (const std::string& id : identities) {
    if (std::find(allowed.begin(), allowed.end(), id) != allowed.end()) return true;
  }
  return false;
}

}  // namespace hybridserve::common
