#!/usr/bin/env python3
"""Deterministic generator of random Mamba2-family models in Hugging Face format.

Archs: Nemotron-H, Mamba2, Bamba, GraniteMoeHybrid (Granite 4.0-H, MoE or dense), Falcon-H1.

Usage:
    python3 tools/gen_model.py --preset {tiny,tiny2,tiny3,default,e2e,bench,1b,moe_tiny,moe_tiny2,moe_e2e,
                                        moe_bench} --seed N --out DIR
                               [--arch {nemotron_h,mamba2,bamba,granitemoehybrid,falcon_h1}]
                               [--dtype {fp32,bf16,fp16}]

Writes DIR/config.json and DIR/model.safetensors, loadable as is by transformers'
`NemotronHForCausalLM` / `Mamba2ForCausalLM` / `BambaForCausalLM` /
`GraniteMoeHybridForCausalLM` / `FalconH1ForCausalLM` (`from_pretrained`) with no missing and
no unexpected keys
(tools/make_golden.py asserts this). Not every arch has every preset (PRESETS).

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
  moe_latent_size null, num_nextn_predict_layers 0, ...). An E block's file tensors are
  mixer.gate.weight, mixer.gate.e_score_correction_bias, mixer.experts.E.{up,down}_proj.weight
  (one 3-D tensor per projection in memory) and mixer.shared_experts.{up,down}_proj.weight.
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
tiny3    falcon_h1 only: 2 layers, Mamba2 8 x 8, n_groups 2, gated RMSNorm after the gate
         (mamba_norm_before_gate false), attention 4 / 4, RoPE theta 1e6, untied.
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
         hidden 64, Mamba2 4 x 16, n_groups 1, 8 experts top-2 (inter 8), shared 32, chunk 16.
         Committed as tests/fixtures/models/{bamba_e2e,granite_e2e} (seed 23). falcon_h1: 4 layers,
         hidden 64, Mamba2 4 x 16, n_groups 2, gated RMSNorm, attention 4 / 2, SwiGLU 64, chunk 32,
         untied; committed as tests/fixtures/models/falcon_h1_e2e (seed 23).
bench    ~127M parameters (nemotron_h) / ~135M (mamba2) / ~125M (bamba, "MM*MM*M"), hidden
         1024, vocab 16384, chunk 128 (nemotron_h, bamba) / 256 (mamba2). granitemoehybrid: MoE
         "MM*MM*", 32 experts top-4 (inter 512), shared 1024, chunk 128: 394M parameters, 129M
         active per token (like nemotron_h's 127M). falcon_h1: Falcon-H1-0.5B's layer shapes in 8
         layers (134.5M). Generated on demand, never committed.
moe_*    Nemotron-H with MoE ('E') blocks. moe_tiny: tiny's shapes, pattern "ME*E-M", 8 experts top-2
         in 2 groups of which 1 is kept, norm_topk_prob, routed_scaling_factor 2.5, inter 16, shared
         24. moe_tiny2: "EM*EME", Mamba2 8 heads x 8, n_groups 1, 1 KV head, 16 experts top-4, one
         group, no norm_topk_prob, scaling 1.0, inter 12, shared 32. moe_e2e: byte vocabulary,
         hidden 64, "MEM*E-", chunk 32, 8 experts top-2 in 4 groups of which 2 are kept, inter 16,
         shared 32; committed as tests/fixtures/models/nemotron_h_moe_e2e (seed 23). moe_bench:
         bench's shape with E for every '-' ("MEMEM*EMEMEM*EME"), 32 experts top-4 (inter 512),
         shared 1024, one group, norm_topk_prob, scaling 2.5; never committed.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np

# Byte-level vocabulary of the `default` preset.
BYTE_VOCAB = {"kind": "bytes", "byte_offset": 0, "num_bytes": 256, "pad": 256, "bos": 257, "eos": 258}
BYTE_VOCAB_SIZE = 259

_INF = {"__float__": "Infinity"}  # transformers 5 encoding of float('inf') in config.json

# Architecture hyper-parameters per (arch, preset). Nemotron-H fields use the names of
# transformers' NemotronHConfig; Mamba2 fields those of Mamba2Config.
PRESETS = {
    ("nemotron_h", "tiny"): dict(
        vocab_size=96, hidden_size=32, pattern="M*M-M*-",
        mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    ("nemotron_h", "default"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=128, pattern="M-M*-M-M*-M-",
        mamba_num_heads=8, mamba_head_dim=32, n_groups=2, ssm_state_size=32, conv_kernel=4, chunk_size=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256,
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"],
        max_position_embeddings=8192),
    ("nemotron_h", "bench"): dict(
        vocab_size=16384, hidden_size=1024, pattern="M-M-M*-M-M-M*-M-",
        mamba_num_heads=32, mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4, chunk_size=128,
        num_attention_heads=8, num_key_value_heads=2, head_dim=128, intermediate_size=2048,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=32768),
    # ~0.93B parameters: the GPU benchmarks' "generated ~1B hybrid" (issue 12).
    ("nemotron_h", "1b"): dict(
        vocab_size=32000, hidden_size=2048, pattern="M-M-M*-M-M-M*-M-M-M*-M-M-M*-",
        mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4, chunk_size=256,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128, intermediate_size=8192,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=131072),
    # End-to-end test shapes (byte vocabulary, random weights, committed under
    # tests/fixtures/models/): the stack is run on every shape the engine
    # supports, not only the default model's. nemotron_h/e2e puts attention
    # first and uses chunk 32; mamba2/e2e has no attention layer at all.
    ("nemotron_h", "e2e"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=64, pattern="*M-M*-M",
        mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=32,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"],
        max_position_embeddings=8192),
    # Nemotron-H with MoE blocks ('E' in the pattern, "moe" in layers_block_type; transformers 5.23
    # NemotronHMoE): relu2 experts and a relu2 shared expert, sigmoid scores plus a correction bias
    # choose the experts within the topk_group best of n_group groups; the weights are the chosen
    # sigmoid scores (over their sum when norm_topk_prob) times routed_scaling_factor.
    ("nemotron_h", "moe_tiny"): dict(
        vocab_size=96, hidden_size=32, pattern="ME*E-M",
        mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, moe_intermediate_size=16, moe_shared_expert_intermediate_size=24,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    ("nemotron_h", "moe_tiny2"): dict(
        vocab_size=96, hidden_size=32, pattern="EM*EME",
        mamba_num_heads=8, mamba_head_dim=8, n_groups=1, ssm_state_size=16, conv_kernel=4, chunk_size=16,
        num_attention_heads=4, num_key_value_heads=1, head_dim=8, intermediate_size=64,
        n_routed_experts=16, num_experts_per_tok=4, n_group=1, topk_group=1, norm_topk_prob=False,
        routed_scaling_factor=1.0, moe_intermediate_size=12, moe_shared_expert_intermediate_size=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    ("nemotron_h", "moe_e2e"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=64, pattern="MEM*E-",
        mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=32,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
        routed_scaling_factor=2.5, moe_intermediate_size=16, moe_shared_expert_intermediate_size=32,
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"],
        max_position_embeddings=8192),
    # The bench preset's shape with an MoE block in place of every MLP (Nemotron 3 Nano's routing:
    # one group, norm_topk_prob, routed_scaling_factor 2.5).
    ("nemotron_h", "moe_bench"): dict(
        vocab_size=16384, hidden_size=1024, pattern="MEMEM*EMEMEM*EME",
        mamba_num_heads=32, mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4, chunk_size=128,
        num_attention_heads=8, num_key_value_heads=2, head_dim=128, intermediate_size=2048,
        n_routed_experts=32, num_experts_per_tok=4, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, moe_intermediate_size=512, moe_shared_expert_intermediate_size=1024,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=32768),
    ("mamba2", "tiny"): dict(
        vocab_size=96, hidden_size=32, num_hidden_layers=4,
        num_heads=4, head_dim=16, n_groups=2, state_size=16, conv_kernel=4, chunk_size=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2),
    ("mamba2", "default"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=128, num_hidden_layers=8,
        num_heads=8, head_dim=32, n_groups=2, state_size=32, conv_kernel=4, chunk_size=64,
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"]),
    ("mamba2", "e2e"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=64, num_hidden_layers=3,
        num_heads=8, head_dim=16, n_groups=4, state_size=16, conv_kernel=4, chunk_size=16,
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"]),
    ("mamba2", "bench"): dict(
        vocab_size=16384, hidden_size=1024, num_hidden_layers=14,
        num_heads=32, head_dim=64, n_groups=8, state_size=128, conv_kernel=4, chunk_size=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # Bamba (BambaForCausalLM): pattern as nemotron_h's without MLP layers (M = Mamba2 mixer,
    # * = attention); every decoder layer also has a SwiGLU feed-forward block. Attention
    # head_dim is hidden_size / num_attention_heads, RoPE on half of it (partial_rotary_factor 0.5).
    ("bamba", "tiny"): dict(
        vocab_size=96, hidden_size=32, pattern="M*MM",
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, mlp_bias=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    ("bamba", "tiny2"): dict(
        vocab_size=96, hidden_size=32, pattern="*MM*M",
        mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
        num_attention_heads=4, num_key_value_heads=1, intermediate_size=48, mlp_bias=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    ("bamba", "e2e"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=64, pattern="M*MM",
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=32,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, mlp_bias=False,
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"],
        max_position_embeddings=8192),
    ("bamba", "bench"): dict(
        vocab_size=16384, hidden_size=1024, pattern="MM*MM*M",
        mamba_n_heads=32, mamba_d_head=64, mamba_n_groups=8, mamba_d_state=128, mamba_d_conv=4, mamba_chunk_size=128,
        num_attention_heads=8, num_key_value_heads=2, intermediate_size=2048, mlp_bias=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=32768),
    # GraniteMoeHybrid (GraniteMoeHybridForCausalLM): pattern as bamba's; every decoder layer has
    # a shared SwiGLU MLP and, when num_local_experts > 0, a top-k MoE block beside it.
    # position_embedding_type None (no positions, as Granite 4.0-H MoE) or "rope".
    ("granitemoehybrid", "tiny"): dict(
        vocab_size=96, hidden_size=32, pattern="M*MM",
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=16, shared_intermediate_size=24,
        position_embedding_type=None, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.0078125, logits_scaling=6.0, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    # Dense (no experts), RoPE, tied head: the shape of Granite 4.0 H-Micro.
    ("granitemoehybrid", "tiny2"): dict(
        vocab_size=96, hidden_size=32, pattern="*MM*",
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=0, num_experts_per_tok=0, intermediate_size=0, shared_intermediate_size=48,
        position_embedding_type="rope", embedding_multiplier=8.0, residual_multiplier=0.5,
        attention_multiplier=0.125, logits_scaling=2.0, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    ("granitemoehybrid", "e2e"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=64, pattern="MM*M",
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=8, shared_intermediate_size=32,
        position_embedding_type=None, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.0078125, logits_scaling=6.0, tie_word_embeddings=False,
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"],
        max_position_embeddings=8192),
    ("granitemoehybrid", "bench"): dict(
        vocab_size=16384, hidden_size=1024, pattern="MM*MM*",
        mamba_n_heads=32, mamba_d_head=64, mamba_n_groups=8, mamba_d_state=128, mamba_d_conv=4, mamba_chunk_size=128,
        num_attention_heads=8, num_key_value_heads=2,
        num_local_experts=32, num_experts_per_tok=4, intermediate_size=512, shared_intermediate_size=1024,
        position_embedding_type=None, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.0078125, logits_scaling=6.0, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=32768),
    # Falcon-H1 (FalconH1ForCausalLM): every decoder layer runs a Mamba2 mixer and attention side by
    # side on the same normed input, then a SwiGLU MLP. Every multiplier differs from 1 and from the
    # others, so an engine that drops or swaps one is caught; falcon_h1_weights folds them into the
    # init. head_dim=None leaves the field out of config.json (transformers then uses
    # hidden_size / num_attention_heads). mamba_d_ssm (= mamba_n_heads * mamba_d_head) is the
    # mixer's inner width, whatever mamba_expand says.
    ("falcon_h1", "tiny"): dict(
        vocab_size=96, hidden_size=32, num_hidden_layers=3,
        mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, mamba_rms_norm=False, mamba_norm_before_gate=True,
        num_attention_heads=4, num_key_value_heads=2, head_dim=None, rope_theta=1e11,
        intermediate_size=64, mlp_bias=True, tie_word_embeddings=False,
        embedding_multiplier=5.5, lm_head_multiplier=0.0390625, key_multiplier=0.390625,
        attention_in_multiplier=1.25, attention_out_multiplier=0.9375, ssm_in_multiplier=1.5,
        ssm_out_multiplier=0.2357, ssm_multipliers=[0.3535, 0.25, 0.707, 0.5, 1.75], mlp_multipliers=[0.8839, 0.5859],
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    # Tied head, head_dim 12 != hidden/heads 16, mamba_d_ssm 48 != mamba_expand * hidden 64, the gated
    # RMSNorm in the mixer (normed before the gate, Falcon's default), RoPE theta 1e4 (every pair turns).
    ("falcon_h1", "tiny2"): dict(
        vocab_size=96, hidden_size=32, num_hidden_layers=3,
        mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=True,
        num_attention_heads=2, num_key_value_heads=1, head_dim=12, rope_theta=10000.0,
        intermediate_size=48, mlp_bias=False, tie_word_embeddings=True,
        embedding_multiplier=3.0, lm_head_multiplier=0.125, key_multiplier=0.6,
        attention_in_multiplier=0.8, attention_out_multiplier=1.6, ssm_in_multiplier=0.7,
        ssm_out_multiplier=0.45, ssm_multipliers=[1.3, 0.55, 0.85, 1.15, 0.65], mlp_multipliers=[1.4, 0.35],
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    # The gated RMSNorm over 2 groups, applied after the gate (mamba_norm_before_gate false); MHA
    # (8 KV heads), head_dim given and equal to hidden/heads, RoPE theta 1e6, untied.
    ("falcon_h1", "tiny3"): dict(
        vocab_size=96, hidden_size=32, num_hidden_layers=2,
        mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=False,
        num_attention_heads=4, num_key_value_heads=4, head_dim=8, rope_theta=1e6,
        intermediate_size=48, mlp_bias=False, tie_word_embeddings=False,
        embedding_multiplier=2.5, lm_head_multiplier=0.0625, key_multiplier=1.3,
        attention_in_multiplier=0.75, attention_out_multiplier=1.15, ssm_in_multiplier=0.55,
        ssm_out_multiplier=0.8, ssm_multipliers=[0.9, 1.2, 0.4, 1.6, 0.3], mlp_multipliers=[0.65, 1.45],
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096),
    ("falcon_h1", "e2e"): dict(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=64, num_hidden_layers=4,
        mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=32, mamba_rms_norm=True, mamba_norm_before_gate=True,
        num_attention_heads=4, num_key_value_heads=2, head_dim=None, rope_theta=1e11,
        intermediate_size=64, mlp_bias=False, tie_word_embeddings=False,
        embedding_multiplier=5.5, lm_head_multiplier=0.0390625, key_multiplier=0.390625,
        attention_in_multiplier=1.25, attention_out_multiplier=0.9375, ssm_in_multiplier=1.5,
        ssm_out_multiplier=0.2357, ssm_multipliers=[0.3535, 0.25, 0.707, 0.5, 1.75], mlp_multipliers=[0.8839, 0.5859],
        pad_token_id=BYTE_VOCAB["pad"], bos_token_id=BYTE_VOCAB["bos"], eos_token_id=BYTE_VOCAB["eos"],
        max_position_embeddings=8192),
    # Falcon-H1-0.5B's layer shapes (hidden 1024, GQA 8/2 x 64, Mamba2 24 x 64 = d_ssm 1536, n_groups 1,
    # d_state 128, SwiGLU 2048) in 8 layers with a 16K vocabulary.
    ("falcon_h1", "bench"): dict(
        vocab_size=16384, hidden_size=1024, num_hidden_layers=8,
        mamba_d_ssm=1536, mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=128, mamba_rms_norm=False, mamba_norm_before_gate=True,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, rope_theta=1e11,
        intermediate_size=2048, mlp_bias=False, tie_word_embeddings=False,
        embedding_multiplier=5.5, lm_head_multiplier=0.0390625, key_multiplier=0.390625,
        attention_in_multiplier=1.25, attention_out_multiplier=0.9375, ssm_in_multiplier=1.5,
        ssm_out_multiplier=0.2357, ssm_multipliers=[0.3535, 0.25, 0.707, 0.5, 1.75], mlp_multipliers=[0.8839, 0.5859],
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=32768),
}

PATTERN_TO_BLOCK = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}

TIME_STEP_MIN, TIME_STEP_MAX, TIME_STEP_FLOOR = 0.001, 0.1, 1e-4
LAYER_NORM_EPS = 1e-5


# ----------------------------------------------------------------------------- config

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
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "dtype": dtype_name,
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "hybrid_override_pattern": pattern,
        "layers_block_type": [PATTERN_TO_BLOCK[c] for c in pattern],
        "num_hidden_layers": len(pattern),
        "tie_word_embeddings": False,
        "pad_token_id": p["pad_token_id"],
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
        # attention ('*')
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"],
        "head_dim": p["head_dim"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": p["max_position_embeddings"],
        "sliding_window": None,
        # MLP ('-')
        "intermediate_size": p["intermediate_size"],
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
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
        "time_step_min": TIME_STEP_MIN,
        "time_step_max": TIME_STEP_MAX,
        "time_step_floor": TIME_STEP_FLOOR,
        "time_step_limit": [0.0, _INF],
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
    return {
        "n_routed_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": p["moe_intermediate_size"],
        "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": p["moe_shared_expert_intermediate_size"],
        "moe_shared_expert_overlap": True,
        "moe_latent_size": None,
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
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "dtype": dtype_name,
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "num_hidden_layers": p["num_hidden_layers"],
        "tie_word_embeddings": True,
        "pad_token_id": p["pad_token_id"],
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
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
        "time_step_min": TIME_STEP_MIN,
        "time_step_max": TIME_STEP_MAX,
        "time_step_floor": TIME_STEP_FLOOR,
        "time_step_limit": [0.0, _INF],
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "residual_in_fp32": True,
        "rescale_prenorm_residual": False,
        "initializer_range": 0.1,
        "use_cache": True,
    }


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
        "time_step_limit": [0.0, _INF],
    }


def bamba_config(p, dtype_name):
    """config.json dict for a Bamba preset `p`: the fields BambaConfig.save_pretrained writes
    (transformers 5.23), without transformers_version."""
    expand = _check_hybrid_preset(p)
    pattern = p["pattern"]
    cfg = {
        "architectures": ["BambaForCausalLM"],
        "model_type": "bamba",
        "dtype": dtype_name,
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "num_hidden_layers": len(pattern),
        "attn_layer_indices": [i for i, c in enumerate(pattern) if c == "*"],
        "tie_word_embeddings": False,
        "pad_token_id": p["pad_token_id"],
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
        # attention: head_dim = hidden_size / num_attention_heads, RoPE on its first half
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": p["max_position_embeddings"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        # SwiGLU feed-forward of every layer
        "intermediate_size": p["intermediate_size"],
        "hidden_act": "silu",
        "mlp_bias": p["mlp_bias"],
        **_mamba_fields(p, expand),
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "num_logits_to_keep": 1,
        "z_loss_coefficient": 0.0,
        "use_cache": True,
    }
    return cfg


# GraniteMoeHybridConfig.layer_types as transformers 5.23 writes them (it reads the Hub's
# legacy "mamba" / "attention" too, and writes these back).
GRANITE_LAYER_TYPES = {"M": "linear_attention", "*": "full_attention"}


def granitemoehybrid_config(p, dtype_name):
    """config.json dict for a GraniteMoeHybrid preset `p`: the fields
    GraniteMoeHybridConfig.save_pretrained writes (transformers 5.23), without transformers_version."""
    expand = _check_hybrid_preset(p)
    pattern = p["pattern"]
    experts, top_k = p["num_local_experts"], p["num_experts_per_tok"]
    if experts and not 0 < top_k <= experts:
        raise ValueError("num_experts_per_tok must be in [1, num_local_experts]")
    if p["position_embedding_type"] not in (None, "rope"):
        raise ValueError("position_embedding_type must be None or 'rope'")
    cfg = {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "dtype": dtype_name,
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "num_hidden_layers": len(pattern),
        "layer_types": [GRANITE_LAYER_TYPES[c] for c in pattern],
        "tie_word_embeddings": p["tie_word_embeddings"],
        "pad_token_id": p["pad_token_id"],
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
        "embedding_multiplier": p["embedding_multiplier"],
        "residual_multiplier": p["residual_multiplier"],
        "attention_multiplier": p["attention_multiplier"],
        "logits_scaling": p["logits_scaling"],
        # attention: head_dim = hidden_size / num_attention_heads, scores scaled by attention_multiplier
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": p["max_position_embeddings"],
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
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    return cfg


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
    cfg = {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        "dtype": dtype_name,
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "num_hidden_layers": p["num_hidden_layers"],
        "tie_word_embeddings": p["tie_word_embeddings"],
        "pad_token_id": p["pad_token_id"],
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
        **{k: (list(p[k]) if isinstance(p[k], list) else p[k]) for k in FALCON_H1_MULTIPLIERS},
        # attention, beside the mixer in every layer: RoPE on the full head_dim
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"],
        **({"head_dim": p["head_dim"]} if p["head_dim"] is not None else {}),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": p["max_position_embeddings"],
        "rope_parameters": {"rope_type": "default", "rope_theta": p["rope_theta"]},
        # SwiGLU MLP of every layer
        "intermediate_size": p["intermediate_size"],
        "hidden_act": "silu",
        "mlp_bias": p["mlp_bias"],
        "projectors_bias": False,
        # Mamba2 mixer of every layer
        "mamba_d_ssm": p["mamba_d_ssm"],
        "mamba_n_heads": p["mamba_n_heads"],
        "mamba_d_head": p["mamba_d_head"],
        "mamba_n_groups": p["mamba_n_groups"],
        "mamba_d_state": p["mamba_d_state"],
        "mamba_d_conv": p["mamba_d_conv"],
        "mamba_expand": p["mamba_expand"],
        "mamba_chunk_size": p["mamba_chunk_size"],
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_rms_norm": p["mamba_rms_norm"],
        "mamba_norm_before_gate": p["mamba_norm_before_gate"],
        "time_step_limit": [0.0, _INF],
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "num_logits_to_keep": 1,
        "use_cache": True,
    }
    return cfg


# ----------------------------------------------------------------------------- random

class _Stream:
    """Random numbers for one tensor: a pure function of (seed, name), platform independent."""

    def __init__(self, seed, name):
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        self._bits = np.random.PCG64(int.from_bytes(digest[:16], "little"))

    def _raw(self, n):
        return self._bits.random_raw(n).astype(np.uint64)

    def normal(self, shape, std, block=1 << 20):
        """Irwin-Hall(12) approximation of N(0, std^2), values in (-6 std, 6 std), float32."""
        n = int(np.prod(shape, dtype=np.int64))
        out = np.empty(n, dtype=np.float32)
        for lo in range(0, n, block):  # blocks only bound memory; the stream is sequential
            m = min(block, n - lo)
            raw = self._raw(3 * m)  # 3 x 64 bits = twelve 16-bit uniforms per value
            acc = np.zeros(m, dtype=np.int64)
            for r in range(3):
                words = raw[r::3]
                for s in range(4):
                    acc += ((words >> np.uint64(16 * s)) & np.uint64(0xFFFF)).astype(np.int64)
            # sum of 12 U{0..65535}: mean 12*65535/2, variance 12*(2^32-1)/12 ~= 2^32
            z = (acc - 393210).astype(np.float64) / 65536.0
            out[lo:lo + m] = (z * std).astype(np.float32)
        return out.reshape(shape)

    def uniform(self, shape, lo, hi):
        """U(lo, hi) from 24-bit dyadic midpoints, float64 (callers cast)."""
        n = int(np.prod(shape, dtype=np.int64))
        k = (self._raw(n) >> np.uint64(40)).astype(np.float64)
        return (lo + (hi - lo) * (k + 0.5) / float(1 << 24)).reshape(shape)


def _softplus_inv(dt):
    # softplus(x) = log(1 + e^x)  =>  x = dt + log(-expm1(-dt))
    return dt + math.log(-math.expm1(-dt))


# ----------------------------------------------------------------------------- weights

def _mamba_mixer(t, rng, prefix, hidden, n_heads, head_dim, n_groups, d_state, d_conv, n_layers, out_scale=1.0):
    """Mamba2 mixer tensors, shared by every arch. in_proj rows: [z | x | B | C | dt].
    out_scale multiplies out_proj's standard deviation (granitemoehybrid: 1 / residual_multiplier)."""
    inter = n_heads * head_dim
    conv_dim = inter + 2 * n_groups * d_state
    proj = inter + conv_dim + n_heads
    t[prefix + "in_proj.weight"] = rng(prefix + "in_proj.weight").normal((proj, hidden), hidden ** -0.5)
    bound = d_conv ** -0.5
    t[prefix + "conv1d.weight"] = rng(prefix + "conv1d.weight").uniform(
        (conv_dim, 1, d_conv), -bound, bound).astype(np.float32)
    t[prefix + "conv1d.bias"] = rng(prefix + "conv1d.bias").uniform((conv_dim,), -bound, bound).astype(np.float32)
    u = rng(prefix + "A_log").uniform((n_heads,), 1.0, 16.0)
    t[prefix + "A_log"] = np.array([math.log(a) for a in u], dtype=np.float32)
    u = rng(prefix + "dt_bias").uniform((n_heads,), math.log(TIME_STEP_MIN), math.log(TIME_STEP_MAX))
    t[prefix + "dt_bias"] = np.array(
        [_softplus_inv(max(math.exp(v), TIME_STEP_FLOOR)) for v in u], dtype=np.float32)
    t[prefix + "D"] = 1.0 + rng(prefix + "D").normal((n_heads,), 0.1)
    t[prefix + "norm.weight"] = 1.0 + rng(prefix + "norm.weight").normal((inter,), 0.1)
    t[prefix + "out_proj.weight"] = rng(prefix + "out_proj.weight").normal(
        (hidden, inter), (inter * n_layers) ** -0.5 * out_scale)


