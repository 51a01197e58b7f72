#!/usr/bin/env python3
"""Replays a scaled multi-turn trace through the three real processes, LRU against utility eviction.

    python3 bench/cachestore/build_traces.py --out_dir=/tmp/hs-traces --only=sharegpt
    bazel build -c opt //cachestore/server:cachestore //prefill:prefill //decode:decode
    /usr/bin/python3 bench/serving/replay_trace.py [--trace=/tmp/hs-traces/sharegpt.jsonl] [--conversations=200] \
        [--time_scale=0.125] [--budget_fraction=0.0625] [--blend=0] [--out_md=...] [--out_csv=...]
    /usr/bin/python3 bench/serving/replay_trace.py --conversations=3 --smoke   # self-check, ~3 s

For each policy (unlimited, then --policies) a fresh cachestore, prefill and decode worker start on
loopback (models/default) and replay the trace's first --conversations conversations. Turn k's
prompt is <bos> + user_0 + generated_0 + ... + generated_{k-1} + user_k: user_i by the trace's
rule (bench/cachestore/trace.cc TokenRule::Append, 1 byte = 1 token, ids < 256) cut to --max_user
tokens; generated_i what the model generated (greedy, EOS ignored, min(reply, --max_reply) tokens).
A conversation ends before the turn that would pass --max_context tokens. Turns are issued in the
trace's order at (arrival - first arrival) x --time_scale from --concurrency client threads; a
turn whose previous turn has not finished is issued when it does.

Budgets: --page_budget_bytes / --state_budget_bytes, or --budget_fraction of the working set the
unlimited run measures (what its cachestore holds at the end, resident + index metadata, per
class), rounded to the nearest MiB (the cachestore's unit; at least 1).

Per policy: TTFT (client side: the call to its first streamed token), prefill's computed and
cache-hit tokens, the cachestore's evictions and CPU time, turns resumed exactly at their previous
turn's end; then utility / LRU of each, in the same run. Exit status 1 when a service dies, a
request fails (the replay stops there) or (--smoke) a later turn does not resume at its previous
turn's end.
"""

import argparse
import concurrent.futures
import contextlib
import csv
import heapq
import json
import math
import os
import platform
import re
import shlex
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multiturn_table import start  # noqa: E402  (also puts client/python on the path)
from hybridserve_client import Client, FinishReason, HybridserveError  # noqa: E402

BOS = 257
MASK = (1 << 64) - 1
MIB = 1 << 20
# models/default's prefill cost, from cache_sim's stderr (bench/cachestore/model_cost.cc):
# "2.188e+06 FLOPs/token + 1024 per context token".
DEFAULT_FLOPS_PER_TOKEN = 2.188e6
DEFAULT_FLOPS_PER_CONTEXT_TOKEN = 1024


