#!/usr/bin/env python3
"""Sanity check: llama.cpp logits on a GGUF vs transformers (fp32, CPU) on the HF model dir
it was converted from.

Usage:
    python3 bench/llamacpp/check_logits.py --hf /tmp/hs-bench/nemotron_h \
        --gguf /tmp/hs-bench/gguf/nemotron_h-f32.gguf [--len 32] [--seed 0]

Runs one uncached forward of a random prompt in both engines (llama.cpp: one llama_decode
with logits for every position) and prints a JSON line with the max abs logit difference
(over all positions and the whole vocabulary), the max abs logit (for scale), whether
the per-position argmax agrees, and for Nemotron-H also the difference against
transformers with its dt >= time_step_min clamp disabled (llama.cpp has no such clamp; see
hf_logits). Needs torch + transformers (tools/requirements.txt).
"""

import argparse
import ctypes
import json
import os
import sys

import numpy as np

KV_TYPES = {"f32": 0, "f16": 1}  # ggml_type values (GGML_TYPE_F32, GGML_TYPE_F16)


def llama_logits(gguf, tokens, threads, kv_type):
    import llama_cpp

    llm = llama_cpp.Llama(
        gguf, n_threads=threads, n_threads_batch=threads, n_ctx=max(256, len(tokens)),
        n_batch=max(512, len(tokens)), n_ubatch=max(512, len(tokens)), logits_all=True,
        type_k=KV_TYPES[kv_type], type_v=KV_TYPES[kv_type], verbose=False)
    llm.reset()
    llm.eval(tokens)
    n_vocab = llm.n_vocab()
    out = np.array(llm.scores[: len(tokens), :n_vocab], dtype=np.float32, copy=True)
    meta = {"llama_cpp_python": llama_cpp.__version__, "arch": llm.metadata.get("general.architecture"),
            "file_type": llm.metadata.get("general.file_type"), "kv_cache_type": kv_type}
    llm.close()
    return out, meta


def hf_logits(model_dir, tokens, threads):
    """transformers logits as is, and (Nemotron-H only) with the mixer's dt clamp disabled.

    transformers' NemotronHMamba2Mixer clamps dt = softplus(dt + dt_bias) to
    [config.time_step_min, inf) in the prefill path (it ignores config.time_step_limit);
    llama.cpp never clamps dt. For random models many dt fall below 0.001, so the two
    differ by far more than fp32 rounding. Setting the mixers' time_step_limit to (0, inf)
    removes exactly that difference. Mamba2ForCausalLM uses time_step_limit ((0, inf) here).
    """
    import torch
    import transformers

    torch.set_num_threads(threads)
    with open(os.path.join(model_dir, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    cls = getattr(transformers, arch)
    model = cls.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    inp = torch.tensor([tokens], dtype=torch.long)
    no_clamp = None
    limits = set()
    with torch.no_grad():
        out = model(inp, use_cache=False).logits[0].float().numpy()
        for mod in model.modules():
            if hasattr(mod, "time_step_limit"):
                limits.add(tuple(float(x) for x in mod.time_step_limit))
                mod.time_step_limit = (0.0, float("inf"))
        if limits and limits != {(0.0, float("inf"))}:
            no_clamp = model(inp, use_cache=False).logits[0].float().numpy()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "hf_class": arch,
            "hf_dt_limit": sorted(str(l) for l in limits)}
    return out, no_clamp, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf", required=True, help="HF model dir (gen_model.py output)")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f32",
                    help="llama.cpp attention KV cache type (llama.cpp's default is f16; f32 isolates "
                         "the model math from cache rounding)")
    args = ap.parse_args()

    with open(os.path.join(args.hf, "config.json")) as f:
        cfg = json.load(f)
    vocab = cfg.get("text_config", cfg)["vocab_size"]  # image-text forms (Qwen3.5-MoE) nest the text model
    rng = np.random.default_rng(args.seed)
    tokens = [int(t) for t in rng.integers(3, vocab, size=args.len)]

    a, meta_a = llama_logits(args.gguf, tokens, args.threads, args.kv_type)
    b, b_nc, meta_b = hf_logits(args.hf, tokens, args.threads)
    b = b[:, : a.shape[1]]
    diff = np.abs(a - b)
    res = {
        "hf_model": args.hf, "gguf": args.gguf, "prompt_len": args.len, "seed": args.seed,
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "max_abs_diff_per_pos": [round(float(x), 6) for x in diff.max(axis=1)],
        "max_abs_logit_hf": float(np.abs(b).max()),
        "argmax_agree": int((a.argmax(1) == b.argmax(1)).sum()), "positions": args.len,
        "max_abs_diff_hf_no_dt_clamp": (None if b_nc is None
                                        else float(np.abs(a - b_nc[:, : a.shape[1]]).max())),
        **meta_a, **meta_b,
    }
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