def _attention(t, rng, pre, h, nq, nkv, hd, n_layers, out_scale=1.0):
    t[pre + "q_proj.weight"] = rng(pre + "q_proj.weight").normal((nq * hd, h), h ** -0.5)
    t[pre + "k_proj.weight"] = rng(pre + "k_proj.weight").normal((nkv * hd, h), h ** -0.5)
    t[pre + "v_proj.weight"] = rng(pre + "v_proj.weight").normal((nkv * hd, h), h ** -0.5)
    t[pre + "o_proj.weight"] = rng(pre + "o_proj.weight").normal((h, nq * hd), (nq * hd * n_layers) ** -0.5 * out_scale)


def nemotron_h_weights(cfg, seed):
    """name -> float32 array, in the names and shapes transformers' save_pretrained writes."""
    rng = lambda name: _Stream(seed, name)  # noqa: E731
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    pattern = cfg["hybrid_override_pattern"]
    n_layers = len(pattern)
    t = {}
    t["backbone.embeddings.weight"] = rng("backbone.embeddings.weight").normal((v, h), h ** -0.5)
    for i, kind in enumerate(pattern):
        pre = f"backbone.layers.{i}."
        t[pre + "norm.weight"] = 1.0 + rng(pre + "norm.weight").normal((h,), 0.1)
        mix = pre + "mixer."
        if kind == "M":
            _mamba_mixer(t, rng, mix, h, cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["n_groups"],
                         cfg["ssm_state_size"], cfg["conv_kernel"], n_layers)
        elif kind == "*":
            _attention(t, rng, mix, h, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                       n_layers)
        elif kind == "-":
            f = cfg["intermediate_size"]
            t[mix + "up_proj.weight"] = rng(mix + "up_proj.weight").normal((f, h), h ** -0.5)
            t[mix + "down_proj.weight"] = rng(mix + "down_proj.weight").normal((h, f), (f * n_layers) ** -0.5)
        else:  # 'E'
            _nemotron_moe(t, rng, mix, cfg, n_layers)
    t["backbone.norm_f.weight"] = 1.0 + rng("backbone.norm_f.weight").normal((h,), 0.1)
    t["lm_head.weight"] = rng("lm_head.weight").normal((v, h), h ** -0.5)
    return t


