"""Policy tests over the rendered manifests of deploy/k8s (every overlay): the
pools' checks (pool_policy.py: resources, probes, security contexts, PDBs,
Services, drain timing, flags, cachestore budgets, topology spread and the
NetworkPolicy flows), autoscaling (autoscaling_policy.py), the cachestore's
shards (cachestore_policy.py), the OpenAI gateway pool's own checks
(gateway_policy.py); on the overlays with the mtls component, the
mutual-TLS checks of tls_policy.py. Each check also runs on deliberately broken copies of
the cpu (or cpu-mtls) render and must catch each of them: the checks can
fail."""

import copy
import os
import unittest

import yaml

import manifests as m
from cachestore_policy import check_cachestore_disk, check_cachestore_shards
from gateway_policy import check_gateway_flags, check_gateway_objects, check_gateway_probes, check_gateway_tls
from manifests import COMPONENTS, GATEWAY, WORKERS
from autoscaling_policy import check_adapter_pages, check_autoscaling, check_autoscaling_alternative
from pool_policy import (check_cachestore_budgets, check_config_rolls, check_device, check_drain, check_flags, check_gpu_placement, check_network_policies,
                         check_objects, check_pdbs, check_pod_monitors, check_probes, check_prometheus_rules, check_resources,
                         check_rollout_deadline, check_security, check_services, check_topology, edit_decode_flags,
                         edit_flag_files)
from tls_policy import (BINARY_TLS_FLAGS, check_spiffe_ids, check_tls_certificates, check_tls_flags, check_tls_health, check_tls_peers,
                        check_tls_secrets)


