"""Policy tests over the rendered manifests of deploy/k8s (every overlay):
resources, probes, security contexts, PDBs, Services, drain timing, flags,
cachestore budgets, autoscaling, topology spread and the NetworkPolicy flows
(evaluated, against a table); the OpenAI gateway pool's own checks
(gateway_policy.py); on the overlays with the mtls component, the
mutual-TLS checks of tls_policy.py. Each check also runs on deliberately broken copies of
the cpu (or cpu-mtls) render and must catch each of them: the checks can
fail."""

import copy
import os
import re
import unittest

import yaml

import manifests as m
from gateway_policy import check_gateway_flags, check_gateway_objects, check_gateway_probes, check_gateway_tls
from manifests import COMPONENTS, GATEWAY, POOLS, PORTS, WORKERS
from tls_policy import (BINARY_TLS_FLAGS, check_spiffe_ids, check_tls_certificates, check_tls_flags, check_tls_health, check_tls_peers,
                        check_tls_secrets)


def _labels(component):
    return {"app.kubernetes.io/name": "hybridserve", "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": "hybridserve"}


# --- checks: each returns the violations of one overlay's objects -------------

def check_objects(objs):
    errors = []
    expected = []
    for c in COMPONENTS:
        expected += [("Service", f"hybridserve-{c}"), ("PodDisruptionBudget", f"hybridserve-{c}"),
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
    cachestore = m.workload(objs, "cachestore")
    if cachestore is not None and cachestore["kind"] == "Deployment":
        if cachestore["spec"].get("strategy", {}).get("type") != "Recreate" or cachestore["spec"].get("replicas") != 1:
            errors.append("cachestore: a Deployment must be one replica with the Recreate strategy")
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
        svc = m.find(objs, "Service", f"hybridserve-{comp}")
        if not svc:
            continue
        ports = [p["port"] for p in svc[0]["spec"].get("ports", [])]
        # gRPC, and the cachestore's bulk port for the workers' reads and puts.
        want = [PORTS[comp]["grpc"]] + ([PORTS[comp]["bulk"]] if "bulk" in PORTS[comp] else [])
        if ports != want:
            errors.append(f"Service hybridserve-{comp}: ports {ports}, want {want}")
        headless = svc[0]["spec"].get("clusterIP") == "None"
        if headless != (comp == "prefill"):
            errors.append(f"Service hybridserve-{comp}: headless={headless} (only prefill's is headless)")
    return errors


def drain_seconds(objs, comp):
    """What a pod's termination must cover: preStop, then the binary's drain."""
    c = m.container(objs, comp)
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = m.parse_duration_s(m.flags(objs, comp).get("shutdown_grace", "10s"))
    # Prefill drains in two steps of --shutdown_grace: its calls, then the
    # queued cache publications (prefill/main.cc).
    return pre_stop + grace * (2 if comp == "prefill" else 1)


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
            if f.get("cachestore") != "hybridserve-cachestore:50051":
                errors.append(f"{comp}: --cachestore={f.get('cachestore')}")
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
    for d in m.find(objs, "Deployment"):
        name = d["metadata"]["name"]
        after = m.find(edited, "Deployment", name)
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
    the gRPC buffers (max_streams x max_chunk) plus 256 MiB (index, process)."""
    f = m.flags(objs, "cachestore")
    limit = m.mib(m.container(objs, "cachestore").get("resources", {}).get("limits", {}).get("memory", "0"))
    budgets = sum(int(f.get(k, d)) for k, d in (("page_budget_mib", 4096), ("state_budget_mib", 4096),
                                                  ("blob_pool_mib", 256)))
    buffers = int(f.get("max_streams", 1024)) * int(f.get("max_chunk_kib", 4096)) / 1024
    errors = []
    if budgets > 0.75 * limit:
        errors.append(f"cachestore: budgets {budgets} MiB > 75 % of its {limit} MiB limit")
    if budgets + buffers + 256 > limit:
        errors.append(f"cachestore: budgets {budgets} + buffers {buffers} + 256 MiB > limit {limit} MiB")
    return errors


# The signals each worker pool scales on: the recorded per-pod series, which
# prometheus-adapter serves as hybridserve_<signal> and whose namespace sums
# (hybridserve:<signal>:sum) the KEDA triggers query.
SIGNALS = {"prefill": {"prefill_backlog_seconds"}, "decode": {"kv_page_use_ratio", "num_requests_waiting"}}


def _targets(objs, kind, comp):
    return [a for a in m.find(objs, kind) if a["spec"]["scaleTargetRef"].get("name") == f"hybridserve-{comp}"
            and a["spec"]["scaleTargetRef"].get("kind", "Deployment") == m.workload(objs, comp)["kind"]]


def _scale_down_window(behavior):
    return (behavior or {}).get("scaleDown", {}).get("stabilizationWindowSeconds", 0)


def check_scaled_object(so, comp, recording):
    """A KEDA ScaledObject's structure (the fields KEDA requires, none it does
    not know; no schema validates it offline), and each Prometheus trigger's
    query: exactly the name of a series the recording rules record as a sum
    by namespace, in the ScaledObject's own namespace, so a renamed or
    per-pod rule fails here. Returns (violations, {signal: threshold})."""
    errors, thresholds = [], {}
    name, spec = so["metadata"]["name"], so.get("spec") or {}
    if so.get("apiVersion") != m.KEDA_API:
        errors.append(f"ScaledObject {name}: apiVersion {so.get('apiVersion')}, want {m.KEDA_API}")
    errors += [f"ScaledObject {name}: unknown spec field {k}" for k in sorted(set(spec) - m.KEDA_SPEC_FIELDS)]
    # The HPA KEDA makes has the name the prometheus-adapter HPAs have, and
    # KEDA takes an existing one over: never two HPAs on one Deployment.
    hpa_name = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("name")
    if hpa_name != f"hybridserve-{comp}" or (so["metadata"].get("annotations") or {}).get(
            "scaledobject.keda.sh/transfer-hpa-ownership") != "true":
        errors.append(f"ScaledObject {name}: its HPA is not hybridserve-{comp} taken over (transfer-hpa-ownership)")
    ref = spec.get("scaleTargetRef") or {}
    if ref.get("name") != f"hybridserve-{comp}" or ref.get("apiVersion", "apps/v1") != "apps/v1":
        errors.append(f"ScaledObject {name}: scaleTargetRef {ref}")
    for field in ("minReplicaCount", "maxReplicaCount"):
        if not isinstance(spec.get(field), int):
            errors.append(f"ScaledObject {name}: no integer {field} (KEDA's defaults: 0 and 100)")
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        return errors + [f"ScaledObject {name}: no triggers (KEDA requires one)"], thresholds
    namespace = so["metadata"].get("namespace", "default")
    for i, trig in enumerate(triggers):
        where = f"ScaledObject {name} trigger {trig.get('name', i)}"
        errors += [f"{where}: unknown field {k}" for k in sorted(set(trig) - m.KEDA_TRIGGER_FIELDS)]
        if trig.get("type") != "prometheus":
            errors.append(f"{where}: type {trig.get('type')}, want prometheus")
            continue
        if trig.get("metricType", "AverageValue") != "AverageValue":
            errors.append(f"{where}: metricType {trig.get('metricType')} (AverageValue: a target per pod)")
        meta = trig.get("metadata") or {}
        errors += [f"{where}: no metadata.{k}" for k in sorted(m.KEDA_PROMETHEUS_REQUIRED - set(meta))]
        errors += [f"{where}: unknown metadata.{k}" for k in sorted(set(meta) - m.KEDA_PROMETHEUS_FIELDS)]
        errors += [f"{where}: metadata.{k} is not a string (KEDA's metadata is map[string]string)"
                   for k, v in meta.items() if not isinstance(v, str)]
        if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", str(meta.get("serverAddress", ""))):
            errors.append(f"{where}: serverAddress {meta.get('serverAddress')!r} is no http(s) URL")
        try:
            threshold = float(meta.get("threshold", ""))
        except ValueError:
            threshold = 0
        if threshold <= 0:
            errors.append(f"{where}: threshold {meta.get('threshold')!r} is not a positive number")
        query = str(meta.get("query", ""))
        q = re.fullmatch(r'(hybridserve:([a-z_]+):sum)\{namespace="([^"]*)"\}', query)
        if not q:
            errors.append(f"{where}: query {query!r} is not hybridserve:<signal>:sum{{namespace=\"...\"}}")
            continue
        series, signal, ns = q.groups()
        if series not in recording:
            errors.append(f"{where}: queries {series}, which no recording rule records")
        elif not re.fullmatch(rf"sum by \(namespace\) \(hybridserve:{signal}\)", " ".join(recording[series].split())):
            errors.append(f"{where}: {series} is not the sum by namespace of hybridserve:{signal}")
        if ns != namespace:
            errors.append(f"{where}: queries namespace {ns!r}, the ScaledObject is in {namespace!r}")
        thresholds[signal] = threshold
    return errors, thresholds


def check_autoscaling(objs, rules=None, recording=None):
    """Exactly one autoscaler a worker pool: a KEDA ScaledObject (the default)
    or an autoscaling/v2 HPA on prometheus-adapter's metrics (the
    alternative), on the pool's signals, at least 2 pods, slow scale-down."""
    rules = m.monitoring_rules() if rules is None else rules
    recording = m.recording_rules() if recording is None else recording
    served = {r["name"]["as"]: r for r in rules}
    errors = []
    for comp, signals in SIGNALS.items():
        scaled, hpas = _targets(objs, "ScaledObject", comp), _targets(objs, "HorizontalPodAutoscaler", comp)
        if len(scaled) + len(hpas) != 1:
            errors.append(f"{comp}: {len(scaled)} ScaledObjects and {len(hpas)} HPAs target it, want one autoscaler")
            continue
        if scaled:
            spec = scaled[0]["spec"]
            found, thresholds = check_scaled_object(scaled[0], comp, recording)
            errors += found
            if set(thresholds) != signals and not found:
                errors.append(f"{comp}: ScaledObject signals {sorted(thresholds)}, want {sorted(signals)}")
            minimum = spec.get("minReplicaCount", 0)
            behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
        else:
            spec = hpas[0]["spec"]
            if hpas[0]["apiVersion"] != "autoscaling/v2":
                errors.append(f"{comp}: HPA {hpas[0]['apiVersion']}, want autoscaling/v2")
            names = {x["pods"]["metric"]["name"] for x in spec.get("metrics", []) if x["type"] == "Pods"}
            if names != {f"hybridserve_{s}" for s in signals}:
                errors.append(f"{comp}: HPA metrics {sorted(names)}, want {sorted(signals)}")
            errors += [f"{comp}: prometheus-adapter serves no {n}" for n in names if n not in served]
            minimum, behavior = spec.get("minReplicas", 1), spec.get("behavior")
        if _scale_down_window(behavior) < 60:
            errors.append(f"{comp}: scale-down stabilisation {_scale_down_window(behavior)}s (< 60s)")
        if minimum < 2:
            errors.append(f"{comp}: minimum {minimum} replicas (< 2: one pod cannot roll without a gap)")
    return errors


