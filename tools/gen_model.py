#!/usr/bin/env python3
"""Deterministic generator of random Mamba2-family models in Hugging Face format.

Archs: Nemotron-H, Mamba2, Bamba, GraniteMoeHybrid (Granite 4.0-H, MoE or dense), Falcon-H1, Zamba2, and the
Gated DeltaNet hybrids Qwen3-Next, Qwen3.5 (text-only form) and Qwen3.5-MoE (image-text form)
(gen_model_qwen3_next.py says what it writes; presets tiny, tiny2, e2e, bench).

Usage:
    python3 tools/gen_model.py --preset {tiny,tiny2,tiny3,tiny4,tiny5,default,e2e,bench,1b,moe_tiny,moe_tiny2,
                                        moe_tiny3,moe_e2e,moe_bench,moe_latent_tiny,moe_latent_e2e} --seed N --out DIR
                               [--arch {nemotron_h,mamba2,bamba,granitemoehybrid,falcon_h1,zamba2}]
                               [--dtype {fp32,bf16,fp16}]

Writes DIR/config.json and DIR/model.safetensors, loadable as is by transformers'
`NemotronHForCausalLM` / `Mamba2ForCausalLM` / `BambaForCausalLM` /
`GraniteMoeHybridForCausalLM` / `FalconH1ForCausalLM` / `Zamba2ForCausalLM` (`from_pretrained`) with no missing and
no unexpected keys
(tools/make_golden.py asserts this). Not every arch has every preset (PRESETS).

Files: this one holds the CLI, the presets, the safetensors writer and build(); each family's
config.json and weights are in a sibling module (gen_model_nemotron_h.py: Nemotron-H and Mamba2;
gen_model_bamba.py: Bamba and GraniteMoeHybrid; gen_model_falcon_h1.py; gen_model_zamba2.py;
gen_model_qwen3_next.py: qwen3_next, qwen3_5_text, qwen3_5_moe), and
what they share (random streams, tensor builders, common config fields) in gen_model_parts.py.
Copy them together (tools/gpu_bundle.sh does).

Contract
--------
* Depends on numpy only (the safetensors file is written by hand, so bf16 needs no torch).
* Byte-for-byte deterministic: the same (arch, preset, seed, dtype) gives identical files on
  any machine. Every tensor has its own random stream, PCG64 seeded from
  sha256("<seed>:<tensor name>"); normals are Irwin-Hall sums of twelve 16-bit uniforms
  (integer arithmetic, exact), uniforms are 24-bit dyadic rationals. Only the per-head
  vectors A_log and dt_bias go through libm (Python's math module).
* Tensor names are those transformers' save_pretrained writes, which are also those of the
  checkpoints on the Hub: prefix "backbone." for the body ("model." is the in-memory name
  of NemotronHForCausalLM; transformers renames backbone. -> model. on load) and
  "lm_head.weight" for the head. Mamba2 presets tie the head to the embedding
  (tie_word_embeddings=true, no lm_head.weight in the file); Nemotron-H cannot tie
  (NemotronHForCausalLM._tied_weights_keys is empty: even with tie_word_embeddings=true
  transformers loads, saves and uses its own lm_head.weight). Bamba and GraniteMoeHybrid
  files say "model." (embed_tokens, layers.L.mamba / self_attn, ...) as in memory, except
  the GraniteMoeHybrid MoE block: the file's block_sparse_moe.{input_linear.weight,
  output_linear.weight, router.layer.weight} are experts.gate_up_proj, experts.down_proj
  and router.weight in memory. A tied GraniteMoeHybrid has no lm_head.weight in the file.
* config.json for nemotron_h states the layer pattern twice, consistently:
  `hybrid_override_pattern` (M = Mamba2 mixer, * = attention, - = MLP, E = MoE) and
  `layers_block_type` (linear_attention / full_attention / mlp / moe), plus the legacy
  `num_hidden_layers`. With E blocks it adds the MoE fields save_pretrained writes
  (n_routed_experts, moe_intermediate_size, moe_shared_expert_intermediate_size,
  num_experts_per_tok, n_group, topk_group, norm_topk_prob, routed_scaling_factor,
  moe_latent_size (null but in the moe_latent_* presets), num_nextn_predict_layers 0, ...). An E
  block's file tensors are mixer.gate.weight, mixer.gate.e_score_correction_bias,
  mixer.experts.E.{up,down}_proj.weight (one 3-D tensor per projection in memory),
  mixer.shared_experts.{up,down}_proj.weight and, with moe_latent_size, mixer.fc1_latent_proj.weight
  and mixer.fc2_latent_proj.weight.
  Infinity is written as transformers 5 writes it: {"__float__": "Infinity"}.
* bamba and granitemoehybrid presets state their pattern as a string of M (Mamba2 mixer)
  and * (attention); config.json has the fields save_pretrained writes (transformers 5.23):
  bamba `attn_layer_indices`, granitemoehybrid `layer_types` as "linear_attention" /
  "full_attention" (transformers reads the Hub's legacy "mamba" / "attention" too and
  writes these back).
* falcon_h1 has no pattern: every decoder layer holds both a Mamba2 mixer (model.layers.L.mamba.*)
  and attention (self_attn.*) on the same normed input, then a SwiGLU feed_forward. A tied
  Falcon-H1 has no lm_head.weight (FalconH1ForCausalLM ties it to model.embed_tokens.weight);
  mamba.norm.weight exists only with mamba_rms_norm. head_dim is written only when the preset
  sets one (transformers falls back to hidden_size / num_attention_heads).
* zamba2 presets state their pattern as a string of M (Mamba2 layer) and H (hybrid layer); config.json
  has layers_block_type ("linear_attention" / "hybrid") and the derived fields save_pretrained writes.
  The head is tied (no lm_head.weight) unless the preset unties it (tiny4); a hybrid layer's
  shared_transformer.* is in the file only for the first hybrid layer using each memory block
  (zamba2_weights lists the names), except with the `per_use_copies` init option (presets tiny3 and
  e2e): then every later use holds a copy; and with `untied_blocks` (tiny4), its own draw.

Initialisation (mimics transformers' init, scaled by fan-in so that tiny models have O(1)
activations through every layer instead of vanishing ones):
    embeddings, lm_head, in_proj, q/k/v_proj, up_proj  ~ N(0, 1/fan_in)
    out_proj, o_proj, down_proj ~ N(0, 1/(fan_in * n_layers))   (rescale_prenorm_residual)
    conv1d weight and bias      ~ U(-1/sqrt(d_conv), 1/sqrt(d_conv))   (PyTorch Conv1d default)
    A_log   = log(U[1, 16])
    dt_bias = softplus^-1(dt), dt = exp(U[log time_step_min, log time_step_max]) >= floor
    D, RMSNorm weights = 1 + N(0, 0.1^2)
The last line departs from the real init (ones) on purpose: a kernel that ignores D or a
norm weight is then caught by the golden tests. Bamba: gate_proj as up_proj, MLP biases
(mlp_bias) ~ N(0, 0.1^2). GraniteMoeHybrid: input_linear as up_proj, output_linear as
down_proj, routers ~ N(0, ROUTER_GAIN^2 / hidden), and its multipliers folded into the init
(granitemoehybrid_weights says how). Falcon-H1: its multipliers folded into the init likewise
(falcon_h1_weights says how). Nemotron-H E blocks: routers ~ N(0, ROUTER_GAIN^2 / hidden),
e_score_correction_bias ~ N(0, NEMOTRON_BIAS_STD^2) (non-zero, so that it changes choices),
experts and shared expert as MLPs, the experts' down_proj over the routed weights' typical sum.

Presets
-------
tiny     Unit-test model, well under 1 MB. nemotron_h: vocab 96, hidden 32, pattern "M*M-M*-",
         Mamba2 4 heads x 16, n_groups 2, d_state 16, d_conv 4, chunk 16; attention 4 heads,
         2 KV heads, head_dim 8; MLP 64. mamba2: 4 layers of the same mixer, tied head.
         bamba: "M*MM", the same mixer and attention, SwiGLU 64, no MLP bias.
         granitemoehybrid: "M*MM", the same mixer and attention, 8 experts top-2 (inter 16),
         shared MLP 24, no positions, multipliers 12 / 0.22 / 1/128 / 6 (embedding, residual,
         attention, logits_scaling), untied.
         falcon_h1: 3 layers, Mamba2 4 heads x 16 (d_ssm 64), n_groups 2, no mixer norm, attention
         4 / 2 KV heads (head_dim 8 from hidden/heads), RoPE theta 1e11, SwiGLU 64 with biases, untied.
tiny2    The second unit-test shape (bamba, granitemoehybrid, falcon_h1). bamba: "*MM*M", Mamba2 8 heads
         x 8, n_groups 1, 1 KV head, SwiGLU 48 with biases. granitemoehybrid: dense (no experts)
         "*MM*", shared MLP 48, RoPE, tied head, multipliers 8 / 0.5 / 0.125 / 2. falcon_h1: tied
         head, attention 2 / 1 KV heads with head_dim 12 (not hidden/heads), RoPE theta 1e4, Mamba2
         6 heads x 8 (d_ssm 48 != mamba_expand * hidden), n_groups 1, gated RMSNorm before the gate.
tiny3    falcon_h1: 2 layers, Mamba2 8 x 8, n_groups 2, gated RMSNorm after the gate
         (mamba_norm_before_gate false), attention 4 / 4, RoPE theta 1e6, untied.
         granitemoehybrid: tiny as "*M*M" with attention biases (attention_bias), RoPE and
         attention_multiplier 0.125.
tiny4    falcon_h1 only: tiny in 2 layers without MLP biases, the mixer's out_proj with a bias
         (projectors_bias) and its in_proj without (mamba_proj_bias false).
tiny5    falcon_h1 only: tiny in 2 layers without MLP biases, the mixer's in_proj with a bias
         (mamba_proj_bias) and its out_proj without; attention biases (attention_bias); gated
         RMSNorm before the gate.
default  Byte-level model of a few MB, chunk 64: the architecture and the initial weights of the
         embedded default model, which tools/train_default_model.py trains on English text into
         models/default (the random weights of this preset are not what is embedded). Vocabulary
         (both archs):
             ids 0..255  the bytes 0x00..0xFF (token id == byte value)
             id  256     <pad>   (pad_token_id)
             id  257     <bos>   (bos_token_id)
             id  258     <eos>   (eos_token_id)
         vocab_size 259. config.json repeats this under "hybridserve_tokenizer".
e2e      Byte-level models (vocabulary as `default`) of the shapes the end-to-end suite runs
         besides the default model: nemotron_h "*M-M*-M" (attention first), hidden 64, chunk 32;
         mamba2 (no attention), 3 layers, hidden 64, 8 heads x 16, n_groups 4, chunk 16. Committed
         under tests/fixtures/models/{nemotron_h_e2e,mamba2_e2e} (seed 23). bamba "M*MM",
         hidden 64, Mamba2 4 heads x 16, SwiGLU 96, chunk 32; granitemoehybrid (MoE) "MM*M",
         hidden 64, Mamba2 4 x 16, n_groups 1, 8 experts top-2 (inter 8), shared 32, chunk 16,
         position_embedding_type "nope". Committed as tests/fixtures/models/{bamba_e2e,granite_e2e}
         (seed 23). falcon_h1: 4 layers, hidden 64, Mamba2 4 x 16, n_groups 2, gated RMSNorm, the
         mixer's out_proj biased and its in_proj not (projectors_bias true, mamba_proj_bias false),
         attention 4 / 2, SwiGLU 64, chunk 32, untied; committed as
         tests/fixtures/models/falcon_h1_e2e (seed 23).
bench    ~127M parameters (nemotron_h) / ~135M (mamba2) / ~125M (bamba, "MM*MM*M"), hidden
         1024, vocab 16384, chunk 128 (nemotron_h, bamba) / 256 (mamba2). granitemoehybrid: MoE
         "MM*MM*", 32 experts top-4 (inter 512), shared 1024, chunk 128: 394M parameters, 129M
         active per token (like nemotron_h's 127M). falcon_h1: Falcon-H1-0.5B's layer shapes in 8
         layers (134.5M). qwen3_5_text: 12 layers, full_attention_interval 4 (9 Gated DeltaNet, 3
         gated attention), GDN 4 key heads / 8 value heads of 128 (the real configs' n_v = 2 n_k,
         dk = dv = 128), attention 8 / 2 KV heads of 128 (partial RoPE 0.25, MRoPE [6, 5, 5]), SwiGLU
         2048, untied (158M). qwen3_5_moe: the same layers with the sparse MoE block in every layer,
         32 experts top-4 (inter 512), shared expert 512, and a one-block vision tower (text engines
         ignore it): 706M parameters, 177M active per token. Generated on demand, never committed.
moe_*    Nemotron-H with MoE ('E') blocks. moe_tiny: tiny's shapes, pattern "ME*E-M", 8 experts top-2
         in 2 groups of which 1 is kept, norm_topk_prob, routed_scaling_factor 2.5, inter 16, shared
         24. moe_tiny2: "EM*EME", Mamba2 8 heads x 8, n_groups 1, 1 KV head, 16 experts top-4, one
         group, no norm_topk_prob, scaling 1.0, inter 12, shared 32. moe_tiny3: moe_tiny with
         mlp_bias (the shared experts' and the MLP layer's up/down biases). moe_e2e: byte vocabulary,
         hidden 64, "MEM*E-", chunk 32, 8 experts top-2 in 4 groups of which 2 are kept, inter 16,
         shared 32; committed as tests/fixtures/models/nemotron_h_moe_e2e (seed 23). moe_bench:
         bench's shape with E for every '-' ("MEMEM*EMEMEM*EME"), 32 experts top-4 (inter 512),
         shared 1024, one group, norm_topk_prob, scaling 2.5; never committed. moe_latent_tiny:
         moe_tiny with moe_latent_size 12 (fc1_latent_proj / fc2_latent_proj around experts 12
         wide); moe_latent_e2e: moe_e2e with moe_latent_size 24, committed as
         tests/fixtures/models/nemotron_h_latent_e2e (seed 23).
zamba2   tiny: vocab 96, hidden 32, "MHMMH", Mamba2 4 x 16, n_groups 2, d_state 16, chunk 16, one memory
         block, attention 4 heads of 16 on 2*hidden, MLP 48 (gelu), adapters rank 4, no RoPE, tied.
         tiny2: hidden 24, "HMHMMH", two memory blocks (block 0 at hybrid uses 0 and 2, block 1 at use
         1), Mamba2 6 x 8, n_groups 1, attention 3 heads of 16, MLP 40, adapters rank 6, RoPE; its
         branch outputs (out_proj, linear, o_proj, down_proj) at 0.4 times the init's standard deviation.
         tiny3: "HMMHMH", one block used three times and written under each (per_use_copies), no
         attention adapters, RoPE, branch outputs at 0.4 (golden fixture zamba2_per_use_tiny).
         tiny4: "HMMHMH", one block, RoPE, branch outputs at 0.4, tie_word_embeddings false: every
         hybrid layer's shared_transformer.* its own draw (untied_blocks), its own lm_head.weight
         (golden fixture zamba2_untied_tiny).
         e2e: byte vocabulary, hidden 64, "MHMMH", one block (written under both hybrid layers:
         per_use_copies), RoPE, chunk 32 (tests/fixtures/models/zamba2_e2e, seed 23). bench: Zamba2-1.2B's shapes at hidden 1024, "MMMMMHMMHMMH", two blocks
         (160M); never committed.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

from gen_model_bamba import bamba_config, bamba_weights, granitemoehybrid_config, granitemoehybrid_weights
from gen_model_falcon_h1 import FALCON_H1_MULTIPLIERS, falcon_h1_config, falcon_h1_weights  # noqa: F401
from gen_model_nemotron_h import mamba2_config, mamba2_weights, nemotron_h_config, nemotron_h_weights
from gen_model_qwen3_next import qwen3_next_config, qwen3_next_weights
from gen_model_zamba2 import zamba2_config, zamba2_shared_block_uses, zamba2_weights  # noqa: F401

# Byte-level vocabulary of the `default` preset.
BYTE_VOCAB = {"kind": "bytes", "byte_offset": 0, "num_bytes": 256, "pad": 256, "bos": 257, "eos": 258}
BYTE_VOCAB_SIZE = 259

# Special token ids of the presets with a 96- or 16K-token vocabulary, and the byte vocabulary's.
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_BYTE_IDS = dict(vocab_size=BYTE_VOCAB_SIZE, pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"],
                 eos_token_id=BYTE_VOCAB["eos"])


def _with(base, **changes):
    """A preset written as its differences from `base`."""
    return {**base, **changes}


# Architecture hyper-parameters per (arch, preset), most written as their differences from the
# arch's tiny preset. Nemotron-H fields use the names of transformers' NemotronHConfig; Mamba2
# fields those of Mamba2Config; the other archs' those of their config classes. `init`: keyword
# arguments of the arch's weights function (not in config.json).
_NEMOTRON_TINY = dict(
    vocab_size=96, hidden_size=32, pattern="M*M-M*-",
    mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
    **_IDS, max_position_embeddings=4096)
_NEMOTRON_DEFAULT = _with(
    _NEMOTRON_TINY, **_BYTE_IDS, hidden_size=128, pattern="M-M*-M-M*-M-", mamba_num_heads=8, mamba_head_dim=32,
    ssm_state_size=32, chunk_size=64, head_dim=32, intermediate_size=256, max_position_embeddings=8192)
_NEMOTRON_BENCH = _with(
    _NEMOTRON_TINY, vocab_size=16384, hidden_size=1024, pattern="M-M-M*-M-M-M*-M-", mamba_num_heads=32,
    mamba_head_dim=64, n_groups=8, ssm_state_size=128, chunk_size=128, num_attention_heads=8, head_dim=128,
    intermediate_size=2048, max_position_embeddings=32768)
# End-to-end test shapes (byte vocabulary, random weights, committed under
# tests/fixtures/models/): the stack is run on every shape the engine
# supports, not only the default model's. nemotron_h/e2e puts attention
# first and uses chunk 32; mamba2/e2e has no attention layer at all.
_NEMOTRON_E2E = _with(
    _NEMOTRON_DEFAULT, hidden_size=64, pattern="*M-M*-M", mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16,
    chunk_size=32, head_dim=16, intermediate_size=128)
# Nemotron-H with MoE blocks ('E' in the pattern, "moe" in layers_block_type; transformers 5.23
# NemotronHMoE): relu2 experts and a relu2 shared expert, sigmoid scores plus a correction bias
# choose the experts within the topk_group best of n_group groups; the weights are the chosen
# sigmoid scores (over their sum when norm_topk_prob) times routed_scaling_factor.
_NEMOTRON_MOE_TINY = _with(
    _NEMOTRON_TINY, pattern="ME*E-M", n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
    norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=16, moe_shared_expert_intermediate_size=24)

_MAMBA2_TINY = dict(
    vocab_size=96, hidden_size=32, num_hidden_layers=4,
    num_heads=4, head_dim=16, n_groups=2, state_size=16, conv_kernel=4, chunk_size=16, **_IDS)
_MAMBA2_DEFAULT = _with(_MAMBA2_TINY, **_BYTE_IDS, hidden_size=128, num_hidden_layers=8, num_heads=8, head_dim=32,
                        state_size=32, chunk_size=64)

# The shapes that Bamba and GraniteMoeHybrid presets share: pattern (M = Mamba2 mixer, * = attention),
# Mamba2 mixer, attention (head_dim is hidden_size / num_attention_heads).
_HYBRID_TINY = dict(
    vocab_size=96, hidden_size=32, pattern="M*MM",
    mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
    num_attention_heads=4, num_key_value_heads=2, **_IDS, max_position_embeddings=4096)
_HYBRID_BENCH = _with(
    _HYBRID_TINY, vocab_size=16384, hidden_size=1024, mamba_n_heads=32, mamba_d_head=64, mamba_n_groups=8,
    mamba_d_state=128, mamba_chunk_size=128, num_attention_heads=8, max_position_embeddings=32768)
# Bamba (BambaForCausalLM): pattern as nemotron_h's without MLP layers; every decoder layer also has a
# SwiGLU feed-forward block. Attention RoPE on half of head_dim (partial_rotary_factor 0.5).
_BAMBA_TINY = _with(_HYBRID_TINY, intermediate_size=64, mlp_bias=False)
# GraniteMoeHybrid (GraniteMoeHybridForCausalLM): pattern as bamba's; every decoder layer has
# a shared SwiGLU MLP and, when num_local_experts > 0, a top-k MoE block beside it.
# position_embedding_type None or "nope" (no positions; the published Granite 4.0-H configs say
# "nope") or "rope".
# Granite 4.0-H MoE's positions (none) and multipliers, untied.
_GRANITE_SCALES = dict(position_embedding_type=None, embedding_multiplier=12.0, residual_multiplier=0.22,
                       attention_multiplier=0.0078125, logits_scaling=6.0, tie_word_embeddings=False)
_GRANITE_TINY = _with(_HYBRID_TINY, num_local_experts=8, num_experts_per_tok=2, intermediate_size=16,
                      shared_intermediate_size=24, **_GRANITE_SCALES)

# Falcon-H1 (FalconH1ForCausalLM): every decoder layer runs a Mamba2 mixer and attention side by
# side on the same normed input, then a SwiGLU MLP. Every multiplier differs from 1 and from the
# others, so an engine that drops or swaps one is caught; falcon_h1_weights folds them into the
# init. head_dim=None leaves the field out of config.json (transformers then uses
# hidden_size / num_attention_heads). mamba_d_ssm (= mamba_n_heads * mamba_d_head) is the
# mixer's inner width, whatever mamba_expand says.
_FALCON_TINY = dict(
    vocab_size=96, hidden_size=32, num_hidden_layers=3,
    mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
    mamba_expand=2, mamba_chunk_size=16, mamba_rms_norm=False, mamba_norm_before_gate=True,
    num_attention_heads=4, num_key_value_heads=2, head_dim=None, rope_theta=1e11,
    intermediate_size=64, mlp_bias=True, projectors_bias=False, mamba_proj_bias=False, attention_bias=False,
    tie_word_embeddings=False,
    embedding_multiplier=5.5, lm_head_multiplier=0.0390625, key_multiplier=0.390625,
    attention_in_multiplier=1.25, attention_out_multiplier=0.9375, ssm_in_multiplier=1.5,
    ssm_out_multiplier=0.2357, ssm_multipliers=[0.3535, 0.25, 0.707, 0.5, 1.75], mlp_multipliers=[0.8839, 0.5859],
    **_IDS, max_position_embeddings=4096)

# Zamba2 (Zamba2ForCausalLM): pattern of M (Mamba2 layer) and H (hybrid layer: the shared
# transformer block of hybrid use u is block u % num_mem_blocks, with its own LoRA adapters for
# that use, then a per-layer `linear`, whose output is added to the Mamba2 layer's input).
# Attention runs on concat(h, embeddings) of width 2*hidden: head_dim = 2*hidden / heads.
# Adapters on q/k/v make num_key_value_heads < num_attention_heads impossible (transformers adds
# a [2*hidden] adapter output to the [kv_heads * head_dim] keys), so every preset is MHA.
_ZAMBA2_TINY = dict(
    vocab_size=96, hidden_size=32, pattern="MHMMH",
    n_mamba_heads=4, mamba_ngroups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, chunk_size=16,
    num_attention_heads=4, intermediate_size=48, num_mem_blocks=1, adapter_rank=4, use_mem_rope=False,
    rope_theta=10000.0, **_IDS, max_position_embeddings=4096)

_F, _L = "full_attention", "linear_attention"
# Qwen3-Next (issue 50): layer_types starting with attention, MoE in every layer (8 experts top-2,
# norm_topk_prob, shared expert with its gate), GDN with 2 key heads of 16 and 4 value heads of 8
# (n_v = 2 n_k, dk != dv), gated attention 4 / 2 KV heads of 16 with partial_rotary_factor 0.25.
_QWEN3_NEXT_TINY = dict(
    vocab_size=256, hidden_size=32, num_hidden_layers=5, layer_types=[_F, _L, _L, _F, _L],
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
    linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, moe_intermediate_size=16,
    shared_expert_intermediate_size=24, intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[],
    rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False, **_IDS)
# Qwen3.5 dense, text-only (qwen3_5_text): the pattern from full_attention_interval (no layer_types),
# tied head; MRoPE sections (text positions make it the plain partial RoPE).
_QWEN3_5_TINY = _with(
    {k: v for k, v in _QWEN3_NEXT_TINY.items() if k != "layer_types"}, full_attention_interval=3,
    intermediate_size=64, tie_word_embeddings=True, mrope_section=[1, 1, 0])
# Qwen3.5-MoE in the image-text form (text_config + a small vision tower), untied.
_QWEN3_5_MOE_TINY = _with(
    _QWEN3_NEXT_TINY, num_hidden_layers=4, layer_types=[_L, _L, _F, _L], mrope_section=[1, 1, 0],
    vision=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                num_position_embeddings=16))
# The llama.cpp comparison's shape (bench/llamacpp): hidden 1024, vocab 16384 like the other bench
# models; the 3:1 linear/full pattern, GDN heads in the real configs' ratio (n_v = 2 n_k,
# dk = dv = 128), gated attention heads of 128 (the rotary half-width 16 = the MRoPE sections' sum).
_QWEN3_5_BENCH = _with(
    _QWEN3_5_TINY, vocab_size=16384, hidden_size=1024, num_hidden_layers=12, full_attention_interval=4,
    num_attention_heads=8, num_key_value_heads=2, head_dim=128, mrope_section=[6, 5, 5], linear_num_key_heads=4,
    linear_num_value_heads=8, linear_key_head_dim=128, linear_value_head_dim=128, intermediate_size=2048,
    tie_word_embeddings=False, max_position_embeddings=65536)
_QWEN3_5_MOE_BENCH = _with(
    _QWEN3_5_MOE_TINY, **{k: v for k, v in _QWEN3_5_BENCH.items() if k != "full_attention_interval"},
    layer_types=[_F if (i + 1) % 4 == 0 else _L for i in range(12)])
_QWEN3_5_MOE_BENCH.update(num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
                          shared_expert_intermediate_size=512)

PRESETS = {
    ("nemotron_h", "tiny"): _NEMOTRON_TINY,
    ("nemotron_h", "default"): _NEMOTRON_DEFAULT,
    ("nemotron_h", "bench"): _NEMOTRON_BENCH,
    # ~0.93B parameters: the GPU benchmarks' "generated ~1B hybrid" (issue 12).
    ("nemotron_h", "1b"): _with(
        _NEMOTRON_BENCH, vocab_size=32000, hidden_size=2048, pattern="M-M-M*-M-M-M*-M-M-M*-M-M-M*-",
        mamba_num_heads=64, chunk_size=256, num_attention_heads=16, num_key_value_heads=4, intermediate_size=8192,
        max_position_embeddings=131072),
    ("nemotron_h", "e2e"): _NEMOTRON_E2E,
    ("nemotron_h", "moe_tiny"): _NEMOTRON_MOE_TINY,
    ("nemotron_h", "moe_tiny2"): _with(
        _NEMOTRON_MOE_TINY, pattern="EM*EME", mamba_num_heads=8, mamba_head_dim=8, n_groups=1, num_key_value_heads=1,
        n_routed_experts=16, num_experts_per_tok=4, n_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
        moe_intermediate_size=12, moe_shared_expert_intermediate_size=32),
    # mlp_bias: the shared experts' and the MLP layer's up/down biases (NemotronHMLP builds both
    # with bias=mlp_bias; the routed experts have none).
    ("nemotron_h", "moe_tiny3"): _with(_NEMOTRON_MOE_TINY, mlp_bias=True),
    ("nemotron_h", "moe_e2e"): _with(
        _NEMOTRON_E2E, pattern="MEM*E-", n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=16,
        moe_shared_expert_intermediate_size=32),
    # moe_tiny with MoE latent projections (Nemotron 3 Super / Ultra's LatentMoE: moe_latent_size
    # 1024 at hidden 4096): the routed experts run 12 wide, between hidden (32) and their inter (16)
    # so that a swapped dimension cannot load.
    ("nemotron_h", "moe_latent_tiny"): _with(_NEMOTRON_MOE_TINY, moe_latent_size=12),
    # moe_e2e with latent projections, 24 wide (hidden 64).
    ("nemotron_h", "moe_latent_e2e"): _with(
        _NEMOTRON_E2E, pattern="MEM*E-", n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=16,
        moe_shared_expert_intermediate_size=32, moe_latent_size=24),
    # The bench preset's shape with an MoE block in place of every MLP (Nemotron 3 Nano's routing:
    # one group, norm_topk_prob, routed_scaling_factor 2.5).
    ("nemotron_h", "moe_bench"): _with(
        _NEMOTRON_BENCH, pattern="MEMEM*EMEMEM*EME", n_routed_experts=32, num_experts_per_tok=4, n_group=1,
        topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=512,
        moe_shared_expert_intermediate_size=1024),
    ("mamba2", "tiny"): _MAMBA2_TINY,
    ("mamba2", "default"): _MAMBA2_DEFAULT,
    ("mamba2", "e2e"): _with(_MAMBA2_DEFAULT, hidden_size=64, num_hidden_layers=3, head_dim=16, n_groups=4,
                             state_size=16, chunk_size=16),
    ("mamba2", "bench"): _with(_MAMBA2_TINY, vocab_size=16384, hidden_size=1024, num_hidden_layers=14, num_heads=32,
                               head_dim=64, n_groups=8, state_size=128, chunk_size=256),
    ("bamba", "tiny"): _BAMBA_TINY,
    ("bamba", "tiny2"): _with(_BAMBA_TINY, pattern="*MM*M", mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1,
                              num_key_value_heads=1, intermediate_size=48, mlp_bias=True),
    ("bamba", "e2e"): _with(_BAMBA_TINY, **_BYTE_IDS, hidden_size=64, mamba_chunk_size=32, intermediate_size=96,
                            max_position_embeddings=8192),
    ("bamba", "bench"): _with(_HYBRID_BENCH, pattern="MM*MM*M", intermediate_size=2048, mlp_bias=False),
    ("granitemoehybrid", "tiny"): _GRANITE_TINY,
    # Dense (no experts), RoPE, tied head: the shape of Granite 4.0 H-Micro.
    ("granitemoehybrid", "tiny2"): _with(
        _GRANITE_TINY, pattern="*MM*", num_local_experts=0, num_experts_per_tok=0, intermediate_size=0,
        shared_intermediate_size=48, position_embedding_type="rope", embedding_multiplier=8.0,
        residual_multiplier=0.5, attention_multiplier=0.125, logits_scaling=2.0, tie_word_embeddings=True),
    # Attention biases (attention_bias: q/k/v/o_proj, as GraniteMoeHybridAttention builds them),
    # RoPE (q's and k's biases are added before the rotation), two attention layers, MoE.
    ("granitemoehybrid", "tiny3"): _with(
        _GRANITE_TINY, pattern="*M*M", attention_bias=True, position_embedding_type="rope",
        attention_multiplier=0.125),
    # "nope" as the published Granite 4.0-H configs write it (the same model as None).
    ("granitemoehybrid", "e2e"): _with(
        _GRANITE_TINY, **_BYTE_IDS, hidden_size=64, pattern="MM*M", mamba_n_groups=1, intermediate_size=8,
        shared_intermediate_size=32, position_embedding_type="nope", max_position_embeddings=8192),
    ("granitemoehybrid", "bench"): _with(
        _HYBRID_BENCH, **_GRANITE_SCALES, pattern="MM*MM*", num_local_experts=32, num_experts_per_tok=4,
        intermediate_size=512, shared_intermediate_size=1024),
    ("falcon_h1", "tiny"): _FALCON_TINY,
    # Tied head, head_dim 12 != hidden/heads 16, mamba_d_ssm 48 != mamba_expand * hidden 64, the gated
    # RMSNorm in the mixer (normed before the gate, Falcon's default), RoPE theta 1e4 (every pair turns).
    ("falcon_h1", "tiny2"): _with(
        _FALCON_TINY, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8, mamba_n_groups=1, mamba_rms_norm=True,
        num_attention_heads=2, num_key_value_heads=1, head_dim=12, rope_theta=10000.0, intermediate_size=48,
        mlp_bias=False, tie_word_embeddings=True, embedding_multiplier=3.0, lm_head_multiplier=0.125,
        key_multiplier=0.6, attention_in_multiplier=0.8, attention_out_multiplier=1.6, ssm_in_multiplier=0.7,
        ssm_out_multiplier=0.45, ssm_multipliers=[1.3, 0.55, 0.85, 1.15, 0.65], mlp_multipliers=[1.4, 0.35]),
    # The gated RMSNorm over 2 groups, applied after the gate (mamba_norm_before_gate false); MHA
    # (8 KV heads), head_dim given and equal to hidden/heads, RoPE theta 1e6, untied.
    ("falcon_h1", "tiny3"): _with(
        _FALCON_TINY, num_hidden_layers=2, mamba_n_heads=8, mamba_d_head=8, mamba_rms_norm=True,
        mamba_norm_before_gate=False, num_key_value_heads=4, head_dim=8, rope_theta=1e6, intermediate_size=48,
        mlp_bias=False, embedding_multiplier=2.5, lm_head_multiplier=0.0625, key_multiplier=1.3,
        attention_in_multiplier=0.75, attention_out_multiplier=1.15, ssm_in_multiplier=0.55,
        ssm_out_multiplier=0.8, ssm_multipliers=[0.9, 1.2, 0.4, 1.6, 0.3], mlp_multipliers=[0.65, 1.45]),
    # The mixer's projection biases one without the other (transformers: in_proj's bias is
    # mamba_proj_bias, out_proj's projectors_bias). tiny4: out_proj's only, no mixer norm;
    # tiny5: in_proj's only (added before the ssm_multipliers), gated RMSNorm before the gate, and
    # attention biases (attention_bias: q/k/v/o_proj; k's before key_multiplier).
    ("falcon_h1", "tiny4"): _with(
        _FALCON_TINY, num_hidden_layers=2, projectors_bias=True, mamba_proj_bias=False, mlp_bias=False),
    ("falcon_h1", "tiny5"): _with(
        _FALCON_TINY, num_hidden_layers=2, projectors_bias=False, mamba_proj_bias=True, mamba_rms_norm=True,
        attention_bias=True, mlp_bias=False),
    # out_proj's bias without in_proj's (projectors_bias true, mamba_proj_bias false).
    ("falcon_h1", "e2e"): _with(
        _FALCON_TINY, **_BYTE_IDS, hidden_size=64, num_hidden_layers=4, mamba_chunk_size=32, mamba_rms_norm=True,
        mlp_bias=False, projectors_bias=True, max_position_embeddings=8192),
    # Falcon-H1-0.5B's layer shapes (hidden 1024, GQA 8/2 x 64, Mamba2 24 x 64 = d_ssm 1536, n_groups 1,
    # d_state 128, SwiGLU 2048) in 8 layers with a 16K vocabulary.
    ("falcon_h1", "bench"): _with(
        _FALCON_TINY, vocab_size=16384, hidden_size=1024, num_hidden_layers=8, mamba_d_ssm=1536, mamba_n_heads=24,
        mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_chunk_size=128, num_attention_heads=8,
        head_dim=64, intermediate_size=2048, mlp_bias=False, max_position_embeddings=32768),
    ("zamba2", "tiny"): _ZAMBA2_TINY,
    # Two memory blocks over three hybrid layers (block 0 at uses 0 and 2, block 1 at use 1), a hybrid
    # layer first (its attention input is concat(embeddings, embeddings)), RoPE on the shared attention.
    # Branch outputs at 0.4 times the usual scale: at 1 the layers amplified fp32 rounding so much
    # that transformers' own fp32 and fp64 logits differed by 3e-5 (7e-5 in its cached decode).
    ("zamba2", "tiny2"): _with(
        _ZAMBA2_TINY, hidden_size=24, pattern="HMHMMH", n_mamba_heads=6, mamba_ngroups=1, num_attention_heads=3,
        intermediate_size=40, num_mem_blocks=2, adapter_rank=6, use_mem_rope=True, init={"branch_gain": 0.4}),
    # The shape of the checkpoint issue 46's testers had: one memory block, a hybrid layer first, its
    # shared block written under every hybrid layer that uses it (per_use_copies), and no attention
    # adapters (use_shared_attention_adapter false, as in Zamba2-2.7B and 7B: the MLP adapters only).
    ("zamba2", "tiny3"): _with(
        _ZAMBA2_TINY, pattern="HMMHMH", use_shared_attention_adapter=False, use_mem_rope=True,
        init={"branch_gain": 0.4, "per_use_copies": True}),
    # Untied (issue 46): tie_word_embeddings false, so transformers runs each hybrid layer with its
    # own shared block, and each layer's is drawn afresh (as save_pretrained writes a randomly
    # initialised untied model); one memory block used three times, a hybrid layer first, attention
    # adapters (each layer runs its own use's), its own lm_head.weight.
    ("zamba2", "tiny4"): _with(
        _ZAMBA2_TINY, pattern="HMMHMH", use_mem_rope=True, tie_word_embeddings=False,
        init={"branch_gain": 0.4, "untied_blocks": True}),
    # Written per use (issue 46): the end-to-end suite serves a file laid out as the testers' was.
    ("zamba2", "e2e"): _with(
        _ZAMBA2_TINY, **_BYTE_IDS, hidden_size=64, mamba_ngroups=1, chunk_size=32, intermediate_size=64,
        use_mem_rope=True, max_position_embeddings=8192, init={"per_use_copies": True}),
    # Zamba2-1.2B's layer shapes (hidden 2048 halved to 1024: Mamba2 32 x 64, n_groups 1, d_state 64,
    # attention 16 heads of 128 on 2*hidden, MLP 4*hidden, adapters rank 128) in 12 layers, 2 blocks.
    ("zamba2", "bench"): _with(
        _ZAMBA2_TINY, vocab_size=16384, hidden_size=1024, pattern="MMMMMHMMHMMH", n_mamba_heads=32,
        mamba_ngroups=1, mamba_d_state=64, chunk_size=128, num_attention_heads=16, intermediate_size=4096,
        num_mem_blocks=2, adapter_rank=128, use_mem_rope=True, max_position_embeddings=32768),
    ("qwen3_next", "tiny"): _QWEN3_NEXT_TINY,
    # Some layers dense: decoder_sparse_step 2 and mlp_only_layers [3] leave MoE in layers 1 and 5 only;
    # 1 key head of 8 and 3 value heads of 16 (dv > dk, n_v = 3 n_k).
    ("qwen3_next", "tiny2"): _with(
        _QWEN3_NEXT_TINY, num_hidden_layers=6, layer_types=[_F, _L, _L, _F, _L, _L], decoder_sparse_step=2,
        mlp_only_layers=[3], linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8,
        linear_value_head_dim=16),
    ("qwen3_5_text", "tiny"): _QWEN3_5_TINY,
    ("qwen3_5_text", "bench"): _QWEN3_5_BENCH,
    ("qwen3_5_text", "e2e"): _with(
        _QWEN3_5_TINY, **_BYTE_IDS, hidden_size=64, head_dim=32, mrope_section=[2, 1, 1], linear_value_head_dim=16,
        intermediate_size=96, max_position_embeddings=8192),
    ("qwen3_5_moe", "tiny"): _QWEN3_5_MOE_TINY,
    ("qwen3_5_moe", "bench"): _QWEN3_5_MOE_BENCH,
    ("qwen3_5_moe", "e2e"): _with(
        _QWEN3_5_MOE_TINY, **_BYTE_IDS, hidden_size=64, layer_types=[_L, _F, _L, _L], head_dim=32,
        mrope_section=[2, 1, 1], linear_value_head_dim=16, shared_expert_intermediate_size=32,
        max_position_embeddings=8192),
}


# ----------------------------------------------------------------------------- dtypes + writer

DTYPES = {  # --dtype -> (config "dtype", safetensors dtype, bytes per element)
    "fp32": ("float32", "F32", 4),
    "bf16": ("bfloat16", "BF16", 2),
    "fp16": ("float16", "F16", 2),
}


def _encode(arr, dtype):
    """float32 array -> little-endian bytes in `dtype` (round to nearest even)."""
    a = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == "fp32":
        return a.astype("<f4").tobytes()
    if dtype == "fp16":
        return a.astype("<f2").tobytes()
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # bf16 RNE; inputs are finite
    return u.astype("<u2").tobytes()


def write_safetensors(path, tensors, dtype="fp32", metadata=None):
    """Writes `tensors` (name -> float32 array) as one safetensors file, names sorted."""
    st_dtype, width = DTYPES[dtype][1], DTYPES[dtype][2]
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        arr = tensors[name]
        blob = _encode(arr, dtype)
        assert len(blob) == arr.size * width
        header[name] = {"dtype": st_dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    head += b" " * (-len(head) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)


# arch -> (config dict of a preset, weights of a config dict and a seed)
ARCHS = {
    "nemotron_h": (nemotron_h_config, nemotron_h_weights),
    "mamba2": (mamba2_config, mamba2_weights),
    "bamba": (bamba_config, bamba_weights),
    "granitemoehybrid": (granitemoehybrid_config, granitemoehybrid_weights),
    "falcon_h1": (falcon_h1_config, falcon_h1_weights),
    "zamba2": (zamba2_config, zamba2_weights),
    **{a: (lambda p, d, a=a: qwen3_next_config(p, d, a), lambda c, s, a=a: qwen3_next_weights(c, s, a))
       for a in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")},
}
PRESET_NAMES = ["tiny", "tiny2", "tiny3", "tiny4", "tiny5", "default", "e2e", "bench", "1b", "moe_tiny", "moe_tiny2",
                "moe_tiny3", "moe_e2e", "moe_bench", "moe_latent_tiny", "moe_latent_e2e"]


def build(arch, preset, seed, dtype="fp32"):
    """Returns (config dict, name -> float32 array) for the given model. Pure function."""
    if (arch, preset) not in PRESETS:
        raise ValueError(f"unknown arch/preset {arch}/{preset}")
    p = PRESETS[(arch, preset)]
    dtype_name = DTYPES[dtype][0]
    config_fn, weights_fn = ARCHS[arch]
    cfg = config_fn(p, dtype_name)
    weights = weights_fn(cfg, seed, **p.get("init", {}))
    if preset in ("default", "e2e", "moe_e2e", "moe_latent_e2e"):
        cfg["hybridserve_tokenizer"] = dict(BYTE_VOCAB)
    cfg["hybridserve_generator"] = {"tool": "tools/gen_model.py", "arch": arch, "preset": preset,
                                    "seed": seed, "dtype": dtype}
    return cfg, weights


def write_model(out_dir, cfg, weights, dtype="fp32"):
    """Writes config.json and model.safetensors into out_dir (created if needed)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True, allow_nan=False)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), weights, dtype, metadata={"format": "pt"})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=PRESET_NAMES, required=True)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="nemotron_h")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    cfg, weights = build(args.arch, args.preset, args.seed, args.dtype)
    write_model(args.out, cfg, weights, args.dtype)
    n_params = sum(int(a.size) for a in weights.values())
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in ("config.json", "model.safetensors"))
    print(f"{args.arch}/{args.preset} seed={args.seed} dtype={args.dtype}: "
          f"{n_params:,} parameters, {len(weights)} tensors, {size:,} bytes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
