"""tools/gen_model.py's Gated DeltaNet hybrids: Qwen3-Next (qwen3_next), Qwen3.5 dense in its text-only
form (qwen3_5_text, Qwen3_5ForCausalLM) and Qwen3.5-MoE in its image-text form (qwen3_5_moe,
Qwen3_5MoeForConditionalGeneration: text_config + vision_config): config.json and weights of a preset.

Tensor names are those transformers 5.23's save_pretrained writes (and published checkpoints hold):
the body under "model." (qwen3_next, qwen3_5_text) or "model.language_model." with the vision tower
under "model.visual." (qwen3_5_moe); one tensor per expert and projection
(mlp.experts.E.{gate,up,down}_proj.weight), which transformers fuses on load into
mlp.experts.gate_up_proj [E, 2 * moe_intermediate_size, hidden] (gate rows first) and
mlp.experts.down_proj [E, hidden, moe_intermediate_size]. A layer is linear_attention (Gated DeltaNet,
linear_attn.*) or full_attention (gated attention, self_attn.*: q_proj's rows are each head's query
then its gate, 2 * heads * head_dim) as layer_types says, or for qwen3_5_text as
full_attention_interval says (every interval-th layer is attention; the config then has no layer_types).
Qwen3-Next's GDN input projections are in_proj_qkvz and in_proj_ba (rows grouped per key head);
Qwen3.5's are in_proj_qkv, in_proj_z, in_proj_b and in_proj_a. The conv1d has no bias.

Initialisation (each tensor its own stream, as gen_model_parts.py): projections ~ N(0, 1/fan_in), output
projections (o_proj, out_proj, down_proj) ~ N(0, 1/(fan_in * layers)), routers and the shared-expert gate
~ N(0, ROUTER_GAIN^2 / hidden). Every tensor is off its transformers init, so that an engine that ignores
it is caught: the (1 + w) RMSNorms (input_layernorm, post_attention_layernorm, norm, q_norm, k_norm;
init 0) ~ N(0, 0.1^2) (an engine that multiplies by w instead of 1 + w scales by ~0.1); the GDN's gated
norm (plain w, init 1) = 1 + N(0, 0.1^2); A_log = log(U[0.1, 1]) and dt_bias ~ U[-2, 0] (init 1), so
that the decay exp(-exp(A_log) softplus(a + dt_bias)) ranges from ~0.5 to ~1 per token and the
recurrent state carries across the 64-token chunks; conv1d ~ U(-1/sqrt(k), 1/sqrt(k)). The vision tower
(qwen3_5_moe, which a text engine must ignore) gets matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2),
LayerNorm weights 1 + N(0, 0.1^2).
"""

import math

import numpy as np

from gen_model_parts import ROUTER_GAIN, new_model, router

ARCHS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")
CLASSES = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
           "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}


def layer_types_of(text):
    """'full_attention' / 'linear_attention' per layer of a text config dict, as transformers 5.23 resolves
    them: layer_types when given, else every full_attention_interval-th layer (1-based) is attention."""
    if "layer_types" in text:
        return list(text["layer_types"])
    interval = text.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(text["num_hidden_layers"])]


def moe_layers_of(arch, text):
    """Whether each layer's MLP is the sparse MoE block (else the dense SwiGLU MLP)."""
    n = text["num_hidden_layers"]
    if arch == "qwen3_5_text":
        return [False] * n
    if arch == "qwen3_5_moe":
        return [True] * n
    step, dense = text.get("decoder_sparse_step", 1), set(text.get("mlp_only_layers", []))
    return [text["num_experts"] > 0 and i not in dense and (i + 1) % step == 0 for i in range(n)]


