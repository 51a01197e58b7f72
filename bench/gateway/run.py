#!/usr/bin/env python3
"""The OpenAI gateway's overhead: TTFT p50 and output throughput via the gateway against gRPC straight to decode.

    bazel build -c opt //cachestore/server:cachestore //prefill:prefill //decode:decode //gateway:gateway
    /usr/bin/python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0
    /usr/bin/python3 bench/gateway/run.py --aiperf=/tmp/aiperf-venv/bin/aiperf \
        [--concurrency=1,4,16,64] [--rounds=3] [--prompt_tokens=128] [--output_tokens=64] \
        [--requests_per_slot=4] [--min_requests=64] [--out_md=bench/gateway/results/....md]

One stack for the whole run: cachestore, prefill and decode on loopback (models/default,
decode --max_batch=64), and the gateway in front of decode. At each concurrency, --rounds
rounds of one run per side, the order rotating (each side first, middle and last in turn) so
that drift and the other processes on the machine hit every side alike:
  direct:  grpc_load.py, streaming Generate on grpc.aio straight to decode (the baseline);
  gateway: aiperf (an existing OpenAI-API load generator) on POST /v1/completions, stream: true;
  control: http_load.py, a minimal asyncio HTTP client, on the same gateway endpoint: where it
           and aiperf disagree, the difference is aiperf's own cost.
The same workload on every side: a closed loop of `concurrency` slots, max(--min_requests,
concurrency x --requests_per_slot) recorded requests after `concurrency` warm-up requests, each
prompt exactly --prompt_tokens tokens and unique (workload.prompt_text: nothing resumes from the
cache), greedy, EOS ignored (`ignore_eos: true` on the gateway, the vLLM-style extension field),
exactly --output_tokens generated. Every recorded request's prompt and output token counts (the
server's usage) are checked; a mismatch or an error fails the run.

TTFT on every side is the client's: the call's start to the first token's arrival at the client
(aiperf: its HTTP request's start to the first SSE event with text; http_load.py the same;
grpc_load.py: the Generate call's start to the first response message with a token). The
statistics are computed by the same code (workload.summarize) from every side's per-request
records: TTFT p50 over all rounds' requests, throughput = output tokens / the runs' windows
(first start to last end) added up.

Prints, per concurrency: TTFT p50 direct / via gateway / difference, throughput direct / via
gateway / ratio, each goal's verdict (the gateway adds <= 1 ms to TTFT p50 and keeps >= 0.95 of
the throughput), for aiperf and for the control; the direct rounds' spread (this machine's noise
floor); the CPU seconds each server process and the client used during each side's runs. A
round during which a process of the stack exits (something else on a shared machine stopped it)
runs again on a fresh stack, at most twice, and the report says so. Exit status 1 when a
request fails or has the wrong token counts; a missed goal is reported, not an error.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "bench", "serving"))
import workload  # noqa: E402
from multiturn_table import start  # noqa: E402

PROCESSES = ("cachestore", "prefill", "decode", "gateway")


class Stack:
    """cachestore + prefill + decode + gateway on loopback; close() stops them."""

    BINARIES = ("cachestore/server/cachestore", "prefill/prefill", "decode/decode", "gateway/gateway")

    def __init__(self, args):
        self.procs, self.ports = {}, {}
        b, model = args.bin, f"--model_dir={args.model_dir}"
        missing = [path for path in self.BINARIES if not os.access(os.path.join(b, path), os.X_OK)]
        if missing:  # bazel-bin is the last bazel command's configuration: a `bazel test` moves it
            sys.exit(f"not in {b}: {', '.join(missing)}; build them (last) with: bazel build -c opt "
                     "//cachestore/server:cachestore //prefill:prefill //decode:decode //gateway:gateway")
        loop = ["--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0"]
        try:
            self._start("cachestore", [f"{b}/cachestore/server/cachestore"] + loop, "CACHESTORE_READY", args)
            cache = f"--cachestore=127.0.0.1:{self.ports['cachestore']}"
            self._start("prefill", [f"{b}/prefill/prefill", model, cache, "--max_queue=256"] + loop,
                        "PREFILL_READY", args)
            prefill = f"--prefill=127.0.0.1:{self.ports['prefill']}"
            self._start("decode", [f"{b}/decode/decode", model, cache, prefill, "--max_batch=64",
                                   "--max_waiting=256", "--max_pages=16384"] + loop + args.decode_flags, "DECODE_READY", args)
            self.decode_target = f"127.0.0.1:{self.ports['decode']}"
            self._start("gateway", [f"{b}/gateway/gateway", f"--decode={self.decode_target}", model,
                                    "--address=127.0.0.1:0"] + args.gateway_flags, "GATEWAY_READY", args)
            self.gateway_url = f"http://127.0.0.1:{self.ports['gateway']}"
        except BaseException:
            self.close()
            raise

    def _start(self, name, argv, ready, args):
        p, f = start(name, argv, ready, args.logdir)
        self.procs[name] = p
        self.ports[name] = int(f["port"])

    def dead(self):
        return [f"{name} exited with {p.poll()}" for name, p in self.procs.items() if p.poll() is not None]

    def cpu_seconds(self):
        """User + system CPU seconds each process has used so far (Linux /proc)."""
        out = {}
        for name, p in self.procs.items():
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    def close(self):
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            p.wait()


def http_json(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def gateway_adds_bos(url, model):
    """Whether the gateway puts <bos> before a text prompt: one 10-byte prompt, its usage."""
    r = http_json(url + "/v1/completions", {"model": model, "prompt": "0123456789", "max_tokens": 1})
    n = r["usage"]["prompt_tokens"]
    if n not in (10, 11):
        sys.exit(f"the gateway counted {n} tokens for a 10-byte prompt: not the byte vocabulary?")
    return n == 11


def write_byte_tokenizer(path):
    """A Hugging Face tokenizer of the default model's byte vocabulary (one token a byte, ids 0-255;
    <pad> 256, <bos> 257, <eos> 258), for aiperf: without a local tokenizer it downloads one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    os.makedirs(path, exist_ok=True)
    # GPT-2's byte -> printable character table: ByteLevel pre-tokenizes text to these characters.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    vocab.update({"<pad>": 256, "<bos>": 257, "<eos>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>"}, f)
    ids = tok.encode("A b\n\xe9").ids
    assert ids == [65, 32, 98, 10, 0xC3, 0xA9], ids


