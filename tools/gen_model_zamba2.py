"""tools/gen_model.py's Zamba2 family: config.json and weights of a preset.

A pattern of M (Mamba2 layer) and H (hybrid layer: a shared transformer block, with per-use LoRA
adapters, whose output is added to the input of the layer's own Mamba2 mixer); the head is tied
unless the preset sets tie_word_embeddings false.
"""

from gen_model_parts import (attention, attention_fields, head_fields, mamba_mixer, mlp, new_model, tail_fields,
                             time_step_fields)

ZAMBA2_LAYER_TYPES = {"M": "linear_attention", "H": "hybrid"}

# Zamba2's LoRA adapters: the second (up) matrix ~ N(0, ZAMBA2_ADAPTER_GAIN^2 / rank), so an adapter
# adds about ZAMBA2_ADAPTER_GAIN times the base projection to q, k, v and gate_up (the real init
# makes them zero, which no test could tell from a dropped adapter).
ZAMBA2_ADAPTER_GAIN = 0.5


def zamba2_config(p, dtype_name):
    """config.json dict for a Zamba2 preset `p`: the fields Zamba2Config.save_pretrained writes
    (transformers 5.23), without transformers_version, the derived ones (attention_hidden_size,
    attention_head_dim, mamba_headdim, kv_channels, num_query_groups, hybrid_layer_ids) included."""
    pattern, h = p["pattern"], p["hidden_size"]
    if not pattern or set(pattern) - set(ZAMBA2_LAYER_TYPES) or "H" not in pattern:
        raise ValueError(f"pattern {pattern!r}: only M and H, at least one H")
    inner = p["mamba_expand"] * h
    if inner % p["n_mamba_heads"] or p["n_mamba_heads"] % p["mamba_ngroups"]:
        raise ValueError("mamba_expand * hidden_size must be a multiple of n_mamba_heads, a multiple of mamba_ngroups")
    if (2 * h) % p["num_attention_heads"] or h % p["num_attention_heads"]:
        raise ValueError("hidden_size must be a multiple of num_attention_heads")
    return {
        **head_fields(p, "Zamba2ForCausalLM", "zamba2", dtype_name, len(pattern),
                      tied=p.get("tie_word_embeddings", True)),
        "layers_block_type": [ZAMBA2_LAYER_TYPES[c] for c in pattern],
        "hybrid_layer_ids": [i for i, c in enumerate(pattern) if c == "H"],
        # shared transformer blocks: attention on concat(h, embeddings), 2 * hidden wide
        "num_mem_blocks": p["num_mem_blocks"],
        "attention_hidden_size": 2 * h,
        "attention_head_dim": 2 * h // p["num_attention_heads"],
        **attention_fields(p, num_key_value_heads=p["num_attention_heads"], bias_field=False),
        "num_query_groups": p["num_attention_heads"],
        "kv_channels": h // p["num_attention_heads"],
        "use_mem_rope": p["use_mem_rope"],
        "use_long_context": False,
        "rope_parameters": {"rope_theta": p["rope_theta"], "rope_type": "default"},
        "use_shared_attention_adapter": p.get("use_shared_attention_adapter", True),
        "adapter_rank": p["adapter_rank"],
        "intermediate_size": p["intermediate_size"],
        "hidden_act": "gelu",
        "add_bias_linear": False,
        # Mamba2 mixer of every layer
        "n_mamba_heads": p["n_mamba_heads"],
        "mamba_headdim": inner // p["n_mamba_heads"],
        "mamba_ngroups": p["mamba_ngroups"],
        "mamba_d_state": p["mamba_d_state"],
        "mamba_d_conv": p["mamba_d_conv"],
        "mamba_expand": p["mamba_expand"],
        "chunk_size": p["chunk_size"],
        "use_conv_bias": True,
        "use_mamba_kernels": True,
        "use_mem_eff_path": False,
        **time_step_fields(),
        **tail_fields(1e-5),
    }


def zamba2_shared_block_uses(cfg):
    """[(hybrid layer index, use u, block id)] in layer order: use u runs block u % num_mem_blocks."""
    ids = cfg["hybrid_layer_ids"]
    return [(layer, u, u % cfg["num_mem_blocks"]) for u, layer in enumerate(ids)]


