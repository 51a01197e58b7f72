"""The gateway bench's shared code: prompts, aiperf's records, statistics, verdicts, the minimal SSE client."""

import asyncio
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_load  # noqa: E402
import workload  # noqa: E402


def record(start_ms, ttft_ms, end_ms, output_tokens=64, error=""):
    return {"start_ns": int(start_ms * 1e6), "ttft_ms": ttft_ms, "end_ns": int(end_ms * 1e6), "prompt_tokens": 128,
            "output_tokens": output_tokens, "error": error}


class PromptTest(unittest.TestCase):

    def test_exact_length_ascii_and_unique_head(self):
        for length in (16, 127, 128, 1000):
            text = workload.prompt_text("g16r2", 7, length)
            self.assertEqual(len(text.encode("utf-8")), length)
            self.assertTrue(text.startswith("g16r2-000007: "))
        self.assertEqual(workload.prompt_text("d1r0", 3, 40), "d1r0-000003: The quick brown fox jumps o")

    def test_two_prompts_differ_from_their_first_bytes(self):
        a, b = workload.prompt_text("d4r0", 1, 128), workload.prompt_text("g4r0", 1, 128)
        self.assertNotEqual(a[0], b[0])

    def test_too_short_for_the_head_is_refused(self):
        with self.assertRaisesRegex(ValueError, "prompt length 5"):
            workload.prompt_text("d1r0", 0, 5)


class SummarizeTest(unittest.TestCase):

    def test_median_and_tokens_over_summed_windows(self):
        run_a = [record(0, 10.0, 100), record(50, 30.0, 200)]  # window 200 ms, 128 tokens
        run_b = [record(1000, 14.0, 1300), record(1000, 40.0, 1100, error="HTTP 500")]  # window 300 ms
        s = workload.summarize([run_a, run_b])
        self.assertEqual(s["requests"], 3)
        self.assertEqual(s["errors"], 1)
        self.assertEqual(s["ttft_p50_ms"], 14.0)  # of 10, 30, 14 (mean 18); the failed request's 40 left out
        self.assertEqual(s["output_tokens"], 192)
        self.assertAlmostEqual(s["window_s"], 0.5)
        self.assertAlmostEqual(s["throughput"], 384.0)

    def test_compare_and_verdicts(self):
        direct = {"ttft_p50_ms": 10.0, "throughput": 1000.0}
        c = workload.compare(direct, {"ttft_p50_ms": 11.0, "throughput": 950.0})
        self.assertEqual((c["ttft_diff_ms"], c["throughput_ratio"], c["ttft_met"], c["throughput_met"]),
                         (1.0, 0.95, True, True))
        c = workload.compare(direct, {"ttft_p50_ms": 11.5, "throughput": 949.0})
        self.assertEqual((c["ttft_met"], c["throughput_met"]), (False, False))

    def test_table_row(self):
        d = workload.summarize([[record(0, 10.0, 1000)]])
        g = workload.summarize([[record(0, 12.5, 1000, output_tokens=64)]])
        row = workload.table([(4, d, g)]).splitlines()[2]
        self.assertEqual(row, "| 4 | 10.00 | 12.50 | +2.50 | MISSED | 64 | 64 | 1.000 | MET | 1 (0) / 1 (0) |")

    def test_check_lengths(self):
        bad = workload.check_lengths([record(0, 1, 2), record(0, 1, 2, output_tokens=63),
                                      record(0, 1, 2, output_tokens=1, error="x")], 128, 64)
        self.assertEqual(bad, ["prompt 128 / output 63 tokens, expected 128 / 64"])


class AiperfRecordsTest(unittest.TestCase):

    def test_profiling_records_only_with_server_counts(self):
        # Trimmed from a real profile_export.jsonl line of aiperf 0.13.0.
        line = {"metadata": {"request_start_ns": 1000000000, "request_end_ns": 1250000000,
                             "benchmark_phase": "profiling"},
                "metrics": {"time_to_first_token": {"value": 12.5, "unit": "ms"},
                            "usage_prompt_tokens": {"value": 128, "unit": "tokens"},
                            "usage_completion_tokens": {"value": 64, "unit": "tokens"},
                            "output_token_count": {"value": 60, "unit": "tokens"}}}
        warmup = dict(line, metadata=dict(line["metadata"], benchmark_phase="warmup"))
        failed = dict(line, error={"code": 500, "message": "boom"})
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for row in (line, warmup, failed):
                f.write(json.dumps(row) + "\n")
        records = workload.read_aiperf_records(f.name)
        os.unlink(f.name)
        self.assertEqual(len(records), 2)
        self.assertEqual(records[0], {"start_ns": 1000000000, "end_ns": 1250000000, "ttft_ms": 12.5,
                                      "prompt_tokens": 128, "output_tokens": 64, "error": ""})
        self.assertEqual(json.loads(records[1]["error"]), {"code": 500, "message": "boom"})


class HttpLoadTest(unittest.TestCase):
    """http_load.py's client against a scripted server: chunked SSE split mid-line, keep-alive."""

    def test_events_split_across_chunks_and_keep_alive(self):
        events = [{"choices": [{"index": 0, "text": "", "finish_reason": None}]},
                  {"choices": [{"index": 0, "text": "ab", "finish_reason": None}]},
                  {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 128, "completion_tokens": 2}}]
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        # Chunks cut inside the `data:` lines of the event with text and of the usage event.
        text_at, usage_at = body.index(b'"ab"'), body.index(b'"usage"')
        cuts = [0, 7, text_at, usage_at, len(body) - 5, len(body)]
        chunked = b"".join(b"%x\r\n" % (b - a) + body[a:b] + b"\r\n" for a, b in zip(cuts, cuts[1:])) + b"0\r\n\r\n"
        requests = []

        async def serve(reader, writer):
            for _ in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0]
                             .split(b":")[1])
                requests.append(json.loads(await reader.readexactly(length)))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n" + chunked)
                await writer.drain()
            writer.close()

        async def main():
            server = await asyncio.start_server(serve, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            conn = http_load.Connection("127.0.0.1", port)
            body = json.dumps({"prompt": "x"}).encode()
            first = await http_load.one_call(conn, "/v1/completions", body)
            second = await http_load.one_call(conn, "/v1/completions", body)
            server.close()
            return first, second

        first, second = asyncio.run(main())
        for r in (first, second):
            self.assertEqual(r["error"], "")
            self.assertEqual((r["prompt_tokens"], r["output_tokens"]), (128, 2))
            self.assertIsNotNone(r["ttft_ms"])
        self.assertEqual(len(requests), 2)  # both on the one connection

    def test_request_body(self):
        class Args:
            prompt_tokens, output_tokens, bos, model = 128, 64, True, "default"

        body = json.loads(http_load.request_body("h1r0", 5, Args))
        self.assertEqual(len(body["prompt"]), 127)  # the gateway adds <bos>
        self.assertEqual({k: v for k, v in body.items() if k != "prompt"},
                         {"model": "default", "max_tokens": 64, "stream": True,
                          "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0})


if __name__ == "__main__":
    unittest.main()
