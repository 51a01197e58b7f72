#!/usr/bin/env python3
"""Golden reference outputs of Hugging Face transformers for the engine's parity tests.

Usage:
    pip install -r tools/requirements.txt
    python3 tools/make_golden.py [--out tests/fixtures/golden] [--only NAME ...]

For each fixture model (see MODELS) this script
  1. generates the model with tools/gen_model.py (its arch, preset and seed in
     tools/fixture_spec.py MODELS) into a temporary folder,
  2. loads it with transformers' from_pretrained (fp32, CPU, eager attention, torch path),
     asserting no missing / unexpected / mismatched keys and that every loaded parameter
     equals the generated tensor bit for bit (so gen_model.py writes a real, loadable format),
  3. saves it with save_pretrained into <out>/<model_name>/ (config.json, model.safetensors;
     transformers' own serialisation, e.g. `layers_block_type` and {"__float__": "Infinity"}),
  4. records, for a fixed set of prompts, into <out>/<model_name>/golden.safetensors:
       prompt_<i>         int32   [len]            prompt token ids
       logits_<i>         float32 [len, vocab]     full-prompt logits, one uncached forward
       greedy_<i>         int32   [n]              generate(do_sample=False): prefill + cached decode
       greedy_logits_<i>  float32 [n, vocab]       logits generate() chose each greedy token from
                                                   (row 0: prefill's last position; row k: decode step k)
       greedy_nocache_<i> int32   [n]              argmax of an uncached forward over prompt+greedy[:k]
       greedy_nocache_logits_<i> float32 [n, vocab] the last-position logits of those forwards
     and <out>/<model_name>/golden.json (versions, seed, prompt lengths, max |logit|, top-1/top-2
     margins per prompt and their minimum over all prompts, whether cached and uncached greedy
     agree, notes; for a MoE model the routing under "moe").

bamba_tiny, bamba_tiny2 (BambaForCausalLM) and granite_moe_tiny, granite_dense_tiny,
granite_nope_tiny (GraniteMoeHybridForCausalLM; the last says position_embedding_type "nope")
and falcon_h1_tiny, falcon_h1_tiny2, falcon_h1_tiny3, falcon_h1_out_bias_tiny, falcon_h1_in_bias_tiny
(FalconH1ForCausalLM; golden.json "falcon_h1" gives the head_dim, RoPE, mixer width, in_proj
segments, gated-norm groups and multipliers transformers ran, after asserting its mup_vector)
are checked and recorded the same way. The GraniteMoeHybrid
MoE block runs with experts_implementation="eager" (transformers' per-expert loop; its
default is grouped_mm), asserted after loading; golden.json "moe" names it and gives, per MoE
layer over one uncached forward of each prompt, the tokens routed to each expert (every top-k
slot), the tokens whose top-1 is each expert, and the smallest top-1/top-2 and
top-k/top-(k+1) router-logit margins (the latter decides which experts run).
nemotron_h_moe_tiny, nemotron_h_moe_tiny2 and nemotron_h_latent_moe_tiny (the last with
moe_latent_size: fc1_latent_proj / fc2_latent_proj around 12-wide experts) (NemotronHForCausalLM
with 'E' blocks) load the
same way (the file's per-expert tensors are rows of transformers' merged experts.up_proj /
experts.down_proj, checked row by row) and run the eager experts too; their "moe" section counts
the same, gives the margins of the choice values (sigmoid score + e_score_correction_bias) that
pick the experts, the group margin where groups are dropped, and per layer how many tokens the
correction bias routes otherwise than the bare scores would.

zamba2_tiny and zamba2_tiny2 (Zamba2ForCausalLM) load the same way; the shared transformer blocks
of the hybrid layers that reuse a memory block are not in the file and are asserted to be the very
parameters of the block's first hybrid layer. zamba2_per_use_tiny's file holds them under every
hybrid layer that uses the block (gen_model.py's per_use_copies, equal values; its model.safetensors
is gen_model.py's file, since save_pretrained drops tied copies): transformers ties them on load
(both present and equal), asserted the same way. zamba2_untied_tiny's config does not tie
(tie_word_embeddings false): each hybrid layer's block is its own draw (untied_blocks), save_pretrained
writes them all, and transformers loads each into that layer's own parameters (asserted: none is
another layer's), which the layer runs. golden.json "zamba2" gives the hybrid layers' uses,
blocks and adapter indices, the attention shapes, scale and RoPE, the norms' eps, the dt clamp, the
logit change when the adapters (all, per kind, per use) or the shared blocks' output are zeroed, and
the cached decode against uncached forwards with the prefill's dt clamp lifted.

qwen3_next_tiny, qwen3_next_sparse_tiny (Qwen3NextForCausalLM), qwen3_5_tiny (Qwen3_5ForCausalLM,
qwen3_5_text) and qwen3_5_moe_tiny (Qwen3_5MoeForConditionalGeneration, loaded with
AutoModelForImageTextToText, vision tower included) are Gated DeltaNet hybrids: the file's per-expert
tensors are rows of transformers' fused experts.gate_up_proj / down_proj (checked row by row), the
torch Gated DeltaNet functions are asserted to be the ones that can run (no fla / causal_conv1d /
kernels), prompts are fixture_spec.GDN_PROMPT_LENGTHS (across the chunk of 64), "moe" gives the
softmax router's counts and margins and the shared-expert gate's range, and golden.json names the
layer_types. qwen3_5_tiny's config.json is gen_model.py's (full_attention_interval, no layer_types),
asserted equal to save_pretrained's otherwise.

`default` records the same references for the embedded model as it is (models/default, trained
by tools/train_default_model.py; not generated, not copied): only golden.safetensors and
golden.json are written, to <out>/default/. Its prompts are English text in bytes (DEFAULT_TEXT,
the first prompt a lone <bos>), with lengths around its chunk size 64, and golden.json names the
sha256 of the model.safetensors they were computed from. Retraining the model means rerunning
`python3 tools/make_golden.py --only default`.

nemotron_h_tied_tiny is a Nemotron-H whose config.json says tie_word_embeddings=true while its
model.safetensors carries its own lm_head.weight (different from the embeddings): the shape
transformers 5 gives every such model. NemotronHForCausalLM declares no tied weights
(`_tied_weights_keys = {}`), so neither its constructor nor from_pretrained ties the head, and
save_pretrained (which drops only tensors that share storage) writes lm_head.weight. The logits
are computed with that stored head; golden.json records how far they are from the logits the
embeddings would give.

Deterministic: the models are pure functions of (preset, seed); prompts come from a fixed
numpy PCG64 stream; torch runs single-threaded.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import safetensors
import torch
import transformers
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model  # noqa: E402
import scale_config  # noqa: E402
from golden_notes import (  # noqa: E402
    BAMBA_NOTES, COMMON_NOTES, FALCON_H1_NOTES, GRANITE_NOTES, MAMBA2_DT_NOTE, NEMOTRON_H_DT_NOTE,
    NEMOTRON_H_MOE_NOTE, QWEN_NOTES, ZAMBA2_NOTES, falcon_h1_shapes, moe_routing_stats, nemotron_moe_routing_stats,
    qwen_moe_routing_stats, zamba2_shapes)
from fixture_spec import (  # noqa: E402
    DEFAULT_PROMPT_LENGTHS, DEFAULT_TEXT, EXISTING_MODELS, GDN_ARCHS, KEEP_CONFIG, MODELS, NEW_TOKENS, PROMPT_SEED,
    PUBLIC_CONFIGS, PUBLIC_MODELS, default_prompts, make_prompts, prompt_lengths)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# How transformers renames a file's tensor on load, per model_type: (regex, replacement) in order.
# NemotronHForCausalLM keeps the body under "model." in memory (files say "backbone."); Mamba2
# and Bamba keep the file's names; GraniteMoeHybrid loads the MoE block's file tensors
# (input_linear / output_linear / router.layer) into experts.gate_up_proj / experts.down_proj /
# router.weight (transformers' conversion_mapping "granitemoe"), values unchanged.
FILE_TO_MEMORY = {
    "nemotron_h": [(r"^backbone\.", "model.")],
    "granitemoehybrid": [
        (r"\.block_sparse_moe\.input_linear\.weight$", ".block_sparse_moe.experts.gate_up_proj"),
        (r"\.block_sparse_moe\.output_linear\.weight$", ".block_sparse_moe.experts.down_proj"),
        (r"\.block_sparse_moe\.router\.layer\.weight$", ".block_sparse_moe.router.weight"),
    ],
}
# The MoE references run transformers' per-expert loop ("eager"), not its default grouped_mm.
EXPERTS_IMPLEMENTATION = "eager"


# Nemotron-H's per-expert file tensors (mixer.experts.E.{up,down}_proj.weight) are rows E of one
# in-memory tensor per block (mixer.experts.{up,down}_proj [experts, out, in]; transformers'
# conversion_mapping "nemotron_h", MergeModulelist), values unchanged.
NEMOTRON_EXPERT = re.compile(r"^(.*\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")
# Qwen3-Next / Qwen3.5-MoE per-expert file tensors (mlp.experts.E.{gate,up,down}_proj.weight): expert E of
# mlp.experts.gate_up_proj [experts, 2 * inter, hidden] (gate rows, then up rows) and mlp.experts.down_proj
# (transformers' conversion_mapping, MergeModulelist + Concatenate), values unchanged.
QWEN_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _in_memory_name(model_type, name):
    for pattern, replacement in FILE_TO_MEMORY.get(model_type, []):
        name = re.sub(pattern, replacement, name)
    return name


def _in_memory_tensor(state, model_type, name):
    """The loaded value of the file's tensor `name`: (in-memory name, tensor)."""
    memory_name = _in_memory_name(model_type, name)
    expert = NEMOTRON_EXPERT.match(memory_name) if model_type == "nemotron_h" else None
    if expert:
        merged = f"{expert.group(1)}.{expert.group(3)}"
        return merged, state[merged][int(expert.group(2))]
    expert = QWEN_EXPERT.match(memory_name) if model_type in GDN_ARCHS else None
    if expert:
        e, proj = int(expert.group(2)), expert.group(3)
        if proj == "down_proj":
            return f"{expert.group(1)}.down_proj", state[f"{expert.group(1)}.down_proj"][e]
        merged = f"{expert.group(1)}.gate_up_proj"
        rows = state[merged].shape[1] // 2
        return merged, state[merged][e][:rows] if proj == "gate_proj" else state[merged][e][rows:]
    return memory_name, state[memory_name]


