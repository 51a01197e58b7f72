#!/usr/bin/env python3
"""Convert a tools/gen_model.py model (HF format, no tokenizer files) to GGUF with
llama.cpp's own convert_hf_to_gguf.py, taken from a llama.cpp source tree that is NOT part
of this repository (the vendor/llama.cpp directory of the llama-cpp-python sdist; see
convert.sh and README.md).

Usage:
    python3 bench/llamacpp/convert.py --llama-cpp-dir DIR MODEL_DIR --outtype f32|bf16 --outfile X.gguf

All arguments other than --llama-cpp-dir DIR are passed to convert_hf_to_gguf.py unchanged
(--llama-cpp-dir defaults to $LLAMA_CPP_DIR).

Changes to the converter's behaviour, all done in memory (no llama.cpp file is edited or
copied, the model directory is used as written by gen_model.py):

1. Hyper-parameters of NemotronHForCausalLM are read from config.json as written
   (ModelBase.load_hparams would otherwise use transformers.AutoConfig(...).to_dict()).
   With transformers 5.x, NemotronHConfig fills in MoE defaults (num_experts_per_tok=2,
   n_routed_experts=8, ...) and drops `hybrid_override_pattern` in favour of the list
   `layers_block_type`. The converter then (a) misdetects the dense model as
   NEMOTRON_H_MOE (it keys on "num_experts_per_tok" in the config) and (b) does not
   recognise "mlp" entries of `layers_block_type` (only "moe"), writing n_ff = 0 for every
   MLP layer. Reading config.json directly is exactly the converter's own fallback path when
   AutoConfig fails (e.g. transformers 4.x + remote-code Nemotron-H checkpoints); it then
   uses the `hybrid_override_pattern` string ("M-M-M*-...") which it understands.

2. GraniteMoeHybridForCausalLM: `layer_types` in the transformers 5 spelling
   ("linear_attention" / "full_attention", what GraniteMoeHybridConfig writes and what
   AutoConfig returns even for a Hub config in the legacy spelling) is mapped to the legacy
   "mamba" / "attention" that GraniteHybridModel.get_attn_layers() compares against.
   Unmapped, it finds no attention layer, writes head_count_kv = 0 for every layer (all
   recurrent) and llama.cpp fails to load the file (the attention layers have no ssm_in).

3. BambaForCausalLM, partial RoPE (transformers rotates the first
   head_dim * partial_rotary_factor dims of each head, rotate_half style, i.e. pairs
   (j, j + rot/2); BambaConfig forces the factor to 0.5):
   a. `attn_rotary_emb` = head_dim * partial_rotary_factor is added to the hyper-parameters
      (the only key the converter reads for rope.dimension_count; without it llama.cpp
      rotates the whole head);
   b. the q/k rows are permuted for ggml's pairwise (NORM) RoPE within the rotated part
      only: rows (j, j + rot/2) -> (2j, 2j + 1) for j < rot/2, the other rows unchanged.
      The converter's Llama `undo_permute` interleaves the two halves of the *whole* head,
      (j, j + head_dim/2) -> (2j, 2j + 1), which pairs the wrong dims whenever
      rot < head_dim (check_logits.py shows the difference).

4. The vocabulary:

* Mamba2ForCausalLM, BambaForCausalLM, GraniteMoeHybridForCausalLM: nothing to do. With no
  tokenizer file in the model dir the converter already falls back to its built-in GPT-NeoX
  vocabulary (models/ggml-vocab-gpt-neox.gguf in the llama.cpp tree), truncated to
  vocab_size (16384).
* NemotronHForCausalLM: NemotronHModel.set_vocab() insists on
  transformers.AutoTokenizer plus a known BPE pre-tokenizer hash, so a made-up
  tokenizer.json cannot pass. We replace it with the method of its parent class,
  GraniteHybridModel.set_vocab() (pad to a multiple of 8, then Mamba2Model.set_vocab(),
  i.e. the same built-in GPT-NeoX fallback as Mamba2). The token strings are therefore
  meaningless for our random models; benchmarks feed token ids directly, so the vocabulary
  text never matters. Tensor mapping and GGUF metadata are otherwise the unmodified
  converter's.
* FalconH1ForCausalLM: FalconH1Model.set_vocab() wants a GPT-2 tokenizer from transformers;
  it gets its parent's, Mamba2Model.set_vocab() (the same built-in fallback).
* Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForConditionalGeneration (Gated DeltaNet
  hybrids, conversion/qwen.py): their set_vocab() wants a sentencepiece or GPT-2 tokenizer; they
  get Mamba2Model.set_vocab() (the same built-in fallback). Run them with `--no-mtp` (convert.sh
  does): the converter otherwise expects multi-token-prediction tensors, which our models (like
  transformers' own classes, which drop mtp.*) do not have.
"""

import json
import os
import runpy
import sys
from pathlib import Path


# transformers 5 layer_types of GraniteMoeHybridConfig -> the legacy names the converter reads.
GRANITE_LAYER_TYPES = {"linear_attention": "mamba", "full_attention": "attention"}


