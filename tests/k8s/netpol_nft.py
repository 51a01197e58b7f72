"""The rendered NetworkPolicies as nftables rules over pods that share one
network namespace, each on its own address (tests/k8s/local_cluster.py's
127.0.0.N), so the policies are enforced rather than only evaluated.

What the rules do, in the one `ip` table TABLE:
  - every flow is checked at the input hook, where a packet between two pods
    on the loopback arrives with both pods' addresses: a new flow from a pod
    some policy selects for Egress runs through that pod's egress chain (its
    rules' peers as destination addresses, their ports), then a new flow to
    a pod some policy selects for Ingress through that pod's ingress chain
    (peers as source addresses); a flow passes only if both allow it;
    replies and related ICMP (conntrack) always pass;
  - what no rule allows is rejected with ICMP admin-prohibited (the
    connecting socket sees EHOSTUNREACH at once: TCP at connect, UDP at the
    next receive), or with verdict="drop" silently dropped (the connect
    times out), as most CNI plugins do;
  - the node's address (NODE_IP: the kubelet's probes, the test's own
    clients) reaches every pod and every pod reaches it: NetworkPolicies
    always allow a pod's traffic with its node;
  - a pod process that connects without binding its source leaves from
    NODE_IP (the kernel's choice on the loopback) unless its pod has a gid
    (Pod.gid): a process running with that group id gets its new flows
    source-NATed to its pod's address at postrouting, as if it ran in the
    pod's own network namespace.

Semantics translated (networking.k8s.io/v1): a policy selects the pods of
its namespace its podSelector matches (empty: all), in the directions of its
policyTypes (default Ingress, plus Egress when it has egress rules); the
rules of every policy selecting a pod in a direction add up; a pod no policy
selects in a direction is open in it. A rule's peers: podSelector (pods of
the policy's namespace), namespaceSelector (all pods of the matching
namespaces), both (the intersection); no peers: any address. Its ports:
none listed: every port and protocol; a port entry without port: every port
of its protocol; a number (with endPort, a range); a name: the destination
pod's container port of that name and protocol (for ingress the selected
pod's, for egress each peer's; no peers: each known pod's). Only the given
pods are peers: a selector matching none of them matches nothing. ipBlock
peers are refused (the manifests' policy test refuses them too)."""

import os
import re
import shutil
import subprocess
from collections import namedtuple

import manifests

TABLE = "hybridserve_netpol"
NODE_IP = "127.0.0.1"
VERDICTS = {"reject": "reject with icmp type admin-prohibited", "drop": "drop"}
_PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}
# Debian installs nft in /usr/sbin, outside the PATH Bazel gives a test.
_SBIN = "/usr/sbin:/sbin"

# One pod at one address: endpoint is a manifests.Endpoint (namespace,
# labels, named ports); gid, when set, the group id its processes run with.
Pod = namedtuple("Pod", ["endpoint", "ip", "gid"], defaults=[None])


def _namespace_labels(objs, namespace):
    """A namespace's labels: the ones rendered, plus the name label the API
    server sets on every namespace."""
    labels = {"kubernetes.io/metadata.name": namespace}
    for ns in manifests.find(objs, "Namespace", namespace):
        labels.update(ns["metadata"].get("labels") or {})
    return labels


def _policy_types(policy):
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def _selecting(policies, pod, direction):
    ep = pod.endpoint
    return [p for p in policies
            if p["metadata"].get("namespace", "default") == ep.namespace
            and manifests.selector_matches(p["spec"].get("podSelector", {}), ep.labels)
            and direction in _policy_types(p)]


def _peer_pods(objs, peer, policy_ns, pods):
    if "ipBlock" in peer:
        raise ValueError(f"ipBlock peers are not translated: {peer}")
    pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
    found = []
    for pod in pods:
        ep = pod.endpoint
        if ns_sel is None:
            in_namespace = ep.namespace == policy_ns
        else:
            in_namespace = manifests.selector_matches(ns_sel, _namespace_labels(objs, ep.namespace))
        if in_namespace and (pod_sel is None or manifests.selector_matches(pod_sel, ep.labels)):
            found.append(pod)
    return found


