#!/usr/bin/env python3
"""Issue 49's goals on the real processes: a shard killed under a replay, and a cachestore rollout with a disk tier.

    python3 bench/cachestore/build_traces.py --out_dir=/tmp/hs-traces --only=sharegpt
    bazel build -c opt //cachestore/server:cachestore //prefill:prefill //decode:decode
    /usr/bin/python3 bench/cachestore/scale_out_replay.py --mode=kill [--shards=4] [--conversations=120]
    /usr/bin/python3 bench/cachestore/scale_out_replay.py --mode=restart [--conversations=120]

Both replay the trace's first --conversations conversations through cachestore(s), one prefill and
one decode worker on loopback (models/default), as bench/serving/replay_trace.py does (its turn
rule, caps and issue times), with budgets large enough that nothing is evicted, so every later turn
should resume exactly at its previous turn's end. A turn's *hit ratio* is its cached tokens over
that expected resume point; the goals are stated in those terms.

--mode=kill: --shards cachestores, the workers given all of them (--cachestore=a,b,c,d). Once
--kill_after of the turns have finished, shard --victim gets SIGKILL; once --rejoin_after have, it
starts again on the same port, empty. Printed: the
failed requests (goal 0), the hit ratio of the later turns in windows (before the kill, four
windows between the kill and the rejoin, two after the rejoin; goal: the first window after the
kill loses at most about 1/shards, later windows recover; the rejoined shard, restarted empty,
costs its conversations one miss each again), and the workers' calls to the killed shard.

--mode=restart: one cachestore with a disk tier (--disk_dir in a temporary directory). Phase 1
replays the first half of every conversation's turns; once the workers' publications have settled
the cachestore gets SIGTERM (it spills memory to disk), starts again on the same port and the same
directory, and phase 2 replays the rest. Printed: the share of conversations whose first turn after
the restart resumed at its previous turn's end (goal >= 95 %), beside the same run without a disk
tier (the control: a cachestore restarted empty).

Exit status 1 when a service dies unexpectedly or a request fails.
"""

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serving"))
from multiturn_table import start  # noqa: E402  (also puts client/python on the path)
from replay_trace import DEFAULT_FLOPS_PER_CONTEXT_TOKEN, DEFAULT_FLOPS_PER_TOKEN, load_turns, metric_sum, replay  # noqa: E402,E501
from hybridserve_client import Client  # noqa: E402

BOS_PROBE = 257
BIG = ["--page_budget_mib=4096", "--state_budget_mib=4096"]


class Procs:
    """Named processes on loopback; restartable cachestores keep their ports."""

    def __init__(self, args, name):
        self.args, self.logdir = args, os.path.join(args.logdir, name)
        os.makedirs(self.logdir, exist_ok=True)
        self.procs, self.ports, self.argv = {}, {}, {}

    def start(self, name, argv, ready, port=0, log_suffix=""):
        full = argv + [f"--address=127.0.0.1:{port}", "--metrics_address=127.0.0.1:0"]
        p, f = start(name + log_suffix, full, ready, self.logdir)
        self.procs[name], self.argv[name] = p, argv
        self.ports[name] = (int(f["port"]), int(f["metrics_port"]))
        return self.ports[name][0]

    def restart(self, name, ready, suffix):
        """Starts `name` again with its arguments on its port."""
        return self.start(name, self.argv[name], ready, port=self.ports[name][0], log_suffix=suffix)

    def metrics(self, name):
        return urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name][1]}/metrics", timeout=5).read().decode()

    def dead(self, expected=()):
        return [f"{n} exited with {p.poll()} (logs in {self.logdir})" for n, p in self.procs.items()
                if p.poll() is not None and n not in expected]

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)


def start_workers(procs, args, cache_targets):
    b, model = args.bin, f"--model_dir={args.model_dir}"
    cache = f"--cachestore={','.join(cache_targets)}"
    pf = procs.start("prefill", [f"{b}/prefill/prefill", model, cache], "PREFILL_READY")
    procs.start("decode", [f"{b}/decode/decode", model, cache, f"--prefill=127.0.0.1:{pf}"], "DECODE_READY")


def ratio(records):
    later = [r for r in records if r["turn"] > 0 and r["expected"] > 0]
    exp = sum(r["expected"] for r in later)
    return (sum(min(r["cached"], r["expected"]) for r in later) / exp if exp else float("nan")), len(later)


def settle(procs, timeout=30.0):
    """Waits until decode has no publication in flight and the cachestore's entry count holds still."""
    deadline, last, same = time.monotonic() + timeout, None, 0
    while time.monotonic() < deadline:
        body = procs.metrics("cachestore")
        now = (metric_sum(body, "hybridserve_cache_bytes"), metric_sum(body, "hybridserve_cache_puts_total"))
        same = same + 1 if now == last else 0
        if same >= 3:
            return True
        last = now
        time.sleep(0.6)  # the cachestore syncs its gauges every 500 ms
    return False