def _quantity(value):
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def check_autoscaling_alternative(objs, alternative):
    """The prometheus-adapter alternative (the overlay with
    components/prometheus-adapter: HPAs instead of ScaledObjects) scales as
    KEDA does: the same bounds, behaviour and per-pod targets."""
    errors = []
    for comp, signals in SIGNALS.items():
        scaled, hpas = _targets(objs, "ScaledObject", comp), _targets(alternative, "HorizontalPodAutoscaler", comp)
        if len(scaled) != 1 or len(hpas) != 1 or _targets(alternative, "ScaledObject", comp):
            errors.append(f"{comp}: {len(scaled)} ScaledObjects by default, {len(hpas)} HPAs in the alternative")
            continue
        so, hpa = scaled[0]["spec"], hpas[0]["spec"]
        if (so.get("minReplicaCount"), so.get("maxReplicaCount")) != (hpa.get("minReplicas"), hpa.get("maxReplicas")):
            errors.append(f"{comp}: KEDA {so.get('minReplicaCount')}-{so.get('maxReplicaCount')} replicas, HPA "
                          f"{hpa.get('minReplicas')}-{hpa.get('maxReplicas')}")
        if so.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior") != hpa.get("behavior"):
            errors.append(f"{comp}: KEDA's behaviour differs from the HPA's")
        keda = {re.match(r"hybridserve:([a-z_]+):sum", t["metadata"]["query"]).group(1): float(t["metadata"]["threshold"])
                for t in so.get("triggers", [])}
        adapter = {x["pods"]["metric"]["name"].removeprefix("hybridserve_"): _quantity(x["pods"]["target"]["averageValue"])
                   for x in hpa.get("metrics", [])}
        if keda != adapter:
            errors.append(f"{comp}: KEDA targets {keda}, HPA targets {adapter}")
    return errors


def check_adapter_pages(objs, recording=None, adapter=None):
    """The autoscalers' KV page-use ratio is right for the overlay: the
    prometheus-adapter rule serves the recorded hybridserve:kv_page_use_ratio,
    and that divides the free pages by the page total decode exports
    (hybridserve_kv_pages_total, its --max_pages), never by a constant (the
    cpu overlay's 4096 pages made an idle gpu pod's 65,536 free a ratio of
    -15). Every adapter rule reads a recorded series."""
    recording = m.recording_rules() if recording is None else recording
    adapter = m.monitoring_rules() if adapter is None else adapter
    errors = []
    for rule in adapter:
        series = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", rule["seriesQuery"]).group(0)
        if series not in recording:
            errors.append(f"adapter {rule['name']['as']}: reads {series}, which no recording rule records")
    kv = [r for r in adapter if r["name"]["as"] == "hybridserve_kv_page_use_ratio"]
    if not kv or not kv[0]["seriesQuery"].startswith("hybridserve:kv_page_use_ratio{"):
        errors.append("hybridserve_kv_page_use_ratio is not the recorded hybridserve:kv_page_use_ratio")
    expr = " ".join(recording.get("hybridserve:kv_page_use_ratio", "").split())
    if not re.search(r"hybridserve_kv_pages_free\s*/\s*(on\s*\([^)]*\)\s*)?hybridserve_kv_pages_total\b", expr):
        errors.append(f"hybridserve:kv_page_use_ratio does not divide by decode's hybridserve_kv_pages_total: {expr}")
    if re.search(r"/\s*[0-9]", expr) or m.flags(objs, "decode").get("max_pages", "-") in re.findall(r"[0-9]+", expr):
        errors.append(f"hybridserve:kv_page_use_ratio divides by a constant page count: {expr}")
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


CHECKS = [check_objects, check_resources, check_probes, check_rollout_deadline, check_security, check_pdbs,
          check_services, check_drain, check_flags, check_cachestore_budgets, check_autoscaling, check_adapter_pages,
          check_pod_monitors, check_prometheus_rules,
          check_topology, check_network_policies, check_gateway_objects, check_gateway_probes, check_gateway_flags,
          check_gateway_tls]
TLS_CHECKS = [check_tls_flags, check_tls_secrets, check_tls_health, check_tls_peers, check_tls_certificates,
              check_spiffe_ids]


# --- deliberate breakage: (check, what, mutation of the cpu render) -------------

def _container(objs, comp):
    return m.container(objs, comp)


def _policy(objs, comp):
    return m.one(objs, "NetworkPolicy", f"hybridserve-{comp}")["spec"]


class _Flags:
    """The flag files of both flags ConfigMaps as one mapping: each key read
    from, written to and deleted in the ConfigMap that holds it."""

    def __init__(self, objs):
        self.datas = [m.config_map(objs, name)["data"] for name in m.CONFIG_NAMES]

    def _holder(self, key):
        for data in self.datas:
            if key in data:
                return data
        raise KeyError(key)

    def __getitem__(self, key):
        return self._holder(key)[key]

    def __setitem__(self, key, value):
        self._holder(key)[key] = value

    def __delitem__(self, key):
        del self._holder(key)[key]


def _config(objs):
    return _Flags(objs)


def _monitor(objs, comp):
    return m.one(objs, "PodMonitor", f"hybridserve-{comp}")["spec"]


def _scaled(objs, comp):
    return m.one(objs, "ScaledObject", f"hybridserve-{comp}")["spec"]


def _trigger(objs, comp, i):
    return _scaled(objs, comp)["triggers"][i]["metadata"]


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    if value is None:
        del d[path[-1]]
    else:
        d[path[-1]] = value


