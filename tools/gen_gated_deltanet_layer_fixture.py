#!/usr/bin/env python3
"""Records one tiny transformers Qwen3NextGatedDeltaNet layer (fp32, seeded)
into tests/fixtures/gated_delta/layer_case.json, the reference of
//kernels/cpu:gated_deltanet_layer_test. Run with the golden venv (torch +
transformers 5.23): /work/venv-golden/bin/python tools/gen_gated_deltanet_layer_fixture.py
Shapes: hidden 16, 2 key heads each serving 2 value heads (4), dk 8, dv 6,
conv kernel 4, seqlen 19, no cache (zero states in). The weights are redrawn
from a seeded normal so none sits at its init value (norm weight 1, dt_bias 1).
Besides the layer output, the layer's final states are captured from inside
the forward: the conv state (the last 3 conv inputs, [channels, 3]) and the
recurrent state ([n_v_heads, dk, dv]) that torch_chunk_gated_delta_rule
returns when asked (the module's functions are wrapped to ask for it).
The same 19 tokens are also run through transformers' cache (cached_*): a
prefill of 15, then 4 one-token decode steps on its decode path, with the
states after the prefill and at the end.
Weights are flat, row-major, in transformers' layouts (Linear [out, in],
conv1d [channels, kernel]).
The same case (same shapes, seed and drawing order) is recorded for Qwen3.5's
layer (Qwen3_5GatedDeltaNet: separate in_proj_qkv / in_proj_z / in_proj_b /
in_proj_a, no per-group interleaving) into layer_case_qwen3_5.json."""

import json
import os
import sys

import torch
import transformers
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_5 import modeling_qwen3_5 as m35
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as m
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig


PREFILL = 15  # the cached run: 15 prefill tokens, then 4 decode steps


def record(m, config_class, layer_class, projections, file_name):
    torch.manual_seed(50)
    cfg = config_class(
        hidden_size=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        num_hidden_layers=1,
        layer_types=["linear_attention"],
    )
    layer = getattr(m, layer_class)(cfg, 0).float().eval()
    with torch.no_grad():
        for name, std in projections:
            getattr(layer, name).weight.normal_(0.0, std)
        layer.conv1d.weight.normal_(0.0, 0.5)
        layer.dt_bias.normal_(0.0, 0.5)
        layer.A_log.copy_(torch.log(torch.empty(cfg.linear_num_value_heads).uniform_(0.05, 2.0)))
        layer.norm.weight.normal_(1.0, 0.2)
        layer.out_proj.weight.normal_(0.0, 0.3)
    seqlen = 19
    x = torch.randn(1, seqlen, cfg.hidden_size)

    captured = {}
    chunk_rule = m.torch_chunk_gated_delta_rule
    conv_fn = m.causal_conv1d_fn

    def chunk_capture(*args, **kwargs):
        kwargs["output_final_state"] = True
        o, s = chunk_rule(*args, **kwargs)
        captured["recurrent_state"] = s
        return o, None

    def conv_capture(hidden_states, *args, **kwargs):
        captured["conv_state"] = hidden_states[0, :, -(cfg.linear_conv_kernel_dim - 1) :]
        return conv_fn(hidden_states, *args, **kwargs)

    m.torch_chunk_gated_delta_rule = chunk_capture
    m.causal_conv1d_fn = conv_capture
    try:
        with torch.no_grad():
            y = layer(x)
    finally:
        m.torch_chunk_gated_delta_rule = chunk_rule
        m.causal_conv1d_fn = conv_fn

    # The same tokens through transformers' cache: a prefill of the first
    # PREFILL tokens, then one-token decode steps (causal_conv1d_update and
    # torch_recurrent_gated_delta_rule). transformers' conv state keeps d_conv
    # columns (the current input last); the kernels keep the last d_conv - 1,
    # recorded here as [:, 1:].
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        rows = [layer(x[:, :PREFILL], cache_params=cache)]
        prefill_conv = cache.get_conv_state(0)[0, :, 1:].clone()
        prefill_state = cache.get_recurrent_state(0).clone()
        for t in range(PREFILL, seqlen):
            rows.append(layer(x[:, t : t + 1], cache_params=cache))
    cached_y = torch.cat(rows, dim=1)

    flat = lambda t: [float(v) for v in t.detach().reshape(-1).tolist()]
    out = {
        "transformers_version": transformers.__version__,
        "seqlen": seqlen,
        "hidden_size": cfg.hidden_size,
        "n_k_heads": cfg.linear_num_key_heads,
        "n_v_heads": cfg.linear_num_value_heads,
        "dk": cfg.linear_key_head_dim,
        "dv": cfg.linear_value_head_dim,
        "d_conv": cfg.linear_conv_kernel_dim,
        "eps": cfg.rms_norm_eps,
        **{name: flat(getattr(layer, name).weight) for name, _ in projections},
        "conv1d": flat(layer.conv1d.weight),
        "dt_bias": flat(layer.dt_bias),
        "A_log": flat(layer.A_log),
        "norm": flat(layer.norm.weight),
        "out_proj": flat(layer.out_proj.weight),
        "x": flat(x),
        "y": flat(y),
        "conv_state": flat(captured["conv_state"]),
        "recurrent_state": flat(captured["recurrent_state"]),
        "cached_prefill": PREFILL,
        "cached_y": flat(cached_y),
        "cached_prefill_conv_state": flat(prefill_conv),
        "cached_prefill_recurrent_state": flat(prefill_state),
        "cached_conv_state": flat(cache.get_conv_state(0)[0, :, 1:]),
        "cached_recurrent_state": flat(cache.get_recurrent_state(0)),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gated_delta", file_name)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path), file=sys.stderr)


def main():
    record(m, Qwen3NextConfig, "Qwen3NextGatedDeltaNet", [("in_proj_qkvz", 0.3), ("in_proj_ba", 0.5)], "layer_case.json")
    record(
        m35,
        Qwen3_5TextConfig,
        "Qwen3_5GatedDeltaNet",
        [("in_proj_qkv", 0.3), ("in_proj_z", 0.3), ("in_proj_b", 0.5), ("in_proj_a", 0.5)],
        "layer_case_qwen3_5.json",
    )


if __name__ == "__main__":
    main()
