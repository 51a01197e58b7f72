#!/usr/bin/env python3
"""Records one tiny transformers Qwen3NextAttention layer (gated attention:
q_proj yields q and an output gate per head, zero-centred q/k RMSNorm, partial
RoPE; fp32, seeded) into tests/fixtures/gated_delta/attention_case.json, the
reference of //kernels/cpu:gated_attention_layer_test. Run with the golden venv
(torch + transformers 5.23): /work/venv-golden/bin/python tools/gen_gated_attention_fixture.py
Shapes: hidden 16, 4 query heads over 2 key/value heads, head_dim 16,
partial_rotary_factor 0.25 (RoPE on the first 4 dims), theta 10000, 11 tokens
at positions 0..10, eager attention with a causal mask. Weights are redrawn
from a seeded normal (the q/k norm weights too: their init, zeros, would hide
the 1 + w). Weights are flat, row-major, in transformers' layouts (Linear [out, in]).
Qwen3.5's text attention (Qwen3_5Attention with Qwen3_5TextRotaryEmbedding: an
MRoPE whose three position rows are equal for text) is recorded the same way,
with head_dim 32 (RoPE on 8 dims, so the H and W sections hold frequencies),
into attention_case_qwen3_5.json."""

import json
import os
import sys

import torch
import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5 as m35
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as m
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig


def record(config_class, attention, rotary, head_dim, file_name):
    torch.manual_seed(50)
    cfg = config_class(
        hidden_size=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        num_hidden_layers=1,
        layer_types=["full_attention"],
        rms_norm_eps=1e-6,
    )
    cfg._attn_implementation = "eager"
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25
    layer = attention(cfg, 0).float().eval()
    rope = rotary(cfg)
    with torch.no_grad():
        for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj):
            lin.weight.normal_(0.0, 0.4)
        layer.q_norm.weight.normal_(0.0, 0.3)
        layer.k_norm.weight.normal_(0.0, 0.3)
    seqlen = 11
    x = torch.randn(1, seqlen, cfg.hidden_size)
    positions = torch.arange(seqlen)[None, :]
    mask = torch.full((seqlen, seqlen), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        cos, sin = rope(x, positions)
        y, _ = layer(x, (cos, sin), mask)

    flat = lambda t: [float(v) for v in t.detach().reshape(-1).tolist()]
    out = {
        "transformers_version": transformers.__version__,
        "seqlen": seqlen,
        "hidden_size": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads,
        "n_kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rotary_dim": int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]),
        "rope_theta": cfg.rope_parameters["rope_theta"],
        "eps": cfg.rms_norm_eps,
        "q_proj": flat(layer.q_proj.weight),
        "k_proj": flat(layer.k_proj.weight),
        "v_proj": flat(layer.v_proj.weight),
        "o_proj": flat(layer.o_proj.weight),
        "q_norm": flat(layer.q_norm.weight),
        "k_norm": flat(layer.k_norm.weight),
        "x": flat(x),
        "y": flat(y),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gated_delta", file_name)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path), file=sys.stderr)


def main():
    record(Qwen3NextConfig, m.Qwen3NextAttention, m.Qwen3NextRotaryEmbedding, 16, "attention_case.json")
    record(Qwen3_5TextConfig, m35.Qwen3_5Attention, m35.Qwen3_5TextRotaryEmbedding, 32, "attention_case_qwen3_5.json")


if __name__ == "__main__":
    main()