BREAKAGES = [
    (check_objects, "decode rollout may drop a pod",
     lambda o: _set(m.workload(o, "decode")["spec"]["strategy"]["rollingUpdate"], ["maxUnavailable"], 1)),
    (check_objects, "the Namespace back in the overlay",
     lambda o: o.extend(copy.deepcopy(m.render_namespace()))),
    (check_objects, "decode's data port renamed",
     lambda o: _set(_container(o, "decode")["ports"][1], ["name"], "plane")),
    (check_objects, "cachestore rolls instead of Recreate",
     lambda o: _set(m.workload(o, "cachestore")["spec"]["strategy"], ["type"], "RollingUpdate")),
    (check_resources, "decode without a memory limit",
     lambda o: _set(_container(o, "decode")["resources"]["limits"], ["memory"], None)),
    (check_resources, "cachestore without requests",
     lambda o: _set(_container(o, "cachestore")["resources"], ["requests"], None)),
    (check_probes, "readiness on the liveness service",
     lambda o: _set(_container(o, "decode")["readinessProbe"]["grpc"], ["service"], m.LIVENESS_SERVICE)),
    (check_probes, "prefill liveness on the wrong port",
     lambda o: _set(_container(o, "prefill")["livenessProbe"]["grpc"], ["port"], 9090)),
    (check_probes, "cachestore without a startup probe",
     lambda o: _set(_container(o, "cachestore"), ["startupProbe"], None)),
    (check_rollout_deadline, "decode at the default deadline (600 s, the startup window alone)",
     lambda o: _set(m.workload(o, "decode")["spec"], ["progressDeadlineSeconds"], None)),
    (check_rollout_deadline, "prefill's startup window raised past its deadline",
     lambda o: _set(_container(o, "prefill")["startupProbe"], ["failureThreshold"], 180)),
    (check_rollout_deadline, "the cachestore's deadline without room for an image pull",
     lambda o: _set(m.workload(o, "cachestore")["spec"], ["progressDeadlineSeconds"], 120)),
    (check_security, "writable root filesystem",
     lambda o: _set(_container(o, "prefill")["securityContext"], ["readOnlyRootFilesystem"], False)),
    (check_security, "capabilities kept",
     lambda o: _set(_container(o, "decode")["securityContext"]["capabilities"], ["drop"], [])),
    (check_security, "root allowed",
     lambda o: (_set(_container(o, "cachestore")["securityContext"], ["runAsNonRoot"], False),
                _set(m.pod_spec(o, "cachestore")["securityContext"], ["runAsNonRoot"], False))),
    (check_pdbs, "no PDB for prefill",
     lambda o: o.remove(m.one(o, "PodDisruptionBudget", "hybridserve-prefill"))),
    (check_pdbs, "decode's PDB selects prefill",
     lambda o: _set(m.one(o, "PodDisruptionBudget", "hybridserve-decode")["spec"]["selector"]["matchLabels"],
                    ["app.kubernetes.io/component"], "prefill")),
    (check_services, "decode Service selects nothing",
     lambda o: _set(m.one(o, "Service", "hybridserve-decode")["spec"]["selector"],
                    ["app.kubernetes.io/component"], "decoder")),
    (check_services, "prefill Service targets a port no container has",
     lambda o: _set(m.one(o, "Service", "hybridserve-prefill")["spec"]["ports"][0], ["targetPort"], "rpc")),
    (check_services, "prefill Service not headless",
     lambda o: _set(m.one(o, "Service", "hybridserve-prefill")["spec"], ["clusterIP"], None)),
    (check_drain, "decode grace shorter than the drain",
     lambda o: _set(m.pod_spec(o, "decode"), ["terminationGracePeriodSeconds"], 35)),
    (check_drain, "prefill grace ignores the publications step",
     lambda o: _set(m.pod_spec(o, "prefill"), ["terminationGracePeriodSeconds"], 50)),
    (check_drain, "decode --shutdown_grace raised in the flag file past the grace period",
     lambda o: _set(_config(o), ["decode.flags"], _config(o)["decode.flags"] + "--shutdown_grace=2m\n")),
    (check_drain, "no preStop",
     lambda o: _set(_container(o, "cachestore"), ["lifecycle"], None)),
    (check_flags, "metrics on another port than declared",
     lambda o: _set(_config(o), ["prefill.flags"], _config(o)["prefill.flags"] + "--metrics_address=:9091\n")),
    (check_flags, "decode's flag file not mounted",
     lambda o: _set(_container(o, "decode")["args"], [0], "--flagfile=/etc/flags/decode.flags")),
    (check_flags, "decode points at the prefill ClusterIP name",
     lambda o: _set(_config(o), ["decode.flags"], _config(o)["decode.flags"] + "--prefill=prefill:50061\n")),
    (check_flags, "advertise_host not the pod IP",
     lambda o: _set(_container(o, "decode")["env"][0], ["valueFrom"], {"fieldRef": {"fieldPath": "spec.nodeName"}})),
    (check_cachestore_budgets, "budgets above the memory limit's share",
     lambda o: _set(_config(o), ["cachestore-budgets.flags"],
                    _config(o)["cachestore-budgets.flags"] + "--page_budget_mib=1800\n")),
    (check_cachestore_budgets, "memory limit cut under the budgets",
     lambda o: _set(_container(o, "cachestore")["resources"]["limits"], ["memory"], "1Gi")),
    (check_autoscaling, "no scale-down stabilisation",
     lambda o: _set(_scaled(o, "decode")["advanced"]["horizontalPodAutoscalerConfig"], ["behavior"], None)),
    (check_autoscaling, "prefill's trigger on a series no rule records",
     lambda o: _set(_trigger(o, "prefill", 0), ["query"], 'hybridserve:prefill_queue_seconds:sum{namespace="hybridserve"}')),
    (check_autoscaling, "decode's trigger on the per-pod series (many samples)",
     lambda o: _set(_trigger(o, "decode", 0), ["query"], 'hybridserve:kv_page_use_ratio{namespace="hybridserve"}')),
    (check_autoscaling, "a trigger reading another namespace",
     lambda o: _set(_trigger(o, "decode", 1), ["query"], 'hybridserve:num_requests_waiting:sum{namespace="default"}')),
    (check_autoscaling, "a trigger without a threshold",
     lambda o: _set(_trigger(o, "prefill", 0), ["threshold"], None)),
    (check_autoscaling, "a threshold as a number, not a string",
     lambda o: _set(_trigger(o, "prefill", 0), ["threshold"], 2)),
    (check_autoscaling, "a trigger of decode's without a serverAddress",
     lambda o: _set(_trigger(o, "decode", 1), ["serverAddress"], None)),
    (check_autoscaling, "the HPA's field name in the ScaledObject (minReplicas)",
     lambda o: _scaled(o, "prefill").update(minReplicas=_scaled(o, "prefill").pop("minReplicaCount"))),
    (check_autoscaling, "decode's ScaledObject scales prefill",
     lambda o: _set(_scaled(o, "decode")["scaleTargetRef"], ["name"], "hybridserve-prefill")),
    (check_autoscaling, "KEDA's HPA under its default name beside an old one",
     lambda o: _scaled(o, "decode")["advanced"]["horizontalPodAutoscalerConfig"].pop("name")),
    (check_autoscaling, "an existing HPA not taken over",
     lambda o: m.one(o, "ScaledObject", "hybridserve-prefill")["metadata"].pop("annotations")),
    (check_autoscaling, "one decode pod at least",
     lambda o: _set(_scaled(o, "decode"), ["minReplicaCount"], 1)),
    (check_autoscaling, "a Value metric (not per pod)",
     lambda o: _set(_scaled(o, "decode")["triggers"][0], ["metricType"], "Value")),
    (check_autoscaling, "no triggers",
     lambda o: _set(_scaled(o, "prefill"), ["triggers"], [])),
    (check_autoscaling, "an HPA beside the ScaledObject",
     lambda o: o.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                         "metadata": {"name": "extra", "namespace": "hybridserve"},
                         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                     "name": "hybridserve-decode"}}})),
    (check_pod_monitors, "decode's PodMonitor scrapes the gRPC port",
     lambda o: _set(_monitor(o, "decode")["podMetricsEndpoints"][0], ["port"], "grpc")),
    (check_pod_monitors, "prefill's PodMonitor selects every hybridserve pod",
     lambda o: _monitor(o, "prefill")["selector"]["matchLabels"].pop("app.kubernetes.io/component")),
    (check_pod_monitors, "the cachestore's PodMonitor selects a label its pods lack",
     lambda o: _set(_monitor(o, "cachestore")["selector"]["matchLabels"], ["app.kubernetes.io/component"], "cache")),
    (check_pod_monitors, "the cachestore listens for scrapes on another port than its metrics port",
     lambda o: _set(_config(o), ["cachestore.flags"],
                    _config(o)["cachestore.flags"] + "--metrics_address=0.0.0.0:9091\n")),
    (check_pod_monitors, "decode's PodMonitor without endpoints",
     lambda o: _set(_monitor(o, "decode"), ["podMetricsEndpoints"], [])),
    (check_pod_monitors, "a ServiceMonitor's field in a PodMonitor (endpoints)",
     lambda o: _monitor(o, "decode").update(endpoints=_monitor(o, "decode").pop("podMetricsEndpoints"))),
    (check_pod_monitors, "prefill scraped over https",
     lambda o: _set(_monitor(o, "prefill")["podMetricsEndpoints"][0], ["scheme"], "https")),
    (check_pod_monitors, "decode's PodMonitor looks in namespace monitoring",
     lambda o: _set(_monitor(o, "decode"), ["namespaceSelector"], {"matchNames": ["monitoring"]})),
    (check_prometheus_rules, "the recording copy's page-use ratio over a constant",
     lambda o: _set(m.one(o, "PrometheusRule", "hybridserve-recording")["spec"]["groups"][0]["rules"][1], ["expr"],
                    "sum by (namespace, pod) (1 - hybridserve_kv_pages_free / 4096)")),
    (check_prometheus_rules, "the alerts' copy without its last alert",
     lambda o: m.one(o, "PrometheusRule", "hybridserve-alerts")["spec"]["groups"][0]["rules"].pop()),
    (check_prometheus_rules, "no recording rules for the Operator",
     lambda o: o.remove(m.one(o, "PrometheusRule", "hybridserve-recording"))),
    (check_prometheus_rules, "a field the CRD does not know",
     lambda o: _set(m.one(o, "PrometheusRule", "hybridserve-alerts")["spec"], ["rules"], [])),
    (check_topology, "decode spread over zones only",
     lambda o: _set(m.pod_spec(o, "decode")["topologySpreadConstraints"][0], ["topologyKey"],
                    "topology.kubernetes.io/zone")),
    (check_network_policies, "prefill's gRPC open to the cachestore instead of decode",
     lambda o: _set(_policy(o, "prefill")["ingress"][0]["from"][0]["podSelector"]["matchLabels"],
                    ["app.kubernetes.io/component"], "cachestore")),
    (check_network_policies, "Prometheus peer without its namespace selector",
     lambda o: _set(_policy(o, "decode")["ingress"][2]["from"][0], ["namespaceSelector"], None)),
    (check_network_policies, "decode's egress left open",
     lambda o: (_set(_policy(o, "decode"), ["egress"], None), _set(_policy(o, "decode"), ["policyTypes"],
                                                                     ["Ingress"]))),
    (check_network_policies, "decode's data port open to every pod",
     lambda o: _set(_policy(o, "decode")["ingress"][1], ["from"], None)),
    (check_network_policies, "cachestore's gRPC open to every pod",
     lambda o: _set(_policy(o, "cachestore")["ingress"][0], ["from"], None)),
    (check_network_policies, "prefill may reach decode's client port too",
     lambda o: _policy(o, "prefill")["egress"][0]["ports"].append({"port": 50050, "protocol": "TCP"})),
    (check_network_policies, "the gateway's egress to the cachestore, whose ingress lets it in",
     lambda o: (_policy(o, GATEWAY)["egress"][0]["to"][0]["podSelector"]["matchLabels"].pop(
         "app.kubernetes.io/component"), _policy(o, GATEWAY)["egress"][0]["ports"].append(
             {"port": 50051, "protocol": "TCP"}), _policy(o, "cachestore")["ingress"][0]["from"].append(
                 {"podSelector": {"matchLabels": {"app.kubernetes.io/component": GATEWAY}}}))),
    (check_network_policies, "the gateway's egress open to anything",
     lambda o: _policy(o, GATEWAY)["egress"][0].clear()),
    (check_network_policies, "decode's client port closed to the gateway",
     lambda o: _set(_policy(o, "decode")["ingress"][0], ["from"], [
         {"namespaceSelector": {}, "podSelector": {"matchExpressions": [
             {"key": "app.kubernetes.io/component", "operator": "NotIn", "values": [GATEWAY]}]}}])),
    (check_network_policies, "the gateway's port open only in its namespace",
     lambda o: _set(_policy(o, GATEWAY)["ingress"][0], ["from"], [{"podSelector": {}}])),
    (check_security, "the gateway's init container may escalate",
     lambda o: _set(m.pod_spec(o, GATEWAY)["initContainers"][0]["securityContext"], ["allowPrivilegeEscalation"],
                    True)),
    (check_security, "the gateway's root filesystem writable",
     lambda o: _set(_container(o, GATEWAY)["securityContext"], ["readOnlyRootFilesystem"], False)),
    (check_resources, "the gateway's init container without limits",
     lambda o: _set(m.pod_spec(o, GATEWAY)["initContainers"][0]["resources"], ["limits"], None)),
    (check_pdbs, "no PDB for the gateway",
     lambda o: o.remove(m.one(o, "PodDisruptionBudget", "hybridserve-gateway"))),
    (check_services, "the gateway Service targets the metrics port name",
     lambda o: _set(m.one(o, "Service", "hybridserve-gateway")["spec"]["ports"][0], ["targetPort"], "metrics")),
    (check_pod_monitors, "the gateway's PodMonitor scrapes a port named metrics",
     lambda o: _set(_monitor(o, GATEWAY)["podMetricsEndpoints"][0], ["port"], "metrics")),
    (check_pod_monitors, "no PodMonitor for the gateway",
     lambda o: o.remove(m.one(o, "PodMonitor", "hybridserve-gateway"))),
    (check_topology, "the gateway not spread over nodes",
     lambda o: m.pod_spec(o, GATEWAY).pop("topologySpreadConstraints")),
    (check_gateway_objects, "one gateway pod",
     lambda o: _set(m.workload(o, GATEWAY)["spec"], ["replicas"], 1)),
    (check_gateway_objects, "the gateway on the workers' image",
     lambda o: _set(_container(o, GATEWAY), ["image"], "hybridserve:latest")),
    (check_gateway_objects, "the gateway's Service on port 80",
     lambda o: _set(m.one(o, "Service", "hybridserve-gateway")["spec"]["ports"][0], ["port"], 80)),
    (check_gateway_objects, "the gateway's Service headless",
     lambda o: _set(m.one(o, "Service", "hybridserve-gateway")["spec"], ["clusterIP"], "None")),
    (check_gateway_objects, "the gateway runs as decode's ServiceAccount",
     lambda o: _set(m.pod_spec(o, GATEWAY), ["serviceAccountName"], "hybridserve-decode")),
    (check_gateway_objects, "the gateway's rollout may drop a pod",
     lambda o: _set(m.workload(o, GATEWAY)["spec"]["strategy"]["rollingUpdate"], ["maxUnavailable"], 1)),
    (check_gateway_objects, "an HPA on the gateway beside its replicas",
     lambda o: o.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                         "metadata": {"name": "hybridserve-gateway", "namespace": "hybridserve"},
                         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                     "name": "hybridserve-gateway"}}})),
    (check_gateway_objects, "no NetworkPolicy for the gateway",
     lambda o: o.remove(m.one(o, "NetworkPolicy", "hybridserve-gateway"))),
    (check_gateway_probes, "readiness on /health/live (ready while decode is down)",
     lambda o: _set(_container(o, GATEWAY)["readinessProbe"]["httpGet"], ["path"], "/health/live")),
    (check_gateway_probes, "a gRPC liveness probe",
     lambda o: _set(_container(o, GATEWAY), ["livenessProbe"], {"grpc": {"port": 8080}})),
    (check_gateway_probes, "the startup probe on another port",
     lambda o: _set(_container(o, GATEWAY)["startupProbe"]["httpGet"], ["port"], 9090)),
    (check_gateway_flags, "the gateway dials decode's pod port name, not its Service",
     lambda o: _gateway_arg(o, "decode", "dns:///hybridserve-decode-0:50050")),
    (check_gateway_flags, "the gateway dials prefill",
     lambda o: _gateway_arg(o, "decode", "dns:///hybridserve-prefill:50061")),
    (check_gateway_flags, "the gateway dials decode's ClusterIP Service (one decode pod a connection)",
     lambda o: _gateway_arg(o, "decode", "dns:///hybridserve-decode:50050")),
    (check_gateway_flags, "no headless Service of decode's pods",
     lambda o: o.remove(m.one(o, "Service", "hybridserve-decode-pods"))),
    (check_gateway_flags, "the Service of decode's pods a ClusterIP",
     lambda o: _set(m.one(o, "Service", "hybridserve-decode-pods")["spec"], ["clusterIP"], None)),
    (check_gateway_flags, "the Service of decode's pods publishes not-ready (and draining) pods",
     lambda o: _set(m.one(o, "Service", "hybridserve-decode-pods")["spec"], ["publishNotReadyAddresses"], True)),
    (check_gateway_flags, "the Service of decode's pods selects every hybridserve pod",
     lambda o: m.one(o, "Service", "hybridserve-decode-pods")["spec"]["selector"].pop(
         "app.kubernetes.io/component")),
    (check_gateway_flags, "the Service of decode's pods selects prefill's",
     lambda o: _set(m.one(o, "Service", "hybridserve-decode-pods")["spec"]["selector"],
                    ["app.kubernetes.io/component"], "prefill")),
    (check_gateway_flags, "the Service of decode's pods targets decode's metrics port",
     lambda o: _set(m.one(o, "Service", "hybridserve-decode-pods")["spec"]["ports"][0], ["targetPort"], "metrics")),
    (check_gateway_flags, "the gateway listens on another port than http",
     lambda o: _gateway_arg(o, "address", "0.0.0.0:8000")),
    (check_gateway_flags, "the API keys Secret optional",
     lambda o: _set(_volume(o, GATEWAY, "api-keys")["secret"], ["optional"], True)),
    (check_gateway_flags, "the API keys read from another Secret",
     lambda o: _set(_volume(o, GATEWAY, "api-keys")["secret"], ["secretName"], "api-keys")),
    (check_gateway_flags, "no --api_keys (no authentication)",
     lambda o: _container(o, GATEWAY)["args"].remove("--api_keys=/etc/hybridserve/api-keys/api_keys")),
    (check_gateway_flags, "the gateway's tokenizer from another directory than decode's model",
     lambda o: _gateway_arg(o, "model_dir", "/models/model")),
    (check_gateway_flags, "the model copy from another image than decode's",
     lambda o: _set(m.pod_spec(o, GATEWAY)["initContainers"][0], ["image"], "hybridserve:old")),
    (check_gateway_flags, "no copy of the model (an empty directory)",
     lambda o: m.pod_spec(o, GATEWAY).pop("initContainers")),
    (check_gateway_flags, "the gateway's drain shorter than decode's",
     lambda o: _gateway_arg(o, "drain_timeout", "10s")),
    (check_gateway_flags, "the gateway's grace period under its drain",
     lambda o: _set(m.pod_spec(o, GATEWAY), ["terminationGracePeriodSeconds"], 30)),
    (check_gateway_flags, "a flag the gateway does not define",
     lambda o: _container(o, GATEWAY)["args"].append("--tenant_from=certificate")),
    (check_gateway_tls, "decode trusts a proxy on a plaintext overlay",
     lambda o: _container(o, "decode")["args"].append(f"--trusted_proxies={_GATEWAY_ID}")),
    (check_gateway_tls, "--tls_server_name on a plaintext overlay (the gateway refuses it without --tls_ca)",
     lambda o: _gateway_arg(o, "tls_server_name", "hybridserve-decode")),
]


