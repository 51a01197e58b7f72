#!/usr/bin/python3
"""Generates text from a prompt with a running decode worker (byte-level default model).

    python3 client/python/examples/generate.py --target localhost:50050 --prompt "Hello" \
        --max-tokens 64 --temperature 0

Streams the text to stdout as it is generated; the finish reason, usage and
timings go to stderr. --model-info prints the served model's info and exits.
Text is encoded with the default model's byte vocabulary (ids 0..255 bytes,
257 <bos>); another model needs its own tokenizer.
"""

import argparse
import os
import sys

# Run from a checkout: make the package importable without installing it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

try:
    from hybridserve_client import (BOS_ID, ByteStreamDecoder, Client, GenerateResult,
                                    HybridserveError, encode_bytes)
except ModuleNotFoundError as e:  # grpc or google.protobuf: another python3 than Debian's
    sys.exit("%s for %s: pip install ./client/python into this environment, or install "
             "python3-grpcio and python3-protobuf with apt (tools/bootstrap.sh) and run with "
             "/usr/bin/python3" % (e, sys.executable))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="localhost:50050", help="decode worker host:port")
    p.add_argument("--prompt", default="Hello", help="prompt text (UTF-8, one token per byte)")
    p.add_argument("--no-bos", action="store_true", help="do not start the prompt with <bos>")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, help="0 for greedy; default: server's (1.0)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop sequence (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--cache-salt", default="")
    p.add_argument("--logprobs", action="store_true", help="print each token's logprob to stderr")
    p.add_argument("--request-id", help="default: a fresh uuid4 hex")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds")
    p.add_argument("--model-info", action="store_true", help="print the model's info and exit")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    with Client(args.target, timeout=args.timeout) as client:
        try:
            if args.model_info:
                print(client.model_info())
                return 0
            prompt = ([] if args.no_bos else [BOS_ID]) + encode_bytes(args.prompt)
            decoder = ByteStreamDecoder()
            with client.stream(
                    prompt, args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                    top_k=args.top_k, seed=args.seed,
                    stop_sequences=[encode_bytes(s) for s in args.stop],
                    ignore_eos=args.ignore_eos, cache_salt=args.cache_salt,
                    return_logprobs=args.logprobs, request_id=args.request_id) as events:
                for event in events:
                    if isinstance(event, GenerateResult):
                        break
                    sys.stdout.write(decoder.decode(event.token_ids))
                    sys.stdout.flush()
                    if args.logprobs:
                        for token_id, logprob in zip(event.token_ids, event.logprobs):
                            print("  token %d logprob %.4f" % (token_id, logprob), file=sys.stderr)
            sys.stdout.write(decoder.flush() + "\n")
        except HybridserveError as e:
            print("error: %s" % e, file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # leaving the with-block cancelled the RPC
            print("\ncancelled", file=sys.stderr)
            return 130

    result = events.result
    usage = result.usage
    print("finish_reason=%s%s request_id=%s" % (
        result.finish_reason.value,
        " stop_token_id=%d" % result.stop_token_id if result.stop_token_id is not None else "",
        result.request_id), file=sys.stderr)
    if result.error_message:
        print("error_message=%s" % result.error_message, file=sys.stderr)
    print("usage: prompt=%d completion=%d cached=%d recomputed=%d resume=%s" % (
        usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
        usage.recomputed_tokens, usage.resume_kind.value), file=sys.stderr)
    ttft = "%.3fs" % result.ttft_seconds if result.ttft_seconds is not None else "-"
    print("ttft=%s total=%.3fs" % (ttft, result.total_seconds), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
