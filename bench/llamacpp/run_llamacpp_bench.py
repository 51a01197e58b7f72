#!/usr/bin/env python3
"""llama.cpp CPU baseline (through llama-cpp-python) for hybridserve's bench models.

Usage:
    python3 bench/llamacpp/run_llamacpp_bench.py --gguf /tmp/hs-bench/gguf/nemotron_h-f32.gguf \
        [--threads 2] [--prefill 512,2048,8192] [--reps 3] [--n-batch 2048] [--n-ubatch 512] \
        [--flash-attn on|off] [--decode-prompt 32] [--decode-steps 64] [--batch 8] \
        [--min-util 0.9] [--label X] [--out results.jsonl]

Measures, with n_threads = n_threads_batch = --threads:

prefill    For each prompt length L, on a cleared context each rep (Llama.reset(), which for
           hybrid/recurrent models calls llama_memory_clear(mem, true); we also call it
           explicitly), time Llama.eval(tokens) on L random token ids. Llama.eval feeds the
           prompt to llama_decode in n_batch-token chunks (llama.cpp splits each chunk into
           n_ubatch-token micro-batches) and requests logits only for the last token of each
           chunk (logits_all=False). Reported: L / median seconds.
decode     Low-level API on its own context (n_seq_max = B): B independent random prompts of
           --decode-prompt tokens are prefilled together in one llama_batch (not timed), then
           --decode-steps steps are timed, each = one llama_decode of a llama_batch holding one
           token per sequence (seq_id i, its own position) + greedy argmax over the B logit rows
           (numpy) for the next tokens. Reported: B * steps / median seconds. B = 1 and
           B = --batch (8). For B = 1 the same loop through Llama.eval([tok]) (high-level path)
           is reported too, as a cross-check. With --batch > 1 the batched greedy outputs are
           compared with each sequence decoded alone (batch_vs_single_identical_seqs).

Shared machines: every rep records its CPU utilisation, process CPU seconds /
(wall seconds * threads). llama.cpp's worker threads spin while waiting, so an unloaded run
reads ~0.95-1.0 and a rep where other processes took a core reads ~0.5. Reps below
--min-util are discarded and retried (at most --max-tries per measurement); if too few clean
reps are obtained the best ones are used and the measurement is listed under "contended".
The JSON keeps every attempt (`*_s_all`, `*_util_all`), the medians (`*_tok_s`), the best
rep (`*_tok_s_best`) and the load averages at start and end.

Prints one JSON line (and appends it to --out) with all numbers, the llama-cpp-python
version, the vendored llama.cpp commit, threads, weight dtype and model path. A warm-up
eval runs first so that page faults on the mmap'd weights are not timed.
"""

import argparse
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


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def clear_memory(ctx):
    mem = llama_cpp.llama_get_memory(ctx)
    if mem is not None:
        llama_cpp.llama_memory_clear(mem, True)


class Measure:
    """Collects `reps` clean reps of a timed callable; see the module docstring."""

    def __init__(self, args):
        self.reps, self.threads = args.reps, args.threads
        self.min_util, self.max_tries = args.min_util, args.max_tries
        self.contended = []

    def __call__(self, name, fn):
        """fn() -> (wall_s, cpu_s, payload) of the timed section. Returns (times, utils, all, payloads)."""
        attempts = []
        for _ in range(self.max_tries):
            wall, cpu, payload = fn()
            attempts.append((wall, cpu / (wall * self.threads), payload))
            if sum(u >= self.min_util for _, u, _ in attempts) >= self.reps:
                break
        clean = [a for a in attempts if a[1] >= self.min_util]
        if len(clean) < self.reps:
            self.contended.append(name)
            clean = sorted(attempts, key=lambda a: -a[1])[: self.reps]
        else:
            clean = clean[: self.reps]
        return ([a[0] for a in clean], [a[1] for a in clean],
                {"s": [round(a[0], 4) for a in attempts], "util": [round(a[1], 3) for a in attempts]},
                [a[2] for a in clean])


def timed(fn):
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


