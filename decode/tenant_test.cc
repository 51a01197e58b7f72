#include "decode/tenant.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::decode {
namespace {

using ::testing::HasSubstr;

CallIdentity Call(std::vector<std::string> identities, std::vector<std::string> headers = {}) {
  return CallIdentity{std::move(identities), std::move(headers)};
}

TEST(TenantTest, SourcesParseByName) {
  EXPECT_EQ(*ParseTenantSource("none", "tenant_from"), TenantSource::kNone);
  EXPECT_EQ(*ParseTenantSource("certificate", "tenant_from"), TenantSource::kCertificate);
  EXPECT_EQ(*ParseTenantSource("proxy_header", "tenant_from"), TenantSource::kProxyHeader);
  const auto bad = ParseTenantSource("salt", "tenant_from");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--tenant_from=salt"));
}

TEST(TenantTest, NoneIsOneTenantAndRefusesAHeader) {
  const TenantResolver r = *TenantResolver::Create(TenantSource::kNone, {});
  EXPECT_EQ(*r.Resolve(Call({})), "");
  EXPECT_EQ(*r.Resolve(Call({"spiffe://x/a"})), "");
  const auto forged = r.Resolve(Call({}, {"org_a"}));
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(forged.status().message()), HasSubstr("takes no tenant from a header"));
}

TEST(TenantTest, CertificateNamesTheTenantBySpiffeIdFirst) {
  const TenantResolver r = *TenantResolver::Create(TenantSource::kCertificate, {});
  EXPECT_EQ(*r.Resolve(Call({"spiffe://t/org_a", "a.example"})), "spiffe://t/org_a");
  EXPECT_EQ(*r.Resolve(Call({"b.example"})), "b.example");
  EXPECT_EQ(r.Resolve(Call({})).status().code(), absl::StatusCode::kUnauthenticated);
  // A client asserting another tenant in a header is refused, not believed.
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/org_b"}, {"spiffe://t/org_a"})).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(TenantTest, ProxyHeaderOnlyFromTrustedProxies) {
  EXPECT_EQ(TenantResolver::Create(TenantSource::kProxyHeader, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TenantResolver::Create(TenantSource::kNone, {"spiffe://t/proxy"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const TenantResolver r = *TenantResolver::Create(TenantSource::kProxyHeader, {"spiffe://t/proxy"});
  EXPECT_EQ(*r.Resolve(Call({"spiffe://t/proxy"}, {"org_a"})), "org_a");
  // Forged: the header from a connection that is not the proxy's.
  const auto forged = r.Resolve(Call({"spiffe://t/org_b"}, {"org_a"}));
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(forged.status().message()), HasSubstr("this connection is not one"));
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/org_b"})).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r.Resolve(Call({})).status().code(), absl::StatusCode::kPermissionDenied);
  // The proxy must name exactly one tenant.
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/proxy"})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/proxy"}, {""})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/proxy"}, {"a", "b"})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/proxy"}, {std::string(257, 'x')})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Certificates name every caller's tenant, except that a trusted proxy (the
// OpenAI gateway) names its user's: direct gRPC clients and the gateway side by side.
TEST(TenantTest, CertificateWithTrustedProxiesTakesTheProxysHeader) {
  const TenantResolver r = *TenantResolver::Create(TenantSource::kCertificate, {"spiffe://t/gateway"});
  EXPECT_EQ(*r.Resolve(Call({"spiffe://t/gateway"}, {"org_a"})), "org_a");
  // Without the header the proxy is a client of its own.
  EXPECT_EQ(*r.Resolve(Call({"spiffe://t/gateway"})), "spiffe://t/gateway");
  // Everyone else is their certificate, and may not assert a tenant.
  EXPECT_EQ(*r.Resolve(Call({"spiffe://t/org_b"})), "spiffe://t/org_b");
  const auto forged = r.Resolve(Call({"spiffe://t/org_b"}, {"org_a"}));
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(forged.status().message()), HasSubstr("this connection is not one"));
  EXPECT_EQ(r.Resolve(Call({})).status().code(), absl::StatusCode::kUnauthenticated);
  // The proxy names exactly one non-empty tenant, of the cache's size.
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/gateway"}, {""})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/gateway"}, {"a", "b"})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Resolve(Call({"spiffe://t/gateway"}, {std::string(257, 'x')})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TenantTest, ScopedIdsNeverCollideAcrossTenants) {
  EXPECT_EQ(ScopedRequestId("", "req-1"), "req-1");
  EXPECT_NE(ScopedRequestId("a", "b/c"), ScopedRequestId("a/b", "c"));
  EXPECT_NE(ScopedRequestId("org_1", "x"), ScopedRequestId("org_12", "x"));
  EXPECT_NE(ScopedRequestId("a", "x"), "x");
}

}  // namespace
}  // namespace hybridserve::decode
