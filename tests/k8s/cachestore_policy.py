"""The cachestore shards' policy checks over the rendered manifests of
deploy/k8s (issue 49): a StatefulSet of shards (Parallel, rolling one at a
time, spread over nodes) behind a headless Service that publishes ready
shards alone, one at a time disrupted, each shard's disk from a
volumeClaimTemplate mounted at --disk_dir with the disk budget below the
volume. Each check takes the render's objects and returns its errors (none
when it holds); manifest_policy_test runs them on every overlay and on
deliberately broken renders. The workers' --cachestore and the grace period
the shutdown spill needs: pool_policy.check_flags and check_drain."""

import manifests as m
from manifests import PORTS


def _shards_service(objs):
    found = m.find(objs, "Service", m.SERVICES["cachestore"])
    return found[0] if found else None


def check_cachestore_shards(objs):
    errors = []
    w = m.workload(objs, "cachestore")
    if w is None or w["kind"] != "StatefulSet":
        return [f"cachestore: a {w['kind'] if w else 'missing workload'}, want a StatefulSet of shards (a stable "
                "name and disk each)"]
    spec = w["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    if spec.get("serviceName") != m.SERVICES["cachestore"]:
        errors.append(f"cachestore: serviceName {spec.get('serviceName')}, want {m.SERVICES['cachestore']}")
    if spec.get("podManagementPolicy") != "Parallel":
        errors.append(f"cachestore: podManagementPolicy {spec.get('podManagementPolicy', 'OrderedReady')}, want "
                      "Parallel (shards are independent)")
    if spec.get("updateStrategy", {}).get("type", "RollingUpdate") != "RollingUpdate" or spec.get(
            "updateStrategy", {}).get("rollingUpdate", {}).get("maxUnavailable", 1) != 1:
        errors.append(f"cachestore: updateStrategy {spec.get('updateStrategy')}, want RollingUpdate one shard at a "
                      "time")
    if spec.get("replicas", 1) < 2:
        errors.append(f"cachestore: {spec.get('replicas', 1)} shard(s), want 2 or more")
    # Each shard reports its pod's name (stable in a StatefulSet); one name
    # for all would put every chain on one shard's name.
    f = m.flags(objs, "cachestore")
    env = {e["name"]: e for e in m.container(objs, "cachestore").get("env", [])}
    name = f.get("shard_name")
    if name is not None:
        var = name[2:-1] if name.startswith("$(") and name.endswith(")") else None
        if var is None or env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get(
                "fieldPath") != "metadata.name":
            errors.append(f"cachestore: --shard_name={name}, want the pod's name (downward API metadata.name) or "
                          "the default (the host name)")
    terms = spec["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
    terms = terms.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
        t.get("podAffinityTerm", {}) for t in terms.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    if not any(t.get("topologyKey") == "kubernetes.io/hostname"
               and m.selector_matches(t.get("labelSelector"), labels, False) for t in terms):
        errors.append("cachestore: no pod anti-affinity over kubernetes.io/hostname among its shards")
    svc = _shards_service(objs)
    if svc is None:
        errors.append(f"cachestore: no Service {m.SERVICES['cachestore']}")
    else:
        name = svc["metadata"]["name"]
        if svc["spec"].get("clusterIP") != "None":
            errors.append(f"Service {name}: not headless (a virtual IP spreads a chain over the shards)")
        if svc["spec"].get("publishNotReadyAddresses", False):
            errors.append(f"Service {name}: publishes not-ready shards (a dead shard stays in the workers' set)")
        if not m.selector_matches({"matchLabels": svc["spec"].get("selector") or {}}, labels, False):
            errors.append(f"Service {name}: does not select the shards")
        ports = {p.get("name"): p["port"] for p in svc["spec"].get("ports", [])}
        want = {"grpc": PORTS["cachestore"]["grpc"], "bulk": PORTS["cachestore"]["bulk"]}
        if ports != want:
            errors.append(f"Service {name}: ports {ports}, want {want}")
    pdbs = [p for p in m.find(objs, "PodDisruptionBudget")
            if m.selector_matches(p["spec"].get("selector"), labels, False)]
    if len(pdbs) != 1 or pdbs[0]["spec"].get("maxUnavailable") != 1 or "minAvailable" in pdbs[0]["spec"]:
        errors.append(f"cachestore: PodDisruptionBudgets {[p['spec'] for p in pdbs]}, want one with maxUnavailable 1 "
                      "(one shard at a time)")
    return errors


def check_cachestore_disk(objs):
    errors = []
    w = m.workload(objs, "cachestore")
    if w is None or w["kind"] != "StatefulSet":
        return ["cachestore: not a StatefulSet: no volumeClaimTemplate for the disk tier"]
    f = m.flags(objs, "cachestore")
    if f.get("disk_dir") != m.DISK_DIR:
        errors.append(f"cachestore: --disk_dir={f.get('disk_dir')}, want {m.DISK_DIR}")
    templates = {t["metadata"]["name"]: t for t in w["spec"].get("volumeClaimTemplates", [])}
    template = templates.get(m.CACHE_VOLUME)
    if template is None:
        return errors + [f"cachestore: no volumeClaimTemplate {m.CACHE_VOLUME} (a disk a shard)"]
    if m.CACHE_VOLUME in {v["name"] for v in m.pod_spec(objs, "cachestore").get("volumes", [])}:
        errors.append(f"cachestore: a pod volume {m.CACHE_VOLUME} hides the claim (an emptyDir loses the disk)")
    mounts = {v["name"]: v for v in m.container(objs, "cachestore").get("volumeMounts", [])}
    mount = mounts.get(m.CACHE_VOLUME)
    if mount is None or mount.get("mountPath") != f.get("disk_dir") or mount.get("readOnly"):
        errors.append(f"cachestore: the claim {m.CACHE_VOLUME} is not mounted writable at --disk_dir "
                      f"({mount and mount.get('mountPath')})")
    access = template["spec"].get("accessModes") or []
    if access != ["ReadWriteOnce"] and access != ["ReadWriteOncePod"]:
        errors.append(f"cachestore: the claim's accessModes {access}, want one writer (ReadWriteOnce)")
    storage = m.mib(template["spec"].get("resources", {}).get("requests", {}).get("storage", "0"))
    budget = int(f.get("disk_budget_mib", 0)) + int(f.get("disk_write_queue_mib", 256))
    if not f.get("disk_budget_mib"):
        errors.append("cachestore: no --disk_budget_mib (sized from the claim)")
    elif budget > m.DISK_SHARE * storage:
        errors.append(f"cachestore: --disk_budget_mib + --disk_write_queue_mib = {budget} MiB > "
                      f"{m.DISK_SHARE:.0%} of the claim's {storage} MiB")
    retention = w["spec"].get("persistentVolumeClaimRetentionPolicy", {})
    if retention.get("whenScaled", "Retain") != "Retain" or retention.get("whenDeleted", "Retain") != "Retain":
        errors.append(f"cachestore: persistentVolumeClaimRetentionPolicy {retention} deletes disks (a shard that "
                      "comes back would start cold)")
    return errors