class LowLevelDecoder:
    """A context with n_seq_max = n_seq on an already loaded model, plus a reusable batch."""

    def __init__(self, model, n_seq, prompt_len, steps, args):
        p = llama_cpp.llama_context_default_params()
        per_seq = -(-(prompt_len + steps + 16) // 256) * 256
        p.n_ctx = n_seq * per_seq  # llama.cpp splits n_ctx evenly over the sequences
        p.n_batch = max(n_seq * prompt_len, 512)
        p.n_ubatch = min(p.n_batch, args.n_ubatch)
        p.n_seq_max = n_seq
        p.n_threads = args.threads
        p.n_threads_batch = args.threads
        p.flash_attn_type = FA[args.flash_attn]
        p.no_perf = True
        self.n_seq = n_seq
        self.prompt_len = prompt_len
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.batch = llama_cpp.llama_batch_init(p.n_batch, 0, 1)

    def close(self):
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)

    def _fill(self, toks_per_seq, pos0):
        b = self.batch
        j = 0
        for s, toks in enumerate(toks_per_seq):
            for k, t in enumerate(toks):
                b.token[j] = int(t)
                b.pos[j] = pos0 + k
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = s
                b.logits[j] = 1 if k == len(toks) - 1 else 0
                j += 1
        b.n_tokens = j

    def _decode(self):
        rc = llama_cpp.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self):
        # Output rows are in batch order: one logit row per sequence.
        ptr = llama_cpp.llama_get_logits(self.ctx)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_seq * self.n_vocab,)).reshape(self.n_seq, self.n_vocab)
        return logits.argmax(axis=1)

    def run(self, prompts, steps):
        """Prefill prompts (untimed), then time `steps` greedy decode steps -> (wall, cpu, tokens)."""
        clear_memory(self.ctx)
        self._fill(prompts, 0)
        self._decode()
        first = self._argmax()

        def loop():
            nxt = first
            generated = [[] for _ in range(self.n_seq)]
            for step in range(steps):
                self._fill([[t] for t in nxt], self.prompt_len + step)
                self._decode()
                nxt = self._argmax()
                for s in range(self.n_seq):
                    generated[s].append(int(nxt[s]))
            llama_cpp.llama_synchronize(self.ctx)
            return generated

        return timed(loop)


