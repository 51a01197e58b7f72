"""Runs what deploy/k8s/overlays/cpu declares, as local processes (how each
declared thing is mapped onto one host: tests/k8s/local_cluster.py), and
plays what a platform team does with it:

  1. the cachestore, one prefill pod and one decode pod -> all Ready;
  2. a three-turn chat through the decode Service; turns 2 and 3 resume from
     the cache (cached_tokens > 0);
  3. 8 conversations start and run on to the end; prefill scales 1 -> 3 and
     decode sends calls to both new pods (their request counters, scraped
     from their declared metrics ports, move);
  4. (cpu) kill -9 of every prefill pod under the conversations: decode prefills
     their prompts itself (--fallback_prefill_max_tokens; its
     hybridserve_decode_fallback_prefills_total grows), no request fails;
     prefill back to 3 pods, and decode sends calls to each again;
  5. a rolling update of decode, then of prefill, as the Deployment
     controller and the kubelet do it (strategy, readiness gate, endpoint
     removal, preStop sleep, SIGTERM, SIGKILL at the grace period's end).
     Besides the conversations, a client that connected to the old decode
     pod before its endpoint removal starts a long generation just before
     that pod's SIGTERM: it runs across the SIGTERM, the drain lets it
     finish (so a grace period too short for the drain is a SIGKILL, and a
     failure).

Apart (//tests/k8s:run_manifests_scale_out_test): decode scales 1 -> 3 under
one long-lived client whose channel goes through an emulated ClusterIP (each
TCP connection to one ready pod, for its life) with decode's
--max_connection_age shortened to DECODE_CONNECTION_AGE_S: the GOAWAY at that
age makes it reconnect, and the new pods serve a share of its requests within
a bound; none fails. And a flag edit applied (a new render) under the
conversations: decode and prefill roll onto the new flag, the cachestore
does not, no request fails.

The same scenario runs on deploy/k8s/overlays/cpu-mtls (mutual TLS on
every gRPC port, tests/k8s/local_cluster.py mapping each pool's Secret to a
directory laid out as the kubelet's), with certificates made at test time as
components/mtls/cert-manager would issue them (its SPIFFE IDs
and DNS names, by tools/make_test_certs.py) and clients holding tenant
certificates. Besides: every pod turned Ready by probes on its plaintext
health port while its gRPC port refuses plaintext, and the health port
answers nothing but health; decode refuses a client without a certificate,
prefill and the cachestore refuse a tenant's certificate (their allowed
peers) and take decode's; another tenant's identical prompt resumes nothing
from the first tenant's cache; and while the conversations run (their turns
and tokens printed before and after each change; no failed request across
it), with no restart:
  - every Secret is renewed (the kubelet's symlink swap): within
    --tls_refresh each TLS port (the pods' gRPC ports) serves the new
    certificate of the Secret its own pod mounts, and a stream opened before
    gets tokens before the change and after it took effect, to its last;
  - the CA is rotated: every ca.crt and every client trusting both CAs
    (each port takes a certificate of the new CA), then every Secret and
    tenant certificate issued by the new CA (each port serves its own), then
    the new CA alone (each port refuses a certificate of the old CA); at the
    end a client trusting only the old CA connects to no port.

Zero failed requests: any non-OK status or a final message with
finish_reason ERROR or ABORT fails the test (clients retry nothing; each
turn is a new connection to a ready decode endpoint, as a ClusterIP
balances connections). So does any kubelet restart (failed startup or
liveness probe, a container that exits, a SIGKILL), any pod that never turns
Ready, and a later turn of a conversation that resumes nothing from the
cache, but for two kinds: a turn after one whose turn-end state decode
reported not published (usage.session.published false: a put failed), and
a turn after a published one matched by a cache failure that makes a lookup
a miss, logged by the decode pod that served the turn (its own prefills) or
counted by any prefill pod (the client cannot tell which one decode called;
their metrics scraped until each pod's process exits). Decode sends a turn's
final message only after its publication's result, so a published turn end
is in the cache when the next turn starts.

The test runs in its own network namespace (the pods bind the manifests'
fixed ports on 127.0.0.N, apart from anything else on the machine) and mount
namespace (the hosts file over /etc/hosts): it re-executes itself under
`unshare` (root, or an unprivileged user namespace)."""

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


def _reexec_in_namespaces():
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
        self.max_tokens = min(int(rate * LONG_CALL_S), LONG_CALL_MAX_TOKENS, max_context - len(self.PROMPT))
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


