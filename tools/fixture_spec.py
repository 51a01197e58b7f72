"""What the golden fixtures are made of: the fixture models, their prompts.

Shared by tools/make_golden.py (which needs torch and transformers) and
tools/check_fixtures.py (which checks the committed files with numpy alone).
"""

import numpy as np

# Fixture models: name -> (arch, preset, seed, config.json fields set over gen_model.py's).
MODELS = {
    "nemotron_h_tiny": ("nemotron_h", "tiny", 1234, {}),
    "mamba2_tiny": ("mamba2", "tiny", 4321, {}),
    "nemotron_h_tied_tiny": ("nemotron_h", "tiny", 2468, {"tie_word_embeddings": True}),
    "bamba_tiny": ("bamba", "tiny", 1357, {}),
    "bamba_tiny2": ("bamba", "tiny2", 2468, {}),
    "granite_moe_tiny": ("granitemoehybrid", "tiny", 3579, {}),
    "granite_dense_tiny": ("granitemoehybrid", "tiny2", 4680, {}),
    "falcon_h1_tiny": ("falcon_h1", "tiny", 5792, {}),
    "falcon_h1_tiny2": ("falcon_h1", "tiny2", 6802, {}),
    "falcon_h1_tiny3": ("falcon_h1", "tiny3", 7915, {}),
    "nemotron_h_moe_tiny": ("nemotron_h", "moe_tiny", 5793, {}),
    "nemotron_h_moe_tiny2": ("nemotron_h", "moe_tiny2", 6802, {}),
    "nemotron_h_latent_moe_tiny": ("nemotron_h", "moe_latent_tiny", 5796, {}),
    "zamba2_tiny": ("zamba2", "tiny", 8025, {}),
    "zamba2_tiny2": ("zamba2", "tiny2", 9135, {}),
    "zamba2_per_use_tiny": ("zamba2", "tiny3", 1046, {}),
    # position_embedding_type "nope", as every published Granite 4.0-H config says (no positions).
    "granite_nope_tiny": ("granitemoehybrid", "tiny", 4691, {"position_embedding_type": "nope"}),
    # The Falcon-H1 mixer's out_proj bias without in_proj's (projectors_bias only), and the reverse.
    "falcon_h1_out_bias_tiny": ("falcon_h1", "tiny4", 5803, {}),
    "falcon_h1_in_bias_tiny": ("falcon_h1", "tiny5", 5914, {}),
    "zamba2_untied_tiny": ("zamba2", "tiny4", 4646, {}),
    # Granite with attention biases (attention_bias: q/k/v/o_proj) and RoPE, MoE.
    "granite_attn_bias_tiny": ("granitemoehybrid", "tiny3", 4702, {}),
    # Nemotron-H MoE with mlp_bias: the shared experts' and the MLP layer's biases.
    "nemotron_h_moe_bias_tiny": ("nemotron_h", "moe_tiny3", 5815, {}),
    # Gated DeltaNet hybrids (issue 50), each file as transformers' save_pretrained writes it.
    # Qwen3-Next: layer_types starting with attention, MoE in every layer (top-2 of 8, shared expert and
    # its gate), n_v = 2 n_k GDN heads with dk 16 != dv 8, partial RoPE 0.25.
    "qwen3_next_tiny": ("qwen3_next", "tiny", 5050, {}),
    # Qwen3-Next with dense layers (decoder_sparse_step 2, mlp_only_layers [3]), n_v = 3 n_k, dv > dk.
    "qwen3_next_sparse_tiny": ("qwen3_next", "tiny2", 5051, {}),
    # Qwen3.5 dense, text-only form (qwen3_5_text, Qwen3_5ForCausalLM), full_attention_interval, tied.
    "qwen3_5_tiny": ("qwen3_5_text", "tiny", 5052, {}),
    # Qwen3.5-MoE, image-text form (Qwen3_5MoeForConditionalGeneration, model.language_model.* and
    # model.visual.*), untied; references from the text path.
    "qwen3_5_moe_tiny": ("qwen3_5_moe", "tiny", 5055, {}),
}
# The archs whose linear layers are Gated DeltaNet (transformers' chunk length 64, not a config field).
GDN_ARCHS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")
# Fixtures whose config.json is gen_model.py's rather than save_pretrained's: qwen3_5_tiny states its
# pattern by full_attention_interval, as save_pretrained (which writes the layer_types it derives) does not.
KEEP_CONFIG = ("qwen3_5_tiny",)
# Fixture models scaled down from published checkpoints' configs (tools/scale_config.py): name ->
# (the config under tests/fixtures/public_configs, seed). One per distinct feature set. config.json
# is the scaled publisher's file (its keys as written), not transformers' re-serialisation.
PUBLIC_MODELS = {
    "public_bamba_9b": ("bamba/Bamba-9B.json", 11),
}
PUBLIC_CONFIGS = "tests/fixtures/public_configs"

