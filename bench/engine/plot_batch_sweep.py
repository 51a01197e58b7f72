#!/usr/bin/env python3
"""Plot the decode batch sweep written by compare_llamacpp.py: tokens/s vs batch (log2 x axis),
hybridserve vs llama.cpp, one panel per model/dtype. Batches llama.cpp refused are marked
with an x on the axis.

    python3 bench/engine/plot_batch_sweep.py SWEEP.json OUT.png

SWEEP.json: {"batches": [1, 2, ...], "threads": 2, "series": [{"model": "nemotron_h",
"dtype": "bf16", "ours": {"1": tok_s|null, ...}, "llama.cpp": {"1": tok_s|null, ...},
"llama_unsupported": [64, ...]}, ...]}
"""

import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        sweep = json.load(f)
    series = sweep["series"]
    if not series:
        sys.exit("no series in " + sys.argv[1])
    n = len(series)
    cols = 2 if n > 1 else 1
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax, s in zip(axes.flat, series):
        for name, style in (("ours", dict(marker="o", color="tab:blue", label="hybridserve")),
                            ("llama.cpp", dict(marker="s", color="tab:orange", label="llama.cpp"))):
            pts = sorted((int(b), v) for b, v in s.get(name, {}).items() if v is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], **style)
        unsup = s.get("llama_unsupported", [])
        if unsup:
            ax.plot(unsup, [0] * len(unsup), "x", color="tab:orange", markersize=10, clip_on=False,
                    label="llama.cpp: unsupported")
        ax.set_xscale("log", base=2)
        bs = sweep.get("batches") or sorted({int(b) for k in ("ours", "llama.cpp") for b in s.get(k, {})})
        ax.set_xticks(bs)
        ax.set_xticklabels([str(b) for b in bs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("decode batch (sequences)")
        ax.set_ylabel("tokens/s (all sequences)")
        ax.set_title(f"{s['model']} {s['dtype']}, {sweep.get('threads', '?')} threads")
        ax.grid(True, alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(sys.argv[2])


if __name__ == "__main__":
    main()
