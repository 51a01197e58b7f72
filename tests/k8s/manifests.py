"""The rendered Kubernetes manifests of deploy/k8s, as Python objects, and the
checks tests/k8s/manifest_policy_test.py runs over them (pool_policy.py, autoscaling_policy.py,
cachestore_policy.py, gateway_policy.py, tls_policy.py).

Each check takes the rendered objects of one overlay (a list of dicts, as
`kubectl kustomize` prints them) and returns a list of violations (strings;
empty when the manifests comply), so a test can run it on the real render and
on a deliberately broken copy."""

import os
import re
import shutil
import subprocess
import tempfile

import yaml

COMPONENTS = ("decode", "prefill", "cachestore")
WORKERS = ("decode", "prefill")
# The OpenAI gateway (deploy/k8s/base/gateway.yaml): an HTTP pool in front of
# decode, from its own image; POOLS: every pool the NetworkPolicies isolate.
GATEWAY = "gateway"
POOLS = COMPONENTS + (GATEWAY,)
# docs: /work/briefs/k8s-conventions.md, restated in deploy/k8s/README.md.
PORTS = {
    "decode": {"grpc": 50050, "data": 50070, "metrics": 9090},
    "prefill": {"grpc": 50061, "metrics": 9090},
    "cachestore": {"grpc": 50051, "bulk": 50052, "metrics": 9090},
}
# Each component's Service: the workers' ClusterIP names, the cachestore
# shards' headless Service (each address one shard; the workers' --cachestore
# resolves it), whose pods the StatefulSet names. Headless: prefill's (decode
# resolves every pod) and the shards'.
SERVICES = {"decode": "hybridserve-decode", "prefill": "hybridserve-prefill",
            "cachestore": "hybridserve-cachestore-shards"}
HEADLESS = ("prefill", "cachestore")
# The cachestore's disk tier: the StatefulSet's volumeClaimTemplate, where
# it is mounted (--disk_dir), and the share of the volume the disk budget
# and the write queue's temp files may take (the rest: the filesystem's).
CACHE_VOLUME = "cache"
DISK_DIR = "/var/lib/hybridserve/cache"
DISK_SHARE = 0.9
# The gateway: its one port (the API, /health, /health/live, /metrics), its
# image and command (deploy/docker/gateway.Dockerfile: the venv's console
# script), the API keys Secret the operator creates (its key, the file
# --api_keys reads), and the HTTP paths of its probes (GATEWAY_SPEC).
GATEWAY_PORTS = {"http": 8080}
GATEWAY_IMAGE = "hybridserve-gateway"
GATEWAY_COMMAND = "/opt/hybridserve/venv/bin/hybridserve-gateway"
API_KEYS_SECRET = "hybridserve-gateway-api-keys"
API_KEYS_KEY = "api_keys"
READINESS_PATH = "/health"
LIVENESS_PATH = "/health/live"
# The mtls component (deploy/k8s/components/mtls): the plaintext health-only
# port every pool gets (the container port named health), and where each pool's Secret is
# mounted, with cert-manager's keys.
HEALTH_PORT = 50080
MTLS_COMPONENT = "components/mtls"
TLS_MOUNT = "/etc/hybridserve/tls"
TLS_SECRET_KEYS = ("tls.crt", "tls.key", "ca.crt")
LIVENESS_SERVICE = "hybridserve.liveness"
BINARY = "/opt/hybridserve/bin/{}"
RUN_AS_USER = 10001
# KEDA (the default autoscaling, deploy/k8s/base/autoscaling.yaml) and the
# alternative, prometheus-adapter with autoscaling/v2 HPAs.
KEDA_API = "keda.sh/v1alpha1"
ADAPTER_COMPONENT = "components/prometheus-adapter"
# The fields of a KEDA ScaledObject's spec and of a trigger (KEDA 2.x CRD,
# keda.sh_scaledobjects.yaml); anything else the API server would refuse or drop.
KEDA_SPEC_FIELDS = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
                    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers"}
