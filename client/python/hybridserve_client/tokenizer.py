"""Text to token ids and back, for generate(text=...) and chat().

Two kinds, one interface (encode, decode, stream_decoder, apply_chat_template):

- HfTokenizer: a model directory's Hugging Face tokenizer files, read with the
  `tokenizers` package (pip install "client/python[text]"): tokenizer.json,
  and its ChatTemplate (chat_template.jinja, else tokenizer_config.json's
  chat_template, with the config's special tokens), rendered with jinja2 the
  way transformers' apply_chat_template renders it.
- ByteTokenizer: the default model's byte vocabulary (byte_vocab.py), no extra
  package; its chat framing is hybridserve_cli chat's ("Q: <text>\\nA:").

load_tokenizer(model_dir) picks one. Tokenizers are immutable and
thread-safe; a stream decoder is used by one thread.
"""

import datetime
import json
import os
import re

from . import byte_vocab


class ByteTokenizer:
    """The default model's vocabulary: ids 0..255 are bytes, <pad> 256, <bos> 257, <eos> 258."""

    vocab_size = byte_vocab.VOCAB_SIZE
    bos_id = byte_vocab.BOS_ID

    def encode(self, text):
        """A prompt's ids: <bos>, then the UTF-8 bytes (the model's training framing)."""
        return byte_vocab.encode_bytes(text, add_bos=True)

    def decode(self, token_ids):
        """Text of ids, without <pad>, <bos> and <eos>; invalid UTF-8 becomes U+FFFD."""
        return byte_vocab.decode_bytes(token_ids)

    def stream_decoder(self):
        return byte_vocab.ByteStreamDecoder()

    def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None, documents=None,
                            tokenize=True, **template_kwargs):
        """Ids of a conversation, ready for the assistant's reply: <bos>, each user
        message as "Q: <content>\\nA:", each assistant message as its content then
        <eos><bos>, as hybridserve_cli chat frames turns. Other roles are skipped.

        Raises:
          ValueError: tools, documents, template kwargs, no generation prompt or
            text (tokenize=False) asked of this framing, which has none of them.
        """
        if tools or documents or template_kwargs or not add_generation_prompt or not tokenize:
            raise ValueError("the byte vocabulary's chat framing (\"Q: ...\\nA:\") takes no tools, documents or "
                             "template arguments and always ends with the generation prompt, as ids")
        ids = [byte_vocab.BOS_ID]
        for message in messages:
            if message["role"] == "user":
                ids += byte_vocab.encode_bytes("Q: %s\nA:" % message["content"])
            elif message["role"] == "assistant":
                ids += byte_vocab.encode_bytes(message["content"]) + [byte_vocab.EOS_ID, byte_vocab.BOS_ID]
        return ids

    def end_of_turn_ids(self):
        """The framing ends an assistant turn with <eos>."""
        return [byte_vocab.EOS_ID]