def bamba_head_dim(hparams):
    return int(hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"])


def bamba_rotary_dim(hparams):
    """Rotated dims per head: head_dim * partial_rotary_factor (transformers' BambaConfig: 0.5)."""
    rope = hparams.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", hparams.get("partial_rotary_factor", 0.5))
    return int(bamba_head_dim(hparams) * factor)


def permute_rotary_part(w, n_heads, head_dim, rot):
    """q/k projection rows [n_heads * head_dim, ...]: within each head, rows (j, j + rot/2) of
    the rotated part become (2j, 2j + 1) (ggml's pairwise RoPE); rows >= rot stay in place."""
    import torch

    rest = tuple(w.shape[1:])
    h = w.reshape(n_heads, head_dim, *rest)
    r = h[:, :rot].reshape(n_heads, 2, rot // 2, *rest).swapaxes(1, 2).reshape(n_heads, rot, *rest)
    return torch.cat([r, h[:, rot:]], dim=1).reshape(w.shape).contiguous()


def main():
    argv = sys.argv[1:]
    if "--llama-cpp-dir" in argv:
        i = argv.index("--llama-cpp-dir")
        llama_dir = Path(argv[i + 1]).resolve()
        del argv[i:i + 2]
    else:
        llama_dir = Path(os.environ.get("LLAMA_CPP_DIR", "")).resolve()
    script = llama_dir / "convert_hf_to_gguf.py"
    if not script.is_file():
        sys.exit(f"convert_hf_to_gguf.py not found in {llama_dir!s} (pass --llama-cpp-dir or set LLAMA_CPP_DIR)")

    # convert_hf_to_gguf.py locates models/ggml-vocab-*.gguf via sys.path[0] and imports
    # the `conversion` package next to it; it inserts its own gguf-py at sys.path[1].
    sys.path.insert(0, str(llama_dir))
    if "NO_LOCAL_GGUF" not in os.environ:
        sys.path.insert(1, str(llama_dir / "gguf-py"))

    from conversion.base import ModelBase  # noqa: E402
    from conversion.granite import GraniteHybridModel  # noqa: E402
    from conversion.falcon_h1 import FalconH1Model  # noqa: E402
    from conversion.mamba import Mamba2Model  # noqa: E402
    from conversion.nemotron import NemotronHModel  # noqa: E402
    from conversion.qwen import Qwen3NextModel  # noqa: E402

    orig_load_hparams = ModelBase.load_hparams

    def load_hparams(dir_model, is_mistral_format):
        cfg_path = Path(dir_model) / "config.json"
        if not is_mistral_format and cfg_path.is_file():
            with open(cfg_path, encoding="utf-8") as f:
                raw = json.load(f)
            if "NemotronHForCausalLM" in (raw.get("architectures") or []):
                return raw
        return orig_load_hparams(dir_model, is_mistral_format)

    ModelBase.load_hparams = staticmethod(load_hparams)
    NemotronHModel.set_vocab = GraniteHybridModel.set_vocab
    # FalconH1Model.set_vocab() wants a GPT-2 tokenizer from transformers; its parent's
    # (Mamba2Model) falls back to the built-in vocabulary.
    FalconH1Model.set_vocab = Mamba2Model.set_vocab
    # Qwen3-Next and the Qwen3.5 text models (subclasses of Qwen3NextModel): the same fallback.
    Qwen3NextModel.set_vocab = Mamba2Model.set_vocab

    # GraniteHybridModel (and Mamba2Model below it) reads config.json itself, not through
    # load_hparams; NemotronHModel passes its own hparams= in.
    orig_init = GraniteHybridModel.__init__

    def init(self, *args, **kwargs):
        if kwargs.get("hparams") is None:
            with open(Path(args[0]) / "config.json", encoding="utf-8") as f:
                kwargs["hparams"] = json.load(f)
        hparams = kwargs["hparams"]
        archs = hparams.get("architectures") or []
        if "GraniteMoeHybridForCausalLM" in archs and hparams.get("layer_types"):
            hparams["layer_types"] = [GRANITE_LAYER_TYPES.get(t, t) for t in hparams["layer_types"]]
        if "BambaForCausalLM" in archs and "attn_rotary_emb" not in hparams:
            hparams["attn_rotary_emb"] = bamba_rotary_dim(hparams)
        orig_init(self, *args, **kwargs)

    GraniteHybridModel.__init__ = init

    orig_modify_tensors = GraniteHybridModel.modify_tensors

    def modify_tensors(self, data_torch, name, bid):
        if "BambaForCausalLM" not in self.hparams["architectures"] or not name.endswith(
                ("q_proj.weight", "k_proj.weight")):
            yield from orig_modify_tensors(self, data_torch, name, bid)
            return
        head_dim = bamba_head_dim(self.hparams)
        rot = int(self.hparams["attn_rotary_emb"])
        data_torch = permute_rotary_part(data_torch, data_torch.shape[0] // head_dim, head_dim, rot)
        self.undo_permute = False  # instance attribute: LlamaModel.modify_tensors skips its permute
        try:
            yield from orig_modify_tensors(self, data_torch, name, bid)
        finally:
            del self.undo_permute

    GraniteHybridModel.modify_tensors = modify_tensors

    sys.argv = [str(script)] + argv
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
