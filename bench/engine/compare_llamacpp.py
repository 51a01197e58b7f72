#!/usr/bin/env python3
"""hybridserve vs llama.cpp on the same weights, measured in one run (the issue's comparison).

Rules (identical on both sides): the same weights converted once (fp32 directory -> f32 GGUF,
bf16 directory -> bf16 GGUF, bench/llamacpp/convert.sh), the same token ids (one token file
per model, written here), context length, step count and thread count; timed regions hold
the same work (prefill: L tokens on cleared state, last-token logits; decode: the model's
decode steps only, greedy argmax outside on both sides); the same clean-repetition rule (a rep
is clean when other processes used <= --max-other-cpu x its wall seconds of CPU); medians of
--reps (>= 3) clean reps.

Parts (each can be skipped; files accumulate in --out, and the report is rebuilt from every
result file there, so parts can be run separately and --report-only regenerates results.md):

  main     per model x dtype: prefill --prefill, decode --batches (+ the sweep batches),
           ours with --bandwidth; table of tok/s, ratio ours/llama.cpp, goal (ratio >= 1)
  sweep    decode tok/s at --sweep-batches on both sides (llama.cpp: unsupported batches are
           marked), a table and sweep.json + sweep.png (bench/engine/plot_batch_sweep.py)
  loaded   for --loaded MODEL:DTYPE,...: decode b=1 and prefill 2048 on both sides without and
           then with one competing `python3 -c "while True: pass"` (unpinned, --max-other-cpu
           1e9 while it runs); goal: our loaded/unloaded ratio >= llama.cpp's
  scale    ours only: prefill 131072 (mamba2; the main table has 32768 for both models), tok/s
           and peak RSS, one process per length

    bazel build -c opt //bench/engine:throughput_bench
    bench/llamacpp/convert.sh /tmp/hs-bench
    python3 bench/engine/compare_llamacpp.py --out /tmp/hs-bench/compare      # everything
    python3 bench/engine/compare_llamacpp.py --quick --skip-sweep --skip-loaded --skip-scale

Model directories: HS_DIR/MODEL[-bf16], GGUFs: HS_DIR/gguf/MODEL-DTYPE.gguf (MODEL: one of MODELS,
the names bench/llamacpp/convert.sh writes). The families of issue 29 alone, at prefill 2048 and
decode b=1 and 8:

    python3 bench/engine/compare_llamacpp.py --out /tmp/hs-bench/compare-families \
        --models bamba,granitemoehybrid,nemotron_h_moe --prefill 2048 --batches 1,8 \
        --skip-sweep --skip-loaded --skip-scale
"""

import argparse
import datetime
import glob
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Appended, never reordered: a model's token ids are seeded with its index here.
MODELS = ("nemotron_h", "mamba2", "bamba", "granitemoehybrid", "nemotron_h_moe", "falcon_h1", "qwen3_5", "qwen3_5_moe")
DTYPES = ("f32", "bf16")
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16")
# Beyond the main table's 32K (which records peak RSS per length too): Mamba2 at 128K.
# Nemotron-H's attention makes 128K a quarter hour on 2 cores; its 512-32K columns show
# the quadratic term.
SCALE_LENGTHS = {"mamba2": [131072]}
LOADED_PREFILL, LOADED_BATCH = 2048, 1


def int_list(s):
    return [int(x) for x in s.split(",") if x.strip()]


