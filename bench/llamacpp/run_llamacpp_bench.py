#!/usr/bin/env python3
"""llama.cpp CPU baseline (through llama-cpp-python) for hybridserve's bench models.

Usage:
    python3 bench/llamacpp/run_llamacpp_bench.py --gguf /tmp/hs-bench/gguf/nemotron_h-f32.gguf \
        [--tokens TOKENS.json] [--threads 2] [--prefill 512,2048,8192,32768] \
        [--decode-context 128] [--decode-steps 64] [--batches 1,8] \
        [--reps 3] [--max-tries 12] [--max-other-cpu 0.10] \
        [--n-batch 2048] [--n-ubatch 512] [--flash-attn on|off] [--verify-batch B] \
        [--n-gpu-layers N] [--label X] [--out results.jsonl]

The rules are the same as hybridserve's bench/engine/throughput_bench (the driver
bench/engine/compare_llamacpp.py runs both with identical settings):

tokens     --tokens FILE is JSON {"prompt": [ids...], "decode_prompts": [[ids...], ...]}.
           Prefill of length L uses prompt[:L]; decode at batch B uses decode_prompts[:B]
           (each --decode-context ids long). Without --tokens, seeded random ids in
           [3, n_vocab) are used (--seed).
prefill    Low-level API, own context (n_seq_max 1). Each rep: llama_memory_clear, then the
           L tokens go to llama_decode in --n-batch chunks (llama.cpp splits each chunk into
           --n-ubatch micro-batches); only the very last token requests logits. Timed: all
           llama_decode calls + llama_synchronize. tok/s = L / median s.
decode     Own context per batch B (n_seq_max = B, seq ids 0..B-1). Untimed: clear the memory,
           prefill the B prompts in one llama_batch, argmax of each sequence's last logits.
           Then --decode-steps steps; step s feeds one token per sequence (step 0: the argmax
           of the prompt's last logits, step s: the argmax of step s-1). Timed: only
           llama_decode + llama_synchronize of each step (perf_counter around them, summed);
           the greedy argmax (numpy) and building the next batch are outside the timed region
           (hybridserve times Model::DecodeStep only). tok/s = B * steps / median s. A batch
           llama.cpp refuses (context creation or llama_decode error) is recorded as
           {"unsupported": "..."} and the run goes on.
clean reps A rep is clean when the CPU time used by OTHER processes during the rep is at most
           --max-other-cpu x the rep's wall seconds (the rep's window: the whole prefill; for
           decode the steps loop, from before step 0 to after the last step, without the
           untimed prompt prefill): (busy jiffies of the whole machine from
           /proc/stat "cpu": user+nice+system+irq+softirq+steal) minus (this process's
           utime+stime from /proc/self/stat), both as deltas over the rep, in seconds
           (SC_CLK_TCK). Reps are repeated until --reps clean ones or --max-tries attempts;
           with too few clean reps the cleanest --reps are used and the measurement is listed
           under "contended". --max-other-cpu 1e9 accepts every rep (loaded-machine runs).
           Per attempt: timed s, window wall s, other-CPU s and own utilisation
           (own CPU s / (wall s x threads); llama.cpp's OpenMP threads spin, ~1.0 is normal).

--verify-batch B (optional) decodes each of the B sequences of the batch-B run alone and
reports how many greedy outputs are identical (batch_vs_single_identical_seqs).

--n-gpu-layers N (optional) offloads N layers (-1: all) to the GPU of a llama-cpp-python built
with CUDA (tools/gpu_bundle/anchors/build_wheels.sh llamacpp; run on the GPU machine by
tools/gpu_bundle/anchors/llamacpp_gpu.sh). Refused when the library has no GPU offload, so a
CPU build never reports a "GPU" figure. Without it, llama.cpp's default applies (a CPU-only
build, as everywhere else in this directory, runs on the CPU). The JSON then records
n_gpu_layers and the GPU (nvidia-smi); timings are still llama_decode + llama_synchronize.

Prints one JSON line (appended to --out as well) with: llama-cpp-python version, llama.cpp
commit, llama_print_system_info(), CPU model and SIMD flags, threads, dtype, settings, and per
measurement median and best tok/s plus every attempt. Per-measurement layout is the same as
throughput_bench's: "prefill": {"512": {...}}, "decode": {"1": {...}}.
"""

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import llama_cpp