# Router weights ~ N(0, (ROUTER_GAIN^2) / hidden): router logits of a normalised hidden state
# have standard deviation ~ROUTER_GAIN, so the top-k choice varies from token to token and its
# margins stay well above rounding (make_golden.py records both).
ROUTER_GAIN = 2.0


# Nemotron-H's router correction bias (e_score_correction_bias) ~ N(0, NEMOTRON_BIAS_STD^2): the
# sigmoid scores of router logits of std ~ROUTER_GAIN spread over (0, 1) with neighbours ~0.1 apart
# in the top-k, so a bias of this size changes a fair share of the choices (make_golden.py records
# how many) without deciding them all.
NEMOTRON_BIAS_STD = 0.1


def _nemotron_moe(t, rng, mix, cfg, n_layers):
    """An 'E' block's tensors under `mix` (backbone.layers.L.mixer.): the router (gate.weight,
    gate.e_score_correction_bias), per-expert experts.E.{up,down}_proj.weight and
    shared_experts.{up,down}_proj.weight, as save_pretrained writes them. Routers
    ~ N(0, ROUTER_GAIN^2 / hidden); expert down projections over the routed weights' typical sum
    (routed_scaling_factor, or top_k * 0.5 * routed_scaling_factor without norm_topk_prob), so the
    routed and shared halves of the block have the scale of an MLP."""
    h, e, f, s = (cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"],
                  cfg["moe_shared_expert_intermediate_size"])
    routed_sum = cfg["routed_scaling_factor"] * (1.0 if cfg["norm_topk_prob"] else 0.5 * cfg["num_experts_per_tok"])
    t[mix + "gate.weight"] = rng(mix + "gate.weight").normal((e, h), ROUTER_GAIN * h ** -0.5)
    t[mix + "gate.e_score_correction_bias"] = rng(mix + "gate.e_score_correction_bias").normal(
        (e,), NEMOTRON_BIAS_STD)
    for j in range(e):
        ex = f"{mix}experts.{j}."
        t[ex + "up_proj.weight"] = rng(ex + "up_proj.weight").normal((f, h), h ** -0.5)
        t[ex + "down_proj.weight"] = rng(ex + "down_proj.weight").normal(
            (h, f), (f * n_layers) ** -0.5 / routed_sum)
    sh = mix + "shared_experts."
    t[sh + "up_proj.weight"] = rng(sh + "up_proj.weight").normal((s, h), h ** -0.5)
    t[sh + "down_proj.weight"] = rng(sh + "down_proj.weight").normal((h, s), (s * n_layers) ** -0.5)


