"""tools/gen_model.py's Falcon-H1 family: config.json and weights of a preset.

Every decoder layer holds a Mamba2 mixer (model.layers.L.mamba.*) and attention (self_attn.*) on
the same normed input, then a SwiGLU feed_forward; the multipliers are folded into the init.
The mixer's in_proj has a bias when mamba_proj_bias, its out_proj when projectors_bias (each
without the other too, as transformers' FalconH1Mixer builds them); q/k/v/o_proj when
attention_bias.
"""

import numpy as np

from gen_model_parts import (INF, attention, attention_fields, head_fields, mamba_mixer, new_model, swiglu_mlp,
                             tail_fields)

# The multipliers of a Falcon-H1 preset, copied into config.json as they are.
FALCON_H1_MULTIPLIERS = ("embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
                         "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier", "ssm_multipliers",
                         "mlp_multipliers")


def falcon_h1_config(p, dtype_name):
    """config.json dict for a Falcon-H1 preset `p`: the fields FalconH1Config.save_pretrained writes
    (transformers 5.23), without transformers_version; head_dim only when the preset gives one."""
    if p["mamba_n_heads"] * p["mamba_d_head"] != p["mamba_d_ssm"] or p["mamba_n_heads"] % p["mamba_n_groups"]:
        raise ValueError("mamba_n_heads * mamba_d_head must be mamba_d_ssm; mamba_n_heads a multiple of mamba_n_groups")
    if p["mamba_d_ssm"] % p["mamba_n_groups"]:
        raise ValueError("mamba_d_ssm must be a multiple of mamba_n_groups (the gated RMSNorm's groups)")
    if p["num_attention_heads"] % p["num_key_value_heads"]:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    if p["head_dim"] is None and p["hidden_size"] % p["num_attention_heads"]:
        raise ValueError("without head_dim, hidden_size must be a multiple of num_attention_heads")
    if len(p["ssm_multipliers"]) != 5 or len(p["mlp_multipliers"]) != 2:
        raise ValueError("ssm_multipliers has 5 values (z, x, B, C, dt), mlp_multipliers 2 (gate, down)")
    mamba = ("mamba_d_ssm", "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv",
             "mamba_expand", "mamba_chunk_size", "mamba_rms_norm", "mamba_norm_before_gate")
    return {
        **head_fields(p, "FalconH1ForCausalLM", "falcon_h1", dtype_name, p["num_hidden_layers"],
                      tied=p["tie_word_embeddings"]),
        **{k: (list(p[k]) if isinstance(p[k], list) else p[k]) for k in FALCON_H1_MULTIPLIERS},
        # attention, beside the mixer in every layer: RoPE on the full head_dim
        **attention_fields(p),
        "attention_bias": p["attention_bias"],
        **({"head_dim": p["head_dim"]} if p["head_dim"] is not None else {}),
        "rope_parameters": {"rope_type": "default", "rope_theta": p["rope_theta"]},
        # SwiGLU MLP of every layer
        "intermediate_size": p["intermediate_size"],
        "hidden_act": "silu",
        "mlp_bias": p["mlp_bias"],
        "projectors_bias": p["projectors_bias"],
        # Mamba2 mixer of every layer
        **{k: p[k] for k in mamba},
        "mamba_conv_bias": True,
        "mamba_proj_bias": p["mamba_proj_bias"],
        "time_step_limit": [0.0, INF],
        **tail_fields(1e-5),
    }


