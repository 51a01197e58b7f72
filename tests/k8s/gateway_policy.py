"""The policy checks of the OpenAI gateway pool (deploy/k8s/base/gateway.yaml;
manifest_policy_test runs them on every overlay and on deliberately broken
copies): its objects, image, HTTP probes, flags (the headless Service of
decode's pods, the API keys Secret, the same model as decode's), drain and,
on the overlays with components/mtls, its identity, decode's trust in it as a
proxy and the name it checks decode's certificate against.

The checks every pool shares (security context, resources, PDB, Services,
PodMonitor, topology spread, NetworkPolicy flows) are manifest_policy_test's
own, run over manifests.POOLS."""

import re

import manifests as m
from manifests import GATEWAY

# The flags the gateway defines (gateway/hybridserve_gateway/main.py's
# argparse): any other stops it at start.
GATEWAY_FLAGS = {"address", "decode", "model_dir", "api_keys", "tls_ca", "tls_cert", "tls_key", "tls_server_name",
                 "served_model_name", "max_body_bytes", "max_concurrency", "backlog", "max_header_bytes",
                 "header_read_timeout", "body_read_timeout", "drain_timeout", "default_max_tokens", "log_level"}
GATEWAY_TLS_FILES = {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"}
MIN_REPLICAS = 2
# The gateway's --drain_timeout default (GATEWAY_SPEC.md).
DEFAULT_DRAIN = "30s"


def _labels():
    return {"app.kubernetes.io/name": "hybridserve", "app.kubernetes.io/component": GATEWAY,
            "app.kubernetes.io/part-of": "hybridserve"}


def check_gateway_objects(objs):
    """The gateway's Deployment (its own labels, ServiceAccount, image and
    command, several replicas that no autoscaler also scales, a rollout that
    never drops a pod), its ClusterIP Service (http 8080), PDB,
    NetworkPolicy, PodMonitor and ServiceAccount."""
    errors = []
    name = f"hybridserve-{GATEWAY}"
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceAccount", "PodMonitor"):
        if not m.find(objs, kind, name):
            errors.append(f"missing {kind}/{name}")
    w = m.workload(objs, GATEWAY)
    if w is None:
        return errors
    tmpl = w["spec"]["template"]
    if tmpl["metadata"].get("labels") != _labels():
        errors.append(f"gateway: pod labels {tmpl['metadata'].get('labels')}")
    if not m.selector_matches(w["spec"]["selector"], tmpl["metadata"].get("labels", {}), False):
        errors.append("gateway: the Deployment's selector misses its own pods")
    if [c["name"] for c in tmpl["spec"]["containers"]] != [GATEWAY]:
        errors.append("gateway: containers are not exactly [gateway]")
    c = m.container(objs, GATEWAY)
    if m.container_ports(c) != m.GATEWAY_PORTS:
        errors.append(f"gateway: ports {m.container_ports(c)}, want {m.GATEWAY_PORTS}")
    if not c.get("image", "").startswith(m.GATEWAY_IMAGE + ":"):
        errors.append(f"gateway: image {c.get('image')}, want {m.GATEWAY_IMAGE}:<tag> (its own image)")
    if c.get("command") != [m.GATEWAY_COMMAND]:
        errors.append(f"gateway: command {c.get('command')}, want [{m.GATEWAY_COMMAND}]")
    account = tmpl["spec"].get("serviceAccountName")
    if account != name or not m.find(objs, "ServiceAccount", account):
        errors.append(f"gateway: runs as ServiceAccount {account}, want its own {name} (defined here)")
    if tmpl["spec"].get("automountServiceAccountToken") is not False:
        errors.append("gateway: the service-account token is mounted")
    autoscalers = [a for a in m.find(objs, "ScaledObject") + m.find(objs, "HorizontalPodAutoscaler")
                   if a["spec"].get("scaleTargetRef", {}).get("name") == name]
    if autoscalers:
        errors.append(f"gateway: scaled by {[a['metadata']['name'] for a in autoscalers]} beside its fixed replicas")
    if int(w["spec"].get("replicas", 1)) < MIN_REPLICAS:
        errors.append(f"gateway: {w['spec'].get('replicas', 1)} replicas (< {MIN_REPLICAS}: a drain or a rollout "
                      "leaves clients nothing)")
    rolling = w["spec"].get("strategy", {}).get("rollingUpdate", {})
    if w["spec"].get("strategy", {}).get("type", "RollingUpdate") != "RollingUpdate" or rolling.get(
            "maxSurge") != 1 or rolling.get("maxUnavailable") != 0:
        errors.append("gateway: rollout is not maxSurge 1, maxUnavailable 0")
    annotations = tmpl["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/port") != str(
            m.GATEWAY_PORTS["http"]) or annotations.get("prometheus.io/path") != "/metrics":
        errors.append("gateway: Prometheus scrape annotations missing or not http /metrics")
    svc = m.find(objs, "Service", name)
    if svc:
        spec = svc[0]["spec"]
        ports = [(p.get("name"), p["port"], p.get("targetPort")) for p in spec.get("ports", [])]
        if ports != [("http", 8080, "http")]:
            errors.append(f"Service {name}: ports {ports}, want [('http', 8080, 'http')]")
        if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("clusterIP") == "None":
            errors.append(f"Service {name}: type {spec.get('type')}, clusterIP {spec.get('clusterIP')} (want a "
                          "ClusterIP Service)")
    return errors


def check_gateway_probes(objs):
    """HTTP probes on the port --address listens on (the container port
    http): readiness /health (decode answers, not draining), liveness and
    startup /health/live; no gRPC probe (the gateway serves none)."""
    errors = []
    c = m.container(objs, GATEWAY)
    ports = m.container_ports(c)
    want = {"startupProbe": m.LIVENESS_PATH, "readinessProbe": m.READINESS_PATH, "livenessProbe": m.LIVENESS_PATH}
    for probe, path in want.items():
        p = c.get(probe) or {}
        get = p.get("httpGet")
        if not get:
            errors.append(f"gateway: no httpGet {probe}")
            continue
        port = ports.get(get.get("port"), get.get("port"))
        if port != ports.get("http"):
            errors.append(f"gateway: {probe} on port {get.get('port')}, not http {ports.get('http')}")
        if get.get("path") != path:
            errors.append(f"gateway: {probe} path {get.get('path')}, want {path}")
        if get.get("scheme", "HTTP") != "HTTP":
            errors.append(f"gateway: {probe} scheme {get.get('scheme')} (it serves plain HTTP)")
    return errors


# The headless Service of decode's pods the gateway dials (decode's own
# Service, hybridserve-decode, stays a ClusterIP for direct clients).
DECODE_PODS_SERVICE = "hybridserve-decode-pods"


def _decode_target(objs):
    """(the gRPC target the gateway must dial, the violations of the Service
    it names): the headless Service of decode's pods, its grpc port. That
    Service is headless (DNS answers each pod's IP, so the gateway's
    round_robin channel reaches every decode pod; through a ClusterIP one
    connection sits on one pod), selects exactly decode's pods (its selector
    is decode's Deployment's: the same pods as hybridserve-decode), targets
    decode's grpc port under the port hybridserve-decode serves, and leaves
    out pods that are not ready (starting, or draining after their deletion)."""
    errors = []
    svc = m.find(objs, "Service", DECODE_PODS_SERVICE)
    if not svc:
        return f"dns:///{DECODE_PODS_SERVICE}:50050", [f"missing Service/{DECODE_PODS_SERVICE} (decode's pods, "
                                                       "headless)"]
    spec = svc[0]["spec"]
    if spec.get("clusterIP") != "None":
        errors.append(f"Service {DECODE_PODS_SERVICE}: clusterIP {spec.get('clusterIP') or 'unset (a virtual IP)'}, "
                      "want None (headless: one address a decode pod; a ClusterIP holds a gateway pod's connection "
                      "on one decode pod)")
    if spec.get("publishNotReadyAddresses"):
        errors.append(f"Service {DECODE_PODS_SERVICE}: publishNotReadyAddresses (the gateway would send to decode "
                      "pods not ready or draining)")
    decode_selector = m.workload(objs, "decode")["spec"]["selector"]
    if {"matchLabels": spec.get("selector") or {}} != decode_selector:
        errors.append(f"Service {DECODE_PODS_SERVICE}: selector {spec.get('selector')}, want decode's pods' "
                      f"{decode_selector}")
    ports = {p.get("name"): p for p in spec.get("ports", [])}
    decode_port = next(p["port"] for p in m.one(objs, "Service", "hybridserve-decode")["spec"]["ports"]
                       if p.get("name") == "grpc")
    grpc_port = ports.get("grpc", {})
    target = grpc_port.get("targetPort", grpc_port.get("port"))
    if grpc_port.get("port") != decode_port or target not in ("grpc", m.container_ports(
            m.container(objs, "decode")).get("grpc")):
        errors.append(f"Service {DECODE_PODS_SERVICE}: port grpc {grpc_port.get('port')} -> {target}, want "
                      f"{decode_port} -> decode's grpc port")
    return f"dns:///{DECODE_PODS_SERVICE}:{grpc_port.get('port', decode_port)}", errors


def _model_source(objs, comp, path):
    """(volume, mount) of the volume a container reads `path` from, the
    longest mount path holding it; None when it is the image's own file."""
    volumes = {v["name"]: v for v in m.pod_spec(objs, comp).get("volumes", [])}
    best = None
    for mt in m.container(objs, comp).get("volumeMounts", []):
        mount = mt["mountPath"].rstrip("/")
        if (path == mount or path.startswith(mount + "/")) and (best is None or len(mount) > len(best[1]["mountPath"])):
            best = (volumes.get(mt["name"], {}), mt)
    return best


def check_gateway_flags(objs):
    """The gateway's flags (its args: it reads no flag file), each one it
    defines: --address on the port http; --decode the headless Service of
    decode's pods and its gRPC port (that Service as _decode_target checks
    it); --api_keys the key api_keys of the Secret
    hybridserve-gateway-api-keys (not optional: without it the gateway would
    take every request unauthenticated); --model_dir decode's --model_dir,
    read from the same source (the same PVC, or a copy of decode's image's
    directory made by an init container of decode's image); a drain covering
    decode's (--drain_timeout >= decode's --shutdown_grace) within its grace
    period."""
    errors = []
    try:
        f = m.flags(objs, GATEWAY)
    except (LookupError, ValueError) as e:
        return [str(e)]
    unknown = sorted(set(f) - GATEWAY_FLAGS)
    if unknown:
        errors.append(f"gateway: flags it does not define: {unknown}")
    c = m.container(objs, GATEWAY)
    if any(a.startswith("--flagfile") for a in c.get("args", [])):
        errors.append("gateway: --flagfile (it reads no flag file)")
    address = f.get("address", "")
    if not re.fullmatch(r"(0\.0\.0\.0|\[::\]|):[0-9]+", address) or m.port_of(address) != m.container_ports(c).get(
            "http"):
        errors.append(f"gateway: --address={address!r}, want 0.0.0.0 on the port http "
                      f"{m.container_ports(c).get('http')}")
    want, service_errors = _decode_target(objs)
    errors += service_errors
    if f.get("decode") != want:
        errors.append(f"gateway: --decode={f.get('decode')}, want {want} (every decode pod: the headless Service)")
    # The API keys.
    keys = f.get("api_keys")
    found = m.mounted_key(objs, GATEWAY, keys, "secret") if keys else None
    if found is None:
        errors.append(f"gateway: --api_keys={keys} is in no mounted Secret (no authentication)")
    else:
        secret = found[0]["secret"]
        if secret.get("secretName") != m.API_KEYS_SECRET or found[1] != m.API_KEYS_KEY:
            errors.append(f"gateway: --api_keys reads {secret.get('secretName')}/{found[1]}, want "
                          f"{m.API_KEYS_SECRET}/{m.API_KEYS_KEY}")
        if secret.get("optional"):
            errors.append(f"gateway: the Secret {secret.get('secretName')} is optional: a pod would start taking "
                          "every request unauthenticated")
    # The model: decode's directory, from decode's source.
    decode = m.flags(objs, "decode")
    model_dir = f.get("model_dir")
    if model_dir != decode.get("model_dir"):
        errors.append(f"gateway: --model_dir={model_dir}, decode reads {decode.get('model_dir')}")
    else:
        errors += _check_model_source(objs, model_dir)
    # The drain.
    try:
        drain = m.parse_duration_s(f.get("drain_timeout", DEFAULT_DRAIN))
        decode_drain = m.parse_duration_s(decode.get("shutdown_grace", "10s"))
    except ValueError as e:
        return errors + [f"gateway: {e}"]
    if drain < decode_drain:
        errors.append(f"gateway: --drain_timeout={f.get('drain_timeout', DEFAULT_DRAIN)} cuts streams decode would "
                      f"finish (decode's --shutdown_grace={decode.get('shutdown_grace')})")
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    if not pre_stop:
        errors.append("gateway: no preStop sleep (endpoint removal races SIGTERM)")
    period = m.pod_spec(objs, GATEWAY).get("terminationGracePeriodSeconds", 30)
    if period <= pre_stop + drain + m.GRACE_MARGIN_S:
        errors.append(f"gateway: terminationGracePeriodSeconds {period} <= preStop {pre_stop}s + --drain_timeout "
                      f"{drain:g}s + margin {m.GRACE_MARGIN_S}s")
    return errors


def _check_model_source(objs, model_dir):
    errors = []
    mine, theirs = _model_source(objs, GATEWAY, model_dir), _model_source(objs, "decode", model_dir)
    if mine is None:
        return [f"gateway: --model_dir={model_dir} is on no volume (its image has no model)"]
    volume, mount = mine
    if not mount.get("readOnly"):
        errors.append(f"gateway: {mount['mountPath']} is mounted writable")
    if theirs is not None and "persistentVolumeClaim" in theirs[0]:
        claim = theirs[0]["persistentVolumeClaim"]["claimName"]
        if volume.get("persistentVolumeClaim", {}).get("claimName") != claim:
            errors.append(f"gateway: --model_dir={model_dir} is not on decode's PVC {claim}")
        return errors
    if theirs is not None:
        return errors + [f"gateway: decode reads {model_dir} from a volume the check does not know"]
    # decode reads it from its image: an init container of decode's image
    # copies it into the gateway's volume.
    if "emptyDir" not in volume:
        return errors + [f"gateway: --model_dir={model_dir} is not a copy of decode's image's (no emptyDir)"]
    image = m.container(objs, "decode").get("image")
    copies = []
    for init in m.pod_spec(objs, GATEWAY).get("initContainers", []):
        into = [mt["mountPath"].rstrip("/") for mt in init.get("volumeMounts", []) if mt["name"] == mount["name"]]
        command = init.get("command", []) + init.get("args", [])
        if (init.get("image") == image and into and command[:2] == ["cp", "-R"]
                and command[2:] == [model_dir.rstrip("/") + "/.", into[0] + "/"]):
            copies.append(init["name"])
    if not copies:
        errors.append(f"gateway: no init container of decode's image ({image}) copies {model_dir} into its volume "
                      f"{mount['name']}")
    return errors


def check_gateway_tls(objs, example=None, trust_domain=None):
    """On the overlays with the mtls component: the gateway calls decode with
    its own certificate (--tls_cert, --tls_key, --tls_ca from its own
    Secret hybridserve-gateway-tls, cert-manager's keys, not optional);
    decode takes tenants from certificates and trusts exactly the gateway's
    identity as a proxy (--trusted_proxies), which is the URI SAN of the
    certificate the cert-manager example issues into that Secret (client
    auth, from the CA Issuer that issues decode's); decode's certificate
    carries the name the gateway checks it against (--tls_server_name, else
    the host it dials). On plaintext overlays, none of it (nor
    --tls_server_name, which the gateway refuses without --tls_ca).
    (example, trust_domain: the cert-manager example and the trust domain
    rendered with other settings.)"""
    errors = []
    f, decode = m.flags(objs, GATEWAY), m.flags(objs, "decode")
    if not decode.get("tls_cert"):  # decode's port in plaintext: no mtls component
        errors += [f"gateway: --{k} on a plaintext overlay" for k in [*GATEWAY_TLS_FILES, "tls_server_name"]
                   if k in f]
        if decode.get("trusted_proxies"):
            errors.append(f"decode: --trusted_proxies={decode['trusted_proxies']} without TLS")
        return errors
    secret = f"hybridserve-{GATEWAY}-tls"
    for flag, key in GATEWAY_TLS_FILES.items():
        found = m.mounted_key(objs, GATEWAY, f[flag], "secret") if f.get(flag) else None
        if found is None:
            errors.append(f"gateway: --{flag}={f.get(flag)} is in no mounted Secret (decode requires its certificate)")
            continue
        volume, got = found
        if volume["secret"].get("secretName") != secret or got != key:
            errors.append(f"gateway: --{flag} reads {volume['secret'].get('secretName')}/{got}, want {secret}/{key}")
        if volume["secret"].get("optional"):
            errors.append(f"gateway: its Secret {secret} is optional")
    if decode.get("tenant_from", "certificate") != "certificate":
        errors.append(f"decode: --tenant_from={decode.get('tenant_from')}, want certificate (a proxy's header only "
                      "for a trusted proxy)")
    identity = m.identity(objs, GATEWAY, trust_domain)
    proxies = [p.strip() for p in decode.get("trusted_proxies", "").split(",") if p.strip()]
    if proxies != [identity]:
        errors.append(f"decode: --trusted_proxies {proxies}, want exactly the gateway's identity [{identity}]")
    example = m.cert_manager_example() if example is None else example
    certificates = {c["spec"].get("secretName"): c for c in example if c["kind"] == "Certificate"}
    cert = certificates.get(secret)
    if cert is None:
        return errors + [f"gateway: the example issues no Certificate for its Secret {secret}"]
    spec = cert["spec"]
    if spec.get("uris") != proxies:
        errors.append(f"Certificate {cert['metadata']['name']}: uris {spec.get('uris')}, decode trusts {proxies}")
    if "client auth" not in (spec.get("usages") or []):
        errors.append(f"Certificate {cert['metadata']['name']}: usages {spec.get('usages')} lack client auth")
    decode_cert = certificates.get("hybridserve-decode-tls", {}).get("spec", {})
    if spec.get("issuerRef") != decode_cert.get("issuerRef"):
        errors.append(f"Certificate {cert['metadata']['name']}: issuer {spec.get('issuerRef')}, decode's "
                      f"certificate's (and CA) {decode_cert.get('issuerRef')}")
    # The name the gateway checks decode's certificate against: --tls_server_name,
    # else the host it dials (the headless Service's, on no certificate).
    host = f.get("tls_server_name") or f.get("decode", "").split("///", 1)[-1].rsplit(":", 1)[0]
    if host not in (decode_cert.get("dnsNames") or []):
        errors.append(f"gateway: checks decode's certificate against {host!r}, not among its dnsNames "
                      f"{decode_cert.get('dnsNames')}")
    return errors
