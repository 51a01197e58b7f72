"""The rendered manifests run as local processes, as a one-node cluster would
run them: the kubelet's part (pods, probes, termination) and the controllers'
part (Service endpoints and DNS, Deployment and StatefulSet scaling and
rolling updates).

Everything a pod runs comes from the rendered objects: the container's
command, args and env (with Kubernetes' $(VAR) expansion and the downward
API's status.podIP), its ports, probes, preStop sleep, the pod's
terminationGracePeriodSeconds, the Deployment's strategy, the Services'
selectors, ports and publishNotReadyAddresses, and the mounted ConfigMaps'
files. What one host forces is mapped, and only that:
  - image paths: IMAGE below (/opt/hybridserve/bin/<binary> -> the built
    binary, /models/default -> the model in the runfiles; the gateway
    image's console script -> the built //gateway:gateway), in the command,
    the args and the flag files;
  - init containers: each runs to completion, in order, before the
    container starts (its command mapped the same way, its mounts the pod's
    same per-volume directories); one that fails is a failure of the pod;
  - volumes: a ConfigMap mount is a per-pod directory holding the ConfigMap's
    files (as the kubelet writes them), an emptyDir an empty per-pod
    directory, a StatefulSet's volumeClaimTemplate a directory of its own
    per claim (<template>-<pod name>, as the controller names the PVC) that
    outlives the pod: the pod that replaces it, under the same name, finds
    what it wrote; a Secret mount a per-pod directory laid out as the kubelet's
    atomic writer lays it out (each key a symlink through ..data to a
    timestamped directory) from the Secrets the test gives (Cluster(secrets=)),
    and Cluster.update_secret renews it as the kubelet does (new directory,
    ..data swapped by one rename); an optional Secret the test does not give
    is an empty directory, a required one fails the pod's start (the kubelet
    would keep it waiting);
  - pod IPs: each pod gets its own loopback address 127.0.0.N (never reused),
    and every 0.0.0.0 bind in its flags (--flag=0.0.0.0:port, in args and in
    its copies of the flag files) becomes that address: the pods share one
    network namespace here, so a wildcard bind would take the port from all;
  - NetworkPolicies: not enforced unless the test passes Cluster(before_start=)
    (tests/k8s/netpol_nft.Enforcer: nftables rules over the pods' addresses,
    each pod's processes under their own group id, so that their unbound
    connections leave from the pod's address, not 127.0.0.1);
  - DNS: one hosts file, bind-mounted over /etc/hosts in the test's own mount
    namespace (Cluster.start), so every pod and the test resolve as a pod in
    the cluster does: a headless Service's name to each ready pod's IP (every
    pod's with publishNotReadyAddresses: one hosts line an address, and a
    resolver answers them all, as cluster DNS answers a headless name), a
    ClusterIP Service's name to its ready pods' IPs (no virtual IP: the
    ports must equal the target ports, checked), each as <name> and
    <name>.<namespace>.svc.cluster.local. The file is rewritten in place
    (same inode: the bind mount holds the inode) by one write, never
    truncated (padded with blank lines);
  - virtual IPs: a ClusterIP Service the test names (Cluster(virtual_ips=))
    resolves to one address of its own, 127.0.1.N, instead (kube-proxy's
    ClusterIP: ClusterIp below, each new connection to one ready pod at
    random for its life), so a client of its name holds connections as it
    would in a cluster: one balancing over the name's addresses reaches one
    pod a connection. Not by default: the proxied connections leave from the
    test's process, not the caller pod's address (the NetworkPolicies'
    enforcement sees pod addresses);
  - probe periods and initial delays are divided by PROBE_SCALE; timeouts,
    thresholds, preStop sleeps and grace periods are kept as declared (a
    preStop sleep covers the lag of endpoint removal, which the binaries'
    own flags, e.g. --prefill_resolve_interval, set in real seconds).

A kubelet restart (a failed startup or liveness probe, a container that
exits by itself, a SIGKILL at the end of the grace period) is never done: it
is recorded in Cluster.failures, and the test fails on any. The one SIGKILL
that is not a failure is the test's own (Pod.kill: a fault it injects)."""

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import grpc

import manifests

PROBE_SCALE = 10
# name in the image -> its runfile (the Bazel target's path).
IMAGE_BINARIES = {"cachestore": "cachestore/server/cachestore", "prefill": "prefill/prefill",
                  "decode": "decode/decode"}
# The gateway image's console script -> //gateway:gateway (a test that runs
# gateway pods has it in its data).
GATEWAY_BINARY = "gateway/gateway"
# How long an init container may run (the model copy: a moment).
INIT_TIMEOUT_S = 60
LOOPBACK_PREFIX = "127.0.0."
# The virtual IPs of ClusterIP Services (Cluster(virtual_ips=)): no pod's.
VIRTUAL_IP_PREFIX = "127.0.1."
DNS_SUFFIX = "svc.cluster.local"
# The kubelet's one extension of the grace period when a preStop hook runs past it.
PRESTOP_OVERRUN_S = 2
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# How often a deleted pod's metrics are scraped until its process exits.
FINAL_SCRAPE_PERIOD_S = 0.5
SERVING = 1  # grpc.health.v1.HealthCheckResponse.ServingStatus


