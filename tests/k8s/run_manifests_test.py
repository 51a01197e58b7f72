"""Runs what deploy/k8s/overlays/cpu declares, as local processes (how each
declared thing is mapped onto one host: tests/k8s/local_cluster.py), and
plays what a platform team does with it:

  1. the cachestore's shards (its StatefulSet's replicas), one prefill pod and
     one decode pod -> all Ready;
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
import ssl
import time
import unittest

import grpc

import local_cluster
import manifests
from hybridserve_client import Client, HybridserveError, encode_bytes
from manifest_run import (
    CACHESTORE,
    CONVERSATIONS,
    DECODE,
    MAX_TOKENS,
    MTLS_OVERLAY,
    OVERLAY,
    PREFILL,
    PREFILL_REPLICAS,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    STREAM_MARGIN_S,
    CallAcrossSigterm,
    Certificates,
    Conversations,
    StreamAcross,
    decode_cache_failures,
    decode_fallback_prefills,
    prefill_cache_failures,
    prefill_calls,
    raw_call,
    served_certificate,
    tls_credentials,
    ManifestRunCase,
    reexec_in_namespaces,
)

# The cachestore shards' certificate names their headless Service (the name
# the workers dial and verify), not the StatefulSet.
CACHESTORE_SHARDS = f"{CACHESTORE}-shards"


def tls_name(pod):
    """The name a pod's TLS certificate is verified against: its pool's Service."""
    return CACHESTORE_SHARDS if pod.deployment.name == CACHESTORE else pod.deployment.name


class RunManifestsTest(ManifestRunCase):

    def test_manifests_serve_scale_and_roll_without_a_failed_request(self):
        self._start(OVERLAY)
        self._with_logs_on_failure(lambda: self._scenario(Conversations(self.cluster)))

    def test_mtls_manifests_serve_scale_roll_and_renew_certificates_without_a_failed_request(self):
        certificates = Certificates(os.path.join(self.workdir, "certs"))
        self._start(MTLS_OVERLAY, certificates.secrets())
        clients = Conversations(self.cluster, certificates.client_options("tenant-a"))
        self._with_logs_on_failure(lambda: self._scenario(clients, certificates))

    def _scenario(self, clients, certificates=None):
        began = time.monotonic()
        deployments = self.cluster.deployments
        # 1. Each pool once the one it needs is Ready: every cachestore shard
        # the overlay declares (a StatefulSet), one prefill and one decode pod.
        deployments[CACHESTORE].scale(deployments[CACHESTORE].replicas, READY_TIMEOUT_S)
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
        # (the budgets of the cpu overlay are small), by class and reason,
        # over the shards.
        evictions = {}
        for shard in deployments[CACHESTORE].pods:
            for line in shard.metrics().splitlines():
                if line.startswith("hybridserve_cache_evictions_total{") and float(line.split()[1]) > 0:
                    key = line.split()[0].split("{", 1)[1].rstrip("}")
                    evictions[key] = evictions.get(key, 0) + float(line.split()[1])

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
        for deployment, method, name in ((PREFILL, "/hybridserve.v1.Prefill/Prefill", PREFILL),
                                         (CACHESTORE, "/hybridserve.v1.CacheStore/Stats", CACHESTORE_SHARDS)):
            pod = self.cluster.deployments[deployment].pods[0]
            address = f"{pod.ip}:{pod.port('grpc')}"
            self.assertEqual(raw_call(address, method, tls_credentials(certificates.ca, certificates.files("tenant-a")), name),
                             grpc.StatusCode.PERMISSION_DENIED, deployment)
            self.assertNotIn(raw_call(address, method, tls_credentials(certificates.ca, certificates.files(f"{DECODE}-tls")), name),
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
                served = served_certificate(address, tls_name(pod), ca, identity)
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
            code = raw_call(address, methods[pod.deployment.name], tls_credentials(ca, identity), tls_name(pod))
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
                served_certificate(f"{pod.ip}:{pod.port('grpc')}", tls_name(pod), old_ca,
                                   certificates.files(f"{DECODE}-tls"))
        pod, target = self.cluster.pick(DECODE, "grpc")
        with Client(target, timeout=10, **{**certificates.client_options("tenant-a"), "tls_ca": old_ca}) as client:
            with self.assertRaises(HybridserveError) as refused:
                client.generate(encode_bytes("trusting the old CA", add_bos=True), max_tokens=1)
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAVAILABLE)
        print(f"CA rotated on all {len(pods)} pods without a restart; a client trusting only the old CA "
              f"connects to none, a certificate of the old CA is refused by all")


if __name__ == "__main__":
    reexec_in_namespaces()
    unittest.main()
