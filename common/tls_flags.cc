#include "common/tls_flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(std::string, tls_cert, "",
          "this process's certificate chain (PEM): its server certificate, and its client certificate on the calls "
          "it makes; empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "the private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_ca, "", "CA bundle (PEM) that verifies the servers this process calls (its own workers)");
ABSL_FLAG(std::string, tls_client_ca, "", "CA bundle (PEM) that verifies this server's clients; empty: --tls_ca");
ABSL_FLAG(std::string, tls_client_auth, "require",
          "client certificates: none, request (verified when given) or require");
ABSL_FLAG(std::string, tls_allowed_peers, "",
          "comma-separated SPIFFE IDs or DNS names allowed to call this server (checked on every call); empty: any "
          "client the client CA verifies");
ABSL_FLAG(absl::Duration, tls_refresh, absl::Seconds(10),
          "how often certificate, key and CA files are re-read (rotation without a restart)");
ABSL_FLAG(std::string, health_address, "",
          "plaintext gRPC address serving only the health service (for kubelet probes, which present no "
          "certificate); empty: none");

namespace hybridserve::common {

absl::StatusOr<TlsFlags> TlsFlagsFromFlags() {
  TlsFlags f;
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string ca = absl::GetFlag(FLAGS_tls_ca);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  const std::vector<std::string> allowed =
      absl::StrSplit(absl::GetFlag(FLAGS_tls_allowed_peers), ',', absl::SkipWhitespace());
  const absl::Duration refresh = absl::GetFlag(FLAGS_tls_refresh);
  if (refresh < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_refresh=", absl::FormatDuration(refresh), ": must be at least 1s"));
  }
  f.health_address = absl::GetFlag(FLAGS_health_address);
  if (cert.empty()) {
    if (!key.empty() || !ca.empty() || !client_ca.empty() || !allowed.empty()) {
      return absl::InvalidArgumentError(
          "--tls_key, --tls_ca, --tls_client_ca and --tls_allowed_peers need --tls_cert (TLS is off without it)");
    }
    return f;
  }
  if (key.empty()) return absl::InvalidArgumentError("--tls_cert needs --tls_key");
  absl::StatusOr<ClientAuth> auth = ParseClientAuth(absl::GetFlag(FLAGS_tls_client_auth), "tls_client_auth");
  if (!auth.ok()) return auth.status();
  f.server.cert_file = cert;
  f.server.key_file = key;
  f.server.client_auth = *auth;
  f.server.client_ca_file = *auth == ClientAuth::kNone ? "" : (client_ca.empty() ? ca : client_ca);
  if (*auth != ClientAuth::kNone && f.server.client_ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_client_auth=", ClientAuthName(*auth),
                                                   " verifies client certificates: give --tls_client_ca or --tls_ca"));
  }
  f.server.allowed_peers = allowed;
  f.server.refresh = refresh;
  if (!allowed.empty() && *auth == ClientAuth::kNone) {
    return absl::InvalidArgumentError("--tls_allowed_peers needs client certificates: --tls_client_auth=none");
  }
  // The calls this process makes: mutual TLS with the same identity.
  if (!ca.empty()) {
    f.channel.ca_file = ca;
    f.channel.cert_file = cert;
    f.channel.key_file = key;
    f.channel.refresh = refresh;
  }
  return f;
}

}  // namespace hybridserve::common
