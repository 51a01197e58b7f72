#!/usr/bin/env python3
"""A check from outside (issue 50): transformers-made Qwen3.5 models through the three processes.

Usage (torch and transformers as tools/requirements.txt pins them; the stack built first):
    bazel build //cachestore/server:cachestore //prefill:prefill //decode:decode
    python3 tools/outside_check_qwen.py [--bin_dir bazel-bin] [--client_python /usr/bin/python3]

For each of two models that transformers itself makes (random weights of its own initialisation,
byte vocabulary 259: pad 256, <bos> 257, <eos> 258; save_pretrained into a temporary directory,
nothing of tools/gen_model*.py):

  dense  Qwen3_5ForCausalLM (qwen3_5_text, the text-only form), tied embeddings, page 16;
  moe    Qwen3_5MoeForConditionalGeneration (qwen3_5_moe, the image-text form: text_config +
         vision_config, the vision tower saved beside the language model), page 32;

this script starts the real cachestore, prefill and decode binaries on the saved directory (as
tests/e2e and the gateway tests start them) and runs a three-turn conversation through the official
Python client (client/python's hybridserve_client, in its own interpreter --client_python, which has
grpc): turn 1 sends <bos> + the first user text; turn k + 1 sends the whole conversation so far (turn
k's prompt, the reply the stack generated, the next user text), greedy (temperature 0), max_tokens
MAX_NEW_TOKENS, stopping at <eos>, under one cache_salt. Then, for every turn, transformers'
greedy generate on that turn's prompt (the whole conversation so far, as the stack saw it, every
token attended; do_sample=False, max_new_tokens MAX_NEW_TOKENS, the saved generation_config: eos 258
stops it) must give the same tokens exactly, and turns 2 and 3 must have resumed from cached state:
usage's resume_kind EXACT_PREFIX with cached_tokens = the previous turn's prompt + reply - 1 (its last
token was generated, never fed), and the rest computed once: the processes' /metrics counters
(hybridserve_prefill_computed_tokens_total, hybridserve_decode_local_prefill_computed_tokens_total)
grow by the whole prompt at prefill on turn 1, by the uncached tokens at decode's local prefill after.
Prints a verdict table and per turn the smallest top-1 minus top-2 logit of transformers' steps (how
near a tie the greedy choice was). Exit status 1 on any difference.

The weights: transformers' _init_weights with initializer_range INIT_RANGE = 0.1 (its default 0.02
makes logits so flat that greedy choices are near ties), then under a fixed seed every norm weight
moved off its constant init by N(0, 0.1^2) (an engine that ignored one would part); A_log = log(U[0.1, 1])
and dt_bias ~ U[-2, 0], as tools/gen_model_qwen3_next.py draws them, so that the delta-rule state decays
by 0.5 to 0.99 a token and carries across turns (transformers draws A from U[0.01, 16] with dt_bias 1:
most heads then forget within a token or two, and a prefill that dropped the restored delta-rule state
on resume passed this check: turn 3's top logprob moved by 1e-3);
and the embedding row of <pad>, which transformers zeroes (padding_idx), drawn as the others are: the
random models do generate 256 (seed 50's MoE model, in turn 2), and a zero row gives the MoE's first
router all-zero logits, an 8-way tie that only torch.topk's tie order would decide.

generate is given attention_mask all ones: without one, transformers infers it as input_ids != pad_token_id
and so masks every <pad> the model generated earlier in the conversation (which parted turn 3 from the
stack, and from transformers' own plain forward, at seed 50).

Two interpreters: this script (torch, transformers) makes the models and the references; the
client half (this file with --serve, standard library + grpc only) starts the binaries and talks to
decode, and prints its turns as JSON.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_NEW_TOKENS = 24
INIT_RANGE = 0.1
NORM_JITTER = 0.1
SEED = 50
PAD, BOS, EOS = 256, 257, 258
VOCAB = 259
# The user's turns (bytes of the text); turn 1 is preceded by <bos>.
USER_TURNS = [
    "User: Tell me about hybrid models, the ones that mix attention with a recurrent state.\nAssistant:",
    "\nUser: And what does the cache keep between turns?\nAssistant:",
    "\nUser: Say it once more, shorter.\nAssistant:",
]
# name -> (page size of both workers, the model's class in the table)
MODELS = {"dense": (16, "Qwen3_5ForCausalLM (qwen3_5_text)"),
          "moe": (32, "Qwen3_5MoeForConditionalGeneration (qwen3_5_moe)")}


def user_ids(turn):
    ids = list(USER_TURNS[turn].encode("utf-8"))
    return [BOS] + ids if turn == 0 else ids


# ---------------------------------------------------------------- the client half (--serve)

# The prompt tokens each process computed (counters of its /metrics): prefill's for a new prompt,
# decode's local prefill for a resumed turn's new tokens.
COMPUTED = {"prefill": (1, "hybridserve_prefill_computed_tokens_total"),
            "decode": (2, "hybridserve_decode_local_prefill_computed_tokens_total")}


def metric(port, name):
    """The value of an unlabelled counter on http://127.0.0.1:port/metrics."""
    import urllib.request  # pylint: disable=import-outside-toplevel
    with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    raise RuntimeError("%s not on port %s's /metrics" % (name, port))