def cpuinfo():
    name, flags = platform.machine(), set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and name == platform.machine():
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return name, [fl for fl in SIMD_FLAGS if fl in flags]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Driver:
    def __init__(self, args):
        self.a = args
        self.out = args.out
        os.makedirs(self.out, exist_ok=True)
        self._bench = args.bench

    # ---------------------------------------------------------------- paths
    def model_dir(self, m, dt):
        return os.path.join(self.a.hs_dir, m if dt == "f32" else f"{m}-bf16")

    def gguf(self, m, dt):
        return os.path.join(self.a.hs_dir, "gguf", f"{m}-{dt}.gguf")

    def result(self, side, phase, m, dt):
        return os.path.join(self.out, f"{side}-{phase}-{m}-{dt}.json")

    def bench(self):
        if self._bench is None:
            bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout.strip()
            self._bench = os.path.join(bin_dir, "bench/engine/throughput_bench")
        if not os.access(self._bench, os.X_OK):
            sys.exit(f"{self._bench} not found: bazel build -c opt //bench/engine:throughput_bench (or --bench)")
        return self._bench

    # ---------------------------------------------------------------- tokens
    def tokens(self, m, need_prompt, need_seqs):
        """The model's token file (written once per model and reused while it is long enough)."""
        path = os.path.join(self.out, f"tokens-{m}.json")
        if os.path.exists(path):
            with open(path) as f:
                tok = json.load(f)
            if (len(tok["prompt"]) >= need_prompt and len(tok["decode_prompts"]) >= need_seqs
                    and all(len(p) >= self.a.decode_context for p in tok["decode_prompts"])):
                return path
            log(f"# {path} too short for this run, rewriting it (same seed: a prefix of the same ids)")
        vocab = set()
        for dt in DTYPES:
            cfg = os.path.join(self.model_dir(m, dt), "config.json")
            if os.path.exists(cfg):
                with open(cfg) as f:
                    c = json.load(f)
                    vocab.add(int(c.get("text_config", c)["vocab_size"]))  # Qwen3.5-MoE nests the text model
        if len(vocab) != 1:
            sys.exit(f"{m}: vocab_size missing or different between the f32 and bf16 directories: {vocab}")
        vocab = vocab.pop()
        rng = np.random.default_rng([self.a.seed, MODELS.index(m)])
        # prompt first, then the decode prompts: longer files keep the same prefix of ids.
        prompt = rng.integers(3, vocab, size=max(need_prompt, 131072)).tolist()
        dctx = max(self.a.decode_context, 128)
        dp = rng.integers(3, vocab, size=(max(need_seqs, 64), dctx)).tolist()
        with open(path, "w") as f:
            json.dump({"model": m, "vocab_size": vocab, "seed": self.a.seed, "prompt": prompt, "decode_prompts": dp}, f)
        return path

    # ---------------------------------------------------------------- runs
    def _run(self, cmd, logpath):
        log("$ " + " ".join(shlex.quote(c) for c in cmd))
        t0 = time.time()
        with open(logpath, "w") as lf:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=lf, text=True)
            lf.write("\n--- stdout ---\n" + p.stdout)
        log(f"  rc={p.returncode} in {time.time() - t0:.0f} s (log {logpath})")
        res = None
        for line in reversed(p.stdout.splitlines()):
            line = line.strip()
            if line.startswith("JSON "):
                res = json.loads(line[5:])
                break
            if line.startswith("{"):
                res = json.loads(line)
                break
        return p.returncode, res

    def run_ours(self, phase, m, dt, prefill, batches, max_other, tokens, bandwidth=False, reps=None):
        cmd = [self.bench(), "--model", self.model_dir(m, dt), "--threads", str(self.a.threads),
               "--mode", self.a.mode, "--tokens", tokens,
               "--prefill", ",".join(map(str, prefill)), "--batches", ",".join(map(str, batches)),
               "--decode_context", str(self.a.decode_context), "--decode_steps", str(self.a.decode_steps),
               "--reps", str(reps or self.a.reps), "--max_tries", str(self.a.max_tries),
               "--max_other_cpu", repr(max_other)]
        if bandwidth:
            cmd.append("--bandwidth")
        path = self.result("ours", phase, m, dt)
        rc, res = self._run(cmd, path[:-5] + ".log")
        if res is None:
            res = {"engine": "hybridserve", "error": f"rc={rc}, no JSON line (see log)", "prefill": {}, "decode": {}}
        if res.get("version", "unknown") == "unknown":
            res["version"] = git_version()
        res["cmd"] = cmd
        self._save(path, res)
        return res

    def run_llama(self, phase, m, dt, prefill, batches, max_other, tokens):
        base = [sys.executable, os.path.join(ROOT, "bench/llamacpp/run_llamacpp_bench.py"),
                "--gguf", self.gguf(m, dt), "--tokens", tokens, "--threads", str(self.a.threads),
                "--decode-context", str(self.a.decode_context), "--decode-steps", str(self.a.decode_steps),
                "--reps", str(self.a.reps), "--max-tries", str(self.a.max_tries),
                "--max-other-cpu", repr(max_other), "--flash-attn", self.a.flash_attn]
        if self.a.verify_batch:
            base += ["--verify-batch", str(self.a.verify_batch)]
        path = self.result("llama", phase, m, dt)
        cmd = base + ["--prefill", ",".join(map(str, prefill)), "--batches", ",".join(map(str, batches))]
        rc, res = self._run(cmd, path[:-5] + ".log")
        if res is None and len(batches) > 1:
            # A llama.cpp abort (GGML_ASSERT) kills the process: measure batch by batch instead.
            log("  llama.cpp run failed; retrying prefill and each batch in its own process")
            res = {"prefill": {}, "decode": {}, "contended": []}
            parts = ([("prefill", prefill, [])] if prefill else []) + [(f"b{b}", [], [b]) for b in batches]
            for tag, pf, bs in parts:
                rc2, r = self._run(base + ["--prefill", ",".join(map(str, pf)), "--batches", ",".join(map(str, bs))],
                                   path[:-5] + f"-{tag}.log")
                if r is None:
                    for b in bs:
                        res["decode"][str(b)] = {"unsupported": f"process failed rc={rc2} (see log)"}
                    for L in pf:
                        res["prefill"][str(L)] = {"error": f"process failed rc={rc2}"}
                    continue
                pre_p, pre_d, pre_c = res["prefill"], res["decode"], res["contended"]
                res.update({k: v for k, v in r.items() if k not in ("prefill", "decode", "contended")})
                res["prefill"], res["decode"] = {**pre_p, **r["prefill"]}, {**pre_d, **r["decode"]}
                res["contended"] = pre_c + r.get("contended", [])
        if res is None:
            res = {"engine": "llama.cpp", "error": f"rc={rc}, no JSON line (see log)", "prefill": {}, "decode": {}}
        res["cmd"] = cmd
        self._save(path, res)
        return res

    def _save(self, path, res):
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    # ---------------------------------------------------------------- phases
    def combos(self):
        return [(m, dt) for m in self.a.models for dt in self.a.dtypes]

    def main_phase(self):
        prefill = [] if self.a.skip_main else self.a.prefill
        batches = sorted(set(([] if self.a.skip_main else self.a.batches) +
                             ([] if self.a.skip_sweep else self.a.sweep_batches)))
        if not prefill and not batches:
            return
        for i, (m, dt) in enumerate(self.combos()):
            tok = self.tokens(m, max(prefill + [max(self.scale_lengths(m), default=0)]), max(batches, default=1))
            sides = self.a.sides
            if self.a.alternate and i % 2 == 1:
                sides = list(reversed(sides))
            for side in sides:
                log(f"== main {m} {dt} {side}")
                if side == "ours":
                    self.run_ours("main", m, dt, prefill, batches, self.a.max_other_cpu, tok, bandwidth=True)
                else:
                    self.run_llama("main", m, dt, prefill, batches, self.a.max_other_cpu, tok)

    def loaded_phase(self):
        for m, dt in self.a.loaded:
            tok = self.tokens(m, LOADED_PREFILL, LOADED_BATCH)
            for cond in ("unloaded", "loaded"):
                comp = None
                if cond == "loaded":
                    comp = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    time.sleep(1.0)
                try:
                    for side in self.a.sides:
                        log(f"== loaded pair {m} {dt} {side} {cond}")
                        c0 = proc_cpu_s(comp.pid) if comp else None
                        t0 = time.time()
                        max_other = 1e9 if comp else self.a.max_other_cpu
                        if side == "ours":
                            res = self.run_ours(f"{cond}", m, dt, [LOADED_PREFILL], [LOADED_BATCH], max_other, tok)
                        else:
                            res = self.run_llama(f"{cond}", m, dt, [LOADED_PREFILL], [LOADED_BATCH], max_other, tok)
                        if comp:
                            # How much CPU the competitor actually got while this side ran.
                            res["competitor_cpu_share"] = round((proc_cpu_s(comp.pid) - c0) / (time.time() - t0), 3)
                            self._save(self.result("ours" if side == "ours" else "llama", cond, m, dt), res)
                finally:
                    if comp:
                        comp.kill()
                        comp.wait()

    def scale_lengths(self, m):
        return [] if self.a.skip_scale else SCALE_LENGTHS.get(m, [])

    def scale_phase(self):
        if "ours" not in self.a.sides:
            return
        for m in self.a.models:
            for dt in self.a.scale_dtypes:
                for L in self.scale_lengths(m):
                    log(f"== scale {m} {dt} prefill {L}")
                    tok = self.tokens(m, L, 1)
                    self.run_ours(f"scale{L}", m, dt, [L], [], self.a.max_other_cpu, tok, reps=self.a.scale_reps)

    # ---------------------------------------------------------------- report
    def load(self, side, phase, m, dt):
        try:
            with open(self.result(side, phase, m, dt)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def report(self):
        L = []  # markdown lines
        a = self.a
        cpu, flags = cpuinfo()
        L.append(f"# hybridserve vs llama.cpp, {datetime.datetime.now().isoformat(timespec='seconds')}")
        L.append("")
        L.append(f"- host: {platform.node()}, CPU: {cpu}, {os.cpu_count()} logical CPUs, "
                 f"SIMD flags: {' '.join(flags)}")
        L.append(f"- rules: {a.threads} threads both sides, decode context {a.decode_context} tokens, "
                 f"{a.decode_steps} decode steps, medians of {a.reps} clean reps (clean: other processes "
                 f"<= {a.max_other_cpu} x wall CPU-s, up to {a.max_tries} tries), token ids from "
                 f"{self.out}/tokens-MODEL.json, ours --mode {a.mode}, llama.cpp flash-attn {a.flash_attn}")
        L.append("- timed: prefill = L tokens on cleared state, last-token logits; decode = decode steps only "
                 "(greedy argmax and next-batch building outside the timed region on both sides)")
        versions, runflags, contended = {}, {}, []
        for side in ("ours", "llama"):
            for f in sorted(glob.glob(os.path.join(self.out, f"{side}-*.json"))):
                try:
                    with open(f) as fh:
                        r = json.load(fh)
                except ValueError:
                    continue
                name = os.path.basename(f)[:-5]
                if "version" in r:
                    versions.setdefault(side, set()).add(r["version"])
                if "cpu_flags" in r:
                    runflags.setdefault((r.get("cpu", "?"), " ".join(sorted(r["cpu_flags"]))), []).append(name)
                for c in r.get("contended", []):
                    contended.append(f"{name}:{c}")
                if r.get("error"):
                    contended.append(f"{name}: ERROR {r['error']}")
        L.append(f"- hybridserve version: {', '.join(sorted(versions.get('ours', {'(no result)'})))}")
        L.append(f"- llama.cpp version: {', '.join(sorted(versions.get('llama', {'(no result)'})))}")
        for (c, fl), names in runflags.items():
            L.append(f"- CPU/flags recorded by {len(names)} run(s) ({', '.join(names[:4])}"
                     f"{', ...' if len(names) > 4 else ''}): {c}: {fl}")
        if len(runflags) > 1:
            L.append("- **WARNING: runs recorded different CPUs/flags**")
        for m, dt in self.combos():
            r = self.load("llama", "main", m, dt)
            if not r:
                continue
            want = {"threads": a.threads, "decode_context": a.decode_context, "decode_steps": a.decode_steps,
                    "reps": a.reps, "max_other_cpu": a.max_other_cpu}
            diff = {k: r.get(k) for k, v in want.items() if k in r and r[k] != v}
            if diff:
                L.append(f"- **WARNING: llama-main-{m}-{dt} was run with other settings than these: {diff}**")
        sysinfo = {r.get("system_info") for m, dt in self.combos() for r in [self.load("llama", "main", m, dt)] if r}
        for s in sorted(x for x in sysinfo if x):
            L.append(f"- llama_print_system_info: `{s}`")
        L.append("")

        rows = []
        for m in a.models:
            desc = model_summary(self.model_dir(m, "f32"))
            if desc:
                rows.append([m] + desc)
        if rows:
            L.append("## Models")
            L.append("")
            L += md_table(["model", "architecture", "layers", "experts (top-k / routed; shared inter)",
                           "hidden", "vocab"], rows)
            L.append("")

        # main table
        rows = []
        for m, dt in self.combos():
            o, t = self.load("ours", "main", m, dt), self.load("llama", "main", m, dt)
            if not o and not t:
                continue
            cells = [("prefill", str(n), f"prefill {n}") for n in a.prefill] + \
                    [("decode", str(b), f"decode b={b}") for b in a.batches]
            for kind, key, label in cells:
                oc, tc = cell(o, kind, key), cell(t, kind, key)
                if oc is None and tc is None:
                    continue
                rows.append([m, dt, label] + ratio_cols(oc, tc))
        if rows:
            L.append("## Throughput (tokens/s, median; ratio = ours / llama.cpp; goal: ratio >= 1.0)")
            L.append("")
            L += md_table(["model", "dtype", "cell", "ours", "llama.cpp", "ratio", "goal", "limit", "notes"], rows)
            L.append("")

        # kernel path + bandwidth
        rows = []
        for m, dt in self.combos():
            o = self.load("ours", "main", m, dt)
            if not o or o.get("error"):
                continue
            d1 = (o.get("decode") or {}).get("1") or {}
            bps, share, bw = d1.get("bytes_per_step"), d1.get("bandwidth_share"), o.get("bandwidth_gbs")
            achieved = d1["tok_s"] * bps / 1e9 if bps and d1.get("tok_s") else None
            rows.append([m, dt, o.get("kernel_path", "?"), fmt(d1.get("tok_s")), fmt_bytes(bps), fmt(achieved, 2),
                         fmt(bw, 2), "" if share is None else f"{100 * share:.0f}%"])
        if rows:
            L.append("## Our kernel path and decode b=1 bandwidth share")
            L.append("")
            L += md_table(["model", "dtype", "kernel path", "decode b=1 tok/s", "bytes/step", "achieved GB/s",
                           "measured read GB/s", "share"], rows)
            L.append("")

        # sweep
        if not a.skip_sweep:
            sweep = {"batches": a.sweep_batches, "threads": a.threads, "series": []}
            rows = []
            for m, dt in self.combos():
                o, t = self.load("ours", "main", m, dt), self.load("llama", "main", m, dt)
                if not o and not t:
                    continue
                s = {"model": m, "dtype": dt, "ours": {}, "llama.cpp": {}, "llama_unsupported": []}
                for b in a.sweep_batches:
                    oc, tc = cell(o, "decode", str(b)), cell(t, "decode", str(b))
                    s["ours"][str(b)] = oc["tok_s"] if oc and "tok_s" in oc else None
                    if tc and "unsupported" in tc:
                        s["llama_unsupported"].append(b)
                    s["llama.cpp"][str(b)] = tc["tok_s"] if tc and "tok_s" in tc else None
                    rows.append([m, dt, str(b)] + ratio_cols(oc, tc)[:3] + [ratio_cols(oc, tc)[5]])
                sweep["series"].append(s)
            if rows:
                spath, ppath = os.path.join(self.out, "sweep.json"), os.path.join(self.out, "sweep.png")
                self._save(spath, sweep)
                plot = subprocess.run([sys.executable, os.path.join(ROOT, "bench/engine/plot_batch_sweep.py"),
                                       spath, ppath], capture_output=True, text=True)
                L.append("## Decode batch sweep (tokens/s, all sequences together)")
                L.append("")
                L += md_table(["model", "dtype", "batch", "ours", "llama.cpp", "ratio", "notes"], rows)
                L.append("")
                L.append(f"Plot: {ppath}" if plot.returncode == 0 else f"Plot failed: {plot.stderr.strip()[-300:]}")
                L.append("")

        # loaded pair
        rows = []
        for m, dt in a.loaded:
            for kind, key, label in (("decode", str(LOADED_BATCH), f"decode b={LOADED_BATCH}"),
                                     ("prefill", str(LOADED_PREFILL), f"prefill {LOADED_PREFILL}")):
                vals = {}
                for side in ("ours", "llama"):
                    u, ld = self.load(side, "unloaded", m, dt), self.load(side, "loaded", m, dt)
                    uc, lc = cell(u, kind, key), cell(ld, kind, key)
                    if uc and lc and uc.get("tok_s") and lc.get("tok_s"):
                        vals[side] = (uc["tok_s"], lc["tok_s"], lc["tok_s"] / uc["tok_s"],
                                      ld.get("competitor_cpu_share"), not uc.get("clean", True))
                if not vals:
                    continue
                o, t = vals.get("ours"), vals.get("llama")
                goal = "n/a"
                if o and t:
                    goal = "met" if o[2] >= t[2] else "MISSED"
                rows.append([m, dt, label,
                             *(fmt(v[0]) if v else "-" for v in (o, t)),
                             *(fmt(v[1]) if v else "-" for v in (o, t)),
                             *(f"{v[2]:.2f}" if v else "-" for v in (o, t)),
                             goal, "(fill from profile)" if goal == "MISSED" else "",
                             "; ".join(f"{n}: competitor got {v[3]:.2f} CPU" + (", unloaded contended" if v[4] else "")
                                       for n, v in (("ours", o), ("llama.cpp", t)) if v and v[3] is not None)])
        if rows:
            L.append("## Loaded machine (one competing busy process; same run, without and with it)")
            L.append("")
            L.append("goal: ours loaded/unloaded >= llama.cpp loaded/unloaded")
            L.append("")
            L += md_table(["model", "dtype", "cell", "ours unloaded", "llama.cpp unloaded", "ours loaded",
                           "llama.cpp loaded", "ours kept", "llama.cpp kept", "goal", "limit", "notes"], rows)
            L.append("")

        # scale
        rows = []
        for m in a.models:
            for dt in a.scale_dtypes:
                for n in SCALE_LENGTHS.get(m, []):
                    o = self.load("ours", f"scale{n}", m, dt)
                    c = cell(o, "prefill", str(n))
                    if not o:
                        continue
                    if not c or "tok_s" not in c:
                        rows.append([m, dt, str(n), "error", "", "", o.get("error", "")])
                        continue
                    rss = c.get("peak_rss_mib", o.get("peak_rss_mib"))
                    reps = len(c.get("s_all", [])) if o.get("reps", 3) == 1 else o.get("reps")
                    rows.append([m, dt, str(n), fmt(c["tok_s"]), fmt(rss, 0), fmt_bytes(o.get("weight_bytes")),
                                 ("" if c.get("clean", True) else "contended; ") + f"median of {reps} rep(s)"])
        if rows:
            L.append("## Scale (ours only, prefill, one process per length; the main table's prefill columns "
                     "record peak RSS at 512-32K too)")
            L.append("")
            L += md_table(["model", "dtype", "tokens", "tok/s", "peak RSS MiB", "weights", "notes"], rows)
            L.append("")

        L.append("## Contended measurements and errors")
        L.append("")
        L += [f"- {c}" for c in contended] or ["- none"]
        L.append("")
        L.append(f"Raw JSON and logs: {self.out}")
        text = "\n".join(L) + "\n"
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(text)
        print(text)


def git_version():
    """The checkout's commit (with -dirty when it has local changes): our side's version."""
    p = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def model_summary(model_dir):
    """[architecture, layer pattern, experts, hidden, vocab] from config.json, or None."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return None
    arch = (c.get("architectures") or ["?"])[0]
    c = {**c, **c.get("text_config", {})}  # Qwen3.5-MoE's image-text form: the text model's fields
    linear = "D" if c.get("linear_num_value_heads") else "M"  # Gated DeltaNet or Mamba2 layers
    if c.get("hybrid_override_pattern"):
        pattern = c["hybrid_override_pattern"]
    elif c.get("layer_types"):
        pattern = "".join("*" if "attention" in t and "linear" not in t else linear for t in c["layer_types"])
    elif c.get("full_attention_interval"):
        n = c["full_attention_interval"]
        pattern = "".join("*" if (i + 1) % n == 0 else linear for i in range(c["num_hidden_layers"]))
    elif "attn_layer_indices" in c:
        pattern = "".join("*" if i in c["attn_layer_indices"] else "M" for i in range(c["num_hidden_layers"]))
    else:
        pattern = f"{c.get('num_hidden_layers', '?')} layers"
    experts = c.get("num_local_experts") or c.get("n_routed_experts") or c.get("num_experts") or 0
    shared = (c.get("shared_intermediate_size") or c.get("moe_shared_expert_intermediate_size")
              or c.get("shared_expert_intermediate_size"))
    moe = f"{c.get('num_experts_per_tok')} / {experts}; {shared}" if experts else "-"
    return [arch, pattern, moe, str(c.get("hidden_size")), str(c.get("vocab_size"))]


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def cell(res, kind, key):
    if not res:
        return None
    return (res.get(kind) or {}).get(key)


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def fmt_bytes(b):
    return "-" if b is None else f"{b / 1e6:.0f} MB"


def ratio_cols(oc, tc):
    """[ours, llama, ratio, goal, limit, notes] for one cell."""
    notes = []
    o = oc.get("tok_s") if oc else None
    t = tc.get("tok_s") if tc else None
    if tc and "unsupported" in tc:
        notes.append("llama.cpp: unsupported")
    for n, c in (("ours", oc), ("llama.cpp", tc)):
        if c and c.get("clean") is False:
            notes.append(f"{n} contended")
        if c and c.get("error"):
            notes.append(f"{n}: {c['error']}")
    if o is None or t is None:
        return [fmt(o), fmt(t) if not (tc and "unsupported" in tc) else "unsupported", "-", "n/a", "",
                "; ".join(notes)]
    r = o / t
    goal = "met" if r >= 1.0 else "MISSED"
    return [fmt(o), fmt(t), f"{r:.2f}", goal, "(fill from profile)" if goal == "MISSED" else "", "; ".join(notes)]


def md_table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/hs-bench/compare", help="directory for raw JSON, logs, results.md")
    ap.add_argument("--hs-dir", default="/tmp/hs-bench", help="model directories and gguf/ (convert.sh OUT_DIR)")
    ap.add_argument("--bench", default=None, help="throughput_bench binary (default: bazel-bin of -c opt)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--sides", default="ours,llama", help="ours,llama (one of them to run a single side)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=["deterministic", "fast"], default="deterministic", help="our matmul mode")
    ap.add_argument("--prefill", default="512,2048,8192,32768")
    ap.add_argument("--batches", default="1,8", help="decode batches of the main table")
    ap.add_argument("--sweep-batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--decode-context", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tries", type=int, default=12)
    ap.add_argument("--max-other-cpu", type=float, default=0.10)
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on", help="llama.cpp flash attention")
    ap.add_argument("--verify-batch", type=int, default=0, help="llama.cpp batch-vs-single greedy check (0: off)")
    ap.add_argument("--loaded", default=None,
                    help="MODEL:DTYPE,... for the loaded-machine pair (e.g. nemotron_h:bf16,nemotron_h:f32; "
                         "default nemotron_h:bf16 when --models has nemotron_h, else none)")
    ap.add_argument("--scale-dtypes", default=None, help="dtypes for the scale part (default: --dtypes)")
    ap.add_argument("--scale-reps", type=int, default=None, help="reps for the scale part (default: --reps)")
    ap.add_argument("--seed", type=int, default=0, help="token ids")
    ap.add_argument("--no-alternate", dest="alternate", action="store_false",
                    help="always run ours first (default: alternate which side runs first per model/dtype)")
    ap.add_argument("--quick", action="store_true", help="prefill 512,2048 and batches 1,8 (reps stay 3)")
    ap.add_argument("--skip-main", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-loaded", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="rebuild results.md from the files in --out")
    a = ap.parse_args()
    if a.quick:
        a.prefill, a.batches = "512,2048", "1,8"
    a.models = [m for m in a.models.split(",") if m]
    a.dtypes = [d for d in a.dtypes.split(",") if d]
    a.sides = [s for s in a.sides.split(",") if s]
    a.scale_dtypes = a.dtypes if a.scale_dtypes is None else [d for d in a.scale_dtypes.split(",") if d]
    a.scale_reps = a.scale_reps or a.reps
    a.prefill, a.batches, a.sweep_batches = int_list(a.prefill), int_list(a.batches), int_list(a.sweep_batches)
    if a.loaded is None:
        a.loaded = "nemotron_h:bf16" if "nemotron_h" in a.models else ""
    a.loaded = [] if a.skip_loaded else [tuple(x.split(":")) for x in a.loaded.split(",") if x]
    for bad in set(a.models) - set(MODELS):
        sys.exit(f"unknown model {bad}")
    for bad in set(a.dtypes) - set(DTYPES):
        sys.exit(f"unknown dtype {bad}")
    for bad in set(a.sides) - {"ours", "llama"}:
        sys.exit(f"unknown side {bad}")
    if a.reps < 3:
        log("# warning: the rules ask for medians of at least 3 reps")

    d = Driver(a)
    if not a.report_only:
        with open(os.path.join(a.out, "runs.jsonl"), "a") as f:
            f.write(json.dumps({"start": datetime.datetime.now().isoformat(timespec="seconds"),
                                "argv": sys.argv, "cpu": cpuinfo(), "loadavg": os.getloadavg()}) + "\n")
        for m, dt in d.combos() + [(m, dt) for m, dt in a.loaded]:
            if "ours" in a.sides and not os.path.exists(os.path.join(d.model_dir(m, dt), "config.json")):
                sys.exit(f"missing {d.model_dir(m, dt)} (bench/llamacpp/convert.sh)")
            if "llama" in a.sides and not os.path.exists(d.gguf(m, dt)):
                sys.exit(f"missing {d.gguf(m, dt)} (bench/llamacpp/convert.sh)")
        d.main_phase()
        if a.loaded:
            d.loaded_phase()
        if not a.skip_scale:
            d.scale_phase()
    d.report()


if __name__ == "__main__":
    main()
