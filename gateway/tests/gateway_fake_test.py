"""The gateway process against a scripted decode (an in-process Generation
server): exactly what it sends decode, and what it answers for every reply
decode can give, including the ones a real decode gives only under faults
(RESOURCE_EXHAUSTED, UNAVAILABLE, an error after the first token). Then the
HTTP edges: API keys and their reload, client disconnects reaching decode,
SIGTERM's drain, and clients that are slow, huge or truncated.

The real stack through the official openai client: gateway_stack_test.py.
"""

import json
import os
import signal
import socket
import tempfile
import threading
import time
import unittest

import grpc
import openai

from fake_generation_server import FakeServer, chunk, complete
from harness import request, runfile, sse_events, start_gateway
from hybridserve_client.proto import generation_pb2 as pb
from hybridserve_gateway.keys import hash_key

MODEL = "fake-model"
WAIT_S = 30.0  # bound on every wait for a condition


def model_info(request_, context):
    return pb.ModelInfo(model_name=MODEL, vocab_size=259, max_context_tokens=512, eos_token_ids=[258],
                        chunk_size=16, page_size=16, checkpoint_interval=64, fingerprint="ab" * 16,
                        end_of_turn_tokens=[pb.SpecialToken(id=258, text="")])


def byte_chunks(*pieces):
    """One chunk per piece, each the piece's UTF-8 bytes as byte-vocabulary ids."""
    return [chunk(list(p.encode("utf-8")) if isinstance(p, str) else list(p)) for p in pieces]


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT_S
    event = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        event.wait(0.01)