def runfile(relative):
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), relative)


def image_paths():
    """What the image holds (deploy/k8s/README.md: the binaries under
    /opt/hybridserve/bin, the default model under /models/default), here."""
    paths = {manifests.BINARY.format(b): runfile(IMAGE_BINARIES[b]) for b in IMAGE_BINARIES}
    paths["/models/default"] = runfile("models/default")
    paths[manifests.GATEWAY_COMMAND] = runfile(GATEWAY_BINARY)
    return paths


def expand(text, env):
    """Kubernetes' $(VAR) expansion of command, args and env values: $(NAME)
    of a defined variable is its value, of an undefined one stays as written;
    $$ is a literal $."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and ")" in text[i:]:
            end = text.index(")", i)
            name = text[i + 2:end]
            out.append(env.get(name, text[i:end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def replace_paths(text, mapping):
    """Each mapped path where it is a whole path or a prefix of one (after a
    separator or the start, followed by /, a separator or the end), in one pass (a replacement is not looked
    at again), the longest first."""
    paths = sorted(mapping, key=len, reverse=True)
    pattern = r"(?<![\w./-])(" + "|".join(re.escape(p) for p in paths) + r")(?=$|[/,\s\"'])"
    return re.sub(pattern, lambda m: mapping[m.group(1)], text, flags=re.MULTILINE)


def bind_to(text, ip):
    """--flag=0.0.0.0:port becomes --flag=<ip>:port."""
    return re.sub(r"(--?[A-Za-z0-9_]+=)0\.0\.0\.0:", lambda m: m.group(1) + ip + ":", text)


def write_secret_volume(local, volume, data):
    """A Secret volume's files as the kubelet's atomic writer keeps them: the
    projected keys (volume items, else every key) in a new timestamped
    directory, `..data` a symlink to it swapped by one rename, each key a
    symlink through `..data`; the previous directory removed. A reader that
    opens a key's path sees the old or the new file, never a mix."""
    items = volume.get("items") or [{"key": k, "path": k} for k in data]
    mode = volume.get("defaultMode", 0o644)
    stamp = f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    os.makedirs(os.path.join(local, stamp))
    for item in items:
        path = os.path.join(local, stamp, item["path"])
        with open(path, "wb") as f:
            f.write(data[item["key"]])
        os.chmod(path, item.get("mode", mode))
    data_link = os.path.join(local, "..data")
    previous = os.readlink(data_link) if os.path.islink(data_link) else None
    os.symlink(stamp, data_link + "_tmp")
    os.rename(data_link + "_tmp", data_link)
    for item in items:
        link = os.path.join(local, item["path"])
        if not os.path.islink(link):
            os.symlink(os.path.join("..data", item["path"]), link)
    if previous is not None:
        shutil.rmtree(os.path.join(local, previous))


def health_check(ip, port, service, timeout_s):
    """The kubelet's gRPC probe: a fresh connection, grpc.health.v1.Health/Check
    with the service name, success only on SERVING."""
    name = service.encode()
    length = bytearray()  # a protobuf varint
    n = len(name)
    while True:
        length.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    request = b"\x0a" + bytes(length) + name if name else b""  # HealthCheckRequest.service, field 1
    channel = grpc.insecure_channel(f"{ip}:{port}")
    try:
        response = channel.unary_unary(HEALTH_CHECK)(request, timeout=timeout_s)
    except grpc.RpcError:
        return False
    finally:
        channel.close()
    return response == bytes([0x08, SERVING])


def http_check(ip, port, path, timeout_s):
    """The kubelet's HTTP probe: GET, success on a status from 200 to 399."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=timeout_s) as response:
            return 200 <= response.status < 400
    except (OSError, ValueError):  # urllib.error.HTTPError (>= 400) is an OSError
        return False


class Probe:
    """One declared probe (grpc or httpGet), with the kubelet's defaults."""

    def __init__(self, spec):
        if "grpc" in spec:
            self.port = spec["grpc"]["port"]
            self.service = spec["grpc"].get("service", "")
            self.path = None
        elif "httpGet" in spec:
            if spec["httpGet"].get("scheme", "HTTP") != "HTTP" or spec["httpGet"].get("httpHeaders"):
                raise ValueError(f"only plain HTTP GET probes are run here: {spec}")
            self.port = spec["httpGet"]["port"]  # a number or a container port's name
            self.path = spec["httpGet"].get("path", "/")
            self.service = None
        else:
            raise ValueError(f"only grpc and httpGet probes are run here: {spec}")
        self.initial_delay_s = spec.get("initialDelaySeconds", 0) / PROBE_SCALE
        self.period_s = spec.get("periodSeconds", 10) / PROBE_SCALE
        self.timeout_s = spec.get("timeoutSeconds", 1)
        self.success_threshold = spec.get("successThreshold", 1)
        self.failure_threshold = spec.get("failureThreshold", 3)