def mamba2_weights(cfg, seed):
    """name -> float32 array for Mamba2ForCausalLM (tied head: no lm_head.weight)."""
    rng = lambda name: _Stream(seed, name)  # noqa: E731
    h, v, n_layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    t = {}
    t["backbone.embeddings.weight"] = rng("backbone.embeddings.weight").normal((v, h), h ** -0.5)
    for i in range(n_layers):
        pre = f"backbone.layers.{i}."
        t[pre + "norm.weight"] = 1.0 + rng(pre + "norm.weight").normal((h,), 0.1)
        _mamba_mixer(t, rng, pre + "mixer.", h, cfg["num_heads"], cfg["head_dim"], cfg["n_groups"],
                     cfg["state_size"], cfg["conv_kernel"], n_layers)
    t["backbone.norm_f.weight"] = 1.0 + rng("backbone.norm_f.weight").normal((h,), 0.1)
    return t


def _hybrid_mixer(t, rng, pre, kind, cfg, n_layers, out_scale=1.0):
    """Layer `pre`'s mixer: model.layers.L.mamba.* ('M') or model.layers.L.self_attn.* ('*')."""
    h = cfg["hidden_size"]
    if kind == "M":
        _mamba_mixer(t, rng, pre + "mamba.", h, cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_n_groups"],
                     cfg["mamba_d_state"], cfg["mamba_d_conv"], n_layers, out_scale)
    else:
        nq = cfg["num_attention_heads"]
        _attention(t, rng, pre + "self_attn.", h, nq, cfg["num_key_value_heads"], h // nq, n_layers, out_scale)


def _hybrid_pattern_of(cfg):
    """'M' / '*' per decoder layer, from a bamba or granitemoehybrid config dict."""
    if cfg["model_type"] == "bamba":
        return "".join("*" if i in cfg["attn_layer_indices"] else "M" for i in range(cfg["num_hidden_layers"]))
    inverse = {v: k for k, v in GRANITE_LAYER_TYPES.items()}
    return "".join(inverse[x] for x in cfg["layer_types"])


def bamba_weights(cfg, seed):
    """name -> float32 array for BambaForCausalLM (save_pretrained names: model.*, lm_head.weight).
    MLP biases (mlp_bias) ~ N(0, 0.1^2), so that a kernel that drops one is caught."""
    rng = lambda name: _Stream(seed, name)  # noqa: E731
    h, v, f = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    pattern = _hybrid_pattern_of(cfg)
    n_layers = len(pattern)
    t = {}
    t["model.embed_tokens.weight"] = rng("model.embed_tokens.weight").normal((v, h), h ** -0.5)
    for i, kind in enumerate(pattern):
        pre = f"model.layers.{i}."
        t[pre + "input_layernorm.weight"] = 1.0 + rng(pre + "input_layernorm.weight").normal((h,), 0.1)
        _hybrid_mixer(t, rng, pre, kind, cfg, n_layers)
        t[pre + "pre_ff_layernorm.weight"] = 1.0 + rng(pre + "pre_ff_layernorm.weight").normal((h,), 0.1)
        ff = pre + "feed_forward."
        t[ff + "gate_proj.weight"] = rng(ff + "gate_proj.weight").normal((f, h), h ** -0.5)
        t[ff + "up_proj.weight"] = rng(ff + "up_proj.weight").normal((f, h), h ** -0.5)
        t[ff + "down_proj.weight"] = rng(ff + "down_proj.weight").normal((h, f), (f * n_layers) ** -0.5)
        if cfg["mlp_bias"]:
            for name, n in (("gate_proj", f), ("up_proj", f), ("down_proj", h)):
                t[ff + name + ".bias"] = rng(ff + name + ".bias").normal((n,), 0.1)
    t["model.final_layernorm.weight"] = 1.0 + rng("model.final_layernorm.weight").normal((h,), 0.1)
    t["lm_head.weight"] = rng("lm_head.weight").normal((v, h), h ** -0.5)
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
    rng = lambda name: _Stream(seed, name)  # noqa: E731
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    pattern = _hybrid_pattern_of(cfg)
    n_layers = len(pattern)
    tied = cfg["tie_word_embeddings"]
    input_gain = cfg["embedding_multiplier"] * cfg["logits_scaling"] if tied else 1.0
    out_scale = input_gain / cfg["residual_multiplier"]
    s, f, n_exp = cfg["shared_intermediate_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    t = {}
    emb_std = h ** -0.5 * (cfg["logits_scaling"] if tied else 1.0 / cfg["embedding_multiplier"])
    t["model.embed_tokens.weight"] = rng("model.embed_tokens.weight").normal((v, h), emb_std)
    for i, kind in enumerate(pattern):
        pre = f"model.layers.{i}."
        t[pre + "input_layernorm.weight"] = 1.0 + rng(pre + "input_layernorm.weight").normal((h,), 0.1)
        _hybrid_mixer(t, rng, pre, kind, cfg, n_layers, out_scale)
        t[pre + "post_attention_layernorm.weight"] = 1.0 + rng(pre + "post_attention_layernorm.weight").normal(
            (h,), 0.1)
        mlp = pre + "shared_mlp."
        t[mlp + "input_linear.weight"] = rng(mlp + "input_linear.weight").normal((2 * s, h), h ** -0.5)
        t[mlp + "output_linear.weight"] = rng(mlp + "output_linear.weight").normal(
            (h, s), (s * n_layers) ** -0.5 * out_scale)
        if n_exp:
            moe = pre + "block_sparse_moe."
            t[moe + "router.layer.weight"] = rng(moe + "router.layer.weight").normal(
                (n_exp, h), ROUTER_GAIN * h ** -0.5)
            t[moe + "input_linear.weight"] = rng(moe + "input_linear.weight").normal((n_exp, 2 * f, h), h ** -0.5)
            t[moe + "output_linear.weight"] = rng(moe + "output_linear.weight").normal(
                (n_exp, h, f), (f * n_layers) ** -0.5 * out_scale)
    t["model.norm.weight"] = 1.0 + rng("model.norm.weight").normal((h,), 0.1)
    if not tied:
        t["lm_head.weight"] = rng("lm_head.weight").normal((v, h), h ** -0.5 * cfg["logits_scaling"])
    return t


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
    MLP biases (mlp_bias) ~ N(0, 0.1^2) after their multipliers.
    """
    rng = lambda name: _Stream(seed, name)  # noqa: E731
    h, v, f, n_layers = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    tied = cfg["tie_word_embeddings"]
    gain = cfg["embedding_multiplier"] / cfg["lm_head_multiplier"] if tied else 1.0
    d_ssm, n_heads, groups = cfg["mamba_d_ssm"], cfg["mamba_n_heads"], cfg["mamba_n_groups"]
    gs = groups * cfg["mamba_d_state"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nq
    a_in, s_in = cfg["attention_in_multiplier"], cfg["ssm_in_multiplier"]
    gate_m, down_m = cfg["mlp_multipliers"]
    t = {}
    emb_std = h ** -0.5 / (cfg["lm_head_multiplier"] if tied else cfg["embedding_multiplier"])
    t["model.embed_tokens.weight"] = rng("model.embed_tokens.weight").normal((v, h), emb_std)
    # in_proj rows [z | x | B | C | dt] and their ssm_multipliers entries
    seg_rows = np.repeat(np.arange(5), [d_ssm, d_ssm, gs, gs, n_heads])
    row_std = h ** -0.5 / (s_in * np.asarray(cfg["ssm_multipliers"], dtype=np.float64)[seg_rows])
    for i in range(n_layers):
        pre = f"model.layers.{i}."
        t[pre + "input_layernorm.weight"] = 1.0 + rng(pre + "input_layernorm.weight").normal((h,), 0.1)
        mix = pre + "mamba."
        _mamba_mixer(t, rng, mix, h, n_heads, cfg["mamba_d_head"], groups, cfg["mamba_d_state"],
                     cfg["mamba_d_conv"], n_layers, gain / cfg["ssm_out_multiplier"])
        z = rng(mix + "in_proj.weight").normal((2 * d_ssm + 2 * gs + n_heads, h), 1.0)  # exact: k / 65536
        t[mix + "in_proj.weight"] = (z.astype(np.float64) * row_std[:, None]).astype(np.float32)
        if not cfg["mamba_rms_norm"]:
            del t[mix + "norm.weight"]
        att = pre + "self_attn."
        t[att + "q_proj.weight"] = rng(att + "q_proj.weight").normal((nq * hd, h), h ** -0.5 / a_in)
        t[att + "k_proj.weight"] = rng(att + "k_proj.weight").normal(
            (nkv * hd, h), h ** -0.5 / (a_in * cfg["key_multiplier"]))
        t[att + "v_proj.weight"] = rng(att + "v_proj.weight").normal((nkv * hd, h), h ** -0.5 / a_in)
        t[att + "o_proj.weight"] = rng(att + "o_proj.weight").normal(
            (h, nq * hd), (nq * hd * n_layers) ** -0.5 * gain / cfg["attention_out_multiplier"])
        t[pre + "pre_ff_layernorm.weight"] = 1.0 + rng(pre + "pre_ff_layernorm.weight").normal((h,), 0.1)
        ff = pre + "feed_forward."
        t[ff + "gate_proj.weight"] = rng(ff + "gate_proj.weight").normal((f, h), h ** -0.5 / gate_m)
        t[ff + "up_proj.weight"] = rng(ff + "up_proj.weight").normal((f, h), h ** -0.5)
        t[ff + "down_proj.weight"] = rng(ff + "down_proj.weight").normal((h, f), (f * n_layers) ** -0.5 * gain / down_m)
        if cfg["mlp_bias"]:
            for name, n, std in (("gate_proj", f, 0.1 / gate_m), ("up_proj", f, 0.1),
                                 ("down_proj", h, 0.1 * gain / down_m)):
                t[ff + name + ".bias"] = rng(ff + name + ".bias").normal((n,), std)
    t["model.final_layernorm.weight"] = 1.0 + rng("model.final_layernorm.weight").normal((h,), 0.1)
    if not tied:
        t["lm_head.weight"] = rng("lm_head.weight").normal((v, h), h ** -0.5 / cfg["lm_head_multiplier"])
    return t


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
}
PRESET_NAMES = ["tiny", "tiny2", "tiny3", "default", "e2e", "bench", "1b", "moe_tiny", "moe_tiny2", "moe_e2e",
                "moe_bench"]


def build(arch, preset, seed, dtype="fp32"):
    """Returns (config dict, name -> float32 array) for the given model. Pure function."""
    if (arch, preset) not in PRESETS:
        raise ValueError(f"unknown arch/preset {arch}/{preset}")
    p = PRESETS[(arch, preset)]
    dtype_name = DTYPES[dtype][0]
    config_fn, weights_fn = ARCHS[arch]
    cfg = config_fn(p, dtype_name)
    weights = weights_fn(cfg, seed)
    if preset in ("default", "e2e", "moe_e2e"):
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