def computed_tokens(processes):
    return {who: metric(processes[i].fields["metrics_port"], name) for who, (i, name) in COMPUTED.items()}


def serve(args):
    """Starts cachestore, prefill and decode on args.serve, runs the three turns through the Python
    client, prints {"turns": [...]} as JSON on stdout (the processes' logs go to args.log_dir)."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "client", "python"))
    sys.path.insert(0, os.path.join(REPO_ROOT, "client", "python", "tests"))
    from hybridserve_client import Client  # pylint: disable=import-outside-toplevel
    from ready_process import ReadyProcess  # pylint: disable=import-outside-toplevel

    def start(name, binary, flags, ready):
        return ReadyProcess(name, [os.path.join(args.bin_dir, binary)] + flags, ready, log_dir=args.log_dir)

    processes = []
    turns = []
    try:
        processes.append(start("cachestore", "cachestore/server/cachestore",
                               ["--address=127.0.0.1:0", "--metrics_address="], "CACHESTORE_READY"))
        cache = "--cachestore=127.0.0.1:" + processes[0].fields["port"]
        common = ["--model_dir=" + args.serve, "--address=127.0.0.1:0", "--threads=1",
                  "--page_size=%d" % args.page_size, "--metrics_address=127.0.0.1:0", cache]
        processes.append(start("prefill", "prefill/prefill", common, "PREFILL_READY"))
        processes.append(start("decode", "decode/decode",
                               common + ["--prefill=127.0.0.1:" + processes[1].fields["port"]], "DECODE_READY"))
        with Client("127.0.0.1:" + processes[2].fields["port"], timeout=300) as client:
            info = client.model_info()
            history = []
            for turn in range(len(USER_TURNS)):
                history = history + user_ids(turn)
                before = computed_tokens(processes)
                result = client.generate(history, max_tokens=MAX_NEW_TOKENS, temperature=0.0,
                                         cache_salt="outside-check")
                after = computed_tokens(processes)
                usage = result.usage
                turns.append({"prompt_ids": list(history), "generated_ids": list(result.token_ids),
                              "finish": result.finish_reason.name, "prompt_tokens": usage.prompt_tokens,
                              "cached_tokens": usage.cached_tokens, "resume_kind": usage.resume_kind.name,
                              "computed": {k: after[k] - before[k] for k in after}})
                history = history + list(result.token_ids)
        print(json.dumps({"model_name": info.model_name, "vocab_size": info.vocab_size,
                          "eos_token_ids": list(info.eos_token_ids), "page_size": info.page_size,
                          "chunk_size": info.chunk_size, "turns": turns}))
    finally:
        problems = []
        for p in reversed(processes):
            problems += p.stop()
        if problems:
            print("process problems: %s" % problems, file=sys.stderr)
            sys.exit(1)


# ---------------------------------------------------------------- the transformers half

def text_fields():
    return dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=8192,
                initializer_range=INIT_RANGE, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})


def make_model(kind, out_dir):
    """The kind's model, made and initialised by transformers, saved to out_dir; returns its class name."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    torch.manual_seed(SEED)
    if kind == "dense":
        config = transformers.Qwen3_5TextConfig(num_hidden_layers=6, intermediate_size=96,
                                                tie_word_embeddings=True, **text_fields())
        model = transformers.Qwen3_5ForCausalLM(config)
    else:
        text = dict(text_fields(), num_hidden_layers=4, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=16, shared_expert_intermediate_size=32,
                    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                    tie_word_embeddings=False)
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64,
                      patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
        config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model = transformers.Qwen3_5MoeForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=generator) * NORM_JITTER)
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.1, 1.0, generator=generator).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty(p.shape).uniform_(-2.0, 0.0, generator=generator))
        embeddings = model.get_input_embeddings().weight
        embeddings[PAD] = torch.randn(embeddings.shape[1], generator=generator) * INIT_RANGE
    model.generation_config.eos_token_id = EOS
    model.generation_config.bos_token_id = BOS
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(out_dir)
    return type(model).__name__


def load_model(model_dir):
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    auto = transformers.AutoModelForImageTextToText if "vision_config" in config else transformers.AutoModelForCausalLM
    extra = {"experts_implementation": "eager"} if "vision_config" in config else {}
    model, info = auto.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                       output_loading_info=True, **extra)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"{model_dir}: {key} = {info[key]}"
    return model.eval()


def reference(model, prompt_ids):
    """transformers' greedy reply to prompt_ids and the smallest top-1 minus top-2 logit of its steps."""
    import torch  # pylint: disable=import-outside-toplevel
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=MAX_NEW_TOKENS, output_logits=True, return_dict_in_generate=True)
    generated = [int(t) for t in out.sequences[0, len(prompt_ids):]]
    margins = [float(v[0] - v[1]) for v in (torch.topk(step[0].float(), 2).values for step in out.logits)]
    return generated, min(margins)


