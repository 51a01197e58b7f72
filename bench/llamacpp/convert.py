#!/usr/bin/env python3
"""Convert a tools/gen_model.py model (HF format, no tokenizer files) to GGUF with
llama.cpp's own convert_hf_to_gguf.py, taken from a llama.cpp source tree that is NOT part
of this repository (the vendor/llama.cpp directory of the llama-cpp-python sdist; see
convert.sh and README.md).

Usage:
    python3 bench/llamacpp/convert.py --llama-cpp-dir DIR MODEL_DIR --outtype f32|bf16 --outfile X.gguf

All arguments other than --llama-cpp-dir DIR are passed to convert_hf_to_gguf.py unchanged
(--llama-cpp-dir defaults to $LLAMA_CPP_DIR).

Two changes to the converter's behaviour, both done in memory (no llama.cpp file is
edited or copied, the model directory is used as written by gen_model.py):

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

2. The vocabulary:

* Mamba2ForCausalLM: nothing to do. With no tokenizer file in the model dir the converter
  already falls back to its built-in GPT-NeoX vocabulary (models/ggml-vocab-gpt-neox.gguf
  in the llama.cpp tree), truncated to vocab_size (16384).
* NemotronHForCausalLM: NemotronHModel.set_vocab() insists on
  transformers.AutoTokenizer plus a known BPE pre-tokenizer hash, so a made-up
  tokenizer.json cannot pass. We replace it with the method of its parent class,
  GraniteHybridModel.set_vocab() (pad to a multiple of 8, then Mamba2Model.set_vocab(),
  i.e. the same built-in GPT-NeoX fallback as Mamba2). The token strings are therefore
  meaningless for our random models; benchmarks feed token ids directly, so the vocabulary
  text never matters. Tensor mapping and GGUF metadata are the unmodified converter's.
"""

import json
import os
import runpy
import sys
from pathlib import Path


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
    from conversion.nemotron import NemotronHModel  # noqa: E402

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

    sys.argv = [str(script)] + argv
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