class Pod:
    """One pod of a Deployment or StatefulSet: its container as a process, its
    probes. `name` names its files here (log, volumes: unique in the run);
    `pod_name`, its metadata.name (a StatefulSet's <name>-<ordinal>, the
    same for the pod that replaces it), is `name` unless given."""

    def __init__(self, cluster, deployment, name, ip, pod_name=None):
        self.cluster, self.deployment, self.name, self.ip = cluster, deployment, name, ip
        self.pod_name = pod_name or name
        self.labels = deployment.template["metadata"].get("labels", {})
        spec = deployment.template["spec"]
        self.container = spec["containers"][0]
        if len(spec["containers"]) != 1:
            raise ValueError(f"{name}: one container a pod is run here")
        self.grace_s = spec.get("terminationGracePeriodSeconds", 30)
        self.started = self.ready = self.deleted = self.killed = False
        self.ready_since = None
        self.deleted_at = self.sigterm_at = self.sigterm_to_exit_s = None
        self.deleting = threading.Event()
        self.sigterm_sent = threading.Event()  # the preStop is over: SIGTERM went to the process
        self.prestop_s = self.container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        self.final_metrics = None  # a deleted pod's last metrics (last_metrics)
        self.log_path = os.path.join(cluster.workdir, f"{name}.log")
        self._stop = threading.Event()  # deletion: the kubelet stops probing
        self._exited = threading.Event()
        self.process = self._start(spec)
        threading.Thread(target=self._watch_exit, daemon=True).start()
        threading.Thread(target=self._probe_startup, daemon=True).start()

    # --- the container ---------------------------------------------------

    def _volumes(self, spec, container=None):
        """mountPath -> a per-pod directory with the volume's files (one a
        volume, whichever container mounts it); the ConfigMap mounts'
        directories in self.config_dirs. container: an init container's
        mounts (emptyDir only), else the container's."""
        os.makedirs(os.path.join(self.cluster.workdir, self.name), exist_ok=True)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = {}
        if container is not None:
            for m in container.get("volumeMounts", []):
                if "emptyDir" not in volumes[m["name"]]:
                    raise ValueError(f"{self.name}: init container {container['name']} mounts {m['name']}, not an "
                                     "emptyDir: not run here")
                local = os.path.join(self.cluster.workdir, self.name, m["name"])
                os.makedirs(local, exist_ok=True)
                mounts[m["mountPath"]] = local
            return mounts
        self.config_dirs = []
        self.secret_dirs = {}  # local directory -> the Secret volume's spec
        claims = {t["metadata"]["name"] for t in getattr(self.deployment, "claim_templates", [])}
        for m in self.container.get("volumeMounts", []):
            if m["name"] in claims and m["name"] not in volumes:
                # The pod's PVC, <template>-<pod name>: kept across pods.
                local = os.path.join(self.cluster.workdir, "pvc", f"{m['name']}-{self.pod_name}")
                os.makedirs(local, exist_ok=True)
                mounts[m["mountPath"]] = local
                continue
            volume = volumes[m["name"]]
            local = os.path.join(self.cluster.workdir, self.name, m["name"])
            os.makedirs(local, exist_ok=True)
            if "configMap" in volume:
                data = manifests.one(self.cluster.objs, "ConfigMap", volume["configMap"]["name"]).get("data", {})
                items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    with open(os.path.join(local, item["path"]), "w", encoding="utf-8") as f:
                        f.write(data[item["key"]])
                self.config_dirs.append(local)
            elif "secret" in volume:
                name = volume["secret"]["secretName"]
                if name in self.cluster.secrets:
                    self.secret_dirs[local] = volume["secret"]
                    write_secret_volume(local, volume["secret"], self.cluster.secrets[name])
                elif not volume["secret"].get("optional"):
                    raise ValueError(f"{self.name}: the Secret {name} does not exist here")
            elif "emptyDir" not in volume:
                raise ValueError(f"{self.name}: volume {m['name']} is not run here: {volume}")
            mounts[m["mountPath"]] = local
        return mounts

    def _env(self):
        env = {}
        for e in self.container.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
                continue
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            values = {"status.podIP": self.ip, "metadata.name": self.pod_name,
                      "metadata.namespace": self.deployment.namespace}
            if field not in values:
                raise ValueError(f"{self.name}: downward API field {field} is not run here")
            env[e["name"]] = values[field]
        return env

    def _run_init_containers(self, spec, env, group):
        """Each init container to completion, in order, as the kubelet runs
        them before the container: its command and args with the image paths
        and its mounts mapped. Raises on a failure (the kubelet would retry
        it, and the pod never starts)."""
        for init in spec.get("initContainers", []):
            paths = {**image_paths(), **self._volumes(spec, init)}
            argv = [replace_paths(expand(a, env), paths) for a in init.get("command", []) + init.get("args", [])]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=INIT_TIMEOUT_S, group=group,
                                  env={k: v for k, v in os.environ.items() if k == "PATH"},
                                  cwd=os.path.join(self.cluster.workdir, self.name), check=False)
            if done.returncode != 0:
                raise ValueError(f"{self.name}: init container {init['name']} exited {done.returncode}: "
                                 f"{done.stderr.strip()[-500:]}")

    def _start(self, spec):
        mounts = self._volumes(spec)
        self.mounts = mounts  # mountPath -> its directory here
        paths = {**image_paths(), **mounts}
        for local in self.config_dirs:
            for file_name in os.listdir(local):
                file_path = os.path.join(local, file_name)
                with open(file_path, encoding="utf-8") as f:
                    text = f.read()
                with open(file_path, "w", encoding="utf-8") as f:
                    f.write(bind_to(replace_paths(text, paths), self.ip))
        env = self._env()
        self.env = env  # the container's declared env, expanded
        argv = [bind_to(replace_paths(expand(a, env), paths), self.ip)
                for a in self.container.get("command", []) + self.container.get("args", [])]
        # The process sees the declared env only (plus PATH and the
        # sanitizers' options, which the test's environment sets).
        process_env = {k: v for k, v in os.environ.items() if k == "PATH" or k.endswith("SAN_OPTIONS")}
        process_env.update(env)
        group = self.cluster.before_start(self) if self.cluster.before_start else None
        self._run_init_containers(spec, env, group)
        log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        try:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=process_env,
                                    cwd=os.path.join(self.cluster.workdir, self.name), group=group)
        finally:
            log.close()

    def _watch_exit(self):
        rc = self.process.wait()
        self._exited.set()
        if not self.deleted:
            self.cluster.fail(f"{self.name}: the container exited by itself (rc {rc}): the kubelet would restart it")
            self._stop.set()
            self._set_ready(False)

    def port(self, name):
        """The containerPort named `name` (or numbered `name`)."""
        if isinstance(name, int):
            return name
        return manifests.container_ports(self.container)[name]

    # --- probes ------------------------------------------------------------

    def _run_probe(self, probe, on_success, on_failure, until_success=False):
        """The kubelet's probe worker: after the initial delay, every period;
        thresholds count consecutive results. Stops at deletion."""
        if self._stop.wait(probe.initial_delay_s):
            return
        successes = failures = 0
        while not self._stop.is_set():
            began = time.monotonic()
            if probe.path is None:
                ok = health_check(self.ip, probe.port, probe.service, probe.timeout_s)
            else:
                ok = http_check(self.ip, self.port(probe.port), probe.path, probe.timeout_s)
            if self._stop.is_set():
                return
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if successes >= probe.success_threshold:
                on_success()
                if until_success:
                    return
            if failures >= probe.failure_threshold:
                if on_failure():
                    return
            self._stop.wait(max(0.0, probe.period_s - (time.monotonic() - began)))

    def _probe_startup(self):
        def started():
            self.started = True
            self.cluster.changed()
            for kind, on_success, on_failure in (("readinessProbe", lambda: self._set_ready(True),
                                                  lambda: self._set_ready(False)),
                                                 ("livenessProbe", lambda: None, self._liveness_failed)):
                if kind in self.container:
                    threading.Thread(target=self._run_probe, args=(Probe(self.container[kind]), on_success, on_failure),
                                     daemon=True).start()
                elif kind == "readinessProbe":
                    self._set_ready(True)

        def failed():
            self.cluster.fail(f"{self.name}: the startup probe failed its threshold: the kubelet would restart it")
            return True

        if "startupProbe" in self.container:
            self._run_probe(Probe(self.container["startupProbe"]), started, failed, until_success=True)
        else:
            started()

    def _liveness_failed(self):
        self.cluster.fail(f"{self.name}: the liveness probe failed its threshold: the kubelet would restart it")
        return True

    def _set_ready(self, ready):
        if ready == self.ready:
            return
        self.ready = ready and not self.deleted
        self.ready_since = time.monotonic() if self.ready else None
        self.cluster.changed()

    # --- termination ---------------------------------------------------------

    def delete(self):
        """The pod is deleted: it leaves the endpoints and the kubelet stops
        probing; preStop sleep; SIGTERM; SIGKILL at the end of
        terminationGracePeriodSeconds (counted from the deletion, as the
        kubelet does, with its one 2 s extension when preStop overruns).
        Returns once the process exited."""
        self.deleted_at = time.monotonic()
        deadline = self.deleted_at + self.grace_s
        self.deleted = True
        self._stop.set()
        self.ready = False
        self.cluster.changed()
        self.deleting.set()
        threading.Thread(target=self._scrape_until_exit, daemon=True).start()
        if self._exited.wait(min(self.prestop_s, self.grace_s)):
            return
        if self.prestop_s >= self.grace_s:
            self.cluster.fail(f"{self.name}: the grace period ({self.grace_s} s) ended during the preStop sleep "
                              f"({self.prestop_s} s): the kubelet cut it short")
            deadline = time.monotonic() + PRESTOP_OVERRUN_S
        self.sigterm_at = time.monotonic()
        self.sigterm_sent.set()
        self.process.send_signal(signal.SIGTERM)
        if self._exited.wait(max(0.0, deadline - time.monotonic())):
            self.sigterm_to_exit_s = time.monotonic() - self.sigterm_at
            if self.process.returncode != 0:
                self.cluster.fail(f"{self.name}: exited with {self.process.returncode} on SIGTERM (a drain exits 0)")
            return
        self.process.kill()
        self._exited.wait()
        self.cluster.fail(f"{self.name}: still running {self.grace_s} s after its deletion: SIGKILL")

    def stop(self):
        """Teardown, as an operator stops a pod: SIGTERM straight away (no
        preStop), and it must exit 0 within its grace period. Returns what
        went wrong ([] when nothing)."""
        self.deleted = True
        self._stop.set()
        if self.process.poll() is not None:
            return []
        self.process.send_signal(signal.SIGTERM)
        if not self._exited.wait(self.grace_s):
            self.process.kill()
            self._exited.wait()
            return [f"{self.name}: still running {self.grace_s} s after SIGTERM at teardown: SIGKILL"]
        if self.process.returncode != 0:
            return [f"{self.name}: exited with {self.process.returncode} on SIGTERM at teardown (a drain exits 0)"]
        return []

    def sanitizer_report(self):
        """The first sanitizer report in the pod's log (from the line that
        names it on), or None."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        at = text.find("Sanitizer")
        if at < 0:
            return None
        return text[text.rfind("\n", 0, at) + 1:][:6000]

    def kill(self):
        """kill -9 of the container, under load (an OOM kill, a lost node): no
        preStop, no SIGTERM, no drain. The kubelet sees the exit at once: the
        pod leaves its Services' endpoints, and it is its Deployment's no
        more (the replacement is the test's to make: scale). Not a failure
        of the cluster. Its metrics as last scraped just before stay in
        final_metrics (last_metrics)."""
        try:
            self.final_metrics = self.metrics()
        except OSError:
            pass
        self.killed = self.deleted = True
        self._stop.set()
        if self in self.deployment.pods:
            self.deployment.pods.remove(self)
        self.process.kill()
        self._exited.wait()
        self.ready = False
        self.ready_since = None
        self.cluster.changed()

    def kill_now(self):
        """No drain wanted (a test that failed already)."""
        self.deleted = True
        self._stop.set()
        if self.process.poll() is None:
            self.process.kill()
        self._exited.wait()

    def log_tail(self, lines=30):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def metrics(self):
        """The pod's Prometheus text, from its declared metrics port (the
        gateway's: its one port, http)."""
        ports = manifests.container_ports(self.container)
        url = f"http://{self.ip}:{self.port('metrics' if 'metrics' in ports else 'http')}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    def _scrape_until_exit(self):
        """From the deletion until the process exits, as a Prometheus that
        scrapes the pod while it lives: its metrics every
        FINAL_SCRAPE_PERIOD_S, the last answer kept in final_metrics."""
        while True:
            try:
                self.final_metrics = self.metrics()
            except OSError:  # not answering (any more)
                pass
            if self._exited.wait(FINAL_SCRAPE_PERIOD_S):
                return

    def last_metrics(self):
        """What the pod counted: its metrics now, or for a deleted pod the
        last ones scraped before its process exited (None: none answered)."""
        return self.final_metrics if self.deleted else self.metrics()

    def secret_names(self):
        """The Secrets the pod mounts (and this cluster has)."""
        return [volume["secretName"] for volume in self.secret_dirs.values()]


class Deployment:
    """A rendered Deployment and its pods (one ReplicaSet's worth a revision)."""

    def __init__(self, cluster, obj):
        self.cluster = cluster
        self.name = obj["metadata"]["name"]
        self.namespace = obj["metadata"].get("namespace", "default")
        self.template = obj["spec"]["template"]
        self.strategy = obj["spec"].get("strategy", {"type": "RollingUpdate"})
        self.min_ready_s = obj["spec"].get("minReadySeconds", 0)
        self.pods = []  # not deleted
        self.revision = 0

    def _new_pod(self):
        pod = self.cluster.new_pod(self, f"{self.name}-{self.revision}-{len(self.cluster.all_pods)}")
        self.pods.append(pod)
        return pod

    def available(self, pods):
        now = time.monotonic()
        return [p for p in pods if p.ready and now - p.ready_since >= self.min_ready_s]

    def scale(self, replicas, timeout_s):
        """Scales up to `replicas` and waits until every pod is available."""
        while len(self.pods) < replicas:
            self._new_pod()
        self.cluster.wait(lambda: len(self.available(self.pods)) >= replicas, timeout_s,
                          f"{self.name}: {replicas} pods available")

    def rollout(self, timeout_s, terminations):
        """A new revision replaces every pod as the Deployment controller does
        (the RollingUpdate strategy's maxSurge and maxUnavailable; a deleted
        pod no longer counts). Returns when the new pods are all available;
        the old ones' terminations run on in `terminations` (threads)."""
        if self.strategy.get("type", "RollingUpdate") != "RollingUpdate":
            raise ValueError(f"{self.name}: only RollingUpdate is run here")
        old, replicas = list(self.pods), len(self.pods)
        rolling = self.strategy.get("rollingUpdate", {})
        surge = _resolve(rolling.get("maxSurge", "25%"), replicas, round_up=True)
        unavailable = _resolve(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
        if surge == 0 and unavailable == 0:
            raise ValueError(f"{self.name}: maxSurge and maxUnavailable are both 0")
        self.revision += 1
        new = []
        deadline = time.monotonic() + timeout_s
        while old or len(self.available(new)) < replicas:
            while len(new) < replicas and len(old) + len(new) < replicas + surge:
                new.append(self._new_pod())
            removable = len(self.available(old + new)) - (replicas - unavailable)
            for pod in sorted(old, key=lambda p: p.ready)[:max(0, removable)]:
                old.remove(pod)
                self.pods.remove(pod)
                thread = threading.Thread(target=pod.delete, daemon=True)
                thread.start()
                terminations.append(thread)
            if self.cluster.failures:
                raise AssertionError(f"{self.name} rollout: {self.cluster.failures}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: the rollout did not finish in {timeout_s} s "
                                     f"(new pods ready: {[p.ready for p in new]})")
            self.cluster.wait_for_change(0.1)


class StatefulSet:
    """A rendered StatefulSet and its pods, <name>-0 .. <name>-{n-1}, each
    with its claims' directories (Pod._volumes). Parallel or OrderedReady pod
    management; RollingUpdate from the highest ordinal down, one pod at a
    time, each deleted (its termination run to the end) before its
    replacement, under the same name, starts."""

    def __init__(self, cluster, obj):
        self.cluster = cluster
        self.name = obj["metadata"]["name"]
        self.namespace = obj["metadata"].get("namespace", "default")
        self.template = obj["spec"]["template"]
        self.replicas = obj["spec"].get("replicas", 1)
        self.parallel = obj["spec"].get("podManagementPolicy", "OrderedReady") == "Parallel"
        self.strategy = obj["spec"].get("updateStrategy", {"type": "RollingUpdate"})
        self.claim_templates = obj["spec"].get("volumeClaimTemplates", [])
        self.governing_service = obj["spec"].get("serviceName")
        self.min_ready_s = obj["spec"].get("minReadySeconds", 0)
        self.pods = []  # not deleted, by ordinal
        self.revision = 0

    def _new_pod(self, ordinal):
        pod_name = f"{self.name}-{ordinal}"
        pod = self.cluster.new_pod(self, f"{pod_name}-r{self.revision}-{len(self.cluster.all_pods)}", pod_name)
        self.pods.insert(ordinal, pod)
        return pod

    def available(self, pods):
        now = time.monotonic()
        return [p for p in pods if p.ready and now - p.ready_since >= self.min_ready_s]

    def scale(self, replicas, timeout_s):
        """Scales up to `replicas` (all at once with Parallel, else each
        after the one before is ready) and waits until every pod is
        available."""
        while len(self.pods) < replicas:
            pod = self._new_pod(len(self.pods))
            if not self.parallel:
                self.cluster.wait(lambda: pod.ready, timeout_s, f"{pod.pod_name} ready")
        self.cluster.wait(lambda: len(self.available(self.pods)) >= replicas, timeout_s,
                          f"{self.name}: {replicas} pods available")

    def rollout(self, timeout_s, terminations):
        """A new revision replaces every pod as the StatefulSet controller
        does: the highest ordinal first, each deleted and its termination
        waited for, then its replacement started and waited for ready.
        `terminations` as Deployment.rollout's (here each already over)."""
        if self.strategy.get("type", "RollingUpdate") != "RollingUpdate":
            raise ValueError(f"{self.name}: only RollingUpdate is run here")
        self.revision += 1
        deadline = time.monotonic() + timeout_s
        for ordinal in reversed(range(len(self.pods))):
            old = self.pods.pop(ordinal)
            thread = threading.Thread(target=old.delete, daemon=True)
            thread.start()
            terminations.append(thread)
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise AssertionError(f"{old.pod_name}: not terminated within the rollout's {timeout_s} s")
            new = self._new_pod(ordinal)
            self.cluster.wait(lambda: new in self.available([new]), max(0.0, deadline - time.monotonic()),
                              f"{self.name} rollout: {new.pod_name} available")


def _resolve(value, replicas, round_up):
    if isinstance(value, int):
        return value
    percent = int(value.rstrip("%")) * replicas
    return -(-percent // 100) if round_up else percent // 100


class ClusterIp:
    """A Service's virtual IP as kube-proxy makes it: each new TCP connection
    to it goes to one ready endpoint of the Service's port `port_name`, at
    random, for the connection's life (so a client's HTTP/2 connection stays
    on one pod until it reconnects). Listens on host:port (by default
    127.0.0.1 and a free port: no pod's address, no name)."""

    def __init__(self, cluster, service, port_name, host="127.0.0.1", port=0):
        self.cluster, self.service, self.port_name = cluster, service, port_name
        self.listener = socket.create_server((host, port))
        self.target = f"{host}:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        self.connections = []  # (pod name) each connection went to
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            try:
                pod, address = self.cluster.pick(self.service, self.port_name)
                host, port = address.rsplit(":", 1)
                backend = socket.create_connection((host, int(port)), timeout=5)
            except (AssertionError, OSError):  # no ready endpoint, or it refused: kube-proxy rejects
                client.close()
                continue
            backend.settimeout(None)
            with self.lock:
                self.connections.append(pod.name)
            for a, b in ((client, backend), (backend, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source, sink):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        """Stops listening (the address is free again at once: shutdown wakes
        the accepting thread, which a close alone would leave holding the
        listening socket). Connections already made run on."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


class Cluster:
    """The pods, the endpoints and the DNS of one rendered overlay."""

    def __init__(self, objs, workdir, secrets=None, before_start=None, virtual_ips=()):
        """secrets: the Secrets that exist, {name: {key: bytes}}.
        before_start: called with each new Pod (its address, labels and
        container set) just before its container starts, from the thread
        that creates pods; returns the group id the container runs with,
        or None for the test's own (e.g. netpol_nft.Enforcer.before_start:
        the NetworkPolicies enforced).
        virtual_ips: names of ClusterIP Services whose name resolves to a
        virtual IP of their own (ClusterIp on each of their ports, at
        127.0.1.N), not to their ready pods' IPs."""
        self.objs, self.workdir = objs, workdir
        self.secrets = dict(secrets or {})
        self.before_start = before_start
        self.hosts_path = os.path.join(workdir, "hosts")
        # The workloads by name: Deployments and StatefulSets (the same
        # interface: scale, rollout, pods).
        self.deployments = {d["metadata"]["name"]: Deployment(self, d) for d in manifests.find(objs, "Deployment")}
        self.deployments.update(
            {s["metadata"]["name"]: StatefulSet(self, s) for s in manifests.find(objs, "StatefulSet")})
        self.services = manifests.find(objs, "Service")
        self.all_pods = []
        self.failures = []
        self._next_ip = 2
        self._cond = threading.Condition()
        self.virtual_ips = {}  # Service name -> (its address, [ClusterIp a port])
        for i, name in enumerate(virtual_ips):
            spec = self.service(name)["spec"]
            if spec.get("clusterIP") == "None" or spec.get("type", "ClusterIP") != "ClusterIP":
                raise ValueError(f"Service {name}: not a ClusterIP Service, no virtual IP")
            ip = f"{VIRTUAL_IP_PREFIX}{i + 1}"
            self.virtual_ips[name] = (ip, [ClusterIp(self, name, p["name"], ip, p["port"]) for p in spec["ports"]])
        self._write_hosts()

    def start(self):
        """Mounts the hosts file over /etc/hosts (the caller runs in its own
        mount namespace)."""
        subprocess.run(["mount", "--bind", self.hosts_path, "/etc/hosts"], check=True)

    def new_pod(self, deployment, name, pod_name=None):
        ip = f"{LOOPBACK_PREFIX}{self._next_ip}"
        self._next_ip += 1
        pod = Pod(self, deployment, name, ip, pod_name)
        self.all_pods.append(pod)
        return pod

    def apply(self, objs):
        """`kubectl apply` of a new render: its ConfigMaps exist from now on
        (pods started later mount them; running pods keep the files they
        started with, as flags are read at start), and each Deployment whose
        pod template changed gets it for its next pods. Returns the names of
        those Deployments: the ones the Deployment controller rolls (the
        caller runs Deployment.rollout). Services and the rest stay as they
        were (checked: unchanged)."""
        for kind in ("Service",):
            if manifests.find(objs, kind) != manifests.find(self.objs, kind):
                raise ValueError(f"apply: the {kind}s changed; not run here")
        changed = []
        for d in manifests.find(objs, "Deployment") + manifests.find(objs, "StatefulSet"):
            deployment = self.deployments[d["metadata"]["name"]]
            if d["spec"]["template"] != deployment.template:
                deployment.template = d["spec"]["template"]
                changed.append(deployment.name)
        self.objs = objs
        return changed

    def update_secret(self, name, data):
        """The Secret `name` changes (a renewal): every pod's volume of it is
        rewritten as the kubelet does on its next sync (here at once), and
        pods started from now on get the new data. Called from the thread
        that scales and rolls the Deployments (not concurrent with new_pod)."""
        self.secrets[name] = data
        for pod in self.all_pods:
            if pod.deleted:
                continue
            for local, volume in pod.secret_dirs.items():
                if volume["secretName"] == name:
                    write_secret_volume(local, volume, data)

    def fail(self, message):
        with self._cond:
            self.failures.append(message)
            self._cond.notify_all()

    def changed(self):
        """A pod's readiness or deletion changed: endpoints and DNS follow."""
        with self._cond:
            self._write_hosts()
            self._cond.notify_all()

    def wait_for_change(self, timeout_s):
        with self._cond:
            self._cond.wait(timeout_s)

    def wait(self, predicate, timeout_s, what):
        """Until predicate() (called without the lock); fails on a recorded
        failure or at the timeout."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.failures:
                raise AssertionError(f"waiting for {what}: {self.failures}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s} s")
            self.wait_for_change(0.1)

    # --- Services ----------------------------------------------------------------

    def _selected(self, service):
        selector = service["spec"].get("selector") or {}
        return [p for p in self.all_pods
                if p.deployment.namespace == service["metadata"].get("namespace", "default")
                and selector and all(p.labels.get(k) == v for k, v in selector.items())]

    def endpoints(self, service):
        """The pods a Service sends to: ready and not deleted (with
        publishNotReadyAddresses, every pod not deleted)."""
        not_ready_too = service["spec"].get("publishNotReadyAddresses", False)
        return [p for p in self._selected(service) if not p.deleted and (p.ready or not_ready_too)]

    def service(self, name):
        return manifests.one(self.objs, "Service", name)

    def pick(self, name, port_name):
        """A connection to the Service `name` on its port `port_name`, as a
        ClusterIP balances: one ready endpoint at random, at its target port."""
        service = self.service(name)
        port = next(p for p in service["spec"]["ports"] if p.get("name") == port_name)
        with self._cond:
            pods = self.endpoints(service)
        if not pods:
            raise AssertionError(f"Service {name} has no ready endpoint")
        pod = random.choice(pods)
        return pod, f"{pod.ip}:{pod.port(port.get('targetPort', port['port']))}"

    def _write_hosts(self):
        lines = ["127.0.0.1 localhost"]
        for service in self.services:
            name = service["metadata"]["name"]
            namespace = service["metadata"].get("namespace", "default")
            if name in self.virtual_ips:
                lines.append(f"{self.virtual_ips[name][0]} {name}.{namespace}.{DNS_SUFFIX} {name}")
                continue
            for pod in self.endpoints(service):
                for port in service["spec"].get("ports", []):
                    target = pod.port(port.get("targetPort", port["port"]))
                    if target != port["port"]:
                        self.fail(f"Service {name}: port {port['port']} -> target {target}: "
                                  "its name resolves to pod IPs here, so the ports must be equal")
                lines.append(f"{pod.ip} {name}.{namespace}.{DNS_SUFFIX} {name}")
                # A StatefulSet's pods under its governing headless Service:
                # <pod name>.<service>[.<namespace>.svc.cluster.local] each.
                if isinstance(pod.deployment, StatefulSet) and service["spec"].get("clusterIP") == "None" and \
                        pod.deployment.governing_service == name:
                    lines.append(f"{pod.ip} {pod.pod_name}.{name}.{namespace}.{DNS_SUFFIX} {pod.pod_name}.{name}")
        text = ("\n".join(lines) + "\n").encode()
        # In place, one write: the bind mount over /etc/hosts holds this inode.
        # Never truncated: a resolver reading between a truncation and the
        # write would find no name at all (a client resolving in a loop does).
        # A shorter text is padded with blank lines over the old one's length.
        fd = os.open(self.hosts_path, os.O_WRONLY | os.O_CREAT)
        try:
            size = os.fstat(fd).st_size
            os.pwrite(fd, text + b"\n" * max(0, size - len(text)), 0)
        finally:
            os.close(fd)

    def teardown(self):
        """Stops every pod still running with SIGTERM (each must exit 0 in
        its grace period), then reads every pod's log: a sanitizer report in
        any fails. Returns those problems ([] when none); they are also
        failures of the cluster."""
        problems = []
        lock = threading.Lock()
        for _, proxies in self.virtual_ips.values():
            for proxy in proxies:
                proxy.close()

        def stop(pod):
            found = pod.stop()
            with lock:
                problems.extend(found)

        threads = [threading.Thread(target=stop, args=(pod,)) for pod in self.all_pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for pod in self.all_pods:
            report = pod.sanitizer_report()
            if report is not None:
                problems.append(f"{pod.name}: a sanitizer report in its log:\n{report}")
        for p in problems:
            self.fail(p)
        return problems