# llama.cpp commit vendored by llama-cpp-python releases we have checked (vendor/llama.cpp in
# the sdist; the wheel itself carries no commit id). Override with --llama-cpp-commit.
KNOWN_COMMITS = {"0.3.36": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}

FILE_TYPES = {0: "f32", 1: "f16", 7: "q8_0", 32: "bf16"}  # llama_ftype values
FA = {"off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED, "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED}
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpuinfo():
    """(model name, [relevant SIMD flags present]) from /proc/cpuinfo."""
    name, flags = platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name == platform.machine():
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return name, [fl for fl in SIMD_FLAGS if fl in flags]


def machine_busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)


def self_jiffies():
    with open("/proc/self/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])  # fields 14, 15: utime, stime


class Rep:
    """Context manager measuring one rep's wall time, own CPU and other processes' CPU."""

    def __enter__(self):
        self.m0, self.s0, self.t0 = machine_busy_jiffies(), self_jiffies(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        own = self_jiffies() - self.s0
        self.own_cpu_s = own / CLK_TCK
        self.other_cpu_s = max(0, machine_busy_jiffies() - self.m0 - own) / CLK_TCK
        return False


class Measure:
    """Collects `reps` clean reps of a timed callable; see the module docstring."""

    def __init__(self, args):
        self.reps, self.threads = args.reps, args.threads
        self.max_other, self.max_tries = args.max_other_cpu, max(args.max_tries, args.reps)
        self.contended = []

    def __call__(self, name, fn):
        """fn() -> (timed_s, payload, rep): rep is the Rep around the timed part. Returns
        (entry, used timed seconds, payloads)."""
        attempts = []
        for _ in range(self.max_tries):
            timed_s, payload, rep = fn()
            a = {"s": timed_s, "wall_s": rep.wall, "other_cpu_s": rep.other_cpu_s,
                 "util": rep.own_cpu_s / (rep.wall * self.threads), "payload": payload}
            a["clean"] = a["other_cpu_s"] <= self.max_other * rep.wall
            attempts.append(a)
            if sum(x["clean"] for x in attempts) >= self.reps:
                break
        used = [a for a in attempts if a["clean"]]
        clean = len(used) >= self.reps
        if not clean:
            self.contended.append(name)
            used = sorted(attempts, key=lambda a: a["other_cpu_s"] / a["wall_s"])[: self.reps]
        entry = {
            "clean": clean,
            "tries": len(attempts),
            "s": [round(a["s"], 5) for a in used],
            "s_all": [round(a["s"], 5) for a in attempts],
            "wall_s_all": [round(a["wall_s"], 5) for a in attempts],
            "other_cpu_s_all": [round(a["other_cpu_s"], 3) for a in attempts],
            "util_all": [round(a["util"], 3) for a in attempts],
            "clean_all": [a["clean"] for a in attempts],
        }
        return entry, [a["s"] for a in used], [a["payload"] for a in used]


def clear_memory(ctx):
    mem = llama_cpp.llama_get_memory(ctx)
    if mem is not None:
        llama_cpp.llama_memory_clear(mem, True)


class Context:
    """A llama.cpp context on an already loaded model, plus a reusable llama_batch."""

    def __init__(self, model, n_seq, n_ctx, n_batch, args):
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = min(n_batch, args.n_ubatch)
        p.n_seq_max = n_seq
        p.n_threads = args.threads
        p.n_threads_batch = args.threads
        p.flash_attn_type = FA[args.flash_attn]
        p.no_perf = True
        self.n_seq, self.n_batch = n_seq, n_batch
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        if not self.ctx:
            raise RuntimeError(f"llama_init_from_model failed (n_seq_max={n_seq}, n_ctx={n_ctx}, n_batch={n_batch})")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)

    def close(self):
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)

    def fill(self, toks_per_seq, pos0, want_logits=True):
        """One llama_batch: sequence s gets toks_per_seq[s] at positions pos0.. (logits on its last token)."""
        b = self.batch
        j = 0
        for s, toks in enumerate(toks_per_seq):
            for k, t in enumerate(toks):
                b.token[j] = int(t)
                b.pos[j] = pos0 + k
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = s
                b.logits[j] = 1 if (want_logits and k == len(toks) - 1) else 0
                j += 1
        b.n_tokens = j

    def decode(self):
        rc = llama_cpp.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def argmax(self):
        # Output rows are in batch order: one logit row per sequence.
        ptr = llama_cpp.llama_get_logits(self.ctx)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_seq * self.n_vocab,)).reshape(self.n_seq, self.n_vocab)
        return logits.argmax(axis=1)

    def prefill(self, toks):
        """Clear, then eval toks in n_batch chunks, logits of the last token only -> (timed s, None, Rep)."""
        clear_memory(self.ctx)
        timed = 0.0
        with Rep() as rep:
            for i in range(0, len(toks), self.n_batch):
                chunk = toks[i:i + self.n_batch]
                self.fill([chunk], i, want_logits=(i + len(chunk) == len(toks)))
                t0 = time.perf_counter()
                self.decode()
                llama_cpp.llama_synchronize(self.ctx)
                timed += time.perf_counter() - t0
        return timed, None, rep

    def greedy(self, prompts, steps):
        """Untimed prompt prefill, then `steps` timed decode steps -> (timed s, generated ids, Rep).
        The Rep (clean-rep window) spans the steps loop, not the untimed prompt prefill."""
        clear_memory(self.ctx)
        self.fill(prompts, 0)
        self.decode()
        nxt = self.argmax()
        pos = len(prompts[0])
        generated = [[] for _ in range(self.n_seq)]
        timed = 0.0
        with Rep() as rep:
            for step in range(steps):
                self.fill([[t] for t in nxt], pos + step)
                t0 = time.perf_counter()
                self.decode()
                llama_cpp.llama_synchronize(self.ctx)
                timed += time.perf_counter() - t0
                nxt = self.argmax()
                for s in range(self.n_seq):
                    generated[s].append(int(nxt[s]))
        return timed, generated, rep


