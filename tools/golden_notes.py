"""What each golden fixture's golden.json says about its model besides the
numbers (tools/make_golden.py writes it): the notes per family, and the
statistics that show a fixture exercises what it is for (MoE routing choices
and margins, Falcon-H1's shapes, Zamba2's shared blocks and adapters).
Needs torch and transformers, as make_golden.py does."""

import math
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model  # noqa: E402
from fixture_spec import NEW_TOKENS  # noqa: E402


COMMON_NOTES = [
    "Reference: transformers torch path (no mamba_ssm / causal_conv1d kernels), fp32, CPU, "
    "eager attention, torch.set_num_threads(1).",
    "logits_<i>: one forward over the whole prompt with use_cache=False (chunked SSD scan).",
    "greedy_<i>: generate(do_sample=False, use_cache=True): the prompt is prefilled with the chunk "
    "scan, then one token at a time with the recurrent selective-state update and causal_conv1d_update.",
    "greedy_nocache_<i>: argmax of an uncached forward over prompt + greedy[:k]; compare with "
    "greedy_<i> (per-prompt greedy_matches_nocache); greedy_nocache_logits_<i> are their "
    "last-position logits, the decode reference for an engine whose decode step clamps dt like its prefill.",
]
NEMOTRON_H_DT_NOTE = (
    "NemotronH clamps dt = softplus(dt_raw + dt_bias) to >= time_step_min (config time_step_limit "
    "is ignored) in the chunked (prefill) path only; the one-token decode path does not clamp. "
    "Hence greedy_logits_<i> differ from greedy_nocache_logits_<i> by up to "
    "max_abs_diff_cached_vs_uncached_logits.")

MAMBA2_DT_NOTE = "Mamba2 clamps dt to config time_step_limit (here [0, inf): a no-op) in the chunked path only."
BAMBA_NOTES = [
    "Bamba clamps dt to config time_step_limit (here [0, inf): a no-op) in the chunked path only.",
    "Bamba attention: head_dim = hidden_size / num_attention_heads, scale head_dim^-0.5; RoPE "
    "(rope_parameters.partial_rotary_factor 0.5, BambaConfig's default when the file has none) rotates "
    "only the first head_dim/2 dims of q and k, NeoX-style halves within them (rotate_half), with "
    "inv_freq = theta^(-2i/(head_dim/2)); the other half passes through. Positions count from 0 at the "
    "first prompt token. The gated RMSNorm of the Mamba2 mixer is group-wise (mamba_n_groups groups), "
    "eps rms_norm_eps, as Nemotron-H's.",
    "Bamba decoder layer: h += mixer(input_layernorm(h)); h += down(silu(gate(x)) * up(x)) with "
    "x = pre_ff_layernorm(h) (biases when mlp_bias); logits = lm_head(final_layernorm(h)).",
]
GRANITE_NOTES = [
    "GraniteMoeHybrid clamps dt to config time_step_limit (here [0, inf): a no-op) in the chunked path only.",
    "GraniteMoeHybrid: h = embed * embedding_multiplier; per layer h += residual_multiplier * "
    "mixer(input_layernorm(h)), then x = post_attention_layernorm(h), h += residual_multiplier * "
    "(moe(x) + shared_mlp(x)) (shared_mlp alone when num_local_experts = 0); "
    "logits = lm_head(norm(h)) / logits_scaling. Attention scores are scaled by attention_multiplier "
    "(not head_dim^-0.5); RoPE on the full head_dim only when position_embedding_type is 'rope', no "
    "positions otherwise.",
    "GraniteMoeHybrid MLPs: input_linear rows are [gate | up] (shared: [2*shared, hidden]; experts: "
    "[experts, 2*inter, hidden]), out = output_linear(silu(gate) * up). MoE: router logits = "
    "router.layer.weight x (fp32), top num_experts_per_tok by logit, weights = softmax over the chosen "
    "logits only (they sum to 1), out = sum of weight * expert(x).",
]

