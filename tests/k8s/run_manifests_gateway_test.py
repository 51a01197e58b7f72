"""The OpenAI gateway pool as deploy/k8s/overlays/cpu and cpu-mtls declare it,
run as local processes with the rest of the stack (tests/k8s/local_cluster.py:
its init container's model copy, its HTTP probes, its API keys Secret as the
kubelet lays a Secret volume out, its Service by the hosts file), and used as
a client uses it, over HTTP through the Service's name:

  1. the cachestore and prefill (one pod each), two decode pods, then two
     gateway pods, Ready (their readiness: /health, 200 once decode answers);
  2. /v1/models refuses a request without a key and with an unknown key (401)
     and lists the model for a key of the Secret;
  3. a tenant's second turn (/v1/completions, its first prompt and answer
     continued) resumes from the cache (cached_tokens > 0), and another
     tenant's identical prompt resumes nothing (0): tenants apart;
  3b. each gateway pod's requests reach every decode pod (each decode pod's
     hybridserve_request_success_total rises while requests go to one
     gateway pod at a time): the gateway dials the headless Service
     hybridserve-decode-pods, whose name resolves to every ready decode pod,
     and balances round robin over them. decode's ClusterIP Service
     hybridserve-decode is emulated as kube-proxy makes it (a virtual IP,
     each connection to one pod: local_cluster.Cluster(virtual_ips=)), so a
     gateway dialing it would keep its one connection on one decode pod;
  4. the API keys Secret edited (a key added, one removed), as the kubelet
     swaps the volume: the added key is taken and the removed one refused
     within the gateway's reload (no restart);
  5. (cpu) a rolling update of decode, then one of the gateway, each under a
     loop of requests to the gateway: none fails, and no probe failure or
     SIGKILL (each drain within its grace period). Decode's: each old decode
     pod leaves the headless name's answer at its deletion, but the gateway's
     channel holds its connection until the pod's server shuts down, and the
     pod refuses new calls (UNAVAILABLE) while it drains; the gateway's retry
     policy sends those to the next decode pod (gateway/hybridserve_gateway/
     backend.py), and it re-resolves the name as soon as a connection ends
     (a second apart at least, not gRPC's default 30 s), so it never waits on
     addresses of pods already gone.
On cpu-mtls the gateway calls decode with its own certificate (made at test
time as components/mtls/cert-manager would issue it), decode trusts it as a
proxy (--trusted_proxies) and takes each request's tenant from its header:
step 3's isolation is decode's; and a direct gRPC client with a tenant
certificate still works beside it.

Runs in its own network and mount namespaces (unshare), as run_manifests_test."""

import json
import os
import threading
import time
import unittest
import urllib.error
import urllib.request

import manifests
from hybridserve_client import Client, encode_bytes
from hybridserve_gateway.keys import hash_key
from manifest_run import (
    CACHESTORE,
    DECODE,
    MTLS_OVERLAY,
    OVERLAY,
    PREFILL,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    Certificates,
    ManifestRunCase,
    metric_sum,
    reexec_in_namespaces,
)

GATEWAY = "hybridserve-gateway"
GATEWAY_PODS = 2
DECODE_PODS = 2
# Requests to one gateway pod until every decode pod's counter rose (round
# robin: DECODE_PODS would do; the rest covers the gateway's own calls to
# decode taking turns and a counter lagging its final message).
BALANCE_MAX_REQUESTS = 8 * DECODE_PODS
FINISHED = "hybridserve_request_success_total"
KEYS = {"hs-test-acme-key": "acme", "hs-test-globex-key": "globex"}
ADDED_KEY, ADDED_TENANT = "hs-test-initech-key", "initech"
# The gateway polls its keys file once a second; the kubelet's sync is
# immediate here.
KEY_RELOAD_TIMEOUT_S = 10
MAX_TOKENS = 6
PROMPT = "The gateway's own conversation, word for word, turn one.\n"


def keys_secret(keys):
    """The Secret hybridserve-gateway-api-keys as the operator makes it."""
    lines = "".join(f"sha256:{hash_key(key)} {tenant}\n" for key, tenant in keys.items())
    return {manifests.API_KEYS_SECRET: {manifests.API_KEYS_KEY: ("# test keys\n" + lines).encode()}}


