#include "decode/tenant.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/keys.h"
#include "common/status_macros.h"

namespace hybridserve::decode {

absl::StatusOr<TenantSource> ParseTenantSource(absl::string_view value, absl::string_view flag) {
  if (value == "none") return TenantSource::kNone;
  if (value == "certificate") return TenantSource::kCertificate;
  if (value == "proxy_header") return TenantSource::kProxyHeader;
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": must be none, certificate or proxy_header"));
}

const char* TenantSourceName(TenantSource source) {
  switch (source) {
    case TenantSource::kNone:
      return "none";
    case TenantSource::kCertificate:
      return "certificate";
    case TenantSource::kProxyHeader:
      return "proxy_header";
  }
  return "unknown";
}

absl::StatusOr<TenantResolver> TenantResolver::Create(TenantSource source, std::vector<std::string> trusted_proxies) {
  if (source == TenantSource::kProxyHeader && trusted_proxies.empty()) {
    return absl::InvalidArgumentError(
        "tenants from a proxy header need the identities of the proxies trusted to set it");
  }
  if (source == TenantSource::kNone && !trusted_proxies.empty()) {
    return absl::InvalidArgumentError(
        "trusted proxies name tenants by certificate or proxy header: with tenants from none there is one tenant");
  }
  return TenantResolver(source, std::move(trusted_proxies));
}

namespace {

// The tenant a trusted proxy's call names: exactly one non-empty header.
absl::StatusOr<std::string> ProxyTenant(const CallIdentity& call) {
  if (call.tenant_headers.size() != 1 || call.tenant_headers.front().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("a trusted proxy's call names its tenant in exactly one ",
                                                   kTenantHeader, " header, got ", call.tenant_headers.size(),
                                                   call.tenant_headers.size() == 1 ? " (empty)" : ""));
  }
  return call.tenant_headers.front();
}

}  // namespace

absl::StatusOr<std::string> TenantResolver::Resolve(const CallIdentity& call) const {
  const bool proxy = std::any_of(call.peer_identities.begin(), call.peer_identities.end(), [&](const std::string& id) {
    return std::find(trusted_proxies_.begin(), trusted_proxies_.end(), id) != trusted_proxies_.end();
  });
  if (!call.tenant_headers.empty() && !proxy) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the ", kTenantHeader, " header is taken only from a trusted proxy's connection: ",
        trusted_proxies_.empty() ? "this server takes no tenant from a header" : "this connection is not one"));
  }
  std::string tenant;
  switch (source_) {
    case TenantSource::kNone:
      return tenant;
    case TenantSource::kCertificate:
      if (call.peer_identities.empty()) {
        return absl::UnauthenticatedError(
            "this server knows its tenants by their client certificates: the call presented none (or none "
            "that names a SPIFFE ID or DNS name)");
      }
      if (proxy && !call.tenant_headers.empty()) {
        // A trusted proxy naming its user's tenant; without the header it is a client of its own.
        ASSIGN_OR_RETURN(tenant, ProxyTenant(call));
      } else {
        tenant = call.peer_identities.front();
      }
      break;
    case TenantSource::kProxyHeader:
      if (!proxy) {
        return absl::PermissionDeniedError(
            "this server takes calls only from trusted proxies, which name the tenant: this connection is not one");
      }
      ASSIGN_OR_RETURN(tenant, ProxyTenant(call));
      break;
  }
  if (tenant.size() > cachestore::kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tenant has ", tenant.size(), " bytes, at most ", cachestore::kMaxTenantBytes));
  }
  return tenant;
}

std::string ScopedRequestId(absl::string_view tenant, absl::string_view request_id) {
  if (tenant.empty()) return std::string(request_id);
  // Length-prefixed: no (tenant, id) pair reads as another.
  return absl::StrCat(tenant.size(), ":", tenant, "/", request_id);
}

}  // namespace hybridserve::decode
