"""What run_manifests_test and run_manifests_scale_out_test share: the
cluster's constants, clients that keep conversations and long calls going,
an emulated ClusterIP, metric readers, the pools' certificates, and the base
test case that renders an overlay and runs it as processes
(local_cluster.py). The tests run in their own network namespace
(reexec_in_namespaces)."""

import os
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

import local_cluster
import manifests
from hybridserve_client import Client, FinishReason, HybridserveError, TokenChunk, encode_bytes

_NAMESPACED = "HS_K8S_RUN_NAMESPACED"

OVERLAY, MTLS_OVERLAY = "cpu", "cpu-mtls"
DECODE, PREFILL, CACHESTORE = "hybridserve-decode", "hybridserve-prefill", "hybridserve-cachestore"
# The clients' certificates (tenants by certificate): issued by the same CA
# as the pools' (README "Mutual TLS"), under their own SPIFFE IDs.
TENANTS = {"tenant-a": f"spiffe://{manifests.TRUST_DOMAIN}/ns/clients/sa/chat",
           "tenant-b": f"spiffe://{manifests.TRUST_DOMAIN}/ns/clients/sa/other"}
CONVERSATIONS = 8
TURNS_A_CONVERSATION = 4
MAX_TOKENS = 6
REQUEST_TIMEOUT_S = 60
# The call running across decode's SIGTERM starts this long before the
# preStop sleep ends and is sized from a measured rate to run about
# LONG_CALL_S (at most LONG_CALL_MAX_TOKENS: longer contexts slow each token),
# well within decode's --shutdown_grace.
LONG_CALL_LEAD_S = 1.0
LONG_CALL_S = 5.0
LONG_CALL_MAX_TOKENS = 4000
CALIBRATION_TOKENS = 1000
# The stream across a Secret renewal is sized to run about --tls_refresh and
# this long (at most the context); its call's deadline.
STREAM_MARGIN_S = 20
STREAM_TIMEOUT_S = 180
# A pod turns Ready within its startup probe's window (scaled) and a few
# readiness periods; this bounds every wait for it.
READY_TIMEOUT_S = 90
PREFILL_REPLICAS = 3
# decode's --max_connection_age in the scale-out test (the manifests' 5 min
# would make it wait that long).
DECODE_CONNECTION_AGE_S = 2
# The flag edit the rollout test applies: decode's page count this much lower.
EDITED_PAGES_LESS = 96


def reexec_in_namespaces():
    if os.environ.get(_NAMESPACED) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    os.environ[_NAMESPACED] = "1"
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    os.execvp("unshare", ["unshare", *user, "--net", "--mount", "--propagation", "private", "--",
                          sys.executable, *sys.argv])


