#!/usr/bin/env python3
"""The gateway bench's baseline: streaming Generate calls straight to decode, at a fixed concurrency.

    /usr/bin/python3 bench/gateway/grpc_load.py --target=127.0.0.1:PORT --concurrency=16 --requests=64 \
        --prompt_tokens=128 --output_tokens=64 --tag=d16 --out=/tmp/direct.jsonl [--bos=true]

The same closed loop aiperf runs against the gateway (`--concurrency` slots, each sending its next
request when its previous one ends, `--requests` in all, after `--warmup` requests that warm the
channel and are not recorded), on grpc.aio, one channel (one HTTP/2 connection), as the gateway
itself talks to decode. Request i's prompt is workload.prompt_text(tag, i, ...) as token ids of the
byte vocabulary, <bos> first when --bos (the gateway's own rule for a text prompt; run.py finds
it out), greedy, EOS ignored, max_tokens = --output_tokens.

TTFT: from just before the call is made to the arrival at the client of the first response
message carrying a token (time.perf_counter_ns, the same clock difference aiperf takes
between starting its HTTP request and receiving the first SSE event with text). Writes one
record per request to --out (workload.py's format); prints a summary line.
"""

import argparse
import asyncio
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import grpc  # noqa: E402
from hybridserve_client.byte_vocab import BOS_ID, encode_bytes  # noqa: E402
from hybridserve_client.proto import generation_pb2 as pb  # noqa: E402
from hybridserve_client.proto import generation_pb2_grpc as pb_grpc  # noqa: E402

import workload  # noqa: E402


def make_request(tag, index, args):
    text = workload.prompt_text(tag, index, args.prompt_tokens - (1 if args.bos else 0))
    request = pb.GenerateRequest(request_id=f"{tag}-{index}", prompt_token_ids=encode_bytes(text, add_bos=args.bos))
    request.sampling.temperature = 0.0
    request.stop.max_tokens = args.output_tokens
    request.stop.ignore_eos = True
    return request


async def one_call(stub, request):
    """One streamed Generate; its record."""
    record = {"start_ns": time.time_ns(), "ttft_ms": None, "prompt_tokens": None, "output_tokens": 0, "error": ""}
    t0 = time.perf_counter_ns()
    try:
        async for response in stub.Generate(request):
            if response.HasField("chunk"):
                if record["ttft_ms"] is None and response.chunk.token_ids:
                    record["ttft_ms"] = (time.perf_counter_ns() - t0) / 1e6
            elif response.HasField("complete"):
                c = response.complete
                record["prompt_tokens"] = c.usage.prompt_tokens
                record["output_tokens"] = c.usage.completion_tokens
                if c.finish_reason != pb.FINISH_REASON_LENGTH:
                    record["error"] = f"finish reason {pb.FinishReason.Name(c.finish_reason)} {c.error_message}"
    except grpc.aio.AioRpcError as e:
        record["error"] = f"{e.code().name}: {e.details()}"
    record["end_ns"] = time.time_ns()
    if not record["error"] and record["ttft_ms"] is None:
        record["error"] = "no token"
    return record


async def run(args):
    async with grpc.aio.insecure_channel(args.target) as channel:
        stub = pb_grpc.GenerationStub(channel)
        slots = [stub] * args.concurrency  # one channel, as a gRPC client has it

        def call(tag):
            return lambda stub_, i: one_call(stub_, make_request(tag, i, args))
        await workload.closed_loop(slots, args.warmup, call(args.tag + "w"))
        return await workload.closed_loop(slots, args.requests, call(args.tag))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="decode's gRPC address")
    workload.add_load_flags(ap, "prompts start with <bos> (id %d)" % BOS_ID)
    args = workload.parse_load_flags(ap)
    return workload.write_records(args, asyncio.run(run(args)), "direct")


if __name__ == "__main__":
    sys.exit(main())