def _port_matches(rule_ports, owner):
    """nft matches for a rule's ports, named ports resolved against `owner`
    (the pod whose container ports they name; None: numbers only). [""]
    when the rule lists no ports (all); [] when none can match."""
    if not rule_ports:
        return [""]
    matches = []
    for rp in rule_ports:
        protocol = rp.get("protocol", "TCP")
        proto = _PROTOCOLS[protocol]
        port = rp.get("port")
        if port is None:
            matches.append(f"meta l4proto {proto}")
        elif isinstance(port, str):
            numbers = [] if owner is None else sorted(
                {n for name, n, p in owner.endpoint.ports if name == port and p == protocol})
            matches += [f"meta l4proto {proto} th dport {n}" for n in numbers]
        elif "endPort" in rp:
            matches.append(f"meta l4proto {proto} th dport {port}-{rp['endPort']}")
        else:
            matches.append(f"meta l4proto {proto} th dport {port}")
    return matches


def _rule_matches(objs, rule, peers_key, addr, policy_ns, selected, pods, direction):
    """The nft matches (each one line's conditions) a rule allows for the
    selected pod in one direction."""
    peers = rule.get(peers_key)
    if not peers:
        if direction == "Ingress":
            return _port_matches(rule.get("ports"), selected)
        # Any destination: numbered ports anywhere, named ports at each known pod.
        ports = rule.get("ports") or []
        named = [rp for rp in ports if isinstance(rp.get("port"), str)]
        if not named:
            return _port_matches(ports, None)
        numbered = [rp for rp in ports if not isinstance(rp.get("port"), str)]
        matches = _port_matches(numbered, None) if numbered else []
        for pod in pods:
            matches += [f"ip daddr {pod.ip} {m}" for m in _port_matches(named, pod)]
        return matches
    matches = []
    for peer in peers:
        for pod in _peer_pods(objs, peer, policy_ns, pods):
            owner = selected if direction == "Ingress" else pod
            matches += [f"ip {addr} {pod.ip} {m}".rstrip() for m in _port_matches(rule.get("ports"), owner)]
    return matches


def _chain_name(direction, pod):
    return f"{direction.lower()}_{re.sub(r'[^A-Za-z0-9]', '_', pod.endpoint.name)}_{pod.ip.replace('.', '_')}"


