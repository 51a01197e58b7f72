"""tools/gen_model.py's Nemotron-H and Mamba2 families: config.json and weights of a preset.

Both write their body under "backbone." (save_pretrained's names). Nemotron-H's layers are
Mamba2 mixers (M), attention (*), relu2 MLPs (-) and MoE blocks (E); Mamba2's are all mixers.
"""

import math

from gen_model_parts import (INF, attention, attention_fields, head_fields, mamba_mixer, mlp, new_model, router,
                             time_step_fields)

PATTERN_TO_BLOCK = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}

LAYER_NORM_EPS = 1e-5

# Nemotron-H's router correction bias (e_score_correction_bias) ~ N(0, NEMOTRON_BIAS_STD^2): the
# sigmoid scores of router logits of std ~ROUTER_GAIN spread over (0, 1) with neighbours ~0.1 apart
# in the top-k, so a bias of this size changes a fair share of the choices (make_golden.py records
# how many) without deciding them all.
NEMOTRON_BIAS_STD = 0.1


def nemotron_h_config(p, dtype_name):
    """config.json dict for a Nemotron-H preset `p` (field names of NemotronHConfig)."""
    pattern = p["pattern"]
    if set(pattern) - set(PATTERN_TO_BLOCK):
        raise ValueError(f"pattern {pattern!r}: only M, *, - and E are supported")
    intermediate = p["mamba_num_heads"] * p["mamba_head_dim"]
    if intermediate % p["hidden_size"] or intermediate % p["n_groups"] or p["mamba_num_heads"] % p["n_groups"]:
        raise ValueError("mamba heads*head_dim must be a multiple of hidden_size and of n_groups; "
                         "mamba_num_heads a multiple of n_groups")
    if p["num_attention_heads"] % p["num_key_value_heads"]:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    cfg = {
        **head_fields(p, "NemotronHForCausalLM", "nemotron_h", dtype_name, len(pattern), tied=False),
        "hybrid_override_pattern": pattern,
        "layers_block_type": [PATTERN_TO_BLOCK[c] for c in pattern],
        # attention ('*')
        **attention_fields(p),
        "head_dim": p["head_dim"],
        "sliding_window": None,
        # MLP ('-')
        "intermediate_size": p["intermediate_size"],
        "mlp_hidden_act": "relu2",
        "mlp_bias": p.get("mlp_bias", False),
        # Mamba2 mixer ('M')
        "mamba_num_heads": p["mamba_num_heads"],
        "mamba_head_dim": p["mamba_head_dim"],
        "ssm_state_size": p["ssm_state_size"],
        "n_groups": p["n_groups"],
        "conv_kernel": p["conv_kernel"],
        "expand": intermediate // p["hidden_size"],
        "chunk_size": p["chunk_size"],
        "mamba_hidden_act": "silu",
        "use_conv_bias": True,
        "use_bias": False,
        "mamba_proj_bias": False,
        **time_step_fields(),
        "time_step_limit": [0.0, INF],
        "mamba_ssm_cache_dtype": "float32",
        # common
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "residual_in_fp32": False,
        "rescale_prenorm_residual": True,
        "initializer_range": 0.02,
        "hidden_dropout": 0.0,
        "num_logits_to_keep": 1,
        "use_cache": True,
    }
    if "E" in pattern:
        cfg.update(_nemotron_moe_fields(p))
    return cfg