def call(path, body=None, key=None, host=GATEWAY):
    """(status, JSON body) of a request to the gateway Service by its name
    (the hosts file: its ready pods), or to `host` (a pod's IP)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"http://{host}:{manifests.GATEWAY_PORTS['http']}{path}",
                                     data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def complete(key, prompt, model, host=GATEWAY):
    status, body = call("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                            "temperature": 0}, key, host)
    if status != 200:
        raise AssertionError(f"/v1/completions: {status} {body}")
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


class RunManifestsGatewayTest(ManifestRunCase):

    def test_gateway_serves_reloads_keys_and_rolls_without_a_failed_request(self):
        self._start(OVERLAY, keys_secret(KEYS), virtual_ips=(DECODE,))
        self._with_logs_on_failure(self._scenario)

    def test_mtls_gateway_is_decodes_trusted_proxy(self):
        certificates = Certificates(os.path.join(self.workdir, "certs"))
        self.assertIn(f"{GATEWAY}-tls", certificates.secret_names())
        self._start(MTLS_OVERLAY, {**certificates.secrets(), **keys_secret(KEYS)}, virtual_ips=(DECODE,))
        self._with_logs_on_failure(lambda: self._scenario(certificates))

    def _scenario(self, certificates=None):
        deployments = self.cluster.deployments
        for name in (CACHESTORE, PREFILL):
            deployments[name].scale(1, READY_TIMEOUT_S)
        deployments[DECODE].scale(DECODE_PODS, READY_TIMEOUT_S)
        deployments[GATEWAY].scale(GATEWAY_PODS, READY_TIMEOUT_S)
        # 2. Keys.
        self.assertEqual(call("/v1/models")[0], 401)
        self.assertEqual(call("/v1/models", key="hs-test-unknown")[0], 401)
        status, models = call("/v1/models", key="hs-test-acme-key")
        self.assertEqual(status, 200, models)
        self.model = models["data"][0]["id"]
        print(f"models: {[m['id'] for m in models['data']]}")
        # 3. A tenant's conversation resumes; another tenant's copy does not.
        text, cached = complete("hs-test-acme-key", PROMPT, self.model)
        second = PROMPT + text + "\nAnd then?\n"
        _, cached_acme = complete("hs-test-acme-key", second, self.model)
        _, cached_globex = complete("hs-test-globex-key", second, self.model)
        print(f"cached tokens: acme's first turn {cached}, its second {cached_acme}; globex sending acme's second "
              f"{cached_globex}")
        self.assertGreater(cached_acme, 0)
        self.assertEqual(cached_globex, 0)
        # 3b. Each gateway pod reaches every decode pod.
        self._each_gateway_pod_reaches_every_decode_pod()
        if certificates is not None:
            # A direct gRPC client with a tenant certificate, beside the gateway.
            with Client(f"{DECODE}:50050", timeout=REQUEST_TIMEOUT_S,
                        **certificates.client_options("tenant-a")) as client:
                r = client.generate(encode_bytes("direct, beside the gateway\n", add_bos=True), max_tokens=MAX_TOKENS,
                                    temperature=0.0, ignore_eos=True)
            self.assertEqual(r.finish_reason.value, "length")
        # 4. The Secret edited: acme's key removed, initech's added.
        self.cluster.update_secret(manifests.API_KEYS_SECRET, keys_secret(
            {"hs-test-globex-key": "globex", ADDED_KEY: ADDED_TENANT})[manifests.API_KEYS_SECRET])
        self.cluster.wait(lambda: call("/v1/models", key=ADDED_KEY)[0] == 200
                          and call("/v1/models", key="hs-test-acme-key")[0] == 401,
                          KEY_RELOAD_TIMEOUT_S, "the edited keys taken by every gateway pod")
        for _ in range(2 * GATEWAY_PODS):
            self.assertEqual(call("/v1/models", key=ADDED_KEY)[0], 200)
        if certificates is None:
            self._roll_under_load(DECODE)
            self._roll_under_load()
        self.assertEqual(self.cluster.failures, [])

    def _each_gateway_pod_reaches_every_decode_pod(self):
        """3b. Requests to one gateway pod at a time (its IP, not the
        Service's name), until each decode pod finished one more request
        (at most BALANCE_MAX_REQUESTS, none started after REQUEST_TIMEOUT_S)."""
        decode_pods = self.cluster.deployments[DECODE].pods
        self.assertEqual(len(decode_pods), DECODE_PODS)
        for gateway in self.cluster.deployments[GATEWAY].pods:
            before = {p.name: metric_sum(p.metrics(), FINISHED) for p in decode_pods}
            rose = {}
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            for i in range(BALANCE_MAX_REQUESTS):
                if time.monotonic() > deadline:
                    break
                complete("hs-test-globex-key", f"balanced request {i} through {gateway.name}\n", self.model,
                         gateway.ip)
                rose = {p.name: metric_sum(p.metrics(), FINISHED) - before[p.name] for p in decode_pods}
                if all(rose.values()):
                    break
            print(f"{gateway.name}: {i + 1} requests, finished by each decode pod in addition: {rose}")
            self.assertTrue(all(rose.values()), f"{gateway.name}'s requests reached only some decode pods "
                            f"in {BALANCE_MAX_REQUESTS} requests: {rose}")

    def _roll_under_load(self, name=GATEWAY):
        """5. The Deployment `name` (decode's, the gateway's) rolls while a
        client loops over requests to the gateway Service."""
        stop, sent, failed = threading.Event(), [0], []

        def loop():
            while not stop.is_set():
                try:
                    complete(ADDED_KEY, "a request across the gateway's rollout\n", self.model)
                except Exception as e:  # pylint: disable=broad-except  # every failure is the test's
                    failed.append(repr(e))
                sent[0] += 1

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        terminations = []
        try:
            self.cluster.wait(lambda: sent[0] >= 3, READY_TIMEOUT_S, "requests before the rollout")
            before = sent[0]
            self.cluster.deployments[name].rollout(3 * READY_TIMEOUT_S, terminations)
            for t in terminations:
                t.join()
            self.cluster.wait(lambda: sent[0] >= before + 6, READY_TIMEOUT_S, "requests after the rollout")
        finally:
            stop.set()
            thread.join(REQUEST_TIMEOUT_S)
        print(f"{name} rollout: {sent[0]} requests, {len(failed)} failed {failed[:3]}")
        self.assertEqual(failed, [])


if __name__ == "__main__":
    reexec_in_namespaces()
    unittest.main()
