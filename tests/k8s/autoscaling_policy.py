"""The pools' autoscaling checks over the rendered manifests of deploy/k8s:
the KEDA ScaledObjects (their fields, triggers on recorded series of their
own namespace, scale-down stabilisation, the HPAs they take over), the
alternative without KEDA (autoscaling/v2 HPAs on the Prometheus adapter's
metrics) and the adapter's pages rule. Each check takes the render's objects
and returns its errors; manifest_policy_test runs them on every overlay and
on deliberately broken renders."""

import re

import manifests as m

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
