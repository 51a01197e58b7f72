#!/usr/bin/env python3
"""Text references of Hugging Face transformers for the gateway's text-equality test.

Usage:
    pip install -r tools/requirements.txt
    python3 tools/make_text_golden.py [--out tests/fixtures/text_golden] [--only NAME ...]

For each byte-vocabulary model the end-to-end suite serves (fixture_spec.TEXT_MODELS:
every e2e model of tests/fixtures/models and the embedded default model), this script builds a
model directory as a user deploys one (the model's config.json and model.safetensors,
tests/fixtures/byte_tokenizer's tokenizer files), loads it with transformers
(AutoModelForCausalLM, or AutoModelForImageTextToText for an image-text checkpoint, given
input_ids only; fp32, CPU, eager attention, eager experts; AutoTokenizer),
and records into <out>/<name>.json, for each case of CASES:

  completion  a prompt text, tokenised as transformers' tokenizer(text) does (special
              tokens added: <bos> first), which is what the gateway's /v1/completions
              does (hybridserve_client.tokenizer.HfTokenizer.encode);
  chat        a conversation rendered and tokenised by
              tokenizer.apply_chat_template(messages, add_generation_prompt=True),
              what the gateway's /v1/chat/completions does (HfTokenizer.apply_chat_template);

then greedy generate(do_sample=False, max_new_tokens=MAX_NEW_TOKENS) with the model's
generation_config (eos_token_id 258: it stops at <eos>, which is also the chat
template's end of turn), and writes per case: prompt_ids, generated_ids (the <eos> it
stopped at included), finish ("stop" when it stopped at an eos id, else "length"),
stop_token_id, text = tokenizer.decode(generated_ids, skip_special_tokens=True)
exactly as transformers gives it (random weights emit bytes that are not UTF-8: each
invalid sequence is U+FFFD), and margins: the top-1 minus top-2 logit of each
generated token (what decides whether another implementation may choose otherwise).

Before writing, each case's prompt ids are checked against the gateway's own
tokenizer (client/python's HfTokenizer on the same directory): the fixture is what
the gateway sends to decode.

Deterministic: torch runs single-threaded; the JSON is written with sorted keys,
arrays of numbers on one line, margins rounded to 6 decimals. tools/check_fixtures.py
regenerates the files when torch and transformers are importable and compares: ids,
finish and text exactly (generated ids may part only at a step whose recorded margin
is within 2 x LOGIT_TOLERANCE), margins within LOGIT_TOLERANCE.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import types

import tokenizers
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_spec import TEXT_GOLDEN, TEXT_MODELS  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER_DIR = "tests/fixtures/byte_tokenizer"

MAX_NEW_TOKENS = 20
# Each case: (name, kind, input): a completion's prompt text or a chat's messages.
CASES = [
    ("completion_ascii", "completion", "Hello there, how are you today?"),
    ("completion_utf8", "completion", "héllo wörld ✓ 日本"),
    ("chat_system_user", "chat", [{"role": "system", "content": "You answer in one line."},
                                  {"role": "user", "content": "What is a hybrid model?"}]),
    ("chat_three_turns", "chat", [{"role": "user", "content": "Tell me a joke."},
                                  {"role": "assistant", "content": "Why did the byte cross the road?"},
                                  {"role": "user", "content": "Why? ¿Por qué?"}]),
    # Single turns the random models answer with <eos> within MAX_NEW_TOKENS (the end of turn, finish
    # "stop"): nemotron_h_moe_e2e at once (an empty reply), nemotron_h_e2e after 5 tokens, bamba_e2e after 2.
    ("chat_hi", "chat", [{"role": "user", "content": "Hi!"}]),
    ("chat_japanese", "chat", [{"role": "user", "content": "日本語で話して"}]),
    ("chat_good_night", "chat", [{"role": "user", "content": "Good night."}]),
]
MARGIN_DECIMALS = 6
# Granite's and Nemotron-H's MoE blocks as make_golden.py runs them (the per-expert loop).
EXPERTS_IMPLEMENTATION = "eager"


def gateway_tokenizer_class():
    """client/python's HfTokenizer (what the gateway tokenises with), imported without the
    package's __init__ (which needs grpc, not a dependency of this script)."""
    package_dir = os.path.join(REPO_ROOT, "client", "python", "hybridserve_client")
    if "hybridserve_client" not in sys.modules:
        package = types.ModuleType("hybridserve_client")
        package.__path__ = [package_dir]
        sys.modules["hybridserve_client"] = package
    from hybridserve_client.tokenizer import HfTokenizer  # noqa: E402  pylint: disable=import-outside-toplevel
    return HfTokenizer


