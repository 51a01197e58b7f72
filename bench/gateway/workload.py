"""The gateway bench's workload and statistics, shared by both sides (standard library only).

One request record, whichever client made it (grpc_load.py writes them; aiperf's
profile_export.jsonl is read into them by read_aiperf_records):
  {"start_ns": wall-clock ns when the client started the call,
   "ttft_ms": first generated token received by the client - start, ms,
   "end_ns": wall-clock ns when the stream ended,
   "prompt_tokens": the server's count, "output_tokens": the server's count,
   "error": "" or what went wrong}
Statistics are computed from these records only, the same code for both sides.
"""

import asyncio
import json
import statistics
import sys

# Filler for the prompts: printable ASCII, so one byte is one token of the default model's
# byte vocabulary whatever the tokenizer (no multi-byte characters).
_FILLER = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
           "step. All that glitters is not gold. Fortune favours the bold. ")

# Goals (issue 48): the gateway adds at most this much to TTFT p50 ...
TTFT_GOAL_MS = 1.0
# ... and keeps at least this fraction of direct gRPC's output throughput.
THROUGHPUT_GOAL_RATIO = 0.95


def prompt_text(tag, index, length):
    """A prompt of exactly `length` ASCII bytes (= tokens of the byte vocabulary), unique per (tag, index).

    The unique head keeps any two prompts of a run apart from their first page, so no request
    resumes from another's cache entries: every prompt is prefilled cold, on both sides.
    """
    head = f"{tag}-{index:06d}: "
    if length < len(head):
        raise ValueError(f"prompt length {length} < {len(head)} bytes of unique head {head!r}")
    body = (_FILLER * (length // len(_FILLER) + 1))[: length - len(head)]
    return head + body


def read_aiperf_records(path):
    """Records of aiperf's profile_export.jsonl (the profiling phase only; warm-up requests dropped)."""
    records = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            meta, metrics = row.get("metadata", {}), row.get("metrics", {})
            if meta.get("benchmark_phase", "profiling") != "profiling":
                continue

            def value(name):
                m = metrics.get(name)
                return m["value"] if isinstance(m, dict) else None

            error = row.get("error")
            records.append({
                "start_ns": int(meta["request_start_ns"]),
                "end_ns": int(meta["request_end_ns"]),
                "ttft_ms": value("time_to_first_token"),
                "prompt_tokens": value("usage_prompt_tokens"),
                "output_tokens": value("usage_completion_tokens"),
                "error": json.dumps(error) if error else "",
            })
    return records


def summarize(runs):
    """Statistics over one side's runs (each a list of records) at one concurrency.

    TTFT p50: the median of every successful request's ttft_ms, all runs pooled.
    Throughput: output tokens of the successful requests / the runs' windows added up,
    a run's window being its first start to its last end (tokens/s).
    """
    ttft, tokens, window_s, ok, errors = [], 0, 0.0, 0, 0
    for records in runs:
        if not records:
            continue
        window_s += (max(r["end_ns"] for r in records) - min(r["start_ns"] for r in records)) / 1e9
        for r in records:
            if r["error"]:
                errors += 1
                continue
            ok += 1
            tokens += r["output_tokens"]
            ttft.append(r["ttft_ms"])
    return {
        "requests": ok,
        "errors": errors,
        "ttft_p50_ms": statistics.median(ttft) if ttft else float("nan"),
        "throughput": tokens / window_s if window_s > 0 else float("nan"),
        "output_tokens": tokens,
        "window_s": window_s,
    }


def check_lengths(records, prompt_tokens, output_tokens):
    """Messages for successful records whose token counts are not the workload's (empty: all right)."""
    bad = []
    for r in records:
        if r["error"]:
            continue
        if r["prompt_tokens"] != prompt_tokens or r["output_tokens"] != output_tokens:
            bad.append(f"prompt {r['prompt_tokens']} / output {r['output_tokens']} tokens, "
                       f"expected {prompt_tokens} / {output_tokens}")
    return bad


def compare(direct, gateway):
    """One table row's figures and verdicts from the two sides' summaries."""
    diff = gateway["ttft_p50_ms"] - direct["ttft_p50_ms"]
    ratio = gateway["throughput"] / direct["throughput"]
    return {
        "ttft_diff_ms": diff,
        "throughput_ratio": ratio,
        "ttft_met": diff <= TTFT_GOAL_MS,
        "throughput_met": ratio >= THROUGHPUT_GOAL_RATIO,
    }


def table(rows, via="via gateway"):
    """Markdown table; rows: (concurrency, direct summary, gateway summary)."""
    lines = [
        f"| streams | TTFT p50 direct, ms | {via}, ms | difference, ms | goal <= +1 ms "
        f"| tokens/s direct | {via} | ratio | goal >= 0.95 | requests (errors) direct / gateway |",
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for concurrency, d, g in rows:
        c = compare(d, g)
        lines.append(
            f"| {concurrency} | {d['ttft_p50_ms']:.2f} | {g['ttft_p50_ms']:.2f} | {c['ttft_diff_ms']:+.2f} "
            f"| {'MET' if c['ttft_met'] else 'MISSED'} | {d['throughput']:.0f} | {g['throughput']:.0f} "
            f"| {c['throughput_ratio']:.3f} | {'MET' if c['throughput_met'] else 'MISSED'} "
            f"| {d['requests']} ({d['errors']}) / {g['requests']} ({g['errors']}) |")
    return "\n".join(lines)


# ---- what both load clients share: a closed loop, their flags, their output ------------

async def closed_loop(slots, count, call):
    """`count` requests (indices 0..count-1) from len(slots) concurrent
    slots, each sending its next request when its previous one ends;
    call(slot, index) -> record. The records, in the order they ended."""
    next_index, records = [0], []

    async def run_slot(slot):
        while next_index[0] < count:
            i = next_index[0]
            next_index[0] += 1
            records.append(await call(slot, i))

    await asyncio.gather(*(run_slot(slot) for slot in slots))
    return records


def add_load_flags(ap, bos_help):
    """The workload flags both load clients take."""
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=0, help="unrecorded requests first (default: --concurrency)")
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--output_tokens", type=int, default=64)
    ap.add_argument("--bos", type=lambda s: s.lower() in ("1", "true", "yes"), default=False, help=bos_help)
    ap.add_argument("--tag", required=True, help="makes this run's prompts unique")
    ap.add_argument("--out", required=True, help="records, one JSON object a line")


def parse_load_flags(ap):
    args = ap.parse_args()
    if args.concurrency < 1 or args.requests < 1:
        sys.exit("--concurrency and --requests must be >= 1")
    args.warmup = args.warmup or args.concurrency
    return args


def write_records(args, records, side):
    """Writes the records to --out and prints their summary; the exit status (1 when any failed)."""
    with open(args.out, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    s = summarize([records])
    print(f"{side} c={args.concurrency}: {s['requests']} requests, {s['errors']} errors, "
          f"TTFT p50 {s['ttft_p50_ms']:.2f} ms, {s['throughput']:.0f} tokens/s")
    return 1 if s["errors"] else 0