def falcon_h1_weights(cfg, seed):
    """name -> float32 array for FalconH1ForCausalLM (save_pretrained names: model.*, and
    lm_head.weight unless tie_word_embeddings; mamba.norm.weight only when mamba_rms_norm).

    Every multiplier is folded into the init, so that the model as transformers runs it has the
    other archs' balance (unit-scale projections, logits O(1)) and an engine that drops a
    multiplier is off by that factor: a matrix whose input or output a multiplier scales has its
    std divided by it (in_proj's z, x, B, C and dt rows by ssm_in_multiplier times their
    ssm_multipliers entry; q_proj and v_proj by attention_in_multiplier, k_proj by that times
    key_multiplier; gate_proj by mlp_multipliers[0]; out_proj, o_proj, down_proj by ssm_out,
    attention_out and mlp_multipliers[1]; lm_head by lm_head_multiplier; an untied embedding by
    embedding_multiplier). A tied embedding is the head: std 1/(sqrt(hidden) lm_head_multiplier),
    so the embedded input is embedding_multiplier / lm_head_multiplier times the untied one's, and
    the residual branches' output projections are scaled up by that gain to match (as Granite's).
    MLP biases (mlp_bias), the mixer's in_proj bias (mamba_proj_bias) and out_proj bias
    (projectors_bias), and the attention biases (attention_bias) ~ N(0, 0.1^2) after their
    multipliers.
    """
    h, v, f, n_layers = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    tied = cfg["tie_word_embeddings"]
    gain = cfg["embedding_multiplier"] / cfg["lm_head_multiplier"] if tied else 1.0
    d_ssm, n_heads, groups = cfg["mamba_d_ssm"], cfg["mamba_n_heads"], cfg["mamba_n_groups"]
    gs = groups * cfg["mamba_d_state"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nq
    a_in, s_in = cfg["attention_in_multiplier"], cfg["ssm_in_multiplier"]
    gate_m, down_m = cfg["mlp_multipliers"]
    emb_std = h ** -0.5 / (cfg["lm_head_multiplier"] if tied else cfg["embedding_multiplier"])
    t = new_model(seed, "model.embed_tokens.weight", v, h, emb_std)
    # in_proj rows [z | x | B | C | dt] and their ssm_multipliers entries
    seg_rows = np.repeat(np.arange(5), [d_ssm, d_ssm, gs, gs, n_heads])
    row_std = h ** -0.5 / (s_in * np.asarray(cfg["ssm_multipliers"], dtype=np.float64)[seg_rows])
    bias_std = 0.1 / np.asarray(cfg["ssm_multipliers"], dtype=np.float64)[seg_rows]
    for i in range(n_layers):
        pre = f"model.layers.{i}."
        t.norm(pre + "input_layernorm.weight", h)
        mix = pre + "mamba."
        mamba_mixer(t, mix, h, n_heads, cfg["mamba_d_head"], groups, cfg["mamba_d_state"],
                    cfg["mamba_d_conv"], n_layers, gain / cfg["ssm_out_multiplier"])
        z = t.stream(mix + "in_proj.weight").normal((2 * d_ssm + 2 * gs + n_heads, h), 1.0)  # exact: k / 65536
        t[mix + "in_proj.weight"] = (z.astype(np.float64) * row_std[:, None]).astype(np.float32)
        if cfg["mamba_proj_bias"]:  # added before the ssm_multipliers, so divided by them
            z = t.stream(mix + "in_proj.bias").normal((seg_rows.size,), 1.0)
            t[mix + "in_proj.bias"] = (z.astype(np.float64) * bias_std).astype(np.float32)
        if cfg["projectors_bias"]:
            t.normal(mix + "out_proj.bias", (h,), 0.1 * gain / cfg["ssm_out_multiplier"])
        if not cfg["mamba_rms_norm"]:
            del t[mix + "norm.weight"]
        attention(t, pre + "self_attn.", h, nq * hd, nkv * hd,
                  (nq * hd * n_layers) ** -0.5 * gain / cfg["attention_out_multiplier"],
                  in_std=h ** -0.5 / a_in, k_std=h ** -0.5 / (a_in * cfg["key_multiplier"]))
        if cfg["attention_bias"]:
            for name, n, std in (("q_proj", nq * hd, 0.1), ("k_proj", nkv * hd, 0.1 / cfg["key_multiplier"]),
                                 ("v_proj", nkv * hd, 0.1), ("o_proj", h, 0.1 * gain / cfg["attention_out_multiplier"])):
                t.normal(pre + "self_attn." + name + ".bias", (n,), std)
        t.norm(pre + "pre_ff_layernorm.weight", h)
        swiglu_mlp(t, pre + "feed_forward.", h, f, (f * n_layers) ** -0.5 * gain / down_m, gate_std=h ** -0.5 / gate_m,
                   bias_stds=(0.1 / gate_m, 0.1, 0.1 * gain / down_m) if cfg["mlp_bias"] else None)
    t.norm("model.final_layernorm.weight", h)
    if not tied:
        t.normal("lm_head.weight", (v, h), h ** -0.5 / cfg["lm_head_multiplier"])
    return t