def model_dir_with_tokenizer(tmp, model_dir):
    """A directory as a deployment has it: the model's files and the byte tokenizer's."""
    d = os.path.join(tmp, "model")
    os.makedirs(d)
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(REPO_ROOT, model_dir, f), os.path.join(d, f))
    source = os.path.join(REPO_ROOT, TOKENIZER_DIR)
    for f in sorted(os.listdir(source)):
        if f.endswith(".json"):
            shutil.copy(os.path.join(source, f), d)
    return d


def load(d):
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    has_experts = (config["model_type"] == "granitemoehybrid" or "moe" in config.get("layers_block_type", []) or
                   config.get("text_config", config).get("num_experts", 0) > 0)
    extra = {"experts_implementation": EXPERTS_IMPLEMENTATION} if has_experts else {}
    # An image-text checkpoint (vision_config: qwen3_5_moe_e2e) loads whole, vision tower included;
    # generate is given input_ids only, so the tower never runs.
    auto = transformers.AutoModelForImageTextToText if "vision_config" in config else transformers.AutoModelForCausalLM
    model, info = auto.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, **extra)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), f"{d}: {kind} = {info[kind]}"
    model.eval()
    return model, transformers.AutoTokenizer.from_pretrained(d)


def prompt_ids(tokenizer, gateway_tokenizer, kind, value):
    """The case's prompt ids as transformers makes them, asserted equal to the gateway's."""
    if kind == "completion":
        ids = tokenizer(value)["input_ids"]
        theirs = gateway_tokenizer.encode(value)
    else:
        ids = tokenizer.apply_chat_template(value, add_generation_prompt=True, return_dict=True)["input_ids"]
        theirs = gateway_tokenizer.apply_chat_template(value, add_generation_prompt=True)
    ids = [int(i) for i in ids]
    assert ids == list(theirs), f"{kind} {value!r}: transformers {ids} vs the gateway's tokenizer {list(theirs)}"
    return ids


@torch.no_grad()
def run_case(model, tokenizer, ids):
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                         output_logits=True, return_dict_in_generate=True)
    generated = [int(t) for t in out.sequences[0, len(ids):]]
    assert [int(step[0].argmax()) for step in out.logits] == generated
    margins = []
    for step in out.logits:
        top = torch.topk(step[0].float(), 2).values
        margins.append(round(float(top[0] - top[1]), MARGIN_DECIMALS))
    stopped = generated[-1] if generated and generated[-1] in eos else None
    assert stopped is not None or len(generated) == MAX_NEW_TOKENS, "generate stopped early without an eos"
    return {
        "generated_ids": generated,
        "finish": "stop" if stopped is not None else "length",
        "stop_token_id": stopped,
        "text": tokenizer.decode(generated, skip_special_tokens=True),
        "margins": margins,
    }, eos


def make(name, model_dir):
    HfTokenizer = gateway_tokenizer_class()
    with tempfile.TemporaryDirectory() as tmp:
        d = model_dir_with_tokenizer(tmp, model_dir)
        model, tokenizer = load(d)
        gateway_tokenizer = HfTokenizer.from_dir(d)
        cases = []
        for case_name, kind, value in CASES:
            ids = prompt_ids(tokenizer, gateway_tokenizer, kind, value)
            result, eos = run_case(model, tokenizer, ids)
            case = {"name": case_name, "kind": kind, "prompt_ids": ids, **result}
            case["prompt" if kind == "completion" else "messages"] = value
            cases.append(case)
    return {
        "model": name,
        "model_dir": model_dir,
        "tokenizer_dir": TOKENIZER_DIR,
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_token_ids": eos,
        "generate": "do_sample=False, max_new_tokens=max_new_tokens, the model's generation_config (eos stops)",
        "decode": "tokenizer.decode(generated_ids, skip_special_tokens=True)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "cases": cases,
    }


# A JSON array of numbers as json.dumps(indent=1) writes it: one element a line.
_NUMBER = r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_NUMBER_ARRAY = re.compile(r"\[\n\s*((?:%s,\n\s*)*%s)\n\s*\]" % (_NUMBER, _NUMBER))


def dumps(record):
    """The file's text: sorted keys, one-space indent, arrays of numbers on one line, non-ASCII
    characters as they are (control characters escaped), a final newline."""
    text = json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False)
    text = _NUMBER_ARRAY.sub(lambda m: "[" + ", ".join(x.strip().rstrip(",") for x in m.group(1).split("\n")) + "]",
                             text)
    assert json.loads(text) == record
    return text + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, TEXT_GOLDEN))
    ap.add_argument("--only", nargs="*", choices=sorted(TEXT_MODELS))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or TEXT_MODELS:
        record = make(name, TEXT_MODELS[name])
        with open(os.path.join(args.out, name + ".json"), "w", encoding="utf-8") as f:
            f.write(dumps(record))
        finishes = ", ".join(f"{c['name']} {len(c['generated_ids'])} {c['finish']}" for c in record["cases"])
        print(f"{name}: {finishes}; smallest margin {min(min(c['margins']) for c in record['cases']):.3g}")


if __name__ == "__main__":
    main()