def _append_flag(o, file_name, line):
    _set(_config(o), [file_name], _config(o)[file_name] + line + "\n")


def _drop_flag(o, file_name, flag):
    lines = _config(o)[file_name].splitlines(keepends=True)
    _set(_config(o), [file_name], "".join(x for x in lines if not x.startswith(f"--{flag}=")))


def _set_peers(o, comp, peers):
    args = _container(o, comp)["args"]
    at = next(i for i, a in enumerate(args) if a.startswith("--tls_allowed_peers="))
    args[at] = f"--tls_allowed_peers={peers}"


def _env(o, comp, name):
    return next(e for e in _container(o, comp)["env"] if e["name"] == name)


def _volume(o, comp, name):
    return next(v for v in m.pod_spec(o, comp)["volumes"] if v["name"] == name)


def _gateway_arg(o, flag, value):
    """The gateway's --flag arg set to value (appended when absent)."""
    args = _container(o, GATEWAY)["args"]
    at = [i for i, a in enumerate(args) if a.startswith(f"--{flag}=")]
    if at:
        args[at[0]] = f"--{flag}={value}"
    else:
        args.append(f"--{flag}={value}")


def _set_proxies(o, value):
    args = _container(o, "decode")["args"]
    at = next(i for i, a in enumerate(args) if a.startswith("--trusted_proxies="))
    args[at] = f"--trusted_proxies={value}"


