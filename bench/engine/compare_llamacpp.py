#!/usr/bin/env python3
"""Engine vs llama.cpp on the same weights, measured in one run, as ratios.

Runs hybridserve's throughput_bench on an HF model directory and then
bench/llamacpp/run_llamacpp_bench.py on the GGUF converted from it
(bench/llamacpp/convert.sh), both with the same thread count, and prints
prefill and decode tokens/s side by side with ratios (ours / llama.cpp).

    bazel build -c opt //bench/engine:throughput_bench
    python3 bench/engine/compare_llamacpp.py --model /tmp/hs-bench/nemotron_h \
        --gguf /tmp/hs-bench/gguf/nemotron_h-f32.gguf [--threads 2] [--mode deterministic]
"""

import argparse
import json
import os
import subprocess
import sys


def last_json(text, prefix):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if prefix:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        elif line.startswith("{"):
            return json.loads(line)
    raise SystemExit("no JSON result in output:\n" + text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model directory (config.json + safetensors)")
    ap.add_argument("--gguf", required=True, help="the same model converted to GGUF")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=["deterministic", "fast"], default="deterministic")
    ap.add_argument("--bench", default=None, help="path of throughput_bench (default: bazel-bin, -c opt)")
    args = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bench = args.bench
    if bench is None:
        bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=root, check=True,
                                 capture_output=True, text=True).stdout.strip()
        bench = os.path.join(bin_dir, "bench/engine/throughput_bench")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads))
    ours_out = subprocess.run([bench, args.model, str(args.threads), args.mode], check=True, capture_output=True,
                              text=True, env=env).stdout
    print(ours_out.strip())
    ours = last_json(ours_out, "JSON ")
    theirs_out = subprocess.run([sys.executable, os.path.join(root, "bench/llamacpp/run_llamacpp_bench.py"),
                                 "--gguf", args.gguf, "--threads", str(args.threads), "--flash-attn", "off"],
                                check=True, capture_output=True, text=True).stdout
    theirs = last_json(theirs_out, "")

    rows = [(f"prefill {n}", ours[f"prefill_{n}"], theirs["prefill_tok_s"][str(n)]) for n in (512, 2048, 8192)]
    rows += [("decode b=1", ours["decode_b1"], theirs["decode_tok_s"]["1"]),
             ("decode b=8", ours["decode_b8"], theirs["decode_tok_s"]["8"])]
    print(f"\nhybridserve ({args.mode} matmul) vs llama.cpp {theirs.get('llama_cpp_python', '?')} "
          f"({theirs.get('dtype', '?')}), {args.threads} threads, tokens/s")
    print(f"{'':12} {'hybridserve':>12} {'llama.cpp':>12} {'ratio':>8}")
    for name, a, b in rows:
        print(f"{name:12} {a:12.1f} {b:12.1f} {a / b:7.2f}x")
    print(f"decode b=1 at {100 * ours['decode_b1'] / ours['decode_b1_bound']:.0f}% of its memory-bandwidth bound "
          f"({ours['bandwidth_gbs']:.1f} GB/s measured in the same run)")


if __name__ == "__main__":
    main()