class HfTokenizer:
    """A Hugging Face tokenizer directory (tokenizer.json required).

    Use load_tokenizer() or HfTokenizer.from_dir(). Needs the `tokenizers`
    package, and jinja2 for apply_chat_template.
    """

    def __init__(self, tokenizer, config, chat_template=None):
        """tokenizer: a tokenizers.Tokenizer; config: tokenizer_config.json's object ({} when absent);
        chat_template: a ChatTemplate (default: the config's, ChatTemplate.from_config)."""
        self._tokenizer = tokenizer
        self._config = config
        self.chat_template = chat_template if chat_template is not None else ChatTemplate.from_config(config)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        bos = _token_string(config.get("bos_token"))
        self.bos_id = tokenizer.token_to_id(bos) if bos else None

    @classmethod
    def from_dir(cls, model_dir):
        try:
            import tokenizers
        except ImportError as e:
            raise ImportError("reading %s/tokenizer.json needs the tokenizers package: "
                              "pip install 'client/python[text]' (or pip install tokenizers)" % model_dir) from e
        tokenizer = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        config = _read_tokenizer_config(model_dir)
        return cls(tokenizer, config, ChatTemplate.from_dir(model_dir, config))

    def encode(self, text):
        """A prompt's ids, with the special tokens the tokenizer's post-processor adds (e.g. <bos>)."""
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, token_ids):
        """Text of ids, special tokens skipped."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def stream_decoder(self):
        return _IncrementalDecoder(self)

    def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None, documents=None,
                            tokenize=True, **template_kwargs):
        """A conversation rendered by the chat template (ChatTemplate.render:
        transformers' apply_chat_template), encoded without adding special
        tokens (the template writes them), as transformers does; the text when
        tokenize is False.

        Raises:
          ValueError: the tokenizer has no chat template.
          jinja2.TemplateError: the template refused the conversation (raise_exception).
        """
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                         documents=documents, **template_kwargs)
        if not tokenize:
            return text
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def end_of_turn_ids(self):
        """The id of the token the chat template ends an assistant turn with
        (ChatTemplate.end_of_turn_text), as a list: [] when the template names
        none or it is not one token of this vocabulary."""
        text = self.chat_template.end_of_turn_text()
        token_id = self._tokenizer.token_to_id(text) if text else None
        return [] if token_id is None else [token_id]


class ChatTemplate:
    """A checkpoint's chat template and the special tokens it is rendered
    with, rendered as transformers' apply_chat_template renders it (jinja2 in
    an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
    loopcontrols extension, raise_exception, strftime_now, and a tojson that
    keeps key order and neither escapes HTML nor non-ASCII). Needs jinja2 to
    render, nothing else. Immutable; render is thread-safe.
    """

    def __init__(self, template, special_tokens=None):
        """template: the template's source, or {name: source} (transformers'
        named templates: "default", and "tool_use" picked when tools are
        given), or None (no template: render raises ValueError).
        special_tokens: {name: text} passed to the template (bos_token,
        eos_token, ...)."""
        self.template = template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_config(cls, config):
        """tokenizer_config.json's chat_template (a string, or a list of
        {"name", "template"}) and its special tokens: each top-level
        "*_token" key whose value is a string or an AddedToken object, as
        transformers' special_tokens_map passes them."""
        template = config.get("chat_template")
        if isinstance(template, list):
            template = {t["name"]: t["template"] for t in template}
        special = {}
        for key, value in config.items():
            text = _token_string(value) if key.endswith("_token") else None
            if isinstance(text, str):
                special[key] = text
        return cls(template, special)

    @classmethod
    def from_dir(cls, model_dir, config=None):
        """A model directory's template: chat_template.jinja when it has one
        (it takes precedence, as in transformers), else tokenizer_config.json's;
        the special tokens from tokenizer_config.json. `config`: that file's
        object when already read."""
        if config is None:
            config = _read_tokenizer_config(model_dir)
        template = cls.from_config(config)
        jinja_path = os.path.join(model_dir, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            # Text mode, as transformers reads it: CRLF line ends read as LF.
            with open(jinja_path, encoding="utf-8") as f:
                template = cls(f.read(), template.special_tokens)
        return template

    def source(self, tools=None):
        """The template that renders a conversation (with `tools`)."""
        if isinstance(self.template, dict):
            if tools and "tool_use" in self.template:
                return self.template["tool_use"]
            if "default" in self.template:
                return self.template["default"]
            raise ValueError("this tokenizer's chat templates (%s) include no \"default\"" %
                             ", ".join(sorted(self.template)))
        if not self.template:
            raise ValueError("this tokenizer has no chat template (chat_template.jinja or tokenizer_config.json)")
        return self.template

    def render(self, messages, *, add_generation_prompt=True, tools=None, documents=None, **template_kwargs):
        """The text of `messages` ([{"role", "content", ...}]), ready for the
        assistant's reply when add_generation_prompt; `tools` (JSON schemas)
        and `documents` as transformers passes them (None when not given);
        template_kwargs (e.g. enable_thinking=False) override the special
        tokens. A message's "reasoning" or "thinking" is also given as
        "reasoning_content" (and "thinking"), as transformers does."""
        compiled = _compile(self.source(tools))
        variables = dict(self.special_tokens)
        variables.update(template_kwargs)
        return compiled.render(messages=_alias_reasoning(messages), tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)

    def end_of_turn_text(self):
        """What the template writes right after an assistant reply: one of
        the special tokens when the text starts with one (eos_token in
        "<eos><bos>"), else up to the first whitespace (e.g. "<|im_end|>",
        "<|end_of_text|>", "<SPECIAL_12>"); found by rendering a reply of a
        sentinel. None when nothing follows it or the template refuses the
        probe."""
        sentinel = "HYBRIDSERVE_END_OF_TURN_PROBE"
        probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": sentinel}]
        try:
            text = self.render(probe, add_generation_prompt=False)
        except Exception:  # pylint: disable=broad-except  # any template error: no end-of-turn text
            return None
        at = text.rfind(sentinel)
        after = text[at + len(sentinel):].lstrip() if at >= 0 else ""
        for token in sorted(set(self.special_tokens.values()), key=len, reverse=True):
            if token and after.startswith(token):
                return token
        return after.split()[0] if after else None


class _IncrementalDecoder:
    """Text of ids arriving in chunks, never splitting a character.

    Decodes a short window of the latest ids (the tokens since the last text
    that ended cleanly, plus the ones before them as context, as vLLM and TGI
    do) and emits what the window adds; while the window's text ends in
    U+FFFD (a character whose bytes have not all arrived) nothing is emitted.
    flush() emits what is held at the end (a character that never completed
    becomes U+FFFD, as the whole decode shows it). Linear in the reply's
    length: the OpenAI gateway streams through it. Not thread-safe."""

    def __init__(self, tokenizer):
        self._decode = tokenizer.decode
        self._ids = []
        self._prefix = 0  # window start: context for the tokens from _read on
        self._read = 0  # tokens up to here have been emitted as text

    def decode(self, token_ids):
        """The new text these ids complete ("" when they end mid-character)."""
        self._ids.extend(token_ids)
        text = self._decode(self._ids[self._prefix:])
        if text.endswith("\ufffd"):
            return ""
        return self._advance(text)

    def flush(self):
        """The text still held (an incomplete character at the end, as U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        return self._advance(self._decode(self._ids[self._prefix:]))

    def _advance(self, text):
        new = text[len(self._decode(self._ids[self._prefix:self._read])):]
        self._prefix = self._read
        self._read = len(self._ids)
        return new


def _token_string(value):
    """tokenizer_config.json's bos_token / eos_token: a string, an AddedToken object, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_tokenizer_config(model_dir):
    """tokenizer_config.json's object, {} when the directory has none."""
    path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _alias_reasoning(messages):
    """transformers' _alias_reasoning_fields: a message's reasoning under
    "reasoning_content", "thinking" or "reasoning" is given under the first two."""
    out = []
    for message in messages:
        if isinstance(message, dict):
            reasoning = next((message[k] for k in ("reasoning_content", "thinking", "reasoning")
                              if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


_COMPILED = {}


def _compile(template):
    """The template compiled in transformers' environment (see ChatTemplate)."""
    compiled = _COMPILED.get(template)
    if compiled is not None:
        return compiled
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise ImportError("chat templates need jinja2: pip install 'client/python[text]'") from e
    version = tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3])
    if version < (3, 1, 6):
        # As transformers: earlier releases have known sandbox escapes, and chat templates are untrusted code.
        raise ImportError("chat templates need jinja2 >= 3.1.6 (earlier releases have known sandbox escapes), "
                          "found %s: pip install -U 'jinja2>=3.1.6'" % jinja2.__version__)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson sorts keys and escapes <, >, & and ': transformers' does neither.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):  # pylint: disable=redefined-builtin
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    compiled = env.from_string(template)
    _COMPILED[template] = compiled
    return compiled


def load_tokenizer(model_dir):
    """The tokenizer of a model directory: HfTokenizer when it has tokenizer.json;
    ByteTokenizer when its config.json declares the byte vocabulary
    (`hybridserve_tokenizer.kind` "bytes", as models/default does).

    Raises:
      ValueError: neither (a sentencepiece-only checkpoint, say).
    """
    if os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        return HfTokenizer.from_dir(model_dir)
    config_path = os.path.join(model_dir, "config.json")
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        if (config.get("hybridserve_tokenizer") or {}).get("kind") == "bytes":
            return ByteTokenizer()
    raise ValueError("%s has no tokenizer.json and is not a byte-level model" % model_dir)
