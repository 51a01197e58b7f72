"""The gateway on the real stack (cachestore, prefill and decode processes on
loopback, the default model with tests/fixtures/byte_tokenizer's Hugging
Face tokenizer files beside it), driven by the official `openai` package and
by curl:

- a three-turn chat whose turns 2 and 3 report cached tokens;
- streamed text equal to the whole reply at temperature 0, chat and completions;
- stop strings, logprobs, refusals in OpenAI's shape (400, 401, 404, 429);
- SSE framing as curl -N sees it;
- a client that disconnects mid-stream aborts its request at decode;
- tenants: the gateway calls decode over mutual TLS as a trusted proxy
  (decode: tenants by certificate, --trusted_proxies naming the gateway's
  identity), so a key's requests land in its tenant's cache namespace,
  while a direct gRPC client with its own certificate keeps working.

Runs under Bazel (system python3, //gateway:gateway), and from a fresh venv
with the pip-installed gateway and openai (venv_install_test.sh:
--bin BAZEL_BIN --gateway_cmd hybridserve-gateway --repo DIR).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import openai

from harness import request, start_gateway
from ready_process import ReadyProcess

WAIT_S = 60.0
ARGS = argparse.Namespace(bin=None, gateway_cmd=None, repo=None)


def repo_path(relative):
    if ARGS.repo:
        return os.path.join(ARGS.repo, relative)
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), relative)


def binary(relative):
    return os.path.join(ARGS.bin, relative) if ARGS.bin else repo_path(relative)


def tmp_root():
    return os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        pause.wait(0.02)


def metric(port, name, labels=""):
    """A counter's value from a /metrics page (0 when absent)."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else 0.0