class ClientFailed(Exception):
    """A client exited without its records."""


def client_cpu_seconds():
    """User + system CPU seconds of this process's waited-for children (and theirs), so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_driver(args, script, target_flags, concurrency, requests, tag, bos):
    """grpc_load.py or http_load.py, one run; its records."""
    out = os.path.join(args.logdir, f"{tag}.jsonl")
    cmd = [sys.executable, os.path.join(HERE, script)] + target_flags + [
        f"--concurrency={concurrency}", f"--requests={requests}", f"--warmup={concurrency}",
        f"--prompt_tokens={args.prompt_tokens}", f"--output_tokens={args.output_tokens}",
        f"--bos={'true' if bos else 'false'}", f"--tag={tag}", f"--out={out}"]
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    if not os.path.exists(out):
        raise ClientFailed(f"{script} wrote no records ({' '.join(cmd)})")
    return [json.loads(line) for line in open(out) if line.strip()]


def run_gateway(args, stack, concurrency, requests, tag, bos, model):
    run_dir = os.path.join(args.logdir, tag)
    os.makedirs(run_dir, exist_ok=True)
    inputs = os.path.join(run_dir, "prompts.jsonl")
    text_tokens = args.prompt_tokens - (1 if bos else 0)
    with open(inputs, "w") as f:  # warm-up prompts first: aiperf reads the file in order through both phases
        for i in range(concurrency + requests):
            f.write(json.dumps({"text": workload.prompt_text(tag, i, text_tokens)}) + "\n")
    cmd = [args.aiperf, "profile", "--model", model, "--url", stack.gateway_url, "--endpoint-type", "completions",
           "--streaming", "--concurrency", str(concurrency), "--warmup-request-count", str(concurrency),
           "--request-count", str(requests), "--input-file", inputs, "--custom-dataset-type", "single_turn",
           "--dataset-sampling-strategy", "sequential", "--osl", str(args.output_tokens),
           "--use-legacy-max-tokens", "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
           "--tokenizer", args.tokenizer_dir, "--use-server-token-count", "--workers-max", "1",
           "--record-processors", "1", "--ui-type", "none", "--output-artifact-dir", run_dir]
    with open(os.path.join(run_dir, "aiperf.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    path = os.path.join(run_dir, "profile_export.jsonl")
    if rc != 0 or not os.path.exists(path):
        raise ClientFailed(f"aiperf failed (exit {rc}): {run_dir}/aiperf.log")
    return workload.read_aiperf_records(path)


SIDES = ("direct", "gateway", "control")  # gRPC to decode; aiperf via the gateway; http_load.py via the gateway


def run_side(args, stack, side, c, requests, tag, bos, model):
    if side == "direct":
        return run_driver(args, "grpc_load.py", [f"--target={stack.decode_target}"], c, requests, tag, bos)
    if side == "control":
        return run_driver(args, "http_load.py", [f"--url={stack.gateway_url}", f"--model={model}"], c, requests,
                          tag, bos)
    return run_gateway(args, stack, c, requests, tag, bos, model)


class StackDied(Exception):
    """A process of the stack exited during a round."""


MAX_RESTARTS = 2


def run_round(args, stack, c, r, requests, bos, model):
    """Round r at c streams: every side once, in rotated order. {side: (records, cpu seconds, table line)}.

    Raises StackDied when a process of the stack exited; exits the bench on a failed request,
    a wrong token count or a client that failed while the stack was up."""
    result = {}
    for side in SIDES[r % 3:] + SIDES[:r % 3]:  # each side first, second, last in turn
        tag = f"{side[0]}{c}r{r}"
        before, client_before = stack.cpu_seconds(), client_cpu_seconds()
        try:
            records = run_side(args, stack, side, c, requests, tag, bos, model)
        except ClientFailed as e:
            if stack.dead():
                raise StackDied("; ".join(stack.dead())) from None
            sys.exit(str(e))
        if stack.dead():
            raise StackDied("; ".join(stack.dead()))
        after, client_after = stack.cpu_seconds(), client_cpu_seconds()
        side_cpu = {name: after[name] - before[name] for name in PROCESSES}
        side_cpu["client"] = client_after - client_before
        s = workload.summarize([records])
        print(f"  c={c} round {r} {side:7s}: TTFT p50 {s['ttft_p50_ms']:8.2f} ms, "
              f"{s['throughput']:6.0f} tokens/s, {s['requests']} requests, {s['errors']} errors", flush=True)
        failures = sorted({f"{tag}: {x['error']}" for x in records if x["error"]})
        failures += sorted(set(workload.check_lengths(records, args.prompt_tokens, args.output_tokens)))
        if len(records) != requests:
            failures.append(f"{tag}: {len(records)} records, expected {requests}")
        if failures:
            sys.exit("; ".join(failures[:5]))
        result[side] = (records, side_cpu, f"| {c} | {r} | {side} | {s['requests']} | {s['errors']} "
                                           f"| {s['ttft_p50_ms']:.2f} | {s['throughput']:.0f} | {s['window_s']:.2f} |")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aiperf", required=True, help="the aiperf executable (aiperf==0.13.0 in a venv)")
    ap.add_argument("--bin", default=os.path.join(REPO, "bazel-bin"))
    ap.add_argument("--model_dir", default=os.path.join(REPO, "models", "default"))
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--output_tokens", type=int, default=64)
    ap.add_argument("--requests_per_slot", type=int, default=4)
    ap.add_argument("--min_requests", type=int, default=64)
    ap.add_argument("--gateway_flags", default="", help="more gateway flags, space-separated")
    ap.add_argument("--decode_flags", default="", help="more decode flags, space-separated (later ones win)")
    ap.add_argument("--logdir", default="/tmp/hs-gateway-bench")
    ap.add_argument("--out_md", default="", help="also write the results (command, machine, tables) here")
    args = ap.parse_args()
    args.gateway_flags = args.gateway_flags.split()
    args.decode_flags = args.decode_flags.split()
    os.makedirs(args.logdir, exist_ok=True)
    args.tokenizer_dir = os.path.join(args.logdir, "byte_tokenizer")
    write_byte_tokenizer(args.tokenizer_dir)
    levels = [int(c) for c in args.concurrency.split(",")]
    load_before = os.getloadavg()

    stack = Stack(args)
    rows, detail, restarts = [], [], []
    try:
        model = http_json(stack.gateway_url + "/v1/models")["data"][0]["id"]
        bos = gateway_adds_bos(stack.gateway_url, model)
        print(f"gateway {stack.gateway_url} -> decode {stack.decode_target}, model {model!r}, "
              f"<bos> before text prompts: {bos}", flush=True)
        for c in levels:
            requests = max(args.min_requests, c * args.requests_per_slot)
            runs = {side: [] for side in SIDES}
            cpu = {side: dict.fromkeys(PROCESSES + ("client",), 0.0) for side in SIDES}
            for r in range(args.rounds):
                for attempt in range(MAX_RESTARTS + 1):
                    try:
                        result = run_round(args, stack, c, r, requests, bos, model)
                        break
                    except StackDied as e:
                        # On a shared machine something else may stop our processes (it happened: SIGTERM to
                        # prefill, decode and the gateway mid-run). The round is run again on a fresh stack.
                        restarts.append(f"streams {c} round {r}: {e}")
                        print(f"  the stack died ({e}): round {r} again on a new stack", flush=True)
                        stack.close()
                        if attempt == MAX_RESTARTS:
                            raise
                        stack = Stack(args)
                for side, (records, side_cpu, line) in result.items():
                    runs[side].append(records)
                    detail.append(line)
                    for name, seconds in side_cpu.items():
                        cpu[side][name] += seconds
            rows.append((c, {side: workload.summarize(runs[side]) for side in SIDES}, cpu,
                         [workload.summarize([x]) for x in runs["direct"]]))
    finally:
        stack.close()

    main_table = workload.table([(c, s["direct"], s["gateway"]) for c, s, _, _ in rows], via="via gateway (aiperf)")
    control_table = workload.table([(c, s["direct"], s["control"]) for c, s, _, _ in rows],
                                   via="via gateway (http_load.py)")
    noise = ["| streams | direct rounds' TTFT p50, ms (max - min) | direct rounds' tokens/s (min / max) |",
             "| ---: | ---: | ---: |"]
    cpu_lines = ["| streams | side | " + " | ".join(f"{p}" for p in PROCESSES + ("client",))
                 + " | gateway CPU ms / 1K tokens |",
                 "| ---: | --- | " + " | ".join("---:" for _ in PROCESSES + ("client",)) + " | ---: |"]
    for c, summaries, cpu, direct_rounds in rows:
        t = [x["ttft_p50_ms"] for x in direct_rounds]
        q = [x["throughput"] for x in direct_rounds]
        noise.append(f"| {c} | {max(t) - min(t):.2f} | {min(q) / max(q):.3f} |")
        for side in SIDES:
            tokens = summaries[side]["output_tokens"]
            per_k = 1e3 * cpu[side]["gateway"] / (tokens / 1e3) if tokens else float("nan")
            cpu_lines.append(f"| {c} | {side} | " + " | ".join(f"{cpu[side][p]:.2f}" for p in PROCESSES + ("client",))
                             + f" | {per_k:.1f} |")
    report = ["The goal's measure: aiperf through the gateway against grpc_load.py straight to decode:", "",
              main_table, "",
              "Control: the same gateway measured by http_load.py (a minimal asyncio HTTP client), against the "
              "same direct runs; the gap between the two tables is aiperf's own cost:", "",
              control_table, "",
              "Noise floor: the direct rounds against each other (no gateway anywhere):", "", *noise, "",
              f"Stack restarts (a process of the stack exited mid-round; the round ran again): "
              f"{'; '.join(restarts) if restarts else 'none'}", "",
              "CPU seconds during each side's runs: each server process (/proc), and the client's whole process "
              "tree (aiperf's includes its start-up, about 7 s):", "", *cpu_lines]
    print("\n" + "\n".join(report))
    if args.out_md:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        cpu_model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                          if line.startswith("model name")), platform.processor())
        text = "\n".join([
            "# Gateway overhead: via the gateway against gRPC straight to decode",
            "",
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}; "
            f"{platform.platform()}, {os.cpu_count()} cores ({cpu_model}), load average "
            f"{load_before[0]:.2f} before / {os.getloadavg()[0]:.2f} after; every process of the stack, "
            f"the gateway and the client share these cores.",
            "",
            "```sh",
            " ".join(shlex.quote(a) for a in ["/usr/bin/python3"] + sys.argv),
            "```",
            "",
            f"Workload: prompts of {args.prompt_tokens} tokens (unique), {args.output_tokens} tokens generated "
            f"(greedy, EOS ignored), {args.rounds} rounds, the three sides' order rotating, "
            f"max({args.min_requests}, {args.requests_per_slot} x streams) requests a run after one warm-up "
            f"request per stream; <bos> before text prompts: {bos}.",
            "", *report, "",
            "Every run:", "", "| streams | round | side | requests | errors | TTFT p50, ms | tokens/s | window, s |",
            "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |", *detail, ""])
        with open(args.out_md, "w") as f:
            f.write(text)
        print(f"wrote {args.out_md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