def zamba2_weights(cfg, seed, branch_gain=1.0, per_use_copies=False, untied_blocks=False):
    """name -> float32 array for Zamba2ForCausalLM (save_pretrained names: model.*; lm_head.weight
    only when the config does not tie it to model.embed_tokens.weight, drawn last).

    A Mamba2 layer L: model.layers.L.{input_layernorm.weight, mamba.*}. A hybrid layer L:
    model.layers.L.{linear.weight, mamba_decoder.input_layernorm.weight, mamba_decoder.mamba.*} and,
    in the first hybrid layer that uses memory block b (the others' shared_transformer is tied
    to it and, without per_use_copies, not written), model.layers.L.shared_transformer.*:
    input_layernorm [2H], pre_ff_layernorm [H], self_attn.{q,k,v}_proj [2H, 2H], o_proj [H, 2H],
    feed_forward.gate_up_proj [2I, H], down_proj [H, I], and for every hybrid use u with
    u % num_mem_blocks == b the adapters self_attn.linear_{q,k,v}_adapter_list.u.{0 [rank, 2H],
    1 [2H, rank]} (only with use_shared_attention_adapter) and
    feed_forward.gate_up_proj_adapter_list.u.{0 [rank, H], 1 [2I, rank]}.
    per_use_copies: every later hybrid layer using block b also holds those tensors, the same values,
    under its own shared_transformer.* (what save_pretrained writes for a model whose blocks are not
    tied in memory); no extra random draws, so every other tensor is the same as without.
    untied_blocks: every hybrid layer holds its own shared_transformer.*, drawn afresh in layer order
    with the same names (its block's tensors and the adapters of every use of its memory block), as
    save_pretrained writes a randomly initialised model whose config does not tie (transformers then
    runs each layer's own; adapters of other uses are in the file but unused by that layer).
    Init: as the other archs (projections N(0, 1/fan_in), branch outputs over n_layers), adapters'
    first matrix N(0, 1/fan_in) and second N(0, ZAMBA2_ADAPTER_GAIN^2 / rank); `linear` N(0, 1/H), so
    the shared block's contribution to the Mamba2 input has the residual's scale. branch_gain
    multiplies the standard deviation of every branch's output matrix (each mixer's out_proj,
    `linear`, the shared blocks' o_proj and down_proj): below 1 the residual stream keeps more of the
    embeddings and each layer amplifies rounding errors less (a preset's `init`)."""
    h, v, f, r = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["adapter_rank"]
    a = 2 * h
    n_layers = cfg["num_hidden_layers"]
    inner = cfg["mamba_expand"] * h
    t = new_model(seed, "model.embed_tokens.weight", v, h)

    def mamba_layer(pre):
        t.norm(pre + "input_layernorm.weight", h)
        mamba_mixer(t, pre + "mamba.", h, cfg["n_mamba_heads"], inner // cfg["n_mamba_heads"],
                    cfg["mamba_ngroups"], cfg["mamba_d_state"], cfg["mamba_d_conv"], n_layers, out_scale=branch_gain)

    def lora(name, n_in, n_out):
        t.normal(name + ".0.weight", (r, n_in), n_in ** -0.5)
        t.normal(name + ".1.weight", (n_out, r), ZAMBA2_ADAPTER_GAIN * r ** -0.5)

    uses = zamba2_shared_block_uses(cfg)
    first_of_block = {}
    for layer, _, block in uses:
        first_of_block.setdefault(block, layer)
    for i, kind in enumerate(cfg["layers_block_type"]):
        pre = f"model.layers.{i}."
        if kind == "linear_attention":
            mamba_layer(pre)
            continue
        t.normal(pre + "linear.weight", (h, h), h ** -0.5 * branch_gain)
        mamba_layer(pre + "mamba_decoder.")
        block = next(b for layer, _, b in uses if layer == i)
        if first_of_block[block] != i and not untied_blocks:
            continue
        st = pre + "shared_transformer."
        t.norm(st + "input_layernorm.weight", a)
        t.norm(st + "pre_ff_layernorm.weight", h)
        attention(t, st + "self_attn.", a, a, a, a ** -0.5 * branch_gain, d_out=h)
        mlp(t, st + "feed_forward.", h, f, f ** -0.5 * branch_gain, up="gate_up_proj", up_rows=2 * f)
        for _, u, b in uses:
            if b != block:
                continue
            if cfg["use_shared_attention_adapter"]:
                for x in ("q", "k", "v"):
                    lora(st + f"self_attn.linear_{x}_adapter_list.{u}", a, a)
            lora(st + f"feed_forward.gate_up_proj_adapter_list.{u}", h, 2 * f)
    if per_use_copies:
        for layer, _, block in uses:
            source = f"model.layers.{first_of_block[block]}.shared_transformer."
            if first_of_block[block] == layer:
                continue
            for name in [n for n in t if n.startswith(source)]:
                t[f"model.layers.{layer}.shared_transformer." + name[len(source):]] = t[name].copy()
    t.norm("model.final_layernorm.weight", h)
    if not cfg["tie_word_embeddings"]:
        t.normal("lm_head.weight", (v, h), h ** -0.5)
    return t
