"""The mutual-TLS policy checks over the rendered manifests of the overlays with
components/mtls (manifest_policy_test runs them, on every such overlay and on
deliberately broken copies): each pool's own Secret behind every TLS file it
reads, the TLS flags as each binary parses them, probes on the plaintext health
port, allowed peers against the callers the NetworkPolicies let in, SPIFFE IDs
built from the settings, and the cert-manager example against all of that."""

import re

import manifests as m
from manifests import COMPONENTS, PORTS


# --- mutual TLS (overlays with components/mtls) ---------------------------------

# The TLS flags each binary defines (common/tls_flags.cc; decode/main.cc adds
# the tenant's): any other tls_/tenant_/trusted_ flag stops the binary at start.
TLS_FLAGS = {"tls_cert", "tls_key", "tls_ca", "tls_client_ca", "tls_client_auth", "tls_allowed_peers", "tls_refresh",
             "health_address"}
BINARY_TLS_FLAGS = {"decode": TLS_FLAGS | {"tenant_from", "trusted_proxies"}, "prefill": TLS_FLAGS,
                    "cachestore": TLS_FLAGS}
TLS_FILE_FLAGS = ("tls_cert", "tls_key", "tls_ca", "tls_client_ca")


def _peers(f):
    return [p.strip() for p in f.get("tls_allowed_peers", "").split(",") if p.strip()]