class GatewayAgainstScriptedDecode(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.fake = FakeServer()
        cls.decode = cls.fake.servicer
        cls.decode.model_info_script = model_info
        cls.decode.abort_script = lambda request_, context: pb.AbortResponse(
            aborted_request_ids=list(request_.request_ids))
        cls.model_dir = runfile("models/default")  # the byte vocabulary
        cls.gateway = start_gateway(cls.fake.target, cls.model_dir, "--max_body_bytes=65536",
                                    "--header_read_timeout=1s", "--body_read_timeout=1s",
                                    "--default_max_tokens=100")
        cls.client = openai.OpenAI(base_url=cls.gateway.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)

    @classmethod
    def tearDownClass(cls):
        problems = cls.gateway.stop()
        cls.fake.stop()
        assert not problems, problems

    def setUp(self):
        self.decode.requests.clear()

    def generates(self):
        return [r for r in self.decode.requests if isinstance(r, pb.GenerateRequest)]

    def script(self, responses):
        self.decode.generate_script = lambda request_, context: iter(responses)

    # ---- what decode is sent, what the client gets -------------------------

    def test_completion_is_sent_as_token_ids_and_answered_as_text(self):
        # "wörld ✓": ö and ✓ split across chunks; the text never shows half a character.
        self.script(byte_chunks("Hello, w", b"\xc3", b"\xb6rld ", b"\xe2\x9c", b"\x93") +
                    [complete(pb.FINISH_REASON_LENGTH, prompt_tokens=6, completion_tokens=17, cached_tokens=4)])
        reply = self.client.completions.create(model=MODEL, prompt="Hello", max_tokens=17, temperature=0.0,
                                               seed=7, top_p=0.5)
        self.assertEqual(reply.choices[0].text, "Hello, wörld ✓")
        self.assertEqual(reply.choices[0].finish_reason, "length")
        self.assertEqual(reply.usage.prompt_tokens, 6)
        self.assertEqual(reply.usage.completion_tokens, 17)
        self.assertEqual(reply.usage.prompt_tokens_details.cached_tokens, 4)
        sent = self.generates()[0]
        self.assertEqual(list(sent.prompt_token_ids), [257] + list(b"Hello"))
        self.assertEqual(sent.stop.max_tokens, 17)
        self.assertEqual(list(sent.stop.stop_token_ids), [])  # a completion stops at EOS only
        self.assertEqual(sent.sampling.temperature, 0.0)
        self.assertAlmostEqual(sent.sampling.top_p, 0.5)
        self.assertEqual(sent.sampling.seed, 7)
        self.assertEqual(sent.cache_salt, "")  # no key, user or prompt_cache_key
        self.assertTrue(sent.request_id.startswith("cmpl-"))

    def test_chat_sends_the_template_and_the_end_of_turn(self):
        self.script(byte_chunks("Paris.") + [complete(pb.FINISH_REASON_STOP, stop_token_id=258, prompt_tokens=9,
                                                      completion_tokens=7)])
        reply = self.client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": [{"type": "text", "text": "Capital of "},
                                                                {"type": "text", "text": "France?"}]}])
        self.assertEqual(reply.choices[0].message.content, "Paris.")
        self.assertEqual(reply.choices[0].message.role, "assistant")
        self.assertEqual(reply.choices[0].finish_reason, "stop")
        sent = self.generates()[0]
        # The byte vocabulary's framing: <bos>, each user message as "Q: ...\nA:" (system skipped).
        self.assertEqual(list(sent.prompt_token_ids), [257] + list(b"Q: Capital of France?\nA:"))
        self.assertEqual(list(sent.stop.stop_token_ids), [258])
        self.assertEqual(sent.sampling.temperature, 1.0)  # OpenAI's default
        self.assertEqual(sent.stop.max_tokens, 100)  # --default_max_tokens
        self.assertTrue(sent.request_id.startswith("chatcmpl-"))

    def test_stream_is_the_whole_reply_in_pieces(self):
        pieces = byte_chunks("Hel", "lo ", b"\xe6\x97", b"\xa5", " end") + [
            complete(pb.FINISH_REASON_LENGTH, prompt_tokens=3, completion_tokens=11, cached_tokens=2)]
        self.script(pieces)
        whole = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=11)
        self.script(pieces)
        stream = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                     max_tokens=11, stream=True,
                                                     stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(text, "Hello 日 end")
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")
        self.assertEqual(chunks[-1].choices, [])  # include_usage: a last chunk with the usage only
        self.assertEqual(chunks[-1].usage.prompt_tokens_details.cached_tokens, 2)
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))

    def test_sse_framing_on_the_wire(self):
        self.script(byte_chunks("ab", "c") + [complete(pb.FINISH_REASON_LENGTH, completion_tokens=3)])
        reply = request(self.gateway.port, "POST", "/v1/completions",
                        {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True})
        self.assertEqual(reply.status, 200)
        self.assertTrue(reply.headers["content-type"].startswith("text/event-stream"))
        body = reply.raw.decode()
        self.assertTrue(body.endswith("data: [DONE]\n\n"), body[-100:])
        events = sse_events(reply.raw)
        self.assertEqual(events[-1], "[DONE]")
        texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
        self.assertEqual("".join(texts), "abc")  # in 1 or 2 events: tokens queued together go out together
        self.assertEqual(texts[-1], "")
        self.assertEqual(json.loads(events[-2])["choices"][0]["finish_reason"], "length")

    def test_stop_string_across_tokens_ends_the_request_at_decode(self):
        for stream in (False, True):
            self.decode.requests.clear()
            self.script(byte_chunks("ab", "cE", "N", "Dxyz", "more") +
                        [complete(pb.FINISH_REASON_ABORT, prompt_tokens=2, completion_tokens=5, cached_tokens=1)])
            if stream:
                chunks = list(self.client.completions.create(model=MODEL, prompt="x", max_tokens=50,
                                                             stop=["END", "zz"], stream=True))
                text = "".join(c.choices[0].text for c in chunks)
                reason = chunks[-1].choices[0].finish_reason
            else:
                reply = self.client.completions.create(model=MODEL, prompt="x", max_tokens=50, stop=["END", "zz"])
                text, reason = reply.choices[0].text, reply.choices[0].finish_reason
                self.assertEqual(reply.usage.prompt_tokens_details.cached_tokens, 1)  # from decode's `complete`
            self.assertEqual(text, "abc")  # never "abcE" or "abcEN": held until told apart
            self.assertEqual(reason, "stop")
            request_id = self.generates()[0].request_id
            wait_for(lambda: any(isinstance(r, pb.AbortRequest) and list(r.request_ids) == [request_id]
                                 for r in self.decode.requests), "the Abort of " + request_id)

    def test_a_stop_prefix_that_never_completes_is_released(self):
        self.script(byte_chunks("xE", "N") + [complete(pb.FINISH_REASON_LENGTH, completion_tokens=3)])
        reply = self.client.completions.create(model=MODEL, prompt="x", max_tokens=3, stop="END")
        self.assertEqual(reply.choices[0].text, "xEN")
        self.assertEqual(reply.choices[0].finish_reason, "length")

    def test_logprobs(self):
        self.script([chunk([72, 105], logprobs=[-0.5, -1.25], top_logprobs=[[(72, -0.5), (74, -2.0)],
                                                                            [(105, -1.25), (33, -1.5)]]),
                     complete(pb.FINISH_REASON_LENGTH, completion_tokens=2)])
        reply = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=2, logprobs=True, top_logprobs=2)
        sent = self.generates()[0]
        self.assertTrue(sent.return_logprobs)
        self.assertEqual(sent.top_logprobs, 2)
        content = reply.choices[0].logprobs.content
        self.assertEqual([(c.token, c.logprob, c.bytes) for c in content], [("H", -0.5, [72]), ("i", -1.25, [105])])
        self.assertEqual([(t.token, t.logprob) for t in content[1].top_logprobs], [("i", -1.25), ("!", -1.5)])
        # Legacy completions: tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset.
        self.script([chunk([72, 105], logprobs=[-0.5, -1.25], top_logprobs=[[(72, -0.5)], [(105, -1.25)]]),
                     complete(pb.FINISH_REASON_LENGTH, completion_tokens=2)])
        legacy = self.client.completions.create(model=MODEL, prompt="x", max_tokens=2, logprobs=1).choices[0]
        self.assertEqual(legacy.logprobs.tokens, ["H", "i"])
        self.assertEqual(legacy.logprobs.token_logprobs, [-0.5, -1.25])
        self.assertEqual(legacy.logprobs.top_logprobs, [{"H": -0.5}, {"i": -1.25}])
        self.assertEqual(legacy.logprobs.text_offset, [0, 1])

    def test_cache_salt_follows_user_and_prompt_cache_key(self):
        salts = []
        for extra in ({}, {"user": "u1"}, {"user": "u2"}, {"user": "u1", "prompt_cache_key": "k"}, {"user": "u1"}):
            self.decode.requests.clear()
            self.script([complete(pb.FINISH_REASON_LENGTH)])
            key = extra.pop("prompt_cache_key", None)
            self.client.completions.create(model=MODEL, prompt="x", max_tokens=1, **extra,
                                           extra_body={"prompt_cache_key": key} if key else None)
            salts.append(self.generates()[0].cache_salt)
        self.assertEqual(salts[0], "")
        self.assertEqual(len(set(salts[:4])), 4)
        self.assertEqual(salts[1], salts[4])

    # ---- decode's refusals and failures as HTTP statuses ---------------------

    def refuse(self, code, details):
        def script(request_, context):
            context.abort(code, details)
            yield  # pragma: no cover
        self.decode.generate_script = script

    def test_decode_refusals_map_to_openai_statuses(self):
        cases = [(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens (9000) with the prompt exceeds the context", 400,
                  "max_tokens"),
                 (grpc.StatusCode.RESOURCE_EXHAUSTED, "the wait queue is full", 429, None),
                 (grpc.StatusCode.UNAVAILABLE, "draining", 503, None),
                 (grpc.StatusCode.INTERNAL, "boom", 500, None)]
        for code, details, status, param in cases:
            for stream in (False, True):
                self.refuse(code, details)
                reply = request(self.gateway.port, "POST", "/v1/completions",
                                {"model": MODEL, "prompt": "x", "max_tokens": 5, "stream": stream})
                self.assertEqual(reply.status, status, (code, stream, reply.raw))
                error = reply.error()
                self.assertIn(details, error["message"])
                self.assertEqual(error["param"], param)
        self.refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        with self.assertRaises(openai.RateLimitError):
            self.client.completions.create(model=MODEL, prompt="x", max_tokens=5)

    def test_failure_after_the_first_token(self):
        failing = byte_chunks("par") + [complete(pb.FINISH_REASON_ERROR, error_message="engine fault")]
        self.script(failing)
        reply = request(self.gateway.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 5})
        self.assertEqual(reply.status, 500)
        self.assertIn("engine fault", reply.error()["message"])
        self.script(failing)
        streamed = request(self.gateway.port, "POST", "/v1/completions",
                           {"model": MODEL, "prompt": "x", "max_tokens": 5, "stream": True})
        self.assertEqual(streamed.status, 200)  # the status line went out with the first token
        events = sse_events(streamed.raw)
        self.assertEqual(json.loads(events[0])["choices"][0]["text"], "par")
        self.assertIn("engine fault", json.loads(events[-2])["error"]["message"])
        self.assertEqual(events[-1], "[DONE]")
        self.script(failing)
        with self.assertRaises(openai.APIError):
            list(self.client.completions.create(model=MODEL, prompt="x", max_tokens=5, stream=True))

    # ---- bad input, each named ---------------------------------------------

    def test_bad_requests_name_the_parameter(self):
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        cases = [
            ("/v1/chat/completions", dict(chat, temperature=3), 400, "temperature"),
            ("/v1/chat/completions", dict(chat, top_p=0), 400, "top_p"),
            ("/v1/chat/completions", dict(chat, n=2), 400, "n"),
            ("/v1/chat/completions", dict(chat, max_tokens=0), 400, "max_tokens"),
            ("/v1/chat/completions", dict(chat, max_tokens="5"), 400, "max_tokens"),
            ("/v1/chat/completions", dict(chat, max_completion_tokens=600), 400, "max_completion_tokens"),
            ("/v1/chat/completions", dict(chat, top_logprobs=21, logprobs=True), 400, "top_logprobs"),
            ("/v1/chat/completions", dict(chat, top_logprobs=2), 400, "top_logprobs"),
            ("/v1/chat/completions", dict(chat, frequency_penalty=0.5), 400, "frequency_penalty"),
            ("/v1/chat/completions", dict(chat, stop=[""]), 400, "stop"),
            ("/v1/chat/completions", dict(chat, stream_options={"include_usage": True}), 400, "stream_options"),
            ("/v1/chat/completions", dict(chat, response_format={"type": "json_object"}), 400, "response_format"),
            ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
            ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
            ("/v1/chat/completions", {"messages": chat["messages"]}, 400, "model"),
            ("/v1/chat/completions", dict(chat, messages=[{"content": "x"}]), 400, "messages[0].role"),
            ("/v1/chat/completions",
             dict(chat, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
             400, "messages[0].content[0]"),
            ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": [257, 9999]}, 400, "prompt"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 6}, 400, "logprobs"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "echo": True}, 400, "echo"),
            ("/v1/completions", {"model": MODEL, "prompt": "x" * 600}, 400, "prompt"),
            ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "model"),
        ]
        for path, body, status, param in cases:
            reply = request(self.gateway.port, "POST", path, body)
            self.assertEqual(reply.status, status, (body, reply.raw))
            self.assertEqual(reply.error()["param"], param, (body, reply.raw))
            self.assertTrue(reply.error()["message"])
        self.assertEqual(self.generates(), [])  # none reached decode

    def test_malformed_bodies_and_paths(self):
        port = self.gateway.port
        for raw in (b"{", b"[1, 2]", b"\xff\xfe", b"", b'{"model": "fake-model", "prompt": "x"'):
            reply = request(port, "POST", "/v1/completions", raw=raw)
            self.assertEqual(reply.status, 400, raw)
            self.assertEqual(reply.error()["type"], "invalid_request_error")
        too_big = request(port, "POST", "/v1/completions", raw=b'{"prompt": "' + b"x" * 70000 + b'"}')
        self.assertEqual(too_big.status, 413)
        self.assertEqual(too_big.error()["code"], "request_too_large")
        self.assertEqual(request(port, "GET", "/v1/nothing").status, 404)
        self.assertEqual(request(port, "GET", "/v1/nothing").error()["code"], "not_found")
        self.assertEqual(request(port, "GET", "/v1/completions").status, 405)
        self.assertIn("error", request(port, "GET", "/v1/completions").json)
        models = request(port, "GET", "/v1/models").json
        self.assertEqual([m["id"] for m in models["data"]], [MODEL])
        self.assertEqual(request(port, "GET", "/v1/models/" + MODEL).json["id"], MODEL)
        self.assertEqual(request(port, "GET", "/v1/models/other").status, 404)
        self.assertEqual(request(port, "GET", "/health/live").status, 200)
        metrics = request(port, "GET", "/metrics").raw.decode()
        self.assertIn('hybridserve_gateway_requests_total{endpoint="completions",status="413"}', metrics)
        self.assertEqual(self.generates(), [])

    def test_random_bodies_never_crash_the_gateway(self):
        """Valid bodies with one field replaced by a value of another type,
        range or shape: every answer is 200 or a 4xx in OpenAI's shape, and
        the gateway keeps serving."""
        import random
        rng = random.Random(48)
        values = [None, True, False, 0, -1, 1, 2 ** 64, -2 ** 70, 0.5, -0.5, 3.5, 1e308, "", "x", "\u0000", "é" * 300,
                  [], [1], [-1], ["a", "b"], [[1, 2]], [[]], {}, {"a": 1}, {"type": "text"},
                  [{"role": "user", "content": {"x": 1}}], [{"role": 1, "content": "x"}],
                  [{"role": "user", "content": [{"type": "text", "text": 5}]}], [{"role": "tool", "content": None}],
                  [{"type": "function", "function": {"name": "f"}}], [{}]]
        chat_fields = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                       "seed", "stop", "stream", "stream_options", "n", "user", "prompt_cache_key", "logprobs",
                       "top_logprobs", "tools", "tool_choice", "response_format", "chat_template_kwargs",
                       "ignore_eos", "presence_penalty", "logit_bias"]
        completion_fields = ["model", "prompt", "max_tokens", "logprobs", "echo", "suffix", "best_of", "stop", "seed"]
        statuses = {}
        for i in range(1500):
            chat = i % 2 == 0
            if chat:
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
                fields = chat_fields
            else:
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
                fields = completion_fields
            for _ in range(rng.randint(1, 3)):
                body[rng.choice(fields)] = rng.choice(values)
            self.script(byte_chunks("ok") + [complete(pb.FINISH_REASON_LENGTH, completion_tokens=2)])
            path = "/v1/chat/completions" if chat else "/v1/completions"
            reply = request(self.gateway.port, "POST", path, body)
            statuses[reply.status] = statuses.get(reply.status, 0) + 1
            self.assertLess(reply.status, 500, (body, reply.raw[:300]))
            if reply.status != 200:
                self.assertTrue(reply.error()["message"], body)
        self.assertIn(200, statuses)
        self.assertIn(400, statuses)
        self.script([complete(pb.FINISH_REASON_LENGTH)])
        self.assertEqual(request(self.gateway.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x"}).status,
                         200)

    # ---- clients that go away, or that are slow or huge --------------------

    def blocking_script(self, first=None):
        """Generate yields `first` (if any) then blocks until the call is cancelled; returns the event set then."""
        cancelled = threading.Event()

        def script(request_, context):
            context.add_callback(cancelled.set)
            if first is not None:
                yield first
            cancelled.wait(WAIT_S)
        self.decode.generate_script = script
        return cancelled

    def test_a_client_that_disconnects_cancels_the_call_at_decode(self):
        body = {"model": MODEL, "prompt": "x", "max_tokens": 500}
        for stream, first in ((True, chunk([65])), (False, None), (True, None)):
            cancelled = self.blocking_script(first)
            data = json.dumps(dict(body, stream=stream)).encode()
            sock = socket.create_connection(("127.0.0.1", self.gateway.port))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
            wait_for(lambda: len(self.generates()) == 1, "the Generate call")
            if first is not None:  # mid-stream: the first token reached the client
                self.assertIn(b'"text":"A"', _read_until(sock, b'"text":"A"'))
            sock.close()
            self.assertTrue(cancelled.wait(WAIT_S), "decode's call was not cancelled (stream=%s)" % stream)
            self.decode.requests.clear()

    def test_slow_loris_huge_header_and_truncated_body_are_bounded(self):
        port = self.gateway.port
        # Headers that never end: closed after --header_read_timeout (1 s here).
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        slow.settimeout(WAIT_S)
        self.assertEqual(_read_all(slow), b"")  # closed unanswered
        # A head over the buffer: 431.
        huge = request(port, "GET", "/v1/models", headers={"X-Huge": "a" * (200 << 10)})
        self.assertEqual(huge.status, 431)
        # A body that stops arriving: 408 after --body_read_timeout.
        truncated = socket.create_connection(("127.0.0.1", port))
        truncated.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{\"model\": ")
        truncated.settimeout(WAIT_S)
        answer = _read_all(truncated)
        self.assertTrue(answer.startswith(b"HTTP/1.1 408"), answer[:200])
        self.assertIn(b"request_timeout", answer)
        # The gateway still serves.
        self.script([complete(pb.FINISH_REASON_LENGTH)])
        self.assertEqual(request(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x"}).status, 200)


def _read_until(sock, marker):
    data = b""
    sock.settimeout(WAIT_S)
    while marker not in data:
        more = sock.recv(4096)
        if not more:
            break
        data += more
    return data


def _read_all(sock):
    data = b""
    while True:
        more = sock.recv(4096)
        if not more:
            return data
        data += more


class ApiKeysAndTenants(unittest.TestCase):
    """A gateway with --api_keys: 401s in OpenAI's shape, one cache salt per
    tenant, and the file reloaded when it changes."""

    @classmethod
    def setUpClass(cls):
        cls.fake = FakeServer()
        cls.fake.servicer.model_info_script = model_info
        cls.fake.servicer.generate_script = lambda request_, context: iter([complete(pb.FINISH_REASON_LENGTH)])
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.keys_path = os.path.join(cls.dir, "api_keys")
        cls.write_keys({"key-a": "tenant-a", "key-b": "tenant-b"})
        cls.gateway = start_gateway(cls.fake.target, runfile("models/default"), "--api_keys=" + cls.keys_path,
                                    name="keyed_gateway")

    @classmethod
    def tearDownClass(cls):
        problems = cls.gateway.stop()
        cls.fake.stop()
        assert not problems, problems

    @classmethod
    def write_keys(cls, keys, garbage=False):
        """Written and renamed into place, as a Secret update swaps its files."""
        text = "# tenants\n" + "".join("sha256:%s %s\n" % (hash_key(k), t) for k, t in keys.items())
        if garbage:
            text += "not a key line\n"
        tmp = cls.keys_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, cls.keys_path)

    def call(self, key, **extra):
        headers = {"Authorization": "Bearer " + key} if key is not None else {}
        return request(self.gateway.port, "POST", "/v1/completions",
                       dict({"model": MODEL, "prompt": "x", "max_tokens": 1}, **extra), headers=headers)

    def test_missing_or_unknown_keys_get_401(self):
        for key, code in ((None, "missing_api_key"), ("key-z", "invalid_api_key"), ("", "missing_api_key")):
            reply = self.call(key)
            self.assertEqual(reply.status, 401)
            self.assertEqual(reply.error()["code"], code)
        self.assertEqual(request(self.gateway.port, "GET", "/v1/models").status, 401)
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url=self.gateway.base_url, api_key="key-z", max_retries=0).models.list()
        self.assertEqual(request(self.gateway.port, "GET", "/health/live").status, 200)  # probes need no key

    def test_each_tenant_has_its_own_cache_salt(self):
        salts = {}
        for key in ("key-a", "key-b"):
            self.fake.servicer.requests.clear()
            self.assertEqual(self.call(key, user="same-user").status, 200)
            salts[key] = self.fake.servicer.requests[-1].cache_salt
        self.assertNotEqual(salts["key-a"], salts["key-b"])
        self.assertNotEqual(salts["key-a"], "")

    def test_keys_file_is_reloaded_and_a_bad_edit_keeps_the_old_keys(self):
        self.assertEqual(self.call("key-c").status, 401)
        self.write_keys({"key-a": "tenant-a", "key-b": "tenant-b", "key-c": "tenant-c"})
        wait_for(lambda: self.call("key-c").status == 200, "key-c accepted after the reload")
        self.write_keys({"key-d": "tenant-d"}, garbage=True)  # does not parse: ignored
        metrics = lambda: request(self.gateway.port, "GET", "/metrics").raw.decode()  # noqa: E731
        wait_for(lambda: 'hybridserve_gateway_api_key_reloads_total{result="failed"}' in metrics(),
                 "the failed reload")
        self.assertEqual(self.call("key-c").status, 200)
        self.assertEqual(self.call("key-d").status, 401)
        self.write_keys({"key-a": "tenant-a", "key-b": "tenant-b"})
        wait_for(lambda: self.call("key-c").status == 401, "key-c revoked")


class Readiness(unittest.TestCase):
    """/health follows decode's readiness over the pods the checks reach:
    one draining pod among serving ones (checks alternate between them, as
    round robin spreads them) keeps the gateway ready; no pod serving makes
    it unready."""

    def test_one_draining_pod_does_not_unready_the_gateway(self):
        from concurrent import futures
        from hybridserve_client.proto import generation_pb2_grpc as pb_grpc
        answers = {"n": 0, "mode": "alternate"}
        lock = threading.Lock()

        def check(request_, context):
            with lock:
                answers["n"] += 1
                serving = answers["mode"] == "alternate" and answers["n"] % 2 == 0
            return b"\x08\x01" if serving else b"\x08\x02"  # HealthCheckResponse: SERVING / NOT_SERVING
        servicer = __import__("fake_generation_server").FakeGeneration()
        servicer.model_info_script = model_info
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_GenerationServicer_to_server(servicer, server)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": grpc.unary_unary_rpc_method_handler(check)})])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        gateway = start_gateway("127.0.0.1:%d" % port, runfile("models/default"), name="ready_gateway")
        try:
            wait_for(lambda: request(gateway.port, "GET", "/health").status == 200, "ready")
            seen = answers["n"]
            deadline = time.monotonic() + WAIT_S
            while answers["n"] < seen + 8:  # the gateway's next 8 checks: 4 answered NOT_SERVING
                self.assertLess(time.monotonic(), deadline, "the gateway stopped checking decode")
                self.assertEqual(request(gateway.port, "GET", "/health").status, 200)
                threading.Event().wait(0.05)
            answers["mode"] = "none"
            wait_for(lambda: request(gateway.port, "GET", "/health").status == 503, "unready once no pod serves")
        finally:
            problems = gateway.stop()
            server.stop(grace=None)
        self.assertEqual(problems, [])


class Drain(unittest.TestCase):
    """SIGTERM: /health 503 and new requests 503 while the request in flight finishes; then exit 0."""

    def test_sigterm_drains(self):
        fake = FakeServer()
        fake.servicer.model_info_script = model_info
        release = threading.Event()
        started = threading.Event()

        def script(request_, context):
            started.set()
            yield chunk(list(b"first "))
            release.wait(WAIT_S)
            yield chunk(list(b"second"))
            yield complete(pb.FINISH_REASON_LENGTH, completion_tokens=12)
        fake.servicer.generate_script = script
        gateway = start_gateway(fake.target, runfile("models/default"), name="drained_gateway")
        try:
            client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
            result = {}

            def stream():
                chunks = client.completions.create(model=MODEL, prompt="x", max_tokens=12, stream=True)
                result["text"] = "".join(c.choices[0].text for c in chunks)
            thread = threading.Thread(target=stream)
            thread.start()
            self.assertTrue(started.wait(WAIT_S))
            self.assertEqual(request(gateway.port, "GET", "/health").status, 200)
            gateway.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: request(gateway.port, "GET", "/health").status == 503, "/health 503 while draining")
            refused = request(gateway.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x"})
            self.assertEqual(refused.status, 503)
            self.assertEqual(refused.error()["code"], "draining")
            self.assertIsNone(gateway.proc.poll())  # still serving the stream in flight
            release.set()
            thread.join(WAIT_S)
            self.assertEqual(result.get("text"), "first second")
            self.assertEqual(gateway.proc.wait(WAIT_S), 0)
        finally:
            release.set()
            problems = gateway.stop()
            fake.stop()
        self.assertEqual(problems, [])


if __name__ == "__main__":
    unittest.main()
