"""tools/gen_model.py's Bamba and GraniteMoeHybrid families: config.json and weights of a preset.

Both state their layers as a pattern of M (Mamba2 mixer, model.layers.L.mamba.*) and * (attention,
model.layers.L.self_attn.*, head_dim = hidden_size / num_attention_heads), share the mamba_* config
fields, and write their body under "model.". Bamba adds a SwiGLU feed_forward to every layer;
GraniteMoeHybrid a shared MLP and, with experts, an MoE block beside it, and multipliers.
With attention_bias (a preset's, False when it does not say), q/k/v/o_proj have biases, as
BambaAttention and GraniteMoeHybridAttention build them.
"""

from gen_model_parts import (INF, attention, attention_fields, head_fields, mamba_mixer, mlp, new_model, router,
                             swiglu_mlp, tail_fields)

# GraniteMoeHybridConfig.layer_types as transformers 5.23 writes them (it reads the Hub's
# legacy "mamba" / "attention" too, and writes these back).
GRANITE_LAYER_TYPES = {"M": "linear_attention", "*": "full_attention"}


def _check_hybrid_preset(p):
    """Checks a bamba / granitemoehybrid preset's pattern (M = Mamba2 mixer, * = attention) and
    its Mamba2 and attention shapes; returns mamba_expand."""
    if not p["pattern"] or set(p["pattern"]) - {"M", "*"}:
        raise ValueError(f"pattern {p['pattern']!r}: only M and * are supported")
    inner = p["mamba_n_heads"] * p["mamba_d_head"]
    if inner % p["hidden_size"] or p["mamba_n_heads"] % p["mamba_n_groups"]:
        raise ValueError("mamba_n_heads*mamba_d_head must be mamba_expand*hidden_size; "
                         "mamba_n_heads a multiple of mamba_n_groups")
    if p["hidden_size"] % p["num_attention_heads"] or p["num_attention_heads"] % p["num_key_value_heads"]:
        raise ValueError("hidden_size must be a multiple of num_attention_heads, which must be a multiple of "
                         "num_key_value_heads")
    return inner // p["hidden_size"]


def _mamba_fields(p, expand):
    """The mamba_* fields that BambaConfig and GraniteMoeHybridConfig share."""
    return {
        "mamba_n_heads": p["mamba_n_heads"],
        "mamba_d_head": p["mamba_d_head"],
        "mamba_n_groups": p["mamba_n_groups"],
        "mamba_d_state": p["mamba_d_state"],
        "mamba_d_conv": p["mamba_d_conv"],
        "mamba_expand": expand,
        "mamba_chunk_size": p["mamba_chunk_size"],
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "time_step_limit": [0.0, INF],
    }


def bamba_config(p, dtype_name):
    """config.json dict for a Bamba preset `p`: the fields BambaConfig.save_pretrained writes
    (transformers 5.23), without transformers_version."""
    expand = _check_hybrid_preset(p)
    pattern = p["pattern"]
    return {
        **head_fields(p, "BambaForCausalLM", "bamba", dtype_name, len(pattern), tied=False),
        "attn_layer_indices": [i for i, c in enumerate(pattern) if c == "*"],
        # attention: head_dim = hidden_size / num_attention_heads, RoPE on its first half
        **attention_fields(p),
        "attention_bias": p.get("attention_bias", False),
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        # SwiGLU feed-forward of every layer
        "intermediate_size": p["intermediate_size"],
        "hidden_act": "silu",
        "mlp_bias": p["mlp_bias"],
        **_mamba_fields(p, expand),
        "z_loss_coefficient": 0.0,
        **tail_fields(1e-5),
    }


