#!/usr/bin/env python3
"""An offline upper bound on the prefill FLOPs any cache policy can save on a trace.

    bazel run -c opt //bench/cachestore:cache_sim -- --traces=... --out=/tmp/sim.csv \
        --intervals_out=/tmp/intervals.csv
    python3 bench/cachestore/oracle_bound.py /tmp/sim.csv /tmp/intervals.csv [--out=bound.csv]

(needs scipy: pip install scipy). For each trace x model x budget of the simulator's CSV
it solves a linear program over the trace's reuse intervals (cache_sim.h ReuseIntervals):
interval i holds a conversation's turn end (its pages, P_i bytes with index memory, and its
turn-end state, S_i) from turn k's arrival to turn k + 1's and is worth the prefill FLOPs
of that prefix, F_i. Choose x_i in [0, 1] to

    maximize  sum F_i x_i
    subject to, at every moment t:  sum over the intervals open at t of P_i x_i <= page budget
                                    sum over the intervals open at t of S_i x_i <= state budget

Any policy, even one that knows the future, is within this: a turn resumes at most at the
previous turn's end; what it resumes from was written by its own conversation and so has
been resident since that conversation's previous turn; a resident prefix of a fraction x
of the chain saves at most x F_i (prefix FLOPs are convex) while its pages charge x P_i and
its state at least x S_i. The bound ignores what a policy must also hold meanwhile (the
prompt being prefilled, grid checkpoints), so it is optimistic. Traces with a prefix shared
across conversations have no intervals (their sharing is not modelled) and are skipped.

Prints, per budget: the bound's fraction of prompt FLOPs saved, LRU's (and every other
policy in the CSV), and bound / LRU: the largest factor any policy could gain over LRU.
With --plot (needs matplotlib), draws them against the budget, one panel per trace and model.
"""

import argparse
import collections
import csv
import sys

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix


def load_intervals(path):
    by_key = collections.defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            by_key[(r["trace"], r["model"])].append(
                (float(r["start_s"]), float(r["end_s"]), int(r["page_charge"]), int(r["state_charge"]),
                 float(r["flops"])))
    return by_key


def bound(intervals, page_budget, state_budget):
    """The LP's optimum: the FLOPs saved by the best fractional choice of intervals."""
    start = np.array([i[0] for i in intervals])
    end = np.array([i[1] for i in intervals])
    pages = np.array([i[2] for i in intervals], dtype=float)
    states = np.array([i[3] for i in intervals], dtype=float)
    flops = np.array([i[4] for i in intervals])
    # Occupancy only rises at a start, so the capacity rows are the distinct starts. An
    # interval [s, e) is open at t when s <= t < e (the next turn reads before its own puts).
    times = np.unique(start)
    rows, cols = [], []
    for j in range(len(intervals)):
        lo = np.searchsorted(times, start[j], side="left")
        hi = np.searchsorted(times, end[j], side="left")
        rows.extend(range(lo, hi))
        cols.extend([j] * (hi - lo))
    rows, cols = np.array(rows), np.array(cols)
    a = csr_matrix((np.concatenate([pages[cols], states[cols]]),
                    (np.concatenate([rows, rows + len(times)]), np.concatenate([cols, cols]))),
                   shape=(2 * len(times), len(intervals)))
    b = np.concatenate([np.full(len(times), float(page_budget)), np.full(len(times), float(state_budget))])
    scale = flops.max()  # keep the objective near 1 for the solver's tolerances
    res = linprog(-flops / scale, A_ub=a, b_ub=b, bounds=(0, 1), method="highs")
    if res.status != 0:
        sys.exit(f"linprog: {res.message}")
    return -res.fun * scale


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sim_csv", help="cache_sim's --out (one or more policies)")
    ap.add_argument("intervals_csv", help="cache_sim's --intervals_out")
    ap.add_argument("--out", help="CSV to write")
    ap.add_argument("--plot", help="PNG to draw (needs matplotlib)")
    args = ap.parse_args()
    intervals = load_intervals(args.intervals_csv)
    sims = list(csv.DictReader(open(args.sim_csv)))
    saved = {(r["trace"], r["model"], r["policy"], r["budget"]): float(r["flops_saved_fraction"]) for r in sims}
    policies = sorted({r["policy"] for r in sims if r["budget"] != "unlimited"})
    out = [["trace", "model", "budget", "page_budget_bytes", "state_budget_bytes", "bound_saved_fraction"] +
           [f"{p}_saved_fraction" for p in policies] + ["bound_over_lru"]]
    seen = set()
    for r in sims:
        key = (r["trace"], r["model"], r["budget"])
        if r["budget"] == "unlimited" or key in seen or (r["trace"], r["model"]) not in intervals:
            continue
        seen.add(key)
        prompt_flops = float(r["prompt_flops"])
        b = bound(intervals[(r["trace"], r["model"])], int(r["page_budget_bytes"]), int(r["state_budget_bytes"]))
        frac = b / prompt_flops
        others = [saved.get((r["trace"], r["model"], p, r["budget"]), float("nan")) for p in policies]
        lru = saved.get((r["trace"], r["model"], "lru", r["budget"]), float("nan"))
        out.append([r["trace"], r["model"], r["budget"], r["page_budget_bytes"], r["state_budget_bytes"],
                    f"{frac:.4f}"] + [f"{o:.4f}" for o in others] + [f"{frac / lru:.2f}" if lru > 0 else "nan"])
        print(",".join(str(c) for c in out[-1]), flush=True)
    if args.out:
        with open(args.out, "w", newline="") as f:
            csv.writer(f).writerows(out)
    if args.plot:
        plot(out, args.plot)


def plot(table, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    header, rows = table[0], table[1:]
    panels = list(dict.fromkeys((r[0], r[1]) for r in rows))
    columns = [i for i, name in enumerate(header) if name.endswith("_saved_fraction")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (trace, model) in zip(axes[0], panels):
        mine = sorted((float(r[2]), r) for r in rows if (r[0], r[1]) == (trace, model))
        for k, c in enumerate(columns):
            name = header[c][:-len("_saved_fraction")]
            style = "k--" if name == "bound" else "o-"
            ax.plot([b for b, _ in mine], [float(r[c]) for _, r in mine], style, label=name,
                    **({} if name == "bound" else {"color": f"C{k}"}))
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{trace}, {model}", fontsize=9)
        ax.set_xlabel("budget / working set")
    axes[0][0].set_ylabel("prefill FLOPs saved")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("policies against the offline bound (dashed): no policy can exceed it", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    main()