KEDA_TRIGGER_FIELDS = {"type", "name", "metadata", "metricType", "useCachedMetrics", "authenticationRef"}
# A Prometheus trigger's metadata KEDA requires, and the ones it also reads.
KEDA_PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
KEDA_PROMETHEUS_FIELDS = KEDA_PROMETHEUS_REQUIRED | {"activationThreshold", "ignoreNullValues", "namespace",
                                                     "customHeaders", "queryParameters", "unsafeSsl", "timeout"}
# The Prometheus Operator's PodMonitor (monitoring.coreos.com/v1): the spec
# and endpoint fields its CRD defines (no schema validates it offline).
POD_MONITOR_API = "monitoring.coreos.com/v1"
POD_MONITOR_SPEC_FIELDS = {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels",
                           "sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit",
                           "attachMetadata", "scrapeProtocols", "keepDroppedTargets", "scrapeClass", "bodySizeLimit",
                           "selectMechanism", "fallbackScrapeProtocol", "scrapeClassicHistograms",
                           "nativeHistogramBucketLimit", "nativeHistogramMinBucketFactor",
                           "convertClassicHistogramsToNHCB"}
POD_METRICS_ENDPOINT_FIELDS = {"port", "portNumber", "targetPort", "path", "scheme", "params", "interval",
                               "scrapeTimeout", "honorLabels", "honorTimestamps", "relabelings", "metricRelabelings",
                               "tlsConfig", "basicAuth", "bearerTokenSecret", "authorization", "oauth2", "proxyUrl",
                               "followRedirects", "enableHttp2", "filterRunning", "trackTimestampsStaleness"}
# GPU placement (deploy/k8s/overlays/gpu): CUDA 13 needs an NVIDIA driver
# >= 580, which GPU Feature Discovery labels nodes with.
DRIVER_LABEL = "nvidia.com/cuda.driver-version.major"
MIN_DRIVER_MAJOR = 580
# On a GPU, decode batches at least this many requests (the cpu overlay's 8
# leaves it idle), and its streams get this long to finish after SIGTERM.
GPU_MIN_BATCH = 32
GPU_STREAM_DRAIN_S = 300
# The custom resources the overlays render ((apiVersion, kind)): no schema
# in kubernetes-validate; the policy test checks their structure.
CUSTOM_KINDS = {(KEDA_API, "ScaledObject"), (POD_MONITOR_API, "PodMonitor"), (POD_MONITOR_API, "PrometheusRule")}
# Seconds of margin a grace period keeps beyond the drain it must cover.
GRACE_MARGIN_S = 5
# Seconds a rollout's progress deadline keeps beyond its pods' startup probe
# window: an image pull (a multi-GB image on a cold node).
IMAGE_PULL_MARGIN_S = 300


# --- rendering -------------------------------------------------------------

def k8s_dir():
    """deploy/k8s: from Bazel's runfiles, else from this checkout."""
    if "TEST_SRCDIR" in os.environ:
        return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), "deploy",
                            "k8s")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "k8s")


SETTINGS = os.path.join("settings", "settings.yaml")


def settings():
    """deploy/k8s/settings/settings.yaml's settings, {name: value}."""
    with open(os.path.join(k8s_dir(), SETTINGS), encoding="utf-8") as f:
        return yaml.safe_load(f)["data"]


