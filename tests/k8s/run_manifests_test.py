"""Runs what deploy/k8s/overlays/cpu declares, as local processes (how each
declared thing is mapped onto one host: tests/k8s/local_cluster.py), and
plays what a platform team does with it:

  1. the cachestore, one prefill pod and one decode pod -> all Ready;
  2. a three-turn chat through the decode Service; turns 2 and 3 resume from
     the cache (cached_tokens > 0);
  3. 8 conversations start and run on to the end; prefill scales 1 -> 3 and
     decode sends calls to both new pods (their request counters, scraped
     from their declared metrics ports, move);
  4. a rolling update of decode, then of prefill, as the Deployment
     controller and the kubelet do it (strategy, readiness gate, endpoint
     removal, preStop sleep, SIGTERM, SIGKILL at the grace period's end).
     Besides the conversations, a client that connected to the old decode
     pod before its endpoint removal starts a long generation just before
     that pod's SIGTERM: it runs across the SIGTERM, the drain lets it
     finish (so a grace period too short for the drain is a SIGKILL, and a
     failure).

Zero failed requests: any non-OK status or a final message with
finish_reason ERROR or ABORT fails the test (clients retry nothing; each
turn is a new connection to a ready decode endpoint, as a ClusterIP
balances connections), and every turn after a conversation's first resumes
from the cache. So does any kubelet restart (failed startup or liveness
probe, a container that exits, a SIGKILL) and any pod that never turns Ready.

The test runs in its own network namespace (the pods bind the manifests'
fixed ports on 127.0.0.N, apart from anything else on the machine) and mount
namespace (the hosts file over /etc/hosts): it re-executes itself under
`unshare` (root, or an unprivileged user namespace)."""

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import local_cluster
import manifests
from hybridserve_client import Client, FinishReason, HybridserveError, encode_bytes

_NAMESPACED = "HS_K8S_RUN_NAMESPACED"

OVERLAY = "cpu"
DECODE, PREFILL, CACHESTORE = "hybridserve-decode", "hybridserve-prefill", "hybridserve-cachestore"
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
# A pod turns Ready within its startup probe's window (scaled) and a few
# readiness periods; this bounds every wait for it.
READY_TIMEOUT_S = 90
PREFILL_REPLICAS = 3


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

    def __init__(self, cluster):
        self.cluster = cluster
        self.lock = threading.Lock()
        self.sent = 0
        self.failed = []
        self.turns_after_first = 0
        self.resumed = 0
        self.stopping = threading.Event()
        self.threads = []

    def turn(self, history, tag):
        """One Generate call; returns its tokens, or None when it failed."""
        pod, target = self.cluster.pick(DECODE, "grpc")
        self.count_sent()
        try:
            with Client(target, timeout=REQUEST_TIMEOUT_S) as client:
                result = client.generate(history, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                                         cache_salt="k8s")
        except HybridserveError as e:
            self.failed_call(f"{tag} on {pod.name}: {e.code} {e}")
            return None, None
        except Exception as e:  # pylint: disable=broad-except  # e.g. StreamProtocolError: a failure too
            self.failed_call(f"{tag} on {pod.name}: {e!r}")
            return None, None
        if result.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
            self.failed_call(f"{tag} on {pod.name}: finish_reason {result.finish_reason} {result.error_message}")
            return None, None
        return result.token_ids, result.usage.cached_tokens

    def count_sent(self):
        with self.lock:
            self.sent += 1

    def failed_call(self, message):
        with self.lock:
            self.failed.append(message)

    def chat(self, name, turns):
        """One conversation; returns each turn's cached_tokens."""
        history = encode_bytes(f"{name}: tell me a fortune, please.\n", add_bos=True)
        cached = []
        for n in range(turns):
            tokens, cached_tokens = self.turn(history, f"{name} turn {n + 1}")
            if tokens is None:
                break
            cached.append(cached_tokens)
            if n > 0:
                with self.lock:
                    self.turns_after_first += 1
                    self.resumed += cached_tokens > 0
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
        self.client = Client(f"{pod.ip}:{pod.port('grpc')}", timeout=REQUEST_TIMEOUT_S)
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
        time.sleep(max(0.0, self.pod.deleted_at + self.pod.prestop_s - LONG_CALL_LEAD_S - time.monotonic()))
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


def prefill_calls(pod):
    """Prefill calls a pod answered, from its metrics."""
    for line in pod.metrics().splitlines():
        if line.startswith('hybridserve_prefill_requests_total{outcome="ok"}'):
            return float(line.split()[-1])
    return 0.0


class RunManifestsTest(unittest.TestCase):

    def setUp(self):
        random.seed(26)
        self.workdir = tempfile.mkdtemp(prefix="k8s-run-", dir=os.environ.get("TEST_TMPDIR"))
        self.objs = manifests.render(OVERLAY)
        self.cluster = local_cluster.Cluster(self.objs, self.workdir)
        self.cluster.start()

    def tearDown(self):
        self.cluster.teardown()

    def test_manifests_serve_scale_and_roll_without_a_failed_request(self):
        try:
            self._scenario()
        except BaseException:
            for pod in self.cluster.all_pods:
                print(f"--- {pod.name} ({pod.ip}) log tail:\n{pod.log_tail()}")
            raise

    def _scenario(self):
        began = time.monotonic()
        deployments = self.cluster.deployments
        # 1. Each pool once the one it needs is Ready.
        deployments[CACHESTORE].scale(1, READY_TIMEOUT_S)
        deployments[PREFILL].scale(1, READY_TIMEOUT_S)
        deployments[DECODE].scale(1, READY_TIMEOUT_S)
        print(f"all Ready after {time.monotonic() - began:.1f} s")

        # 2. A three-turn chat.
        clients = Conversations(self.cluster)
        cached = clients.chat("the three-turn chat", 3)
        self.assertEqual(clients.failed, [])
        self.assertEqual(len(cached), 3)
        self.assertTrue(all(c > 0 for c in cached[1:]), f"cached_tokens of the three turns: {cached}")
        print(f"three-turn chat: cached_tokens {cached}")

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

        # 4. Rolling updates under traffic.
        terminations = []
        across = CallAcrossSigterm(clients, deployments[DECODE].pods[0])
        deployments[DECODE].rollout(READY_TIMEOUT_S, terminations)
        deployments[PREFILL].rollout(3 * READY_TIMEOUT_S, terminations)
        for t in terminations:
            t.join()
        across.join()
        rolled_prefill = {p.name: prefill_calls(p) for p in deployments[PREFILL].pods}
        clients.stop()

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
        self.assertEqual(clients.resumed, clients.turns_after_first)
        self.assertEqual(len(rolled), 1 + PREFILL_REPLICAS)
        self.assertTrue(all(calls > 0 for calls in rolled_prefill.values()), rolled_prefill)
        # The long call was running (its first token out) when its pod got SIGTERM.
        self.assertLess(across.first_token, across.pod.sigterm_at)
        self.assertGreater(across.ended, across.pod.sigterm_at)


if __name__ == "__main__":
    _reexec_in_namespaces()
    unittest.main()