def wait_reconnected(procs, client, timeout=30.0):
    """Sends one-token probe requests until the restarted cachestore has seen a lookup (prefill) and a
    put (decode's turn end): both workers' channels are back."""
    deadline, i = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        client.generate([BOS_PROBE, 1 + i % 250, 2, 3], 1, temperature=0.0, ignore_eos=True)
        body = procs.metrics("cachestore")
        if (metric_sum(body, "hybridserve_cache_lookups_total") > 0
                and metric_sum(body, "hybridserve_cache_puts_total") > 0):
            return True
        i += 1
        time.sleep(0.1)
    return False


def run_kill(args, turns):
    procs = Procs(args, "kill")
    problems = []
    try:
        targets = []
        for i in range(args.shards):
            port = procs.start(f"shard{i}", [f"{args.bin}/cachestore/server/cachestore"] + BIG + args.cache_flags,
                               "CACHESTORE_READY")
            targets.append(f"127.0.0.1:{port}")
        start_workers(procs, args, targets)
        victim = f"shard{args.victim}"
        marks = {}
        done = [0]
        lock = threading.Condition()
        stop = threading.Event()

        def watcher():
            n = len(turns)
            with lock:
                while not stop.is_set() and done[0] < args.kill_after * n:
                    lock.wait(0.2)
            if stop.is_set():
                return
            procs.procs[victim].send_signal(signal.SIGKILL)
            procs.procs[victim].wait()
            marks["kill"] = time.monotonic()
            print(f"killed {victim} after {done[0]} turns", flush=True)
            with lock:
                while not stop.is_set() and done[0] < args.rejoin_after * n:
                    lock.wait(0.2)
            if stop.is_set():
                return
            marks["rejoin"] = time.monotonic()  # the workers may see it as soon as it listens
            procs.restart(victim, "CACHESTORE_READY", ".rejoined")
            print(f"{victim} rejoined after {done[0]} turns", flush=True)

        w = threading.Thread(target=watcher, daemon=True)
        w.start()
        with Client(f"127.0.0.1:{procs.ports['decode'][0]}", timeout=args.request_timeout) as client:
            orig = client.generate

            def counted(*a, **k):
                try:
                    return orig(*a, **k)
                finally:
                    with lock:
                        done[0] += 1
                        lock.notify_all()
            client.generate = counted
            records, errors, _ = replay(args, turns, client)
        stop.set()
        w.join()
        problems += errors + procs.dead(expected=() if "rejoin" in marks else (victim,))
        print(f"\n{args.shards} shards, {len(records)} turns, {len(errors)} failed requests")
        if "kill" not in marks:
            problems.append("the replay ended before the kill")
            return problems
        kill, rejoin = marks["kill"], marks.get("rejoin", float("inf"))
        rows = [("before the kill", [r for r in records if r["done"] < kill])]
        span = (min(rejoin, max(r["done"] for r in records)) - kill) / 4
        for q in range(4):
            lo, hi = kill + q * span, kill + (q + 1) * span
            rows.append((f"kill + {q}/4 .. {q + 1}/4 of the outage", [r for r in records if lo <= r["issued"] < hi]))
        if rejoin < float("inf"):
            end = max(r["issued"] for r in records)
            half = rejoin + (end - rejoin) / 2
            rows.append(("rejoin .. first half of the rest", [r for r in records if rejoin <= r["issued"] < half]))
            rows.append(("second half of the rest", [r for r in records if r["issued"] >= half]))
        print("| window (by issue time) | later turns | hit tokens / expected |")
        print("| --- | --- | --- |")
        for name, rs in rows:
            h, n = ratio(rs)
            print(f"| {name} | {n} | {h:.3f} |")
        name = targets[args.victim]
        for w in ("prefill", "decode"):
            body = procs.metrics(w)
            print(f"{w}: calls to {victim} ({name}) that failed: "
                  f"{metric_sum(body, 'hybridserve_cache_shard_failures_total', shard=name):.0f} of "
                  f"{metric_sum(body, 'hybridserve_cache_shard_calls_total', shard=name):.0f}; answered at once while "
                  f"it was down: {metric_sum(body, 'hybridserve_cache_shard_refused_total', shard=name):.0f}; "
                  f"up now: {metric_sum(body, 'hybridserve_cache_shard_up', shard=name):.0f}")
        if args.cache_flags:
            print(f"cachestore flags: {' '.join(args.cache_flags)}")
        return problems
    finally:
        procs.close()


