#!/usr/bin/env python3
"""A scaled-down model with exactly the features of a published checkpoint's config.json.

Usage:
    python3 tools/scale_config.py tests/fixtures/public_configs/bamba/Bamba-9B.json --seed 11 --out DIR

Reads a config of the corpus (tests/fixtures/public_configs, SOURCES.md there) and writes to DIR a
config.json that keeps every key and value of the original except the sizes, and a
model.safetensors of random weights under the checkpoint's own tensor names. Kept as written:
the layer kinds and their order (each run of equal kinds shortened to one layer, the pattern cut
after every kind has appeared, then ended on the original's last kind), positional encoding and
its fraction, biases, multipliers, norm epsilon, tying, every legacy or unused field (the point is
to feed the engine what the publisher wrote). Scaled: hidden 64, Mamba2 heads of 16 (n_groups kept
when it divides the heads), d_state 16, attention heads 4 with the original's query/KV ratio,
intermediate sizes in the original's ratio to hidden, vocab 256, chunk 16 (the golden prompts'
grid). The special token ids become pad 0, bos 1, eos 2 (the fixture prompts draw from
[3, vocab)); they are not features, and the engine refuses ids outside the vocabulary.
With --byte_vocab the vocabulary is instead the end-to-end suite's: 256 bytes, pad 256, bos 257,
eos 258 (vocab 259, as tests/fixtures/models/*_e2e), so tests/e2e can serve the model.

The weights come from tools/gen_model.py's per-family generators (numpy, seeded, byte-for-byte
reproducible without torch, so tools/check_fixtures.py can check them exactly) and carry the
names transformers' save_pretrained writes, which are the published checkpoints' names for the
families transformers hosts (Bamba: model.*, lm_head.weight). The generators read a few fields
the published files leave out; they get transformers' defaults here (FAMILY_DEFAULTS), in a copy
that is not written.

Families: bamba. A config of another family is refused by name (not scaled yet).
"""

import argparse
import copy
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model  # noqa: E402

HIDDEN = 64
SSM_HEAD_DIM = 16
SSM_STATE = 16
ATTENTION_HEADS = 4
VOCAB = 256
CHUNK = 16
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# --byte_vocab: the end-to-end suite's byte vocabulary (tests/e2e/stack.cc's text prompts).
BYTE_VOCAB = 259
BYTE_SPECIAL_IDS = {"pad_token_id": 256, "bos_token_id": 257, "eos_token_id": 258}

# Fields a generator reads that a published config may leave out: transformers 5.23's defaults
# (BambaConfig). Used for the weights only; config.json keeps what the publisher wrote.
FAMILY_DEFAULTS = {
    "bamba": {"mlp_bias": False, "mamba_d_conv": 4, "mamba_n_groups": 1, "mamba_expand": 2},
}


def reduce_pattern(kinds):
    """Kinds per layer -> the shortest pattern with every kind, the original order, and its first
    and last kinds: runs of equal kinds become one layer, cut after every kind has appeared,
    then ended on the original's last kind."""
    runs = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    seen, cut = set(), len(runs)
    for i, k in enumerate(runs):
        seen.add(k)
        if seen == set(runs):
            cut = i + 1
            break
    out = runs[:cut]
    if out[-1] != kinds[-1]:
        out.append(kinds[-1])
    return out


def _scale_ratio(value, original_hidden):
    """A size in the same ratio to HIDDEN as `value` to the original hidden size, rounded to 8."""
    return max(8, int(round(value * HIDDEN / original_hidden / 8.0)) * 8)