def _certificate(example, name):
    return next(c for c in example if c["kind"] == "Certificate" and c["metadata"]["name"] == name)


# An allowed peer as the manifests write it (the kubelet expands it).
_SPIFFE = "spiffe://$(TRUST_DOMAIN)/ns/$(POD_NAMESPACE)/sa"
_DECODE_ID = f"spiffe://{m.TRUST_DOMAIN}/ns/hybridserve/sa/hybridserve-decode"
_PREFILL_ID = f"spiffe://{m.TRUST_DOMAIN}/ns/hybridserve/sa/hybridserve-prefill"
_CACHESTORE_ID = f"spiffe://{m.TRUST_DOMAIN}/ns/hybridserve/sa/hybridserve-cachestore"
_GATEWAY_ID = f"spiffe://{m.TRUST_DOMAIN}/ns/hybridserve/sa/hybridserve-gateway"

# (check, what, mutation of the cpu-mtls render)
TLS_BREAKAGES = [
    (check_objects, "decode runs as prefill's ServiceAccount",
     lambda o: _set(m.pod_spec(o, "decode"), ["serviceAccountName"], "hybridserve-prefill")),
    (check_objects, "the service-account token mounted",
     lambda o: _set(m.pod_spec(o, "cachestore"), ["automountServiceAccountToken"], True)),
    (check_probes, "liveness probed on the TLS port",
     lambda o: _set(_container(o, "prefill")["livenessProbe"]["grpc"], ["port"], 50061)),
    (check_network_policies, "the health port open to every pod",
     lambda o: _policy(o, "decode")["ingress"][0]["ports"].append({"port": "health", "protocol": "TCP"})),
    (check_tls_flags, "decode's TLS flag file not on its args",
     lambda o: _container(o, "decode")["args"].remove("--flagfile=/etc/hybridserve/flags/decode-tls.flags")),
    (check_tls_flags, "prefill calls the cachestore in plaintext (no --tls_ca)",
     lambda o: _drop_flag(o, "prefill-tls.flags", "tls_ca")),
    (check_tls_flags, "decode takes clients without certificates",
     lambda o: _append_flag(o, "decode-tls.flags", "--tls_client_auth=request")),
    (check_tls_flags, "the cachestore takes unauthenticated callers",
     lambda o: _append_flag(o, "cachestore-tls.flags", "--tls_client_auth=none")),
    (check_tls_flags, "decode's tenants from a header",
     lambda o: _append_flag(o, "decode-tls.flags", "--tenant_from=proxy_header")),
    (check_tls_flags, "--tenant_from given to prefill, which does not define it",
     lambda o: _append_flag(o, "prefill-tls.flags", "--tenant_from=certificate")),
    (check_tls_flags, "a wildcard allowed peer",
     lambda o: _set_peers(o, "prefill", "*")),
    (check_tls_flags, "the health port bound to loopback",
     lambda o: _append_flag(o, "cachestore-tls.flags", "--health_address=127.0.0.1:50080")),
    (check_tls_flags, "a refresh interval the binaries refuse",
     lambda o: _append_flag(o, "decode-tls.flags", "--tls_refresh=500ms")),
    (check_tls_secrets, "prefill mounts decode's Secret",
     lambda o: _set(_volume(o, "prefill", "tls")["secret"], ["secretName"], "hybridserve-decode-tls")),
    (check_tls_secrets, "decode's Secret optional",
     lambda o: _set(_volume(o, "decode", "tls")["secret"], ["optional"], True)),
    (check_tls_secrets, "the cachestore's Secret not mounted",
     lambda o: _set(_container(o, "cachestore"), ["volumeMounts"],
                    [v for v in _container(o, "cachestore")["volumeMounts"] if v["name"] != "tls"])),
    (check_tls_secrets, "the CA read from the certificate's key",
     lambda o: _append_flag(o, "decode-tls.flags", f"--tls_ca={m.TLS_MOUNT}/tls.crt")),
    (check_tls_secrets, "the Secret's items leave out the key",
     lambda o: _set(_volume(o, "prefill", "tls")["secret"], ["items"],
                    [{"key": "tls.crt", "path": "tls.crt"}, {"key": "ca.crt", "path": "ca.crt"}])),
    (check_tls_health, "readiness probed on the TLS port",
     lambda o: _set(_container(o, "decode")["readinessProbe"]["grpc"], ["port"], 50050)),
    (check_tls_health, "the health port not declared",
     lambda o: _set(_container(o, "prefill"), ["ports"],
                    [p for p in _container(o, "prefill")["ports"] if p["name"] != "health"])),
    (check_tls_health, "--health_address on another port than the probes'",
     lambda o: _append_flag(o, "cachestore-tls.flags", "--health_address=0.0.0.0:50081")),
    (check_tls_peers, "prefill also lets the cachestore's identity in",
     lambda o: _set_peers(o, "prefill", f"{_SPIFFE}/hybridserve-decode,{_SPIFFE}/hybridserve-cachestore")),
    (check_tls_peers, "the cachestore forgets prefill",
     lambda o: _set_peers(o, "cachestore", f"{_SPIFFE}/hybridserve-decode")),
    (check_tls_peers, "the trust domain on prefill's env not the setting's",
     lambda o: _set(_env(o, "prefill", "TRUST_DOMAIN"), ["value"], "example.org")),
    (check_spiffe_ids, "prefill's peers with the namespace written out",
     lambda o: _set_peers(o, "prefill", "spiffe://$(TRUST_DOMAIN)/ns/hybridserve/sa/hybridserve-decode")),
    (check_spiffe_ids, "the cachestore's peers with the trust domain written out",
     lambda o: _set_peers(o, "cachestore", f"spiffe://{m.TRUST_DOMAIN}/ns/$(POD_NAMESPACE)/sa/hybridserve-decode,"
                                           f"{_SPIFFE}/hybridserve-prefill")),
    (check_spiffe_ids, "the peers back in a flag file, written out",
     lambda o: _append_flag(o, "decode-tls.flags", f"--tls_allowed_peers={_PREFILL_ID}")),
    (check_spiffe_ids, "POD_NAMESPACE from the pod's name",
     lambda o: _set(_env(o, "cachestore", "POD_NAMESPACE")["valueFrom"]["fieldRef"], ["fieldPath"], "metadata.name")),
    (check_spiffe_ids, "no TRUST_DOMAIN on prefill's env",
     lambda o: _container(o, "prefill")["env"].remove(_env(o, "prefill", "TRUST_DOMAIN"))),
    (check_tls_peers, "the cachestore's NetworkPolicy no longer lets prefill in, its peers still name it",
     lambda o: _policy(o, "cachestore")["ingress"][0]["from"].pop()),
    (check_tls_peers, "decode runs as another ServiceAccount than prefill lets in",
     lambda o: _set(m.pod_spec(o, "decode"), ["serviceAccountName"], "hybridserve-frontend")),
    (check_tls_peers, "decode's client port limited to prefill's identity",
     lambda o: _append_flag(o, "decode-tls.flags", f"--tls_allowed_peers={_PREFILL_ID}")),
    (check_tls_certificates, "decode mounts a Secret the example does not issue",
     lambda o: _set(_volume(o, "decode", "tls")["secret"], ["secretName"], "hybridserve-decode-tls-v2")),
    (check_gateway_tls, "decode trusts no proxy (the gateway's tenants all one)",
     lambda o: _container(o, "decode")["args"].remove(f"--trusted_proxies={_SPIFFE}/hybridserve-gateway")),
    (check_gateway_tls, "decode trusts prefill as a proxy",
     lambda o: _set_proxies(o, f"{_SPIFFE}/hybridserve-prefill")),
    (check_gateway_tls, "decode trusts the gateway and prefill",
     lambda o: _set_proxies(o, f"{_SPIFFE}/hybridserve-gateway,{_SPIFFE}/hybridserve-prefill")),
    (check_gateway_tls, "the gateway runs as another ServiceAccount than decode trusts",
     lambda o: _set(m.pod_spec(o, GATEWAY), ["serviceAccountName"], "hybridserve-frontend")),
    (check_gateway_tls, "decode's tenants from the proxy header for every caller",
     lambda o: _append_flag(o, "decode-tls.flags", "--tenant_from=proxy_header")),
    (check_gateway_tls, "the gateway calls decode without a certificate",
     lambda o: _container(o, GATEWAY)["args"].remove("--tls_cert=/etc/hybridserve/tls/tls.crt")),
    (check_gateway_tls, "the gateway mounts decode's Secret",
     lambda o: _set(_volume(o, GATEWAY, "tls")["secret"], ["secretName"], "hybridserve-decode-tls")),
    (check_gateway_tls, "the gateway's Secret optional",
     lambda o: _set(_volume(o, GATEWAY, "tls")["secret"], ["optional"], True)),
    (check_gateway_tls, "the gateway checks decode's certificate against a name it lacks",
     lambda o: _container(o, GATEWAY)["args"].append("--tls_server_name=decode.example")),
    (check_gateway_tls, "the gateway checks decode's certificate against the headless name it dials",
     lambda o: _container(o, GATEWAY)["args"].remove("--tls_server_name=hybridserve-decode")),
    (check_spiffe_ids, "decode's trusted proxy written out",
     lambda o: _set_proxies(o, _GATEWAY_ID)),
    (check_spiffe_ids, "no POD_NAMESPACE on decode's env for its trusted proxy",
     lambda o: _container(o, "decode")["env"].remove(_env(o, "decode", "POD_NAMESPACE"))),
]