def render(overlay, components=(), settings_override=None, edit=None):
    """The objects `kubectl kustomize deploy/k8s/overlays/<overlay>` renders;
    with `components` (paths relative to deploy/k8s, e.g.
    "components/prometheus-adapter"), those of an overlay over it that adds
    them, as a user's overlay would; with `settings_override` ({name: value}),
    those settings changed in settings/settings.yaml first; with `edit` (a
    function of the copy's root directory), after it changed the copy."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        # A real copy: kustomize refuses symlinks leading outside its root.
        root = shutil.copytree(k8s_dir(), os.path.join(tmp, "k8s"))
        if edit:
            edit(root)
        if settings_override:
            path = os.path.join(root, SETTINGS)
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
            doc["data"].update(settings_override)
            with open(path, "w", encoding="utf-8") as f:
                yaml.safe_dump(doc, f)
        target = os.path.join(root, "overlays", overlay)
        if components:
            target = os.path.join(root, "alternatives", "with-components")
            os.makedirs(target)
            with open(os.path.join(target, "kustomization.yaml"), "w", encoding="utf-8") as f:
                yaml.safe_dump({"resources": [os.path.join("..", "..", "overlays", overlay)],
                                "components": [os.path.join("..", "..", c) for c in components]}, f)
        out = subprocess.run(["kubectl", "kustomize", target], check=True, capture_output=True, text=True).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def render_namespace(settings_override=None):
    """The objects of deploy/k8s/namespace (the Namespace, applied once, on
    its own: no overlay renders it)."""
    return render(os.path.join("..", "namespace"), settings_override=settings_override)


def overlays():
    return sorted(os.listdir(os.path.join(k8s_dir(), "overlays")))


def overlay_components(overlay):
    """The kustomize Components an overlay lists, as paths relative to
    deploy/k8s (e.g. "components/mtls")."""
    path = os.path.join(k8s_dir(), "overlays", overlay, "kustomization.yaml")
    with open(path, encoding="utf-8") as f:
        kustomization = yaml.safe_load(f)
    base = os.path.join("overlays", overlay)
    return [os.path.normpath(os.path.join(base, c)) for c in kustomization.get("components") or []]


def uses_mtls(overlay):
    return MTLS_COMPONENT in overlay_components(overlay)


def cert_manager_example(settings_override=None):
    """The objects of components/mtls/cert-manager (cert-manager's
    Certificates and Issuers with the settings; rendered by no overlay:
    cert-manager's CRDs)."""
    return render(os.path.join("..", MTLS_COMPONENT, "cert-manager"), settings_override=settings_override)


def monitoring_rules():
    """The prometheus-adapter rules of deploy/k8s/monitoring (its config.yaml)."""
    path = os.path.join(k8s_dir(), "monitoring", "prometheus-adapter-config.yaml")
    with open(path, encoding="utf-8") as f:
        config_map = yaml.safe_load(f)
    return yaml.safe_load(config_map["data"]["config.yaml"])["rules"]


def rules_files():
    """{file name: its groups} of deploy/k8s/monitoring/rules' rule files
    (recording and alerting rules, as Prometheus' rule_files load them)."""
    found = {}
    for name in ("hybridserve.rules.yaml", "hybridserve.alerts.yaml"):
        with open(os.path.join(k8s_dir(), "monitoring", "rules", name), encoding="utf-8") as f:
            found[name] = yaml.safe_load(f)["groups"]
    return found


def recording_rules():
    """The Prometheus recording rules of deploy/k8s/monitoring/rules, {record: expr}."""
    path = os.path.join(k8s_dir(), "monitoring", "rules", "hybridserve.rules.yaml")
    with open(path, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["groups"]
    return {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}


# --- object access ---------------------------------------------------------

def find(objs, kind, name=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs, kind, name):
    found = find(objs, kind, name)
    if len(found) != 1:
        raise LookupError(f"{kind}/{name}: {len(found)} objects")
    return found[0]


# The flags ConfigMaps' generator names (the workers', the cachestore's):
# kustomize appends a hash of the data (<name>-<10 characters>), so that an
# edit renames one and every Deployment that mounts it rolls.
CONFIG_NAME = "hybridserve-config"
CACHESTORE_CONFIG_NAME = "hybridserve-cachestore-config"
CONFIG_NAMES = (CONFIG_NAME, CACHESTORE_CONFIG_NAME)
_HASHED = re.compile(r"-[a-z0-9]{10}$")


def config_map(objs, name=CONFIG_NAME):
    """The ConfigMap generated as `name` (its name with kustomize's hash
    suffix, or exactly `name`)."""
    found = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"] == name or (
        o["metadata"]["name"].startswith(name + "-") and _HASHED.fullmatch(o["metadata"]["name"][len(name):]))]
    if len(found) != 1:
        raise LookupError(f"ConfigMap/{name}: {len(found)} objects")
    return found[0]