def _text_fields(p, arch):
    """The text model's fields as transformers 5.23's save_pretrained writes them (less layer_types when
    the preset gives full_attention_interval instead)."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": p["partial_rotary_factor"]}
    if arch != "qwen3_next":
        rope.update(mrope_section=p["mrope_section"], mrope_interleaved=True)
    f = {
        "vocab_size": p["vocab_size"], "hidden_size": p["hidden_size"], "num_hidden_layers": p["num_hidden_layers"],
        "num_attention_heads": p["num_attention_heads"], "num_key_value_heads": p["num_key_value_heads"],
        "head_dim": p["head_dim"], "attention_bias": False, "attention_dropout": 0.0, "rope_parameters": rope,
        "linear_num_key_heads": p["linear_num_key_heads"], "linear_num_value_heads": p["linear_num_value_heads"],
        "linear_key_head_dim": p["linear_key_head_dim"], "linear_value_head_dim": p["linear_value_head_dim"],
        "linear_conv_kernel_dim": p["linear_conv_kernel_dim"], "hidden_act": "silu",
        "max_position_embeddings": p["max_position_embeddings"], "rms_norm_eps": p["rms_norm_eps"],
        "initializer_range": 0.02, "use_cache": True, "tie_word_embeddings": p["tie_word_embeddings"],
        "pad_token_id": p["pad_token_id"], "bos_token_id": p["bos_token_id"], "eos_token_id": p["eos_token_id"],
    }
    if "layer_types" in p:
        f["layer_types"] = list(p["layer_types"])
    else:
        f["full_attention_interval"] = p["full_attention_interval"]
    if arch != "qwen3_5_text":
        f.update(num_experts=p["num_experts"], num_experts_per_tok=p["num_experts_per_tok"],
                 moe_intermediate_size=p["moe_intermediate_size"],
                 shared_expert_intermediate_size=p["shared_expert_intermediate_size"],
                 output_router_logits=False, router_aux_loss_coef=0.001)
    if arch != "qwen3_5_moe":
        f["intermediate_size"] = p["intermediate_size"]
    if arch == "qwen3_next":
        f.update(norm_topk_prob=p["norm_topk_prob"], decoder_sparse_step=p["decoder_sparse_step"],
                 mlp_only_layers=list(p["mlp_only_layers"]))
    return f


def _check(p):
    if p["num_attention_heads"] % p["num_key_value_heads"] or p["linear_num_value_heads"] % p["linear_num_key_heads"]:
        raise ValueError("heads must be multiples of key_value heads / linear key heads")
    if "layer_types" in p and len(p["layer_types"]) != p["num_hidden_layers"]:
        raise ValueError("layer_types must name every layer")
    half = int(p["head_dim"] * p["partial_rotary_factor"]) // 2
    if "mrope_section" in p and sum(p["mrope_section"]) != half:
        raise ValueError(f"mrope_section must sum to the rotary half-width {half}")


def qwen3_next_config(p, dtype_name, arch):
    """config.json dict of a preset `p` of `arch`, the fields save_pretrained writes (transformers 5.23),
    without transformers_version."""
    _check(p)
    text = _text_fields(p, arch)
    if arch != "qwen3_5_moe":
        return {"architectures": [CLASSES[arch]], "model_type": arch, "dtype": dtype_name, **text}
    text["model_type"] = "qwen3_5_moe_text"
    v = p["vision"]
    return {
        "architectures": [CLASSES[arch]], "model_type": arch, "dtype": dtype_name,
        "tie_word_embeddings": p["tie_word_embeddings"], "text_config": text,
        "vision_config": {
            "model_type": "qwen3_5_moe_vision", "depth": v["depth"], "hidden_size": v["hidden_size"],
            "hidden_act": "gelu_pytorch_tanh", "intermediate_size": v["intermediate_size"],
            "num_heads": v["num_heads"], "in_channels": 3, "patch_size": v["patch_size"],
            "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": p["hidden_size"],
            "num_position_embeddings": v["num_position_embeddings"], "initializer_range": 0.02,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}},
        "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
    }


def _one_plus_w(t, name, n):
    """A (1 + w) RMSNorm weight (transformers inits w to 0): w ~ N(0, 0.1^2)."""
    t.normal(name, (n,), 0.1)


def _gdn(t, pre, cfg, arch, n_layers):
    h = cfg["hidden_size"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    kd, vd = nk * cfg["linear_key_head_dim"], nv * cfg["linear_value_head_dim"]
    k = cfg["linear_conv_kernel_dim"]
    if arch == "qwen3_next":
        t.normal(pre + "in_proj_qkvz.weight", (2 * kd + 2 * vd, h), h ** -0.5)
        t.normal(pre + "in_proj_ba.weight", (2 * nv, h), h ** -0.5)
    else:
        t.normal(pre + "in_proj_qkv.weight", (2 * kd + vd, h), h ** -0.5)
        t.normal(pre + "in_proj_z.weight", (vd, h), h ** -0.5)
        t.normal(pre + "in_proj_b.weight", (nv, h), h ** -0.5)
        t.normal(pre + "in_proj_a.weight", (nv, h), h ** -0.5)
    bound = k ** -0.5
    t[pre + "conv1d.weight"] = t.stream(pre + "conv1d.weight").uniform((2 * kd + vd, 1, k), -bound, bound).astype(
        np.float32)
    u = t.stream(pre + "A_log").uniform((nv,), 0.1, 1.0)
    t[pre + "A_log"] = np.array([math.log(a) for a in u], dtype=np.float32)
    t[pre + "dt_bias"] = t.stream(pre + "dt_bias").uniform((nv,), -2.0, 0.0).astype(np.float32)
    t.norm(pre + "norm.weight", cfg["linear_value_head_dim"])
    t.normal(pre + "out_proj.weight", (h, vd), (vd * n_layers) ** -0.5)


def _attention(t, pre, cfg, n_layers):
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    t.normal(pre + "q_proj.weight", (2 * nq * hd, h), h ** -0.5)
    t.normal(pre + "k_proj.weight", (nkv * hd, h), h ** -0.5)
    t.normal(pre + "v_proj.weight", (nkv * hd, h), h ** -0.5)
    t.normal(pre + "o_proj.weight", (h, nq * hd), (nq * hd * n_layers) ** -0.5)
    _one_plus_w(t, pre + "q_norm.weight", hd)
    _one_plus_w(t, pre + "k_norm.weight", hd)


def _swiglu(t, pre, h, f, n_layers):
    t.normal(pre + "gate_proj.weight", (f, h), h ** -0.5)
    t.normal(pre + "up_proj.weight", (f, h), h ** -0.5)
    t.normal(pre + "down_proj.weight", (h, f), (f * n_layers) ** -0.5)


def _moe(t, pre, cfg, n_layers):
    h, n_exp = cfg["hidden_size"], cfg["num_experts"]
    router(t, pre + "gate.weight", n_exp, h)
    for e in range(n_exp):
        _swiglu(t, f"{pre}experts.{e}.", h, cfg["moe_intermediate_size"], n_layers)
    _swiglu(t, pre + "shared_expert.", h, cfg["shared_expert_intermediate_size"], n_layers)
    t.normal(pre + "shared_expert_gate.weight", (1, h), ROUTER_GAIN * h ** -0.5)


def _vision(t, pre, v):
    """The vision tower's tensors (Qwen3_5MoeVisionModel), under `pre` ("model.visual.")."""
    w, f, p, m = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["spatial_merge_size"]
    t.normal(pre + "patch_embed.proj.weight", (w, v["in_channels"], v["temporal_patch_size"], p, p),
             (v["in_channels"] * v["temporal_patch_size"] * p * p) ** -0.5)
    t.normal(pre + "patch_embed.proj.bias", (w,), 0.1)
    t.normal(pre + "pos_embed.weight", (v["num_position_embeddings"], w), w ** -0.5)

    def linear(name, n_out, n_in):
        t.normal(name + ".weight", (n_out, n_in), n_in ** -0.5)
        t.normal(name + ".bias", (n_out,), 0.1)

    def layer_norm(name, n):
        t.norm(name + ".weight", n)
        t.normal(name + ".bias", (n,), 0.1)

    for d in range(v["depth"]):
        b = f"{pre}blocks.{d}."
        layer_norm(b + "norm1", w)
        layer_norm(b + "norm2", w)
        linear(b + "attn.qkv", 3 * w, w)
        linear(b + "attn.proj", w, w)
        linear(b + "mlp.linear_fc1", f, w)
        linear(b + "mlp.linear_fc2", w, f)
    layer_norm(pre + "merger.norm", w)
    linear(pre + "merger.linear_fc1", w * m * m, w * m * m)
    linear(pre + "merger.linear_fc2", v["out_hidden_size"], w * m * m)