def run_restart(args, turns, disk):
    name = "restart_disk" if disk else "restart_control"
    procs = Procs(args, name)
    problems = []
    with tempfile.TemporaryDirectory(prefix="hs-disk-") as d:
        try:
            flags = BIG + args.cache_flags + ([f"--disk_dir={d}", f"--disk_budget_mib={args.disk_budget_mib}"]
                                              if disk else [])
            port = procs.start("cachestore", [f"{args.bin}/cachestore/server/cachestore"] + flags, "CACHESTORE_READY")
            start_workers(procs, args, [f"127.0.0.1:{port}"])
            per_conv = {}
            for t in turns:
                per_conv.setdefault(t[0], []).append(t)
            first = [t for ts in per_conv.values() for t in ts[:max(1, len(ts) // 2)]]
            second = [t for ts in per_conv.values() for t in ts[max(1, len(ts) // 2):]]
            first.sort(key=lambda t: t[2])
            second.sort(key=lambda t: t[2])
            history = {}
            with Client(f"127.0.0.1:{procs.ports['decode'][0]}", timeout=args.request_timeout) as client:
                r1, e1, _ = replay(args, first, client, history)
                problems += e1
                if e1:
                    return problems, (0, 0)
                if not settle(procs):
                    problems.append("the cachestore did not settle after phase 1")
                before = procs.metrics("cachestore")
                t0 = time.monotonic()
                procs.procs["cachestore"].send_signal(signal.SIGTERM)
                rc = procs.procs["cachestore"].wait()
                down = time.monotonic() - t0
                procs.restart("cachestore", "CACHESTORE_READY", ".restarted")
                up = time.monotonic() - t0
                if not wait_reconnected(procs, client):
                    problems.append("the workers did not reach the restarted cachestore")
                time.sleep(0.6)  # the cachestore syncs its gauges every 500 ms
                after = procs.metrics("cachestore")
                r2, e2, _ = replay(args, second, client, history)
                problems += e2
            problems += procs.dead()
            seen, firsts = set(), []
            for r in sorted(r2, key=lambda r: r["issued"]):
                if r["conv"] not in seen:
                    seen.add(r["conv"])
                    if r["expected"] > 0:
                        firsts.append(r)
            hits = sum(r["cached"] >= r["expected"] for r in firsts)
            h, n = ratio(r2)
            print(f"\n[{'disk tier' if disk else 'control: no disk tier'}] SIGTERM -> exit {rc} in {down:.2f} s, "
                  f"ready again at {up:.2f} s; bytes before {metric_sum(before, 'hybridserve_cache_bytes') / 2**20:.1f} MiB, "
                  f"disk entries after restart {metric_sum(after, 'hybridserve_cache_disk_entries'):.0f}")
            print(f"[{'disk tier' if disk else 'control'}] first turn after the restart resumed at its previous "
                  f"turn's end: {hits} of {len(firsts)} conversations ({100.0 * hits / max(1, len(firsts)):.1f} %); "
                  f"phase 2 hit tokens / expected {h:.3f} over {n} later turns; phase 1 {len(r1)} turns")
            return problems, (hits, len(firsts))
        finally:
            procs.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("kill", "restart"), required=True)
    ap.add_argument("--trace", default="/tmp/hs-traces/sharegpt.jsonl")
    ap.add_argument("--model_dir", default="models/default")
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--conversations", type=int, default=120)
    ap.add_argument("--time_scale", type=float, default=0.05)
    ap.add_argument("--max_user", type=int, default=512)
    ap.add_argument("--max_reply", type=int, default=32)
    ap.add_argument("--max_context", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--victim", type=int, default=1)
    ap.add_argument("--kill_after", type=float, default=0.33, help="share of the turns finished before the kill")
    ap.add_argument("--rejoin_after", type=float, default=0.66, help="share finished before the shard restarts")
    ap.add_argument("--disk_budget_mib", type=int, default=4096)
    ap.add_argument("--cache_flag", dest="cache_flags", action="append", default=[],
                    help="an extra cachestore flag (repeatable)")
    ap.add_argument("--no_control", action="store_true", help="restart: skip the run without a disk tier")
    ap.add_argument("--request_timeout", type=float, default=120)
    ap.add_argument("--flops_per_token", type=float, default=DEFAULT_FLOPS_PER_TOKEN)
    ap.add_argument("--flops_per_context_token", type=float, default=DEFAULT_FLOPS_PER_CONTEXT_TOKEN)
    ap.add_argument("--logdir", default="/tmp/scale_out_replay")
    args = ap.parse_args()
    _, turns = load_turns(args.trace, args)
    print(f"{args.conversations} conversations of {args.trace} ({len(turns)} turns); command: "
          + " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv), flush=True)
    if args.mode == "kill":
        problems = run_kill(args, turns)
    else:
        problems, _ = run_restart(args, turns, disk=True)
        if not args.no_control:
            p2, _ = run_restart(args, turns, disk=False)
            problems += p2
    for p in problems:
        print(f"ERROR {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
