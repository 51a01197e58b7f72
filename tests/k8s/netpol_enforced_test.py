"""The NetworkPolicies of every overlay enforced (tests/k8s/netpol_nft.py
turns them into nftables rules) and checked by connecting: each hybridserve
pool gets two pods and each pod outside hybridserve the policies name
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
policies; and with the drop verdict a forbidden connect times out.

Runs in its own network namespace, re-executing itself under `unshare`
(root, or an unprivileged user namespace; the unbound-socket check needs
root: it runs processes under other group ids)."""

import errno
import os
import select
import socket
import subprocess
import sys
import unittest

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


def _reexec_in_namespace():
    if os.environ.get(_NAMESPACED) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    os.environ[_NAMESPACED] = "1"
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    os.execvp("unshare", ["unshare", *user, "--net", "--", sys.executable, *sys.argv])


def pods_of(objs, with_gids=False):
    """POOL_PODS pods a hybridserve component, one each OUTSIDE endpoint, at
    consecutive addresses; with_gids: each with its own group id."""
    pods = []
    for ep in manifests.endpoints(objs):
        copies = POOL_PODS if ep.name in manifests.COMPONENTS else 1
        for _ in range(copies):
            host = FIRST_HOST + len(pods)
            pods.append(netpol_nft.Pod(ep, f"127.0.0.{host}", GID_BASE + host if with_gids else None))
    return pods


def ports_of(pod):
    """(port, protocol) of each listener a pod gets."""
    ports = [(number, protocol) for _, number, protocol in pod.endpoint.ports]
    if pod.endpoint.name in manifests.COMPONENTS:
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


class NetpolEnforcedTest(unittest.TestCase):

    def tearDown(self):
        try:
            netpol_nft.unload()
        except RuntimeError:
            pass  # none loaded

    def _flows(self, objs, pods, listeners):
        """{(from, to, port, protocol): {outcome: [address pairs]}} over
        every pair of pods where either is a hybridserve pod."""
        outcomes = {}
        for src in pods:
            for dst in pods:
                if src is dst or (src.endpoint.name not in manifests.COMPONENTS
                                  and dst.endpoint.name not in manifests.COMPONENTS):
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
                    outcomes = self._flows(objs, pods, listeners)
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

    def test_a_pod_process_without_a_bound_source_is_held_to_its_pods_policies(self):
        objs = manifests.render("cpu")
        pods = pods_of(objs, with_gids=True)
        by_name = {}
        for pod in pods:
            by_name.setdefault(pod.endpoint.name, pod)
        decode, prefill, cachestore = by_name["decode"], by_name["prefill"], by_name["cachestore"]
        listeners = Listeners(pods)
        connect = ("import socket, sys\n"
                   "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
                   "print(s.getsockname()[0])\n")

        def from_process(gid, dst, port):
            """A process with group id gid connects, unbound: (its exit
            status, its stderr's last line, the address the listener saw or
            None)."""
            try:
                run = subprocess.run([sys.executable, "-c", connect, dst.ip, str(port)], group=gid,
                                     capture_output=True, text=True, timeout=30, check=False)
            except PermissionError as e:
                self.skipTest(f"processes under other group ids need root: {e}")
            seen = None
            if run.returncode == 0:
                conn, peer = listeners.sockets[(dst.ip, port, "TCP")].accept()
                conn.close()
                seen = peer[0]
            return run.returncode, (run.stderr.strip().splitlines() or [""])[-1], seen

        try:
            netpol_nft.load(netpol_nft.ruleset(objs, pods))
            allowed = [(decode, prefill, 50061), (decode, cachestore, 50051), (prefill, decode, 50070),
                       (prefill, cachestore, 50052)]
            for src, dst, port in allowed:
                self.assertEqual(from_process(src.gid, dst, port), (0, "", src.ip), f"{src.endpoint.name} -> {port}")
            forbidden = [(decode, cachestore, 9090), (prefill, decode, 50050), (prefill, prefill, 50061),
                         (cachestore, decode, 50050), (decode, prefill, UNDECLARED_PORT)]
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


if __name__ == "__main__":
    _reexec_in_namespace()
    unittest.main()