def text_config(config):
    """The language model's config: text_config of an image-text config, else the config itself."""
    return getattr(config, "text_config", None) or config


def assert_torch_gated_delta_path():
    """No package that transformers would prefer to its torch Gated DeltaNet / causal-conv functions is
    importable: flash-linear-attention (fla), causal_conv1d, the kernels hub."""
    for package in ("fla", "causal_conv1d", "kernels"):
        assert importlib.util.find_spec(package) is None, f"{package} is installed: not the torch path"


def load_checked(model_dir, expected):
    """from_pretrained, asserting a clean load and bitwise-equal parameters."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    model_type = config["model_type"]
    has_experts = (model_type == "granitemoehybrid" or "moe" in config.get("layers_block_type", []) or
                   config.get("text_config", config).get("num_experts", 0) > 0)
    extra = {"experts_implementation": EXPERTS_IMPLEMENTATION} if has_experts else {}
    if model_type in GDN_ARCHS:
        assert_torch_gated_delta_path()
    # An image-text checkpoint (vision_config) loads whole, vision tower included.
    auto = transformers.AutoModelForImageTextToText if "vision_config" in config else transformers.AutoModelForCausalLM
    model, info = auto.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, **extra)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), f"{model_dir}: {kind} = {info[kind]}"
    if extra:
        implementation = text_config(model.config)._experts_implementation
        assert implementation == EXPERTS_IMPLEMENTATION, implementation
    state = model.state_dict()
    memory_names = set()
    for name, arr in expected.items():
        memory_name, got = _in_memory_tensor(state, model_type, name)
        memory_names.add(memory_name)
        assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(arr)), f"{name} differs after load"
    if model_type == "zamba2":
        memory_names |= _zamba2_tied_copies(model, expected)
    assert len(state) == len(memory_names) + (1 if "lm_head.weight" not in expected else 0), \
        f"{model_dir}: {len(state)} parameters in memory, {len(memory_names)} loaded from the file"
    # A stored head was loaded as stored (checked above), even when the config ties; a tied
    # model without one uses its embeddings.
    if "lm_head.weight" not in expected:
        assert text_config(model.config).tie_word_embeddings
        assert head_is_embeddings(model)
    model.eval()
    return model


ZAMBA2_SHARED = re.compile(r"^model\.layers\.(\d+)\.shared_transformer\.(.*)$")


def _zamba2_tied_copies(model, expected):
    """The in-memory names of Zamba2's shared transformer blocks in the hybrid layers that reuse a
    memory block (in the file only when written per use, then equal to the first use's): asserts
    that each is the very parameter of the block's first hybrid layer, which the file holds.
    Returns those names. Untied (tie_word_embeddings false): asserts instead that each is a parameter
    of its own, loaded from the file's tensor of its own name (checked by the caller); returns none."""
    c = model.config
    tied = c.tie_word_embeddings
    first = {}
    for u, layer in enumerate(c.hybrid_layer_ids):
        first.setdefault(u % c.num_mem_blocks, layer)
    params = dict(model.named_parameters(remove_duplicate=False))
    copies = set()
    for u, layer in enumerate(c.hybrid_layer_ids):
        source = first[u % c.num_mem_blocks]
        for name, p in params.items():
            m = ZAMBA2_SHARED.match(name)
            if not m or int(m.group(1)) != layer:
                continue
            source_name = f"model.layers.{source}.shared_transformer.{m.group(2)}"
            assert source_name in expected, f"{name}: its block's first layer {source} has no {source_name} in the file"
            if layer != source and tied:
                assert p is params[source_name], f"{name} is not tied to {source_name}"
                copies.add(name)
            elif layer != source:
                assert p is not params[source_name] and name in expected, f"{name}: not its own, from the file"
    return copies


def head_is_embeddings(model):
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


@torch.no_grad()
def logits_with_embeddings_as_head(model, prompt):
    """Last hidden state (after norm_f) times the embeddings: the logits a tied head would give."""
    ids = torch.from_numpy(prompt.astype(np.int64))[None]
    hidden = model.base_model(ids, use_cache=False).last_hidden_state[0]
    return (hidden @ model.get_input_embeddings().weight.T).float()


@torch.no_grad()
def dt_clamped_fraction(model, prompts):
    """Fraction of (layer, position, head) over the prompts where softplus(dt_raw + dt_bias)
    lies below the mixer's time_step_limit[0], i.e. where the chunked path's clamp acts."""
    counts = [0, 0]

    def hook(mixer, _inputs, output):
        dt_raw = output[..., -mixer.num_heads:]
        if hasattr(mixer, "mup_vector"):  # Falcon-H1 scales in_proj's output segments after the projection
            dt_raw = dt_raw * mixer.mup_vector[..., -mixer.num_heads:]
        dt = torch.nn.functional.softplus(dt_raw + mixer.dt_bias)
        counts[0] += int((dt < mixer.time_step_limit[0]).sum())
        counts[1] += dt.numel()

    mixers = [m for m in model.modules() if hasattr(m, "dt_bias") and hasattr(m, "in_proj")]
    assert mixers, "no Mamba2 mixer"
    handles = [m.in_proj.register_forward_hook(lambda mod, i, o, m=m: hook(m, i, o)) for m in mixers]
    try:
        for prompt in prompts:
            model(torch.from_numpy(prompt.astype(np.int64))[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return counts[0] / max(counts[1], 1)


# transformers' torch_chunk_gated_delta_rule's chunk length (its default; the models pass none).
GDN_CHUNK_SIZE = 64


def chunk_size(config):
    """The SSD chunk length: chunk_size (Nemotron-H, Mamba2) or mamba_chunk_size (Bamba, Granite); the
    Gated DeltaNet chunk for Qwen3-Next / Qwen3.5."""
    if config.model_type in GDN_ARCHS:
        return GDN_CHUNK_SIZE
    return config.chunk_size if hasattr(config, "chunk_size") else config.mamba_chunk_size


def margin(row):
    """top-1 minus top-2 logit of a 1-D tensor."""
    top = torch.topk(row, 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def run_prompt(model, prompt):
    """Returns (logits [len,vocab], greedy [n], greedy_logits [n,vocab], greedy_nocache [n],
    greedy_nocache_logits [n,vocab], stats)."""
    ids = torch.from_numpy(prompt.astype(np.int64))[None]
    logits = model(ids, use_cache=False).logits[0].float()

    out = model.generate(
        ids, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0, use_cache=True,
        eos_token_id=None, pad_token_id=text_config(model.config).pad_token_id,
        output_logits=True, return_dict_in_generate=True)
    greedy = out.sequences[0, ids.shape[1]:]
    assert greedy.numel() == NEW_TOKENS, "generate stopped early"
    greedy_logits = torch.stack([s[0].float() for s in out.logits])
    assert torch.equal(greedy_logits.argmax(-1), greedy)

    # Uncached recomputation: step k sees prompt + greedy[:k], all in one chunked forward.
    nocache, nocache_logits, step_diff = [], [], []
    for k in range(NEW_TOKENS):
        seq = torch.cat([ids[0], greedy[:k]])[None]
        last = model(seq, use_cache=False).logits[0, -1].float()
        nocache.append(int(last.argmax()))
        nocache_logits.append(last)
        step_diff.append(float((last - greedy_logits[k]).abs().max()))
    nocache = torch.tensor(nocache)
    nocache_logits = torch.stack(nocache_logits)
    stats = {
        "len": int(prompt.size),
        "greedy_matches_nocache": bool(torch.equal(nocache, greedy)),
        "first_mismatch_step": next((k for k in range(NEW_TOKENS) if nocache[k] != greedy[k]), None),
        "min_margin_prompt_logits": min(margin(r) for r in logits),
        "min_margin_greedy": min(margin(r) for r in greedy_logits),
        "min_margin_nocache": min(margin(r) for r in nocache_logits),
        "max_abs_diff_cached_vs_uncached_logits": max(step_diff),
        "prefill_last_vs_full_forward_max_abs_diff": float((greedy_logits[0] - logits[-1]).abs().max()),
    }
    return logits, greedy, greedy_logits, nocache, nocache_logits, stats


def record_prompts(model, prompts, dest):
    """Runs every prompt, writes dest/golden.safetensors; returns (per-prompt stats, max |logit|, tensors)."""
    vocab = text_config(model.config).vocab_size
    tensors, per_prompt = {}, []
    max_abs = 0.0
    for i, prompt in enumerate(prompts):
        logits, greedy, greedy_logits, nocache, nocache_logits, stats = run_prompt(model, prompt)
        assert logits.shape == (prompt.size, vocab)
        tensors[f"prompt_{i}"] = prompt.astype(np.int32)
        tensors[f"logits_{i}"] = logits.numpy().astype(np.float32)
        tensors[f"greedy_{i}"] = greedy.numpy().astype(np.int32)
        tensors[f"greedy_logits_{i}"] = greedy_logits.numpy().astype(np.float32)
        tensors[f"greedy_nocache_{i}"] = nocache.numpy().astype(np.int32)
        tensors[f"greedy_nocache_logits_{i}"] = nocache_logits.numpy().astype(np.float32)
        max_abs = max(max_abs, float(logits.abs().max()), float(greedy_logits.abs().max()))
        per_prompt.append(stats)
    save_file(tensors, os.path.join(dest, "golden.safetensors"), metadata={"format": "np"})
    return per_prompt, max_abs, tensors


def make_fixture(name, arch, preset, seed, overrides, out_root):
    cfg, weights = gen_model.build(arch, preset, seed, "fp32")
    if overrides:
        cfg.update(overrides)
        cfg["hybridserve_generator"]["config_overrides"] = dict(overrides)
    generator = {"tool": "tools/gen_model.py", "preset": preset, "seed": seed, "dtype": "fp32"}
    return record_fixture(name, arch, cfg, weights, generator, out_root, keep_config=name in KEEP_CONFIG)


def make_public_fixture(name, source, seed, out_root):
    """A model scaled down from the published config `source` (tools/scale_config.py). Its
    config.json is the scaled publisher's file, written over save_pretrained's, and the references
    are computed from a load of that file."""
    cfg, weights = scale_config.build(os.path.join(REPO_ROOT, PUBLIC_CONFIGS, source), seed)
    generator = {"tool": "tools/scale_config.py", "source": source, "seed": seed, "dtype": "fp32"}
    return record_fixture(name, cfg["model_type"], cfg, weights, generator, out_root, keep_config=True)


def record_fixture(name, arch, cfg, weights, generator, out_root, keep_config=False):
    dest = os.path.join(out_root, name)
    with tempfile.TemporaryDirectory() as tmp:
        gen_model.write_model(tmp, cfg, weights, "fp32")
        model = load_checked(tmp, weights)
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    model.save_pretrained(dest)
    gen_cfg = os.path.join(dest, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)  # not used by the engine
    preset = gen_model.PRESETS.get((arch, generator.get("preset")), {})  # none for a public model
    if preset.get("init", {}).get("per_use_copies"):
        # save_pretrained drops the tied copies; the fixture is the file written per use, as
        # save_pretrained writes a Zamba2 whose blocks are not tied (loaded and tied again below).
        copies = sorted(set(weights) - set(load_file(os.path.join(dest, "model.safetensors"))))
        assert copies and all(ZAMBA2_SHARED.match(k) for k in copies), copies
        gen_model.write_safetensors(os.path.join(dest, "model.safetensors"), weights, "fp32",
                                    metadata={"format": "pt"})
    saved = load_file(os.path.join(dest, "model.safetensors"))
    assert sorted(saved) == sorted(weights), "save_pretrained wrote other tensor names than gen_model.py"
    for k, v in weights.items():
        assert np.array_equal(saved[k], v), f"{k}: save_pretrained changed the values"
    if keep_config and arch in GDN_ARCHS:
        # Written over save_pretrained's, which differs only in stating the pattern it derived.
        with open(os.path.join(dest, "config.json")) as f:
            written = json.load(f)
        written.pop("transformers_version")
        assert "layer_types" in written and "full_attention_interval" in cfg, "nothing to keep"
        written.pop("layer_types")
        ours = {k: v for k, v in cfg.items() if k != "full_attention_interval"}
        assert written == ours, f"save_pretrained's config.json differs: {sorted(set(written) ^ set(ours))}"
    if keep_config:
        with open(os.path.join(dest, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
    model = load_checked(dest, weights)  # the committed files load cleanly too

    c = text_config(model.config)
    vocab = c.vocab_size
    prompts = make_prompts(vocab, PROMPT_SEED, arch)
    # A tied config that stores its own head: how far the logits are from the embeddings' ones.
    own_head = c.tie_word_embeddings and "lm_head.weight" in weights
    if own_head:
        assert not head_is_embeddings(model)
        assert not torch.equal(torch.from_numpy(weights["lm_head.weight"]), model.get_input_embeddings().weight)
    diff_if_tied = 0.0
    if own_head:
        for prompt in prompts:
            with torch.no_grad():
                ids = torch.from_numpy(prompt.astype(np.int64))[None]
                logits = model(ids, use_cache=False).logits[0].float()
            diff_if_tied = max(diff_if_tied,
                               float((logits - logits_with_embeddings_as_head(model, prompt)).abs().max()))
    per_prompt, max_abs, _ = record_prompts(model, prompts, dest)

    gdn = arch in GDN_ARCHS
    # The common notes describe the Mamba2 scan; a Gated DeltaNet fixture has its own.
    notes = list(COMMON_NOTES) if not gdn else [COMMON_NOTES[0].replace(
        "(no mamba_ssm / causal_conv1d kernels)", "(no flash-linear-attention / causal_conv1d / kernels)")]
    notes += {"nemotron_h": [NEMOTRON_H_DT_NOTE], "mamba2": [MAMBA2_DT_NOTE], "bamba": BAMBA_NOTES,
              "granitemoehybrid": GRANITE_NOTES, "falcon_h1": FALCON_H1_NOTES,
              "zamba2": ZAMBA2_NOTES, **{a: QWEN_NOTES for a in GDN_ARCHS}}[arch]
    if gdn:
        notes += [
            "logits_<i>: one forward over the whole prompt with use_cache=False (chunked gated delta rule).",
            "greedy_<i>: generate(do_sample=False, use_cache=True): the prompt is prefilled with the chunked rule, "
            "then one token at a time with the recurrent rule and causal_conv1d_update.",
            COMMON_NOTES[3]]
    if "vision_config" in model.config.to_dict():
        notes.append(
            f"{type(model).__name__} (image-text form): the file holds the language model under "
            "model.language_model.* and the vision tower under model.visual.* (loaded, unused: the references "
            "are the text path, input_ids only; an engine must ignore model.visual.*); lm_head.weight at the top.")
    if keep_config and gdn:
        notes.append("config.json is tools/gen_model.py's: save_pretrained's less the layer_types it derives, with "
                     "full_attention_interval instead (asserted: no other difference); model.safetensors is "
                     "save_pretrained's.")
    moe = (nemotron_moe_routing_stats if arch == "nemotron_h" else
           qwen_moe_routing_stats if gdn else moe_routing_stats)(model, prompts)
    if arch == "nemotron_h" and moe is not None:
        notes.append(NEMOTRON_H_MOE_NOTE)
    if moe is not None:
        notes.append("moe: routing over the prompts per MoE layer; the MoE blocks ran transformers' "
                     f"experts_implementation={moe['experts_implementation']!r} (the per-expert loop).")
    if arch == "zamba2" and not c.tie_word_embeddings:
        notes.append(
            "Zamba2 with tie_word_embeddings=false: transformers ties nothing (_tied_weights_keys is "
            "empty), so every hybrid layer runs the shared_transformer.* stored under its own index "
            "(asserted: no parameter shared between layers, each equal to its file tensor), with its own "
            "module's adapter_list.{u}, u its use; the adapters of the block's other uses that its module "
            "also holds are in the file and unused. The head is lm_head.weight, not the embeddings.")
    if c.tie_word_embeddings and not own_head:
        assert head_is_embeddings(model)
        notes.append("tie_word_embeddings: model.safetensors has no lm_head.weight (save_pretrained drops "
                     "it); the head is the embedding matrix.")
    if own_head:
        notes.append(
            "config.json says tie_word_embeddings=true, yet model.safetensors stores lm_head.weight "
            "(as save_pretrained wrote it) and it differs from backbone.embeddings.weight. transformers "
            f"does not tie it ({type(model).__name__}._tied_weights_keys = {type(model)._tied_weights_keys}): "
            "every logit here is computed with the stored lm_head.weight. "
            "max_abs_diff_logits_with_embeddings_as_head is how far logits_<i> are from those the "
            "embeddings would give.")
    golden = {
        "model": name,
        "arch": arch,
        "architecture": (model.config.architectures[0] if model.config.architectures else type(model).__name__),
        "generator": generator,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
        "prompt_seed": PROMPT_SEED,
        "num_prompts": len(prompts),
        "prompt_lengths": prompt_lengths(arch),
        "new_tokens": NEW_TOKENS,
        "vocab_size": vocab,
        "chunk_size": chunk_size(model.config),
        "max_abs_logit": max_abs,
        "min_margin_prompt_logits_all": min(s["min_margin_prompt_logits"] for s in per_prompt),
        "min_margin_greedy_all": min(s["min_margin_greedy"] for s in per_prompt),
        "min_margin_nocache_all": min(s["min_margin_nocache"] for s in per_prompt),
        "max_abs_diff_cached_vs_uncached_logits": max(
            s["max_abs_diff_cached_vs_uncached_logits"] for s in per_prompt),
        **({"dt_clamped_in_prefill_fraction": dt_clamped_fraction(model, prompts)} if not gdn else {}),
        **({"gated_deltanet_path": "torch (transformers' torch_chunk_gated_delta_rule, "
                                   "torch_recurrent_gated_delta_rule, torch causal conv; fla, causal_conv1d, "
                                   "kernels not installed)",
            "layer_types": list(c.layer_types)} if gdn else {}),
        "greedy_matches_nocache_all": all(s["greedy_matches_nocache"] for s in per_prompt),
        **({"tie_word_embeddings": True, "lm_head_is_embeddings": False,
            "max_abs_diff_logits_with_embeddings_as_head": diff_if_tied} if own_head else {}),
        **({"tie_word_embeddings": True, "lm_head_is_embeddings": True}
           if c.tie_word_embeddings and not own_head else {}),
        **({"moe": moe} if moe is not None else {}),
        **({"falcon_h1": falcon_h1_shapes(model)} if arch == "falcon_h1" else {}),
        **({"zamba2": zamba2_shapes(model, prompts, weights)} if arch == "zamba2" else {}),
        "per_prompt": per_prompt,
        "notes": notes,
    }
    with open(os.path.join(dest, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2, sort_keys=False)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(dest, f)) for f in os.listdir(dest))
    print(f"{name}: {size:,} bytes, max|logit| {max_abs:.4f}, "
          f"cached==uncached greedy: {[s['greedy_matches_nocache'] for s in per_prompt]}")
    return golden


def make_existing_golden(name, model_dir, out_root):
    """Golden references of the model in `model_dir` as it is; writes only golden.* to <out>/<name>/."""
    path = os.path.join(model_dir, "model.safetensors")
    weights = load_file(path)
    model = load_checked(model_dir, weights)
    c = model.config
    bos = c.bos_token_id
    prompts = default_prompts(bos)
    dest = os.path.join(out_root, name)
    os.makedirs(dest, exist_ok=True)
    per_prompt, max_abs, tensors = record_prompts(model, prompts, dest)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    golden = {
        "model": name,
        "model_dir": os.path.relpath(os.path.abspath(model_dir), REPO_ROOT),
        "model_safetensors_sha256": digest,
        "architecture": c.architectures[0],
        "generator": getattr(c, "hybridserve_generator", None),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
        "prompt_text": DEFAULT_TEXT,
        "prompt_note": "prompt_<i> is <bos> followed by the first len - 1 bytes of prompt_text",
        "num_prompts": len(prompts),
        "prompt_lengths": DEFAULT_PROMPT_LENGTHS,
        "new_tokens": NEW_TOKENS,
        "vocab_size": c.vocab_size,
        "chunk_size": chunk_size(c),
        "max_abs_logit": max_abs,
        "max_abs_diff_cached_vs_uncached_logits": max(
            s["max_abs_diff_cached_vs_uncached_logits"] for s in per_prompt),
        "dt_clamped_in_prefill_fraction": dt_clamped_fraction(model, prompts),
        "greedy_matches_nocache_all": all(s["greedy_matches_nocache"] for s in per_prompt),
        "greedy_text": [bytes(int(t) for t in tensors[f"greedy_{i}"] if t < 256).decode("utf-8", "backslashreplace")
                        for i in range(len(prompts))],
        "per_prompt": per_prompt,
        "notes": COMMON_NOTES + [NEMOTRON_H_DT_NOTE],
    }
    with open(os.path.join(dest, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2, sort_keys=False)
        f.write("\n")
    print(f"{name}: from {model_dir}, max|logit| {max_abs:.4f}, "
          f"cached==uncached greedy: {[s['greedy_matches_nocache'] for s in per_prompt]}")
    return golden


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "golden"))
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS) + sorted(PUBLIC_MODELS) + sorted(EXISTING_MODELS),
                    help="fixtures to write (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    os.makedirs(args.out, exist_ok=True)
    for name, (arch, preset, seed, overrides) in MODELS.items():
        if args.only is None or name in args.only:
            make_fixture(name, arch, preset, seed, overrides, args.out)
    for name, (source, seed) in PUBLIC_MODELS.items():
        if args.only is None or name in args.only:
            make_public_fixture(name, source, seed, args.out)
    for name, model_dir in EXISTING_MODELS.items():
        if args.only is None or name in args.only:
            make_existing_golden(name, os.path.join(REPO_ROOT, model_dir), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