class Conversations:
    """Clients of the decode Service: conversations of several turns, each
    turn a new connection to a ready decode endpoint."""

    def __init__(self, cluster, client_options=None):
        self.cluster = cluster
        self.client_options = client_options or {}  # Client's TLS arguments
        self.lock = threading.Lock()
        self.sent = 0
        self.failed = []
        self.completed = 0  # turns that ended without a failure
        self.tokens = 0  # the tokens they streamed
        self.turns_after_first = 0
        self.resumed = 0
        # Later turns that found nothing cached, after a turn whose turn-end
        # state decode reported as published (usage.session.published), and
        # after one it reported as not published; each (turn, decode pod).
        self.missed_unpublished = []
        self.missed_published = []
        self.stopping = threading.Event()
        self.threads = []

    def turn(self, history, tag):
        """One Generate call; returns its tokens, its usage and the decode pod
        that served it, or Nones when it failed."""
        try:
            pod, target = self.cluster.pick(DECODE, "grpc")
        except AssertionError as e:  # no ready endpoint: the client's connection fails
            self.count_sent()
            self.failed_call(f"{tag}: {e}")
            self.stopping.wait(0.1)  # its reconnect backoff
            return None, None, None
        self.count_sent()
        options = self.client_options  # one set: the test swaps the whole dict
        try:
            with Client(target, timeout=REQUEST_TIMEOUT_S, **options) as client:
                result = client.generate(history, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                                         cache_salt="k8s")
        except HybridserveError as e:
            self.failed_call(f"{tag} on {pod.name}: {e.code} {e}")
            return None, None, None
        except Exception as e:  # pylint: disable=broad-except  # e.g. StreamProtocolError: a failure too
            self.failed_call(f"{tag} on {pod.name}: {e!r}")
            return None, None, None
        if result.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
            self.failed_call(f"{tag} on {pod.name}: finish_reason {result.finish_reason} {result.error_message}")
            return None, None, None
        with self.lock:
            self.completed += 1
            self.tokens += len(result.token_ids)
        return result.token_ids, result.usage, pod

    def count_sent(self):
        with self.lock:
            self.sent += 1

    def failed_call(self, message):
        with self.lock:
            self.failed.append(message)

    def progress(self):
        """(turns completed, tokens streamed, failed calls) so far."""
        with self.lock:
            return self.completed, self.tokens, len(self.failed)

    def wait_for_turns(self, turns, timeout_s, what):
        """Until `turns` more turns complete (a failed call or the timeout:
        AssertionError naming `what` and the failures)."""
        target = self.progress()[0] + turns

        def done():
            completed, _, failed = self.progress()
            if failed:
                raise AssertionError(f"{what}: failed calls {self.failed}")
            return completed >= target

        self.cluster.wait(done, timeout_s, f"{what}: {turns} more turns complete")

    def chat(self, name, turns):
        """One conversation; returns each turn's cached_tokens."""
        history = encode_bytes(f"{name}: tell me a fortune, please.\n", add_bos=True)
        cached = []
        previous_published = True
        for n in range(turns):
            tokens, usage, pod = self.turn(history, f"{name} turn {n + 1}")
            if tokens is None:
                break
            cached.append(usage.cached_tokens)
            if n > 0:
                with self.lock:
                    self.turns_after_first += 1
                    self.resumed += usage.cached_tokens > 0
                    if usage.cached_tokens == 0:
                        (self.missed_published if previous_published else self.missed_unpublished).append(
                            (f"{name} turn {n + 1}", pod.name))
            previous_published = usage.session.published
            history = history + list(tokens) + encode_bytes(f"And another, number {n + 2}.\n")
        return cached

    def start(self, count):
        def run(i):
            k = 0
            while not self.stopping.is_set():
                self.chat(f"client {i} conversation {k}", TURNS_A_CONVERSATION)
                k += 1

        for i in range(count):
            t = threading.Thread(target=run, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=2 * REQUEST_TIMEOUT_S * TURNS_A_CONVERSATION)


class CallAcrossSigterm:
    """A client connected to `pod` that starts a long generation
    LONG_CALL_LEAD_S before the pod's preStop sleep ends, on its connection
    kept across the endpoint removal, as clients do. Its length comes from a
    calibration call on the same connection, under the same load."""

    PROMPT = encode_bytes("Once upon a time", add_bos=True)

    def __init__(self, clients, pod):
        self.clients, self.pod = clients, pod
        self.client = Client(f"{pod.ip}:{pod.port('grpc')}", timeout=REQUEST_TIMEOUT_S, **clients.client_options)
        clients.count_sent()
        max_context = self.client.model_info().max_context_tokens
        clients.count_sent()
        began = time.monotonic()
        self.client.generate(self.PROMPT, max_tokens=CALIBRATION_TOKENS, temperature=0.0, ignore_eos=True)
        rate = CALIBRATION_TOKENS / (time.monotonic() - began)
        # At least CALIBRATION_TOKENS: a calibration slowed by a passing load
        # (seen under ASan: 71 tokens/s measured, 340 served) must not size a
        # call that ends before the SIGTERM it is meant to run across; the
        # calibration itself took that long, well within --shutdown_grace.
        self.max_tokens = min(max(int(rate * LONG_CALL_S), CALIBRATION_TOKENS), LONG_CALL_MAX_TOKENS,
                              max_context - len(self.PROMPT))
        self.began = self.first_token = self.ended = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.pod.deleting.wait()
        # Starts LONG_CALL_LEAD_S before the kubelet's preStop sleep ends; a
        # SIGTERM before then (the plan failed) wakes it and is reported.
        if self.pod.sigterm_sent.wait(
                max(0.0, self.pod.deleted_at + self.pod.prestop_s - LONG_CALL_LEAD_S - time.monotonic())):
            self.clients.failed_call(f"{self.pod.name} got SIGTERM before the call across it could start")
            self.client.close()
            return
        self.clients.count_sent()
        self.began = time.monotonic()
        tag = f"the call across {self.pod.name}'s SIGTERM"
        try:
            with self.client.stream(self.PROMPT, max_tokens=self.max_tokens, temperature=0.0,
                                    ignore_eos=True) as events:
                for _ in events:
                    if self.first_token is None:
                        self.first_token = time.monotonic()
            result = events.result
            if result.finish_reason != FinishReason.LENGTH or len(result.token_ids) != self.max_tokens:
                self.clients.failed_call(f"{tag}: {result.finish_reason} after {len(result.token_ids)} tokens "
                                         f"{result.error_message}")
        except HybridserveError as e:
            self.clients.failed_call(f"{tag}: {e.code} {e}")
        except Exception as e:  # pylint: disable=broad-except
            self.clients.failed_call(f"{tag}: {e!r}")
        self.ended = time.monotonic()
        self.client.close()

    def join(self):
        self.thread.join()


