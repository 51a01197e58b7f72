"""The pools' policy checks over the rendered manifests of deploy/k8s:
resources, probes, rollout deadlines, security contexts, PDBs, Services, drain
timing, flags (and the flag edits that must roll every Deployment), cachestore
budgets, PodMonitors, Prometheus rules, topology spread, the
NetworkPolicy flows (evaluated against manifests.py's table), GPU devices and
placement. Each check takes the render's objects and returns its errors (none
when it holds); manifest_policy_test runs them on every overlay and on
deliberately broken renders. The gateway pool's own checks: gateway_policy.py;
the mutual-TLS checks: tls_policy.py; autoscaling: autoscaling_policy.py; the
cachestore's shards: cachestore_policy.py."""

import os

import manifests as m
from manifests import COMPONENTS, GATEWAY, POOLS, PORTS, WORKERS


def _labels(component):
    return {"app.kubernetes.io/name": "hybridserve", "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": "hybridserve"}


# --- checks: each returns the violations of one overlay's objects -------------

def check_objects(objs):
    errors = []
    expected = []
    for c in COMPONENTS:
        expected += [("Service", m.SERVICES[c]), ("PodDisruptionBudget", f"hybridserve-{c}"),
                     ("NetworkPolicy", f"hybridserve-{c}")]
    for c in WORKERS:
        expected += [("Deployment", f"hybridserve-{c}"), ("ScaledObject", f"hybridserve-{c}")]
    errors += [f"missing {k}/{n}" for k, n in expected if not m.find(objs, k, n)]
    for name in m.CONFIG_NAMES:
        try:
            m.config_map(objs, name)
        except LookupError as e:
            errors.append(f"missing the flags: {e}")
    # The Namespace is applied once on its own (deploy/k8s/namespace): in an
    # overlay, `kubectl delete -k` would delete it, the model PVC and the TLS
    # Secrets in it with it.
    errors += [f"the overlay renders Namespace/{n['metadata']['name']}" for n in m.find(objs, "Namespace")]
    for c in COMPONENTS:
        w = m.workload(objs, c)
        if w is None:
            errors.append(f"no workload for {c}")
            continue
        tmpl = w["spec"]["template"]
        if tmpl["metadata"].get("labels") != _labels(c):
            errors.append(f"{c}: pod labels {tmpl['metadata'].get('labels')}")
        if [x["name"] for x in tmpl["spec"]["containers"]] != [c]:
            errors.append(f"{c}: containers are not exactly [{c}]")
        if not m.selector_matches(w["spec"]["selector"], tmpl["metadata"].get("labels", {}), False):
            errors.append(f"{c}: the workload's selector misses its own pods")
        ports = m.container_ports(m.container(objs, c))
        want = {**PORTS[c], "health": m.HEALTH_PORT} if "health" in ports else PORTS[c]
        if ports != want:
            errors.append(f"{c}: ports {ports}, want {want}")
        account = tmpl["spec"].get("serviceAccountName")
        if account != f"hybridserve-{c}" or not m.find(objs, "ServiceAccount", account):
            errors.append(f"{c}: runs as ServiceAccount {account}, want its own hybridserve-{c} (defined here)")
        if tmpl["spec"].get("automountServiceAccountToken") is not False:
            errors.append(f"{c}: the service-account token is mounted")
        if m.container(objs, c).get("command") != [m.BINARY.format(c)]:
            errors.append(f"{c}: command is not [{m.BINARY.format(c)}]")
        if not m.container(objs, c).get("image", "").startswith("hybridserve:"):
            errors.append(f"{c}: image {m.container(objs, c).get('image')}")
        annotations = tmpl["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/port") != str(
                PORTS[c]["metrics"]):
            errors.append(f"{c}: Prometheus scrape annotations missing or not the metrics port")
    for c in WORKERS:
        rolling = (m.workload(objs, c) or {}).get("spec", {}).get("strategy", {}).get("rollingUpdate", {})
        if rolling.get("maxSurge") != 1 or rolling.get("maxUnavailable") != 0:
            errors.append(f"{c}: rollout is not maxSurge 1, maxUnavailable 0")
    return errors