def qwen3_next_weights(cfg, seed, arch):
    """name -> float32 array of the checkpoint save_pretrained writes for config dict `cfg`."""
    text = cfg.get("text_config", cfg)
    body = "model.language_model." if arch == "qwen3_5_moe" else "model."
    h, v = text["hidden_size"], text["vocab_size"]
    kinds, moe = layer_types_of(text), moe_layers_of(arch, text)
    n_layers = len(kinds)
    t = new_model(seed, body + "embed_tokens.weight", v, h)
    for i, kind in enumerate(kinds):
        pre = f"{body}layers.{i}."
        _one_plus_w(t, pre + "input_layernorm.weight", h)
        _one_plus_w(t, pre + "post_attention_layernorm.weight", h)
        if kind == "linear_attention":
            _gdn(t, pre + "linear_attn.", text, arch, n_layers)
        else:
            _attention(t, pre + "self_attn.", text, n_layers)
        if moe[i]:
            _moe(t, pre + "mlp.", text, n_layers)
        else:
            _swiglu(t, pre + "mlp.", h, text["intermediate_size"], n_layers)
    _one_plus_w(t, body + "norm.weight", h)
    if not cfg["tie_word_embeddings"]:
        t.normal("lm_head.weight", (v, h), h ** -0.5)
    if arch == "qwen3_5_moe":
        _vision(t, "model.visual.", cfg["vision_config"])
    return t
