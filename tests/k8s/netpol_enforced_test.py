"""The NetworkPolicies of every overlay enforced (tests/k8s/netpol_nft.py
turns them into nftables rules) and checked by connecting: each hybridserve
pool (the OpenAI gateway's included) gets two pods and each pod outside hybridserve the policies name
(manifests.OUTSIDE: a tenant-like client, a pod of the hybridserve namespace,
Prometheus, Grafana, cluster DNS) one, each on its own 127.0.0.N, with a
listener on every port its containers declare (TCP: accepting; UDP:
answering) plus UNDECLARED_PORT on the hybridserve pods. From each pod's
address to every other pod's every port, where either end is a hybridserve
pod, a flow must connect exactly when manifests.allowed_flows (the
policies' evaluator) and manifests.EXPECTED_FLOWS (the table) say so, and be
rejected (EHOSTUNREACH: ICMP admin-prohibited) otherwise; the node's address
reaches every port. Besides: a pod process that connects without binding
(as the binaries do) is seen with its pod's address and held to its pod's
policies; with the drop verdict a forbidden connect times out; and the cpu
overlay's real pods (tests/k8s/local_cluster.py, the rules reloaded before
each pod starts) serve a client pod's chat under the rules, resumed from the
cache, their flows counted by the allow rules from their own addresses, while
connections the policies forbid from a process in each pod (and from the
client pod) are rejected.

Runs in its own network and mount namespaces, re-executing itself under
`unshare` (root, or an unprivileged user namespace; the checks that run
processes under a pod's group id need root and are skipped without it)."""

import ast
import errno
import os
import select
import socket
import subprocess
import sys
import tempfile
import unittest

import local_cluster
import manifests
import netpol_nft

_NAMESPACED = "HS_NETPOL_NAMESPACED"
FIRST_HOST = 10  # pods from 127.0.0.10 on; 127.0.0.1 is the node
POOL_PODS = 2  # a pool's flows to itself are between two of its pods
UNDECLARED_PORT = 50099  # a listener on each hybridserve pod at a port no container declares
GID_BASE = 20000
# A loopback connect, its answer or its ICMP error come at once; this only
# bounds a wait that went wrong (reported as "timed out", a failure).
ATTEMPT_TIMEOUT_S = 5
# With the drop verdict a forbidden connect never gets an answer: it is
# given this long before it counts as timed out.
DROP_WAIT_S = 1
OPEN, REJECTED = "open", "rejected"

# The real stack (tests/k8s/local_cluster.py's pods count up from 127.0.0.2)
# and two pods outside it, each with its own group id.
CLIENT_IP, PROMETHEUS_IP = "127.0.0.200", "127.0.0.201"
DECODE, PREFILL, CACHESTORE = "hybridserve-decode", "hybridserve-prefill", "hybridserve-cachestore"
READY_TIMEOUT_S = 90
CHAT_TURNS = 3
# A process in a pod: connects without binding, prints the address it left from.
CONNECT = ("import socket, sys\n"
           "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
           "print(s.getsockname()[0])\n")
# A client pod's chat with decode: each turn a new connection; prints each
# turn's (finish_reason, cached_tokens).
CHAT = ("import sys\n"
        "from hybridserve_client import Client, encode_bytes\n"
        "history = encode_bytes('netpol: tell me a fortune, please.\\n', add_bos=True)\n"
        "turns = []\n"
        "for n in range(int(sys.argv[2])):\n"
        "    with Client(sys.argv[1], timeout=60) as client:\n"
        "        r = client.generate(history, max_tokens=6, temperature=0.0, ignore_eos=True, cache_salt='netpol')\n"
        "    turns.append((r.finish_reason.value, r.usage.cached_tokens))\n"
        "    history = history + list(r.token_ids) + encode_bytes('And another.\\n')\n"
        "print(turns)\n")


def _reexec_in_namespace():
    if os.environ.get(_NAMESPACED) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    os.environ[_NAMESPACED] = "1"
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    os.execvp("unshare", ["unshare", *user, "--net", "--mount", "--propagation", "private", "--", sys.executable,
                          *sys.argv])


def pods_of(objs, with_gids=False):
    """POOL_PODS pods a hybridserve component, one each OUTSIDE endpoint, at
    consecutive addresses; with_gids: each with its own group id."""
    pods = []
    for ep in manifests.endpoints(objs):
        copies = POOL_PODS if ep.name in manifests.POOLS else 1
        for _ in range(copies):
            host = FIRST_HOST + len(pods)
            pods.append(netpol_nft.Pod(ep, f"127.0.0.{host}", GID_BASE + host if with_gids else None))
    return pods


