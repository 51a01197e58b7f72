#!/usr/bin/env python3
"""llama.cpp's resume anchor for a warm turn 2: load a saved state in process, then eval the new tokens.

    PYTHONPATH=/tmp/llcpp/site python3 bench/llamacpp/resume_anchor.py \
        --gguf /tmp/hs-bench/gguf/nemotron_h-f32.gguf [--histories 4096,16384] [--new 65] \
        [--threads 2] [--reps 3]

The comparison serving_bench's resume rows make (issue 28: our warm TTFT <= 0.7x this). For
each history length H: one llama-cpp-python context (n_ctx = H + new + 16, n_batch 2048,
the settings of run_llamacpp_bench.py), eval H seeded random ids in [3, n_vocab), save_state()
(llama_state_get_data into memory: the attention KV and the recurrent states). Timed, --reps
times after one untimed rep, median: load_state(saved) then eval of `new` more seeded ids,
through the logits of the last one. This is the most favourable resume llama.cpp offers: the
state never leaves the process (no socket, no file, no other process), where ours crosses
from the cachestore to prefill and on to decode.

Prints one line per history and, last, a JSON object {"anchor": [{"history", "new", "load_ms",
"eval_ms", "total_ms"}, ...]} that serving_bench --llamacpp_gguf parses.
"""

import argparse
import json
import random
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--histories", default="4096,16384")
    ap.add_argument("--new", type=int, default=65)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        import llama_cpp
    except ImportError:
        sys.exit("resume_anchor.py needs llama-cpp-python (see bench/llamacpp/README.md)")
    rows = []
    for history in [int(h) for h in args.histories.split(",") if h]:
        llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=history + args.new + 16, n_batch=2048, n_ubatch=512,
                              n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
        rng = random.Random(args.seed + history)
        vocab = llm.n_vocab()
        past = [rng.randrange(3, vocab) for _ in range(history)]
        new = [rng.randrange(3, vocab) for _ in range(args.new)]
        llm.reset()
        llm.eval(past)
        saved = llm.save_state()
        loads, evals = [], []
        for rep in range(args.reps + 1):
            start = time.perf_counter()
            llm.load_state(saved)
            loaded = time.perf_counter()
            llm.eval(new)
            done = time.perf_counter()
            if llm.n_tokens != history + args.new:
                sys.exit(f"history {history}: {llm.n_tokens} tokens after the eval, expected {history + args.new}")
            if rep > 0:  # the first rep warms the allocations
                loads.append(loaded - start)
                evals.append(done - loaded)
        row = {"history": history, "new": args.new, "load_ms": 1e3 * statistics.median(loads),
               "eval_ms": 1e3 * statistics.median(evals),
               "total_ms": 1e3 * statistics.median([a + b for a, b in zip(loads, evals)]),
               "state_mib": saved.llama_state_size / 2**20}
        rows.append(row)
        print(f"history {history:6d} + {args.new} new: load {row['load_ms']:.1f} ms + eval {row['eval_ms']:.1f} ms"
              f" = {row['total_ms']:.1f} ms (state {row['state_mib']:.1f} MiB, {args.threads} threads)", flush=True)
        del llm
    print(json.dumps({"anchor": rows}))


if __name__ == "__main__":
    main()
