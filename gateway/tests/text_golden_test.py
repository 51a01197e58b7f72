"""Text equality with transformers (issue 48): for each byte-vocabulary model of
tests/fixtures/text_golden (tools/make_text_golden.py: transformers' greedy
generate + decode of each prompt, with tests/fixtures/byte_tokenizer's
tokenizer), on the real stack (cachestore, prefill, decode, the gateway):

- the engine generates transformers' greedy ids (through the Python client,
  from the fixture's prompt ids): where the text differs, this says whether
  the engine or the gateway parted;
- the gateway's /v1/completions (the prompt text) and /v1/chat/completions (the
  messages), temperature 0, max_tokens the fixture's, called with the official
  `openai` package, return transformers' text exactly (each byte sequence that
  is not UTF-8 a U+FFFD, as transformers decodes it), the same finish reason
  and the prompt's token count; streamed, the deltas concatenate to that text.

One stack per model, on a model directory holding the model's config.json and
model.safetensors and the byte tokenizer's files; its name is the fixture's
model name, which decode serves.
"""

import glob
import json
import os
import shutil
import tempfile
import unittest

import openai

from harness import log_dir, runfile, start_gateway
from hybridserve_client import Client, FinishReason
from ready_process import ReadyProcess


def _process(name, binary, args, ready):
    return ReadyProcess(name, [runfile(binary)] + args, ready, log_dir=log_dir())


FIXTURES = sorted(glob.glob(runfile("tests/fixtures/text_golden/*.json")))
TOKENIZER_DIR = "tests/fixtures/byte_tokenizer"
FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}
_cachestore = None


def setUpModule():
    global _cachestore
    _cachestore = _process("cachestore", "cachestore/server/cachestore",
                           ["--address=127.0.0.1:0", "--metrics_address="], "CACHESTORE_READY")


def tearDownModule():
    problems = _cachestore.stop()
    assert not problems, problems