CHECKS = [check_objects, check_resources, check_probes, check_rollout_deadline, check_security, check_pdbs,
          check_services, check_drain, check_flags, check_cachestore_budgets, check_autoscaling, check_adapter_pages,
          check_pod_monitors, check_prometheus_rules,
          check_topology, check_network_policies, check_gateway_objects, check_gateway_probes, check_gateway_flags,
          check_gateway_tls, check_cachestore_shards, check_cachestore_disk]
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
    (check_resources, "decode without a memory limit",
     lambda o: _set(_container(o, "decode")["resources"]["limits"], ["memory"], None)),
    (check_resources, "cachestore without requests",
     lambda o: _set(_container(o, "cachestore")["resources"], ["requests"], None)),
    (check_probes, "readiness on the liveness service",
     lambda o: _set(_container(o, "decode")["readinessProbe"]["grpc"], ["service"], m.LIVENESS_SERVICE)),
    (check_probes, "prefill liveness on the wrong port",
     lambda o: _set(_container(o, "prefill")["livenessProbe"]["grpc"], ["port"], 9090)),
    (check_probes, "decode's readiness probe at the kubelet's 1 s timeout with one failure allowed",
     lambda o: _set(_container(o, "decode")["readinessProbe"], ["timeoutSeconds"], None)),
    (check_probes, "cachestore without a startup probe",
     lambda o: _set(_container(o, "cachestore"), ["startupProbe"], None)),
    (check_rollout_deadline, "decode at the default deadline (600 s, the startup window alone)",
     lambda o: _set(m.workload(o, "decode")["spec"], ["progressDeadlineSeconds"], None)),
    (check_rollout_deadline, "prefill's startup window raised past its deadline",
     lambda o: _set(_container(o, "prefill")["startupProbe"], ["failureThreshold"], 180)),
    (check_rollout_deadline, "the gateway's deadline without room for an image pull",
     lambda o: _set(m.workload(o, GATEWAY)["spec"], ["progressDeadlineSeconds"], 120)),
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
    (check_services, "the shards' Service not headless",
     lambda o: _set(_shards(o)["spec"], ["clusterIP"], None)),
    (check_services, "a ClusterIP Service over the shards beside the headless one",
     lambda o: o.append(_cachestore_cluster_ip(o))),
    (check_drain, "the cachestore's grace period without the shutdown spill",
     lambda o: _set(m.pod_spec(o, "cachestore"), ["terminationGracePeriodSeconds"], 30)),
    (check_drain, "--shutdown_spill_timeout raised past the cachestore's grace period",
     lambda o: _append_flag(o, "cachestore.flags", "--shutdown_spill_timeout=60s")),
    (check_flags, "decode points at one cachestore name (the ClusterIP of old)",
     lambda o: _append_flag(o, "decode.flags", "--cachestore=hybridserve-cachestore:50051")),
    (check_flags, "prefill resolves the shards once",
     lambda o: _drop_flag(o, "prefill.flags", "cachestore_resolve_interval")),
    (check_flags, "prefill's bulk reads from one host",
     lambda o: _append_flag(o, "prefill.flags", "--cachestore_bulk_address=hybridserve-cachestore-0:50052")),
    (check_cachestore_budgets, "the write queue pushes the cachestore past its memory limit",
     lambda o: _append_flag(o, "cachestore-budgets.flags", "--disk_write_queue_mib=512")),
    (check_cachestore_shards, "the cachestore a Deployment",
     lambda o: _set(m.workload(o, "cachestore"), ["kind"], "Deployment")),
    (check_cachestore_shards, "the shards started in order",
     lambda o: _set(m.workload(o, "cachestore")["spec"], ["podManagementPolicy"], None)),
    (check_cachestore_shards, "a rollout that waits for someone to delete each shard",
     lambda o: _set(m.workload(o, "cachestore")["spec"], ["updateStrategy"], {"type": "OnDelete"})),
    (check_cachestore_shards, "every shard reports one name",
     lambda o: _set(_container(o, "cachestore")["args"], [1], "--shard_name=shard")),
    (check_cachestore_shards, "the shard's name from the node's",
     lambda o: _set(_env(o, "cachestore", "POD_NAME")["valueFrom"]["fieldRef"], ["fieldPath"], "spec.nodeName")),
    (check_cachestore_shards, "one shard",
     lambda o: _set(m.workload(o, "cachestore")["spec"], ["replicas"], 1)),
    (check_cachestore_shards, "the StatefulSet governed by another Service",
     lambda o: _set(m.workload(o, "cachestore")["spec"], ["serviceName"], "hybridserve-cachestore")),
    (check_cachestore_shards, "no anti-affinity (every shard on one node)",
     lambda o: m.pod_spec(o, "cachestore").pop("affinity")),
    (check_cachestore_shards, "the shards' Service a ClusterIP",
     lambda o: _set(_shards(o)["spec"], ["clusterIP"], None)),
    (check_cachestore_shards, "the shards' Service publishes not-ready (dead) shards",
     lambda o: _set(_shards(o)["spec"], ["publishNotReadyAddresses"], True)),
    (check_cachestore_shards, "no headless Service of the shards",
     lambda o: o.remove(_shards(o))),
    (check_cachestore_shards, "the shards' Service without the bulk port",
     lambda o: _shards(o)["spec"]["ports"].pop()),
    (check_cachestore_shards, "no PDB for the shards",
     lambda o: o.remove(m.one(o, "PodDisruptionBudget", "hybridserve-cachestore"))),
    (check_cachestore_shards, "the shards' PDB lets two go",
     lambda o: _set(m.one(o, "PodDisruptionBudget", "hybridserve-cachestore")["spec"], ["maxUnavailable"], 2)),
    (check_cachestore_disk, "no volumeClaimTemplate (no disk)",
     lambda o: m.workload(o, "cachestore")["spec"].pop("volumeClaimTemplates")),
    (check_cachestore_disk, "the disk an emptyDir (lost with the pod)",
     lambda o: m.pod_spec(o, "cachestore")["volumes"].append({"name": "cache", "emptyDir": {}})),
    (check_cachestore_disk, "the claim mounted elsewhere than --disk_dir",
     lambda o: _set(_mount(o, "cachestore", "cache"), ["mountPath"], "/cache")),
    (check_cachestore_disk, "the disk budget as large as the claim",
     lambda o: _append_flag(o, "cachestore-budgets.flags", "--disk_budget_mib=4096")),
    (check_cachestore_disk, "the claim shrunk under the budget",
     lambda o: _set(m.workload(o, "cachestore")["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"],
                    ["storage"], "1Gi")),
    (check_cachestore_disk, "no --disk_dir",
     lambda o: _drop_flag(o, "cachestore.flags", "disk_dir")),
    (check_cachestore_disk, "the disks deleted on scale-down",
     lambda o: _set(m.workload(o, "cachestore")["spec"]["persistentVolumeClaimRetentionPolicy"], ["whenScaled"],
                    "Delete")),
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


def _shards(o):
    return m.one(o, "Service", m.SERVICES["cachestore"])


def _cachestore_cluster_ip(o):
    svc = copy.deepcopy(_shards(o))
    svc["metadata"]["name"] = "hybridserve-cachestore"
    svc["spec"].pop("clusterIP")
    svc["spec"].pop("publishNotReadyAddresses")
    return svc


def _mount(o, comp, name):
    return next(v for v in _container(o, comp)["volumeMounts"] if v["name"] == name)


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
        # hash suffix) and changes every Deployment's and StatefulSet's pod
        # template.
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                edited = m.render(overlay, edit=edit_flag_files)
                self.assertEqual(check_config_rolls(objs, edited), [])
                for name in m.CONFIG_NAMES:
                    self.assertNotEqual(m.config_map(objs, name)["metadata"]["name"],
                                        m.config_map(edited, name)["metadata"]["name"])
                # A worker flag edit rolls the workers alone: the cachestore's
                # shards keep their pods, and their memory.
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
