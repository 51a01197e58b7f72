"""The client renders the public checkpoints' real chat templates
(tests/fixtures/chat_templates, SOURCES.md) exactly as transformers'
apply_chat_template does, and chat() stops on the token each template ends an
assistant turn with.

The expected texts are transformers' (make_expected.py, committed); where
transformers is importable (the golden venv) each is also rendered live and
compared. Needs jinja2 only: the tokenizer here is a stand-in of the
`tokenizers` interface (special tokens as single ids, the rest as bytes).
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
import unittest

from fake_generation_server import FakeServer, chunk, complete
from hybridserve_client import ChatTemplate, Client, HfTokenizer
from hybridserve_client.proto import generation_pb2 as pb

try:
    import jinja2  # noqa: F401  pylint: disable=unused-import
    HAVE_JINJA2 = True
except ImportError:
    HAVE_JINJA2 = False
try:
    import transformers  # noqa: F401  pylint: disable=unused-import
    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False

WAIT_S = 10.0  # bound on any call; a passing test never reaches it


def fixtures_dir():
    if "TEST_SRCDIR" in os.environ:  # under bazel test
        return os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "tests", "fixtures",
                            "chat_templates")
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "..", "tests", "fixtures", "chat_templates")


FIXTURES = fixtures_dir()
# The text each template writes right after an assistant reply (read from the
# templates: the tokens the publishers' generation configs stop on).
END_OF_TURN = {
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "<|im_end|>",
    "NVIDIA-Nemotron-Nano-v2": "<SPECIAL_12>",
    "granite-4.0": "<|end_of_text|>",
}


def cases():
    with open(os.path.join(FIXTURES, "cases.json"), encoding="utf-8") as f:
        return json.load(f)["cases"]


def expected(checkpoint, case):
    with open(os.path.join(FIXTURES, checkpoint, "expected", case + ".txt"), encoding="utf-8", newline="") as f:
        return f.read()


def render_with_transformers(model_dir, case):
    """transformers' apply_chat_template over a copy of `model_dir`'s template
    files with a stand-in tokenizer.json (make_expected.py's way)."""
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("chat_template.jinja", "tokenizer_config.json"):
            if os.path.isfile(os.path.join(model_dir, name)):
                shutil.copyfile(os.path.join(model_dir, name), os.path.join(tmp, name))
        if not os.path.isfile(os.path.join(tmp, "tokenizer_config.json")):
            with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
        Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")).save(os.path.join(tmp, "tokenizer.json"))
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        return tokenizer.apply_chat_template(case["messages"], tools=case.get("tools"),
                                             add_generation_prompt=case["add_generation_prompt"], tokenize=False,
                                             **case.get("template_kwargs", {}))


class _Encoding:
    def __init__(self, ids):
        self.ids = ids


class StandInTokenizer:
    """The part of tokenizers.Tokenizer HfTokenizer uses: each of `special`
    is one id (1000, 1001, ...), other text its UTF-8 bytes."""

    def __init__(self, special):
        self.special = {text: 1000 + i for i, text in enumerate(special)}
        self._split = re.compile("(%s)" % "|".join(re.escape(t) for t in sorted(special, key=len, reverse=True)))

    def get_vocab_size(self, with_added_tokens=True):
        return 1000 + len(self.special)

    def token_to_id(self, text):
        return self.special.get(text)

    def encode(self, text, add_special_tokens=True):
        ids = []
        for piece in self._split.split(text):
            ids += [self.special[piece]] if piece in self.special else list(piece.encode("utf-8"))
        return _Encoding(ids)

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


# Each template's marker tokens, one id each in the stand-in vocabulary.
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>",
           "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<think>", "</think>"]