class TextGoldenCase(unittest.TestCase):
    """One model's fixture (FIXTURE, set by the subclasses below) against its own stack."""

    FIXTURE = None

    @classmethod
    def setUpClass(cls):
        with open(cls.FIXTURE, encoding="utf-8") as f:
            cls.golden = json.load(f)
        cls.model = cls.golden["model"]
        cls.tmp = tempfile.mkdtemp(dir=log_dir())
        model_dir = os.path.join(cls.tmp, cls.model)
        os.makedirs(model_dir)
        for name in ("config.json", "model.safetensors"):
            os.symlink(runfile(os.path.join(cls.golden["model_dir"], name)), os.path.join(model_dir, name))
        for path in sorted(glob.glob(runfile(os.path.join(TOKENIZER_DIR, "*.json")))):
            shutil.copy(path, model_dir)
        cache = "127.0.0.1:" + _cachestore.fields["port"]
        cls.processes = []
        try:
            prefill = cls._start("prefill", "prefill/prefill",
                                 ["--model_dir=" + model_dir, "--address=127.0.0.1:0", "--threads=1",
                                  "--cachestore=" + cache], "PREFILL_READY")
            decode = cls._start("decode", "decode/decode",
                                ["--model_dir=" + model_dir, "--address=127.0.0.1:0", "--threads=1",
                                 "--prefill=127.0.0.1:" + prefill.fields["port"], "--cachestore=" + cache],
                                "DECODE_READY")
            cls.decode_target = "127.0.0.1:" + decode.fields["port"]
            gateway = start_gateway(cls.decode_target, model_dir, name=cls.model + "_gateway")
            cls.processes.append(gateway)
        except BaseException:
            cls._stop_all()
            raise
        cls.openai = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=120)

    @classmethod
    def _start(cls, name, binary, args, ready):
        process = _process("%s_%s" % (cls.model, name), binary, args, ready)
        cls.processes.append(process)
        return process

    @classmethod
    def _stop_all(cls):
        problems = []
        for process in reversed(cls.processes):
            problems += process.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        return problems

    @classmethod
    def tearDownClass(cls):
        cls.openai.close()
        problems = cls._stop_all()
        # Each service exits 0 on SIGTERM, with no sanitizer report.
        assert not problems, problems

    def assert_usage(self, usage, case):
        """The prompt as transformers tokenised it; every generated token, the <eos> that ended it included."""
        self.assertEqual((usage.prompt_tokens, usage.completion_tokens),
                         (len(case["prompt_ids"]), len(case["generated_ids"])))

    def streamed(self, stream, content):
        """(the deltas joined, the finish reason, the usage) of a stream; content(choice) is a chunk's text."""
        deltas, finish, usage = [], None, None
        for chunk in stream:
            for choice in chunk.choices:
                deltas.append(content(choice) or "")
                finish = choice.finish_reason or finish
            usage = chunk.usage or usage
        return "".join(deltas), finish, usage

    def cases(self, kind):
        return [c for c in self.golden["cases"] if c["kind"] == kind]

    def test_engine_generates_transformers_greedy_ids(self):
        with Client(self.decode_target, timeout=120) as client:
            for case in self.golden["cases"]:
                with self.subTest(case=case["name"]):
                    result = client.generate(case["prompt_ids"], max_tokens=self.golden["max_new_tokens"],
                                             temperature=0.0, cache_salt="engine-" + case["name"])
                    self.assertEqual(list(result.token_ids), case["generated_ids"])
                    self.assertEqual(result.finish_reason, FINISH[case["finish"]])

    def test_completion_text_equals_transformers(self):
        for case in self.cases("completion"):
            with self.subTest(case=case["name"]):
                reply = self.openai.completions.create(model=self.model, prompt=case["prompt"], temperature=0,
                                                       max_tokens=self.golden["max_new_tokens"],
                                                       user="completion-" + case["name"])
                self.assertEqual(reply.choices[0].text, case["text"])
                self.assertEqual(reply.choices[0].finish_reason, case["finish"])
                self.assert_usage(reply.usage, case)

    def test_streamed_completion_text_equals_transformers(self):
        for case in self.cases("completion"):
            with self.subTest(case=case["name"]):
                stream = self.openai.completions.create(model=self.model, prompt=case["prompt"], temperature=0,
                                                        max_tokens=self.golden["max_new_tokens"], stream=True,
                                                        stream_options={"include_usage": True},
                                                        user="completion-stream-" + case["name"])
                text, finish, usage = self.streamed(stream, lambda choice: choice.text)
                self.assertEqual(text, case["text"])
                self.assertEqual(finish, case["finish"])
                self.assert_usage(usage, case)

    def test_chat_text_equals_transformers(self):
        for case in self.cases("chat"):
            with self.subTest(case=case["name"]):
                reply = self.openai.chat.completions.create(
                    model=self.model, messages=case["messages"], temperature=0,
                    max_completion_tokens=self.golden["max_new_tokens"], user="chat-" + case["name"])
                self.assertEqual(reply.choices[0].message.content, case["text"])
                self.assertEqual(reply.choices[0].finish_reason, case["finish"])
                self.assert_usage(reply.usage, case)

    def test_streamed_chat_text_equals_transformers(self):
        for case in self.cases("chat"):
            with self.subTest(case=case["name"]):
                stream = self.openai.chat.completions.create(
                    model=self.model, messages=case["messages"], temperature=0, stream=True,
                    max_completion_tokens=self.golden["max_new_tokens"], stream_options={"include_usage": True},
                    user="chat-stream-" + case["name"])
                text, finish, usage = self.streamed(stream, lambda choice: choice.delta.content)
                self.assertEqual(text, case["text"])
                self.assertEqual(finish, case["finish"])
                self.assert_usage(usage, case)


# One test class per fixture, named for its model.
for _path in FIXTURES:
    _name = os.path.basename(_path)[:-len(".json")]
    globals()["TextGolden_" + _name] = type("TextGolden_" + _name, (TextGoldenCase,), {"FIXTURE": _path})
del TextGoldenCase  # the base has no fixture: not a test class of its own


class FixturesArePresent(unittest.TestCase):

    def test_every_byte_vocabulary_model_has_a_fixture(self):
        # tools/fixture_spec.py TEXT_MODELS: the eleven e2e models and the default one.
        self.assertEqual(len(FIXTURES), 12, FIXTURES)


if __name__ == "__main__":
    unittest.main()
