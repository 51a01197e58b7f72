"""The Python client against the real stack (cachestore, prefill and decode
processes on loopback): two chat turns, the second resumed from the first's
turn-end state; a bad request raises with the server's status; streaming and
abort by id."""

import os
import subprocess
import unittest

import grpc

from ready_process import ReadyProcess
from hybridserve_client import (Client, FinishReason, HybridserveError, ResumeKind, SpecialToken, decode_bytes,
                                encode_bytes)


def _runfile(relative):
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), relative)


def _Process(name, binary, args, ready):
    return ReadyProcess(name, [_runfile(binary)] + args, ready, log_dir=os.environ.get("TEST_TMPDIR"))


class PythonClientOnTheStack(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        model = _runfile("models/default")
        cls.cachestore = _Process("cachestore", "cachestore/server/cachestore",
                                  ["--address=127.0.0.1:0", "--metrics_address="], "CACHESTORE_READY")
        cache = "127.0.0.1:" + cls.cachestore.fields["port"]
        cls.prefill = _Process("prefill", "prefill/prefill",
                               ["--model_dir=" + model, "--address=127.0.0.1:0", "--threads=1",
                                "--cachestore=" + cache], "PREFILL_READY")
        cls.decode = _Process("decode", "decode/decode",
                              ["--model_dir=" + model, "--address=127.0.0.1:0", "--threads=1",
                               "--prefill=127.0.0.1:" + cls.prefill.fields["port"], "--cachestore=" + cache],
                              "DECODE_READY")
        cls.client = Client("127.0.0.1:" + cls.decode.fields["port"], timeout=60)
        # A second decode worker with TLS on its client port, tenants by
        # client certificate (its calls to prefill and the cache stay
        # plaintext: no --tls_ca).
        cls.certs = os.path.join(os.environ["TEST_TMPDIR"], "certs")
        subprocess.run(["/usr/bin/python3", _runfile("tools/make_test_certs.py"), "--out", cls.certs], check=True)
        cls.tls_decode = _Process("tls_decode", "decode/decode",
                                  ["--model_dir=" + model, "--address=127.0.0.1:0", "--threads=1",
                                   "--prefill=127.0.0.1:" + cls.prefill.fields["port"], "--cachestore=" + cache,
                                   "--tls_cert=" + cls.cert("decode.pem"), "--tls_key=" + cls.cert("decode.key"),
                                   "--tls_client_ca=" + cls.cert("ca.pem")], "DECODE_READY")

    @classmethod
    def cert(cls, name):
        return os.path.join(cls.certs, name)

    def tls_client(self, identity=None, **kwargs):
        files = {}
        if identity:
            files = {"tls_cert": self.cert(identity + ".pem"), "tls_key": self.cert(identity + ".key")}
        return Client("127.0.0.1:" + self.tls_decode.fields["port"], timeout=60, tls_ca=self.cert("ca.pem"),
                      **files, **kwargs)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        problems = []
        for p in (cls.tls_decode, cls.decode, cls.prefill, cls.cachestore):
            problems += p.stop()
        # Each service exits 0 on SIGTERM, with no sanitizer report.
        assert not problems, problems

    def test_model_info(self):
        info = self.client.model_info()
        self.assertEqual(info.model_name, "default")  # the directory's name, not its path
        self.assertEqual(info.vocab_size, 259)
        self.assertEqual(list(info.eos_token_ids), [258])
        # models/default has no tokenizer files: config.json's eos id, unnamed.
        self.assertEqual(info.end_of_turn_tokens, (SpecialToken(258, ""),))

    def test_text_and_chat_with_the_byte_vocabulary(self):
        by_text = self.client.generate(text="Hello there", max_tokens=8, temperature=0.0, ignore_eos=True,
                                       cache_salt="py-text")
        by_ids = self.client.generate(encode_bytes("Hello there", add_bos=True), max_tokens=8, temperature=0.0,
                                      ignore_eos=True, cache_salt="py-ids")
        self.assertEqual(by_text.token_ids, by_ids.token_ids)
        self.assertEqual(by_text.text, decode_bytes(by_ids.token_ids))
        reply = self.client.chat([{"role": "user", "content": "Who are you?"}], max_tokens=64, seed=3,
                                 cache_salt="py-chat")
        self.assertEqual(reply.usage.prompt_tokens, len(encode_bytes("Q: Who are you?\nA:", add_bos=True)))
        self.assertEqual(reply.text, decode_bytes(reply.token_ids))

    def test_second_turn_resumes_from_the_first(self):
        history = encode_bytes("Hello there, how are you today?\n", add_bos=True)
        first = self.client.generate(history, max_tokens=12, temperature=0.0, ignore_eos=True, cache_salt="py")
        self.assertEqual(len(first.token_ids), 12)
        self.assertEqual(first.usage.cached_tokens, 0)
        history = history + list(first.token_ids) + encode_bytes("Tell me more.\n")
        second = self.client.generate(history, max_tokens=12, temperature=0.0, ignore_eos=True, cache_salt="py")
        self.assertEqual(second.usage.prompt_tokens, len(history))
        self.assertEqual(second.usage.cached_tokens, len(history) - len(encode_bytes("Tell me more.\n")) - 1)
        self.assertEqual(second.usage.resume_kind, ResumeKind.EXACT_PREFIX)
        self.assertTrue(second.usage.session.published)

    def test_session_retention_is_reported(self):
        result = self.client.generate(encode_bytes("Keep this one.\n", add_bos=True), max_tokens=4,
                                      ignore_eos=True, cache_salt="py-session", session_keep=90, session_pin=True)
        self.assertTrue(result.usage.session.published)
        self.assertTrue(result.usage.session.pinned, result.usage.session.pin_refused_reason)
        self.assertEqual(result.usage.session.keep_seconds, 90)

    def test_bad_request_raises_with_the_status(self):
        with self.assertRaises(HybridserveError) as e:
            self.client.generate([257, 400], max_tokens=4)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("prompt", str(e.exception))

    def test_tenants_by_certificate_over_tls(self):
        history = encode_bytes("A private conversation.\n", add_bos=True)
        with self.tls_client("tenant_a") as a, self.tls_client("tenant_b") as b:
            first = a.generate(history, max_tokens=8, ignore_eos=True, cache_salt="same")
            self.assertEqual(first.usage.cached_tokens, 0)
            history = history + list(first.token_ids) + encode_bytes("And then?\n")
            resumed = a.generate(history, max_tokens=4, ignore_eos=True, cache_salt="same")
            self.assertEqual(resumed.usage.resume_kind, ResumeKind.EXACT_PREFIX)
            # Tenant B, A's exact prompt and salt: nothing of A's.
            copied = b.generate(history, max_tokens=4, ignore_eos=True, cache_salt="same")
            self.assertEqual(copied.usage.cached_tokens, 0)
        with self.tls_client(None) as anonymous:
            with self.assertRaises(HybridserveError) as e:
                anonymous.generate(history, max_tokens=1)
            self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)  # no certificate: no handshake
        with self.tls_client("tenant_b", tenant_header="spiffe://hybridserve.test/tenant_a") as forged:
            with self.assertRaises(HybridserveError) as e:
                forged.generate(history, max_tokens=1)
            self.assertEqual(e.exception.code, grpc.StatusCode.PERMISSION_DENIED)
        with self.assertRaises(ValueError):
            Client("127.0.0.1:1", tls_cert=self.cert("tenant_a.pem"))

    def test_stream_then_abort(self):
        stream = self.client.stream(encode_bytes("Once upon a time", add_bos=True), max_tokens=4000,
                                    ignore_eos=True, request_id="py-abort")
        chunks = iter(stream)
        next(chunks)  # the first chunk arrived: the request is live
        self.assertEqual(self.client.abort(["py-abort"]), ["py-abort"])
        for _ in chunks:
            pass
        self.assertEqual(stream.result.finish_reason, FinishReason.ABORT)
        self.assertLess(len(stream.result.token_ids), 4000)


if __name__ == "__main__":
    unittest.main()