FALCON_H1_NOTES = [
    "FalconH1 clamps dt to config time_step_limit (here [0, inf): a no-op) in the chunked path only.",
    "FalconH1 decoder layer (every layer is both): x = input_layernorm(h); h += ssm_out_multiplier * "
    "mamba(x) + attention_out_multiplier * self_attn(attention_in_multiplier * x); then h += "
    "down_proj(up_proj(y) * silu(gate_proj(y) * mlp_multipliers[0])) * mlp_multipliers[1] with "
    "y = pre_ff_layernorm(h) (the multipliers also scale the gate and down biases when mlp_bias). "
    "h starts as embed_tokens * embedding_multiplier; logits = lm_head(final_layernorm(h)) * "
    "lm_head_multiplier. rms_norm_eps everywhere.",
    "FalconH1 mixer: in_proj(ssm_in_multiplier * x), then its output segments [z (d_ssm) | x (d_ssm) | "
    "B (groups*d_state) | C (groups*d_state) | dt (heads)] are multiplied by ssm_multipliers[0..4] "
    "(the dt segment before dt_bias and softplus), then Mamba2 as usual (conv1d + silu over x,B,C; "
    "y = SSD(x, dt, A, B, C) + D * x). Inner width mamba_d_ssm (mamba_expand is ignored when it is "
    "set). mamba_rms_norm false: out = out_proj(y * silu(z)), no norm tensor. mamba_rms_norm true: "
    "group-wise gated RMSNorm over mamba_n_groups groups of d_ssm/groups, weight norm.weight [d_ssm]: "
    "mamba_norm_before_gate true: norm(y) * silu(z); false: norm(y * silu(z)).",
    "FalconH1 attention: head_dim = config head_dim when present, else hidden_size / num_attention_heads; "
    "k = k_proj(x) * key_multiplier (before RoPE and the cache); scale head_dim^-0.5; RoPE on the full "
    "head_dim, NeoX-style halves (rotate_half), inv_freq = rope_theta^(-2i/head_dim), positions from 0.",
    "FalconH1ForCausalLM ties lm_head to embed_tokens when tie_word_embeddings (_tied_weights_keys); "
    "embedding_multiplier scales only the input embedding, lm_head_multiplier only the logits.",
]