class StreamAcross:
    """One long generation on its own connection to decode (opened before a
    change, kept across it, as a client keeps its channel), streamed in a
    thread: tokens() is how many have arrived so far. Sized from a
    calibration call on the same connection, under the same load, to run
    about `seconds`."""

    PROMPT = encode_bytes("A long story, streamed across a change:", add_bos=True)

    def __init__(self, clients, seconds):
        self.clients = clients
        self.pod, target = clients.cluster.pick(DECODE, "grpc")
        self.client = Client(target, timeout=STREAM_TIMEOUT_S, **clients.client_options)
        clients.count_sent()
        max_context = self.client.model_info().max_context_tokens
        clients.count_sent()
        began = time.monotonic()
        self.client.generate(self.PROMPT, max_tokens=CALIBRATION_TOKENS, temperature=0.0, ignore_eos=True)
        rate = CALIBRATION_TOKENS / (time.monotonic() - began)
        self.max_tokens = min(int(rate * seconds), max_context - len(self.PROMPT))
        self.lock = threading.Lock()
        self.count = 0
        self.first = threading.Event()
        self.ended = None  # time.monotonic() at its end
        clients.count_sent()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        tag = f"the stream on {self.pod.name} across the change"
        try:
            with self.client.stream(self.PROMPT, max_tokens=self.max_tokens, temperature=0.0,
                                    ignore_eos=True) as events:
                for event in events:  # TokenChunks, then the GenerateResult
                    if isinstance(event, TokenChunk):
                        with self.lock:
                            self.count += len(event.token_ids)
                        self.first.set()
            result = events.result
            if result.finish_reason != FinishReason.LENGTH or len(result.token_ids) != self.max_tokens:
                self.clients.failed_call(f"{tag}: {result.finish_reason} after {len(result.token_ids)} tokens "
                                         f"{result.error_message}")
        except HybridserveError as e:
            self.clients.failed_call(f"{tag}: {e.code} {e}")
        except Exception as e:  # pylint: disable=broad-except
            self.clients.failed_call(f"{tag}: {e!r}")
        self.ended = time.monotonic()
        self.first.set()
        self.client.close()

    def tokens(self):
        with self.lock:
            return self.count

    def join(self):
        self.thread.join()
        return self.tokens()


# The decode Service's virtual IP (local_cluster.ClusterIp), for the tests
# that import it from here.
ClusterIp = local_cluster.ClusterIp


