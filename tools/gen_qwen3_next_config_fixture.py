"""What transformers makes of Qwen3-Next / Qwen3.5 configs: engine/qwen3_next_config_test's reference.

For each case (a config dict), the fields transformers' config class resolves
(defaults applied) and the language model's tensors (name and shape) of the
model class on the meta device, both as the model holds them (experts fused)
and as save_pretrained writes them (one tensor per expert), written to
tests/fixtures/qwen3_next_config/transformers_reference.json. Run with the
venv that pins transformers (tools/requirements.txt):

  /work/venv-golden/bin/python tools/gen_qwen3_next_config_fixture.py
"""

import json
import pathlib

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.core_model_loading import revert_weight_conversion

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/qwen3_next_config/transformers_reference.json"
PUBLIC = ROOT / "tests/fixtures/public_configs"

# Only model_type: every field takes the config class's default.
CASES = {f"defaults_{t}": {"model_type": t} for t in
         ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe"]}
# full_attention_interval instead of layer_types; mlp_only_layers and a sparse step.
CASES["interval3_sparse2"] = {"model_type": "qwen3_next", "num_hidden_layers": 7, "full_attention_interval": 3,
                              "decoder_sparse_step": 2, "mlp_only_layers": [3], "hidden_size": 64,
                              "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 300,
                              "tie_word_embeddings": True}
# Image-text MoE: text_config with rope_parameters (mrope fields), a pattern
# that starts with attention, attention biases, tied at the top level.
CASES["image_text_moe_small"] = {
    "model_type": "qwen3_5_moe", "tie_word_embeddings": True, "vision_config": {"depth": 2},
    "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 64, "vocab_size": 300, "num_hidden_layers": 4,
                    "layer_types": ["full_attention", "linear_attention", "linear_attention", "linear_attention"],
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True,
                    "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 8,
                    "linear_value_head_dim": 12, "linear_conv_kernel_dim": 3, "num_experts": 5,
                    "num_experts_per_tok": 3, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40,
                    "rms_norm_eps": 1e-5, "mtp_num_hidden_layers": 1,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.5,
                                        "mrope_section": [1, 1, 2], "mrope_interleaved": True}}}


def text_config(config):
    return getattr(config, "text_config", config)


def resolve(config):
    t = text_config(config)
    rope = t.rope_parameters or {}
    out = {
        "text_model_type": t.model_type,
        "hidden_size": t.hidden_size, "vocab_size": t.vocab_size, "num_hidden_layers": t.num_hidden_layers,
        "layer_types": list(t.layer_types),
        "linear_num_key_heads": t.linear_num_key_heads, "linear_num_value_heads": t.linear_num_value_heads,
        "linear_key_head_dim": t.linear_key_head_dim, "linear_value_head_dim": t.linear_value_head_dim,
        "linear_conv_kernel_dim": t.linear_conv_kernel_dim,
        "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim, "partial_rotary_factor": rope.get("partial_rotary_factor"),
        "rope_theta": rope.get("rope_theta"), "rope_type": rope.get("rope_type"),
        "rms_norm_eps": t.rms_norm_eps, "attention_bias": t.attention_bias,
        "tie_word_embeddings": config.tie_word_embeddings,
    }
    for key in ["intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"]:
        if hasattr(t, key):
            out[key] = getattr(t, key)
    return out


def tensors(config):
    """The model's own tensors, and those save_pretrained writes (its reverted weight conversion: one
    tensor per expert), or None for the second where they would be over 2,000."""
    with torch.device("meta"):
        if hasattr(config, "text_config"):
            model = AutoModelForImageTextToText.from_config(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    state = dict(model.state_dict(keep_vars=True))
    saved = rows_of(revert_weight_conversion(model, dict(state)), config)
    return rows_of(state, config), saved if len(saved) <= 2000 else None


def rows_of(state, config):
    rows = []
    for name, tensor in state.items():
        if ".visual." in name or name.startswith("mtp."):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        rows.append([name, list(tensor.shape)])
    return rows


def main():
    cases = dict(CASES)
    for path in sorted(PUBLIC.glob("qwen3_*/*.json")):
        cases[f"public/{path.parent.name}/{path.stem}"] = json.loads(path.read_text())
    result = {"transformers_version": transformers.__version__, "cases": {}}
    for name, raw in cases.items():
        config = AutoConfig.for_model(**raw)
        model_tensors, checkpoint_tensors = tensors(config)
        result["cases"][name] = {"config": raw, "resolved": resolve(config), "tensors": model_tensors}
        if checkpoint_tensors is not None:
            result["cases"][name]["checkpoint_tensors"] = checkpoint_tensors
        print(name, len(model_tensors), "tensors,", len(checkpoint_tensors or []), "in a checkpoint")
    OUT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