def granitemoehybrid_config(p, dtype_name):
    """config.json dict for a GraniteMoeHybrid preset `p`: the fields
    GraniteMoeHybridConfig.save_pretrained writes (transformers 5.23), without transformers_version."""
    expand = _check_hybrid_preset(p)
    pattern = p["pattern"]
    experts, top_k = p["num_local_experts"], p["num_experts_per_tok"]
    if experts and not 0 < top_k <= experts:
        raise ValueError("num_experts_per_tok must be in [1, num_local_experts]")
    # transformers builds rotary embeddings only for "rope"; None and "nope" (what the published
    # Granite 4.0-H configs say) both mean no positions.
    if p["position_embedding_type"] not in (None, "nope", "rope"):
        raise ValueError("position_embedding_type must be None, 'nope' or 'rope'")
    return {
        **head_fields(p, "GraniteMoeHybridForCausalLM", "granitemoehybrid", dtype_name, len(pattern),
                      tied=p["tie_word_embeddings"]),
        "layer_types": [GRANITE_LAYER_TYPES[c] for c in pattern],
        "embedding_multiplier": p["embedding_multiplier"],
        "residual_multiplier": p["residual_multiplier"],
        "attention_multiplier": p["attention_multiplier"],
        "logits_scaling": p["logits_scaling"],
        # attention: head_dim = hidden_size / num_attention_heads, scores scaled by attention_multiplier
        **attention_fields(p),
        "attention_bias": p.get("attention_bias", False),
        "position_embedding_type": p["position_embedding_type"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        # shared SwiGLU MLP of every layer, and the MoE block beside it (num_local_experts > 0)
        "shared_intermediate_size": p["shared_intermediate_size"],
        "intermediate_size": p["intermediate_size"],
        "num_local_experts": experts,
        "num_experts_per_tok": top_k,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "hidden_act": "silu",
        **_mamba_fields(p, expand),
        **tail_fields(1e-6, logits_to_keep=False),
    }


def _hybrid_mixer(t, pre, kind, cfg, n_layers, out_scale=1.0):
    """Layer `pre`'s mixer: model.layers.L.mamba.* ('M') or model.layers.L.self_attn.* ('*').
    Attention biases (attention_bias) ~ N(0, 0.1^2), o_proj's times out_scale, drawn after the
    four matrices (so a model without them draws what it always did)."""
    h = cfg["hidden_size"]
    if kind == "M":
        mamba_mixer(t, pre + "mamba.", h, cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_n_groups"],
                    cfg["mamba_d_state"], cfg["mamba_d_conv"], n_layers, out_scale)
    else:
        nq = cfg["num_attention_heads"]
        hd = h // nq
        nkv = cfg["num_key_value_heads"]
        attention(t, pre + "self_attn.", h, nq * hd, nkv * hd, (nq * hd * n_layers) ** -0.5 * out_scale)
        if cfg.get("attention_bias", False):
            for name, n, std in (("q_proj", nq * hd, 0.1), ("k_proj", nkv * hd, 0.1), ("v_proj", nkv * hd, 0.1),
                                 ("o_proj", h, 0.1 * out_scale)):
                t.normal(pre + "self_attn." + name + ".bias", (n,), std)


def _hybrid_pattern_of(cfg):
    """'M' / '*' per decoder layer, from a bamba or granitemoehybrid config dict."""
    if cfg["model_type"] == "bamba":
        return "".join("*" if i in cfg["attn_layer_indices"] else "M" for i in range(cfg["num_hidden_layers"]))
    inverse = {v: k for k, v in GRANITE_LAYER_TYPES.items()}
    return "".join(inverse[x] for x in cfg["layer_types"])


def bamba_weights(cfg, seed):
    """name -> float32 array for BambaForCausalLM (save_pretrained names: model.*, lm_head.weight).
    MLP biases (mlp_bias) ~ N(0, 0.1^2), so that a kernel that drops one is caught."""
    h, v, f = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    pattern = _hybrid_pattern_of(cfg)
    n_layers = len(pattern)
    t = new_model(seed, "model.embed_tokens.weight", v, h)
    for i, kind in enumerate(pattern):
        pre = f"model.layers.{i}."
        t.norm(pre + "input_layernorm.weight", h)
        _hybrid_mixer(t, pre, kind, cfg, n_layers)
        t.norm(pre + "pre_ff_layernorm.weight", h)
        swiglu_mlp(t, pre + "feed_forward.", h, f, (f * n_layers) ** -0.5,
                   bias_stds=(0.1, 0.1, 0.1) if cfg["mlp_bias"] else None)
    t.norm("model.final_layernorm.weight", h)
    t.normal("lm_head.weight", (v, h), h ** -0.5)
    return t


def granitemoehybrid_weights(cfg, seed):
    """name -> float32 array for GraniteMoeHybridForCausalLM (save_pretrained names; no
    lm_head.weight when tie_word_embeddings).

    The multipliers are folded into the init so that activations have the balance of the other
    archs: logits O(1) after the division by logits_scaling (lm_head's std times logits_scaling),
    and residual branches a few times larger than the embedded input. An untied embedding's std
    is divided by embedding_multiplier, so the embedded input has the other archs' scale; a tied
    embedding, being the head too, gets std logits_scaling/sqrt(hidden), so the embedded input is
    embedding_multiplier * logits_scaling times larger. Residual branches' output projections
    (mamba out_proj, o_proj, shared and expert output_linear) have their std multiplied by that
    input gain (1 untied, embedding_multiplier * logits_scaling tied) over residual_multiplier.
    Without that gain the tied model's residual is its input embedding and its greedy choice is
    the last input token, whatever the layers compute.
    """
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    pattern = _hybrid_pattern_of(cfg)
    n_layers = len(pattern)
    tied = cfg["tie_word_embeddings"]
    input_gain = cfg["embedding_multiplier"] * cfg["logits_scaling"] if tied else 1.0
    out_scale = input_gain / cfg["residual_multiplier"]
    s, f, n_exp = cfg["shared_intermediate_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    emb_std = h ** -0.5 * (cfg["logits_scaling"] if tied else 1.0 / cfg["embedding_multiplier"])
    t = new_model(seed, "model.embed_tokens.weight", v, h, emb_std)
    for i, kind in enumerate(pattern):
        pre = f"model.layers.{i}."
        t.norm(pre + "input_layernorm.weight", h)
        _hybrid_mixer(t, pre, kind, cfg, n_layers, out_scale)
        t.norm(pre + "post_attention_layernorm.weight", h)
        mlp(t, pre + "shared_mlp.", h, s, (s * n_layers) ** -0.5 * out_scale, up="input_linear",
            down="output_linear", up_rows=2 * s)
        if n_exp:
            moe = pre + "block_sparse_moe."
            router(t, moe + "router.layer.weight", n_exp, h)
            t.normal(moe + "input_linear.weight", (n_exp, 2 * f, h), h ** -0.5)
            t.normal(moe + "output_linear.weight", (n_exp, h, f), (f * n_layers) ** -0.5 * out_scale)
    t.norm("model.norm.weight", h)
    if not tied:
        t.normal("lm_head.weight", (v, h), h ** -0.5 * cfg["logits_scaling"])
    return t