_LOG_CB = None


def quiet_llama_logs():
    """llama.cpp logs every context creation at INFO level to stderr; keep warnings and errors."""
    global _LOG_CB

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        if level in (3, 4):  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
            sys.stderr.write(text.decode(errors="replace"))

    _LOG_CB = cb  # keep a reference: llama.cpp holds the C pointer
    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))


def gpu_name():
    """The first GPU's name and driver per nvidia-smi, or None."""
    import subprocess

    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def int_list(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tokens", default=None, help="JSON token file (see above); default: seeded random ids")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", default="512,2048,8192,32768", help="comma-separated prompt lengths ('' for none)")
    ap.add_argument("--decode-context", type=int, default=128, help="prompt tokens per sequence before decoding")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--batches", default="1,8", help="comma-separated decode batch sizes ('' for none)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tries", type=int, default=12, help="attempts per measurement")
    ap.add_argument("--max-other-cpu", type=float, default=0.10,
                    help="a rep is clean if other processes used at most this x wall CPU-seconds (1e9: off)")
    ap.add_argument("--n-batch", type=int, default=2048, help="llama.cpp n_batch (tokens per llama_decode)")
    ap.add_argument("--n-ubatch", type=int, default=512, help="llama.cpp n_ubatch (micro-batch)")
    ap.add_argument("--flash-attn", choices=sorted(FA), default="on",
                    help="flash attention in the attention layers (llama.cpp's own default 'auto' "
                         "enables it on CPU; llama-cpp-python's Llama defaults to off)")
    ap.add_argument("--verify-batch", type=int, default=0,
                    help="compare the greedy outputs of this batch with each sequence decoded alone (0: off)")
    ap.add_argument("--seed", type=int, default=0, help="for random token ids when --tokens is not given")
    ap.add_argument("--verbose", action="store_true", help="keep llama.cpp's INFO logs")
    ap.add_argument("--n-gpu-layers", type=int, default=None,
                    help="layers to offload to the GPU (-1: all); needs a llama-cpp-python built with CUDA")
    ap.add_argument("--label", default=None)
    ap.add_argument("--llama-cpp-commit", default=None)
    ap.add_argument("--out", default=None, help="also append the JSON line to this file")
    args = ap.parse_args()

    lengths = int_list(args.prefill)
    batches = sorted(set(int_list(args.batches)))
    measure = Measure(args)
    cpu, flags = cpuinfo()

    if not args.verbose:
        quiet_llama_logs()
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    gpu = None
    if args.n_gpu_layers is not None:
        if args.n_gpu_layers < -1:
            sys.exit(f"--n-gpu-layers: {args.n_gpu_layers} (give -1 for all layers, 0 for none, or a count)")
        if args.n_gpu_layers != 0 and not llama_cpp.llama_supports_gpu_offload():
            sys.exit(f"--n-gpu-layers {args.n_gpu_layers}: this llama-cpp-python ({llama_cpp.__file__}) has no GPU "
                     "offload (a CPU-only build); build it with CUDA: tools/gpu_bundle/anchors/build_wheels.sh llamacpp")
        mp.n_gpu_layers = args.n_gpu_layers
        if args.n_gpu_layers != 0:
            gpu = gpu_name()
    t_load = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(os.fsencode(args.gguf), mp)
    if not model:
        sys.exit(f"failed to load {args.gguf}")
    t_load = time.perf_counter() - t_load
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    meta = {}
    buf = ctypes.create_string_buffer(256)
    for key in ("general.architecture", "general.file_type"):
        if llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, 256) >= 0:
            meta[key] = buf.value.decode()

    if args.tokens:
        with open(args.tokens) as f:
            tok = json.load(f)
        prompt, dprompts = tok["prompt"], tok["decode_prompts"]
        if lengths and len(prompt) < max(lengths):
            sys.exit(f"--tokens prompt has {len(prompt)} ids, need {max(lengths)}")
        if batches and len(dprompts) < max(batches):
            sys.exit(f"--tokens has {len(dprompts)} decode prompts, need {max(batches)}")
        dprompts = [p[:args.decode_context] for p in dprompts]
        if any(len(p) < args.decode_context for p in dprompts[:max(batches, default=0)]):
            sys.exit(f"--tokens decode prompts are shorter than --decode-context {args.decode_context}")
    else:
        rng = np.random.default_rng(args.seed)
        prompt = [int(t) for t in rng.integers(3, n_vocab, size=max(lengths, default=0))]
        dprompts = [[int(t) for t in rng.integers(3, n_vocab, size=args.decode_context)]
                    for _ in range(max(batches, default=0))]
    bad = [t for t in prompt + [t for p in dprompts for t in p] if not 0 <= t < n_vocab]
    if bad:
        sys.exit(f"token ids outside [0, {n_vocab}): {bad[:5]}")

    res = {
        "engine": "llama.cpp",
        "label": args.label,
        "model": os.path.abspath(args.gguf),
        "arch": meta.get("general.architecture"),
        "dtype": FILE_TYPES.get(int(meta.get("general.file_type", -1)), meta.get("general.file_type")),
        "n_params": int(llama_cpp.llama_model_n_params(model)),
        "n_vocab": n_vocab,
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_commit": args.llama_cpp_commit or KNOWN_COMMITS.get(llama_cpp.__version__, "unknown"),
        "threads": args.threads,
        "n_gpu_layers": args.n_gpu_layers,
        "gpu": gpu,
        "cpu": cpu,
        "cpu_flags": flags,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "tokens": os.path.abspath(args.tokens) if args.tokens else f"random seed {args.seed}",
        "n_batch": args.n_batch,
        "n_ubatch": args.n_ubatch,
        "flash_attn": args.flash_attn,
        "kv_cache_type": "f16",
        "reps": args.reps,
        "max_tries": args.max_tries,
        "max_other_cpu": args.max_other_cpu,
        "decode_context": args.decode_context,
        "decode_steps": args.decode_steps,
        "load_s": round(t_load, 3),
        "loadavg_start": os.getloadavg(),
        "prefill_method": "llama_decode of n_batch chunks on a cleared context, logits of the last token "
                          "only; timed: llama_decode + llama_synchronize",
        "decode_method": "llama_batch with one token per sequence per step; timed: llama_decode + "
                         "llama_synchronize of each step (summed); argmax/batch building untimed; prompt "
                         "prefill untimed; tok/s = B*steps/median s",
        "prefill": {},
        "decode": {},
    }
    res["version"] = f"llama-cpp-python {res['llama_cpp_python']} / llama.cpp {res['llama_cpp_commit'][:12]}"

    if lengths:
        n_ctx = -(-(max(lengths) + 16) // 256) * 256
        pctx = Context(model, 1, n_ctx, args.n_batch, args)
        pctx.prefill(prompt[:min(512, max(lengths))])  # warm-up: mmap'd weights paged in, thread pool up
        for L in lengths:
            toks = prompt[:L]
            e, used, _ = measure(f"prefill_{L}", lambda: pctx.prefill(toks))
            e["tok_s"] = round(L / statistics.median(used), 2)
            e["tok_s_best"] = round(L / min(used), 2)
            res["prefill"][str(L)] = e
            print(f"# prefill {L}: {e['tok_s']} tok/s  s {e['s']}  other-cpu {e['other_cpu_s_all']}  "
                  f"clean {e['clean']} ({e['tries']} tries)", file=sys.stderr, flush=True)
        pctx.close()

    outputs = {}
    for B in batches:
        k = str(B)
        dec = None
        try:
            per_seq = -(-(args.decode_context + args.decode_steps + 16) // 256) * 256
            dec = Context(model, B, B * per_seq, max(B * args.decode_context, 512), args)
            prompts = dprompts[:B]
            dec.greedy(prompts, 2)  # warm-up: graph allocation for this batch shape
            e, used, gens = measure(f"decode_{B}", lambda: dec.greedy(prompts, args.decode_steps))
        except RuntimeError as err:
            res["decode"][k] = {"unsupported": str(err)}
            print(f"# decode B={B}: unsupported ({err})", file=sys.stderr, flush=True)
            continue
        finally:
            if dec is not None:
                dec.close()
        if any(g != gens[0] for g in gens):
            res.setdefault("warnings", []).append(f"B={B}: greedy output differs between reps")
        outputs[B] = (prompts, gens[0])
        e["tok_s"] = round(B * args.decode_steps / statistics.median(used), 2)
        e["tok_s_best"] = round(B * args.decode_steps / min(used), 2)
        res["decode"][k] = e
        print(f"# decode B={B}: {e['tok_s']} tok/s  s {e['s']}  other-cpu {e['other_cpu_s_all']}  "
              f"clean {e['clean']} ({e['tries']} tries)", file=sys.stderr, flush=True)

    if args.verify_batch > 1 and args.verify_batch in outputs:
        # Each sequence of the batched run decoded alone: same greedy tokens?
        prompts, gens = outputs[args.verify_batch]
        per_seq = -(-(args.decode_context + args.decode_steps + 16) // 256) * 256
        dec = Context(model, 1, per_seq, max(args.decode_context, 512), args)
        same, first_diff = 0, []
        for s, pr in enumerate(prompts):
            g = dec.greedy([pr], args.decode_steps)[1][0]
            if g == gens[s]:
                same += 1
            else:
                first_diff.append(next(i for i, (x, y) in enumerate(zip(g, gens[s])) if x != y))
        dec.close()
        res["batch_vs_single_identical_seqs"] = f"{same}/{args.verify_batch}"
        if first_diff:
            res["batch_vs_single_first_diff_step"] = first_diff

    res["contended"] = measure.contended
    res["loadavg_end"] = os.getloadavg()
    llama_cpp.llama_model_free(model)
    line = json.dumps(res)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