# (what, mutation of the cert-manager example), caught by check_tls_certificates
CERTIFICATE_BREAKAGES = [
    ("prefill's certificate without the Service's full name",
     lambda e: _certificate(e, "hybridserve-prefill")["spec"]["dnsNames"].remove(
         "hybridserve-prefill.hybridserve.svc.cluster.local")),
    ("the cachestore's certificate names decode's identity",
     lambda e: _set(_certificate(e, "hybridserve-cachestore")["spec"], ["uris"], [_DECODE_ID])),
    ("decode's certificate for servers only",
     lambda e: _set(_certificate(e, "hybridserve-decode")["spec"], ["usages"], ["server auth", "digital signature"])),
    ("prefill's certificate from the self-signed Issuer",
     lambda e: _set(_certificate(e, "hybridserve-prefill")["spec"]["issuerRef"], ["name"], "hybridserve-selfsigned")),
    ("the cachestore's certificate in another namespace",
     lambda e: _set(_certificate(e, "hybridserve-cachestore")["metadata"], ["namespace"], "default")),
    ("the CA Issuer's Secret is no CA",
     lambda e: _set(_certificate(e, "hybridserve-ca")["spec"], ["isCA"], False)),
]

# (what, mutation of the cert-manager example), caught by check_gateway_tls
GATEWAY_CERTIFICATE_BREAKAGES = [
    ("the gateway's certificate names decode's identity",
     lambda e: _set(_certificate(e, "hybridserve-gateway")["spec"], ["uris"], [_DECODE_ID])),
    ("the gateway's certificate for servers only",
     lambda e: _set(_certificate(e, "hybridserve-gateway")["spec"], ["usages"], ["server auth", "digital signature"])),
    ("the gateway's certificate from the self-signed Issuer (decode does not trust it)",
     lambda e: _set(_certificate(e, "hybridserve-gateway")["spec"]["issuerRef"], ["name"], "hybridserve-selfsigned")),
    ("no certificate for the gateway",
     lambda e: e.remove(_certificate(e, "hybridserve-gateway"))),
    ("decode's certificate without the name the gateway checks",
     lambda e: _certificate(e, "hybridserve-decode")["spec"]["dnsNames"].remove("hybridserve-decode")),
]


_KV_RATIO = "hybridserve:kv_page_use_ratio"

# (what, mutation of (recording rules, adapter rules, the overlay's render)),
# caught by check_adapter_pages on the cpu and the gpu overlay
RULE_BREAKAGES = [
    ("the ratio over the overlay's --max_pages as a constant",
     lambda r, a, o: _set(r, [_KV_RATIO], r[_KV_RATIO].replace(
         "on (namespace, pod) hybridserve_kv_pages_total", m.flags(o, "decode")["max_pages"]))),
    ("the ratio over the cpu overlay's 4096 pages",
     lambda r, a, o: _set(r, [_KV_RATIO], r[_KV_RATIO].replace(
         "on (namespace, pod) hybridserve_kv_pages_total", "4096"))),
    ("the ratio over prefill's free pages instead of decode's total",
     lambda r, a, o: _set(r, [_KV_RATIO], r[_KV_RATIO].replace(
         "hybridserve_kv_pages_total", "hybridserve_prefill_kv_pages_free"))),
    ("the adapter divides the raw gauge again",
     lambda r, a, o: _set(a[1], ["seriesQuery"], 'hybridserve_kv_pages_free{namespace!="",pod!=""}')),
    ("an adapter rule on a series nothing records",
     lambda r, a, o: r.pop("hybridserve:prefill_backlog_seconds")),
]


def _affinity_terms(o, comp):
    return m.pod_spec(o, comp)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


def _append_gpu_flag(o, line):
    _set(_config(o), ["decode-gpu.flags"], _config(o)["decode-gpu.flags"] + line + "\n")


# (what, mutation of the gpu render), caught by check_gpu_placement (or check_drain)
GPU_BREAKAGES = [
    ("decode without node affinity", lambda o: m.pod_spec(o, "decode").pop("affinity")),
    ("prefill admits the 575 driver (Gt 570)",
     lambda o: _set(_affinity_terms(o, "prefill")[0]["matchExpressions"][0], ["values"], ["570"])),
    ("decode on any GPU node (Exists)",
     lambda o: _affinity_terms(o, "decode")[0]["matchExpressions"][0].update(operator="Exists", values=[])),
    ("the old GFD label spelled with the new key's value",
     lambda o: _set(_affinity_terms(o, "prefill")[0]["matchExpressions"][0], ["key"], "nvidia.com/cuda.driver.major")),
    ("a second term admitting any GPU node",
     lambda o: _affinity_terms(o, "decode").append(
         {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]})),
    ("the cpu overlay's batch on a GPU", lambda o: _append_gpu_flag(o, "--max_batch=8")),
    ("decode's streams cut 30 s after SIGTERM", lambda o: _append_gpu_flag(o, "--shutdown_grace=30s")),
    ("decode's grace period the base's 60 s", lambda o: _set(m.pod_spec(o, "decode"), ["terminationGracePeriodSeconds"], 60)),
    ("the nvidia RuntimeClass on decode alone", lambda o: _set(m.pod_spec(o, "decode"), ["runtimeClassName"], "nvidia")),
    ("the cachestore on the nvidia RuntimeClass",
     lambda o: _set(m.pod_spec(o, "cachestore"), ["runtimeClassName"], "nvidia")),
    ("the cachestore only on GPU nodes",
     lambda o: _set(m.pod_spec(o, "cachestore"), ["nodeSelector"], {"nvidia.com/gpu.present": "true"})),
]