def generator_name(obj):
    """An object's name without kustomize's hash suffix where it is a flags
    ConfigMap (its name as generated), else its name."""
    name = obj["metadata"]["name"]
    for generated in CONFIG_NAMES:
        if obj["kind"] == "ConfigMap" and name.startswith(generated + "-") and _HASHED.fullmatch(
                name[len(generated):]):
            return generated
    return name


def config_map_refs(obj):
    """The names of the ConfigMaps a workload's pods mount (volumes, projected
    volumes) or read (env, envFrom), in order."""
    spec = obj["spec"]["template"]["spec"]
    refs = []
    for v in spec.get("volumes", []):
        if "configMap" in v:
            refs.append(v["configMap"]["name"])
        for source in v.get("projected", {}).get("sources", []):
            if "configMap" in source:
                refs.append(source["configMap"]["name"])
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                refs.append(ref["name"])
        for e in c.get("envFrom", []):
            if "configMapRef" in e:
                refs.append(e["configMapRef"]["name"])
    return refs


def workload(objs, component):
    """The Deployment (or StatefulSet) of a component, or None."""
    for kind in ("Deployment", "StatefulSet"):
        found = find(objs, kind, f"hybridserve-{component}")
        if found:
            return found[0]
    return None


def pod_spec(objs, component):
    return workload(objs, component)["spec"]["template"]["spec"]


def container(objs, component):
    for c in pod_spec(objs, component)["containers"]:
        if c["name"] == component:
            return c
    raise LookupError(f"no container {component}")


def container_ports(c):
    return {p.get("name"): p["containerPort"] for p in c.get("ports", [])}


