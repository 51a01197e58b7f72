#!/usr/bin/env python3
"""The gateway bench's control: the same closed loop as grpc_load.py, over HTTP to the gateway, by a minimal client.

    /usr/bin/python3 bench/gateway/http_load.py --url=http://127.0.0.1:PORT --model=default --concurrency=16 \
        --requests=64 --prompt_tokens=128 --output_tokens=64 --tag=h16 --out=/tmp/http.jsonl [--bos=true]

Where aiperf (the load generator of record) and this client disagree about the gateway, the
difference is the load generator's own cost, not the gateway's. One keep-alive HTTP/1.1
connection per slot on asyncio streams; POST /v1/completions with stream: true, ignore_eos: true,
temperature 0, stream_options.include_usage; the SSE body parsed as it arrives (chunked transfer
encoding). TTFT: from just before the request is written to the arrival of the first SSE event
with text (time.perf_counter_ns), as aiperf measures it. Prompts: the text of
workload.prompt_text (the gateway adds <bos> itself when --bos, so the text is one byte shorter).
Writes one record per request to --out (workload.py's format); prints a summary line.
"""

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workload  # noqa: E402


class Connection:
    """One keep-alive HTTP/1.1 connection; one request at a time. Not thread-safe."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post_sse(self, path, body, on_event):
        """POSTs `body` (bytes, JSON); calls on_event(data) for each SSE `data:` line. Returns the HTTP status."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                          f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        headers = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        buf = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                buf = self._feed(buf + data[:-2], on_event)
        else:
            buf = self._feed(await self.reader.readexactly(int(headers.get("content-length", "0"))), on_event)
        if headers.get("connection", "").lower() == "close":
            self.writer.close()
            self.reader = self.writer = None
        return status

    @staticmethod
    def _feed(buf, on_event):
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"data:"):
                on_event(line[5:].strip())
        return buf


async def one_call(conn, path, body):
    record = {"start_ns": time.time_ns(), "ttft_ms": None, "prompt_tokens": None, "output_tokens": 0, "error": ""}
    t0 = time.perf_counter_ns()

    def on_event(data):
        if data == b"[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            record["error"] = json.dumps(event["error"])
        for choice in event.get("choices") or []:
            if choice.get("text") and record["ttft_ms"] is None:
                record["ttft_ms"] = (time.perf_counter_ns() - t0) / 1e6
        if event.get("usage"):
            record["prompt_tokens"] = event["usage"]["prompt_tokens"]
            record["output_tokens"] = event["usage"]["completion_tokens"]

    try:
        status = await conn.post_sse(path, body, on_event)
        if status != 200 and not record["error"]:
            record["error"] = f"HTTP {status}"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        record["error"] = f"{type(e).__name__}: {e}"
        conn.writer = conn.reader = None
    record["end_ns"] = time.time_ns()
    if not record["error"] and record["ttft_ms"] is None:
        record["error"] = "no text"
    return record


def request_body(tag, index, args):
    text = workload.prompt_text(tag, index, args.prompt_tokens - (1 if args.bos else 0))
    return json.dumps({"model": args.model, "prompt": text, "max_tokens": args.output_tokens, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True,
                       "temperature": 0}).encode()


async def run(args):
    u = urllib.parse.urlsplit(args.url)
    connections = [Connection(u.hostname, u.port or 80) for _ in range(args.concurrency)]

    def call(tag):
        return lambda conn, i: one_call(conn, args.path, request_body(tag, i, args))
    await workload.closed_loop(connections, args.warmup, call(args.tag + "w"))
    records = await workload.closed_loop(connections, args.requests, call(args.tag))
    for c in connections:
        if c.writer is not None:
            c.writer.close()
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="the gateway, http://HOST:PORT")
    ap.add_argument("--model", required=True)
    ap.add_argument("--path", default="/v1/completions")
    workload.add_load_flags(ap, "the gateway puts <bos> before the text: the text is one token shorter")
    args = workload.parse_load_flags(ap)
    return workload.write_records(args, asyncio.run(run(args)), "http")


if __name__ == "__main__":
    sys.exit(main())