def _scale_attention(cfg, original, head_dim_field=None):
    heads, kv = original["num_attention_heads"], original.get("num_key_value_heads") or original["num_attention_heads"]
    if heads % kv != 0:
        raise ValueError(f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv})")
    group = heads // kv
    cfg["num_attention_heads"] = ATTENTION_HEADS
    if "num_key_value_heads" in cfg:
        cfg["num_key_value_heads"] = max(1, ATTENTION_HEADS // group)
    return HIDDEN // ATTENTION_HEADS


def scale_bamba(original):
    cfg = copy.deepcopy(original)
    n = original["num_hidden_layers"]
    attn = set(original.get("attn_layer_indices") or [])
    kinds = reduce_pattern(["*" if i in attn else "M" for i in range(n)])
    cfg["num_hidden_layers"] = len(kinds)
    cfg["attn_layer_indices"] = [i for i, k in enumerate(kinds) if k == "*"]
    h0 = original["hidden_size"]
    cfg["hidden_size"] = HIDDEN
    head_dim0 = h0 // original["num_attention_heads"]
    head_dim = _scale_attention(cfg, original)
    if "attn_rotary_emb" in cfg:  # the rotated width, in the same fraction of head_dim
        cfg["attn_rotary_emb"] = original["attn_rotary_emb"] * head_dim // head_dim0
    cfg["intermediate_size"] = _scale_ratio(original["intermediate_size"], h0)
    expand = original.get("mamba_expand", FAMILY_DEFAULTS["bamba"]["mamba_expand"])
    n_heads = expand * HIDDEN // SSM_HEAD_DIM
    groups = original.get("mamba_n_groups", FAMILY_DEFAULTS["bamba"]["mamba_n_groups"])
    if n_heads % groups != 0:
        raise ValueError(f"mamba_n_groups ({groups}) does not divide the scaled Mamba2 heads ({n_heads})")
    cfg["mamba_n_heads"] = n_heads
    if "mamba_d_head" in cfg and cfg["mamba_d_head"] != "auto":
        cfg["mamba_d_head"] = SSM_HEAD_DIM
    cfg["mamba_d_state"] = SSM_STATE
    cfg["mamba_chunk_size"] = CHUNK
    return cfg


SCALERS = {"bamba": scale_bamba}
# The name of the family's generator in tools/gen_model.py ARCHS.
GENERATOR_ARCH = {"bamba": "bamba"}


def scale(original, byte_vocab=False):
    """The scaled config dict (every key of `original`, sizes replaced)."""
    family = original.get("model_type")
    if family not in SCALERS:
        raise ValueError(f"model_type {family!r} is not scaled by this tool yet (families: {sorted(SCALERS)})")
    cfg = SCALERS[family](original)
    cfg["vocab_size"] = BYTE_VOCAB if byte_vocab else VOCAB
    for key, value in (BYTE_SPECIAL_IDS if byte_vocab else SPECIAL_IDS).items():
        if key in cfg and cfg[key] is not None:
            cfg[key] = value
    return cfg


def build(config_path, seed, byte_vocab=False):
    """(config dict to write, name -> float32 array) for the corpus config at `config_path`.
    Pure function of the file, the seed and byte_vocab."""
    with open(config_path) as f:
        original = json.load(f)
    cfg = scale(original, byte_vocab)
    family = cfg["model_type"]
    view = {**FAMILY_DEFAULTS.get(family, {}), **cfg}
    _, weights_fn = gen_model.ARCHS[GENERATOR_ARCH[family]]
    weights = weights_fn(view, seed)
    cfg["hybridserve_generator"] = {"tool": "tools/scale_config.py", "source": "/".join(os.path.normpath(config_path).split(os.sep)[-2:]),
                                    "seed": seed, "dtype": "fp32"}
    return cfg, dict(weights)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="a config.json of tests/fixtures/public_configs")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--byte_vocab", action="store_true", help="the end-to-end suite's vocabulary (259)")
    args = ap.parse_args(argv)
    cfg, weights = build(args.config, args.seed, args.byte_vocab)
    gen_model.write_model(args.out, cfg, weights, "fp32")
    params = sum(int(math.prod(w.shape)) for w in weights.values())
    print(f"{args.config} -> {args.out}: {cfg['num_hidden_layers']} layers, {params:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