def selector_matches(selector, labels, empty_matches_all=True):
    """A Kubernetes label selector (matchLabels, matchExpressions) on labels."""
    if selector is None:
        return False
    if not selector and not empty_matches_all:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        op, key, values = e["operator"], e["key"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def node_affinity_admits(pod_spec, node_labels):
    """Whether a pod's required node affinity and nodeSelector admit a node
    with these labels (the scheduler's rules: terms ORed, expressions ANDed;
    Gt and Lt compare integers)."""
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if node_labels.get(k) != v:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True

    def expression(e):
        key, op, values = e["key"], e["operator"], e.get("values") or []
        value = node_labels.get(key)
        if op == "In":
            return value in values
        if op == "NotIn":
            return value not in values
        if op == "Exists":
            return key in node_labels
        if op == "DoesNotExist":
            return key not in node_labels
        if op in ("Gt", "Lt"):
            try:
                number, bound = int(value), int(values[0])
            except (TypeError, ValueError, IndexError):
                return False
            return number > bound if op == "Gt" else number < bound
        raise ValueError(f"unknown operator {op}")

    return any(all(expression(e) for e in term.get("matchExpressions") or [])
               for term in required.get("nodeSelectorTerms") or [])


# --- flags -----------------------------------------------------------------

def parse_duration_s(text):
    """An absl duration ("30s", "1m30s", "500ms") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ms|us|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _flag_lines(text):
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


def mounted_key(objs, component, path, source):
    """Where a file a container reads comes from: (volume, key) of the
    `source` ("configMap" or "secret") volume mounted over `path`, the key
    mapped through the volume's items as the kubelet does; None when no such
    volume holds the path (not checked: whether the object has the key)."""
    spec = pod_spec(objs, component)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container(objs, component).get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/") + "/"
        volume = volumes.get(m["name"], {})
        if not path.startswith(mount) or source not in volume or m.get("subPath"):
            continue
        key = path[len(mount):]
        items = volume[source].get("items")
        if items is not None:
            mapped = [item["key"] for item in items if item["path"] == key]
            if not mapped:
                continue
            key = mapped[0]
        return volume, key
    return None


def _mounted_file(objs, component, path):
    """The text of a file a container reads from a mounted ConfigMap, or None."""
    found = mounted_key(objs, component, path, "configMap")
    if found is None:
        return None
    volume, key = found
    cms = find(objs, "ConfigMap", volume["configMap"]["name"])
    if cms and key in (cms[0].get("data") or {}):
        return cms[0]["data"][key]
    return None


def identity(objs, component, trust_domain=None):
    """The SPIFFE ID of a component's pods: their ServiceAccount's, in the
    SPIFFE convention spiffe://<trust domain>/ns/<namespace>/sa/<name> (the
    trust domain: the setting's unless given)."""
    w = workload(objs, component)
    account = w["spec"]["template"]["spec"].get("serviceAccountName", "default")
    trust_domain = trust_domain or settings()["trust_domain"]
    return f"spiffe://{trust_domain}/ns/{w['metadata'].get('namespace', 'default')}/sa/{account}"


def container_env(objs, component):
    """The component container's env as the kubelet sets it, where known
    before the pod runs: literal values, and the downward API's
    metadata.namespace (the workload's namespace). {name: value}."""
    env = {}
    for e in container(objs, component).get("env", []):
        if "value" in e:
            env[e["name"]] = expand_vars(e["value"], env)
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = workload(objs, component)["metadata"].get("namespace", "default")
    return env


def expand_vars(text, env):
    """Kubernetes' $(NAME) expansion of args: a defined variable's value, an
    undefined one left as written; $$ is a literal $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda mt: "$" if mt.group(0) == "$$" else env.get(mt.group(1), mt.group(0)), text)


def flags(objs, component):
    """The component container's flags, {name: value}, as its binary sees them:
    its args ($(VAR) expanded from the env as the kubelet does, where known:
    container_env), each --flagfile expanded from the mounted ConfigMap
    (later values win, as in absl). Raises LookupError for a flag file not mounted."""
    result = {}

    def take(arg):
        m = re.fullmatch(r"--?([A-Za-z0-9_]+)(?:=(.*))?", arg)
        if not m:
            raise ValueError(f"{component}: not a flag: {arg!r}")
        name, value = m.group(1), m.group(2) if m.group(2) is not None else "true"
        if name == "flagfile":
            for path in value.split(","):
                text = _mounted_file(objs, component, path)
                if text is None:
                    raise LookupError(f"{component}: --flagfile {path} is no mounted ConfigMap key")
                for line in _flag_lines(text):
                    take(line)
        else:
            result[name] = value

    env = container_env(objs, component)
    for arg in container(objs, component).get("args", []):
        take(expand_vars(arg, env))
    return result


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def mib(quantity):
    """A memory quantity ("2Gi", "512Mi") in MiB."""
    m = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti)?", str(quantity))
    if not m:
        raise ValueError(f"unsupported quantity {quantity!r}")
    scale = {None: 1 / (1 << 20), "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1 << 20}[m.group(2)]
    return int(m.group(1)) * scale


# --- network policies --------------------------------------------------------

class Endpoint:
    """A pod as a NetworkPolicy sees it: namespace, labels, named ports."""

    def __init__(self, name, namespace, labels, ports):
        self.name, self.namespace, self.labels = name, namespace, labels
        self.ports = ports  # [(name, number, protocol)]


# The pods outside hybridserve a flow may involve. Prometheus and the
# cluster DNS are where the settings say (deploy/k8s/settings/settings.yaml:
# by default namespace monitoring, label app.kubernetes.io/name=prometheus;
# kube-system, k8s-app=kube-dns), as deploy/k8s/README.md states.
def outside_endpoints(s):
    return [
        Endpoint("client", "clients", {"app": "client"}, []),
        Endpoint("pod-in-namespace", s["namespace"], {"app": "debug"}, []),
        Endpoint("prometheus", s["prometheus_namespace"], {"app.kubernetes.io/name": s["prometheus_name"]},
                 [("web", 9090, "TCP")]),
        Endpoint("grafana", s["prometheus_namespace"], {"app.kubernetes.io/name": "grafana"}, [("web", 3000, "TCP")]),
        Endpoint("dns", s["dns_namespace"], {"k8s-app": s["dns_k8s_app"]}, [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")]),
    ]


OUTSIDE = outside_endpoints(settings())
# The trust domain of the mtls component's SPIFFE IDs (the setting).
TRUST_DOMAIN = settings()["trust_domain"]

# Clients are anyone: decode's gRPC port and the gateway's HTTP port are
# open to every pod (Prometheus scrapes the gateway on its HTTP port).
CLIENTS = tuple(e.name for e in OUTSIDE)
# (from, to, port, protocol): every flow allowed into or out of a hybridserve
# pod; all others must be denied (the gateway reaches decode's client port
# alone: not prefill, the cachestore, decode's data port, another gateway).
EXPECTED_FLOWS = (
    {(c, "decode", 50050, "TCP") for c in CLIENTS}
    | {(c, GATEWAY, 8080, "TCP") for c in CLIENTS}
    | {(GATEWAY, "decode", 50050, "TCP")}
    | {(GATEWAY, "dns", 53, p) for p in ("UDP", "TCP")}
    | {
        ("decode", "prefill", 50061, "TCP"),
        ("prefill", "decode", 50070, "TCP"),
        ("decode", "cachestore", 50051, "TCP"),
        ("prefill", "cachestore", 50051, "TCP"),
        ("decode", "cachestore", 50052, "TCP"),
        ("prefill", "cachestore", 50052, "TCP"),
    }
    | {("prometheus", c, 9090, "TCP") for c in COMPONENTS}
    | {(c, "dns", 53, p) for c in COMPONENTS for p in ("UDP", "TCP")}
)


def endpoints(objs, outside=None):
    pods = []
    for component in POOLS:
        w = workload(objs, component)
        if w is None:
            continue
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        ports = [(p.get("name"), p["containerPort"], p.get("protocol", "TCP"))
                 for c in w["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
        pods.append(Endpoint(component, w["metadata"].get("namespace", "default"), labels, ports))
    return pods + (OUTSIDE if outside is None else outside)


def _namespace_labels(objs, namespace):
    labels = {"kubernetes.io/metadata.name": namespace}
    for ns in find(objs, "Namespace", namespace):
        labels.update(ns["metadata"].get("labels") or {})
    return labels


def _peer_matches(objs, peer, policy_ns, other):
    if "ipBlock" in peer:
        return False  # pods are not matched by address here; check_network_policies refuses ipBlock
    pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
    if ns_sel is None:
        in_namespace = other.namespace == policy_ns
    else:
        in_namespace = selector_matches(ns_sel, _namespace_labels(objs, other.namespace))
    return in_namespace and (pod_sel is None or selector_matches(pod_sel, other.labels))


def _port_matches(rule_ports, target, port, protocol):
    if not rule_ports:
        return True
    for rp in rule_ports:
        if rp.get("protocol", "TCP") != protocol:
            continue
        p = rp.get("port")
        if p is None:
            return True
        if isinstance(p, str):
            if any(name == p and number == port and proto == protocol for name, number, proto in target.ports):
                return True
        elif p <= port <= rp.get("endPort", p):
            return True
    return False


def _policy_types(policy):
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def _direction_allows(objs, policies, direction, pod, other, target, port, protocol):
    """Whether the policies selecting `pod` let it talk to `other` in one direction."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies if p["metadata"].get("namespace", "default") == pod.namespace
                 and selector_matches(p["spec"].get("podSelector", {}), pod.labels)
                 and direction in _policy_types(p)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key)
            if peers and not any(_peer_matches(objs, peer, pod.namespace, other) for peer in peers):
                continue
            if _port_matches(rule.get("ports"), target, port, protocol):
                return True
    return False


def allowed_flows(objs, outside=None):
    """Every (from, to, port, protocol) the NetworkPolicies allow between the
    endpoints where either end is a hybridserve pod, to each port the
    destination exposes."""
    policies = find(objs, "NetworkPolicy")
    eps = endpoints(objs, outside)
    flows = set()
    for src in eps:
        for dst in eps:
            # A component to itself: two pods of the pool.
            if src.name not in POOLS and dst.name not in POOLS:
                continue
            for _, port, protocol in dst.ports:
                if (_direction_allows(objs, policies, "Egress", src, dst, dst, port, protocol)
                        and _direction_allows(objs, policies, "Ingress", dst, src, dst, port, protocol)):
                    flows.add((src.name, dst.name, port, protocol))
    return flows