class GatewayOnTheStack(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.processes = []
        cls.work = tempfile.mkdtemp(prefix="gateway-stack-", dir=tmp_root())
        try:
            cls._start()
        except Exception:
            cls.tearDownClass()
            raise

    @classmethod
    def _start(cls):
        # The model directory: the default model and the byte tokenizer's HF files.
        cls.model_dir = os.path.join(cls.work, "byte-model")
        os.makedirs(cls.model_dir)
        for name in ("config.json", "model.safetensors"):
            os.symlink(repo_path("models/default/" + name), os.path.join(cls.model_dir, name))
        fixture = repo_path("tests/fixtures/byte_tokenizer")
        for name in os.listdir(fixture):
            if name.endswith(".json"):
                shutil.copy(os.path.join(fixture, name), cls.model_dir)
        cls.certs = os.path.join(cls.work, "certs")
        # Debian's python3 has `cryptography` (tools/bootstrap.sh); a fresh venv may not.
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        subprocess.run([python, repo_path("tools/make_test_certs.py"), "--out", cls.certs], check=True,
                       stdout=subprocess.DEVNULL)
        cache = cls.start("cachestore", ["cachestore/server/cachestore", "--address=127.0.0.1:0",
                                         "--metrics_address="], "CACHESTORE_READY")
        cache_target = "127.0.0.1:" + cache.fields["port"]
        common = ["--model_dir=" + cls.model_dir, "--address=127.0.0.1:0", "--threads=1",
                  "--cachestore=" + cache_target]
        prefill = cls.start("prefill", ["prefill/prefill", "--metrics_address="] + common, "PREFILL_READY")
        prefill_target = "--prefill=127.0.0.1:" + prefill.fields["port"]
        # decode over TLS: tenants by client certificate; the gateway ("proxy") names its users' tenants.
        cls.decode = cls.start("decode", ["decode/decode", "--metrics_address=127.0.0.1:0", prefill_target] + common +
                               ["--tls_cert=" + cls.cert("decode.pem"), "--tls_key=" + cls.cert("decode.key"),
                                "--tls_client_ca=" + cls.cert("ca.pem"),
                                "--trusted_proxies=spiffe://hybridserve.test/proxy"], "DECODE_READY")
        cls.decode_metrics = int(cls.decode.fields["metrics_port"])
        # A small plaintext decode: one request at a time, none waiting (429s).
        small = cls.start("small_decode", ["decode/decode", "--metrics_address=", prefill_target, "--max_batch=1",
                                           "--max_waiting=0"] + common, "DECODE_READY")
        cls.keys_path = os.path.join(cls.work, "api_keys")
        with open(cls.keys_path, "w") as f:
            for key, tenant in (("key-a", "tenant-a"), ("key-b", "tenant-b")):
                digest = subprocess.run(
                    cls.gateway_argv("keys") + ["hash", "--tenant=" + tenant, key], check=True,
                    stdout=subprocess.PIPE, text=True).stdout
                f.write(digest)
        cls.gateway = cls.add(start_gateway(
            "127.0.0.1:" + cls.decode.fields["port"], cls.model_dir, "--api_keys=" + cls.keys_path,
            "--tls_ca=" + cls.cert("ca.pem"), "--tls_cert=" + cls.cert("proxy.pem"),
            "--tls_key=" + cls.cert("proxy.key"), binary=cls.gateway_argv()))
        cls.small_gateway = cls.add(start_gateway("127.0.0.1:" + small.fields["port"], cls.model_dir,
                                                  name="small_gateway", binary=cls.gateway_argv()))
        cls.client = openai.OpenAI(base_url=cls.gateway.base_url, api_key="key-a", max_retries=0, timeout=WAIT_S)
        cls.client_b = openai.OpenAI(base_url=cls.gateway.base_url, api_key="key-b", max_retries=0, timeout=WAIT_S)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def gateway_argv(cls, module=None):
        """The gateway (or its keys tool, module "keys") as a command."""
        if ARGS.gateway_cmd:
            if module:
                return [sys.executable, "-m", "hybridserve_gateway." + module]
            return [ARGS.gateway_cmd]
        if module:
            return [sys.executable, "-m", "hybridserve_gateway." + module]
        return [binary("gateway/gateway")]

    @classmethod
    def cert(cls, name):
        return os.path.join(cls.certs, name)

    @classmethod
    def start(cls, name, argv, ready):
        return cls.add(ReadyProcess(name, [binary(argv[0])] + argv[1:], ready, log_dir=cls.work))

    @classmethod
    def add(cls, process):
        cls.processes.append(process)
        return process

    @classmethod
    def tearDownClass(cls):
        problems = []
        for p in reversed(cls.processes):
            problems += p.stop()
        assert not problems, problems

    # ---- conversations ------------------------------------------------------

    def test_three_turn_chat_resumes_from_the_cache(self):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Tell me a fortune about the sea, please."}]
        cached = []
        for turn in range(3):
            reply = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=24,
                                                        temperature=0.0, user="three-turns")
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
            self.assertGreater(reply.usage.completion_tokens, 0)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "And another one, turn %d?" % (turn + 2)}]
        self.assertEqual(cached[0], 0)
        self.assertGreater(cached[1], 0, cached)
        self.assertGreater(cached[2], cached[1], cached)

    def test_streamed_text_equals_the_whole_reply(self):
        messages = [{"role": "user", "content": "Héllo wörld, what is new? ✓"}]
        whole = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=40,
                                                    temperature=0.0, user="stream-eq")
        chunks = list(self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=40,
                                                          temperature=0.0, user="stream-eq", stream=True,
                                                          stream_options={"include_usage": True}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(streamed, whole.choices[0].message.content)
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        completion = self.client.completions.create(model=self.model, prompt="Once upon a time", max_tokens=32,
                                                    temperature=0.0)
        pieces = list(self.client.completions.create(model=self.model, prompt="Once upon a time", max_tokens=32,
                                                     temperature=0.0, stream=True))
        self.assertEqual("".join(p.choices[0].text for p in pieces), completion.choices[0].text)
        self.assertEqual(len(completion.choices[0].text.encode()) > 0, True)

    def test_stop_strings_cut_the_text(self):
        free = self.client.completions.create(model=self.model, prompt="The quick brown fox", max_tokens=48,
                                              temperature=0.0, extra_body={"ignore_eos": True}).choices[0].text
        self.assertGreater(len(free), 20, free)
        # A stop string from the middle of the free text, not occurring earlier.
        at = next(i for i in range(8, len(free) - 3) if free.find(free[i:i + 3]) == i)
        stop = free[at:at + 3]
        for stream in (False, True):
            if stream:
                parts = list(self.client.completions.create(model=self.model, prompt="The quick brown fox",
                                                            max_tokens=48, temperature=0.0, stop=[stop, "\x00"],
                                                            stream=True, extra_body={"ignore_eos": True}))
                text = "".join(p.choices[0].text for p in parts)
                reason = parts[-1].choices[0].finish_reason
            else:
                choice = self.client.completions.create(model=self.model, prompt="The quick brown fox",
                                                        max_tokens=48, temperature=0.0, stop=[stop, "\x00"],
                                                        extra_body={"ignore_eos": True}).choices[0]
                text, reason = choice.text, choice.finish_reason
            self.assertEqual(text, free[:at], (stop, stream))
            self.assertEqual(reason, "stop")

    def test_logprobs_of_greedy_tokens(self):
        reply = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=12, temperature=0.0, logprobs=True, top_logprobs=3)
        content = reply.choices[0].logprobs.content
        self.assertEqual(len(content), reply.usage.completion_tokens - (reply.choices[0].finish_reason == "stop"))
        for entry in content:
            self.assertLessEqual(entry.logprob, 0.0)
            self.assertEqual(len(entry.top_logprobs), 3)
            self.assertEqual(entry.top_logprobs[0].logprob, entry.logprob)  # greedy: the most likely token
            self.assertEqual(entry.top_logprobs[0].token, entry.token)
            values = [t.logprob for t in entry.top_logprobs]
            self.assertEqual(values, sorted(values, reverse=True))
        text = bytes(b for entry in content for b in entry.bytes).decode("utf-8", errors="replace")
        self.assertEqual(text, reply.choices[0].message.content)

    # ---- refusals ------------------------------------------------------------

    def test_refusals_in_openai_shape(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt="x", max_tokens=1 << 20)
        self.assertEqual(e.exception.body["param"], "max_tokens")
        with self.assertRaises(openai.NotFoundError):
            self.client.completions.create(model="no-such-model", prompt="x")
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url=self.gateway.base_url, api_key="wrong", max_retries=0).completions.create(
                model=self.model, prompt="x")
        # 429: the small decode runs one request and queues none.
        port = self.small_gateway.port
        body = {"model": self.model, "prompt": "A long story:", "max_tokens": 4000, "stream": True,
                "ignore_eos": True}
        busy = socket.create_connection(("127.0.0.1", port))
        data = json.dumps(body).encode()
        busy.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        busy.settimeout(WAIT_S)
        self.assertTrue(busy.recv(4096).startswith(b"HTTP/1.1 200"))  # running: the first token arrived
        refused = request(port, "POST", "/v1/completions", {"model": self.model, "prompt": "x", "max_tokens": 2})
        busy.close()
        self.assertEqual(refused.status, 429, refused.raw)
        self.assertEqual(refused.error()["type"], "rate_limit_error")

    # ---- the wire and the client's departure --------------------------------

    def test_curl_sees_sse_framing(self):
        curl = shutil.which("curl")
        if curl is None:
            self.skipTest("curl is not installed")
        out = subprocess.run(
            [curl, "-sN", "--fail-with-body", self.gateway.base_url + "/chat/completions",
             "-H", "Authorization: Bearer key-a", "-H", "Content-Type: application/json",
             "-d", json.dumps({"model": self.model, "messages": [{"role": "user", "content": "Hi"}],
                               "max_tokens": 6, "temperature": 0, "stream": True,
                               "stream_options": {"include_usage": True}})],
            check=True, stdout=subprocess.PIPE, timeout=WAIT_S).stdout.decode()
        blocks = out.split("\n\n")
        self.assertEqual(blocks[-1], "")  # every event ends with a blank line
        data = [b for b in blocks[:-1] if not b.startswith(":")]  # ":" lines are keep-alive comments
        self.assertTrue(all(b.startswith("data: ") and "\n" not in b for b in data), data)
        self.assertEqual(data[-1], "data: [DONE]")
        events = [json.loads(b[len("data: "):]) for b in data[:-1]]
        self.assertEqual({e["object"] for e in events}, {"chat.completion.chunk"})
        self.assertEqual(len({e["id"] for e in events}), 1)
        self.assertIn("usage", events[-1])
        self.assertEqual(events[-1]["choices"], [])

    def test_a_client_that_disconnects_mid_stream_aborts_at_decode(self):
        aborts = metric(self.decode_metrics, "hybridserve_request_success_total", '{finished_reason="abort"}')
        tokens = metric(self.decode_metrics, "hybridserve_generation_tokens_total")
        body = json.dumps({"model": self.model, "prompt": "Tell me everything.", "max_tokens": 4000,
                           "stream": True, "ignore_eos": True}).encode()
        sock = socket.create_connection(("127.0.0.1", self.gateway.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.settimeout(WAIT_S)
        seen = b""
        while seen.count(b"data: ") < 4:  # mid-work: tokens are streaming
            seen += sock.recv(4096)
        sock.close()
        wait_for(lambda: metric(self.decode_metrics, "hybridserve_request_success_total",
                                '{finished_reason="abort"}') == aborts + 1, "decode's abort of the request")
        generated = metric(self.decode_metrics, "hybridserve_generation_tokens_total") - tokens
        self.assertLess(generated, 4000)  # ended by the abort, far before max_tokens

    # ---- tenants ---------------------------------------------------------------

    def test_a_keys_tenant_is_its_cache_namespace_at_decode(self):
        from hybridserve_client import Client  # the gRPC client: decode as the gateway sees it
        from hybridserve_gateway.service import cache_salt
        prompt = "A private note for tenant a only."
        first = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=8, temperature=0.0,
                                               user="ns", extra_body={"ignore_eos": True})
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)
        ids = self.tokenizer().encode(prompt) + [0]  # one new token: the cached prompt is a prefix
        target = "127.0.0.1:" + self.decode.fields["port"]
        proxy = dict(tls_ca=self.cert("ca.pem"), tls_cert=self.cert("proxy.pem"), tls_key=self.cert("proxy.key"))
        salt = cache_salt("tenant-a", "ns", None)
        with Client(target, timeout=WAIT_S, tenant_header="tenant-a", **proxy) as as_a:
            hit = as_a.generate(ids, max_tokens=1, cache_salt=salt)
        self.assertGreater(hit.usage.cached_tokens, 0)  # the gateway's request is in tenant-a's namespace
        with Client(target, timeout=WAIT_S, tenant_header="tenant-b", **proxy) as as_b:
            miss = as_b.generate(ids, max_tokens=1, cache_salt=salt)
        self.assertEqual(miss.usage.cached_tokens, 0)  # the same salt in another tenant: nothing
        # Through the gateway with key b, the same prompt and user: nothing of a's.
        other = self.client_b.completions.create(model=self.model, prompt=prompt, max_tokens=1, user="ns")
        self.assertEqual(other.usage.prompt_tokens_details.cached_tokens, 0)
        # A direct client with its own certificate beside the gateway: its certificate is its tenant.
        with Client(target, timeout=WAIT_S, tls_ca=self.cert("ca.pem"), tls_cert=self.cert("tenant_a.pem"),
                    tls_key=self.cert("tenant_a.key")) as direct:
            self.assertEqual(direct.generate(ids, max_tokens=1, cache_salt=salt).usage.cached_tokens, 0)
            with self.assertRaises(Exception) as forged:  # and it may not name a tenant
                Client(target, timeout=WAIT_S, tls_ca=self.cert("ca.pem"), tls_cert=self.cert("tenant_a.pem"),
                       tls_key=self.cert("tenant_a.key"), tenant_header="tenant-a").generate(ids, max_tokens=1)
            self.assertIn("PERMISSION_DENIED", str(forged.exception))

    def tokenizer(self):
        from hybridserve_client import load_tokenizer
        return load_tokenizer(self.model_dir)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", help="Bazel's bazel-bin (outside Bazel)")
    parser.add_argument("--gateway_cmd", help="the installed gateway's command (outside Bazel)")
    parser.add_argument("--repo", help="the repository's root (outside Bazel)")
    args, rest = parser.parse_known_args()
    ARGS.bin, ARGS.gateway_cmd, ARGS.repo = args.bin, args.gateway_cmd, args.repo
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