@unittest.skipUnless(HAVE_JINJA2, "chat templates need jinja2 (pip install 'client/python[text]')")
class ChatTemplateTest(unittest.TestCase):

    def checkpoints(self):
        names = sorted(d for d in os.listdir(FIXTURES)
                       if os.path.isfile(os.path.join(FIXTURES, d, "chat_template.jinja")))
        self.assertEqual(names, sorted(END_OF_TURN))
        return names

    def test_each_template_is_the_recorded_one(self):
        with open(os.path.join(FIXTURES, "SOURCES.md"), encoding="utf-8") as f:
            recorded = dict(re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", f.read(), re.M))
        for checkpoint in self.checkpoints():
            with open(os.path.join(FIXTURES, checkpoint, "chat_template.jinja"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), recorded.get(checkpoint), checkpoint)

    def test_rendering_equals_transformers_apply_chat_template(self):
        for checkpoint in self.checkpoints():
            template = ChatTemplate.from_dir(os.path.join(FIXTURES, checkpoint))
            for name, case in sorted(cases().items()):
                with self.subTest(checkpoint=checkpoint, case=name):
                    text = template.render(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                                           tools=case.get("tools"), **case.get("template_kwargs", {}))
                    self.assertEqual(text, expected(checkpoint, name))
                    if HAVE_TRANSFORMERS:
                        self.assertEqual(text, render_with_transformers(os.path.join(FIXTURES, checkpoint), case))

    def test_the_end_of_turn_text_is_what_follows_an_assistant_reply(self):
        for checkpoint in self.checkpoints():
            template = ChatTemplate.from_dir(os.path.join(FIXTURES, checkpoint))
            self.assertEqual(template.end_of_turn_text(), END_OF_TURN[checkpoint], checkpoint)
            after = expected(checkpoint, "turn_end").split("HYBRIDSERVE_SENTINEL")[-1]
            self.assertEqual(after.split()[0], END_OF_TURN[checkpoint], checkpoint)
        # A special token followed by more (the byte vocabulary's framing).
        byte_framing = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}Q: "
                        "{{ message['content'] }}\nA:{% elif message['role'] == 'assistant' %}{{ message['content'] }}"
                        "{{ eos_token }}{{ bos_token }}{% endif %}{% endfor %}")
        self.assertEqual(ChatTemplate(byte_framing, {"bos_token": "<bos>", "eos_token": "<eos>"}).end_of_turn_text(),
                         "<eos>")
        self.assertIsNone(ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").end_of_turn_text())
        self.assertIsNone(ChatTemplate("{{ raise_exception('no') }}").end_of_turn_text())

    def test_chat_template_jinja_wins_and_special_tokens_reach_the_template_as_in_transformers(self):
        source = ("{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ my_token }}|{{ tools is none }}|"
                  "{{ documents is none }}|{{ messages[0].reasoning_content }}|"
                  "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}|"
                  "{{ {'b': '<é>', 'a': 1} | tojson }}")
        bos = {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False,
               "single_word": False, "special": True}
        config = {"bos_token": bos, "eos_token": "</s>", "unk_token": None, "add_bos_token": True, "my_token": "<m>",
                  "chat_template": "the config's, not this one"}
        messages = [{"role": "user", "content": "hi", "reasoning": "r"}, {"role": "user", "content": "x"}]
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f)
            with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(source)
            text = ChatTemplate.from_dir(tmp).render(messages)
            self.assertEqual(text, '<s>|</s>|False|<m>|True|True|r|hi|{"b": "<é>", "a": 1}')
            if HAVE_TRANSFORMERS:
                self.assertEqual(text, render_with_transformers(tmp, {"messages": messages,
                                                                      "add_generation_prompt": True}))
        with self.assertRaisesRegex(ValueError, "no chat template"):
            ChatTemplate.from_config({}).render(messages)
        with self.assertRaises(jinja2.TemplateError):
            ChatTemplate("{{ raise_exception('roles must alternate') }}").render(messages)


@unittest.skipUnless(HAVE_JINJA2, "chat templates need jinja2 (pip install 'client/python[text]')")
class ChatStopsAtTheTemplatesEndOfTurnTest(unittest.TestCase):
    """chat() with each template: the prompt is the template's rendering, and
    the request stops at the template's end-of-turn token even where the
    server's end-of-turn tokens (generation_config.json's eos_token_id) do not
    name it."""

    def setUp(self):
        self.server = FakeServer()
        self.fake = self.server.servicer
        self.fake.model_info_script = lambda request, context: pb.ModelInfo(
            model_name="m", vocab_size=2000, eos_token_ids=[7],
            end_of_turn_tokens=[pb.SpecialToken(id=7, text="<|endoftext|>")])

    def tearDown(self):
        self.server.stop()

    def test_prompt_and_stop_tokens(self):
        stand_in = StandInTokenizer(SPECIAL)
        for checkpoint in sorted(END_OF_TURN):
            end_id = stand_in.token_to_id(END_OF_TURN[checkpoint])
            self.fake.generate_script = lambda request, context, end_id=end_id: iter(
                [chunk(list(b"Six.") + [end_id]), complete(pb.FINISH_REASON_STOP, stop_token_id=end_id)])
            tokenizer = HfTokenizer(stand_in, {}, ChatTemplate.from_dir(os.path.join(FIXTURES, checkpoint)))
            all_cases = cases()
            with Client(self.server.target, timeout=WAIT_S, tokenizer=tokenizer) as client:
                reply = client.chat(all_cases["chat"]["messages"], max_tokens=8, stop_token_ids=[5])
                client.chat(all_cases["tools"]["messages"], max_tokens=8, tools=all_cases["tools"]["tools"])
                client.chat(all_cases["no_thinking"]["messages"], max_tokens=8,
                            chat_template_kwargs=all_cases["no_thinking"]["template_kwargs"])
            self.assertEqual(reply.text, "Six.", checkpoint)
            requests = [r for r in self.fake.requests if isinstance(r, pb.GenerateRequest)][-3:]
            for request, name in zip(requests, ["chat", "tools", "no_thinking"]):
                self.assertEqual(list(request.prompt_token_ids), stand_in.encode(expected(checkpoint, name)).ids,
                                 (checkpoint, name))
                self.assertEqual(list(request.stop.stop_token_ids), ([5] if name == "chat" else []) + [7, end_id],
                                 (checkpoint, name))


if __name__ == "__main__":
    unittest.main()