def ports_of(pod):
    """(port, protocol) of each listener a pod gets."""
    ports = [(number, protocol) for _, number, protocol in pod.endpoint.ports]
    if pod.endpoint.name in manifests.POOLS:
        ports.append((UNDECLARED_PORT, "TCP"))
    return ports


class Listeners:
    """A listening socket at each pod's address and port."""

    def __init__(self, pods):
        self.sockets = {}
        for pod in pods:
            for port, protocol in ports_of(pod):
                kind = socket.SOCK_STREAM if protocol == "TCP" else socket.SOCK_DGRAM
                s = socket.socket(socket.AF_INET, kind)
                # The previous listeners' accepted connections may linger in TIME_WAIT.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((pod.ip, port))
                if protocol == "TCP":
                    s.listen(64)
                self.sockets[(pod.ip, port, protocol)] = s

    def close(self):
        for s in self.sockets.values():
            s.close()


def attempt(listeners, src_ip, dst_ip, port, protocol):
    """OPEN when a socket bound to src_ip reaches the listener (TCP: the
    connection is accepted; UDP: the datagram arrives and the answer comes
    back), REJECTED on EHOSTUNREACH, else what happened."""
    kind = socket.SOCK_STREAM if protocol == "TCP" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as s:
        s.settimeout(ATTEMPT_TIMEOUT_S)
        if src_ip is not None:
            s.bind((src_ip, 0))
        try:
            s.connect((dst_ip, port))
            server = listeners.sockets[(dst_ip, port, protocol)]
            if protocol == "TCP":
                conn, _ = server.accept()
                conn.close()
                return OPEN
            s.send(b"?")
            readable, _, _ = select.select([s, server], [], [], ATTEMPT_TIMEOUT_S)
            if server in readable:
                data, peer = server.recvfrom(16)
                server.sendto(data, peer)
            s.recv(16)
            return OPEN
        except socket.timeout:
            return "timed out"
        except OSError as e:
            return REJECTED if e.errno == errno.EHOSTUNREACH else f"{errno.errorcode.get(e.errno, e.errno)}: {e}"


