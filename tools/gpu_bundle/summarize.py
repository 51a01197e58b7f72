#!/usr/bin/env python3
"""The GPU run's table (markdown on stdout), from run.sh's steps.tsv and logs.

Tests: each step's outcome and its gtest XML's counts (passed, failed,
skipped), with every failure's and skip's first line. Figures: each against
the goal the CUDA issues set (issue 27):
  selective state update >= 88 % of HBM bandwidth at batch >= 64
  SSD chunk scan > 2.4e7 tokens/s at granite-4.0-h-small's Mamba dimensions
  decode batch 1 >= 80 % of the HBM (device copy) bound
  CUDA IPC transfer >= 0.9 of a device-to-device copy
  disaggregated / aggregated TTFT <= 1.05
Standard library only (runs on the GPU machine's python3).
"""

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def first_line(text, limit=160):
    """The first line of `text` that is not a gtest location ("file:line") or FAIL()'s "Failed"."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    lines = [l for l in lines if not re.fullmatch(r"\S+:\d+", l) and l != "Failed"] or lines
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def gtest_cases(xml_path):
    """[(name, outcome, message)] from a gtest XML report; None when unreadable."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = []
    for tc in root.iter("testcase"):
        name = f"{tc.get('classname')}.{tc.get('name')}"
        failures = tc.findall("failure")
        skipped = tc.find("skipped")
        if failures:
            cases.append((name, "FAILED", failures[0].get("message", "")))
        elif skipped is not None or tc.get("result") == "skipped" or tc.get("status") == "notrun":
            cases.append((name, "skipped", skipped.get("message", "") if skipped is not None else ""))
        else:
            cases.append((name, "passed", ""))
    return cases


def json_line(log):
    for line in reversed(log.splitlines()):
        if line.startswith("JSON "):
            try:
                return json.loads(line[5:])
            except ValueError:
                return None
    return None


def verdict(ok):
    return "MET" if ok else "MISSED"


def kernel_figures(log):
    j = json_line(log)
    rows = []
    if j is None:
        return rows
    rows.append(("device copy bandwidth (read + write)", f"{j.get('copy_gbs', 0):.0f} GB/s",
                 f"nominal peak {j.get('hbm_peak_gbs', 0):.0f} GB/s", "-"))
    big = [s for s in j.get("ssu", []) if s["batch"] >= 64]
    for s in j.get("ssu", []):
        if s["batch"] in (1, 64, 256):
            rows.append((f"selective state update, batch {s['batch']}",
                         f"{100 * s['share_of_peak']:.1f} % of peak ({100 * s['share_of_copy']:.1f} % of copy), "
                         f"{s['us']:.1f} us", ">= 88 % at batch >= 64" if s["batch"] >= 64 else "-",
                         verdict(s["share_of_peak"] >= 0.88) if s["batch"] >= 64 else "-"))
    if big:
        worst = min(s["share_of_peak"] for s in big)
        rows.append(("selective state update, worst of batch >= 64", f"{100 * worst:.1f} % of peak",
                     ">= 88 %", verdict(worst >= 0.88)))
    for s in j.get("ssd", []):
        rows.append((f"SSD chunk scan, {s['seqlen']} tokens", f"{s['tok_s']:.3g} tokens/s", "> 2.4e7",
                     verdict(s["tok_s"] > 2.4e7)))
    # Every m the benchmark ran (1, 8, 64): the deterministic kernel's worst
    # shares are at m = 8 and 64, which batch decode runs.
    for m in j.get("matmul", []):
        rows.append((f"matmul decode m={m['m']}, {m['dtype']} {m['mode']}",
                     f"{100 * m['share_of_copy']:.1f} % of copy ({m['us']:.1f} us)", "-", "-"))
    return rows


def transfer_figures(log):
    rows = []
    for m in re.finditer(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+>=0\.9\s*$", log, re.M):
        n, plane, copy, ratio = int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))
        rows.append((f"CUDA IPC transfer, {n / 2**20:g} MiB", f"{ratio:.3f} of a device copy ({plane:.0f} vs "
                     f"{copy:.0f} GB/s)", ">= 0.9", verdict(ratio >= 0.9)))
    return rows