def metric_sum(text, name, labels=""):
    """The sum of the samples of the metric `name` whose labels include
    `labels` (e.g. 'reason="deadline_exceeded"'), in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sample, value = line.split()[:2]
        if (sample == name or sample.startswith(name + "{")) and labels in sample:
            total += float(value)
    return total


def prefill_calls(pod):
    """Prefill calls a pod answered, from its metrics."""
    return metric_sum(pod.metrics(), "hybridserve_prefill_requests_total", 'outcome="ok"')


def decode_fallback_prefills(pod):
    """Prompts a decode pod prefilled itself as no prefill worker answered
    (--fallback_prefill_max_tokens), by reason, from its metrics."""
    text = pod.metrics()
    return {reason: metric_sum(text, "hybridserve_decode_fallback_prefills_total", f'reason="{reason}"')
            for reason in ("unavailable", "failed")}


def prefill_cache_failures(pod):
    """Cache failures a prefill pod counted that make a lookup a miss (None:
    its metrics never answered): lookups and restores abandoned as misses,
    and puts past their deadline, each of which starts the cache backoff
    whose skipped lookups are misses counted nowhere
    (cachestore/client/cache_backoff.h)."""
    text = pod.last_metrics()
    if text is None:
        return None
    return (metric_sum(text, "hybridserve_prefill_cache_errors_total")
            + metric_sum(text, "hybridserve_prefill_publish_failures_total", 'reason="deadline_exceeded"'))


# What prefill/prefill_worker.cc logs when a cache lookup or restore failed
# and became a miss.
CACHE_FAILURE_LOGS = ("cache lookup failed, prefilling cold", "cache resume at ")


def decode_cache_failures(pod):
    """Cache failures that made a lookup a miss in a decode pod's own
    prefills (continuations it prefills itself, --local_prefill_max_tokens):
    decode exports no counter of them, so its log's lines of them (the first
    of each kind is always logged, later ones in a burst are held back)."""
    with open(pod.log_path, encoding="utf-8", errors="replace") as f:
        return sum(any(m in line for m in CACHE_FAILURE_LOGS) for line in f)


class Certificates:
    """The Secrets the mtls overlay mounts, issued at test time as
    components/mtls/cert-manager would issue them (each
    Certificate's URIs and DNS names; the CA Issuer's CA as ca.crt), by
    tools/make_test_certs.py, and the tenants' client certificates.

    A CA rotation: new_ca() makes the next CA (its own directory), trust()
    sets the bundle every Secret's ca.crt and every client trusts (`ca`, a
    new file each time), issue_everything_from() issues every Secret and
    tenant by a CA. Files a client reads are never rewritten: it reads one
    consistent set, the paths of client_options at the time."""

    def __init__(self, directory):
        self.root = directory
        self.tool = local_cluster.runfile("tools/make_test_certs.py")
        subprocess.run(["/usr/bin/python3", self.tool, "--out", directory], check=True)  # the CA
        self.dir = directory  # the issuing CA's ca.pem and ca.key, and what it signed
        self.ca = os.path.join(directory, "ca.pem")  # the bundle trusted (ca.crt)
        self.cas = 1
        self.bundles = 0
        self.sans = {}  # Secret name -> make_test_certs.py's SAN arguments
        for cert in manifests.cert_manager_example():
            spec = cert["spec"]
            if cert["kind"] != "Certificate" or spec.get("isCA"):
                continue
            self.sans[spec["secretName"]] = ([f"--uri={u}" for u in spec.get("uris", [])]
                                             + [f"--dns={d}" for d in spec.get("dnsNames", [])])
        for name, spiffe_id in TENANTS.items():
            self.sans[name] = [f"--uri={spiffe_id}"]
        for name in self.sans:
            self._issue(name)

    def _issue(self, name):
        subprocess.run(["/usr/bin/python3", self.tool, "--out", self.dir, "--issue", name, *self.sans[name]],
                       check=True)

    def secret_names(self):
        return [name for name in self.sans if name not in TENANTS]

    def secret(self, name):
        """The Secret's data, cert-manager's keys."""
        out = {}
        for key, path in (("tls.crt", os.path.join(self.dir, f"{name}.pem")),
                          ("tls.key", os.path.join(self.dir, f"{name}.key")), ("ca.crt", self.ca)):
            with open(path, "rb") as f:
                out[key] = f.read()
        return out

    def secrets(self):
        return {name: self.secret(name) for name in self.secret_names()}

    def renew(self, name):
        """A new certificate and key for the Secret (a renewal); its data."""
        self._issue(name)
        return self.secret(name)

    def new_ca(self):
        """The next CA (issues nothing yet); the directory of its ca.pem."""
        self.cas += 1
        directory = os.path.join(self.root, f"ca{self.cas}")
        subprocess.run(["/usr/bin/python3", self.tool, "--out", directory, "--ca_only",
                        f"--ca_name=hybridserve test CA {self.cas}"], check=True)
        return directory

    def trust(self, *ca_dirs):
        """From now on ca.crt and the clients' bundle: those CAs."""
        self.bundles += 1
        path = os.path.join(self.root, f"trust{self.bundles}.pem")
        with open(path, "wb") as out:
            for directory in ca_dirs:
                with open(os.path.join(directory, "ca.pem"), "rb") as f:
                    out.write(f.read())
        self.ca = path

    def issue_by(self, ca_dir, name):
        """`name`'s certificate signed by that CA, apart from what is in use:
        its (certificate, key) paths."""
        subprocess.run(["/usr/bin/python3", self.tool, "--out", ca_dir, "--issue", f"{name}.probe",
                        *self.sans[name]], check=True)
        return os.path.join(ca_dir, f"{name}.probe.pem"), os.path.join(ca_dir, f"{name}.probe.key")

    def issue_everything_from(self, ca_dir):
        """Every Secret's and tenant's certificate anew, signed by that CA."""
        self.dir = ca_dir
        for name in self.sans:
            self._issue(name)

    def files(self, name):
        """(certificate, key) paths of a tenant or a Secret's identity."""
        return os.path.join(self.dir, f"{name}.pem"), os.path.join(self.dir, f"{name}.key")

    def client_options(self, tenant, server_name=DECODE):
        cert, key = self.files(tenant)
        return {"tls_ca": self.ca, "tls_cert": cert, "tls_key": key, "tls_server_name": server_name}


