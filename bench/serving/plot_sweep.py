#!/usr/bin/env python3
"""Draws serving_bench's concurrency sweep (its --sweep_csv) as a PNG.

    python3 bench/serving/plot_sweep.py sweep.csv sweep.png

Left: requests/s against concurrent streams. Right: p50/p99 time to first
token and inter-token latency (log scale). Needs matplotlib (pip install
matplotlib); a tool, never a dependency of the services.
"""
import csv
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_sweep.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    with open(argv[1], newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"{argv[1]}: no rows", file=sys.stderr)
        return 1
    streams = [int(r["streams"]) for r in rows]
    col = lambda name: [float(r[name]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(streams, col("requests_per_s"), marker="o")
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrent streams")
    left.set_ylabel("requests / s")
    left.set_title("throughput")
    left.grid(True, alpha=0.3)
    for name, label, style in [("ttft_p50_ms", "TTFT p50", "o-"), ("ttft_p99_ms", "TTFT p99", "o--"),
                               ("itl_p50_ms", "ITL p50", "s-"), ("itl_p99_ms", "ITL p99", "s--")]:
        right.plot(streams, col(name), style, label=label)
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("concurrent streams")
    right.set_ylabel("ms")
    right.set_title("latency")
    right.grid(True, alpha=0.3)
    right.legend()
    errors = sum(int(r["errors"]) for r in rows)
    requests = sum(int(r["requests"]) for r in rows)
    fig.suptitle(f"hybridserve, default model: {requests} requests, {errors} errors")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    print(f"wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