class ClusterIp:
    """The decode Service's virtual IP as kube-proxy makes it: each new TCP
    connection to it goes to one ready endpoint, at random, for the
    connection's life (so a client's HTTP/2 connection stays on one pod until
    it reconnects). Listens on 127.0.0.1 (no pod's address)."""

    def __init__(self, cluster, service, port_name):
        self.cluster, self.service, self.port_name = cluster, service, port_name
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.target = f"127.0.0.1:{self.listener.getsockname()[1]}"
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
        self.listener.close()


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


class RunManifestsTest(unittest.TestCase):

    def setUp(self):
        random.seed(26)
        self.workdir = tempfile.mkdtemp(prefix="k8s-run-", dir=os.environ.get("TEST_TMPDIR"))
        self.cluster = None

    def tearDown(self):
        if self.cluster is not None:
            # Every pod still running stops with SIGTERM and exits 0, and no
            # pod's log holds a sanitizer report.
            self.assertEqual(self.cluster.teardown(), [])

    def _start(self, overlay, secrets=None, edit=None):
        self.objs = manifests.render(overlay)
        if edit:
            edit(self.objs)
        os.makedirs(os.path.join(self.workdir, overlay))
        self.cluster = local_cluster.Cluster(self.objs, os.path.join(self.workdir, overlay), secrets)
        self.cluster.start()

    def _with_logs_on_failure(self, scenario):
        try:
            scenario()
        except BaseException:
            for pod in self.cluster.all_pods:
                print(f"--- {pod.name} ({pod.ip}) log tail:\n{pod.log_tail()}")
            raise

    def test_manifests_serve_scale_and_roll_without_a_failed_request(self):
        self._start(OVERLAY)
        self._with_logs_on_failure(lambda: self._scenario(Conversations(self.cluster)))

    def test_decode_scale_out_reaches_a_long_lived_client(self):
        # One client, one channel to the decode Service (a ClusterIP: each
        # connection stays on one pod), sending requests one after another
        # throughout. Decode 1 -> 3: the connection age (--max_connection_age,
        # DECODE_CONNECTION_AGE_S here in place of the manifests' 5 min) sends
        # it a GOAWAY, it reconnects, and the new pods serve a share of its
        # requests; none fails.
        def short_age(objs):
            manifests.container(objs, "decode")["args"].append(f"--max_connection_age={DECODE_CONNECTION_AGE_S}s")

        self._start(OVERLAY, edit=short_age)
        self._with_logs_on_failure(self._scale_out_scenario)

    def _scale_out_scenario(self):
        deployments = self.cluster.deployments
        deployments[CACHESTORE].scale(1, READY_TIMEOUT_S)
        deployments[PREFILL].scale(1, READY_TIMEOUT_S)
        deployments[DECODE].scale(1, READY_TIMEOUT_S)
        vip = ClusterIp(self.cluster, DECODE, "grpc")
        failed = []
        stopping = threading.Event()

        def finished(pod):
            return metric_sum(pod.metrics(), "hybridserve_request_success_total")

        def client():
            prompt = encode_bytes("one long-lived client, request ", add_bos=True)
            with Client(vip.target, timeout=REQUEST_TIMEOUT_S) as c:
                n = 0
                while not stopping.is_set():
                    n += 1
                    try:
                        result = c.generate(prompt + encode_bytes(str(n)), max_tokens=MAX_TOKENS, temperature=0.0,
                                            ignore_eos=True)
                        if result.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                            failed.append(f"request {n}: {result.finish_reason} {result.error_message}")
                    except Exception as e:  # pylint: disable=broad-except
                        failed.append(f"request {n}: {e!r}")

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        try:
            self._scale_out_under(vip, failed, finished)
        finally:
            stopping.set()
            thread.join(REQUEST_TIMEOUT_S)
            vip.close()

    def _scale_out_under(self, vip, failed, finished):
        deployments = self.cluster.deployments
        first = deployments[DECODE].pods[0]
        self.cluster.wait(lambda: finished(first) > 0 or failed, REQUEST_TIMEOUT_S, "the client's first requests")
        deployments[DECODE].scale(3, READY_TIMEOUT_S)
        added = [p for p in deployments[DECODE].pods if p is not first]
        began = time.monotonic()
        # Each reconnection picks one of 3 pods: a new pod missed by 30 in a
        # row has odds (2/3)^30 < 1e-5; one comes each connection age.
        bound_s = 30 * DECODE_CONNECTION_AGE_S + REQUEST_TIMEOUT_S
        self.cluster.wait(lambda: failed or all(finished(p) > 0 for p in added), bound_s,
                          "the new decode pods serve the long-lived client")
        took = time.monotonic() - began
        served = {p.name: finished(p) for p in deployments[DECODE].pods}
        print(f"decode 1 -> 3 under one long-lived client (--max_connection_age={DECODE_CONNECTION_AGE_S}s): "
              f"requests finished by pod {served}, the new pods' first after {took:.1f} s; "
              f"its connections went to {vip.connections}")
        self.assertEqual(failed, [])
        self.assertEqual(self.cluster.failures, [])
        self.assertTrue(all(served[p.name] > 0 for p in added), served)

    def test_a_flag_edit_rolls_the_workers(self):
        # An operator edits a flag (engine.flags: --max_pages) and applies the
        # new render under 8 conversations: the workers' ConfigMap gets a new
        # name, the render changes decode's and prefill's pod templates and
        # not the cachestore's; their rollouts bring pods that run the new
        # flag (decode's hybridserve_kv_pages_total), with no failed request.
        self._start(OVERLAY)
        self._with_logs_on_failure(self._flag_edit_scenario)

    def _flag_edit_scenario(self):
        deployments = self.cluster.deployments
        for name in (CACHESTORE, PREFILL, DECODE):
            deployments[name].scale(1, READY_TIMEOUT_S)
        pages = int(manifests.flags(self.objs, "decode")["max_pages"])
        old_decode = deployments[DECODE].pods[0]
        self.assertEqual(metric_sum(old_decode.metrics(), "hybridserve_kv_pages_total"), pages)

        def edit(root):
            with open(os.path.join(root, "overlays", OVERLAY, "engine.flags"), "a", encoding="utf-8") as f:
                f.write(f"--max_pages={pages - EDITED_PAGES_LESS}\n")

        edited = manifests.render(OVERLAY, edit=edit)
        clients = Conversations(self.cluster)
        clients.start(CONVERSATIONS)
        clients.wait_for_turns(CONVERSATIONS, REQUEST_TIMEOUT_S, "the conversations before the edit")
        changed = self.cluster.apply(edited)
        self.assertEqual(sorted(changed), sorted([DECODE, PREFILL]))
        terminations = []
        deployments[PREFILL].rollout(3 * READY_TIMEOUT_S, terminations)
        deployments[DECODE].rollout(READY_TIMEOUT_S, terminations)
        for t in terminations:
            t.join()
        clients.wait_for_turns(CONVERSATIONS, REQUEST_TIMEOUT_S, "the conversations after the rollouts")
        clients.stop()
        new_decode = deployments[DECODE].pods[0]
        new_pages = metric_sum(new_decode.metrics(), "hybridserve_kv_pages_total")
        print(f"flag edit (--max_pages {pages} -> {pages - EDITED_PAGES_LESS}) applied: rolled {changed}; "
              f"{old_decode.name} had {pages} pages, {new_decode.name} has {new_pages:.0f}; requests sent "
              f"{clients.sent}, failed {len(clients.failed)}")
        self.assertEqual(clients.failed, [])
        self.assertEqual(self.cluster.failures, [])
        self.assertNotIn(old_decode, deployments[DECODE].pods)
        self.assertEqual(new_pages, pages - EDITED_PAGES_LESS)

    def test_mtls_manifests_serve_scale_roll_and_renew_certificates_without_a_failed_request(self):
        certificates = Certificates(os.path.join(self.workdir, "certs"))
        self._start(MTLS_OVERLAY, certificates.secrets())
        clients = Conversations(self.cluster, certificates.client_options("tenant-a"))
        self._with_logs_on_failure(lambda: self._scenario(clients, certificates))

    def _scenario(self, clients, certificates=None):
        began = time.monotonic()
        deployments = self.cluster.deployments
        # 1. Each pool once the one it needs is Ready.
        deployments[CACHESTORE].scale(1, READY_TIMEOUT_S)
        deployments[PREFILL].scale(1, READY_TIMEOUT_S)
        deployments[DECODE].scale(1, READY_TIMEOUT_S)
        print(f"all Ready after {time.monotonic() - began:.1f} s")
        if certificates is not None:
            self._check_tls_ports(certificates)

        # 2. A three-turn chat.
        cached = clients.chat("the three-turn chat", 3)
        self.assertEqual(clients.failed, [])
        self.assertEqual(len(cached), 3)
        self.assertTrue(all(c > 0 for c in cached[1:]), f"cached_tokens of the three turns: {cached}")
        print(f"three-turn chat: cached_tokens {cached}")
        if certificates is not None:
            self._check_tenants(certificates)

        # 3. Traffic from here on; prefill 1 -> 3.
        clients.start(CONVERSATIONS)
        first_prefill = list(deployments[PREFILL].pods)
        deployments[PREFILL].scale(PREFILL_REPLICAS, READY_TIMEOUT_S)
        added = [p for p in deployments[PREFILL].pods if p not in first_prefill]
        resolve_s = manifests.parse_duration_s(manifests.flags(self.objs, "decode")["prefill_resolve_interval"])
        self.cluster.wait(lambda: all(prefill_calls(p) > 0 for p in added), resolve_s + 30,
                          "decode calls every new prefill pod")
        served = {p.name: prefill_calls(p) for p in deployments[PREFILL].pods}
        print(f"prefill pods after scaling to {PREFILL_REPLICAS}, calls served: {served}")
        if certificates is not None:
            went_across = self._renew_every_secret(certificates, clients)
            self._rotate_ca(certificates, clients)
            went_across()

        # 4. kill -9 of every prefill pod; the pool back (the plaintext
        # overlay: the same pools and flags).
        if certificates is None:
            self._kill_every_prefill_pod(clients)

        # 5. Rolling updates under traffic.
        terminations = []
        across = CallAcrossSigterm(clients, deployments[DECODE].pods[0])
        deployments[DECODE].rollout(READY_TIMEOUT_S, terminations)
        deployments[PREFILL].rollout(3 * READY_TIMEOUT_S, terminations)
        for t in terminations:
            t.join()
        across.join()
        rolled_prefill = {p.name: prefill_calls(p) for p in deployments[PREFILL].pods}
        clients.stop()
        prefill_failures = {p.name: prefill_cache_failures(p) for p in self.cluster.all_pods
                            if p.deployment.name == PREFILL}
        decode_failures = {p.name: decode_cache_failures(p) for p in self.cluster.all_pods
                           if p.deployment.name == DECODE}
        # Not a failure, printed to explain a miss: what the cache evicted
        # (the budgets of the cpu overlay are small), by class and reason.
        evictions = {line.split()[0].split("{", 1)[1].rstrip("}"): float(line.split()[1])
                     for line in deployments[CACHESTORE].pods[0].metrics().splitlines()
                     if line.startswith("hybridserve_cache_evictions_total{") and float(line.split()[1]) > 0}

        rolled = [p for p in self.cluster.all_pods if p.deleted and p.sigterm_to_exit_s is not None]
        print(f"requests sent: {clients.sent}, failed: {len(clients.failed)}")
        print(f"turns resumed from the cache: {clients.resumed} / {clients.turns_after_first} turns after the first")
        for pod in rolled:
            print(f"{pod.name}: SIGTERM to exit {pod.sigterm_to_exit_s:.2f} s (grace {pod.grace_s} s)")
        print(f"prefill pods of the new revision, calls served: {rolled_prefill}")
        if across.first_token is not None and across.pod.sigterm_at is not None:
            print(f"the long call on {across.pod.name} ({across.max_tokens} tokens): first token "
                  f"{across.pod.sigterm_at - across.first_token:.2f} s before its SIGTERM, "
                  f"ended {across.ended - across.pod.sigterm_at:.2f} s after it")
        print(f"whole scenario: {time.monotonic() - began:.1f} s")

        self.assertEqual(self.cluster.failures, [])
        self.assertEqual(clients.failed, [])
        self.assertGreater(clients.turns_after_first, 0)
        # Every later turn resumes from the cache, but (a) a turn after one
        # whose turn end decode reported not published (usage.session.published
        # false: a put failed, its state is not in the cache), and (b) a turn
        # after a published one matched by a cache failure that makes a lookup
        # a miss where that turn's lookup may have run: in the decode pod that
        # served it (its own prefills: decode_cache_failures) or, as the
        # client cannot tell which prefill pod decode called, in any prefill
        # pod (prefill_cache_failures, scraped from each until its process
        # exited). A published turn end is in the cache before the next turn
        # starts: decode sends the final message only after the publication's
        # result (decode/turn_end.h).
        missed = clients.missed_published + clients.missed_unpublished
        print(f"later turns not resumed: {len(clients.missed_published)} after a published turn end "
              f"{clients.missed_published[:5]}, {len(clients.missed_unpublished)} after an unpublished one "
              f"{clients.missed_unpublished[:5]}; cache failures counted by the prefill pods: {prefill_failures}, "
              f"logged by the decode pods: {decode_failures}; cachestore evictions: {evictions}")
        self.assertEqual(clients.resumed + len(missed), clients.turns_after_first)
        if clients.missed_published:
            self.assertNotIn(None, prefill_failures.values(), "a prefill pod's metrics never answered")
        unmatched = [(turn, pod) for turn, pod in clients.missed_published
                     if decode_failures[pod] == 0 and sum(prefill_failures.values()) == 0]
        self.assertFalse(unmatched, f"{len(unmatched)} turns missed the cache after a published turn end, with no "
                         f"cache failure counted by a prefill pod nor logged by the decode pod that served them, "
                         f"e.g. {unmatched[:5]}")
        self.assertEqual(len(rolled), 1 + PREFILL_REPLICAS)
        self.assertTrue(all(calls > 0 for calls in rolled_prefill.values()), rolled_prefill)
        # The long call was running (its first token out) when its pod got SIGTERM.
        self.assertLess(across.first_token, across.pod.sigterm_at)
        self.assertGreater(across.ended, across.pod.sigterm_at)

    def _kill_every_prefill_pod(self, clients):
        """kill -9 of every prefill pod while the conversations run: decode
        prefills their prompts itself (its fallback counter grows: the kill
        landed while it had prompts to prefill) and no request fails, with
        no prefill pod for CONVERSATIONS turns and more; then the pool back
        at PREFILL_REPLICAS pods, and decode calls each of them within its
        --prefill_resolve_interval (their request counters move)."""
        deployments = self.cluster.deployments
        decodes = list(deployments[DECODE].pods)

        def fallbacks():
            return sum(sum(decode_fallback_prefills(p).values()) for p in decodes)

        before = fallbacks()
        killed = list(deployments[PREFILL].pods)
        began = time.monotonic()
        for pod in killed:
            pod.kill()
        progress = clients.progress()
        self.assertEqual(deployments[PREFILL].pods, [])
        def fell_back():
            if clients.failed:
                raise AssertionError(f"failed calls with no prefill pod: {clients.failed[:5]}")
            return fallbacks() > before

        self.cluster.wait(fell_back, REQUEST_TIMEOUT_S, "decode prefills prompts itself with no prefill pod")
        clients.wait_for_turns(CONVERSATIONS, REQUEST_TIMEOUT_S, "the conversations with no prefill pod")
        alone = {p.name: decode_fallback_prefills(p) for p in decodes}
        after_kill = clients.progress()
        print(f"kill -9 of {[p.name for p in killed]}: conversations' turns/tokens at the kill {progress[:2]}, "
              f"{time.monotonic() - began:.1f} s later {after_kill[:2]}, failed calls {after_kill[2]}; "
              f"decode's fallback prefills {before:.0f} before, now {alone}")
        self.assertEqual(clients.failed, [])

        deployments[PREFILL].scale(PREFILL_REPLICAS, READY_TIMEOUT_S)
        back = list(deployments[PREFILL].pods)
        resolve_s = manifests.parse_duration_s(manifests.flags(self.objs, "decode")["prefill_resolve_interval"])
        self.cluster.wait(lambda: all(prefill_calls(p) > 0 for p in back), resolve_s + 30,
                          "decode calls every prefill pod back")
        # It takes the load on: its calls keep growing, and decode's own
        # fallback prefills stop (CONVERSATIONS turns in a row without one;
        # a fallback under way when the pool came back may still count).
        calls, fell_back = sum(prefill_calls(p) for p in back), fallbacks()
        self.cluster.wait(lambda: sum(prefill_calls(p) for p in back) > calls, REQUEST_TIMEOUT_S,
                          "the prefill pool back takes the prompts")
        quiet = [fallbacks(), clients.progress()[0]]

        def returned():
            now, turns = fallbacks(), clients.progress()[0]
            if clients.failed:
                raise AssertionError(f"failed calls with the prefill pool back: {clients.failed[:5]}")
            if now != quiet[0]:
                quiet[:] = [now, turns]
                return False
            return turns - quiet[1] >= CONVERSATIONS

        self.cluster.wait(returned, REQUEST_TIMEOUT_S, f"{CONVERSATIONS} turns without a fallback prefill")
        print(f"prefill back to {PREFILL_REPLICAS} pods, calls served: {({p.name: prefill_calls(p) for p in back})}; "
              f"decode's fallback prefills {fell_back:.0f} once each served a call, then {quiet[0]:.0f} for "
              f"{CONVERSATIONS} turns and more")
        self.assertEqual(clients.failed, [])

    # --- mutual TLS --------------------------------------------------------------

    def _check_tls_ports(self, certificates):
        """Every pod turned Ready by probes on its plaintext health port (its
        gRPC port refuses plaintext); the health port answers nothing but
        health; each pool takes exactly the callers its allowed peers name."""
        for pod in self.cluster.all_pods:
            health = f"{pod.ip}:{pod.port('health')}"
            probe_ports = {pod.container[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe",
                                                                         "livenessProbe")}
            self.assertEqual(probe_ports, {pod.port("health")}, pod.name)
            self.assertTrue(pod.ready, pod.name)
            self.assertTrue(local_cluster.health_check(pod.ip, pod.port("health"), "", 5), pod.name)
            self.assertFalse(local_cluster.health_check(pod.ip, pod.port("grpc"), "", 5),
                             f"{pod.name}: its TLS port answers a plaintext probe")
            for method in ("/hybridserve.v1.Generation/Generate", "/hybridserve.v1.CacheStore/Stats",
                           "/hybridserve.v1.Prefill/Prefill"):
                self.assertEqual(raw_call(health, method), grpc.StatusCode.UNIMPLEMENTED, f"{pod.name} {method}")
            self.assertEqual(raw_call(health, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                      stream=True), grpc.StatusCode.UNIMPLEMENTED, f"{pod.name}: reflection")
        # Decode: a client without a certificate fails the handshake.
        decode = self.cluster.deployments[DECODE].pods[0]
        with Client(f"{decode.ip}:{decode.port('grpc')}", timeout=10, tls_ca=certificates.ca,
                    tls_server_name=DECODE) as client:
            with self.assertRaises(HybridserveError) as refused:
                client.generate(encode_bytes("no certificate", add_bos=True), max_tokens=1)
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAVAILABLE)
        # Prefill and the cachestore: a tenant's certificate verifies but is
        # not an allowed peer; decode's is.
        for deployment, method in ((PREFILL, "/hybridserve.v1.Prefill/Prefill"),
                                   (CACHESTORE, "/hybridserve.v1.CacheStore/Stats")):
            pod = self.cluster.deployments[deployment].pods[0]
            address = f"{pod.ip}:{pod.port('grpc')}"
            self.assertEqual(raw_call(address, method, tls_credentials(certificates.ca, certificates.files("tenant-a")), deployment),
                             grpc.StatusCode.PERMISSION_DENIED, deployment)
            self.assertNotIn(raw_call(address, method, tls_credentials(certificates.ca, certificates.files(f"{DECODE}-tls")), deployment),
                             (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
                              grpc.StatusCode.UNAVAILABLE), deployment)
        print("mTLS: probes on the health ports; TLS ports refuse plaintext; health ports serve health alone; "
              "decode refuses no certificate; prefill and the cachestore refuse a tenant, take decode")

    def _check_tenants(self, certificates):
        """Tenants by certificate (the same salt): A's first turn is cached
        under A; B sending A's second turn word for word resumes nothing; A
        sending it resumes."""
        pod, target = self.cluster.pick(DECODE, "grpc")

        def turn(tenant, history):
            with Client(target, timeout=REQUEST_TIMEOUT_S, **certificates.client_options(tenant)) as client:
                return client.generate(history, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                                       cache_salt="k8s")

        first = encode_bytes("tenant A's own conversation, word for word.\n", add_bos=True)
        second = first + list(turn("tenant-a", first).token_ids) + encode_bytes("And then?\n")
        cached_b = turn("tenant-b", second).usage.cached_tokens
        cached_a = turn("tenant-a", second).usage.cached_tokens
        print(f"tenants on {pod.name}: A's second turn sent by B: cached_tokens {cached_b}; by A: {cached_a}")
        self.assertEqual(cached_b, 0)
        self.assertGreater(cached_a, 0)

    def _refresh_s(self):
        return max(manifests.parse_duration_s(manifests.flags(self.objs, c).get("tls_refresh", "10s"))
                   for c in manifests.COMPONENTS)

    def _wait_tls_ports(self, what, check):
        """Until check(pod, address) returns None for every live pod's TLS
        port (its gRPC port: health and metrics are plaintext, decode's data
        plane raw TCP), within --tls_refresh and 10 s; otherwise it returns
        what is wrong, and the AssertionError names each port still wrong."""
        pods = [p for p in self.cluster.all_pods if not p.deleted]
        wrong = {}

        def all_right():
            wrong.clear()
            for pod in pods:
                address = f"{pod.ip}:{pod.port('grpc')}"
                problem = check(pod, address)
                if problem is not None:
                    wrong[f"{pod.name} {address}"] = problem
            return not wrong

        try:
            self.cluster.wait(all_right, self._refresh_s() + 10, what)
        except AssertionError as e:
            raise AssertionError(f"{e}; still: {wrong}") from None
        return len(pods)

    def _wait_serving(self, certificates, issued, ca):
        """Until every TLS port serves the certificate its own Secret (the
        one its pod mounts) holds now, `issued` ({Secret: DER}), verified
        against the bundle `ca` and the pool's Service name."""
        identity = certificates.files(f"{DECODE}-tls")

        def serves_its_own(pod, address):
            (secret,) = pod.secret_names()
            try:
                served = served_certificate(address, pod.deployment.name, ca, identity)
            except OSError as e:  # ssl.SSLError included
                return repr(e)
            if served == issued[secret]:
                return None
            return "serves " + next((f"{name}'s new certificate" for name, der in issued.items() if der == served),
                                    f"not {secret}'s new certificate")

        return self._wait_tls_ports("every TLS port serves its own Secret's certificate", serves_its_own)

    def _wait_taking(self, what, ca, identity, taken):
        """Until every TLS port takes (`taken`) or refuses at the handshake
        (UNAVAILABLE) a call from a client trusting `ca` and presenting
        `identity` ((certificate, key) paths: decode's SANs, a peer every
        pool allows)."""
        methods = {DECODE: "/hybridserve.v1.Generation/GetModelInfo", PREFILL: "/hybridserve.v1.Prefill/Prefill",
                   CACHESTORE: "/hybridserve.v1.CacheStore/Stats"}
        refused = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE)

        def check(pod, address):
            code = raw_call(address, methods[pod.deployment.name], tls_credentials(ca, identity), pod.deployment.name)
            if taken:
                return None if code not in refused else f"refused: {code}"
            return None if code == grpc.StatusCode.UNAVAILABLE else f"taken: {code}"

        return self._wait_tls_ports(what, check)

    def _across(self, clients, what, change):
        """change() under the conversations; they go on without a failure:
        their progress (turns completed, tokens streamed) just before, once
        change() returned, and CONVERSATIONS turns later, all after it took
        effect."""
        before = clients.progress()
        began = time.monotonic()
        change()
        changed = clients.progress()
        clients.wait_for_turns(CONVERSATIONS, REQUEST_TIMEOUT_S, f"the conversations after {what}")
        after = clients.progress()
        print(f"{what} in {time.monotonic() - began:.1f} s: conversations' turns/tokens before {before[:2]}, "
              f"once it took effect {changed[:2]}, then {after[:2]}; failed calls {after[2]}")
        self.assertEqual(after[2], 0, clients.failed)

    def _renew_every_secret(self, certificates, clients):
        """Every pool's Secret renewed while the conversations run: each TLS
        port serves its own Secret's new certificate within --tls_refresh,
        without a restart; the conversations go on across it, and so does a
        stream opened before it: the check of that stream (_went_across) is
        returned, to run once it ended."""
        pods = [p for p in self.cluster.all_pods if not p.deleted]
        processes = {p.name: p.process.pid for p in pods}
        stream = StreamAcross(clients, self._refresh_s() + STREAM_MARGIN_S)
        stream.first.wait(REQUEST_TIMEOUT_S)
        streamed = {}

        def renew():
            streamed["before"] = stream.tokens()
            renewed = {}
            for name in certificates.secret_names():
                data = certificates.renew(name)
                renewed[name] = ssl.PEM_cert_to_DER_cert(data["tls.crt"].decode())
                self.cluster.update_secret(name, data)
            self._wait_serving(certificates, renewed, certificates.ca)
            streamed["served"] = stream.tokens()
            streamed["running"] = stream.ended is None

        self._across(clients, f"renewing every Secret (--tls_refresh {self._refresh_s():.0f} s)", renew)
        self.assertEqual({p.name: p.process.pid for p in pods if p.process.poll() is None}, processes)
        return lambda: self._went_across(clients, stream, streamed)

    def _went_across(self, clients, stream, streamed):
        """The stream opened before the renewal got tokens before the Secrets
        changed and after every port served the new certificates, and ends
        with all its tokens (later steps run meanwhile)."""
        streamed["end"] = stream.join()
        print(f"the stream on {stream.pod.name} across the renewal ({stream.max_tokens} tokens): {streamed}")
        self.assertEqual(clients.failed, [])
        self.assertGreater(streamed["before"], 0)
        self.assertTrue(streamed["running"], f"the stream ended before every port served its new certificate: "
                        f"{streamed}")
        self.assertLess(streamed["before"], streamed["served"])
        self.assertEqual(streamed["end"], stream.max_tokens)

    def _rotate_ca(self, certificates, clients):
        """A CA rotation while the conversations run, as trust-manager and
        cert-manager would do it (deploy/k8s/README.md, "Rotation"): (1)
        every Secret's ca.crt and every client trust both CAs; (2) every
        Secret and tenant gets a certificate of the new CA; (3) the new CA
        alone. At each step every TLS port takes the step's certificates
        (within --tls_refresh, no restart) and the conversations go on
        without a failure; at the end a port takes no certificate of the old
        CA, and a client trusting only the old CA connects nowhere."""
        pods = [p for p in self.cluster.all_pods if not p.deleted]
        processes = {p.name: p.process.pid for p in pods}
        old_dir, old_ca = certificates.dir, certificates.ca
        old_identity = certificates.files(f"{DECODE}-tls")
        new_dir = certificates.new_ca()
        new_ca = os.path.join(new_dir, "ca.pem")
        new_probe = certificates.issue_by(new_dir, f"{DECODE}-tls")

        def publish():
            for name in certificates.secret_names():
                self.cluster.update_secret(name, certificates.secret(name))
            clients.client_options = certificates.client_options("tenant-a")

        def both():
            certificates.trust(old_dir, new_dir)
            publish()
            self._wait_taking("every TLS port takes a certificate of the new CA", certificates.ca, new_probe, True)

        def new_leaves():
            certificates.issue_everything_from(new_dir)
            publish()
            issued = {name: ssl.PEM_cert_to_DER_cert(certificates.secret(name)["tls.crt"].decode())
                      for name in certificates.secret_names()}
            self._wait_serving(certificates, issued, new_ca)

        def new_only():
            certificates.trust(new_dir)
            publish()
            self._wait_taking("every TLS port refuses a certificate of the old CA", new_ca, old_identity, False)
            self._wait_taking("every TLS port takes the new CA's", new_ca, certificates.files(f"{DECODE}-tls"),
                              True)

        self._across(clients, "CA rotation, step 1: both CAs trusted", both)
        self._across(clients, "CA rotation, step 2: certificates of the new CA", new_leaves)
        self._across(clients, "CA rotation, step 3: the new CA alone", new_only)
        self.assertEqual({p.name: p.process.pid for p in pods if p.process.poll() is None}, processes)
        # A client trusting only the old CA: every port's certificate fails
        # its verification; decode's client sees UNAVAILABLE.
        for pod in pods:
            with self.assertRaises(ssl.SSLCertVerificationError, msg=pod.name):
                served_certificate(f"{pod.ip}:{pod.port('grpc')}", pod.deployment.name, old_ca,
                                   certificates.files(f"{DECODE}-tls"))
        pod, target = self.cluster.pick(DECODE, "grpc")
        with Client(target, timeout=10, **{**certificates.client_options("tenant-a"), "tls_ca": old_ca}) as client:
            with self.assertRaises(HybridserveError) as refused:
                client.generate(encode_bytes("trusting the old CA", add_bos=True), max_tokens=1)
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAVAILABLE)
        print(f"CA rotated on all {len(pods)} pods without a restart; a client trusting only the old CA "
              f"connects to none, a certificate of the old CA is refused by all")


if __name__ == "__main__":
    _reexec_in_namespaces()
    unittest.main()