def check(kind, args, tmp):
    page_size, _ = MODELS[kind]
    model_dir = os.path.join(tmp, "qwen3_5_" + kind)
    class_name = make_model(kind, model_dir)
    log_dir = os.path.join(tmp, kind + "_logs")
    os.makedirs(log_dir)
    served = subprocess.run([args.client_python, os.path.abspath(__file__), "--serve", model_dir,
                             "--page_size", str(page_size), "--bin_dir", args.bin_dir, "--log_dir", log_dir],
                            stdout=subprocess.PIPE, check=False)
    if served.returncode != 0:
        for name in sorted(os.listdir(log_dir)):
            with open(os.path.join(log_dir, name), errors="replace") as f:
                print(f"--- {name}\n{f.read()[-4000:]}", file=sys.stderr)
        raise RuntimeError(f"{kind}: the client half exited {served.returncode}")
    stack = json.loads(served.stdout)
    model = load_model(model_dir)
    rows = []
    for i, turn in enumerate(stack["turns"]):
        expected, margin = reference(model, turn["prompt_ids"])
        same = turn["generated_ids"] == expected
        if i == 0:
            want_cached, want_kind = 0, "COLD"
        else:
            previous = stack["turns"][i - 1]
            want_cached, want_kind = len(previous["prompt_ids"]) + len(previous["generated_ids"]) - 1, "EXACT_PREFIX"
        # The rest was computed once: a new prompt by prefill, a resumed turn's new tokens by decode.
        uncached = len(turn["prompt_ids"]) - want_cached
        want_computed = {"prefill": uncached, "decode": 0} if i == 0 else {"prefill": 0, "decode": uncached}
        resumed = (turn["resume_kind"] == want_kind and turn["cached_tokens"] == want_cached and
                   turn["computed"] == want_computed)
        want = f"{want_kind}, cached {want_cached}, computed {want_computed}"
        rows.append({"model": kind, "class": class_name, "turn": i + 1, "prompt": len(turn["prompt_ids"]),
                     "generated": len(turn["generated_ids"]), "finish": turn["finish"],
                     "tokens_equal": same, "resume_kind": turn["resume_kind"], "cached": turn["cached_tokens"],
                     "computed": turn["computed"], "resume_expected": want, "resume_ok": resumed, "min_margin": margin,
                     "first_difference": None if same else next(
                         (j for j, (a, b) in enumerate(zip(turn["generated_ids"], expected)) if a != b),
                         min(len(expected), len(turn["generated_ids"]))),
                     "stack_ids": turn["generated_ids"], "transformers_ids": expected})
    info = {k: stack[k] for k in ("model_name", "vocab_size", "eos_token_ids", "page_size", "chunk_size")}
    return rows, info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin_dir", default=os.path.join(REPO_ROOT, "bazel-bin"))
    ap.add_argument("--client_python", default="/usr/bin/python3")
    ap.add_argument("--models", nargs="*", choices=sorted(MODELS), default=sorted(MODELS))
    ap.add_argument("--serve", help=argparse.SUPPRESS)  # the client half: a model directory
    ap.add_argument("--page_size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--log_dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.bin_dir = os.path.abspath(args.bin_dir)
    if args.serve:
        serve(args)
        return 0
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)
    print(f"outside check: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"binaries {args.bin_dir}, {len(USER_TURNS)} turns, greedy, max_tokens {MAX_NEW_TOKENS}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="outside_check_qwen") as tmp:
        for kind in args.models:
            kind_rows, info = check(kind, args, tmp)
            print(f"{kind}: {kind_rows[0]['class']}, served as {info['model_name']!r}: vocab {info['vocab_size']}, "
                  f"eos {info['eos_token_ids']}, page {info['page_size']}, chunk {info['chunk_size']}")
            rows += kind_rows
    print()
    print(f"{'model':6} {'turn':>4} {'prompt':>6} {'gen':>4} {'finish':7} {'tokens':7} {'resume':13} "
          f"{'cached':>6} {'computed P/D':>12} {'resume?':8} {'min margin':>10}")
    for r in rows:
        computed = "%d/%d" % (r["computed"]["prefill"], r["computed"]["decode"])
        print(f"{r['model']:6} {r['turn']:>4} {r['prompt']:>6} {r['generated']:>4} {r['finish']:7} "
              f"{'equal' if r['tokens_equal'] else 'DIFFER':7} {r['resume_kind']:13} {r['cached']:>6} "
              f"{computed:>12} {'ok' if r['resume_ok'] else 'WRONG':8} {r['min_margin']:>10.4f}")
        if not r["tokens_equal"]:
            print(f"       first difference at generated token {r['first_difference']}: "
                  f"stack {r['stack_ids']} transformers {r['transformers_ids']}")
        if not r["resume_ok"]:
            print(f"       expected {r['resume_expected']}")
    failed = [r for r in rows if not (r["tokens_equal"] and r["resume_ok"])]
    print()
    print("VERDICT: " + ("PASS" if not failed else "FAIL") +
          f" ({len(rows) - len(failed)} of {len(rows)} turns equal to transformers and resumed as expected)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