def check_tls_flags(objs):
    """The TLS flags as each binary parses them (common/tls_flags.cc,
    decode/main.cc): TLS on, with a CA for the calls it makes and verified
    client certificates; values each binary accepts."""
    errors = []
    for comp in COMPONENTS:
        f = m.flags(objs, comp)
        unknown = sorted(k for k in f if re.match(r"(tls_|tenant_|trusted_|health_)", k)
                         and k not in BINARY_TLS_FLAGS[comp])
        if unknown:
            errors.append(f"{comp}: flags the binary does not define: {unknown}")
        for flag in ("tls_cert", "tls_key", "tls_ca"):
            if not f.get(flag):
                errors.append(f"{comp}: no --{flag}")
        auth = f.get("tls_client_auth", "require")
        if auth not in ("none", "request", "require"):
            errors.append(f"{comp}: --tls_client_auth={auth}")
        elif auth == "none":
            errors.append(f"{comp}: --tls_client_auth=none: callers are not authenticated")
        try:
            if m.parse_duration_s(f.get("tls_refresh", "10s")) < 1:
                errors.append(f"{comp}: --tls_refresh={f.get('tls_refresh')} (< 1s is refused)")
        except ValueError as e:
            errors.append(f"{comp}: --tls_refresh: {e}")
        for peer in _peers(f):
            if not (re.fullmatch(r"spiffe://[a-z0-9.-]+(/[A-Za-z0-9._~-]+)+", peer)
                    or re.fullmatch(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?", peer)):
                errors.append(f"{comp}: --tls_allowed_peers entry {peer!r} is no SPIFFE ID or DNS name")
        health = f.get("health_address", "")
        if not re.fullmatch(r"(0\.0\.0\.0|\[::\]|):[0-9]+", health):
            errors.append(f"{comp}: --health_address={health!r}: the kubelet probes the pod IP, bind 0.0.0.0:PORT")
    decode = m.flags(objs, "decode")
    if decode.get("tenant_from", "certificate") != "certificate":
        errors.append(f"decode: --tenant_from={decode.get('tenant_from')}, want certificate (tenants by client "
                      "certificate)")
    if decode.get("tls_client_auth", "require") != "require":
        errors.append(f"decode: --tls_client_auth={decode.get('tls_client_auth')}: a tenant needs a certificate, "
                      "require it at the handshake")
    return errors


def check_tls_secrets(objs):
    """Every TLS file a container reads comes from its own pool's Secret
    (hybridserve-<pool>-tls, not optional), with cert-manager's keys."""
    errors = []
    owners = {}
    for comp in COMPONENTS:
        f = m.flags(objs, comp)
        want = f"hybridserve-{comp}-tls"
        for flag in TLS_FILE_FLAGS:
            if not f.get(flag):
                continue
            found = m.mounted_key(objs, comp, f[flag], "secret")
            if found is None:
                errors.append(f"{comp}: --{flag}={f[flag]} is in no mounted Secret")
                continue
            volume, key = found
            secret = volume["secret"]
            if secret.get("secretName") != want:
                errors.append(f"{comp}: --{flag} reads the Secret {secret.get('secretName')}, want its own {want}")
            if secret.get("optional"):
                errors.append(f"{comp}: its Secret {secret.get('secretName')} is optional: a pod would start without "
                              "its identity")
            if key not in m.TLS_SECRET_KEYS:
                errors.append(f"{comp}: --{flag} reads key {key!r}, not one of cert-manager's {m.TLS_SECRET_KEYS}")
            owners.setdefault(secret.get("secretName"), set()).add(comp)
        expected_keys = {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"}
        for flag, key in expected_keys.items():
            found = m.mounted_key(objs, comp, f.get(flag, ""), "secret") if f.get(flag) else None
            if found is not None and found[1] != key:
                errors.append(f"{comp}: --{flag} reads {found[1]}, want {key}")
    errors += [f"Secret {name} is mounted by several pools {sorted(comps)}: one identity each"
               for name, comps in owners.items() if len(comps) > 1]
    return list(dict.fromkeys(errors))  # each once, though several flags read the same Secret


def check_tls_health(objs):
    """Probes on the plaintext health port: the container port named health,
    where --health_address listens, and no other port of the pod."""
    errors = []
    for comp in COMPONENTS:
        c = m.container(objs, comp)
        ports = m.container_ports(c)
        f = m.flags(objs, comp)
        if ports.get("health") != m.HEALTH_PORT:
            errors.append(f"{comp}: no container port health {m.HEALTH_PORT} (ports {ports})")
        if not f.get("health_address") or m.port_of(f["health_address"]) != ports.get("health"):
            errors.append(f"{comp}: --health_address={f.get('health_address')} is not the port health "
                          f"{ports.get('health')}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("grpc", {}).get("port")
            if port != ports.get("health"):
                errors.append(f"{comp}: {probe} on port {port}, not the health port {ports.get('health')}")
    return errors


def check_tls_peers(objs):
    """--tls_allowed_peers of each pool names exactly the identities of the
    pools the NetworkPolicies let reach its gRPC port; a port open to clients
    anywhere (decode's) names none (any certificate the CA verifies)."""
    errors = []
    flows = m.allowed_flows(objs)
    for comp in COMPONENTS:
        callers = {src for src, dst, port, _ in flows if dst == comp and port == PORTS[comp]["grpc"]}
        peers = set(_peers(m.flags(objs, comp)))
        if callers - set(COMPONENTS):
            if peers:
                errors.append(f"{comp}: its gRPC port is open to clients, yet --tls_allowed_peers names "
                              f"{sorted(peers)}")
            continue
        want = {m.identity(objs, c) for c in callers}
        if peers != want:
            errors.append(f"{comp}: --tls_allowed_peers {sorted(peers)}, but the NetworkPolicies let in "
                          f"{sorted(callers)}: {sorted(want)}")
    return errors


SPIFFE_ID_TEMPLATE = re.compile(r"spiffe://\$\(TRUST_DOMAIN\)/ns/\$\(POD_NAMESPACE\)/sa/[a-z0-9-]+")


def check_spiffe_ids(objs, trust_domain=None):
    """Every SPIFFE ID a pool's flags name is written
    spiffe://$(TRUST_DOMAIN)/ns/$(POD_NAMESPACE)/sa/<account> on its args,
    which the kubelet expands from the pod's env: POD_NAMESPACE its own
    namespace (downward API), TRUST_DOMAIN the setting (settings.yaml): no
    namespace or trust domain is written out in them or in a flag file."""
    errors = []
    trust_domain = trust_domain or m.settings()["trust_domain"]
    for comp in COMPONENTS:
        c = m.container(objs, comp)
        texts = list(c.get("args", []))
        for arg in c.get("args", []):
            if arg.startswith("--flagfile="):
                for path in arg.split("=", 1)[1].split(","):
                    texts += list(m._flag_lines(m._mounted_file(objs, comp, path) or ""))
        ids = [i for text in texts for i in re.findall(r"spiffe://[^,\s]+", text)]
        errors += [f"{comp}: SPIFFE ID {i} is not spiffe://$(TRUST_DOMAIN)/ns/$(POD_NAMESPACE)/sa/<account>"
                   for i in ids if not SPIFFE_ID_TEMPLATE.fullmatch(i)]
        if not ids:
            continue
        env = {e["name"]: e for e in c.get("env", [])}
        if env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.namespace":
            errors.append(f"{comp}: POD_NAMESPACE is not the downward API's metadata.namespace")
        if env.get("TRUST_DOMAIN", {}).get("value") != trust_domain:
            errors.append(f"{comp}: TRUST_DOMAIN {env.get('TRUST_DOMAIN', {}).get('value')!r}, the setting is "
                          f"{trust_domain!r}")
    return errors


def check_tls_certificates(objs, example=None, trust_domain=None):
    """The cert-manager example issues each pool's Secret with the pool's
    identity (URI SAN), its Service's names (what callers dial and verify),
    server and client usage, from a CA Issuer whose CA it also issues."""
    example = m.cert_manager_example() if example is None else example
    errors = []
    certificates = {c["spec"].get("secretName"): c for c in example if c["kind"] == "Certificate"}
    issuers = {i["metadata"]["name"]: i for i in example if i["kind"] == "Issuer"}
    for comp in COMPONENTS:
        f = m.flags(objs, comp)
        found = m.mounted_key(objs, comp, f.get("tls_cert", ""), "secret") if f.get("tls_cert") else None
        if found is None:
            errors.append(f"{comp}: reads no certificate from a Secret")
            continue
        secret = found[0]["secret"]["secretName"]
        cert = certificates.get(secret)
        if cert is None:
            errors.append(f"{comp}: the example issues no Certificate for its Secret {secret}")
            continue
        spec = cert["spec"]
        namespace = m.workload(objs, comp)["metadata"].get("namespace", "default")
        if cert["metadata"].get("namespace") != namespace:
            errors.append(f"Certificate {cert['metadata']['name']}: namespace {cert['metadata'].get('namespace')}, "
                          f"the pods' is {namespace}")
        if spec.get("uris") != [m.identity(objs, comp, trust_domain)]:
            errors.append(f"Certificate {cert['metadata']['name']}: uris {spec.get('uris')}, want "
                          f"[{m.identity(objs, comp, trust_domain)}]")
        service = m.SERVICES[comp]
        names = {service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
                 f"{service}.{namespace}.svc.cluster.local"}
        missing = names - set(spec.get("dnsNames") or [])
        if missing:
            errors.append(f"Certificate {cert['metadata']['name']}: dnsNames lack {sorted(missing)}")
        if not {"server auth", "client auth"} <= set(spec.get("usages") or []):
            errors.append(f"Certificate {cert['metadata']['name']}: usages {spec.get('usages')} lack server auth and "
                          "client auth")
        issuer = issuers.get(spec.get("issuerRef", {}).get("name"))
        if spec.get("issuerRef", {}).get("kind", "Issuer") != "Issuer" or issuer is None or "ca" not in issuer["spec"]:
            errors.append(f"Certificate {cert['metadata']['name']}: not issued by a CA Issuer of the example")
            continue
        ca = certificates.get(issuer["spec"]["ca"].get("secretName"))
        if ca is None or not ca["spec"].get("isCA"):
            errors.append(f"Issuer {issuer['metadata']['name']}: its CA Secret is not an isCA Certificate here")
    return list(dict.fromkeys(errors))  # each once, though several Certificates share the Issuer