# (what, mutation of the recording rules {record: expr}), caught by
# check_autoscaling on the cpu overlay: the KEDA queries name recorded series.
RECORDING_BREAKAGES = [
    ("decode's page-use sum renamed",
     lambda r: r.update({"hybridserve:kv_page_use_ratio:total": r.pop("hybridserve:kv_page_use_ratio:sum")})),
    ("the backlog sum no longer recorded", lambda r: r.pop("hybridserve:prefill_backlog_seconds:sum")),
    ("the waiting sum per pod, not per namespace",
     lambda r: r.update({"hybridserve:num_requests_waiting:sum": "sum by (pod) (hybridserve:num_requests_waiting)"})),
]

# (what, mutation of the alternative's render), caught by check_autoscaling_alternative
ALTERNATIVE_BREAKAGES = [
    ("the HPA's decode bound above KEDA's",
     lambda o: _set(m.one(o, "HorizontalPodAutoscaler", "hybridserve-decode")["spec"], ["maxReplicas"], 9)),
    ("the HPA's backlog target 3 s, KEDA's 2 s",
     lambda o: _set(m.one(o, "HorizontalPodAutoscaler", "hybridserve-prefill")["spec"]["metrics"][0]["pods"]
                    ["target"], ["averageValue"], "3")),
    ("the HPA scales decode down faster",
     lambda o: _set(m.one(o, "HorizontalPodAutoscaler", "hybridserve-decode")["spec"]["behavior"]["scaleDown"],
                    ["stabilizationWindowSeconds"], 300)),
    ("the ScaledObject left beside the HPA",
     lambda o: o.append({"apiVersion": m.KEDA_API, "kind": "ScaledObject",
                         "metadata": {"name": "hybridserve-decode", "namespace": "hybridserve"},
                         "spec": {"scaleTargetRef": {"name": "hybridserve-decode"}}})),
]


class ManifestPolicyTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.rendered = {o: m.render(o) for o in m.overlays()}

    def test_every_overlay_renders(self):
        self.assertEqual(sorted(self.rendered), ["cpu", "cpu-mtls", "gpu", "gpu-mtls"])
        self.assertEqual(sorted(o for o in self.rendered if m.uses_mtls(o)), ["cpu-mtls", "gpu-mtls"])
        # An -mtls overlay is its base overlay with the mtls component: the
        # same objects, the same device settings.
        for overlay in ("cpu", "gpu"):
            plain, mtls = self.rendered[overlay], self.rendered[f"{overlay}-mtls"]
            # (The flags ConfigMap's hash differs: mtls adds flag files.)
            self.assertEqual([(o["kind"], m.generator_name(o)) for o in plain],
                             [(o["kind"], m.generator_name(o)) for o in mtls])
            for comp in WORKERS:
                self.assertEqual({k: v for k, v in m.flags(plain, comp).items() if k in ("device", "max_pages")},
                                 {k: v for k, v in m.flags(mtls, comp).items() if k in ("device", "max_pages")})
        for overlay, objs in self.rendered.items():
            self.assertGreaterEqual(len(objs), 18, overlay)

    def test_the_namespace_applies_on_its_own(self):
        # deploy/k8s/namespace holds exactly the Namespace every namespaced
        # object of every overlay lives in; no overlay renders it.
        namespaced = {o["metadata"]["namespace"] for objs in self.rendered.values() for o in objs
                      if o["kind"] != "Namespace"}
        self.assertEqual(namespaced, {"hybridserve"})
        ns = m.render_namespace()
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in ns], [("Namespace", "hybridserve")])
        for overlay, objs in self.rendered.items():
            self.assertEqual(m.find(objs, "Namespace"), [], overlay)

    def test_each_check_passes_on_every_overlay(self):
        for overlay, objs in self.rendered.items():
            for check in CHECKS:
                with self.subTest(overlay=overlay, check=check.__name__):
                    self.assertEqual(check(objs), [])
            with self.subTest(overlay=overlay, check="check_device"):
                self.assertEqual(check_device(objs, overlay), [])
            with self.subTest(overlay=overlay, check="check_gpu_placement"):
                self.assertEqual(check_gpu_placement(objs, overlay), [])
            if m.uses_mtls(overlay):
                for check in TLS_CHECKS:
                    with self.subTest(overlay=overlay, check=check.__name__):
                        self.assertEqual(check(objs), [])
            else:
                # Plaintext: no TLS flag, no Secret; the TLS checks would fail.
                for comp in COMPONENTS:
                    self.assertEqual([k for k in m.flags(objs, comp) if k in BINARY_TLS_FLAGS[comp]], [], comp)
                    self.assertFalse([v for v in m.pod_spec(objs, comp)["volumes"] if "secret" in v], comp)
                self.assertNotEqual(check_tls_flags(objs), [], overlay)

    def test_each_check_catches_its_breakages(self):
        covered = set()
        for overlay, breakages in (("cpu", BREAKAGES), ("cpu-mtls", TLS_BREAKAGES)):
            for check, what, mutate in breakages:
                with self.subTest(overlay=overlay, check=check.__name__, breakage=what):
                    broken = copy.deepcopy(self.rendered[overlay])
                    mutate(broken)
                    self.assertNotEqual(check(broken), [], f"{check.__name__} missed: {what}")
                    covered.add(check)
        for what, mutate in CERTIFICATE_BREAKAGES:
            with self.subTest(check="check_tls_certificates", breakage=what):
                example = copy.deepcopy(m.cert_manager_example())
                mutate(example)
                self.assertNotEqual(check_tls_certificates(self.rendered["cpu-mtls"], example), [],
                                    f"check_tls_certificates missed: {what}")
        for what, mutate in GATEWAY_CERTIFICATE_BREAKAGES:
            with self.subTest(check="check_gateway_tls", breakage=what):
                example = copy.deepcopy(m.cert_manager_example())
                mutate(example)
                self.assertNotEqual(check_gateway_tls(self.rendered["cpu-mtls"], example), [],
                                    f"check_gateway_tls missed: {what}")
        for what, mutate in RULE_BREAKAGES:
            for overlay in ("cpu", "gpu"):
                with self.subTest(check="check_adapter_pages", overlay=overlay, breakage=what):
                    recording, adapter = copy.deepcopy(m.recording_rules()), copy.deepcopy(m.monitoring_rules())
                    mutate(recording, adapter, self.rendered[overlay])
                    self.assertNotEqual(check_adapter_pages(self.rendered[overlay], recording, adapter), [],
                                        f"check_adapter_pages missed: {what}")
                    covered.add(check_adapter_pages)
        for what, mutate in RECORDING_BREAKAGES:
            with self.subTest(check="check_autoscaling", breakage=what):
                recording = copy.deepcopy(m.recording_rules())
                mutate(recording)
                self.assertNotEqual(check_autoscaling(self.rendered["cpu"], recording=recording), [],
                                    f"check_autoscaling missed: {what}")
        self.assertEqual(covered, set(CHECKS + TLS_CHECKS),
                         "every check has a breakage it must catch")

    def test_a_flag_edit_rolls_every_deployment(self):
        # Every overlay: a flag edit renames the flags ConfigMap (kustomize's
        # hash suffix) and changes every Deployment's pod template.
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                edited = m.render(overlay, edit=edit_flag_files)
                self.assertEqual(check_config_rolls(objs, edited), [])
                for name in m.CONFIG_NAMES:
                    self.assertNotEqual(m.config_map(objs, name)["metadata"]["name"],
                                        m.config_map(edited, name)["metadata"]["name"])
                # A worker flag edit rolls the workers alone: the cachestore
                # (Recreate) keeps its pod, and its cache.
                decode_only = m.render(overlay, edit=edit_decode_flags)
                self.assertEqual(check_config_rolls(objs, decode_only), [])
                for comp, rolls in (("decode", True), ("prefill", True), ("cachestore", False)):
                    self.assertEqual(m.workload(objs, comp)["spec"]["template"]
                                     != m.workload(decode_only, comp)["spec"]["template"], rolls, comp)

        # The earlier kustomization (generatorOptions: disableNameSuffixHash)
        # fails it, for each Deployment.
        def fixed_name(root):
            path = os.path.join(root, "base", "kustomization.yaml")
            with open(path, encoding="utf-8") as f:
                kustomization = yaml.safe_load(f)
            kustomization["generatorOptions"] = {"disableNameSuffixHash": True}
            with open(path, "w", encoding="utf-8") as f:
                yaml.safe_dump(kustomization, f)

        def fixed_name_edited(root):
            fixed_name(root)
            edit_flag_files(root)

        errors = check_config_rolls(m.render("cpu", edit=fixed_name), m.render("cpu", edit=fixed_name_edited))
        for comp in COMPONENTS:
            self.assertTrue([e for e in errors if e.startswith(f"hybridserve-{comp}: ConfigMap hybridserve-")
                             and "keeps its name" in e], errors)
            self.assertIn(f"hybridserve-{comp}: its pod template is unchanged after its flags changed: "
                          "it does not roll", errors)

    def test_prometheus_adapter_alternative(self):
        # Every overlay with components/prometheus-adapter: HPAs in place of
        # the ScaledObjects, which pass the same policy and scale alike.
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                alternative = m.render(overlay, [m.ADAPTER_COMPONENT])
                self.assertEqual(m.find(alternative, "ScaledObject"), [])
                self.assertEqual(len(m.find(alternative, "HorizontalPodAutoscaler")), 2)
                self.assertEqual(check_autoscaling(alternative), [])
                self.assertEqual(check_autoscaling_alternative(objs, alternative), [])
                self.assertEqual(len(alternative), len(objs))
        alternative = m.render("cpu", [m.ADAPTER_COMPONENT])
        for what, mutate in ALTERNATIVE_BREAKAGES:
            with self.subTest(check="check_autoscaling_alternative", breakage=what):
                broken = copy.deepcopy(alternative)
                mutate(broken)
                self.assertNotEqual(check_autoscaling_alternative(self.rendered["cpu"], broken), [],
                                    f"check_autoscaling_alternative missed: {what}")

    def test_each_setting_in_one_place(self):
        # settings/settings.yaml changed alone moves every object that
        # depends on a setting: the namespace of every object and the
        # Namespace, the KEDA queries and their Prometheus, the
        # NetworkPolicies' Prometheus and DNS peers, the SPIFFE IDs.
        changed = {"namespace": "prod", "trust_domain": "example.org", "prometheus_namespace": "observability",
                   "prometheus_name": "kube-prometheus", "prometheus_url": "http://prom.observability.svc:9090",
                   "dns_namespace": "dns", "dns_k8s_app": "coredns"}
        self.assertEqual(set(changed), set(m.settings()))
        self.assertEqual(m.TRUST_DOMAIN, "hybridserve.local")
        outside = m.outside_endpoints(changed)
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in m.render_namespace(changed)],
                         [("Namespace", "prod")])
        for overlay in ("cpu", "cpu-mtls"):
            with self.subTest(overlay=overlay):
                objs = m.render(overlay, settings_override=changed)
                self.assertEqual({o["metadata"].get("namespace") for o in objs}, {"prod"})
                self.assertEqual(check_autoscaling(objs), [])
                for so in m.find(objs, "ScaledObject"):
                    for trigger in so["spec"]["triggers"]:
                        self.assertTrue(trigger["metadata"]["query"].endswith('{namespace="prod"}'))
                        self.assertEqual(trigger["metadata"]["serverAddress"], changed["prometheus_url"])
                self.assertEqual(m.allowed_flows(objs, outside), m.EXPECTED_FLOWS)
                # The old places no longer reach the pods.
                self.assertNotEqual(m.allowed_flows(objs), m.EXPECTED_FLOWS)
                if m.uses_mtls(overlay):
                    self.assertEqual(check_spiffe_ids(objs, "example.org"), [])
                    example = m.cert_manager_example(changed)
                    self.assertEqual(check_tls_certificates(objs, example, "example.org"), [])
                    self.assertEqual({o["metadata"]["namespace"] for o in example}, {"prod"})
                    self.assertEqual(m.flags(objs, "prefill")["tls_allowed_peers"],
                                     "spiffe://example.org/ns/prod/sa/hybridserve-decode")
                    self.assertEqual(m.flags(objs, "cachestore")["tls_allowed_peers"],
                                     "spiffe://example.org/ns/prod/sa/hybridserve-decode,"
                                     "spiffe://example.org/ns/prod/sa/hybridserve-prefill")
                    self.assertEqual(m.flags(objs, "decode")["trusted_proxies"],
                                     "spiffe://example.org/ns/prod/sa/hybridserve-gateway")
                    self.assertEqual(check_gateway_tls(objs, example, "example.org"), [])

    def test_gpu_placement_catches_its_breakages(self):
        gpu = self.rendered["gpu"]
        # A cpu overlay's pods under the gpu rules, and back.
        self.assertNotEqual(check_gpu_placement(self.rendered["cpu"], "gpu"), [])
        self.assertNotEqual(check_gpu_placement(gpu, "cpu"), [])
        for what, mutate in GPU_BREAKAGES:
            with self.subTest(breakage=what):
                broken = copy.deepcopy(gpu)
                mutate(broken)
                self.assertNotEqual(check_gpu_placement(broken, "gpu") + check_drain(broken), [],
                                    f"check_gpu_placement missed: {what}")

    def test_nvidia_runtime_class(self):
        # components/nvidia-runtime-class: both GPU workers on the nvidia
        # RuntimeClass, the cachestore on the default; all else unchanged.
        for overlay in ("gpu", "gpu-mtls"):
            with self.subTest(overlay=overlay):
                objs = m.render(overlay, ["components/nvidia-runtime-class"])
                self.assertEqual({c: m.pod_spec(objs, c).get("runtimeClassName") for c in COMPONENTS},
                                 {"decode": "nvidia", "prefill": "nvidia", "cachestore": None})
                self.assertEqual(check_gpu_placement(objs, overlay), [])
                for o in objs:
                    if o["kind"] == "Deployment":
                        o["spec"]["template"]["spec"].pop("runtimeClassName", None)
                self.assertEqual(objs, self.rendered[overlay])

    def test_without_prometheus_operator(self):
        # components/without-prometheus-operator removes exactly the PodMonitors
        # and the PrometheusRules.
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                without = m.render(overlay, ["components/without-prometheus-operator"])
                self.assertEqual(m.find(without, "PodMonitor") + m.find(without, "PrometheusRule"), [])
                self.assertEqual([o for o in objs if o["kind"] not in ("PodMonitor", "PrometheusRule")], without)

    def test_device_check_catches_a_cpu_overlay_on_gpus(self):
        self.assertNotEqual(check_device(self.rendered["cpu"], "gpu"), [])
        self.assertNotEqual(check_device(self.rendered["gpu"], "cpu"), [])
        self.assertNotEqual(check_device(self.rendered["cpu-mtls"], "gpu-mtls"), [])

    def test_network_policy_table(self):
        # The table itself, written out: what the README's flow table says.
        flows = m.allowed_flows(self.rendered["cpu"])
        self.assertIn(("decode", "prefill", 50061, "TCP"), flows)
        self.assertIn(("prefill", "decode", 50070, "TCP"), flows)
        for denied in [("client", "prefill", 50061, "TCP"), ("client", "cachestore", 50051, "TCP"),
                       ("client", "decode", 50070, "TCP"), ("decode", "decode", 50070, "TCP"),
                       ("cachestore", "decode", 50050, "TCP"), ("grafana", "decode", 9090, "TCP"),
                       ("prefill", "prefill", 50061, "TCP"), ("decode", "prometheus", 9090, "TCP"),
                       # The gateway reaches decode's client port alone, and
                       # nothing but clients reach it.
                       ("gateway", "cachestore", 50051, "TCP"), ("gateway", "cachestore", 50052, "TCP"),
                       ("gateway", "prefill", 50061, "TCP"), ("gateway", "decode", 50070, "TCP"),
                       ("gateway", "decode", 9090, "TCP"), ("gateway", "gateway", 8080, "TCP"),
                       ("decode", "gateway", 8080, "TCP"), ("prefill", "gateway", 8080, "TCP")]:
            self.assertNotIn(denied, flows)
        for allowed in [("gateway", "decode", 50050, "TCP"), ("client", "gateway", 8080, "TCP"),
                        ("prometheus", "gateway", 8080, "TCP"), ("gateway", "dns", 53, "UDP")]:
            self.assertIn(allowed, flows)
        # With mutual TLS the flows are the same, and no pod reaches a health
        # port: only the kubelet does (a pod's own node always may).
        self.assertEqual(m.allowed_flows(self.rendered["cpu-mtls"]), flows)
        self.assertIn(m.HEALTH_PORT, {p for _, p, _ in m.endpoints(self.rendered["cpu-mtls"])[0].ports})


if __name__ == "__main__":
    unittest.main()