def other_gids_usable():
    """Whether processes can run under group ids other than the test's (root;
    not an unprivileged user namespace, which maps only the test's own)."""
    try:
        subprocess.run(["true"], group=GID_BASE, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


class NetpolEnforcedTest(unittest.TestCase):

    def tearDown(self):
        try:
            netpol_nft.unload()
        except RuntimeError:
            pass  # none loaded

    def _flows(self, pods, listeners):
        """{(from, to, port, protocol): {outcome: [address pairs]}} over
        every pair of pods where either is a hybridserve pod."""
        outcomes = {}
        for src in pods:
            for dst in pods:
                if src is dst or (src.endpoint.name not in manifests.POOLS
                                  and dst.endpoint.name not in manifests.POOLS):
                    continue
                for port, protocol in ports_of(dst):
                    outcome = attempt(listeners, src.ip, dst.ip, port, protocol)
                    flow = (src.endpoint.name, dst.endpoint.name, port, protocol)
                    outcomes.setdefault(flow, {}).setdefault(outcome, []).append((src.ip, dst.ip))
        return outcomes

    def test_every_flow_is_what_the_policies_allow(self):
        for overlay in manifests.overlays():
            with self.subTest(overlay=overlay):
                objs = manifests.render(overlay)
                pods = pods_of(objs)
                listeners = Listeners(pods)
                try:
                    netpol_nft.load(netpol_nft.ruleset(objs, pods))
                    outcomes = self._flows(pods, listeners)
                    node = {(pod.endpoint.name, port, protocol): attempt(listeners, netpol_nft.NODE_IP, pod.ip, port,
                                                                         protocol)
                            for pod in pods for port, protocol in ports_of(pod)}
                finally:
                    listeners.close()
                odd = {f: o for f, o in outcomes.items() if set(o) - {OPEN, REJECTED} or len(o) != 1}
                self.assertEqual(odd, {}, "flows neither open nor rejected, or not alike for every pod pair")
                opened = {f for f, o in outcomes.items() if OPEN in o}
                self.assertEqual(sorted(opened - manifests.allowed_flows(objs)), [], "open, the policies deny")
                self.assertEqual(sorted(manifests.allowed_flows(objs) - opened), [], "the policies allow, rejected")
                self.assertEqual(opened, manifests.EXPECTED_FLOWS)
                self.assertEqual({k: v for k, v in node.items() if v != OPEN}, {}, "the node reaches every port")
                attempts = sum(len(pairs) for o in outcomes.values() for pairs in o.values())
                print(f"{overlay}: {attempts} connections over {len(outcomes)} flows: "
                      f"{len(opened)} open, {len(outcomes) - len(opened)} rejected; node to {len(node)} ports: open")

    @unittest.skipUnless(other_gids_usable(), "processes under other group ids need root")
    def test_a_pod_process_without_a_bound_source_is_held_to_its_pods_policies(self):
        objs = manifests.render("cpu")
        pods = pods_of(objs, with_gids=True)
        by_name = {}
        for pod in pods:
            by_name.setdefault(pod.endpoint.name, pod)
        decode, prefill, cachestore = by_name["decode"], by_name["prefill"], by_name["cachestore"]
        gateway, client = by_name["gateway"], by_name["client"]
        listeners = Listeners(pods)

        def from_process(gid, dst, port):
            """A process with group id gid connects, unbound: (its exit
            status, its stderr's last line, the address the listener saw or
            None)."""
            run = subprocess.run([sys.executable, "-c", CONNECT, dst.ip, str(port)], group=gid, capture_output=True,
                                 text=True, timeout=30, check=False)
            seen = None
            if run.returncode == 0:
                conn, peer = listeners.sockets[(dst.ip, port, "TCP")].accept()
                conn.close()
                seen = peer[0]
            return run.returncode, (run.stderr.strip().splitlines() or [""])[-1], seen

        try:
            netpol_nft.load(netpol_nft.ruleset(objs, pods))
            allowed = [(decode, prefill, 50061), (decode, cachestore, 50051), (prefill, decode, 50070),
                       (prefill, cachestore, 50052), (gateway, decode, 50050), (client, gateway, 8080)]
            for src, dst, port in allowed:
                self.assertEqual(from_process(src.gid, dst, port), (0, "", src.ip), f"{src.endpoint.name} -> {port}")
            forbidden = [(decode, cachestore, 9090), (prefill, decode, 50050), (prefill, prefill, 50061),
                         (cachestore, decode, 50050), (decode, prefill, UNDECLARED_PORT),
                         # The gateway reaches decode's client port alone.
                         (gateway, cachestore, 50051), (gateway, cachestore, 50052), (gateway, prefill, 50061),
                         (gateway, decode, 50070), (gateway, decode, 9090), (gateway, gateway, 8080),
                         (decode, gateway, 8080), (client, gateway, UNDECLARED_PORT)]
            for src, dst, port in forbidden:
                if src is dst:
                    dst = [p for p in pods if p.endpoint is src.endpoint and p is not src][0]
                self.assertEqual(from_process(src.gid, dst, port), (1, "OSError: [Errno 113] No route to host", None),
                                 f"{src.endpoint.name} -> {dst.endpoint.name}:{port}")
            # A process of no pod is the node's: a kubelet probe, a scrape by the test.
            self.assertEqual(from_process(0, cachestore, 9090), (0, "", netpol_nft.NODE_IP))
        finally:
            listeners.close()

    def test_with_the_drop_verdict_a_forbidden_connect_times_out(self):
        objs = manifests.render("cpu")
        pods = pods_of(objs)
        by_name = {}
        for pod in pods:
            by_name.setdefault(pod.endpoint.name, pod)
        client, decode, cachestore = by_name["client"], by_name["decode"], by_name["cachestore"]
        listeners = Listeners(pods)
        try:
            netpol_nft.load(netpol_nft.ruleset(objs, pods, verdict="drop"))
            self.assertEqual(attempt(listeners, client.ip, decode.ip, 50050, "TCP"), OPEN)
            with socket.socket() as s:
                s.bind((client.ip, 0))
                s.settimeout(DROP_WAIT_S)
                with self.assertRaises(socket.timeout):
                    s.connect((cachestore.ip, 50051))
        finally:
            listeners.close()

    @unittest.skipUnless(other_gids_usable(), "processes under other group ids need root")
    def test_the_stack_serves_under_the_policies_and_its_pods_reach_nothing_else(self):
        objs = manifests.render("cpu")
        outside = {e.name: e for e in manifests.OUTSIDE}
        client = netpol_nft.Pod(outside["client"], CLIENT_IP, GID_BASE + 200)
        prometheus = netpol_nft.Pod(outside["prometheus"], PROMETHEUS_IP, GID_BASE + 201)
        enforcer = netpol_nft.Enforcer(objs, [client, prometheus])
        workdir = tempfile.mkdtemp(prefix="netpol-", dir=os.environ.get("TEST_TMPDIR"))
        cluster = local_cluster.Cluster(objs, workdir, before_start=enforcer.before_start)
        cluster.start()
        try:
            for name in (CACHESTORE, PREFILL, DECODE):
                cluster.deployments[name].scale(1, READY_TIMEOUT_S)
            self._serve_and_refuse(cluster, enforcer, client, prometheus)
        except BaseException:
            for pod in cluster.all_pods:
                print(f"--- {pod.name} ({pod.ip}) log tail:\n{pod.log_tail()}")
            raise
        finally:
            cluster.teardown()
        self.assertEqual(cluster.failures, [])

    def _serve_and_refuse(self, cluster, enforcer, client, prometheus):
        pods = {n: cluster.deployments[n].pods[0] for n in (DECODE, PREFILL, CACHESTORE)}
        gids = {p.ip: p.gid for p in enforcer.pods + enforcer.outside}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

        def in_pod(ip, *argv):
            return subprocess.run([sys.executable, "-c", *argv], group=gids[ip], env=env, capture_output=True,
                                  text=True, timeout=180, check=False)

        # The chat from the client pod: decode calls prefill, prefill writes
        # to decode's data port, both use the cachestore; later turns resume.
        chat = in_pod(CLIENT_IP, CHAT, f"{pods[DECODE].ip}:{pods[DECODE].port('grpc')}", str(CHAT_TURNS))
        self.assertEqual(chat.returncode, 0, chat.stderr)
        turns = ast.literal_eval(chat.stdout.strip().splitlines()[-1])
        self.assertEqual([reason for reason, _ in turns], ["length"] * CHAT_TURNS)
        self.assertTrue(all(cached > 0 for _, cached in turns[1:]), f"(finish_reason, cached_tokens): {turns}")
        calls = [line for line in pods[PREFILL].metrics().splitlines()
                 if line.startswith('hybridserve_prefill_requests_total{outcome="ok"}')]
        self.assertTrue(calls and float(calls[0].split()[-1]) > 0, f"prefill served no call: {calls}")
        # The pods' own connections passed the rules as the pods' addresses
        # (counted by the allow rules; rules reloaded at each pod's start, so
        # flows opened since decode started).
        decode, prefill, cachestore = pods[DECODE].ip, pods[PREFILL].ip, pods[CACHESTORE].ip
        hits = {k: v for k, v in netpol_nft.counts().items() if v}
        needed = [("Ingress", decode, None, 50050), ("Egress", decode, prefill, 50061),
                  ("Ingress", prefill, decode, 50061), ("Egress", prefill, decode, 50070),
                  ("Ingress", decode, prefill, 50070), ("Egress", decode, cachestore, 50051),
                  ("Ingress", cachestore, decode, 50051)]
        self.assertEqual([k for k in needed if k not in hits], [], f"flows the rules let through: {hits}")
        self.assertGreaterEqual(hits[("Ingress", decode, None, 50050)], CHAT_TURNS)

        def connect(src_ip, dst, port):
            run = in_pod(src_ip, CONNECT, dst.ip, str(port))
            return run.returncode, (run.stderr.strip().splitlines() or [""])[-1]

        # Prometheus scrapes every pod; from a process in each pod, and from the
        # client pod, what no policy allows is rejected.
        for pod in pods.values():
            self.assertEqual(connect(PROMETHEUS_IP, pod, pod.port("metrics")), (0, ""), pod.name)
            self.assertGreater(netpol_nft.counts().get(("Ingress", pod.ip, PROMETHEUS_IP, 9090), 0), 0, pod.name)
        refused = (1, "OSError: [Errno 113] No route to host")
        forbidden = [(DECODE, CACHESTORE, "metrics"), (DECODE, PREFILL, "metrics"), (PREFILL, DECODE, "grpc"),
                     (CACHESTORE, DECODE, "grpc"), (CACHESTORE, PREFILL, "grpc"),
                     (None, CACHESTORE, "grpc"), (None, CACHESTORE, "bulk"), (None, PREFILL, "grpc"),
                     (None, DECODE, "data"), (None, DECODE, "metrics")]
        for src, dst, port in forbidden:
            src_ip = CLIENT_IP if src is None else pods[src].ip
            self.assertEqual(connect(src_ip, pods[dst], pods[dst].port(port)), refused, f"{src} -> {dst} {port}")
        print(f"chat under the policies: (finish_reason, cached_tokens) {turns}; flows let through since decode "
              f"started: {sorted(hits.items(), key=str)}; {len(forbidden)} forbidden connections refused")


if __name__ == "__main__":
    _reexec_in_namespace()
    unittest.main()
