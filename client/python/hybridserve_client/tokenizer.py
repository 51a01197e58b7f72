"""Text to token ids and back, for generate(text=...) and chat().

Two kinds, one interface (encode, decode, stream_decoder, apply_chat_template):

- HfTokenizer: a model directory's Hugging Face tokenizer files, read with the
  `tokenizers` package (pip install "client/python[text]"): tokenizer.json,
  and tokenizer_config.json's bos/eos strings and chat_template (rendered with
  jinja2 the way transformers' apply_chat_template renders it).
- ByteTokenizer: the default model's byte vocabulary (byte_vocab.py), no extra
  package; its chat framing is hybridserve_cli chat's ("Q: <text>\\nA:").

load_tokenizer(model_dir) picks one. Tokenizers are immutable and
thread-safe; a stream decoder is used by one thread.
"""

import json
import os

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

    def apply_chat_template(self, messages):
        """Ids of a conversation, ready for the assistant's reply: <bos>, each user
        message as "Q: <content>\\nA:", each assistant message as its content then
        <eos><bos>, as hybridserve_cli chat frames turns. Other roles are skipped."""
        ids = [byte_vocab.BOS_ID]
        for message in messages:
            if message["role"] == "user":
                ids += byte_vocab.encode_bytes("Q: %s\nA:" % message["content"])
            elif message["role"] == "assistant":
                ids += byte_vocab.encode_bytes(message["content"]) + [byte_vocab.EOS_ID, byte_vocab.BOS_ID]
        return ids


class HfTokenizer:
    """A Hugging Face tokenizer directory (tokenizer.json required).

    Use load_tokenizer() or HfTokenizer.from_dir(). Needs the `tokenizers`
    package, and jinja2 for apply_chat_template.
    """

    def __init__(self, tokenizer, config):
        """tokenizer: a tokenizers.Tokenizer; config: tokenizer_config.json's object ({} when absent)."""
        self._tokenizer = tokenizer
        self._config = config
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
        config_path = os.path.join(model_dir, "tokenizer_config.json")
        config = {}
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        return cls(tokenizer, config)

    def encode(self, text):
        """A prompt's ids, with the special tokens the tokenizer's post-processor adds (e.g. <bos>)."""
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, token_ids):
        """Text of ids, special tokens skipped."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def stream_decoder(self):
        return _IncrementalDecoder(self)

    def apply_chat_template(self, messages):
        """Ids of a conversation ready for the assistant's reply: tokenizer_config.json's
        chat_template rendered with add_generation_prompt, encoded without adding
        special tokens (the template writes them), as transformers does.

        Raises:
          ValueError: the tokenizer has no chat template.
        """
        template = self._config.get("chat_template")
        if isinstance(template, list):  # [{"name": ..., "template": ...}]: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not template:
            raise ValueError("this tokenizer has no chat_template (tokenizer_config.json)")
        text = _render_chat_template(template, messages, bos_token=_token_string(self._config.get("bos_token")) or "",
                                     eos_token=_token_string(self._config.get("eos_token")) or "")
        return self._tokenizer.encode(text, add_special_tokens=False).ids


class _IncrementalDecoder:
    """Text of ids arriving in chunks: decodes all ids so far and emits what is
    new, holding back a trailing U+FFFD (a character whose bytes have not all
    arrived) until the next chunk or flush(). Quadratic in the reply's length,
    which a client's replies keep small. Not thread-safe."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._ids = []
        self._emitted = 0

    def decode(self, token_ids):
        self._ids.extend(token_ids)
        text = self._tokenizer.decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        return self._take(text)

    def flush(self):
        return self._take(self._tokenizer.decode(self._ids))

    def _take(self, text):
        new = text[self._emitted:]
        self._emitted = len(text)
        return new


def _token_string(value):
    """tokenizer_config.json's bos_token / eos_token: a string, an AddedToken object, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _render_chat_template(template, messages, **special):
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise ImportError("chat templates need jinja2: pip install 'client/python[text]'") from e

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=True, **special)


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
