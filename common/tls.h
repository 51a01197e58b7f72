#ifndef HYBRIDSERVE_COMMON_TLS_H_
#define HYBRIDSERVE_COMMON_TLS_H_

// TLS and mutual TLS for every gRPC server and channel of hybridserve
// (docs/ARCHITECTURE.md section "Trust"). Certificates and keys are PEM
// files watched by gRPC's FileWatcherCertificateProvider: replacing them on
// disk (Kubernetes swaps a Secret volume's symlink) takes effect for new
// connections within the refresh interval, without a restart; connections
// already open keep the credentials they were made with.
//
// Identity. A verified peer certificate names its peer by its SPIFFE ID (a
// URI SAN "spiffe://...") and its DNS SANs; PeerIdentities lists them. A
// server given allowed peers takes calls only from a peer that holds one of
// them (an AuthMetadataProcessor on its credentials: every call, every
// method); anything else is PERMISSION_DENIED, a call without a verified
// certificate UNAUTHENTICATED. A certificate that does not verify (another
// CA, expired, not yet valid) fails the TLS handshake itself: the caller
// sees UNAVAILABLE naming the handshake, and no call is made.
//
// Thread-safe: the functions keep no state; the credentials they return are
// gRPC's (thread-safe).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace hybridserve::common {

// Whether a server asks its clients for certificates.
enum class ClientAuth {
  kNone,     // no client certificate is asked for
  kRequest,  // asked for; verified when given; a client without one may call
  kRequire,  // a client without a verified certificate fails the handshake
};
// "none", "request", "require"; INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<ClientAuth> ParseClientAuth(absl::string_view value, absl::string_view flag);
const char* ClientAuthName(ClientAuth auth);

inline constexpr absl::Duration kDefaultTlsRefresh = absl::Seconds(10);

struct ServerTlsOptions {
  // This server's certificate chain and private key (PEM). Empty cert_file:
  // plaintext (every other field must then be empty too).
  std::string cert_file;
  std::string key_file;
  // The CA bundle client certificates are verified against (PEM); required
  // unless client_auth is kNone.
  std::string client_ca_file;
  ClientAuth client_auth = ClientAuth::kRequire;
  // SPIFFE IDs or DNS names (exact): a call is taken only from a peer whose
  // verified certificate names one of them. Empty: any peer (any certificate
  // client_ca_file verifies, or none under kRequest/kNone). A "*" entry is
  // refused: say no list instead.
  std::vector<std::string> allowed_peers;
  absl::Duration refresh = kDefaultTlsRefresh;  // how often the files are re-read

  bool enabled() const { return !cert_file.empty(); }
};

// What a server's options make: credentials for AddListeningPort, insecure
// when TLS is off. INVALID_ARGUMENT, naming the files, for missing or
// unreadable files, a file without the PEM block it should hold, a
// client_auth that needs a CA without one, allowed peers without client
// certificates, or options given with TLS off.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NewServerCredentials(const ServerTlsOptions& options);

struct ChannelTlsOptions {
  // The CA bundle the server's certificate is verified against (PEM). Empty:
  // plaintext (every other field must then be empty too).
  std::string ca_file;
  // This client's certificate chain and key for mutual TLS; both or neither.
  std::string cert_file;
  std::string key_file;
  // The name the server's certificate must hold instead of the target's host
  // (e.g. a Service's DNS name when dialling an address).
  std::string server_name;
  absl::Duration refresh = kDefaultTlsRefresh;

  bool enabled() const { return !ca_file.empty(); }
};

// Credentials for a channel to a server, insecure when TLS is off; the
// server's certificate must verify against ca_file and name the target's host
// (or server_name). INVALID_ARGUMENT as NewServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewChannelCredentials(const ChannelTlsOptions& options);

// The channel arguments the options need (the server name override), added
// to `args`.
void AddChannelArguments(const ChannelTlsOptions& options, grpc::ChannelArguments* args);

// grpc::CreateCustomChannel with the options' credentials and arguments.
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& target, const ChannelTlsOptions& options,
                                                          grpc::ChannelArguments args = {});

// The identities a verified peer certificate names: its SPIFFE ID, then its
// DNS SANs. Empty for a peer without a verified certificate.
std::vector<std::string> PeerIdentities(const grpc::AuthContext& context);

// Whether any of `identities` is in `allowed`.
bool AnyAllowed(const std::vector<std::string>& identities, const std::vector<std::string>& allowed);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_TLS_H_