def check_resources(objs):
    errors = []
    for w in m.find(objs, "Deployment") + m.find(objs, "StatefulSet"):
        spec = w["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(kind, {}):
                        errors.append(f"{c['name']}: no {kind}.{r}")
            gpus = {k: res.get(k, {}).get("nvidia.com/gpu") for k in ("requests", "limits")}
            if gpus["requests"] != gpus["limits"]:
                errors.append(f"{c['name']}: nvidia.com/gpu requests {gpus['requests']} != limits {gpus['limits']}")
    return errors


def plaintext_health_port(objs, comp):
    """The port a kubelet gRPC probe (no client certificate) gets answers on:
    the --health_address port when given, else the gRPC port unless it
    requires TLS (--tls_cert); None when there is none."""
    f = m.flags(objs, comp)
    if f.get("health_address"):
        return m.port_of(f["health_address"])
    return None if f.get("tls_cert") else PORTS[comp]["grpc"]


# A readiness probe that one failure ends waits at least this long for its
# answer: under load (a busy node, a sanitizer build) a healthy pod's health
# answer can take over the kubelet's default second, and its only endpoint
# would drop ("Service ... has no ready endpoint").
MIN_SOLE_PROBE_TIMEOUT_S = 2


def check_probes(objs):
    errors = []
    want = {"startupProbe": m.LIVENESS_SERVICE, "readinessProbe": "", "livenessProbe": m.LIVENESS_SERVICE}
    for comp in COMPONENTS:
        c = m.container(objs, comp)
        port = plaintext_health_port(objs, comp)
        if port not in m.container_ports(c).values():
            errors.append(f"{comp}: no declared container port answers plaintext health (probes need one: {port})")
        for probe, service in want.items():
            p = c.get(probe)
            if not p or "grpc" not in p:
                errors.append(f"{comp}: no gRPC {probe}")
                continue
            if p["grpc"].get("port") != port:
                errors.append(f"{comp}: {probe} port {p['grpc'].get('port')}, want {port} (plaintext health)")
            if p["grpc"].get("service", "") != service:
                errors.append(f"{comp}: {probe} service {p['grpc'].get('service')!r}, want {service!r}")
        ready = c.get("readinessProbe") or {}
        if ready.get("failureThreshold", 3) == 1 and ready.get("timeoutSeconds", 1) < MIN_SOLE_PROBE_TIMEOUT_S:
            errors.append(f"{comp}: one readiness probe slower than {ready.get('timeoutSeconds', 1)}s takes the pod "
                          f"out of its Service (failureThreshold 1; want timeoutSeconds >= {MIN_SOLE_PROBE_TIMEOUT_S})")
        start = c.get("startupProbe", {})
        budget = start.get("periodSeconds", 10) * start.get("failureThreshold", 3)
        if budget < 60:
            errors.append(f"{comp}: the startup probe allows {budget}s to load the model (< 60s)")
    return errors


def check_rollout_deadline(objs):
    """Every Deployment's progressDeadlineSeconds (default 600) exceeds the
    time a new pod may take to turn ready: its startup probe's window
    (initialDelaySeconds + failureThreshold x periodSeconds, the API's
    defaults where unset), then one readiness period, plus an image pull
    (m.IMAGE_PULL_MARGIN_S); else a slow model load after a pull marks a
    healthy rollout failed."""
    errors = []
    for d in m.find(objs, "Deployment"):
        deadline = d["spec"].get("progressDeadlineSeconds", 600)
        for c in d["spec"]["template"]["spec"]["containers"]:
            start, ready = c.get("startupProbe") or {}, c.get("readinessProbe") or {}
            window = (start.get("initialDelaySeconds", 0) + start.get("failureThreshold", 3) *
                      start.get("periodSeconds", 10)) if start else 0
            window += ready.get("initialDelaySeconds", 0) + ready.get("periodSeconds", 10) if ready else 0
            if deadline <= window + m.IMAGE_PULL_MARGIN_S:
                errors.append(f"{d['metadata']['name']}: progressDeadlineSeconds {deadline} <= startup and readiness "
                              f"window {window}s of {c['name']} + image pull {m.IMAGE_PULL_MARGIN_S}s")
    return errors


def check_security(objs):
    errors = []
    for comp in POOLS:
        pod = m.pod_spec(objs, comp).get("securityContext", {})
        # Every container of the pod, its init containers too.
        for c in m.pod_spec(objs, comp).get("initContainers", []) + m.pod_spec(objs, comp)["containers"]:
            sc, who = c.get("securityContext", {}), comp if c["name"] == comp else f"{comp}/{c['name']}"
            if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
                errors.append(f"{who}: runAsNonRoot not set")
            if sc.get("runAsUser", pod.get("runAsUser")) != m.RUN_AS_USER:
                errors.append(f"{who}: not run as uid {m.RUN_AS_USER}")
            if sc.get("readOnlyRootFilesystem") is not True:
                errors.append(f"{who}: root filesystem not read-only")
            if sc.get("allowPrivilegeEscalation") is not False:
                errors.append(f"{who}: privilege escalation allowed")
            if "ALL" not in (sc.get("capabilities", {}).get("drop") or []) or sc.get("capabilities", {}).get("add"):
                errors.append(f"{who}: capabilities not dropped (ALL) or some added")
            if sc.get("seccompProfile", pod.get("seccompProfile", {})).get("type") != "RuntimeDefault":
                errors.append(f"{who}: seccompProfile not RuntimeDefault")
        mounts = {v["mountPath"] for v in m.container(objs, comp).get("volumeMounts", [])}
        if "/tmp" not in mounts:
            errors.append(f"{comp}: no writable /tmp")
    return errors


def check_pdbs(objs):
    errors = []
    pdbs = m.find(objs, "PodDisruptionBudget")
    for comp in POOLS:
        labels = m.workload(objs, comp)["spec"]["template"]["metadata"].get("labels", {})
        if not any(m.selector_matches(p["spec"].get("selector"), labels, False) for p in pdbs):
            errors.append(f"{comp}: no PodDisruptionBudget selects its pods")
    return errors


def check_services(objs):
    errors = []
    pods = [(c, m.workload(objs, c)["spec"]["template"]) for c in POOLS]
    for svc in m.find(objs, "Service"):
        name = svc["metadata"]["name"]
        selected = [(c, t) for c, t in pods
                    if m.selector_matches({"matchLabels": svc["spec"].get("selector") or {}},
                                          t["metadata"].get("labels", {}), False)]
        if not selected:
            errors.append(f"Service {name}: selects no pods")
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            for c, t in selected:
                exposed = {p.get("name"): p["containerPort"] for x in t["spec"]["containers"] for p in x.get("ports", [])}
                if target not in exposed and target not in exposed.values():
                    errors.append(f"Service {name}: port {target} is not a port of {c}'s containers")
    for comp in COMPONENTS:
        name = m.SERVICES[comp]
        svc = m.find(objs, "Service", name)
        if not svc:
            continue
        ports = [p["port"] for p in svc[0]["spec"].get("ports", [])]
        # gRPC, and the cachestore's bulk port for the workers' reads and puts.
        want = [PORTS[comp]["grpc"]] + ([PORTS[comp]["bulk"]] if "bulk" in PORTS[comp] else [])
        if ports != want:
            errors.append(f"Service {name}: ports {ports}, want {want}")
        headless = svc[0]["spec"].get("clusterIP") == "None"
        if headless != (comp in m.HEADLESS):
            errors.append(f"Service {name}: headless={headless} (headless: {', '.join(m.HEADLESS)})")
    # A virtual IP in front of the shards would spread one chain's calls
    # over all of them: every Service of the cachestore's pods is headless.
    labels = m.workload(objs, "cachestore")["spec"]["template"]["metadata"].get("labels", {})
    for svc in m.find(objs, "Service"):
        if svc["spec"].get("clusterIP") != "None" and m.selector_matches(
                {"matchLabels": svc["spec"].get("selector") or {}}, labels, False):
            errors.append(f"Service {svc['metadata']['name']}: a ClusterIP over the cachestore's shards")
    return errors


def drain_seconds(objs, comp):
    """What a pod's termination must cover: preStop, then the binary's drain."""
    c = m.container(objs, comp)
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    f = m.flags(objs, comp)
    grace = m.parse_duration_s(f.get("shutdown_grace", "10s"))
    # Prefill drains in two steps of --shutdown_grace: its calls, then the
    # queued cache publications (prefill/main.cc). A cachestore shard with a
    # disk first writes its memory there, up to --shutdown_spill_timeout.
    spill = m.parse_duration_s(f.get("shutdown_spill_timeout", "20s")) if comp == "cachestore" and f.get(
        "disk_dir") else 0
    return pre_stop + spill + grace * (2 if comp == "prefill" else 1)


def check_drain(objs):
    errors = []
    for comp in COMPONENTS:
        c = m.container(objs, comp)
        if not c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds"):
            errors.append(f"{comp}: no preStop sleep (endpoint removal races SIGTERM)")
        period = m.pod_spec(objs, comp).get("terminationGracePeriodSeconds", 30)
        need = drain_seconds(objs, comp)
        if period <= need + m.GRACE_MARGIN_S:
            errors.append(f"{comp}: terminationGracePeriodSeconds {period} <= preStop + drain {need}s + margin "
                          f"{m.GRACE_MARGIN_S}s")
    decode, prefill = m.flags(objs, "decode"), m.flags(objs, "prefill")
    if m.parse_duration_s(prefill.get("shutdown_grace", "10s")) < m.parse_duration_s(
            decode.get("transfer_timeout", "60s")):
        errors.append("prefill --shutdown_grace is shorter than decode's --transfer_timeout: a call running at "
                      "SIGTERM may be cut")
    return errors


def check_flags(objs):
    errors, resolved = [], {}
    for comp in COMPONENTS:
        try:
            resolved[comp] = m.flags(objs, comp)
        except (LookupError, ValueError) as e:
            errors.append(str(e))
    if errors:
        return errors
    for comp, f in resolved.items():
        for flag, port in (("address", "grpc"), ("metrics_address", "metrics"), ("data_address", "data")):
            if port in PORTS[comp] and (flag not in f or m.port_of(f[flag]) != PORTS[comp][port]):
                errors.append(f"{comp}: --{flag}={f.get(flag)} is not on the {port} port {PORTS[comp][port]}")
        if comp in WORKERS:
            # Every shard: the headless Service, re-resolved; the bulk port on
            # each shard's host (empty: off, the mtls component's).
            shards = f"dns:///{m.SERVICES['cachestore']}:{PORTS['cachestore']['grpc']}"
            if f.get("cachestore") != shards:
                errors.append(f"{comp}: --cachestore={f.get('cachestore')}, want the shards' headless {shards}")
            if not f.get("cachestore_resolve_interval"):
                errors.append(f"{comp}: no --cachestore_resolve_interval (the shard set is resolved once)")
            if f.get("cachestore_bulk_address") not in ("", f":{PORTS['cachestore']['bulk']}"):
                errors.append(f"{comp}: --cachestore_bulk_address={f.get('cachestore_bulk_address')}, want "
                              f":{PORTS['cachestore']['bulk']} (each shard's host)")
            if f.get("data_planes") != "tcp":
                errors.append(f"{comp}: --data_planes={f.get('data_planes')} (pods pair with no one: tcp)")
    f = resolved["decode"]
    if f.get("prefill") != "hybridserve-prefill:50061":
        errors.append(f"decode: --prefill={f.get('prefill')}, want the headless Service")
    if f.get("advertise_host") != "$(POD_IP)":
        errors.append(f"decode: --advertise_host={f.get('advertise_host')}, want $(POD_IP)")
    env = {e["name"]: e for e in m.container(objs, "decode").get("env", [])}
    if env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "status.podIP":
        errors.append("decode: POD_IP is not the downward API's status.podIP")
    prefill = resolved["prefill"]
    for flag in ("page_size", "model_dir", "device"):
        if f.get(flag) != prefill.get(flag):
            errors.append(f"--{flag}: decode {f.get(flag)} != prefill {prefill.get(flag)}")
    return errors


def edit_flag_files(root):
    """What an operator's flag change does, on a copy of deploy/k8s (`root`):
    every flag file edited (a comment appended)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".flags"):
                with open(os.path.join(dirpath, name), "a", encoding="utf-8") as f:
                    f.write("# edited\n")


def edit_decode_flags(root):
    """A copy of deploy/k8s (`root`) with decode's flag file edited alone."""
    with open(os.path.join(root, "base", "flags", "decode.flags"), "a", encoding="utf-8") as f:
        f.write("# edited\n")


def check_config_rolls(objs, edited):
    """Every ConfigMap a Deployment mounts or reads is name-hashed: in
    `edited` (the same overlay rendered after edit_flag_files) a ConfigMap
    whose data changed has a new name, and each Deployment that references it
    a new pod template, so it rolls. A fixed name (disableNameSuffixHash)
    leaves the pods as they are: the binaries read their flags at start, and
    the pods the autoscaler adds after the edit would run the new flags beside
    the old ones (a page-size change fails every transfer between them)."""
    errors = []
    for d in m.find(objs, "Deployment") + m.find(objs, "StatefulSet"):
        name = d["metadata"]["name"]
        after = m.find(edited, d["kind"], name)
        if not after:
            errors.append(f"{name}: not rendered after the edit")
            continue
        refs, refs_after = m.config_map_refs(d), m.config_map_refs(after[0])
        if len(refs) != len(refs_after):
            errors.append(f"{name}: references {refs} before the edit, {refs_after} after")
            continue
        changed = False
        for ref, ref_after in zip(refs, refs_after):
            cm, cm_after = m.find(objs, "ConfigMap", ref), m.find(edited, "ConfigMap", ref_after)
            if not cm or not cm_after:
                errors.append(f"{name}: references ConfigMap {ref if not cm else ref_after}, which is not rendered")
                continue
            if cm[0].get("data") == cm_after[0].get("data"):
                continue
            changed = True
            if ref == ref_after:
                errors.append(f"{name}: ConfigMap {ref} keeps its name after its data changed (no hash suffix: "
                              "disableNameSuffixHash?): pods added after an edit would run new flags beside old ones")
        if changed and d["spec"]["template"] == after[0]["spec"]["template"]:
            errors.append(f"{name}: its pod template is unchanged after its flags changed: it does not roll")
    return errors


def check_cachestore_budgets(objs):
    """page + state + blob pool <= 75 % of the memory limit, and the rest holds
    the gRPC buffers (max_streams x max_chunk) and the disk tier's write queue
    (evicted entries waiting for the disk) plus 256 MiB (index, process)."""
    f = m.flags(objs, "cachestore")
    limit = m.mib(m.container(objs, "cachestore").get("resources", {}).get("limits", {}).get("memory", "0"))
    budgets = sum(int(f.get(k, d)) for k, d in (("page_budget_mib", 4096), ("state_budget_mib", 4096),
                                                  ("blob_pool_mib", 256)))
    buffers = int(f.get("max_streams", 1024)) * int(f.get("max_chunk_kib", 4096)) / 1024
    if f.get("disk_dir"):
        buffers += int(f.get("disk_write_queue_mib", 256))
    errors = []
    if budgets > 0.75 * limit:
        errors.append(f"cachestore: budgets {budgets} MiB > 75 % of its {limit} MiB limit")
    if budgets + buffers + 256 > limit:
        errors.append(f"cachestore: budgets {budgets} + buffers {buffers} + 256 MiB > limit {limit} MiB")
    return errors


def check_pod_monitors(objs):
    """One Prometheus Operator PodMonitor a pool (its structure: no schema
    validates it offline): it selects that pool's pods and no other's, in
    their namespace, and scrapes the container port named metrics, which is
    where the binary's --metrics_address listens, over plain HTTP at /metrics."""
    errors = []
    monitors = m.find(objs, "PodMonitor")
    for pm in monitors:
        name, spec = pm["metadata"]["name"], pm.get("spec") or {}
        if pm.get("apiVersion") != m.POD_MONITOR_API:
            errors.append(f"PodMonitor {name}: apiVersion {pm.get('apiVersion')}, want {m.POD_MONITOR_API}")
        errors += [f"PodMonitor {name}: unknown spec field {k}" for k in sorted(set(spec) - m.POD_MONITOR_SPEC_FIELDS)]
        names = (spec.get("namespaceSelector") or {}).get("matchNames")
        if names is not None and pm["metadata"].get("namespace") not in names:
            errors.append(f"PodMonitor {name}: looks in namespaces {names}, not its own")
        if not isinstance(spec.get("podMetricsEndpoints"), list) or not spec["podMetricsEndpoints"]:
            errors.append(f"PodMonitor {name}: no podMetricsEndpoints")
    for comp in POOLS:
        labels = m.workload(objs, comp)["spec"]["template"]["metadata"].get("labels", {})
        selecting = [pm for pm in monitors if m.selector_matches((pm.get("spec") or {}).get("selector"), labels, False)]
        if len(selecting) != 1:
            errors.append(f"{comp}: {len(selecting)} PodMonitors select its pods, want 1")
            continue
        pm = selecting[0]
        others = [c for c in POOLS if c != comp and m.selector_matches(
            pm["spec"]["selector"], m.workload(objs, c)["spec"]["template"]["metadata"].get("labels", {}), False)]
        if others:
            errors.append(f"PodMonitor {pm['metadata']['name']}: also selects {others}")
        ports = m.container_ports(m.container(objs, comp))
        # The gateway serves /metrics on its one port (--address, http).
        port_name, flag = ("http", "address") if comp == GATEWAY else ("metrics", "metrics_address")
        listen = m.port_of(m.flags(objs, comp).get(flag, ":0"))
        for ep in pm["spec"].get("podMetricsEndpoints") or []:
            where = f"PodMonitor {pm['metadata']['name']}"
            errors += [f"{where}: unknown endpoint field {k}" for k in sorted(set(ep) - m.POD_METRICS_ENDPOINT_FIELDS)]
            if ep.get("port") != port_name or ports.get(port_name) != listen:
                errors.append(f"{where}: scrapes port {ep.get('port')!r}; {comp} serves metrics on the port named "
                              f"{port_name} ({ports.get(port_name)}), its --{flag} on {listen}")
            if ep.get("path", "/metrics") != "/metrics" or ep.get("scheme", "http") != "http":
                errors.append(f"{where}: {ep.get('scheme')}://...{ep.get('path')}, the exposer serves http /metrics")
    return errors


# The PrometheusRules of the base and the rule file each copies.
PROMETHEUS_RULES = {"hybridserve-recording": "hybridserve.rules.yaml", "hybridserve-alerts": "hybridserve.alerts.yaml"}


def check_prometheus_rules(objs, files=None):
    """The base's PrometheusRules (for the Prometheus Operator) are exactly
    the rule files promtool checks and tests (monitoring/rules), one each:
    a copy edited alone fails here."""
    files = m.rules_files() if files is None else files
    errors = []
    rules = {r["metadata"]["name"]: r for r in m.find(objs, "PrometheusRule")}
    if set(rules) != set(PROMETHEUS_RULES):
        errors.append(f"PrometheusRules {sorted(rules)}, want {sorted(PROMETHEUS_RULES)}")
    for name, file_name in PROMETHEUS_RULES.items():
        rule = rules.get(name)
        if rule is None:
            continue
        if rule.get("apiVersion") != m.POD_MONITOR_API or set(rule.get("spec") or {}) != {"groups"}:
            errors.append(f"PrometheusRule {name}: apiVersion {rule.get('apiVersion')}, spec fields "
                          f"{sorted(rule.get('spec') or {})} (want {m.POD_MONITOR_API}, groups)")
        elif rule["spec"]["groups"] != files[file_name]:
            errors.append(f"PrometheusRule {name} differs from monitoring/rules/{file_name}")
    return errors


def check_topology(objs):
    errors = []
    for comp in WORKERS + (GATEWAY,):
        tmpl = m.workload(objs, comp)["spec"]["template"]
        spreads = [t for t in tmpl["spec"].get("topologySpreadConstraints", [])
                   if t.get("topologyKey") == "kubernetes.io/hostname"
                   and m.selector_matches(t.get("labelSelector"), tmpl["metadata"].get("labels", {}), False)]
        if not spreads:
            errors.append(f"{comp}: no topology spread across nodes over its own pods")
    return errors


def check_network_policies(objs):
    errors = []
    for p in m.find(objs, "NetworkPolicy"):
        for rule in p["spec"].get("ingress", []) + p["spec"].get("egress", []):
            if any("ipBlock" in peer for peer in rule.get("from", []) + rule.get("to", [])):
                errors.append(f"NetworkPolicy {p['metadata']['name']}: ipBlock (not evaluated here)")
    flows = m.allowed_flows(objs)
    errors += [f"flow allowed, not in the table: {f}" for f in sorted(flows - m.EXPECTED_FLOWS)]
    errors += [f"flow in the table, denied: {f}" for f in sorted(m.EXPECTED_FLOWS - flows)]
    return errors


def check_device(objs, overlay):
    """The device settings of an overlay: the gpu overlays (gpu, gpu-mtls)
    run CUDA on one GPU a worker, the others the CPU on the embedded model."""
    errors = []
    for comp in WORKERS:
        f = m.flags(objs, comp)
        res = m.container(objs, comp).get("resources", {})
        mounts = {v["mountPath"]: v["name"] for v in m.container(objs, comp).get("volumeMounts", [])}
        volumes = {v["name"]: v for v in m.pod_spec(objs, comp).get("volumes", [])}
        if overlay.split("-")[0] == "gpu":
            if f.get("device") != "cuda":
                errors.append(f"{comp}: --device={f.get('device')} on the gpu overlay")
            for kind in ("requests", "limits"):
                if str(res.get(kind, {}).get("nvidia.com/gpu")) != "1":
                    errors.append(f"{comp}: {kind}.nvidia.com/gpu is not 1")
            shm = volumes.get(mounts.get("/dev/shm"), {}).get("emptyDir", {})
            if shm.get("medium") != "Memory":
                errors.append(f"{comp}: /dev/shm is not a Memory emptyDir")
        else:
            if f.get("device") != "cpu" or f.get("model_dir") != "/models/default":
                errors.append(f"{comp}: --device={f.get('device')} --model_dir={f.get('model_dir')} on {overlay}")
            if "nvidia.com/gpu" in res.get("limits", {}):
                errors.append(f"{comp}: asks for a GPU on {overlay}")
    # The gateway needs none on any overlay.
    res = m.container(objs, GATEWAY).get("resources", {})
    if any("nvidia.com/gpu" in res.get(kind, {}) for kind in ("requests", "limits")):
        errors.append(f"gateway: asks for a GPU on {overlay}")
    return errors


def _gpu_node(driver_major, **extra):
    return {"kubernetes.io/hostname": "gpu-1", "nvidia.com/gpu.present": "true",
            m.DRIVER_LABEL: str(driver_major), **extra}


def check_gpu_placement(objs, overlay):
    """On the gpu overlays, the GPU workers land only on nodes whose NVIDIA
    driver runs CUDA 13 (the required node affinity admits a node labelled
    driver 580 and refuses 579, an unlabelled one and one with a bad label),
    name the same RuntimeClass or none, decode batches at least
    m.GPU_MIN_BATCH and gives its streams m.GPU_STREAM_DRAIN_S after SIGTERM
    (its grace period covering that: check_drain). The cachestore needs no
    GPU node. On the cpu overlays, no worker asks for a GPU node or runtime."""
    errors = []
    gpu = overlay.split("-")[0] == "gpu"
    classes = {}
    for comp in POOLS:
        spec = m.pod_spec(objs, comp)
        classes[comp] = spec.get("runtimeClassName")
        if not gpu or comp not in WORKERS:
            if not m.node_affinity_admits(spec, {"kubernetes.io/hostname": "cpu-1"}):
                errors.append(f"{comp}: does not admit a node without a GPU")
            if classes[comp]:
                errors.append(f"{comp}: runtimeClassName {classes[comp]} on a pod without a GPU")
            continue
        admitted = {
            "a node with driver 580": m.node_affinity_admits(spec, _gpu_node(m.MIN_DRIVER_MAJOR)),
            "a node with driver 590": m.node_affinity_admits(spec, _gpu_node(590)),
        }
        refused = {
            "a node with driver 579": m.node_affinity_admits(spec, _gpu_node(m.MIN_DRIVER_MAJOR - 1)),
            "a node with driver 535": m.node_affinity_admits(spec, _gpu_node(535)),
            "a node without the driver label": m.node_affinity_admits(
                spec, {k: v for k, v in _gpu_node(590).items() if k != m.DRIVER_LABEL}),
            "a node with a non-numeric driver label": m.node_affinity_admits(spec, _gpu_node("unknown")),
        }
        errors += [f"{comp}: refuses {n}" for n, ok in admitted.items() if not ok]
        errors += [f"{comp}: admits {n} (CUDA 13 needs >= {m.MIN_DRIVER_MAJOR})" for n, ok in refused.items() if ok]
    if gpu:
        if classes["decode"] != classes["prefill"]:
            errors.append(f"runtimeClassName: decode {classes['decode']}, prefill {classes['prefill']}")
        f = m.flags(objs, "decode")
        if int(f.get("max_batch", 8)) < m.GPU_MIN_BATCH:
            errors.append(f"decode: --max_batch={f.get('max_batch', 8)} on a GPU (< {m.GPU_MIN_BATCH})")
        if m.parse_duration_s(f.get("shutdown_grace", "10s")) < m.GPU_STREAM_DRAIN_S:
            errors.append(f"decode: --shutdown_grace={f.get('shutdown_grace')} cuts streams running at SIGTERM "
                          f"(< {m.GPU_STREAM_DRAIN_S} s)")
    return errors