def decode_llama_eval(llm, prompt, steps):
    llm.reset()
    clear_memory(llm._ctx.ctx)
    llm.eval(prompt)
    n_vocab = llm.n_vocab()

    def argmax():
        return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,)).argmax())

    first = argmax()

    def loop():
        nxt, out = first, []
        for _ in range(steps):
            llm.eval([nxt])
            nxt = argmax()
            out.append(nxt)
        return out

    return timed(loop)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", default="512,2048,8192", help="comma-separated prompt lengths")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-batch", type=int, default=2048, help="llama.cpp n_batch (tokens per llama_decode)")
    ap.add_argument("--n-ubatch", type=int, default=512, help="llama.cpp n_ubatch (micro-batch)")
    ap.add_argument("--flash-attn", choices=sorted(FA), default="on",
                    help="flash attention in the attention layers (llama.cpp's own default 'auto' "
                         "enables it on CPU; llama-cpp-python's Llama defaults to off)")
    ap.add_argument("--decode-prompt", type=int, default=32)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="number of sequences for batched decode")
    ap.add_argument("--min-util", type=float, default=0.9,
                    help="discard reps whose CPU utilisation is below this (0 keeps all)")
    ap.add_argument("--max-tries", type=int, default=12, help="attempts per measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-verify", action="store_true",
                    help="skip checking that batched greedy outputs equal per-sequence B=1 outputs")
    ap.add_argument("--label", default=None)
    ap.add_argument("--llama-cpp-commit", default=None)
    ap.add_argument("--out", default=None, help="also append the JSON line to this file")
    args = ap.parse_args()

    lengths = [int(x) for x in args.prefill.split(",") if x]
    n_ctx = max(lengths + [args.decode_prompt + args.decode_steps]) + 256
    measure = Measure(args)

    t_load = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=args.gguf, n_threads=args.threads, n_threads_batch=args.threads, n_ctx=n_ctx,
        n_batch=args.n_batch, n_ubatch=args.n_ubatch, logits_all=False,
        flash_attn=(args.flash_attn == "on"), verbose=False)
    t_load = time.perf_counter() - t_load
    meta = llm.metadata
    n_vocab = llm.n_vocab()
    rng = np.random.default_rng(args.seed)

    def rand_tokens(n):
        return [int(t) for t in rng.integers(3, n_vocab, size=n)]

    # Warm-up: touch every weight page once (mmap) and let the thread pool spin up.
    llm.reset()
    llm.eval(rand_tokens(min(512, args.n_batch)))

    res = {
        "engine": "llama.cpp",
        "label": args.label,
        "model_path": os.path.abspath(args.gguf),
        "arch": meta.get("general.architecture"),
        "dtype": FILE_TYPES.get(int(meta.get("general.file_type", -1)), meta.get("general.file_type")),
        "n_params": int(llama_cpp.llama_model_n_params(llm._model.model)),
        "n_vocab": n_vocab,
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_commit": args.llama_cpp_commit or KNOWN_COMMITS.get(llama_cpp.__version__, "unknown"),
        "threads": args.threads,
        "n_ctx": llm.n_ctx(),
        "n_batch": args.n_batch,
        "n_ubatch": args.n_ubatch,
        "flash_attn": args.flash_attn,
        "kv_cache_type": "f16",
        "reps": args.reps,
        "min_util": args.min_util,
        "load_s": round(t_load, 3),
        "loadavg_start": os.getloadavg(),
        "cpu": cpu_name(),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "prefill_method": "Llama.eval -> llama_decode in n_batch chunks, logits for the last token of each "
                          "chunk; context cleared before each rep",
        "decode_method": "low-level llama_batch/llama_decode, one token per sequence per step, greedy argmax "
                         "(numpy) included; time covers decode steps only; tok/s = B*steps/median s",
        "prefill_tok_s": {}, "prefill_tok_s_best": {}, "prefill_s": {}, "prefill_util": {},
        "prefill_s_all": {}, "prefill_util_all": {},
    }

    for L in lengths:
        toks = rand_tokens(L)

        def one():
            llm.reset()
            clear_memory(llm._ctx.ctx)

            def ev():
                llm.eval(toks)
                llama_cpp.llama_synchronize(llm._ctx.ctx)

            return timed(ev)

        times, utils, allr, _ = measure(f"prefill_{L}", one)
        k = str(L)
        res["prefill_tok_s"][k] = round(L / statistics.median(times), 2)
        res["prefill_tok_s_best"][k] = round(L / min(times), 2)
        res["prefill_s"][k] = [round(t, 4) for t in times]
        res["prefill_util"][k] = [round(u, 3) for u in utils]
        res["prefill_s_all"][k], res["prefill_util_all"][k] = allr["s"], allr["util"]
        print(f"# prefill {L}: {res['prefill_tok_s'][k]} tok/s  times {res['prefill_s'][k]}  "
              f"util {res['prefill_util'][k]}  (attempts {len(allr['s'])})", file=sys.stderr)

    # Batch-1 decode through the high-level path (cross-check for the low-level B=1 number).
    prompt = rand_tokens(args.decode_prompt)
    times, utils, _, _ = measure("decode_b1_llama_eval", lambda: decode_llama_eval(llm, prompt, args.decode_steps))
    res["decode_b1_llama_eval_tok_s"] = round(args.decode_steps / statistics.median(times), 2)

    for key in ("decode_tok_s", "decode_tok_s_best", "decode_s", "decode_util", "decode_s_all", "decode_util_all"):
        res[key] = {}
    outputs = {}
    for B in sorted({1, args.batch}):
        dec = LowLevelDecoder(llm._model.model, B, args.decode_prompt, args.decode_steps, args)
        prompts = [rand_tokens(args.decode_prompt) for _ in range(B)]
        dec.run(prompts, 2)  # warm-up: graph allocation for this batch shape
        times, utils, allr, gens = measure(f"decode_{B}", lambda: dec.run(prompts, args.decode_steps))
        if any(g != gens[0] for g in gens):
            res.setdefault("warnings", []).append(f"B={B}: greedy output differs between reps")
        outputs[B] = (prompts, gens[0])
        dec.close()
        k = str(B)
        res["decode_tok_s"][k] = round(B * args.decode_steps / statistics.median(times), 2)
        res["decode_tok_s_best"][k] = round(B * args.decode_steps / min(times), 2)
        res["decode_s"][k] = [round(t, 4) for t in times]
        res["decode_util"][k] = [round(u, 3) for u in utils]
        res["decode_s_all"][k], res["decode_util_all"][k] = allr["s"], allr["util"]
        print(f"# decode B={B}: {res['decode_tok_s'][k]} tok/s  times {res['decode_s'][k]}  "
              f"util {res['decode_util'][k]}  (attempts {len(allr['s'])})", file=sys.stderr)

    if args.batch > 1 and not args.no_verify:
        # Each sequence of the batched run decoded alone: same greedy tokens?
        prompts, gens = outputs[args.batch]
        dec = LowLevelDecoder(llm._model.model, 1, args.decode_prompt, args.decode_steps, args)
        same, first_diff = 0, []
        for s, pr in enumerate(prompts):
            g = dec.run([pr], args.decode_steps)[2][0]
            if g == gens[s]:
                same += 1
            else:
                first_diff.append(next(i for i, (x, y) in enumerate(zip(g, gens[s])) if x != y))
        dec.close()
        res["batch_vs_single_identical_seqs"] = f"{same}/{args.batch}"
        if first_diff:
            res["batch_vs_single_first_diff_step"] = first_diff

    res["decode_prompt"] = args.decode_prompt
    res["decode_steps"] = args.decode_steps
    res["contended"] = measure.contended
    res["loadavg_end"] = os.getloadavg()
    llm.close()
    line = json.dumps(res)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