@torch.no_grad()
def moe_routing_stats(model, prompts):
    """Per MoE layer, over one uncached forward of each prompt: tokens routed to each expert
    (counting every top-k slot), tokens whose top-1 is each expert, and the smallest top-1/top-2
    and top-k/top-(k+1) router-logit margins (the second decides which experts run)."""
    layers = [(i, layer.block_sparse_moe) for i, layer in enumerate(model.base_model.layers)
              if getattr(layer, "block_sparse_moe", None) is not None]
    if not layers:
        return None
    k = model.config.num_experts_per_tok
    n_exp = model.config.num_local_experts
    seen = {i: [] for i, _ in layers}

    def hook(i, output):
        seen[i].append(output[0].detach().clone())  # router_logits [tokens, experts], fp32

    handles = [moe.router.register_forward_hook(lambda mod, inp, out, i=i: hook(i, out)) for i, moe in layers]
    try:
        for prompt in prompts:
            model(torch.from_numpy(prompt.astype(np.int64))[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    per_layer = []
    for i, _ in layers:
        logits = torch.cat(seen[i])
        top = torch.topk(logits, min(k + 1, n_exp), dim=-1)
        chosen = top.indices[:, :k]
        per_layer.append({
            "layer": i,
            "tokens": int(logits.shape[0]),
            "tokens_per_expert": torch.bincount(chosen.reshape(-1), minlength=n_exp).tolist(),
            "top1_tokens_per_expert": torch.bincount(chosen[:, 0], minlength=n_exp).tolist(),
            "min_margin_top1_top2": float((top.values[:, 0] - top.values[:, 1]).min()),
            "min_margin_topk_next": (float((top.values[:, k - 1] - top.values[:, k]).min())
                                     if k < n_exp else None),
            "router_logit_std": float(logits.std()),
        })
    return {
        "experts_implementation": model.config._experts_implementation,
        "num_local_experts": n_exp,
        "num_experts_per_tok": k,
        "over": "one uncached forward of each prompt (every prompt token)",
        "min_margin_top1_top2": min(d["min_margin_top1_top2"] for d in per_layer),
        "min_margin_topk_next": (min(d["min_margin_topk_next"] for d in per_layer) if k < n_exp else None),
        "per_layer": per_layer,
    }


QWEN_NOTES = [
    "Gated DeltaNet reference: transformers' torch functions torch_chunk_gated_delta_rule (chunk_size 64, "
    "on the uncached forwards and the cached prefill), torch_recurrent_gated_delta_rule (one-token cached "
    "decode steps) and the torch causal_conv1d_fn / causal_conv1d_update fallbacks; asserted that "
    "flash-linear-attention (fla), causal_conv1d and the kernels hub package are not importable, so no "
    "other implementation could run.",
    "Prompts: fixture_spec.GDN_PROMPT_LENGTHS (1, 5, 40, 64, 100, 128, 150): within the first 64-token "
    "chunk, exactly one and two chunks, and off the grid in the second and third; ids uniform in [3, vocab).",
    "Qwen3-Next / Qwen3.5 decoder layer: h += mixer(input_layernorm(h)); h += mlp(post_attention_layernorm(h)); "
    "logits = lm_head(norm(h)). input_layernorm, post_attention_layernorm, norm, q_norm and k_norm are "
    "x / rms(x) * (1 + w) (eps rms_norm_eps); the GDN's gated norm is rms-normed o * w * silu(z) per "
    "value head. Gated attention: q_proj rows are per head [query (head_dim) | gate (head_dim)]; "
    "q_norm / k_norm per head, then RoPE on the first head_dim * partial_rotary_factor dims (NeoX "
    "halves), scale head_dim^-0.5, output * sigmoid(gate) before o_proj. Text-only MRoPE (Qwen3.5) has "
    "equal position rows: the same partial RoPE.",
    "Qwen3-Next / Qwen3.5 GDN: Qwen3-Next's in_proj_qkvz rows are grouped per key head [q (dk) | k (dk) | "
    "v (n_v/n_k * dv) | z (n_v/n_k * dv)] and in_proj_ba's [b (n_v/n_k) | a (n_v/n_k)]; Qwen3.5's "
    "in_proj_qkv rows are [q (all key heads) | k | v], in_proj_z / in_proj_b / in_proj_a separate. "
    "conv1d (no bias, silu) over [q | k | v]; q, k l2-normalised per head (q also * dk^-0.5), repeated "
    "from n_k to n_v heads (value head j reads key head j // (n_v / n_k)); beta = sigmoid(b); "
    "g = -exp(A_log) * softplus(a + dt_bias).",
    "Sparse MoE block: router logits = gate.weight x; softmax over all experts; top num_experts_per_tok; "
    "renormalised to sum 1 when norm_topk_prob (Qwen3.5-MoE always); experts SwiGLU (file: "
    "experts.E.{gate,up,down}_proj, transformers' fused gate_up_proj rows [gate | up]); plus "
    "sigmoid(shared_expert_gate x) * shared_expert(x). Dense layers: a SwiGLU mlp.",
]


@torch.no_grad()
def qwen_moe_routing_stats(model, prompts):
    """moe_routing_stats for the Qwen sparse MoE blocks (mlp.gate = the router, softmax top-k): the
    same counts and router-logit margins, and the range of the shared-expert gate sigmoid(w x)."""
    lm = getattr(model.model, "language_model", model.model)
    layers = [(i, layer.mlp) for i, layer in enumerate(lm.layers) if hasattr(layer.mlp, "gate")]
    if not layers:
        return None
    c = getattr(model.config, "text_config", model.config)
    k, n_exp = c.num_experts_per_tok, c.num_experts
    seen = {i: [] for i, _ in layers}
    gates = {i: [] for i, _ in layers}
    handles = []
    for i, moe in layers:
        handles.append(moe.gate.register_forward_hook(
            lambda mod, inp, out, i=i: seen[i].append(out[0].detach().clone())))
        handles.append(moe.shared_expert_gate.register_forward_hook(
            lambda mod, inp, out, i=i: gates[i].append(torch.sigmoid(out).detach().clone())))
    try:
        for prompt in prompts:
            model(torch.from_numpy(prompt.astype(np.int64))[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    per_layer = []
    for i, _ in layers:
        logits = torch.cat(seen[i])
        gate = torch.cat([g.reshape(-1) for g in gates[i]])
        top = torch.topk(logits, min(k + 1, n_exp), dim=-1)
        chosen = top.indices[:, :k]
        per_layer.append({
            "layer": i,
            "tokens": int(logits.shape[0]),
            "tokens_per_expert": torch.bincount(chosen.reshape(-1), minlength=n_exp).tolist(),
            "top1_tokens_per_expert": torch.bincount(chosen[:, 0], minlength=n_exp).tolist(),
            "min_margin_top1_top2": float((top.values[:, 0] - top.values[:, 1]).min()),
            "min_margin_topk_next": float((top.values[:, k - 1] - top.values[:, k]).min()) if k < n_exp else None,
            "router_logit_std": float(logits.std()),
            "shared_expert_gate_min_max": [float(gate.min()), float(gate.max())],
        })
    return {
        "experts_implementation": c._experts_implementation,
        "router": "softmax over experts, top-k (Qwen3NextTopKRouter / Qwen3_5MoeTopKRouter)",
        "num_experts": n_exp,
        "num_experts_per_tok": k,
        "norm_topk_prob": getattr(c, "norm_topk_prob", True),
        "moe_layers": [i for i, _ in layers],
        "over": "one uncached forward of each prompt (every prompt token)",
        "min_margin_top1_top2": min(d["min_margin_top1_top2"] for d in per_layer),
        "min_margin_topk_next": min(d["min_margin_topk_next"] for d in per_layer) if k < n_exp else None,
        "per_layer": per_layer,
    }


NEMOTRON_H_MOE_NOTE = (
    "NemotronH 'E' block (NemotronHMoE): x = norm(h); router logits = gate.weight x (fp32); "
    "scores = sigmoid(logits); choice = scores + gate.e_score_correction_bias; the n_group groups of "
    "consecutive experts are ranked by the sum of their two best choice values and the topk_group best "
    "kept; the num_experts_per_tok experts of largest choice among the kept groups run; their weights are "
    "their scores (not choice values), over the sum of the chosen scores + 1e-20 when norm_topk_prob, "
    "times routed_scaling_factor; expert(x) = down_proj(relu(up_proj(x))^2); "
    "h += sum of weight * expert(x) + shared_experts(x) (same relu2 MLP, moe_shared_expert_intermediate_size).")


def _nemotron_choices(scores_for_choice, n_group, topk_group, k):
    """The chosen experts [tokens, k] of NemotronHTopkRouter for given choice values, with the sorted
    masked choice values [tokens, experts] and the group scores sorted [tokens, n_group]."""
    tokens, experts = scores_for_choice.shape
    groups = scores_for_choice.view(tokens, n_group, experts // n_group)
    group_scores = groups.topk(min(2, experts // n_group), dim=-1)[0].sum(dim=-1)
    kept = torch.topk(group_scores, k=topk_group, dim=-1)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, kept, 1).bool()
    mask = mask[:, :, None].expand(-1, -1, experts // n_group).reshape(tokens, experts)
    masked = scores_for_choice.masked_fill(~mask, float("-inf"))
    ordered = torch.sort(masked, dim=-1, descending=True)
    return ordered.indices[:, :k], ordered.values, torch.sort(group_scores, dim=-1, descending=True).values


@torch.no_grad()
def nemotron_moe_routing_stats(model, prompts):
    """moe_routing_stats for Nemotron-H's 'E' blocks: the same counts, margins of the choice values
    (sigmoid score + correction bias) that decide which experts run, the group margin when groups are
    dropped, and how many tokens the correction bias routes differently."""
    layers = [(i, layer.mixer) for i, layer in enumerate(model.base_model.layers) if layer.block_type == "moe"]
    if not layers:
        return None
    c = model.config
    k, n_exp, n_group, topk_group = c.num_experts_per_tok, c.n_routed_experts, c.n_group, c.topk_group
    seen = {i: [] for i, _ in layers}

    def hook(i, output):
        logits, _, indices = output
        seen[i].append((logits.detach().clone(), indices.detach().clone()))

    handles = [moe.gate.register_forward_hook(lambda mod, inp, out, i=i: hook(i, out)) for i, moe in layers]
    try:
        for prompt in prompts:
            model(torch.from_numpy(prompt.astype(np.int64))[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    per_layer = []
    for i, moe in layers:
        logits = torch.cat([x[0] for x in seen[i]])
        ran = torch.cat([x[1] for x in seen[i]])
        scores = logits.sigmoid()
        bias = moe.gate.e_score_correction_bias.float()
        chosen, values, group_scores = _nemotron_choices(scores + bias, n_group, topk_group, k)
        assert torch.equal(torch.sort(chosen, -1).values, torch.sort(ran, -1).values), "routing recomputed differently"
        unbiased, _, _ = _nemotron_choices(scores, n_group, topk_group, k)
        changed = (torch.sort(chosen, -1).values != torch.sort(unbiased, -1).values).any(-1)
        next_value = values[:, k] if k < values.shape[1] else torch.full_like(values[:, 0], float("-inf"))
        topk_margin = values[:, k - 1] - next_value
        topk_margin = topk_margin[torch.isfinite(topk_margin)]
        per_layer.append({
            "layer": i,
            "tokens": int(logits.shape[0]),
            "tokens_per_expert": torch.bincount(chosen.reshape(-1), minlength=n_exp).tolist(),
            "top1_tokens_per_expert": torch.bincount(chosen[:, 0], minlength=n_exp).tolist(),
            "tokens_routed_otherwise_without_bias": int(changed.sum()),
            "min_margin_top1_top2": float((values[:, 0] - values[:, 1]).min()),
            "min_margin_topk_next": float(topk_margin.min()) if topk_margin.numel() else None,
            "min_margin_group": (float((group_scores[:, topk_group - 1] - group_scores[:, topk_group]).min())
                                 if topk_group < n_group else None),
            "router_logit_std": float(logits.std()),
        })

    def smallest(key):
        values = [d[key] for d in per_layer if d[key] is not None]
        return min(values) if values else None

    return {
        "experts_implementation": model.config._experts_implementation,
        "router": "sigmoid scores + e_score_correction_bias, group-limited top-k (NemotronHTopkRouter)",
        "n_routed_experts": n_exp,
        "num_experts_per_tok": k,
        "n_group": n_group,
        "topk_group": topk_group,
        "norm_topk_prob": c.norm_topk_prob,
        "routed_scaling_factor": c.routed_scaling_factor,
        "over": "one uncached forward of each prompt (every prompt token)",
        "margins_of": "choice values (sigmoid(router logit) + e_score_correction_bias), masked to the kept "
                      "groups; min_margin_group: the topk_group-th minus the next group score",
        "min_margin_top1_top2": smallest("min_margin_top1_top2"),
        "min_margin_topk_next": smallest("min_margin_topk_next"),
        "min_margin_group": smallest("min_margin_group"),
        "per_layer": per_layer,
    }


def falcon_h1_shapes(model):
    """What a Falcon-H1 engine must read from config.json, as transformers resolved it; asserts that
    every mixer's in-memory mup_vector (not in the file) is ssm_multipliers spread over in_proj's
    [z | x | B | C | dt] rows."""
    c = model.config
    mixer = model.model.layers[0].mamba
    d_ssm, gs = mixer.intermediate_size, c.mamba_n_groups * c.mamba_d_state
    rows = [d_ssm, d_ssm, gs, gs, c.mamba_n_heads]
    want = torch.cat([torch.full((n,), float(m)) for n, m in zip(rows, c.ssm_multipliers)])
    for layer in model.model.layers:
        assert torch.equal(layer.mamba.mup_vector.reshape(-1), want), "mup_vector is not ssm_multipliers"
    attn = model.model.layers[0].self_attn
    return {
        "attention_head_dim": attn.head_dim,
        "head_dim_in_config": "head_dim" in c.to_dict(),
        "rope_theta": c.rope_parameters["rope_theta"],
        "rope_dims": int(model.model.rotary_emb.inv_freq.numel() * 2),
        "mamba_d_ssm": d_ssm,
        "mamba_expand_in_config": c.mamba_expand,
        "in_proj_rows_z_x_B_C_dt": rows,
        "mamba_rms_norm": c.mamba_rms_norm,
        "mamba_norm_before_gate": c.mamba_norm_before_gate,
        "gated_norm_group_size": d_ssm // c.mamba_n_groups if c.mamba_rms_norm else None,
        "multipliers": {k: getattr(c, k) for k in gen_model.FALCON_H1_MULTIPLIERS},
    }


ZAMBA2_NOTES = [
    "Zamba2 clamps dt = softplus(dt_raw + dt_bias) to >= config time_step_min (the mixer's "
    "time_step_limit is (time_step_min, inf), whatever config says) in the chunked (prefill) path only; "
    "the one-token decode path (mamba2_selective_state_update) does not clamp. Hence greedy_logits_<i> "
    "differ from greedy_nocache_logits_<i> by up to max_abs_diff_cached_vs_uncached_logits; "
    "zamba2.cached_vs_uncached_without_dt_clamp shows they agree once the clamp is lifted.",
    "Zamba2 model: e = embed_tokens(ids) (no multiplier); h = e. A Mamba2 layer: h = h + "
    "mamba(input_layernorm(h)). A hybrid layer L (use u of the hybrid layers, memory block u % "
    "num_mem_blocks): x = input_layernorm_2H(concat(h, e)) (h first); a = o_proj(attention(x)); "
    "t = down_proj(act(g) * up) with [g | up] = gate_up_proj(pre_ff_layernorm(a)) + adapter_u(pre_ff_layernorm(a)) "
    "(no residual inside the block); t = linear_L(t); then h = h + mamba_decoder.mamba("
    "mamba_decoder.input_layernorm(h + t)): t enters only the mixer's input, not the residual. "
    "logits = final_layernorm(h) @ embed_tokens^T (tied).",
    "Zamba2 shared attention: input width 2*hidden; head_dim = 2*hidden / num_attention_heads; "
    "q = q_proj(x) + q_adapter_u(x), likewise k and v (adapter_u = up(down(x)), LoRA without scale); "
    "scores scaled by (head_dim / 2)^-0.5, not head_dim^-0.5; causal softmax; RoPE (use_mem_rope) on the "
    "full head_dim, NeoX halves, inv_freq = rope_theta^(-2i/head_dim), positions from 0, after the adapters "
    "and before the KV cache; no RoPE when use_mem_rope is false. Each hybrid layer keeps its own KV "
    "cache (keyed by its layer index), though layers of one block share the weights.",
    "Zamba2 Mamba2 mixer: in_proj rows [z (inner) | x (inner) | B | C | dt (heads)], inner = mamba_expand * "
    "hidden; conv1d + silu over x,B,C; y = SSD + D*x; out = out_proj(norm(y * silu(z))): the gated RMSNorm "
    "gates first, then normalises over mamba_ngroups groups of inner/groups with eps 1e-5 (fixed, not "
    "rms_norm_eps). Every other RMSNorm uses rms_norm_eps. MLP act: hidden_act (gelu = exact erf GELU).",
]


@torch.no_grad()
def zamba2_shapes(model, prompts, file_names):
    """What a Zamba2 engine must read from config.json, as transformers resolved it, and how much the
    outputs depend on the shared blocks and their adapters: the largest logit change over the longest
    prompt (one uncached forward) when a part is zeroed. Also the cached decode against uncached forwards
    with every mixer's dt clamp lifted (time_step_limit (0, inf)), which isolates the clamp."""
    c = model.config
    hybrid = model.model.layers[c.hybrid_layer_ids[0]]
    attn = hybrid.shared_transformer.self_attn
    mixer = next(m for m in model.modules() if hasattr(m, "dt_bias"))
    ids = torch.from_numpy(prompts[-1].astype(np.int64))[None]
    base = model(ids, use_cache=False).logits[0]
    params = dict(model.named_parameters(remove_duplicate=False))

    def change(pred):
        saved = {n: p.clone() for n, p in params.items() if pred(n)}
        assert saved, "nothing to zero"
        for n in saved:
            params[n].zero_()
        diff = float((model(ids, use_cache=False).logits[0] - base).abs().max())
        for n, v in saved.items():
            params[n].copy_(v)
        return diff

    def adapter(n, kinds, use=None):
        m = re.search(r"\.(linear_[qkv]_adapter_list|gate_up_proj_adapter_list)\.(\d+)\.1\.weight$", n)
        return bool(m) and m.group(1) in kinds and (use is None or int(m.group(2)) == use)

    attn_kinds = ("linear_q_adapter_list", "linear_k_adapter_list", "linear_v_adapter_list")
    mlp_kinds = ("gate_up_proj_adapter_list",)
    ablation = {
        # None: use_shared_attention_adapter is false, there are none.
        "attention_adapters_zeroed": change(lambda n: adapter(n, attn_kinds)) if c.use_shared_attention_adapter
        else None,
        "mlp_adapters_zeroed": change(lambda n: adapter(n, mlp_kinds)),
        "all_adapters_zeroed": change(lambda n: adapter(n, attn_kinds + mlp_kinds)),
        "shared_block_output_zeroed": change(lambda n: n.endswith(".linear.weight")),
    }
    for u in range(len(c.hybrid_layer_ids)):
        ablation[f"adapters_of_use_{u}_zeroed"] = change(lambda n, u=u: adapter(n, attn_kinds + mlp_kinds, u))
    assert float((model(ids, use_cache=False).logits[0] - base).abs().max()) == 0.0, "ablation not undone"

    mixers = [m for m in model.modules() if hasattr(m, "dt_bias")]
    limits = [m.time_step_limit for m in mixers]
    for m in mixers:
        m.time_step_limit = (0.0, float("inf"))
    unclamped = 0.0
    try:
        for prompt in prompts:
            p = torch.from_numpy(prompt.astype(np.int64))[None]
            out = model.generate(p, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0, use_cache=True,
                                 eos_token_id=None, pad_token_id=c.pad_token_id, output_logits=True,
                                 return_dict_in_generate=True)
            cached = torch.stack([x[0] for x in out.logits])
            full = model(out.sequences[:, :-1], use_cache=False).logits[0, p.shape[1] - 1:]
            unclamped = max(unclamped, float((cached - full).abs().max()))
    finally:
        for m, lim in zip(mixers, limits):
            m.time_step_limit = lim
    uses = gen_model.zamba2_shared_block_uses(c.to_dict())
    first = {}
    for layer, _, b in uses:
        first.setdefault(b, layer)
    copies = sorted({layer for layer, _, b in uses if layer != first[b] and any(
        n.startswith(f"model.layers.{layer}.shared_transformer.") for n in file_names)})
    # Later uses that run a block of their own (not tied to the first use's parameters).
    norm = "model.layers.{}.shared_transformer.pre_ff_layernorm.weight"
    untied = [layer for layer, _, b in uses if params[norm.format(layer)] is not params[norm.format(first[b])]]
    return {
        "hybrid_layers": [{"layer": layer, "use": u, "block": b, "weights_in_file_under":
                           f"model.layers.{layer if layer in untied else first[b]}.shared_transformer.",
                           "adapter_index": u, "linear": f"model.layers.{layer}.linear.weight"}
                          for layer, u, b in uses],
        # Later uses whose layer holds a copy of its block (gen_model.py's per_use_copies, or its own
        # block: untied_blocks).
        **({"shared_block_copied_under_layers": copies} if copies and not untied else {}),
        **({"shared_block_untied_layers": untied} if untied else {}),
        "use_shared_attention_adapter": c.use_shared_attention_adapter,
        "num_mem_blocks": c.num_mem_blocks,
        "attention_hidden_size": attn.attention_hidden_size,
        "attention_head_dim": attn.head_dim,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "attention_scaling": attn.scaling,
        "use_mem_rope": c.use_mem_rope,
        "rope_theta": c.rope_parameters["rope_theta"] if c.use_mem_rope else None,
        "rope_dims": int(model.model.rotary_emb.inv_freq.numel() * 2) if c.use_mem_rope else None,
        "adapter_rank": c.adapter_rank,
        "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps,
        "mamba_gated_norm_eps": mixer.norm.variance_epsilon,
        "mamba_gated_norm_group_size": mixer.norm.group_size,
        "mamba_inner": mixer.intermediate_size,
        "mamba_dt_min_prefill": mixer.time_step_limit[0],
        "mamba_dt_max_prefill": None if math.isinf(mixer.time_step_limit[1]) else mixer.time_step_limit[1],
        "mamba_dt_clamped_in_decode": False,
        "ablation_max_abs_logit_change": ablation,
        "ablation_over": f"one uncached forward of prompt {len(prompts) - 1} ({prompts[-1].size} tokens)",
        "cached_vs_uncached_without_dt_clamp": unclamped,
    }