# Prompt lengths for chunk_size 16: shorter than a chunk (1, 5, 13), exactly one and two
# chunks (16, 32), off-grid (29, 50) and longer than three chunks (50, 77).
PROMPT_LENGTHS = [1, 5, 13, 16, 29, 32, 50, 77]
# The Gated DeltaNet fixtures' prompt lengths, for transformers' chunk of 64 (torch_chunk_gated_delta_rule):
# within the first chunk (1, 5, 40), exactly one and two chunks (64, 128), off-grid in the second and
# third (100, 150). Token ids as make_prompts draws them for any fixture (same seed).
GDN_PROMPT_LENGTHS = [1, 5, 40, 64, 100, 128, 150]
NEW_TOKENS = 12
PROMPT_SEED = 20240601

# The embedded model, recorded as it is: name -> its directory, relative to the repository.
EXISTING_MODELS = {"default": "models/default"}
# Its prompts: <bos> + the first len - 1 bytes of DEFAULT_TEXT. Lengths for chunk_size 64: within
# the first chunk (1, 5, 40), exactly one and two chunks (64, 128), off-grid (100, 150) and past
# four chunks (300).
DEFAULT_PROMPT_LENGTHS = [1, 5, 40, 64, 100, 128, 150, 300]
DEFAULT_TEXT = (
    "A man walked into a library and asked the librarian for a book about paranoia.  She "
    "leaned over the counter and whispered, \"It's right behind you.\"\n"
    "Never put off until tomorrow what you can do the day after tomorrow.  The first rule "
    "of computing is that every program has at least one bug and can be shortened by one "
    "line; the second rule is that it will take longer than you think, even when you take "
    "the first rule into account.\n")


# The text references of tools/make_text_golden.py (tests/fixtures/text_golden/<name>.json): every
# byte-vocabulary model the end-to-end suite serves, with tests/fixtures/byte_tokenizer's tokenizer
# files beside it. name -> its directory (config.json, model.safetensors), relative to the repository.
TEXT_MODELS = {
    "default": "models/default",
    "nemotron_h_e2e": "tests/fixtures/models/nemotron_h_e2e",
    "nemotron_h_moe_e2e": "tests/fixtures/models/nemotron_h_moe_e2e",
    "nemotron_h_latent_e2e": "tests/fixtures/models/nemotron_h_latent_e2e",
    "mamba2_e2e": "tests/fixtures/models/mamba2_e2e",
    "bamba_e2e": "tests/fixtures/models/bamba_e2e",
    "granite_e2e": "tests/fixtures/models/granite_e2e",
    "falcon_h1_e2e": "tests/fixtures/models/falcon_h1_e2e",
    "zamba2_e2e": "tests/fixtures/models/zamba2_e2e",
    "public_bamba_9b_e2e": "tests/fixtures/models/public_bamba_9b_e2e",
    "qwen3_5_e2e": "tests/fixtures/models/qwen3_5_e2e",
    "qwen3_5_moe_e2e": "tests/fixtures/models/qwen3_5_moe_e2e",
}
TEXT_GOLDEN = "tests/fixtures/text_golden"


def prompt_lengths(arch=None):
    """The prompt lengths of a generated fixture of `arch`."""
    return GDN_PROMPT_LENGTHS if arch in GDN_ARCHS else PROMPT_LENGTHS


def make_prompts(vocab_size, seed, arch=None):
    """Fixed prompts: uniform token ids in [3, vocab) (ids 0..2 are pad/bos/eos), of prompt_lengths(arch)."""
    bits = np.random.Generator(np.random.PCG64(seed))
    return [bits.integers(3, vocab_size, size=n, dtype=np.int64).astype(np.int32) for n in prompt_lengths(arch)]


def default_prompts(bos):
    """The embedded model's prompts: <bos> + the first len - 1 bytes of DEFAULT_TEXT."""
    text = DEFAULT_TEXT.encode()
    return [np.array([bos] + list(text[:n - 1]), dtype=np.int32) for n in DEFAULT_PROMPT_LENGTHS]