def throughput_figures(log, label):
    j = json_line(log)
    rows = []
    if j is None:
        return rows
    if j.get("bandwidth_gbs"):
        rows.append((f"{label}: device copy bandwidth", f"{j['bandwidth_gbs']:.0f} GB/s", "-", "-"))
    for b, d in sorted(j.get("decode", {}).items(), key=lambda kv: int(kv[0])):
        share = d.get("bandwidth_share")
        rows.append((f"{label}: decode batch {b}", f"{d['tok_s']:.1f} tok/s" +
                     (f", {100 * share:.1f} % of the HBM bound" if share is not None else ""),
                     ">= 80 % of the HBM bound" if b == "1" else "-",
                     verdict(share >= 0.8) if b == "1" and share is not None else "-"))
    for n, p in sorted(j.get("prefill", {}).items(), key=lambda kv: int(kv[0])):
        rows.append((f"{label}: prefill {n} tokens", f"{p['tok_s']:.0f} tok/s", "-", "-"))
    return rows


def serving_figures(log):
    rows = []
    pat = r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+<=1\.05\s+(-?[\d.]+)%\s+<=2%\s*$"
    for m in re.finditer(pat, log, re.M):
        n, d, a, ratio, share = m.group(1), float(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5))
        rows.append((f"disaggregated / aggregated TTFT, {n} tokens (CUDA IPC)",
                     f"{ratio:.3f} ({d:.1f} / {a:.1f} ms; transfer "
                     + (f"{share:.2f} % of TTFT)" if share >= 0 else "share unknown)"), "<= 1.05",
                     verdict(ratio <= 1.05)))
    return rows


MAX_NOTES = 6  # failed or skipped cases listed per step

FIGURES = {
    "cuda_kernels_bench": kernel_figures,
    "gpu_transfer_bench": transfer_figures,
    "throughput_bench": lambda log: throughput_figures(log, "bench model (127M, bf16)"),
    "throughput_bench_1b": lambda log: throughput_figures(log, "1b model (0.93B, bf16)"),
    "serving_bench": serving_figures,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--machine", default="")
    args = ap.parse_args()
    steps = []
    for line in read(args.steps).splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            steps.append(parts)

    out = ["# hybridserve GPU run", ""]
    out += [f"    {l}" for l in read(args.machine).splitlines()] + [""]
    out += ["## Tests (HS_REQUIRE_GPUS=1: a GPU case that cannot run fails)", "",
            "| step | outcome | passed | failed | skipped | seconds |", "| --- | --- | --- | --- | --- | --- |"]
    notes = []
    for name, kind, rc, secs in steps:
        if kind != "test":
            continue
        cases = gtest_cases(os.path.join(args.logs, name + ".xml"))
        if cases is None:
            counts = ("-", "-", "-")
            tail = first_line("\n".join(read(os.path.join(args.logs, name + ".log")).splitlines()[-3:]))
            if rc != "budget":
                notes.append(f"- {name}: no gtest report (exit {rc}); log ends: `{tail}`")
        else:
            counts = tuple(str(sum(1 for c in cases if c[1] == o)) for o in ("passed", "FAILED", "skipped"))
            listed = [c for c in cases if c[1] != "passed"]
            for case, outcome, message in listed[:MAX_NOTES]:
                notes.append(f"- {name}: {outcome} {case}: {first_line(message)}")
            if len(listed) > MAX_NOTES:
                notes.append(f"- {name}: ... and {len(listed) - MAX_NOTES} more failed or skipped (logs.tar.gz)")
            if not cases and rc == "0":
                notes.append(f"- {name}: NO CASES matched the filter")
        if rc == "budget":
            outcome = "not run (budget)"
        elif rc == "0":
            outcome = "PASSED" if cases else "PASSED (no cases?)"
        else:
            outcome = f"FAILED ({rc})"
        out.append(f"| {name} | {outcome} | {' | '.join(counts)} | {secs} |")
    out += [""] + notes + [""]

    out += ["## Figures against their goals", "", "| figure | value | goal | verdict |", "| --- | --- | --- | --- |"]
    bench_notes = []
    for name, kind, rc, secs in steps:
        if kind != "bench":
            continue
        log = read(os.path.join(args.logs, name + ".log"))
        rows = FIGURES.get(name, lambda _: [])(log)
        for figure, value, goal, v in rows:
            out.append(f"| {figure} | {value} | {goal} | {v} |")
        if rc != "0" or not rows:
            tail = first_line("\n".join(log.splitlines()[-3:]))
            bench_notes.append(f"- {name}: exit {rc} after {secs} s, {len(rows)} figures; log ends: `{tail}`")
    out += [""] + bench_notes
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
