#ifndef HYBRIDSERVE_COMMON_TLS_FLAGS_H_
#define HYBRIDSERVE_COMMON_TLS_FLAGS_H_

// The TLS flags every server binary takes (decode, prefill, cachestore),
// read here only (defined in tls_flags.cc, linked into each main):
//
//   --tls_cert, --tls_key    this process's certificate chain and key (PEM):
//                            its server certificate, and its client
//                            certificate on the calls it makes (mutual TLS)
//   --tls_ca                 the CA bundle of the deployment's own workers:
//                            verifies the servers this process calls
//   --tls_client_ca          verifies the certificates of this server's
//                            clients (default: --tls_ca)
//   --tls_client_auth        none | request | require (default require)
//   --tls_allowed_peers      identities (SPIFFE IDs or DNS names, comma-
//                            separated) allowed to call this server; empty: any
//                            client the client CA verifies
//   --tls_refresh            how often certificate files are re-read
//   --health_address         a plaintext gRPC port serving only the health
//                            service, for kubelet probes that present no
//                            certificate; empty: none
//
// Without --tls_cert everything is plaintext, as before, and the other TLS
// flags must be empty.

#include <string>

#include "absl/status/statusor.h"
#include "common/tls.h"

namespace hybridserve::common {

struct TlsFlags {
  ServerTlsOptions server;
  ChannelTlsOptions channel;  // for the calls this process makes
  std::string health_address;
};

// The flags as options; INVALID_ARGUMENT naming the flag for a bad value or
// a combination that cannot work (a key without a certificate, a client CA
// without a certificate, ...). The files themselves are checked when the
// credentials are made (NewServerCredentials, NewChannelCredentials).
absl::StatusOr<TlsFlags> TlsFlagsFromFlags();

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_TLS_FLAGS_H_
