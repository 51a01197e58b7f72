#!/usr/bin/env python3
"""Draws cache_sim's CSV (its --out) as a PNG.

    python3 bench/cachestore/plot_cache_sim.py cache_sim.csv cache_sim.png

One column per trace. Top: token hit rate against the budget (a fraction of the
trace's working set, log scale), one line per model and policy, the unlimited
cache's rate dashed. Bottom: the fraction of prefill FLOPs saved, same axes.
A second policy's rows (policy column) and blend values get lines of their own.
Needs matplotlib (pip install matplotlib); a tool, never a dependency of the services.
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
        print("plot_cache_sim.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    with open(argv[1], newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"{argv[1]}: no rows", file=sys.stderr)
        return 1
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    series = list(dict.fromkeys((r["model"], r["policy"]) for r in rows))
    fig, axes = plt.subplots(2, len(traces), figsize=(4.2 * len(traces), 6.4), squeeze=False, sharex=True)
    for col, trace in enumerate(traces):
        for i, (model, policy) in enumerate(series):
            mine = [r for r in rows if r["trace"] == trace and r["model"] == model and r["policy"] == policy]
            limited = sorted((float(r["budget"]), r) for r in mine if r["budget"] != "unlimited")
            unlimited = [r for r in mine if r["budget"] == "unlimited"]
            color = f"C{i}"
            for row, (name, ylabel) in enumerate([("token_hit_rate", "token hit rate"),
                                                  ("flops_saved_fraction", "prefill FLOPs saved")]):
                ax = axes[row][col]
                ax.plot([b for b, _ in limited], [float(r[name]) for _, r in limited], "o-", color=color,
                        label=f"{model} {policy}")
                if unlimited:
                    ax.axhline(float(unlimited[0][name]), color=color, linestyle="--", linewidth=0.8)
                ax.set_xscale("log", base=2)
                ax.set_ylim(0, 1)
                ax.grid(True, alpha=0.3)
                if col == 0:
                    ax.set_ylabel(ylabel)
                if row == 1:
                    ax.set_xlabel("budget / working set")
        axes[0][col].set_title(trace)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle("cache_sim: dashed = unlimited cache", fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=80)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