def mix(x):
    """SplitMix64's finalizer, as bench/cachestore/trace.cc Mix."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def rule_tokens(owner, turn, segment, n, vocab=256):
    """The first n ids of TokenRule::Append(owner, turn, segment, ...) at 1 unit per token."""
    base = mix(mix(mix(owner) ^ turn) ^ segment)
    return [mix(base ^ i) % vocab for i in range(n)]


def load_turns(path, args):
    """[(conv, turn, arrival_s, user_ids, reply_len)] in trace order, conversations and lengths capped."""
    with open(path) as f:
        header = json.loads(f.readline())
        if header.get("format") != "hybridserve-trace/1" or header.get("unit") != "bytes":
            sys.exit(f"{path}: not a hybridserve-trace/1 trace in bytes")
        rows = [json.loads(line) for line in f if line.strip()]
    context, stopped, turns = {}, set(), []
    for r in rows:
        c = r["conv"]
        if c >= args.conversations or c in stopped:
            continue
        user = []
        if r.get("shared", -1) >= 0:  # a shared prefix is owned by its shared id (trace.h)
            user = rule_tokens(r["shared"], 0, 0, r["shared_units"])
        user = (user + rule_tokens(c, r["turn"], 1, max(1, r["user"])))[:args.max_user]
        reply = min(max(1, r["reply"]), args.max_reply)
        n = context.get(c, 1) + len(user)
        if n + reply > args.max_context:
            stopped.add(c)
            continue
        context[c] = n + reply
        turns.append((c, r["turn"], r["t"], user, reply))
    return header, turns


def metric_sum(body, name, **labels):  # the sum of every series of `name` whose labels include `labels`
    return sum(float(m.group(2)) for m in re.finditer(r"^" + re.escape(name) + r"(\{[^}]*\})? (\S+)$", body, re.M)
               if all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()))


class Stack:
    """cachestore + prefill + decode on loopback; close() stops them."""

    def __init__(self, args, name, cache_flags):
        self.logdir = os.path.join(args.logdir, name)
        os.makedirs(self.logdir, exist_ok=True)
        self.procs, self.ports = [], {}
        b, model = args.bin, f"--model_dir={args.model_dir}"
        loop = ["--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0"]
        try:
            self._start("cachestore", [f"{b}/cachestore/server/cachestore"] + loop + cache_flags, "CACHESTORE_READY")
            cache = f"--cachestore=127.0.0.1:{self.ports['cachestore'][0]}"
            self._start("prefill", [f"{b}/prefill/prefill", model, cache] + loop, "PREFILL_READY")
            prefill = f"--prefill=127.0.0.1:{self.ports['prefill'][0]}"
            self._start("decode", [f"{b}/decode/decode", model, cache, prefill] + loop, "DECODE_READY")
        except BaseException:
            self.close()
            raise

    def _start(self, name, argv, ready):
        p, f = start(name, argv, ready, self.logdir)
        self.procs.append((name, p))
        self.ports[name] = (int(f["port"]), int(f["metrics_port"]))

    def dead(self):
        return [f"{name} exited with {p.poll()} (log {self.logdir}/{name}.log)" for name, p in self.procs
                if p.poll() is not None]

    def metrics(self, name):
        return urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name][1]}/metrics", timeout=5).read().decode()

    def cpu_seconds(self, name):  # user + system CPU time the process has used (Linux /proc)
        with open(f"/proc/{dict(self.procs)[name].pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for _, p in self.procs:
            p.wait()


def replay(args, turns, client, history=None):
    """Issues every turn; returns (per-turn records, errors, issue lags).

    `history` (conversation -> (tokens so far, expected resume)) carries conversations across calls: a
    later call given the same dict goes on where the earlier one left each conversation."""
    by_conv = {}
    for i, t in enumerate(turns):
        by_conv.setdefault(t[0], []).append(i)
    nxt = {i: conv[k + 1] for conv in by_conv.values() for k, i in enumerate(conv[:-1])}
    t0 = time.monotonic() + 0.5
    due = lambda i: t0 + (turns[i][2] - turns[0][2]) * args.time_scale  # noqa: E731
    cv = threading.Condition()
    ready = [(due(conv[0]), conv[0]) for conv in by_conv.values()]
    heapq.heapify(ready)
    records, errors = {}, []
    history = {} if history is None else history
    remaining, lags = [len(turns)], []  # lags: call start - due time, seconds

    def run(i, when):
        lags.append(time.monotonic() - when)
        conv, k, _, user, reply = turns[i]
        prev, expected = history.get(conv, ([BOS], 0))
        prompt = prev + user
        rec = None
        try:
            r = client.generate(prompt, reply, temperature=0.0, ignore_eos=True, timeout=args.request_timeout)
            if r.finish_reason == FinishReason.ERROR or r.ttft_seconds is None:
                raise RuntimeError(f"finish {r.finish_reason.value}: {r.error_message}")
            n, c = len(prompt), r.usage.cached_tokens
            rec = {"ttft": r.ttft_seconds, "prompt": len(prompt), "turn": k, "conv": conv, "cached": c,
                   "expected": expected, "issued": when, "done": time.monotonic(),
                   # the model's prefill cost of the tokens past the resume point (the cachestore's utility rule)
                   "flops": args.flops_per_token * (n - c) + args.flops_per_context_token * (n * n + n - c * c - c) / 2,
                   "resumed": k > 0 and r.usage.cached_tokens == expected, "short": len(r.token_ids) != reply,
                   "late": when > due(i)}
            history[conv] = (prompt + list(r.token_ids), len(prompt) + len(r.token_ids) - 1)
        except (HybridserveError, RuntimeError) as e:
            errors.append(f"conversation {conv} turn {k}: {e}")
        except Exception as e:  # noqa: BLE001  (a bug here must stop the replay, not hang it)
            errors.append(f"conversation {conv} turn {k}: {type(e).__name__}: {e}")
        with cv:
            remaining[0] -= 1
            if rec is not None:
                records[i] = rec
                if i in nxt:
                    j = nxt[i]
                    heapq.heappush(ready, (max(due(j), time.monotonic()), j))
            else:  # the conversation cannot go on: its later turns are not issued
                j = i
                while j in nxt:
                    j = nxt[j]
                    remaining[0] -= 1
            cv.notify()

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        with cv:
            while remaining[0] > 0 and not errors:  # the first failed request stops the replay
                if ready and ready[0][0] <= time.monotonic():
                    when, i = heapq.heappop(ready)
                    pool.submit(run, i, when)
                    continue
                cv.wait(timeout=None if not ready else max(0.0, ready[0][0] - time.monotonic()))
    return [records[i] for i in sorted(records)], errors, lags


def held(body, cls):
    """Bytes a cachestore class holds: resident entries plus their index metadata."""
    return sum(metric_sum(body, "hybridserve_cache_bytes", **{"class": cls, "state": s})
               for s in ("resident", "metadata"))


def percentile(values, q):  # nearest rank
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else float("nan")


def run_policy(args, turns, name, cache_flags):
    print(f"[{name}] starting the stack: cachestore {' '.join(cache_flags) or '(defaults)'}", flush=True)
    with contextlib.closing(Stack(args, name, cache_flags)) as stack:
        with Client(f"127.0.0.1:{stack.ports['decode'][0]}", timeout=args.request_timeout) as client:
            t = time.monotonic()
            records, errors, lags = replay(args, turns, client)
            wall = time.monotonic() - t
        time.sleep(1.2)  # the cachestore syncs its gauges and counters every 500 ms
        problems = errors + stack.dead()
        if problems:
            return None, problems
        pf, cs, dc = (stack.metrics(n) for n in ("prefill", "cachestore", "decode"))
        cpu = {n: stack.cpu_seconds(n) for n in ("cachestore", "prefill", "decode")}
    ttft = [r["ttft"] for r in records]
    row = {
        "policy": name, "turns": len(records), "wall_s": wall,
        "ttft_mean_ms": 1e3 * sum(ttft) / len(ttft), "ttft_p50_ms": 1e3 * percentile(ttft, 0.5),
        "ttft_p99_ms": 1e3 * percentile(ttft, 0.99),
        "prompt_tokens": sum(r["prompt"] for r in records),
        "computed_tokens": metric_sum(pf, "hybridserve_prefill_computed_tokens_total"),
        "hit_tokens": metric_sum(pf, "hybridserve_prefix_cache_hits_total"),
        "computed_gflops": sum(r["flops"] for r in records) / 1e9,
        "recomputed_tokens": metric_sum(pf, "hybridserve_prefill_recomputed_tokens_total"),
        "prefill_resume_s": metric_sum(pf, "hybridserve_prefill_resume_seconds_sum"),
        "prefill_compute_s": metric_sum(pf, "hybridserve_prefill_compute_seconds_sum"),
        "parent_waits_expired": metric_sum(dc, "hybridserve_decode_publish_parent_waits_expired_total"),
        "page_evictions": metric_sum(cs, "hybridserve_cache_evictions_total", **{"class": "page"}),
        "state_evictions": metric_sum(cs, "hybridserve_cache_evictions_total", **{"class": "state"}),
        "cachestore_cpu_s": cpu["cachestore"], "prefill_cpu_s": cpu["prefill"], "decode_cpu_s": cpu["decode"],
        "resumed_at_prev_end": sum(r["resumed"] for r in records),
        "later_turns": sum(r["turn"] > 0 for r in records),
        "delayed_by_prev_turn": sum(r["late"] for r in records),
        "short_replies": sum(r["short"] for r in records),
        "issue_lag_max_ms": 1e3 * max(lags, default=0.0),
        "page_working_set": held(cs, "page"), "state_working_set": held(cs, "state"),
    }
    print(f"[{name}] {row['turns']} turns in {wall:.1f} s: TTFT mean {row['ttft_mean_ms']:.1f} ms, "
          f"p99 {row['ttft_p99_ms']:.1f} ms; computed {row['computed_tokens']:.0f}, hit {row['hit_tokens']:.0f} tokens",
          flush=True)
    return row, []


COLUMNS = [("turns", "turns", "{:.0f}"), ("ttft_mean_ms", "TTFT mean, ms", "{:.1f}"),
           ("ttft_p50_ms", "TTFT p50, ms", "{:.1f}"), ("ttft_p99_ms", "TTFT p99, ms", "{:.1f}"),
           ("prompt_tokens", "prompt tokens", "{:.0f}"), ("computed_tokens", "prefill computed tokens", "{:.0f}"),
           ("hit_tokens", "cache hit tokens", "{:.0f}"), ("computed_gflops", "computed GFLOPs (model cost)", "{:.0f}"),
           ("prefill_compute_s", "prefill compute, s", "{:.1f}"), ("page_evictions", "pages evicted", "{:.0f}"),
           ("state_evictions", "states evicted", "{:.0f}"),
           ("resumed_at_prev_end", "turns resumed at prev. turn's end", "{:.0f}"),
           ("cachestore_cpu_s", "cachestore CPU, s", "{:.1f}"), ("wall_s", "wall, s", "{:.1f}")]


def table(rows, budget_note):
    out = ["| policy | budget | " + " | ".join(c[1] for c in COLUMNS) + " |",
           "| --- | --- |" + " --- |" * len(COLUMNS)]
    for r in rows:
        out.append(f"| {r['policy']} | {budget_note(r)} | "
                   + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + " |")
    by = {r["policy"].split(" ")[0]: r for r in rows}
    if "lru" in by and "utility" in by:
        ratio = lambda k: by["utility"][k] / by["lru"][k] if by["lru"][k] else float("nan")  # noqa: E731
        out.append("| utility / LRU | same | " + " | ".join(f"{ratio(k):.3f}" for k, _, _ in COLUMNS) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="/tmp/hs-traces/sharegpt.jsonl")
    ap.add_argument("--model_dir", default="models/default")
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--conversations", type=int, default=200, help="the trace's first N conversations")
    ap.add_argument("--time_scale", type=float, default=0.125, help="issue time = trace time x this")
    ap.add_argument("--max_user", type=int, default=2048, help="tokens of a turn's user text at most")
    ap.add_argument("--max_reply", type=int, default=128, help="tokens generated a turn at most")
    ap.add_argument("--max_context", type=int, default=4096, help="prompt + reply tokens a conversation may reach")
    ap.add_argument("--concurrency", type=int, default=16, help="turns in flight at most (client threads)")
    ap.add_argument("--policies", default="lru,utility")
    ap.add_argument("--blend", type=float, default=0.0, help="utility: --utility_recency_blend")
    ap.add_argument("--flops_per_token", type=float, default=DEFAULT_FLOPS_PER_TOKEN)
    ap.add_argument("--flops_per_context_token", type=float, default=DEFAULT_FLOPS_PER_CONTEXT_TOKEN)
    ap.add_argument("--page_budget_bytes", type=int, default=0)
    ap.add_argument("--state_budget_bytes", type=int, default=0)
    ap.add_argument("--budget_fraction", type=float, default=1 / 16,
                    help="budgets as this fraction of the working set the unlimited run measures")
    ap.add_argument("--no_unlimited", action="store_true", help="skip the unlimited row (explicit budgets only)")
    ap.add_argument("--request_timeout", type=float, default=300)
    ap.add_argument("--smoke", action="store_true", help="self-check: unlimited only, at once; every later turn "
                    "must resume at its previous turn's end")
    ap.add_argument("--logdir", default="/tmp/replay_trace")
    ap.add_argument("--out_csv", default="")
    ap.add_argument("--out_md", default="")
    args = ap.parse_args()
    explicit = args.page_budget_bytes > 0 and args.state_budget_bytes > 0
    if args.no_unlimited and not explicit:
        sys.exit("--no_unlimited needs --page_budget_bytes and --state_budget_bytes")
    if args.max_user + args.max_reply + 1 > args.max_context:
        sys.exit("--max_context must hold <bos>, --max_user and --max_reply")
    policies = [p for p in args.policies.split(",") if p]
    if args.smoke:
        args.time_scale, args.no_unlimited, policies = 0.0, False, []
    elif any(p not in ("lru", "utility") for p in policies):
        sys.exit(f"--policies: lru and/or utility, not {args.policies}")
    header, turns = load_turns(args.trace, args)
    if not turns:
        sys.exit(f"{args.trace}: no turns")
    started = time.monotonic()
    caps = (f"{args.conversations} conversations of {header.get('name')} ({len(turns)} turns), issue times = trace "
            f"times x {args.time_scale}, {args.concurrency} client threads; caps: user text {args.max_user} tokens "
            f"a turn, reply min(trace, {args.max_reply}) tokens, context {args.max_context} tokens")
    print(caps, flush=True)
    rows, problems = [], []

    def one(name, flags):
        row, errs = run_policy(args, turns, name, flags)
        problems.extend(f"[{name}] {e}" for e in errs)
        rows.extend([row] if row else [])
        return row

    unlimited = None
    if not args.no_unlimited:
        unlimited = one("unlimited", [])
        if unlimited and (unlimited["page_evictions"] or unlimited["state_evictions"]):
            problems.append("[unlimited] the cachestore evicted: its default budgets are not unlimited here")
    page_mib = state_mib = 0
    if explicit or unlimited:
        f = 1 if explicit else args.budget_fraction
        want = ((args.page_budget_bytes, args.state_budget_bytes) if explicit else
                (unlimited["page_working_set"], unlimited["state_working_set"]))
        page_mib, state_mib = (max(1, round(f * b / MIB)) for b in want)
    budget = [f"--page_budget_mib={page_mib}", f"--state_budget_mib={state_mib}"]
    for p in policies if not problems else []:
        flags = budget + [f"--eviction={p}"]
        if p == "utility":
            flags += [f"--utility_flops_per_token={args.flops_per_token:g}",
                      f"--utility_flops_per_token_context={args.flops_per_context_token:g}",
                      f"--utility_recency_blend={args.blend:g}"]
        one(p if p == "lru" else f"utility (blend {args.blend:g})", flags)

    if args.smoke and unlimited and unlimited["resumed_at_prev_end"] != unlimited["later_turns"]:
        problems.append(f"[smoke] {unlimited['later_turns'] - unlimited['resumed_at_prev_end']} of "
                        f"{unlimited['later_turns']} later turns did not resume at their previous turn's end")
    note = lambda r: ("default (4096 MiB each)" if r["policy"] == "unlimited"  # noqa: E731
                      else f"pages {page_mib} MiB, states {state_mib} MiB")
    md = table(rows, note)
    total = time.monotonic() - started
    lines = [f"Trace: {args.trace} ({header.get('source', '')})", "", caps + ".", ""]
    if unlimited:
        lines.append(f"Working set (the unlimited run's cachestore at its end, resident + index metadata): "
                     f"pages {unlimited['page_working_set'] / MIB:.1f} MiB, "
                     f"states {unlimited['state_working_set'] / MIB:.1f} MiB"
                     + ("; budgets given in bytes." if explicit else
                        f"; budgets {args.budget_fraction:g} of it, per class, to the nearest MiB."))
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")
    lines += ["", md, "",
              f"Utility: --utility_flops_per_token={args.flops_per_token:g} --utility_flops_per_token_context="
              f"{args.flops_per_context_token:g} --utility_recency_blend={args.blend:g}.",
              "Per row: " + "; ".join(f"{r['policy']}: {r['later_turns']} later turns, {r['delayed_by_prev_turn']} "
                                      f"issued late waiting for their previous turn, {r['short_replies']} short "
                                      f"replies, {r['recomputed_tokens']:.0f} tokens recomputed, prefill resume / "
                                      f"compute {r['prefill_resume_s']:.1f} / {r['prefill_compute_s']:.1f} s, "
                                      f"{r['parent_waits_expired']:.0f} turn-end publications gave up waiting for "
                                      f"a parent page, "
                                      f"largest issue lag {r['issue_lag_max_ms']:.0f} ms, CPU s prefill "
                                      f"{r['prefill_cpu_s']:.1f} decode {r['decode_cpu_s']:.1f}" for r in rows) + ".",
              "", f"Command: {' '.join(shlex.quote(a) for a in [sys.executable] + sys.argv)}",
              f"Machine: {platform.node()}, {os.cpu_count()} CPUs ({cpu}); total wall {total:.0f} s."]
    text = "\n".join(lines + [f"ERROR {p}" for p in problems])
    print("\n" + text)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(f"# Replay of a scaled {header.get('name')} trace through the real stack: LRU against utility "
                    f"eviction\n\n{text}\n")
    if args.out_csv and rows:
        with open(args.out_csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