def ruleset(objs, pods, verdict="reject", node_ip=NODE_IP):
    """The nft script (for `nft -f`) enforcing the NetworkPolicies among
    `objs` over `pods` (Pod tuples, distinct addresses). Replaces TABLE
    atomically when loaded over an earlier one."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r}: one of {sorted(VERDICTS)}")
    policies = manifests.find(objs, "NetworkPolicy")
    chains, jumps, snat = [], [], []
    for pod in pods:
        if pod.gid is not None:
            snat.append(f"meta skgid {pod.gid} snat to {pod.ip}")
        for direction, key, peers_key, addr, this in (("Egress", "egress", "to", "daddr", "saddr"),
                                                       ("Ingress", "ingress", "from", "saddr", "daddr")):
            selecting = _selecting(policies, pod, direction)
            if not selecting:
                continue
            # Egress allowed: on to the destination's ingress check; ingress allowed: accepted.
            allow = "counter return" if direction == "Egress" else "counter accept"
            lines = []
            for policy in selecting:
                policy_ns = policy["metadata"].get("namespace", "default")
                for rule in policy["spec"].get(key) or []:
                    lines += [f"{m} {allow}".strip() for m in
                              _rule_matches(objs, rule, peers_key, addr, policy_ns, pod, pods, direction)]
            name = _chain_name(direction, pod)
            chains.append(f"  chain {name} {{\n" + "".join(f"    {line}\n" for line in lines)
                          + f"    {VERDICTS[verdict]}\n  }}\n")
            jumps.append((direction, f"ip {this} {pod.ip} jump {name}"))
    ordered = [j for d, j in jumps if d == "Egress"] + [j for d, j in jumps if d == "Ingress"]
    body = "".join(chains)
    body += ("  chain input {\n    type filter hook input priority filter; policy accept;\n"
             "    ct state established,related accept\n"
             f"    ip saddr {node_ip} accept\n    ip daddr {node_ip} accept\n"
             + "".join(f"    {j}\n" for j in ordered) + "  }\n")
    body += ("  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n"
             + "".join(f"    {s}\n" for s in snat) + "  }\n")
    # Declaring the table first makes the delete valid when none exists yet.
    return f"table ip {TABLE}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n{body}}}\n"


def counts():
    """{(direction, pod address, peer address or None, port or None): packets}
    over the allow rules loaded now: what each let through (the first packet
    of each flow; a peer or port None where the rule names none)."""
    result, chain = {}, None
    for line in nft("list", "table", "ip", TABLE).splitlines():
        line = line.strip()
        m = re.match(r"chain (egress|ingress)_\S*_(\d+)_(\d+)_(\d+)_(\d+) \{", line)
        if line.startswith("chain "):
            chain = (m.group(1).capitalize(), ".".join(m.group(2, 3, 4, 5))) if m else None
            continue
        m = re.search(r"counter packets (\d+)", line)
        if m and chain is not None:
            peer = re.search(r"ip [sd]addr (\S+)", line)
            port = re.search(r"dport (\d+)", line)
            key = (*chain, peer.group(1) if peer else None, int(port.group(1)) if port else None)
            result[key] = result.get(key, 0) + int(m.group(1))
    return result


def nft(*args, script=None):
    """Runs nft (from the PATH, else /usr/sbin) in the caller's network
    namespace, `script` on its stdin; raises RuntimeError with nft's message
    when it fails."""
    path = shutil.which("nft", path=f"{os.environ.get('PATH', '')}:{_SBIN}")
    if path is None:
        raise FileNotFoundError("nft: not installed (tools/bootstrap.sh installs nftables)")
    run = subprocess.run([path, *args], input=script, text=True, capture_output=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: exit {run.returncode}: {run.stderr.strip()}")
    return run.stdout


def load(script):
    """Loads an nft script in the caller's network namespace (one
    transaction: all of it or, on an error, none)."""
    nft("-f", "-", script=script)


def unload():
    nft("delete", "table", "ip", TABLE)


class Enforcer:
    """Keeps the pods of a tests/k8s/local_cluster.Cluster under the
    NetworkPolicies: pass before_start as Cluster(before_start=...). Each
    new pod gets its own group id (GID_BASE + the last byte of its address)
    and, before its container starts, the rules over every pod so far and
    the `outside` pods (Pod tuples: clients, Prometheus) are loaded with it.
    Not thread-safe: the cluster creates pods from one thread."""

    GID_BASE = 20000

    def __init__(self, objs, outside=(), verdict="reject"):
        self.objs, self.verdict = objs, verdict
        self.outside = list(outside)
        self.pods = []

    def before_start(self, local_pod):
        gid = self.GID_BASE + int(local_pod.ip.rsplit(".", 1)[1])
        self.pods.append(pod_of(local_pod, gid))
        load(ruleset(self.objs, self.pods + self.outside, self.verdict))
        return gid


def pod_of(local_pod, gid=None):
    """A tests/k8s/local_cluster.Pod as a Pod here (its Deployment's
    namespace, its template's labels, its containers' named ports)."""
    ports = [(p.get("name"), p["containerPort"], p.get("protocol", "TCP"))
             for p in local_pod.container.get("ports", [])]
    endpoint = manifests.Endpoint(local_pod.name, local_pod.deployment.namespace, local_pod.labels, ports)
    return Pod(endpoint, local_pod.ip, gid)