def _nemotron_moe_fields(p):
    """The MoE ('E') fields of NemotronHConfig, as save_pretrained writes them (transformers 5.23),
    with the multi-token-prediction fields it writes beside them (no MTP layers)."""
    experts, top_k, n_group, topk_group = (p["n_routed_experts"], p["num_experts_per_tok"], p["n_group"],
                                           p["topk_group"])
    if experts % n_group or (n_group > 1 and experts // n_group < 2) or not 1 <= topk_group <= n_group:
        raise ValueError("n_group must divide n_routed_experts into groups of two or more experts; "
                         "topk_group must be in [1, n_group]")
    if not 1 <= top_k <= topk_group * (experts // n_group):
        raise ValueError("num_experts_per_tok must be in [1, experts of topk_group groups]")
    latent = p.get("moe_latent_size")
    if latent is not None and (not isinstance(latent, int) or latent < 1):
        raise ValueError("moe_latent_size must be a positive integer or None")
    return {
        "n_routed_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": p["moe_intermediate_size"],
        "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": p["moe_shared_expert_intermediate_size"],
        "moe_shared_expert_overlap": True,
        "moe_latent_size": p.get("moe_latent_size"),
        "n_group": n_group,
        "topk_group": topk_group,
        "norm_topk_prob": p["norm_topk_prob"],
        "routed_scaling_factor": p["routed_scaling_factor"],
        "output_router_logits": False,
        "num_nextn_predict_layers": 0,
        "mtp_layers_block_type": ["full_attention", "moe"],
    }


def mamba2_config(p, dtype_name):
    """config.json dict for a Mamba2 preset `p` (field names of Mamba2Config)."""
    intermediate = p["num_heads"] * p["head_dim"]
    if intermediate % p["hidden_size"] or p["num_heads"] % p["n_groups"]:
        raise ValueError("num_heads*head_dim must be a multiple of hidden_size; num_heads of n_groups")
    return {
        **head_fields(p, "Mamba2ForCausalLM", "mamba2", dtype_name, p["num_hidden_layers"], tied=True),
        "num_heads": p["num_heads"],
        "head_dim": p["head_dim"],
        "expand": intermediate // p["hidden_size"],
        "state_size": p["state_size"],
        "n_groups": p["n_groups"],
        "conv_kernel": p["conv_kernel"],
        "chunk_size": p["chunk_size"],
        "hidden_act": "silu",
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": math.ceil(p["hidden_size"] / 16),
        **time_step_fields(),
        "time_step_limit": [0.0, INF],
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "residual_in_fp32": True,
        "rescale_prenorm_residual": False,
        "initializer_range": 0.1,
        "use_cache": True,
    }


def nemotron_h_weights(cfg, seed):
    """name -> float32 array, in the names and shapes transformers' save_pretrained writes."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    pattern = cfg["hybrid_override_pattern"]
    n_layers = len(pattern)
    t = new_model(seed, "backbone.embeddings.weight", v, h)
    for i, kind in enumerate(pattern):
        pre = f"backbone.layers.{i}."
        t.norm(pre + "norm.weight", h)
        mix = pre + "mixer."
        if kind == "M":
            mamba_mixer(t, mix, h, cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["n_groups"],
                        cfg["ssm_state_size"], cfg["conv_kernel"], n_layers)
        elif kind == "*":
            nq, hd = cfg["num_attention_heads"], cfg["head_dim"]
            attention(t, mix, h, nq * hd, cfg["num_key_value_heads"] * hd, (nq * hd * n_layers) ** -0.5)
        elif kind == "-":
            f = cfg["intermediate_size"]
            mlp(t, mix, h, f, (f * n_layers) ** -0.5)
            _mlp_biases(t, mix, h, f, cfg)
        else:  # 'E'
            _nemotron_moe(t, mix, cfg, n_layers)
    t.norm("backbone.norm_f.weight", h)
    t.normal("lm_head.weight", (v, h), h ** -0.5)
    return t


def _nemotron_moe(t, mix, cfg, n_layers):
    """An 'E' block's tensors under `mix` (backbone.layers.L.mixer.): the router (gate.weight,
    gate.e_score_correction_bias), per-expert experts.E.{up,down}_proj.weight and
    shared_experts.{up,down}_proj.weight, as save_pretrained writes them; with moe_latent_size L
    also fc1_latent_proj.weight [L, hidden] ~ N(0, 1/hidden) and fc2_latent_proj.weight [hidden, L]
    ~ N(0, 1/L), and the experts are L wide ([inter, L] up, [L, inter] down). Routers
    ~ N(0, ROUTER_GAIN^2 / hidden); expert down projections over the routed weights' typical sum
    (routed_scaling_factor, or top_k * 0.5 * routed_scaling_factor without norm_topk_prob), so the
    routed and shared halves of the block have the scale of an MLP."""
    h, e, f, s = (cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"],
                  cfg["moe_shared_expert_intermediate_size"])
    routed_sum = cfg["routed_scaling_factor"] * (1.0 if cfg["norm_topk_prob"] else 0.5 * cfg["num_experts_per_tok"])
    router(t, mix + "gate.weight", e, h)
    t.normal(mix + "gate.e_score_correction_bias", (e,), NEMOTRON_BIAS_STD)
    d = h
    if cfg.get("moe_latent_size") is not None:
        d = cfg["moe_latent_size"]
        t.normal(mix + "fc1_latent_proj.weight", (d, h), h ** -0.5)
        t.normal(mix + "fc2_latent_proj.weight", (h, d), d ** -0.5)
    for j in range(e):
        mlp(t, f"{mix}experts.{j}.", d, f, (f * n_layers) ** -0.5 / routed_sum)
    mlp(t, mix + "shared_experts.", h, s, (s * n_layers) ** -0.5)
    _mlp_biases(t, mix + "shared_experts.", h, s, cfg)


def _mlp_biases(t, pre, h, f, cfg):
    """With mlp_bias, up_proj.bias [f] and down_proj.bias [h] ~ N(0, 0.1^2) under `pre`: an MLP
    layer's, and the shared expert's (NemotronHMLP; the routed experts have none). Drawn after
    the matrices, so a model without them draws what it always did."""
    if cfg["mlp_bias"]:
        t.normal(pre + "up_proj.bias", (f,), 0.1)
        t.normal(pre + "down_proj.bias", (h,), 0.1)


def mamba2_weights(cfg, seed):
    """name -> float32 array for Mamba2ForCausalLM (tied head: no lm_head.weight)."""
    h, v, n_layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    t = new_model(seed, "backbone.embeddings.weight", v, h)
    for i in range(n_layers):
        pre = f"backbone.layers.{i}."
        t.norm(pre + "norm.weight", h)
        mamba_mixer(t, pre + "mixer.", h, cfg["num_heads"], cfg["head_dim"], cfg["n_groups"],
                    cfg["state_size"], cfg["conv_kernel"], n_layers)
    t.norm("backbone.norm_f.weight", h)
    return t
