#!/usr/bin/env python3
"""Multi-turn caching through the three real processes, as a user sees it.

    bazel build //cachestore/server:cachestore //prefill:prefill //decode:decode
    /usr/bin/python3 bench/serving/multiturn_table.py --model_dir tests/fixtures/models/mamba2_e2e \
        [--page_size 16] [--bin bazel-bin] [--max_tokens 32]

Starts the cachestore, one prefill and one decode worker on loopback (ports
picked by the processes), then for first prompts of 1, 5, 16, 17, 37, 64 and
100 tokens plays a three-turn conversation through the client proto only (each
turn's prompt is the whole conversation plus new text; greedy, EOS ignored).
Prints, per conversation, each turn's cached tokens against the exact
expectation (turn N+1 resumes at turn N's prompt + its generated tokens - 1),
and every request's total time beside the decode worker's own measure of how
long the final message waited for the turn-end publication (decode's
hybridserve_decode_publish_wait_seconds). The ratio column is that wait over
the request's time: the baseline is the request itself, measured in the same
run. Exit status 1 when a cached-token count is not the expected one.
"""

import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
from hybridserve_client import Client  # noqa: E402

TEXT = (b"The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
        b"step. All that glitters is not gold. ")


def prompt(n, seed):
    return [257] + [TEXT[(i + 17 * seed) % len(TEXT)] for i in range(n - 1)]


def start(name, argv, ready, logdir):
    log = open(os.path.join(logdir, name + ".log"), "w+")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        log.seek(0)
        for line in log.read().splitlines():
            if line.startswith(ready):
                return p, dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        if p.poll() is not None:
            break
        time.sleep(0.02)
    log.seek(0)
    sys.exit(f"{name} did not start:\n{log.read()}")


def scrape(port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", required=True)
    ap.add_argument("--page_size", type=int, default=0)
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--max_tokens", type=int, default=32)
    ap.add_argument("--logdir", default="/tmp/multiturn_table")
    args = ap.parse_args()
    os.makedirs(args.logdir, exist_ok=True)
    b = args.bin
    page = [f"--page_size={args.page_size}"]
    procs = []
    try:
        cs, f = start("cachestore", [f"{b}/cachestore/server/cachestore", "--address=127.0.0.1:0",
                                     "--metrics_address=127.0.0.1:0"], "CACHESTORE_READY", args.logdir)
        procs.append(cs)
        cache = f"127.0.0.1:{f['port']}"
        pf, f = start("prefill", [f"{b}/prefill/prefill", f"--model_dir={args.model_dir}", "--address=127.0.0.1:0",
                                  "--metrics_address=127.0.0.1:0", f"--cachestore={cache}"] + page,
                      "PREFILL_READY", args.logdir)
        procs.append(pf)
        dc, f = start("decode", [f"{b}/decode/decode", f"--model_dir={args.model_dir}", "--address=127.0.0.1:0",
                                 "--metrics_address=127.0.0.1:0", f"--prefill=127.0.0.1:{f['port']}",
                                 f"--cachestore={cache}"] + page, "DECODE_READY", args.logdir)
        procs.append(dc)
        target, metrics = f"127.0.0.1:{f['port']}", int(f["metrics_port"])
        wait_metric = "hybridserve_decode_publish_wait_seconds_sum"
        bad = 0
        print(f"model {args.model_dir}, page size {args.page_size or 'default'}, {args.max_tokens} tokens a turn")
        print("| first prompt | turn 2 cached (expected) | turn 3 cached (expected) "
              "| request time, ms (turns 1/2/3) | final message's publication wait, ms | wait / request |")
        print("| --- | --- | --- | --- | --- | --- |")
        with Client(target, timeout=60) as client:
            for first in (1, 5, 16, 17, 37, 64, 100):
                conversation = prompt(first, first)
                expected, cached, times, waits = 0, [], [], []
                for turn in range(3):
                    before = scrape(metrics, wait_metric)
                    t0 = time.perf_counter()
                    r = client.generate(conversation, args.max_tokens, temperature=0.0, ignore_eos=True,
                                        cache_salt=f"table-{first}")
                    times.append(1e3 * (time.perf_counter() - t0))
                    waits.append(1e3 * (scrape(metrics, wait_metric) - before))
                    got = r.usage.cached_tokens
                    if turn > 0:
                        cached.append((got, expected))
                        bad += got != expected
                    expected = len(conversation) + len(r.token_ids) - 1
                    conversation = conversation + list(r.token_ids) + prompt(12, turn + 5)[1:]
                ratio = sum(waits) / sum(times)
                print(f"| {first} | {cached[0][0]} ({cached[0][1]}) | {cached[1][0]} ({cached[1][1]}) "
                      f"| {times[0]:.1f} / {times[1]:.1f} / {times[2]:.1f} "
                      f"| {waits[0]:.2f} / {waits[1]:.2f} / {waits[2]:.2f} | {ratio:.3f} |")
        print(f"publications that waited out --publish_parent_wait: "
              f"{scrape(metrics, 'hybridserve_decode_publish_parent_waits_expired_total'):.0f}")
        return 1 if bad else 0
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
