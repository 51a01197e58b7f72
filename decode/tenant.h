#ifndef HYBRIDSERVE_DECODE_TENANT_H_
#define HYBRIDSERVE_DECODE_TENANT_H_

// Who a Generate call is for: the tenant whose cache namespace it reads and
// writes (cachestore/keys.h: the tenant is a field of the namespace beside
// the client's salt, so a salt narrows sharing within a tenant and never
// reaches another's). Derived by the server from what the connection proved,
// never taken from what a client merely says (docs/ARCHITECTURE.md "Trust"):
//
//   none         single tenant: every call is tenant "" (the default only
//                when the client port has no TLS, and said so at start);
//   certificate  the caller's verified client certificate: its SPIFFE ID,
//                else its first DNS name;
//   proxy_header a trusted front proxy (its certificate names one of
//                trusted_proxies) authenticated the user and names the
//                tenant in the header kTenantHeader.
//
// A call carrying kTenantHeader on a connection that is not a trusted
// proxy's is refused (PERMISSION_DENIED), not ignored: a client that believes
// it chose its tenant must learn that it did not, and a proxy misconfigured
// into talking to the wrong port must fail loudly rather than merge its users
// into one tenant.
//
// Thread-safe (immutable after construction).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridserve::decode {

inline constexpr char kTenantHeader[] = "x-hybridserve-tenant";

enum class TenantSource { kNone, kCertificate, kProxyHeader };
// "none", "certificate", "proxy_header"; INVALID_ARGUMENT naming `flag`
// otherwise.
absl::StatusOr<TenantSource> ParseTenantSource(absl::string_view value, absl::string_view flag);
const char* TenantSourceName(TenantSource source);

// What a call's connection proved and what its metadata says.
struct CallIdentity {
  // The verified client certificate's identities (common::PeerIdentities):
  // SPIFFE ID first, then DNS names; empty without one.
  std::vector<std::string> peer_identities;
  // The values of kTenantHeader in the call's metadata.
  std::vector<std::string> tenant_headers;
};

class TenantResolver {
 public:
  // proxy_header needs trusted_proxies; the others take none.
  static absl::StatusOr<TenantResolver> Create(TenantSource source, std::vector<std::string> trusted_proxies);

  TenantSource source() const { return source_; }

  // The call's tenant (at most cachestore::kMaxTenantBytes), or
  // UNAUTHENTICATED (no verified certificate where one is needed),
  // PERMISSION_DENIED (a tenant header from a connection that is not a
  // trusted proxy's; a proxy_header call from anyone else), INVALID_ARGUMENT
  // (a trusted proxy's call without exactly one non-empty header, or one
  // too long).
  absl::StatusOr<std::string> Resolve(const CallIdentity& call) const;

 private:
  TenantResolver(TenantSource source, std::vector<std::string> trusted_proxies)
      : source_(source), trusted_proxies_(std::move(trusted_proxies)) {}
  TenantSource source_;
  std::vector<std::string> trusted_proxies_;
};

// The id the decode loop knows a request by: the client's id within its
// tenant, so that one tenant's ids never collide with, or abort, another's.
// The client's id itself for tenant "". Internal: never validated against
// the client's limit (kMaxRequestIdBytes bounds the client's id) and never
// shown to a client (it would name the tenant).
std::string ScopedRequestId(absl::string_view tenant, absl::string_view request_id);

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_TENANT_H_
