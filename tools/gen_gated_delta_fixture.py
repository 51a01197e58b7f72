#!/usr/bin/env python3
"""Records transformers' torch_chunk_gated_delta_rule (Qwen3-Next) on one small
random case into tests/fixtures/gated_delta/chunk_case.json, the reference of
//kernels/cpu:gated_delta_test. Run with the golden venv (torch + transformers
5.23): /work/venv-golden/bin/python tools/gen_gated_delta_fixture.py
Shapes: seqlen 7, chunk 4 (one full chunk and a partial one), 2 key heads each
serving 2 consecutive value heads (4; transformers' repeat_interleave), dk 4, dv 3, a random initial state, use_qk_l2norm_in_kernel=True.
Arrays are flat, row-major, in the kernel's layouts ([seqlen, heads, dim] and
[heads, dk, dv])."""

import json
import os
import sys

import torch
import transformers
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule


def main():
    torch.manual_seed(50)
    seqlen, hk, hv, dk, dv, chunk = 7, 2, 4, 4, 3, 4
    q = torch.randn(1, seqlen, hk, dk)
    k = torch.randn(1, seqlen, hk, dk)
    v = torch.randn(1, seqlen, hv, dv)
    g = -torch.rand(1, seqlen, hv)  # log decay in (-1, 0]
    beta = torch.rand(1, seqlen, hv)
    s0 = torch.randn(1, hv, dk, dv) * 0.5
    o, s = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, chunk_size=chunk, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    flat = lambda t: [float(x) for x in t.reshape(-1).tolist()]
    out = {
        "transformers_version": transformers.__version__,
        "seqlen": seqlen,
        "n_k_heads": hk,
        "n_v_heads": hv,
        "dk": dk,
        "dv": dv,
        "chunk_size": chunk,
        "q": flat(q),
        "k": flat(k),
        "v": flat(v),
        "g": flat(g),
        "beta": flat(beta),
        "initial_state": flat(s0),
        "o": flat(o),
        "final_state": flat(s),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gated_delta", "chunk_case.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path), file=sys.stderr)


if __name__ == "__main__":
    main()