def served_certificate(address, server_name, ca, cert_and_key):
    """The certificate (DER) a TLS port serves a new connection from a client
    presenting `cert_and_key` ((certificate, key) paths), verified against
    the bundle `ca` and `server_name` (Python's own check of the SANs)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ca)
    context.load_cert_chain(*cert_and_key)
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        with context.wrap_socket(sock, server_hostname=server_name) as tls:
            return tls.getpeercert(binary_form=True)


def raw_call(address, method, credentials=None, server_name=None, stream=False):
    """One call by method name with an empty request; its status code."""
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", server_name)])
    try:
        if stream:
            list(channel.stream_stream(method)(iter([b""]), timeout=5))
        else:
            channel.unary_unary(method)(b"", timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def tls_credentials(ca, cert_and_key):
    """A channel's credentials: the bundle `ca`, the (certificate, key) paths."""
    cert, key = cert_and_key

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(read(ca), read(key), read(cert))


class ManifestRunCase(unittest.TestCase):

    def setUp(self):
        random.seed(26)
        self.workdir = tempfile.mkdtemp(prefix="k8s-run-", dir=os.environ.get("TEST_TMPDIR"))
        self.cluster = None

    def tearDown(self):
        if self.cluster is not None:
            # Every pod still running stops with SIGTERM and exits 0, and no
            # pod's log holds a sanitizer report.
            self.assertEqual(self.cluster.teardown(), [])

    def _start(self, overlay, secrets=None, edit=None, virtual_ips=()):
        """virtual_ips: the ClusterIP Services whose name resolves to a
        virtual IP (local_cluster.Cluster)."""
        self.objs = manifests.render(overlay)
        if edit:
            edit(self.objs)
        os.makedirs(os.path.join(self.workdir, overlay))
        self.cluster = local_cluster.Cluster(self.objs, os.path.join(self.workdir, overlay), secrets,
                                             virtual_ips=virtual_ips)
        self.cluster.start()

    def _with_logs_on_failure(self, scenario):
        try:
            scenario()
        except BaseException:
            for pod in self.cluster.all_pods:
                print(f"--- {pod.name} ({pod.ip}) log tail:\n{pod.log_tail()}")
            raise
